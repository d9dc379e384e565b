"""Quantize a target with llm-compressor's oneshot and save it in compressed-tensors format."""

from __future__ import annotations

import contextlib
import resource
import shutil
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import PipelineError
from pipeline.core.sizes import dir_size, megabytes
from pipeline.quantize.recipes import (
    GroupSize,
    VariantSpec,
    build_recipe,
    choose_group_size,
    input_widths,
    is_unquantized,
    with_group_size,
)
from pipeline.quantize.settings import Calibration

if TYPE_CHECKING:  # imported where a model is quantized: the unquantized baseline, a file copy, needs no torch
    import torch

# quantize_metrics' keys that differ between two runs of the same recipe on the same inputs: the stage keeps them out
# of its DVC metrics (pipeline/core/stage.py: record_timings).
RUN_DEPENDENT = ("wall_time_s", "oneshot_time_s", "peak_memory_mb", "peak_gpu_memory_mb")


def compute_setup() -> tuple[str, torch.dtype]:
    """bf16 on GPU; float32 on CPU, where bf16 matmuls are slow (AWQ on a 21M model took 629 s)."""
    import torch

    return ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)


@contextlib.contextmanager
def awq_pinning_off_without_accelerator():
    """llm-compressor 0.14's AWQ pins its cached activations before the smoothing grid search
    (AWQModifier._apply_smoothing -> IntermediatesCache.pin_memory, added by
    https://github.com/vllm-project/llm-compressor/pull/2813 for faster host->GPU copies;
    src/llmcompressor/modifiers/transform/awq/base.py). torch can only pin memory when an
    accelerator exists ("Cannot access accelerator device when none is available"), so AWQ
    crashes on a CPU-only host. With nothing to copy to, pinning buys nothing: make it a no-op
    there, for the duration of the run only. Hosts with an accelerator keep the real pinning."""
    import torch

    if torch.accelerator.is_available():
        yield
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


def calibrated_layers(model: torch.nn.Module, sequential_targets) -> int | None:
    """How many times llm-compressor's sequential pipeline ends a calibration epoch (LifecycleCallbacks.
    sequential_epoch_end, after which GPTQ solves and AWQ smooths that subgraph): once per decoder layer (its
    sequential targets, e.g. LlamaDecoderLayer) and once for what follows the last one (the final norm and head)."""
    from llmcompressor.utils.pytorch.module import infer_sequential_targets

    targets = infer_sequential_targets(model, sequential_targets)
    targets = {targets} if isinstance(targets, str) else set(targets)
    layers = sum(type(m).__name__ in targets for m in model.modules())
    return layers + 1 if layers else None  # targets given as patterns: count unknown, the bar counts up without a total


@contextlib.contextmanager
def layer_progress(desc: str, total: int | None):
    """The console's progress bar (pipeline/core/stage.py) advanced each time llm-compressor finishes a layer: GPTQ and
    AWQ do their work per layer inside LifecycleCallbacks.sequential_epoch_end (the modifiers' on_event), which
    every calibration pipeline calls (sequential: per subgraph; basic: once). llm-compressor's own tqdm bars and
    METRIC lines go to the stage's log; without this the console showed nothing for 11 (GPTQ) and 24 (AWQ) minutes
    on SmolLM2-135M (issue #29)."""
    from llmcompressor.core import LifecycleCallbacks

    from pipeline.core.stage import progress_bar

    original = LifecycleCallbacks.__dict__["sequential_epoch_end"]
    bar = progress_bar(desc, total=total)

    def sequential_epoch_end(cls, modules, **kwargs):
        result = original.__func__(cls, modules, **kwargs)
        bar.update(1)
        return result

    LifecycleCallbacks.sequential_epoch_end = classmethod(sequential_epoch_end)
    try:
        yield bar
    finally:
        LifecycleCallbacks.sequential_epoch_end = original
        bar.close()


def resolve_group_size(
    model: torch.nn.Module, spec: VariantSpec, ignore: list[str]
) -> tuple[VariantSpec, GroupSize | None]:
    """The spec with the group size its layers take (recipes.choose_group_size), checked before calibration: a
    group_size the variant sets that does not divide a layer's input width is refused in one line; the scheme's own
    gives way to the largest vLLM serves that does, the reason in the metrics."""
    group = choose_group_size(spec, input_widths(model, ignore))
    return with_group_size(spec, group), group


@contextlib.contextmanager
def tracing_failures_as_pipeline_errors(architecture: str):
    """The sequential pipeline traces the model into one subgraph per decoder layer with torch.fx;
    an architecture whose forward it can't trace fails there with a long multi-line error.
    Turn exactly that failure (raised under llm-compressor's trace_subgraphs) into one line."""
    try:
        yield
    except Exception as e:
        if not any(
            frame.f_code.co_name == "trace_subgraphs" and "llmcompressor" in frame.f_code.co_filename
            for frame, _ in traceback.walk_tb(e.__traceback__)
        ):
            raise
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        raise PipelineError(
            f"llm-compressor cannot trace {architecture} for its layer-by-layer (sequential) "
            f"calibration ({reason}); set quantize.calibration.pipeline: basic to calibrate the "
            "whole model in one pass (it must fit in memory)"
        ) from None


def calibration_settings(cfg: Calibration, spec: VariantSpec) -> Calibration:
    """quantize.calibration with the variant's own num_samples / max_seq_length on top."""
    return cfg.with_overrides(spec.num_samples, spec.max_seq_length)


def awq_grid(spec: VariantSpec, cfg: Calibration, device: str) -> tuple[VariantSpec, dict]:
    """The AWQ grid this run searches, and its metrics. On a CPU the default grid of 20 ratios per mapping is most of
    the stage (SmolLM2-135M on 2 cores: 1170 s at 20, 162 s at 4, KL 0.178 vs 0.191; benchmarks/quantize.md), so a
    variant that sets no n_grid gets quantize.calibration.cpu_awq_n_grid there; on a GPU, llm-compressor's default."""
    if spec.algorithm != "awq":
        return spec, {}
    if "n_grid" in spec.knobs:
        return spec, {"awq_n_grid": spec.knobs["n_grid"], "awq_n_grid_from": f"quantize.variants.{spec.name}.n_grid"}
    if device == "cpu" and cfg.cpu_awq_n_grid is not None:
        return (
            replace(spec, knobs={**spec.knobs, "n_grid": cfg.cpu_awq_n_grid}),
            {"awq_n_grid": cfg.cpu_awq_n_grid, "awq_n_grid_from": "quantize.calibration.cpu_awq_n_grid"},
        )
    from llmcompressor.modifiers.transform.awq import AWQModifier  # as recipes.build_recipe: only where AWQ runs

    return spec, {
        "awq_n_grid": AWQModifier.model_fields["n_grid"].default,
        "awq_n_grid_from": "llm-compressor's default",
    }


def sequential_targets(cfg: Calibration) -> str | list[str] | None:
    """quantize.calibration.sequential_targets as llm-compressor takes it: a class name or a list of them."""
    targets = cfg.sequential_targets
    return list(targets) if isinstance(targets, tuple) else targets


def load_for_quantization(model_dir: Path, device: str, dtype: torch.dtype, offload: bool):
    """offload: weights stay in CPU RAM (spilling to disk past free RAM) through compressed-tensors'
    offloading, and llm-compressor's sequential pipeline onloads one decoder layer at a time onto
    the GPU, so a model larger than GPU memory quantizes. Otherwise the whole model sits on device."""
    from transformers import AutoModelForCausalLM

    if offload:
        from compressed_tensors.offload import load_offloaded_model

        with load_offloaded_model():
            return AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=dtype, device_map="auto_offload", trust_remote_code=False, use_safetensors=True
            )
    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, trust_remote_code=False, use_safetensors=True
    ).to(device)


def to_saved_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The model in the checkpoint's dtype, except the global scales of tensor-group schemes (NVFP4):
    compressed-tensors creates those in float32 whatever the model's dtype (quantization/lifecycle/
    initialize.py), so a GPU run saves them in float32, and compression divides by them. They sit out
    the cast: re-assigning an existing parameter of a compressed-tensors dispatched module copies into
    its storage (offload/cache/base.py, OffloadCache.__setitem__), which would keep the cast dtype."""
    import torch

    keep = {
        (module, name): param.detach().clone()
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False)
        if name.endswith("_global_scale")
    }
    for module, name in keep:
        delattr(module, name)
    model.to(dtype)
    for (module, name), value in keep.items():
        module.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))


def calibration_dataset(tokenizer, texts: list[str], max_seq_length: int):
    """Token ids, truncated to max_seq_length. Texts formatted by a chat template already carry
    its special tokens (BOS), so the tokenizer must not add them again."""
    from datasets import Dataset

    enc = tokenizer(texts, add_special_tokens=not tokenizer.chat_template, truncation=True, max_length=max_seq_length)
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})


def peak_memory() -> dict:
    """Peak host RSS of this process (so run one variant per process to compare them; rank 0's in a
    distributed run), and GPU, in MB (10^6 bytes)."""
    peak = {"peak_memory_mb": megabytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, 1)}  # Linux: KiB
    torch = sys.modules.get("torch")  # never imported: nothing ran on a GPU (the unquantized baseline's copy)
    if torch is not None and torch.cuda.is_available():
        peak["peak_gpu_memory_mb"] = megabytes(torch.cuda.max_memory_allocated(), 1)
    return peak


def process_rank() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless this process is one of a distributed run (pipeline/quantize/distributed.py)."""
    from compressed_tensors.distributed import is_distributed

    if not is_distributed():
        return 0, 1
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def quantize_model(
    model_dir: Path,
    out_dir: Path,
    spec: VariantSpec,
    calibration_texts: list[str],
    cfg: Calibration,
    targets: Mapping[str, list[str]] | None = None,
) -> dict:
    """Run the variant's recipe and save a compressed checkpoint into out_dir (which must be new/temp).

    cfg: quantize.calibration (num_samples, max_seq_length, ignore, pipeline, sequential_targets, offload); the spec
    may override num_samples and max_seq_length. targets: a per-layer layout, scheme -> module patterns
    (pipeline/quantize/mixed.py); None quantizes every layer with the variant's scheme.

    Inside a distributed run (every rank calls this), each rank calibrates on its own contiguous slice of
    the calibration rows and llm-compressor combines the ranks' statistics; the weights are loaded once,
    into CPU memory the ranks share (compressed-tensors' offloaded loading), and rank 0 writes the files.
    """
    if is_unquantized(spec):
        return copy_unquantized(model_dir, out_dir, spec)
    import llmcompressor  # noqa: F401 - imported (seconds) before the clock starts, as run_oneshot's import is free
    import torch
    from transformers import AutoConfig, AutoTokenizer

    cfg = calibration_settings(cfg, spec)
    device, dtype = compute_setup()
    spec, grid = awq_grid(spec, cfg, device)
    ignore = sorted(set(cfg.ignore) | set(spec.ignore))
    calibrate = any(m.requires_calibration_data for m in build_recipe(spec, ignore, targets))
    if calibrate and not calibration_texts:
        raise PipelineError(f"variant {spec.name!r} needs calibration data but the calibration split is empty")

    rank, world = process_rank()
    t0 = time.perf_counter()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    saved_dtype = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).dtype
    # Distributed: rank 0 loads, the other ranks map its shared copy (llm-compressor's documented way).
    model = load_for_quantization(model_dir, device, dtype, cfg.offload or world > 1)
    spec, group = resolve_group_size(model, spec, ignore)
    recipe = build_recipe(spec, ignore, targets)

    texts = calibration_texts[: cfg.num_samples] if calibrate else []
    kwargs = calibration_kwargs(tokenizer, texts, cfg, rank, world) if calibrate else {}
    oneshot_s = run_oneshot(model, tokenizer, recipe, spec, cfg, rank == 0 and calibrate, kwargs)
    # Calibration ran in float32 on CPU; store the unquantized tensors (embeddings, norms,
    # scales) in the checkpoint's own dtype, as a GPU run would.
    if isinstance(saved_dtype, torch.dtype) and saved_dtype != dtype:
        to_saved_dtype(model, saved_dtype)
    # Every rank calls it (compression is split across ranks); only rank 0 writes (is_source_process).
    model.save_pretrained(out_dir, save_compressed=True)
    if rank == 0:
        tokenizer.save_pretrained(out_dir)
    wall = time.perf_counter() - t0

    return {**quantize_metrics(spec, model_dir, out_dir, device, len(texts), wall, oneshot_s, world, group), **grid}


def calibration_kwargs(tokenizer, texts: list[str], cfg: Calibration, rank: int, world: int) -> dict:
    """oneshot's calibration arguments: this rank's slice of texts, split as llm-compressor's get_rank_partition
    splits a dataset."""
    mine = texts[len(texts) * rank // world : len(texts) * (rank + 1) // world]
    kwargs = dict(
        dataset=calibration_dataset(tokenizer, mine, cfg.max_seq_length),
        num_calibration_samples=len(mine),
        max_seq_length=cfg.max_seq_length,
        shuffle_calibration_samples=False,
    )
    return kwargs | {
        k: v for k, v in (("pipeline", cfg.pipeline), ("sequential_targets", sequential_targets(cfg))) if v
    }


def run_oneshot(
    model, tokenizer, recipe: list, spec: VariantSpec, cfg: Calibration, show_layers: bool, kwargs: dict
) -> float:
    """llm-compressor's oneshot on model, its tracing failures as one line; the seconds it took. show_layers: a
    progress line per calibrated layer (data-free recipes take seconds; a distributed run's ranks share one
    console, so rank 0's alone)."""
    from llmcompressor import oneshot

    t1 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracing_failures_as_pipeline_errors(type(model).__name__))
        if spec.algorithm == "awq":
            stack.enter_context(awq_pinning_off_without_accelerator())
        if show_layers:
            layers = calibrated_layers(model, sequential_targets(cfg)) if cfg.pipeline in (None, "sequential") else None
            stack.enter_context(layer_progress(f"quantize {spec.name} ({spec.algorithm}, layers)", layers))
        oneshot(model=model, tokenizer=tokenizer, recipe=recipe, **kwargs)
    return time.perf_counter() - t1


def copy_unquantized(model_dir: Path, out_dir: Path, spec: VariantSpec) -> dict:
    """The baseline variant: the target's own files, byte for byte (real copies, so the variant does not
    change when the target directory is rebuilt)."""
    t0 = time.perf_counter()
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    return quantize_metrics(spec, model_dir, out_dir, "none", 0, time.perf_counter() - t0, 0.0)


def group_metrics(group: GroupSize | None) -> dict:
    """The quantize metrics' group size fields (null for a scheme without groups)."""
    return group.as_metrics() if group else {"group_size": None, "group_size_configured": None, "group_size_reason": []}


def quantize_metrics(
    spec: VariantSpec,
    model_dir: Path,
    out_dir: Path,
    device: str,
    samples: int,
    wall: float,
    oneshot_s: float,
    processes: int = 1,
    group: GroupSize | None = None,
) -> dict:
    """group: the weight group size used (-1: channel-wise), the one configured, and why they differ (null when not)."""
    size_before, size_after = dir_size(model_dir, suffix=".safetensors"), dir_size(out_dir, suffix=".safetensors")
    return {
        "variant": spec.name,
        "algorithm": spec.algorithm,
        "scheme": spec.scheme,
        **group_metrics(group),
        "kv_cache": spec.kv_cache,
        "device": device,
        "calibration_samples": samples,
        "processes": processes,  # quantize.distributed.gpus: one per GPU
        "wall_time_s": round(wall, 2),
        "oneshot_time_s": round(oneshot_s, 2),
        **peak_memory(),
        "size_before_mb": megabytes(size_before),  # MB, 10^6 bytes
        "size_after_mb": megabytes(size_after),
        "compression_ratio": round(size_before / size_after, 3),
    }
