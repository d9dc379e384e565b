"""Whether vLLM can shard a model's layers over tensor_parallel_size GPUs with a variant's weight groups.

A memory fit is not enough: a GPTQ W4A16 group-128 checkpoint of the demo target (hidden 384) does not start at TP 2
(benchmarks/gpu/SCALE.md, raw/tpeval: "Weight input_size_per_partition=192 for layer
'model.layers.0.self_attn.o_proj' is not divisible by group_size=128"). vLLM 0.26.0's rules (its sdist on PyPI), for a
Llama-style dense decoder:

- attention heads: vllm/config/model.py, ModelConfig.verify_with_parallel_config:
  `if total_num_attention_heads % tensor_parallel_size != 0: raise ValueError(...)`;
- KV heads: vllm/model_executor/layers/linear.py, QKVParallelLinear: `if tp_size >= self.total_num_kv_heads:
  self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)` else `self.num_kv_heads =
  divide(self.total_num_kv_heads, tp_size)`: split evenly, or (more GPUs than KV heads) each replicated evenly;
- MLP width: MergedColumnParallelLinear (gate_proj, up_proj) `divide(output_size, self.tp_size)`, RowParallelLinear
  (down_proj) divides its input the same way: intermediate_size % TP;
- integer weights in groups (compressed-tensors' W4A16/W8A16: compressed_tensors/schemes/compressed_tensors_wNa16.py
  create_weights; W4A8 and W4AFP8 likewise):
      group_size = self.group_size if self.group_size != -1 else input_size
      row_parallel = input_size != input_size_per_partition
      partition_scales = not marlin_repeat_scales_on_all_ranks(self.has_g_idx, self.group_size, row_parallel)
      if partition_scales:
          verify_group_size_divides_partition(input_size_per_partition, group_size, self.layer_name)
  and vllm/distributed/utils.py raises unless `input_size_per_partition % group_size == 0`. So each GPU's share of a
  layer's input must be a whole number of groups: a row-parallel layer (o_proj: heads x head_dim inputs; down_proj:
  intermediate_size) holds input / TP, a column-parallel one (q, k, v, gate, up) its whole input (which
  recipes.choose_group_size already checks at TP 1). Channel-wise weights (group -1) repeat their scales on every GPU
  of a row-parallel layer: no check. has_g_idx (GPTQ actorder "group") also repeats them, but this project never
  writes it (recipes.GPTQ_ACTORDERS).
- kernel tiles: no rule of their own in 0.26. The kernel is chosen first (kernels/linear/__init__.py
  choose_mp_linear_kernel, on CUDA: CutlassW4A8, Machete, AllSpark, Marlin, ...). Machete needs input per GPU % 64 and
  output per GPU % 128 (quantization/utils/machete_utils.py check_machete_supports_shape) but gives way to Marlin,
  whose can_implement (kernels/linear/mixed_precision/marlin.py) without act-order checks only the group ("A group
  straddling TP ranks cannot be fixed by padding") and then "Tile misalignment is fixed by zero-padding at weight
  prep": a column-parallel layer's output per GPU is never refused.

Not covered: FP8 128x128 block weights (vLLM's fp8_utils.validate_fp8_block_shape: input per GPU % 128 on row-parallel
layers, each output partition % 128) and MXFP4/NVFP4's groups of 32/16.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pipeline.quantize.recipes import (
    CHANNELWISE,
    VLLM_WNA16_GROUP_SIZES,
    VariantSpec,
    is_unquantized,
    is_wna16,
    scheme_of,
)
from pipeline.quantize.settings import UNQUANTIZED

if TYPE_CHECKING:
    from pipeline.serving.parallelism import ModelShape

PRESET_GROUP = 128  # compressed-tensors' group size for its integer W*A* presets


def largest_served_group(configured: int, widths: Iterable[int]) -> int:
    """The largest of VLLM_WNA16_GROUP_SIZES up to `configured` that divides every width, else CHANNELWISE (as
    recipes.choose_group_size picks the group for an unset group_size)."""
    widths = list(widths)
    return next((g for g in VLLM_WNA16_GROUP_SIZES if g <= configured and all(w % g == 0 for w in widths)), CHANNELWISE)


@dataclass(frozen=True)
class Layer:
    """A Linear of a Llama-style decoder layer, as vLLM shards it."""

    kind: str  # q_proj, ..., down_proj
    module: str  # self_attn | mlp
    row_parallel: bool  # splits its input (RowParallelLinear), else its output (column-parallel)


LAYERS = (
    Layer("q_proj", "self_attn", False),
    Layer("k_proj", "self_attn", False),
    Layer("v_proj", "self_attn", False),
    Layer("o_proj", "self_attn", True),
    Layer("gate_proj", "mlp", False),
    Layer("up_proj", "mlp", False),
    Layer("down_proj", "mlp", True),
)


def input_width(shape: ModelShape, layer: Layer) -> int:
    if layer.kind == "o_proj":
        return shape.heads * shape.head_dim
    return shape.intermediate_size if layer.kind == "down_proj" else shape.hidden_size


def input_per_gpu(shape: ModelShape, layer: Layer, tensor_parallel_size: int) -> int:
    width = input_width(shape, layer)
    return width // tensor_parallel_size if layer.row_parallel else width


def module_names(shape: ModelShape, layer: Layer) -> list[str]:
    """The layer's module name in each decoder layer (transformers' and vLLM's: what `re:` targets match)."""
    return [f"model.layers.{i}.{layer.module}.{layer.kind}" for i in range(shape.layers)]


def matches(name: str, target: str) -> bool:
    """compressed-tensors' and vLLM's target matching: `re:` from the start of the name, a class name, or the name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == "Linear" or target == name


@dataclass(frozen=True)
class WeightGroups:
    """The integer weight group sizes a variant's layers carry: (layer kind, group size) pairs, and the param that
    sets the size (named where a size can't shard)."""

    pairs: tuple[tuple[str, int], ...] = ()
    param: str = ""

    def of(self, kind: str) -> list[int]:
        return sorted({g for k, g in self.pairs if k == kind})


NO_GROUPS = WeightGroups()


def _grouped(kinds: Iterable[tuple[Layer, int]], param: str) -> WeightGroups:
    return WeightGroups(tuple(sorted({(layer.kind, g) for layer, g in kinds})), param)


def spec_groups(spec: VariantSpec, shape: ModelShape) -> WeightGroups:
    """The groups a variant's checkpoint will carry, before it exists: its scheme's (and a `mixed:` variant's every
    scheme's: any layer may take any of them) integer group size, the spec's group_size or the preset's, replaced as
    recipes.choose_group_size replaces an unset one that doesn't divide a layer's input; on every layer kind the
    spec's ignore leaves quantized in some decoder layer."""
    if is_unquantized(spec):
        return NO_GROUPS
    sizes = set()
    for name in (spec.scheme, *(spec.mixed.schemes if spec.mixed else ())):
        if name == UNQUANTIZED:
            continue
        scheme = scheme_of(replace(spec, scheme=name))
        w = scheme.weights
        if w is None or w.type != "int" or w.strategy != "group":
            continue  # channel-wise, per tensor, float: nothing split in groups
        size = spec.group_size or PRESET_GROUP
        if spec.group_size is None and is_wna16(scheme):
            size = largest_served_group(size, (input_width(shape, layer) for layer in LAYERS))
        if size != CHANNELWISE:
            sizes.add(size)
    quantized = [
        layer
        for layer in LAYERS
        if not all(any(matches(n, p) for p in spec.ignore) for n in module_names(shape, layer))
    ]
    return _grouped(((layer, g) for layer in quantized for g in sizes), group_param(spec.name))


def group_param(variant: str) -> str:
    return f"quantize.variants.{variant}.group_size"


def with_calibration_ignore(spec: VariantSpec, params: Mapping) -> VariantSpec:
    """The spec with quantize.calibration.ignore added to its own ignore, as recipes.config_groups quantizes it."""
    base = ((params.get("quantize") or {}).get("calibration") or {}).get("ignore") or []
    return replace(spec, ignore=sorted(set(spec.ignore) | {str(p) for p in base}))


def checkpoint_groups(config: Mapping, shape: ModelShape, variant: str) -> WeightGroups | None:
    """The groups a built compressed-tensors checkpoint carries (config.json's quantization_config: each layer's first
    config group whose targets match it, unless ignored); None where the config has none to read."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping) or not isinstance(quant.get("config_groups"), Mapping):
        return None
    ignore = [t for t in quant.get("ignore") or [] if isinstance(t, str)]
    groups = [g for g in quant["config_groups"].values() if isinstance(g, Mapping)]
    found = []
    for layer in LAYERS:
        for name in module_names(shape, layer):
            if any(matches(name, t) for t in ignore):
                continue
            group = next((g for g in groups if any(matches(name, t) for t in g.get("targets") or [])), None)
            w = (group or {}).get("weights") or {}
            size = w.get("group_size")
            if w.get("type") == "int" and w.get("strategy") == "group" and isinstance(size, int) and size > 0:
                found.append((layer, size))
    return _grouped(found, group_param(variant))


def shard_problem(shape: ModelShape, groups: WeightGroups, tensor_parallel_size: int) -> str | None:
    """Why vLLM 0.26 refuses to shard the model over tensor_parallel_size GPUs (the module docstring's rules), in one
    line naming the layer kind, its width per GPU and the group size; None where it shards."""
    tp = tensor_parallel_size
    if shape.heads % tp:
        return f"the model's {shape.heads} attention heads do not divide over {tp} GPUs (vLLM requires it)"
    kv = shape.kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):
        return (
            f"the model's {kv} KV heads neither divide over {tp} GPUs nor replicate evenly on them (vLLM requires "
            "one or the other)"
        )
    if shape.intermediate_size % tp:
        return f"the MLP's intermediate size {shape.intermediate_size} does not divide over {tp} GPUs"
    for layer in LAYERS:
        width = input_per_gpu(shape, layer, tp)
        for size in groups.of(layer.kind):
            if width % size:
                how = (
                    f"{input_width(shape, layer)} / {tp}, row-parallel"
                    if layer.row_parallel and tp > 1
                    else "its whole input"
                )
                return (
                    f"{layer.kind}'s input per GPU at tensor parallel {tp} is {width} ({how}), not a whole number of "
                    f"weight groups of {size}"
                )
    return None


def group_that_shards(shape: ModelShape, groups: WeightGroups, tensor_parallel_size: int) -> int | None:
    """The largest group size vLLM's INT weight-only kernels serve (VLLM_WNA16_GROUP_SIZES) that divides every grouped
    layer's input per GPU at this size; None where the model has no groups, or none does, or the heads don't shard."""
    if not groups.pairs or shard_problem(shape, NO_GROUPS, tensor_parallel_size) is not None:
        return None
    widths = [input_per_gpu(shape, layer, tensor_parallel_size) for layer in LAYERS if groups.of(layer.kind)]
    size = largest_served_group(max(VLLM_WNA16_GROUP_SIZES), widths)
    return None if size == CHANNELWISE else size
