"""Variant specs from params.yaml -> llm-compressor 0.14 modifier lists (the recipe).

A variant spec names an `algorithm` (awq, gptq, rtn) and a compressed-tensors preset
`scheme`; everything else passes straight through as overrides (group size, ignore list,
kv-cache scheme, the algorithm's own knobs, calibration sample count and length), the way
llm-compressor's own recipes do. `algorithm: none` (no scheme) is the unquantized target in its
own dtype: the BF16 baseline every quality and speed ratio is taken against, in the same run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pipeline.core.errors import PipelineError
from pipeline.core.names import check_variant_name
from pipeline.core.sections import thawed
from pipeline.quantize.presets import PRESETS, Scheme
from pipeline.quantize.settings import UNQUANTIZED, MixedSearch

# Knobs each algorithm's modifier takes (GPTQModifier / AWQModifier fields); rtn is plain
# QuantizationModifier: round-to-nearest weights plus observed activation scales.
ALGORITHM_KEYS = {
    "gptq": ("actorder", "dampening_frac", "block_size"),
    "awq": ("duo_scaling", "n_grid", "offload_device"),
    "rtn": (),
    "none": (),  # the unquantized target (the BF16 baseline variant): no recipe, no scheme
}
ALGORITHMS = tuple(ALGORITHM_KEYS)
# What GPTQ 0.14 runs: weight-ordered columns ("static" is its alias) or none; the old "group"
# (dynamic) ordering is deprecated and would only fail after calibration.
GPTQ_ACTORDERS = (None, "static", "weight")
# Per-variant overrides of quantize.calibration.
CALIBRATION_KEYS = ("num_samples", "max_seq_length")
# FP8 KV cache with calibrated per-tensor scales: lets vLLM serve with kv_cache_dtype=fp8.
KV_CACHE_SCHEMES = {"fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}
# SmoothQuant (migrate activation outliers into the weights) before GPTQ or RTN: INT8 W8A8 needs it.
SMOOTHING_ALGORITHMS = ("gptq", "rtn")
# vLLM's kernels for integer weights with 16-bit activations (W4A16, W8A16: compressed-tensors' WNA16 scheme) and the
# group sizes they serve, from vLLM's source (-1 there: channel-wise, one scale per output channel):
# - Marlin, every NVIDIA GPU from compute capability 8.0: MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]
#   (vllm/model_executor/layers/quantization/utils/marlin_utils.py, _check_marlin_supported);
# - Machete, Hopper (9.0): query_machete_supported_group_sizes -> [-1, 64, 128] for float16/bfloat16 activations
#   (vllm/model_executor/layers/quantization/utils/machete_utils.py; kernels/linear/mixed_precision/machete.py).
# A group must divide the layer's input width (compressed-tensors' group quantization, and Marlin's
# verify_marlin_supports_shape). Where the configured size does not, the largest of these that divides every
# quantized layer's input width is used, else channel-wise (choose_group_size).
VLLM_WNA16_GROUP_SIZES = (128, 64, 32)
CHANNELWISE = -1  # VariantSpec.group_size once chosen: one scale per output channel (vLLM's group_size -1)
WNA16_KERNELS = "Marlin: 32, 64, 128; Machete on Hopper: 64, 128; or channel-wise"
# A per-layer search (`mixed:`) applies the variant's own quantizer to every layer it quantizes: GPTQ and RTN act on
# each Linear alone, while AWQ's smoothing rescales pairs of layers that may land in different schemes.
MIXED_ALGORITHMS = ("gptq", "rtn")
# Keys of a variant spec; anything else is a typo.
SPEC_KEYS = {
    "algorithm",
    "scheme",
    "group_size",
    "ignore",
    "kv_cache",
    "smoothing_strength",
    "mixed",
    *CALIBRATION_KEYS,
    *(k for keys in ALGORITHM_KEYS.values() for k in keys),
}


@dataclass(frozen=True)
class VariantSpec:
    """One quantize.variants entry, validated once (parse_variant) and passed as this value."""

    name: str
    algorithm: str  # awq | gptq | rtn
    scheme: str | None  # a compressed-tensors preset, e.g. W4A16, FP8_DYNAMIC; None for `none`
    group_size: int | None = None
    ignore: list[str] = field(default_factory=list)
    kv_cache: str | None = None  # fp8: calibrated FP8 KV-cache scales
    smoothing_strength: float | None = None  # SmoothQuant before the quantizer (INT8 W8A8)
    num_samples: int | None = None  # overrides quantize.calibration
    max_seq_length: int | None = None
    knobs: dict = field(default_factory=dict)  # the algorithm's own modifier arguments
    mixed: MixedSearch | None = None  # a per-layer precision search over these schemes (pipeline/quantize/mixed.py)


def parse_variant(name: str, raw) -> VariantSpec:
    """params.yaml's quantize.variants[name] as a VariantSpec, or one error line naming the problem."""
    check_variant_name(name)
    validate_spec(name, raw)
    knobs = {k: raw[k] for k in ALGORITHM_KEYS[raw["algorithm"]] if k in raw}
    spec = VariantSpec(
        name=name,
        algorithm=raw["algorithm"],
        scheme=raw.get("scheme"),
        group_size=raw.get("group_size"),
        ignore=list(raw.get("ignore", [])),
        kv_cache=raw.get("kv_cache"),
        smoothing_strength=raw.get("smoothing_strength"),
        num_samples=raw.get("num_samples"),
        max_seq_length=raw.get("max_seq_length"),
        knobs=knobs,
        mixed=parse_mixed(name, raw),
    )
    if spec.group_size is not None and is_wna16(scheme_of(spec)) and spec.group_size not in VLLM_WNA16_GROUP_SIZES:
        raise PipelineError(
            f"quantize.variants.{name}.group_size is {spec.group_size}, a size vLLM's INT"
            f"{scheme_of(spec).weights.num_bits} weight-only kernels do not serve ({WNA16_KERNELS}); "
            f"set it to one of {', '.join(map(str, VLLM_WNA16_GROUP_SIZES))} (where it does "
            "not divide a layer's input width, the largest that divides them all is used)"
        )
    return spec


def parse_mixed(name: str, raw: dict) -> MixedSearch | None:
    """quantize.variants.<name>.mixed, checked against the variant: every scheme an integer weight-only one vLLM
    serves with the same kernels as the variant's own (Marlin/Machete, WNA16) or UNQUANTIZED, each wider than the one
    before it, so a promotion always buys precision with bytes."""
    if raw.get("mixed") is None:
        return None
    where = f"quantize.variants.{name}.mixed"
    mixed = MixedSearch.parse(raw["mixed"], where)
    if raw["algorithm"] not in MIXED_ALGORITHMS:
        raise PipelineError(
            f"{where}: the per-layer search quantizes with {list(MIXED_ALGORITHMS)}, not "
            f"{raw['algorithm']!r} (AWQ's smoothing spans layers the search may split)"
        )
    ladder = [raw["scheme"], *mixed.schemes]
    for scheme in ladder:
        if scheme != UNQUANTIZED and (scheme not in PRESETS or not is_wna16(PRESETS[scheme])):
            raise PipelineError(
                f"{where}: scheme {scheme!r} is not an integer weight-only scheme (W4A16, W8A16, ...) "
                f"nor {UNQUANTIZED}; the search mixes schemes vLLM serves with one kernel family"
            )
    bits = [16 if s == UNQUANTIZED else PRESETS[s].weights.num_bits for s in ladder]
    if any(b <= a for a, b in zip(bits, bits[1:])):
        raise PipelineError(
            f"{where}.schemes must widen the variant's {raw['scheme']} step by step (weight bits "
            f"{bits} for {ladder}), e.g. [W8A16, {UNQUANTIZED}]"
        )
    return mixed


def validate_spec(name: str, spec: dict) -> None:
    if not isinstance(spec, dict):
        raise PipelineError(f"variant {name!r}: expected a mapping of recipe keys, got {spec!r}")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise PipelineError(f"variant {name!r}: unknown recipe keys {sorted(unknown)} (known: {sorted(SPEC_KEYS)})")
    algorithm = spec.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise PipelineError(f"variant {name!r}: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    foreign = [k for a, keys in ALGORITHM_KEYS.items() if a != algorithm for k in keys if k in spec]
    if foreign:
        raise PipelineError(
            f"variant {name!r}: {sorted(foreign)} do not apply to algorithm {algorithm!r} "
            f"(its keys: {list(ALGORITHM_KEYS[algorithm]) or 'none'})"
        )
    if algorithm == "none":
        extra = sorted(set(spec) - {"algorithm"})
        if extra:
            raise PipelineError(f"variant {name!r}: algorithm 'none' is the unquantized target; {extra} do not apply")
        return
    if spec.get("scheme") not in PRESETS:
        raise PipelineError(
            f"variant {name!r}: unknown quantization scheme {spec.get('scheme')!r} "
            f"(compressed-tensors presets: {', '.join(sorted(PRESETS))})"
        )
    if spec.get("kv_cache") not in (None, *KV_CACHE_SCHEMES):
        raise PipelineError(f"variant {name!r}: kv_cache must be one of {list(KV_CACHE_SCHEMES)} or absent")
    strength = spec.get("smoothing_strength")
    if strength is not None:
        if algorithm not in SMOOTHING_ALGORITHMS:
            raise PipelineError(
                f"variant {name!r}: smoothing_strength (SmoothQuant) applies to "
                f"{list(SMOOTHING_ALGORITHMS)}, not {algorithm!r}"
            )
        if not isinstance(strength, (int, float)) or isinstance(strength, bool) or not 0 < strength < 1:
            raise PipelineError(f"variant {name!r}: smoothing_strength must be a number in (0, 1), got {strength!r}")
    if spec.get("actorder") not in GPTQ_ACTORDERS:
        raise PipelineError(
            f"variant {name!r}: actorder must be one of {list(GPTQ_ACTORDERS)}, got {spec['actorder']!r}"
        )
    for key in ("group_size", *CALIBRATION_KEYS):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise PipelineError(f"variant {name!r}: {key} must be a positive integer, got {value!r}")
    ignore = spec.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise PipelineError(f"variant {name!r}: ignore must be a list of module names or patterns")


def scheme_of(spec: VariantSpec) -> Scheme:
    """scheme_for's weights and input activations (type, bits, strategy) from presets.PRESETS, without importing
    compressed-tensors: what the stages that only read a variant's scheme (bundle, serve_bench) need of it."""
    scheme = PRESETS[spec.scheme]
    if spec.group_size is not None:
        if scheme.weights is None or scheme.weights.strategy != "group":
            raise PipelineError(
                f"variant {spec.name!r}: group_size applies to grouped schemes only (e.g. W4A16), not {spec.scheme}"
            )
        if spec.group_size == CHANNELWISE:
            return replace(scheme, weights=replace(scheme.weights, strategy="channel"))
    return scheme


def scheme_for(spec: VariantSpec):
    """The compressed-tensors scheme: the preset with the spec's overrides applied (group_size CHANNELWISE, which only
    choose_group_size sets: one scale per output channel)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    scheme_of(spec)  # refuses a group_size the preset has no groups for
    scheme = preset_name_to_scheme(spec.scheme, ["Linear"])
    if spec.group_size is not None:
        if spec.group_size == CHANNELWISE:
            scheme.weights = QuantizationArgs(
                **{**scheme.weights.model_dump(), "strategy": "channel", "group_size": None}
            )
        else:
            scheme.weights.group_size = int(spec.group_size)
    return scheme


def is_wna16(scheme) -> bool:
    """Integer weights in groups with 16-bit activations: what vLLM serves with Marlin or Machete (of scheme_for's
    scheme or scheme_of's)."""
    w = scheme.weights
    return w is not None and w.type == "int" and w.strategy == "group" and scheme.input_activations is None


@dataclass(frozen=True)
class GroupSize:
    """A grouped variant's weight group size against the model's layers: configured (the spec's, else its preset's)
    and used (CHANNELWISE: one scale per output channel), with why they differ."""

    configured: int
    used: int
    reason: str | None = None

    def as_metrics(self) -> dict:
        """The quantize metrics' fields; the reason in a list, which `dvc metrics show` leaves out of its table."""
        return {
            "group_size": self.used,
            "group_size_configured": self.configured,
            "group_size_reason": [self.reason] if self.reason else [],
        }


def group_size_label(size: int) -> str:
    """A group size as the stages' lines say it."""
    return "channel-wise" if size == CHANNELWISE else str(size)


def input_widths(model, ignore: list[str]) -> dict[str, int]:
    """Each layer the recipe quantizes (its Linear targets, minus ignore, matched as llm-compressor matches them, so
    `re:` patterns and class names work) by name, with its input width."""
    from compressed_tensors.utils import match_named_modules

    return {name: module.in_features for name, module in match_named_modules(model, ["Linear"], ignore)}


def config_input_widths(config, ignore: list[str]) -> dict[str, int]:
    """input_widths of the model a transformers config describes, built on the meta device (no weights read or
    allocated: an 8B Llama takes a tenth of a second), so layer widths are known when params are validated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return input_widths(model, ignore)


def choose_group_size(spec: VariantSpec, widths: dict[str, int]) -> GroupSize | None:
    """The group size a grouped variant quantizes these layers with (None: its scheme has no groups). The configured
    size when it divides every layer's input width. A group_size the variant sets that does not is refused in one
    line naming the size that would fit. The scheme's own size (no group_size set) gives way, for INT weight-only
    schemes (W4A16, W8A16), to the largest that vLLM's kernels serve and divides them all (VLLM_WNA16_GROUP_SIZES),
    or channel-wise, with the reason recorded (GroupSize.reason: the sources stage says it, the metrics and the card
    record it); other grouped schemes (W4A8, MXFP4) have no such fallback: one line naming the param and the
    layer."""
    if is_unquantized(spec):
        return None
    scheme = scheme_for(spec)
    if scheme.weights is None or scheme.weights.strategy != "group":
        return None
    configured = scheme.weights.group_size
    blocking = next(((name, w) for name, w in widths.items() if w % configured), None)
    if blocking is None:
        return GroupSize(configured, configured)
    name, width = blocking
    doesnt = f"group size {configured} does not divide the input width {width} of layer {name}"
    if not is_wna16(scheme):
        raise PipelineError(
            f"quantize.variants.{spec.name}.group_size: {doesnt} (scheme {spec.scheme}); set a "
            "group_size that divides every quantized layer's input width, or add the layer to ignore"
        )
    used = next(
        (g for g in VLLM_WNA16_GROUP_SIZES if g <= configured and all(w % g == 0 for w in widths.values())), CHANNELWISE
    )
    bits = scheme.weights.num_bits
    if spec.group_size is not None:  # set in the variant: it wins or is refused, never replaced behind its back
        fix = (
            f"set group_size: {used} (the largest vLLM's INT{bits} weight-only kernels serve that divides every "
            "quantized layer's input width)"
            if used != CHANNELWISE
            else f"no group size vLLM's INT{bits} weight-only kernels serve divides every quantized layer's input width"
        )
        raise PipelineError(
            f"quantize.variants.{spec.name}.group_size: {doesnt}; {fix}, or leave group_size out to "
            f"have the scheme's {configured} replaced by what fits"
        )
    why = (
        f"{used} is the largest group size vLLM's INT{bits} weight-only kernels serve ({WNA16_KERNELS}) that "
        "divides every quantized layer's input width"
        if used != CHANNELWISE
        else f"no group size vLLM's INT{bits} weight-only kernels serve "
        f"({', '.join(map(str, VLLM_WNA16_GROUP_SIZES))}) "
        "divides every quantized layer's input width: one scale per output channel (vLLM's group size -1)"
    )
    return GroupSize(configured, used, f"{doesnt}; {why}")


def with_group_size(spec: VariantSpec, group: GroupSize | None) -> VariantSpec:
    """The spec quantized with the chosen group size."""
    if group is None or group.used == group.configured:
        return spec
    return replace(spec, group_size=group.used)


def is_unquantized(spec: VariantSpec) -> bool:
    return spec.algorithm == "none"


def _one_line(error: ValueError) -> str:
    """pydantic's ValidationError (a ValueError) spans several lines; keep field and reason."""
    if hasattr(error, "errors"):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    return str(error).strip().splitlines()[-1]


def config_groups(spec: VariantSpec, ignore: list[str], targets: Mapping[str, list[str]] | None) -> dict:
    """The quantization modifier's config_groups and ignore: one group of the variant's scheme on every Linear, or,
    with targets (a per-layer layout: scheme -> module patterns, pipeline/quantize/mixed.py), one group per scheme on
    its patterns, the UNQUANTIZED ones added to ignore (compressed-tensors' config_groups, as llm-compressor's
    examples/quantization_non_uniform write them)."""
    ignore = sorted(set(ignore) | set(spec.ignore))
    if targets is None:
        return dict(config_groups={"group_0": scheme_for(spec)}, ignore=ignore)
    groups = {}
    for scheme, patterns in targets.items():
        if scheme == UNQUANTIZED or not patterns:
            continue
        group = scheme_for(replace(spec, scheme=scheme))
        group.targets = list(patterns)
        groups[f"group_{len(groups)}"] = group
    return dict(config_groups=groups, ignore=ignore + list(targets.get(UNQUANTIZED, [])))


def build_recipe(spec: VariantSpec, ignore: list[str], targets: Mapping[str, list[str]] | None = None) -> list:
    """Modifier list for oneshot(); imports are local so `--help` paths stay fast. targets: a per-layer layout
    (config_groups).

    AWQ in 0.14 is a transform (it only rescales channels), so it is followed by the
    QuantizationModifier that actually quantizes; the old single-AWQModifier form is deprecated.
    """
    if is_unquantized(spec):
        return []
    from compressed_tensors.quantization import QuantizationArgs
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    quant = config_groups(spec, ignore, targets)
    if spec.kv_cache:
        quant["kv_cache_scheme"] = QuantizationArgs(**KV_CACHE_SCHEMES[spec.kv_cache])
    algorithm, knobs = spec.algorithm, spec.knobs
    try:
        # llm-compressor's W8A8 INT8 example: SmoothQuant, then GPTQ (or RTN) with the W8A8 scheme.
        smooth = [SmoothQuantModifier(smoothing_strength=spec.smoothing_strength)] if spec.smoothing_strength else []
        if algorithm == "gptq":
            return [*smooth, GPTQModifier(**quant, **knobs)]
        if algorithm == "awq":
            return [AWQModifier(**knobs), QuantizationModifier(**quant)]
        return [*smooth, QuantizationModifier(**quant)]
    except ValueError as e:
        raise PipelineError(f"variant {spec.name!r}: invalid recipe value: {_one_line(e)}") from None


def needs_calibration(spec: VariantSpec) -> bool:
    """Whether the recipe needs calibration data, as llm-compressor itself decides it: GPTQ and
    AWQ always; RTN when it observes static activation or KV-cache scales (FP8, not FP8_DYNAMIC)."""
    return any(m.requires_calibration_data for m in build_recipe(spec, []))


def variant_spec(variants: Mapping[str, Mapping], name: str) -> VariantSpec:
    """The parsed VariantSpec of a variant in quantize.variants (QuantizeParams.variants), or a one-line error naming
    the known ones."""
    check_known(variants, name)
    return parse_variant(name, thawed(variants[name]))


def check_known(variants: Mapping[str, Mapping], name: str) -> None:
    """variant_spec's one-line error for a name not in quantize.variants, without parsing the recipe."""
    if name not in variants:
        raise PipelineError(f"unknown variant {name!r}; known variants: {', '.join(sorted(variants))}")


def enabled_variant(params: dict, name: str) -> VariantSpec:
    """variant_spec of params.yaml's mapping, for callers still holding the raw params."""
    return variant_spec(params["quantize"]["variants"], name)
