"""GPUs per replica: each variant's tensor parallelism, the smallest that fits the serving GPU's memory.

vLLM shards a model's weights over tensor_parallel_size GPUs (the embedding and head too: they are vocab-parallel)
and its KV cache by KV head. A replica fits when, on each GPU,

    weight bytes / TP  +  KV cache bytes / TP (KV heads split; replicated beyond num_kv_heads)  +  overhead
        <=  serving.gpu_memory_utilization x the GPU's memory (pipeline/quantize/hardware.py GPU_MEMORY_GB)

with the KV cache sized for the serving section's own load: max_num_seqs sequences of max_model_len tokens each, at
2 (K and V) x layers x KV heads x head_dim x the KV dtype's bytes per token. That is stricter than what vLLM needs to
start (one sequence of max_model_len): a replica sized to it never preempts at its configured batch. vLLM must also
be able to shard the layers at that size (pipeline/serving/sharding.py: the attention and KV heads, the MLP width, and
each GPU's share of a layer's input a whole number of the weights' integer groups: group 128 does not shard the demo
target's o_proj, 384 inputs, at TP 2); a size it can't never fits, and one line says why.

serving.tensor_parallel_size `auto` takes, per variant, the smallest of 1, 2, 4, 8 up to
serving.max_tensor_parallel_size that fits; a number pins every variant (refused when it can't fit a named
serving.gpu). serving.gpu null plans for an H100, the GPU every measurement of this project comes from (as the
speculation cost profiles do); a tiny model takes 1 there anyway. Weight bytes are the checkpoint's own once it is
built (artifacts/quantized/<variant>), an estimate from the model's config and the scheme's bits before.

Decided where it is first known: when params are checked (the `sources` stage, `modelprep plan`) if the target's
config is readable there, else in the `models` stage before any variant is quantized; then again by every stage that
runs or ships the variant (evaluate, serve_bench, bundle), from the real checkpoint. tensor_parallel_for is the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.quantize.hardware import GPU_MEMORY_GB, GPUS
from pipeline.quantize.recipes import VariantSpec, is_unquantized, scheme_of, variant_spec
from pipeline.serving.settings import AUTO_TP, TP_SIZES, ServingParams
from pipeline.serving.sharding import (
    NO_GROUPS,
    PRESET_GROUP,
    WeightGroups,
    checkpoint_groups,
    group_that_shards,
    shard_problem,
    spec_groups,
    with_calibration_ignore,
)

GIB = 1024**3
GB = 10**9
# Per GPU besides weights and KV cache: activations of the largest batch, non-torch memory (CUDA context, cuBLAS and
# NCCL workspaces) and CUDA graphs. Measured: vLLM 0.25 serving the Llama-3-8B shape on an H100 at
# gpu_memory_utilization 0.9 (benchmarks/gpu/raw/costs/lease-2/llama3-8b/plain-k0.log) loaded 14.96 GiB of weights and
# left 50.35 GiB for the KV cache of 0.9 x 79.65 GiB: 6.37 GiB went elsewhere. Taken per GPU at every size (a sharded
# replica's activations shrink, its NCCL buffers grow): a small model's is less (about 1 GiB in the same logs).
OVERHEAD_BYTES = int(6.4 * GIB)
OVERHEAD_SOURCE = "benchmarks/gpu/raw/costs/lease-2/llama3-8b/plain-k0.log (Llama-3-8B shape, vLLM 0.25, H100)"
DEFAULT_GPU = "h100"  # serving.gpu null: plan for the GPU the project's measurements come from
UNQUANTIZED_BITS = 16  # BF16 weights; a float32 checkpoint is served in BF16 by vLLM's auto dtype too


@dataclass(frozen=True)
class ModelShape:
    """What the memory model reads of a dense decoder's config (Llama-style: config.json keys)."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False

    @classmethod
    def from_config(cls, config: Mapping) -> ModelShape:
        """From a config.json mapping; one line naming the missing key."""
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(
                layers=int(config["num_hidden_layers"]),
                hidden_size=hidden,
                heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PipelineError(
                f"model config: can't read the layer shapes ({e!r} missing or not a number): the "
                "memory plan needs num_hidden_layers, hidden_size, num_attention_heads, "
                "intermediate_size and vocab_size"
            ) from None

    @property
    def embedding_parameters(self) -> int:
        """Input embedding and LM head (one matrix when tied): never quantized (quantize.calibration.ignore)."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def parameters(self) -> int:
        """Dense Llama-style count: attention (q, k, v, o), gated MLP (3 matrices), two norms per layer."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        layer = (
            self.hidden_size * (2 * q + 2 * kv) + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size
        )
        return self.layers * layer + self.embedding_parameters + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def weight_bits(spec: VariantSpec) -> float:
    """Bits per quantized weight, scales included (one 16-bit scale per group; NVFP4: an FP8 scale per 16)."""
    if is_unquantized(spec):
        return UNQUANTIZED_BITS
    w = scheme_of(spec).weights
    if w is None:
        return UNQUANTIZED_BITS
    if w.strategy == "group":
        return w.num_bits + 16 / (spec.group_size if spec.group_size and spec.group_size > 0 else PRESET_GROUP)
    if w.strategy == "tensor_group":
        return w.num_bits + 8 / 16
    return w.num_bits  # per channel, tensor or 128x128 block: the scales are a rounding error


def estimated_weight_bytes(shape: ModelShape, spec: VariantSpec) -> int:
    """A checkpoint's bytes before it exists: the decoder layers at the scheme's bits, embeddings in BF16."""
    body = shape.parameters - shape.embedding_parameters
    return int(body * weight_bits(spec) / 8 + shape.embedding_parameters * UNQUANTIZED_BITS / 8)


def kv_dtype_bytes(spec: VariantSpec) -> int:
    return 1 if spec.kv_cache == "fp8" else 2


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the per-GPU need depends on (one variant, one GPU, the serving section's load)."""

    weight_bytes: int  # the whole checkpoint's
    shape: ModelShape
    kv_dtype_bytes: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    overhead_bytes: int = OVERHEAD_BYTES
    groups: WeightGroups = NO_GROUPS  # the weights' integer groups, which each GPU's share must hold whole


@dataclass(frozen=True)
class PerGpu:
    """One GPU's share at a tensor (and pipeline) parallel size, in bytes."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    budget_bytes: int  # gpu_memory_utilization x the GPU's memory
    shard_problem: str | None = None  # why vLLM can't shard the layers at this size (sharding.py); None: it can

    @property
    def need_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def fits_memory(self) -> bool:
        return self.need_bytes <= self.budget_bytes

    @property
    def fits(self) -> bool:
        return self.shard_problem is None and self.fits_memory

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def describe(self) -> str:
        return (
            f"weights {self.weight_bytes / GB:.1f} GB + KV cache {self.kv_bytes / GB:.1f} GB + overhead "
            f"{self.overhead_bytes / GB:.1f} GB = {self.need_bytes / GB:.1f} GB per GPU of "
            f"{self.budget_bytes / GB:.1f} GB"
        ) + (f", and it can't be sharded: {self.shard_problem}" if self.shard_problem else "")


def per_gpu(inputs: MemoryInputs, tensor_parallel_size: int, pipeline_parallel_size: int = 1) -> PerGpu:
    """The memory model: each GPU's bytes at TP x PP (pipeline parallelism splits the layers: weights and KV cache
    divide by it too). KV heads split over TP up to num_kv_heads; beyond, vLLM replicates them (one per GPU)."""
    shape, tp, pp = inputs.shape, tensor_parallel_size, pipeline_parallel_size
    tokens = inputs.max_num_seqs * inputs.max_model_len
    kv_heads_per_gpu = max(1, shape.kv_heads // tp)
    kv = tokens * 2 * -(-shape.layers // pp) * kv_heads_per_gpu * shape.head_dim * inputs.kv_dtype_bytes
    return PerGpu(
        tp,
        pp,
        -(-inputs.weight_bytes // (tp * pp)),
        kv,
        inputs.overhead_bytes,
        int(inputs.gpu_memory_utilization * inputs.gpu_memory_bytes),
        shard_problem(shape, inputs.groups, tp),
    )


def shares(inputs: MemoryInputs, max_tp: int, pipeline_parallel_size: int = 1, min_tp: int = 1) -> list[PerGpu]:
    """The share at each TP of TP_SIZES from min_tp up to max_tp (at least min_tp's), up to the first that fits."""
    out = []
    for tp in (t for t in TP_SIZES if min_tp <= t <= max(min_tp, max_tp)):
        out.append(per_gpu(inputs, tp, pipeline_parallel_size))
        if out[-1].fits:
            break
    return out


def smallest_fit(
    inputs: MemoryInputs, max_tp: int, pipeline_parallel_size: int = 1, min_tp: int = 1
) -> tuple[PerGpu | None, PerGpu]:
    """(the smallest TP of TP_SIZES from min_tp up to max_tp that fits, or None; the share at the largest one tried,
    at least min_tp's)."""
    tried = shares(inputs, max_tp, pipeline_parallel_size, min_tp)
    return (tried[-1] if tried[-1].fits else None), tried[-1]


def gpu_of(serving: ServingParams) -> str:
    gpu = serving.gpu or DEFAULT_GPU
    if gpu not in GPUS:
        raise PipelineError(f"serving.gpu must be one of {sorted(GPUS)} or null, got {gpu!r}")
    return gpu


def memory_inputs(
    serving: ServingParams,
    shape: ModelShape,
    weight_bytes: int,
    spec: VariantSpec,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float | None = None,
    groups: WeightGroups | None = None,
) -> MemoryInputs:
    """The serving section's load, or another vLLM engine's (max_num_seqs, gpu_memory_utilization: its own). groups:
    the checkpoint's (checkpoint_groups); None: what the spec will quantize (spec_groups)."""
    return MemoryInputs(
        weight_bytes,
        shape,
        kv_dtype_bytes(spec),
        max_num_seqs or serving.max_num_seqs,
        serving.max_model_len,
        GPU_MEMORY_GB[gpu_of(serving)] * GB,
        gpu_memory_utilization or serving.gpu_memory_utilization,
        groups=groups if groups is not None else spec_groups(spec, shape),
    )


@dataclass(frozen=True)
class Engine:
    """A vLLM engine a stage runs besides serving (distill's generator, evaluate's): its own memory share, and the
    KV cache it needs to start (one max_model_len sequence: it batches within what is left)."""

    param: str  # the params key of its gpu_memory_utilization, named in the error line
    gpu_memory_utilization: float

    @classmethod
    def of(cls, params: Mapping, section: str) -> Engine:
        """draft_training.vllm or evaluate.vllm as params.yaml holds it (distill's default share: 0.5)."""
        node = params
        for key in section.split("."):
            node = node.get(key) or {}
        return cls(f"{section}.gpu_memory_utilization", float(node.get("gpu_memory_utilization", 0.5)))

    def inputs(
        self,
        serving: ServingParams,
        shape: ModelShape,
        weight_bytes: int,
        spec: VariantSpec,
        groups: WeightGroups | None = None,
    ) -> MemoryInputs:
        return memory_inputs(serving, shape, weight_bytes, spec, 1, self.gpu_memory_utilization, groups)


def engine_fit(
    name: str,
    engine: Engine,
    serving: ServingParams,
    shape: ModelShape,
    weight_bytes: int,
    spec: VariantSpec,
    at_least: int = 1,
    groups: WeightGroups | None = None,
) -> PerGpu:
    """The smallest TP from at_least up to serving.max_tensor_parallel_size at which `engine` holds `name`'s weights
    (the memory model above at the engine's own share). Where none does with the overhead estimate (measured at 8B
    serving load: an upper estimate for a one-sequence engine, and larger than a small GPU's share), the smallest
    whose weights and KV cache alone fit, and vLLM's own memory check has the last word on the GPU; one line only
    when they exceed the share at every size: no engine can start then."""
    inputs = engine.inputs(serving, shape, weight_bytes, spec, groups)
    fit, largest = smallest_fit(inputs, serving.max_tensor_parallel_size, min_tp=at_least)
    if fit is None:  # the smallest size whose weights and KV cache alone fit the share
        fit, _ = smallest_fit(replace(inputs, overhead_bytes=0), serving.max_tensor_parallel_size, min_tp=at_least)
        if fit is not None:
            return per_gpu(inputs, fit.tensor_parallel_size)
    if fit is None:
        raise PipelineError(
            f"{name}: vLLM at {engine.param} {engine.gpu_memory_utilization} does not fit {gpu_of(serving)} GPUs at "
            f"tensor parallel {at_least} up to serving.max_tensor_parallel_size {serving.max_tensor_parallel_size}: at "
            f"{largest.tensor_parallel_size} {largest.describe()}; raise {engine.param} or "
            "serving.max_tensor_parallel_size"
        )
    return fit


@dataclass(frozen=True)
class TpDecision:
    """A variant's GPUs per replica, with the share that decided it."""

    variant: str
    tensor_parallel_size: int
    pinned: bool
    gpu: str  # the GPU planned for (serving.gpu, or DEFAULT_GPU when null)
    weights_from: str  # checkpoint | estimate | pinned (no shape known)
    share: PerGpu | None  # None: pinned without a known shape

    def reason(self) -> str:
        """Why this size, for the card and the logs: pinned or the smallest fit, and the per-GPU share."""
        if self.weights_from == UNREAD_SHAPE:
            return (
                "auto, but the memory model can't read this model config's layer shapes: one GPU (pin "
                "serving.tensor_parallel_size to shard it)"
            )
        how = (
            "pinned by serving.tensor_parallel_size"
            if self.pinned
            else f"the smallest of {', '.join(map(str, TP_SIZES))} that fits {self.gpu} and shards"
        )
        return how + (f": {self.share.describe()} ({self.weights_from} weights)" if self.share is not None else "")

    def summary(self) -> str:
        return f"{self.variant}: tensor parallel {self.tensor_parallel_size} ({self.reason()})"


def decide(
    variant: str,
    spec: VariantSpec,
    serving: ServingParams,
    shape: ModelShape | None,
    weight_bytes: int | None = None,
    groups: WeightGroups | None = None,
) -> TpDecision:
    """The variant's tensor parallelism; one error line when it can't fit or shard. weight_bytes, groups: the
    checkpoint's (None: estimated from shape and the scheme)."""
    pinned = serving.tensor_parallel_size != AUTO_TP
    gpu = gpu_of(serving)
    if shape is None:  # auto: one GPU, as before sizes were chosen; the card and logs say why
        return TpDecision(
            variant,
            serving.tensor_parallel_size if pinned else 1,
            pinned,
            gpu,
            "pinned" if pinned else UNREAD_SHAPE,
            None,
        )
    weights_from = "checkpoint" if weight_bytes is not None else "estimate"
    inputs = memory_inputs(
        serving,
        shape,
        weight_bytes if weight_bytes is not None else estimated_weight_bytes(shape, spec),
        spec,
        groups=groups,
    )
    share = pinned_share(variant, inputs, serving) if pinned else auto_share(variant, inputs, serving)
    return TpDecision(variant, share.tensor_parallel_size, pinned, gpu, weights_from, share)


def pinned_share(variant: str, inputs: MemoryInputs, serving: ServingParams) -> PerGpu:
    """serving.tensor_parallel_size's share, or one error line when vLLM can't shard it or serving.gpu can't hold it."""
    gpu = gpu_of(serving)
    share = per_gpu(inputs, serving.tensor_parallel_size)
    if share.shard_problem:
        raise PipelineError(
            f"serving.tensor_parallel_size {share.tensor_parallel_size} can't shard variant {variant}: "
            f"{share.shard_problem}; {what_shards(inputs, share.tensor_parallel_size, serving.gpu is not None)}"
        )
    if serving.gpu is not None and not share.fits:  # no GPU named: the pinned size is the user's to know
        raise PipelineError(
            f"variant {variant} does not fit serving.gpu {gpu} at the pinned "
            f"serving.tensor_parallel_size {share.tensor_parallel_size}: {share.describe()}; "
            "set it to auto or larger, or lower serving.max_num_seqs / max_model_len"
        )
    return share


def auto_share(variant: str, inputs: MemoryInputs, serving: ServingParams) -> PerGpu:
    """auto: the share at the smallest size that fits and shards; one error line when none does."""
    gpu = gpu_of(serving)
    # Each rule of sharding.py that fails at a size fails at every larger one of 1, 2, 4, 8 (groups in input / TP;
    # heads, KV heads, MLP width over TP): where the smallest size that fits memory doesn't shard, none does.
    tried = shares(inputs, serving.max_tensor_parallel_size)
    fit, largest = (tried[-1] if tried[-1].fits else None), tried[-1]
    unsharded = [s for s in tried if s.shard_problem and s.fits_memory]
    if fit is None and unsharded:
        first = unsharded[0]
        raise PipelineError(
            f"variant {variant} fits {gpu} GPUs from tensor parallel {first.tensor_parallel_size} but vLLM can't "
            f"shard it there: {first.shard_problem}, nor at any larger size up to serving.max_tensor_parallel_size "
            f"{serving.max_tensor_parallel_size}; {what_shards(inputs, first.tensor_parallel_size, True)}"
        )
    if fit is None:
        raise PipelineError(
            f"variant {variant} does not fit {gpu} GPUs ({GPU_MEMORY_GB[gpu]} GB) at tensor parallel up to "
            f"serving.max_tensor_parallel_size {serving.max_tensor_parallel_size}: at {largest.tensor_parallel_size} "
            f"{largest.describe()} (gpu_memory_utilization {serving.gpu_memory_utilization}, KV cache for "
            f"max_num_seqs {serving.max_num_seqs} x max_model_len {serving.max_model_len}); lower those, quantize "
            "it, or serve it across hosts (docs/scale.md)"
        )
    return fit


def what_shards(inputs: MemoryInputs, tensor_parallel_size: int, check_memory: bool) -> str:
    """What would work instead of a size vLLM can't shard at: the group size that shards there, a smaller size that
    shards (and fits memory, with check_memory), else a larger GPU or a lighter load."""
    options = []
    group = group_that_shards(inputs.shape, inputs.groups, tensor_parallel_size)
    if group is not None:
        options.append(f"{inputs.groups.param} {group}")
    smaller = [
        t
        for t in TP_SIZES
        if t < tensor_parallel_size
        and (share := per_gpu(inputs, t)).shard_problem is None
        and (share.fits_memory or not check_memory)
    ]
    if smaller:
        options.append(f"serving.tensor_parallel_size {max(smaller)}")
    if not options:
        return (
            "no smaller size that fits shards, nor does a group size: plan for a larger serving.gpu or lower "
            "serving.max_num_seqs / max_model_len"
        )
    return "use " + " or ".join(options)


def read_config(model_dir: Path) -> dict | None:
    config = Path(model_dir) / "config.json"
    try:
        return json.loads(config.read_text()) if config.is_file() else None
    except (OSError, ValueError):
        return None  # an unreadable config is the models/quantize stages' to report, with its file


def checkpoint_bytes(model_dir: Path) -> int | None:
    """The weights' bytes in a checkpoint directory (safetensors, else PyTorch .bin); None when there are none."""
    files = [f for f in Path(model_dir).glob("*.safetensors")] or list(Path(model_dir).glob("*.bin"))
    return sum(f.stat().st_size for f in files) or None


def source_config(params: Mapping, role: str = "target") -> dict | None:
    """The target's config before any stage has run: the demo's from params, a local directory's config.json, a Hub
    repo's config.json already in the local cache; None where it is not known yet."""
    section = params.get(role) if isinstance(params.get(role), Mapping) else {}
    source = str(section.get("source"))
    if source == "demo":
        demo = params.get("demo") or {}
        d = demo.get(role) or {}
        return {
            "vocab_size": demo.get("vocab_size"),
            "tie_word_embeddings": False,
            **{
                k: d.get(k)
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                )
            },
        }
    local = read_config(Path(source).expanduser())
    if local is not None:
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source.removeprefix("hf:"), "config.json", revision=section.get("revision"))
    except Exception:  # noqa: BLE001 - not a Hub id, or no cache: unknown until the models stage fetches it
        return None
    return read_config(Path(cached).parent) if isinstance(cached, str) else None


UNREAD_SHAPE = "unknown shape"  # TpDecision.weights_from where the config's layer shapes could not be read


def shape_of(config: Mapping | None) -> ModelShape | None:
    """The config's layer shapes; None where there is no config yet or it is not a Llama-style dense decoder's (the
    memory model can't size it: auto then serves on one GPU, see decide)."""
    if config is None:
        return None
    try:
        return ModelShape.from_config(config)
    except PipelineError:
        return None


@dataclass(frozen=True)
class Known:
    """What a variant's sizes are decided from: its recipe, the serving section, and the model's shape, weight bytes
    and weight groups (None: estimated from the shape and the scheme; shape None: not known yet)."""

    spec: VariantSpec
    serving: ServingParams
    shape: ModelShape | None
    weight_bytes: int | None
    groups: WeightGroups | None = None

    @property
    def weights(self) -> int:
        return self.weight_bytes if self.weight_bytes is not None else estimated_weight_bytes(self.shape, self.spec)


def known_for(variant: str, params: Mapping, checkpoint: Path | None = None) -> Known:
    """The shape, bytes and weight groups from the variant's checkpoint (artifacts/quantized/<variant>, or
    `checkpoint`) when it exists, else the built target's config, else the source's (source_config) with the bytes
    and groups estimated."""
    serving = ServingParams.parse(params[ServingParams.SECTION])
    spec = with_calibration_ignore(variant_spec(params["quantize"]["variants"], variant), params)
    checkpoint = Path(checkpoint) if checkpoint is not None else paths.QUANTIZED / variant
    config, weight_bytes, groups = read_config(checkpoint), None, None
    if config is not None:
        weight_bytes = checkpoint_bytes(checkpoint)
    else:
        config = read_config(paths.TARGET) or source_config(params)
    shape = shape_of(config)
    if weight_bytes is not None and shape is not None:
        groups = checkpoint_groups(config, shape, variant)
    return Known(spec, serving, shape, weight_bytes, groups)


def decision_for(variant: str, params: Mapping, checkpoint: Path | None = None) -> TpDecision:
    """tensor_parallel_for with what decided it (known_for's shape, bytes and groups)."""
    known = known_for(variant, params, checkpoint)
    return decide(variant, known.spec, known.serving, known.shape, known.weight_bytes, known.groups)


def evaluate_tp(variant: str, decision: TpDecision, known: Known, engine: Engine) -> int:
    """evaluate's vLLM engines' TP: the smallest that is at least the variant's serving TP (quality measured as
    served, or sharded wider) and fits evaluate.vllm's own memory share. A size pinned with serving.gpu null is the
    user's to know, as in decide(); one line when nothing up to serving.max_tensor_parallel_size fits."""
    if known.shape is None or (decision.pinned and known.serving.gpu is None):
        return decision.tensor_parallel_size
    return engine_fit(
        f"evaluate@{variant}",
        engine,
        known.serving,
        known.shape,
        known.weights,
        known.spec,
        at_least=decision.tensor_parallel_size,
        groups=known.groups,
    ).tensor_parallel_size


def evaluate_tensor_parallel(variant: str, params: Mapping, checkpoint: Path | None = None) -> int:
    """evaluate_tp for the variant as built (known_for), at evaluate.vllm.gpu_memory_utilization."""
    known = known_for(variant, params, checkpoint)
    decision = decide(variant, known.spec, known.serving, known.shape, known.weight_bytes, known.groups)
    return evaluate_tp(variant, decision, known, Engine.of(params, "evaluate.vllm"))


def evaluate_sizes(
    params: Mapping, decisions: Mapping[str, TpDecision], specs: Mapping[str, VariantSpec], config: Mapping | None
) -> dict[str, int]:
    """evaluate_tp of each decided variant from a config, bytes estimated: the params check refuses, in one line and
    before any work, a variant evaluate.vllm's share can't hold up to serving.max_tensor_parallel_size."""
    serving, shape = ServingParams.parse(params[ServingParams.SECTION]), shape_of(config)
    engine = Engine.of(params, "evaluate.vllm")
    return {n: evaluate_tp(n, d, Known(specs[n], serving, shape, None), engine) for n, d in decisions.items()}


def engine_serving(serving: ServingParams, tensor_parallel_size: int) -> ServingParams:
    """The serving section for an engine sharded at its own size: a draft TP that is set follows it (vLLM serves a
    draft model only at its target's)."""
    speculation = serving.speculation
    if speculation.draft_tensor_parallel_size is not None:
        speculation = replace(speculation, draft_tensor_parallel_size=tensor_parallel_size)
    return replace(serving, tensor_parallel_size=tensor_parallel_size, speculation=speculation)


def tensor_parallel_for(variant: str, params: Mapping, checkpoint: Path | None = None) -> int:
    """GPUs one replica of `variant` shards over (vLLM tensor_parallel_size): serving.tensor_parallel_size when it
    pins one, else the smallest of 1, 2, 4, 8 that fits serving.gpu (decide). params: params.yaml as loaded
    (pipeline.params.load.load_params()); checkpoint: the variant's model directory (None:
    artifacts/quantized/<variant>). Raises PipelineError (one line) when the variant can't fit."""
    return decision_for(variant, params, checkpoint).tensor_parallel_size


def resolved(serving: ServingParams, tensor_parallel_size: int) -> ServingParams:
    """The serving section with its tensor parallelism for one variant: what engine_args, the tiers and the manifests
    read (an int there, never auto)."""
    return replace(serving, tensor_parallel_size=tensor_parallel_size)


def serving_for(variant: str, params: Mapping, checkpoint: Path | None = None) -> ServingParams:
    """The serving section as `variant` is served: resolved at tensor_parallel_for's size."""
    return resolved(
        ServingParams.parse(params[ServingParams.SECTION]), tensor_parallel_for(variant, params, checkpoint)
    )


TARGET_SPEC = VariantSpec("target", "none", None)  # the unquantized target as distill's vLLM engine runs it


def target_tensor_parallel(params: Mapping, model_dir: Path = paths.TARGET) -> int:
    """The unquantized target's tensor parallelism in distill's vLLM engine: the smallest that fits at
    draft_training.vllm.gpu_memory_utilization with one max_model_len sequence (engine_fit; what the plan's distill row
    shows); a pinned serving.tensor_parallel_size pins it too."""
    serving = ServingParams.parse(params[ServingParams.SECTION])
    config = read_config(model_dir) or source_config(params)
    shape, weight_bytes = shape_of(config), checkpoint_bytes(model_dir) if read_config(model_dir) else None
    if serving.tensor_parallel_size != AUTO_TP or shape is None:  # pinned, or decide()'s line for an unknown shape
        return decide("target", TARGET_SPEC, serving, shape, weight_bytes).tensor_parallel_size
    weights = weight_bytes if weight_bytes is not None else estimated_weight_bytes(shape, TARGET_SPEC)
    return engine_fit(
        "distill", Engine.of(params, "draft_training.vllm"), serving, shape, weights, TARGET_SPEC
    ).tensor_parallel_size


def decide_enabled(
    serving: ServingParams, specs: Mapping[str, VariantSpec], config: Mapping | None
) -> dict[str, TpDecision]:
    """Every enabled variant's decision from a config (the source's or the built target's), before quantization:
    estimated bytes. {} when the config is unknown and the size is auto (decided later, in the models stage)."""
    shape = shape_of(config)
    if shape is None and serving.tensor_parallel_size == AUTO_TP:
        return {}
    return {name: decide(name, spec, serving, shape) for name, spec in specs.items()}
