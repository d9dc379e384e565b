"""`modelprep plan`: per stage, the GPUs, GPU memory per GPU, disk and time a build of the configured model needs on
a host, before any work; and the one line that refuses a plan that can't fit.

Memory: serving (serve_bench, and the bundle's replicas) from the memory model of pipeline/serving/parallelism.py at
each variant's tensor parallelism (and, over several hosts, pipeline parallelism); distill's vLLM engine from the same
model at draft_training.vllm.gpu_memory_utilization and one max_model_len sequence; quantization from the peak
measured at the Llama-3-8B shape, scaled by parameters (the weights sit on the GPU unless
quantize.calibration.offload); GPTQ onloading one layer at a time (offload, or quantize.distributed.gpus > 1) from the
per-layer peak and seconds measured at the nearest GPU count (raw/scale-host: a Llama-3-70B-wide layer on 1 and 4
H100s), times layers, layer parameters and calibration samples over the measured ones; eagle3 and evaluate load the
model with transformers on one GPU (BF16 weights; evaluate holds the target and the variant). Time: each stage's
measured wall time (plan_points.json, written by benchmarks/plan_points.py from committed raw runs) times this model's
parameters over the measured run's, calibrated quantization times its calibration samples over the measured ones too:
a proportional guess, not a measurement, and every row names the run it scales. Disk: checkpoint bytes (the target,
each variant, each bundle's copy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.quantize.hardware import GPU_MEMORY_GB
from pipeline.quantize.recipes import VariantSpec, is_unquantized, variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.serving import parallelism as par
from pipeline.serving.settings import ServingParams
from pipeline.serving.sharding import with_calibration_ignore

POINTS_FILE = Path(__file__).with_name("plan_points.json")
# Published configs (each model's config.json on the Hub), for planning without the model.
SHAPES = {
    "llama-3-8b": {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    },
    "llama-3-70b": {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 28672,
        "vocab_size": 128256,
    },
    "llama-3.1-405b": {
        "num_hidden_layers": 126,
        "hidden_size": 16384,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 53248,
        "vocab_size": 128256,
    },
}


@dataclass(frozen=True)
class Host:
    gpu: str
    gpus_per_host: int
    hosts: int = 1
    gpu_named: bool = True  # False: serving.gpu null (and no --gpu): gpu is DEFAULT_GPU, a pinned TP is not checked

    @property
    def memory_bytes(self) -> int:
        return GPU_MEMORY_GB[self.gpu] * par.GB


@dataclass(frozen=True)
class Row:
    stage: str
    gpus: str
    gpu_memory: str  # per GPU
    disk_bytes: int
    time: str
    source: str  # the measured run it scales from, or how it was computed
    problem: str | None = None  # why it can't fit (None: it fits)
    unchecked: str | None = None  # why fitting was not checked (a pinned TP with serving.gpu null)

    @property
    def fits(self) -> str:
        return "NO" if self.problem else self.unchecked or "yes"


def load_points() -> dict:
    return json.loads(POINTS_FILE.read_text())


def gb(n: float) -> str:
    return f"{n / par.GB:.1f} GB"


def duration(seconds: float) -> str:
    return (
        f"~{seconds:.0f} s"
        if seconds < 120
        else f"~{seconds / 60:.0f} min"
        if seconds < 7200
        else f"~{seconds / 3600:.1f} h"
    )


def nearest(points: list[dict], parameters: int) -> dict:
    """The measured point whose model size is nearest (by ratio) to `parameters`: the one a proportional scaling
    stretches least."""
    return min(points, key=lambda p: abs(math.log(parameters / p["parameters"])))


def scaled_time(points: dict | list[dict], parameters: int, factor: float = 1.0) -> tuple[str, str]:
    point = nearest(points, parameters) if isinstance(points, list) else points
    seconds = point["wall_time_s"] * parameters / point["parameters"] * factor
    return duration(seconds), (
        f"{point['run']} ({point['wall_time_s']} s at {point['parameters'] / 1e9:.2f}B "
        f"parameters, {point['gpu']}) x parameters" + (" x calibration samples" if factor != 1.0 else "")
    )


def serve_row(
    name: str, spec: VariantSpec, serving: ServingParams, shape: par.ModelShape, host: Host, stage: str
) -> tuple[Row, int]:
    """A variant served (serve_bench, the bundle's replica): its tensor parallelism on one host, else pipeline
    parallelism over the hosts (vLLM multi-node). Returns the row and the GPUs per replica."""
    weight_bytes = par.estimated_weight_bytes(shape, spec)
    inputs = par.memory_inputs(serving, shape, weight_bytes, spec)
    max_tp = min(serving.max_tensor_parallel_size, host.gpus_per_host)
    if serving.tensor_parallel_size != par.AUTO_TP:
        fit = par.per_gpu(inputs, serving.tensor_parallel_size)
        if serving.gpu is None and fit.shard_problem is None and not fit.fits:  # as decide(): the user's to know
            return Row(
                stage,
                f"{fit.gpus} (TP {fit.tensor_parallel_size})",
                f"{gb(fit.need_bytes)} of {gb(fit.budget_bytes)} on {host.gpu}",
                0,
                "",
                "memory model (pipeline/serving/parallelism.py), estimated weights",
                unchecked=f"not checked ({ServingParams.SECTION}.gpu null)",
            ), fit.gpus
        largest, fit = fit, (fit if fit.fits else None)
    else:  # where vLLM can't shard the smallest size that fits memory, that one says why
        tried = par.shares(inputs, max_tp)
        fit = tried[-1] if tried[-1].fits else None
        largest = tried[-1] if fit else next((s for s in tried if s.fits_memory), tried[-1])
    for pp in range(2, host.hosts + 1):
        if fit is not None:
            break
        share = par.per_gpu(inputs, max_tp, pp)
        fit, largest = (share if share.fits else None), share
    share = fit or largest
    layout = f"TP {share.tensor_parallel_size}" + (
        f" x PP {share.pipeline_parallel_size}" if share.pipeline_parallel_size > 1 else ""
    )
    problem = (
        None
        if fit
        else f"{stage}: vLLM can't shard {name} at {layout}: {share.shard_problem}; "
        f"{par.what_shards(inputs, share.tensor_parallel_size, host.gpu_named)}"
        if share.shard_problem and share.fits_memory
        else (
            f"{stage}: {name} does not fit {host.hosts} host(s) of {host.gpus_per_host} "
            f"{host.gpu}: at {layout} {share.describe()}"
        )
    )
    return Row(
        stage,
        f"{share.gpus} ({layout})",
        f"{gb(share.need_bytes)} of {gb(share.budget_bytes)}",
        0,
        "",
        "memory model (pipeline/serving/parallelism.py), estimated weights",
        problem,
    ), share.gpus


def one_gpu(stage: str, need: int, host: Host, why: str) -> str | None:
    if need <= host.memory_bytes:
        return None
    return f"{stage}: {why} needs {gb(need)} on one {host.gpu} ({GPU_MEMORY_GB[host.gpu]} GB)"


def distill_row(params: Mapping, serving: ServingParams, shape, bf16: int, host: Host, stage_points: dict) -> Row:
    """The distill stage's row: the target's vLLM engine, sharded over the fewest GPUs it fits."""
    engine = par.Engine.of(params, "draft_training.vllm")  # as stages/distill.py sizes it (target_tensor_parallel)
    util = engine.gpu_memory_utilization
    fit, largest = par.smallest_fit(
        engine.inputs(serving, shape, bf16, par.TARGET_SPEC), min(serving.max_tensor_parallel_size, host.gpus_per_host)
    )
    share = fit or largest
    t, src = scaled_time(stage_points["distill"], shape.parameters)
    return Row(
        "distill",
        f"{share.tensor_parallel_size} (TP)",
        f"{gb(share.need_bytes)} of {gb(share.budget_bytes)}",
        0,
        t,
        src,
        None
        if fit
        else f"distill: the target's vLLM engine at draft_training.vllm."
        f"gpu_memory_utilization {util} does not fit {host.gpus_per_host} {host.gpu}: {share.describe()}",
    )


def plan(params: Mapping, config: Mapping, host: Host, points: dict | None = None) -> list[Row]:
    """Every stage's row for params' enabled variants, the model of `config` (a config.json mapping), on `host`."""
    points = points or load_points()
    serving = ServingParams.parse({**params["serving"], "gpu": host.gpu if host.gpu_named else None})
    quantize = QuantizeParams.parse(params["quantize"])
    shape = par.ModelShape.from_config(config)
    n = shape.parameters
    bf16 = par.estimated_weight_bytes(shape, par.TARGET_SPEC)
    rows = [Row("models", "0", "-", bf16, "not estimated (download or conversion)", "the target's BF16 bytes")]
    stage_points = points["stages"]
    for name in quantize.enabled:
        rows.append(quantize_row(name, variant_spec(quantize.variants, name), quantize, shape, bf16, host, points))
    rows.append(distill_row(params, serving, shape, bf16, host, stage_points))
    for stage in ("draft_finetune", "eagle3"):
        t, src = (
            scaled_time(stage_points[stage], n)
            if stage == "eagle3"
            else (
                f"~{stage_points[stage][0]['wall_time_s']:.0f} s",
                f"{stage_points[stage][0]['run']} (the draft's size, not the target's: unscaled)",
            )
        )
        memory = bf16 if stage == "eagle3" else 0
        problem = one_gpu(stage, memory, host, "the target in BF16 (transformers)") if memory else None
        rows.append(Row(stage, "1", gb(memory) + " + the head" if memory else "the draft's", 0, t, src, problem))
    for name in quantize.enabled:
        spec = with_calibration_ignore(variant_spec(quantize.variants, name), params)
        t, src = scaled_time(stage_points["evaluate"], n)
        need = 2 * bf16  # the target and the variant, decompressed to BF16 (pipeline/models/loading.py)
        rows.append(
            Row(
                f"evaluate@{name}",
                "1",
                gb(need),
                0,
                t,
                src,
                one_gpu(f"evaluate@{name}", need, host, "the target and the variant in BF16 (transformers)"),
            )
        )
        row, _ = serve_row(name, spec, serving, shape, host, f"serve_bench@{name}")
        t, src = scaled_time(stage_points["serve_bench"], n)
        rows.append(
            Row(row.stage, row.gpus, row.gpu_memory, 0, t, f"{src}; memory: {row.source}", row.problem, row.unchecked)
        )
        t, src = scaled_time(stage_points["bundle"], n)
        rows.append(Row(f"bundle@{name}", "0", "-", par.estimated_weight_bytes(shape, spec), t, src + " (a copy)"))
    return rows


def quantize_row(name: str, spec, quantize, shape, bf16: int, host: Host, points: dict) -> Row:
    """quantize@name's row: time scaled from the measured point of its algorithm, GPU memory whole or one layer."""
    n = shape.parameters
    size = par.estimated_weight_bytes(shape, spec)
    if is_unquantized(spec):
        t, src = scaled_time(points["stages"]["quantize@bf16"], n)
        return Row(f"quantize@{name}", "0", "-", size, t, src + " (a copy)")
    samples = spec.num_samples or quantize.calibration.num_samples
    gpus = quantize.distributed.gpus
    onloads = quantize.calibration.offload or gpus > 1  # one decoder layer at a time on each GPU
    if onloads and spec.algorithm == "gptq" and points.get("gptq_layers"):
        # a 70B model quantizes on an H100 only layer by layer: scale the per-layer point measured at 70B width
        est = per_layer_estimate(points["gptq_layers"], shape, gpus, samples)
        problem = one_gpu(f"quantize@{name}", est.peak_bytes, host, "one decoder layer and its calibration")
        return Row(f"quantize@{name}", str(gpus), est.memory, size, est.time, est.source, problem)
    point = points["quantize"].get(name) or next(
        (p for p in points["quantize"].values() if p["algorithm"] == spec.algorithm), None
    )
    factor = samples / point["calibration_samples"] if point and point["calibration_samples"] else 1.0
    t, src = scaled_time(point, n, factor) if point else ("not measured", "no measured point for this algorithm")
    if onloads:
        layer = (bf16 - shape.embedding_parameters * 2) // shape.layers
        memory, problem = f"{gb(layer)} + calibration activations (one layer; not measured)", None
    elif point:
        peak = point["peak_gpu_memory_bytes"] * n // point["parameters"]
        memory = f"{gb(peak)} (measured peak x parameters)"
        problem = one_gpu(f"quantize@{name}", peak, host, "the whole model on the GPU")
        if problem:
            problem += ": set quantize.calibration.offload: true (one layer at a time on the GPU)"
    else:
        memory, problem = "not measured", None
    return Row(f"quantize@{name}", str(gpus), memory, size, t, src, problem)


def layer_parameters(shape: par.ModelShape) -> int:
    """One decoder layer's parameters (attention, MLP, its two norms): what onloading moves to a GPU at a time."""
    return (shape.parameters - shape.embedding_parameters - shape.hidden_size) // shape.layers


@dataclass(frozen=True)
class LayerEstimate:
    time: str
    memory: str  # per GPU (per process)
    peak_bytes: int
    source: str


def nearest_layer_point(points: list[dict], gpus: int, layer: int) -> dict:
    """The onloading point nearest `gpus` (by ratio: a layer's time falls with GPUs), then nearest `layer`
    parameters."""
    onloading = [p for p in points if p["offload"] or p["gpus"] > 1]
    return min(onloading, key=lambda p: (abs(math.log(gpus / p["gpus"])), abs(math.log(layer / p["layer_parameters"]))))


def per_layer_estimate(points: list[dict], shape: par.ModelShape, gpus: int, samples: int) -> LayerEstimate:
    """GPTQ layer by layer: layers x the point's seconds per layer x layer parameters and calibration samples over
    the point's; GPU memory per process: the point's peak x layer parameters (loading and saving not counted)."""
    layer = layer_parameters(shape)
    p = nearest_layer_point(points, gpus, layer)
    stretch = layer / p["layer_parameters"]
    seconds = shape.layers * p["layer_seconds"] * stretch * samples / p["calibration_samples"]
    peak = round(p["peak_gpu_memory_bytes"] * stretch)
    source = (
        f"{p['run']} {p['step']} ({p['layer_seconds']} s per layer of {p['layer_parameters'] / 1e9:.2f}B parameters, "
        f"{p['calibration_samples']} samples x {p['max_seq_length']} tokens, {p['gpus']}x {p['gpu']}) x layers x "
        "layer parameters x calibration samples; memory: measured one-layer peak per process x layer parameters"
    )
    return LayerEstimate(duration(seconds), f"{gb(peak)} (measured one-layer peak x layer parameters)", peak, source)


def render(rows: list[Row], title: str) -> str:
    header = ("stage", "fits", "GPUs", "GPU memory per GPU", "disk", "time", "scaled from")
    table = [header] + [
        (r.stage, r.fits, r.gpus, r.gpu_memory, gb(r.disk_bytes) if r.disk_bytes else "-", r.time, r.source)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    disk = sum(r.disk_bytes for r in rows)
    lines.append(
        f"disk: {gb(disk)} of checkpoints in the workspace (DVC's cache holds a second copy unless its "
        "cache.type links); times scale measured runs by parameters: a proportional guess, not a measurement"
    )
    return "\n".join(lines)


def first_problem(rows: list[Row]) -> str | None:
    """The refusal line: a variant that can't be served first (what every other stage's size follows), else the
    first stage in order that can't fit."""
    ordered = sorted(rows, key=lambda r: not r.stage.startswith("serve_bench@"))
    return next((r.problem for r in ordered if r.problem), None)
