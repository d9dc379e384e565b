"""Variant specs from params.yaml -> llm-compressor 0.14 modifier lists (the recipe).

A variant spec names an `algorithm` (awq, gptq, rtn) and a compressed-tensors preset
`scheme`; everything else passes straight through as overrides (group size, ignore list,
kv-cache scheme, the algorithm's own knobs, calibration sample count and length), the way
llm-compressor's own recipes do. `algorithm: none` (no scheme) is the unquantized target in its
own dtype: the BF16 baseline every quality and speed ratio is taken against, in the same run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES, preset_name_to_scheme

from pipeline.errors import PipelineError
from pipeline.names import check_variant_name

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
KV_CACHE_SCHEMES = {"fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                            "symmetric": True}}
# SmoothQuant (migrate activation outliers into the weights) before GPTQ or RTN: INT8 W8A8 needs it.
SMOOTHING_ALGORITHMS = ("gptq", "rtn")
# Keys of a variant spec; anything else is a typo.
SPEC_KEYS = {"algorithm", "scheme", "group_size", "ignore", "kv_cache", "smoothing_strength", *CALIBRATION_KEYS,
             *(k for keys in ALGORITHM_KEYS.values() for k in keys)}


@dataclass(frozen=True)
class VariantSpec:
    """One quantize.variants entry, validated once (parse_variant) and passed as this value."""
    name: str
    algorithm: str                    # awq | gptq | rtn
    scheme: str | None                # a compressed-tensors preset, e.g. W4A16, FP8_DYNAMIC; None for `none`
    group_size: int | None = None
    ignore: list[str] = field(default_factory=list)
    kv_cache: str | None = None       # fp8: calibrated FP8 KV-cache scales
    smoothing_strength: float | None = None  # SmoothQuant before the quantizer (INT8 W8A8)
    num_samples: int | None = None    # overrides quantize.calibration
    max_seq_length: int | None = None
    knobs: dict = field(default_factory=dict)  # the algorithm's own modifier arguments


def parse_variant(name: str, raw) -> VariantSpec:
    """params.yaml's quantize.variants[name] as a VariantSpec, or one error line naming the problem."""
    check_variant_name(name)
    validate_spec(name, raw)
    knobs = {k: raw[k] for k in ALGORITHM_KEYS[raw["algorithm"]] if k in raw}
    return VariantSpec(name=name, algorithm=raw["algorithm"], scheme=raw.get("scheme"), group_size=raw.get("group_size"),
                       ignore=list(raw.get("ignore", [])), kv_cache=raw.get("kv_cache"),
                       smoothing_strength=raw.get("smoothing_strength"),
                       num_samples=raw.get("num_samples"), max_seq_length=raw.get("max_seq_length"), knobs=knobs)


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
        raise PipelineError(f"variant {name!r}: {sorted(foreign)} do not apply to algorithm {algorithm!r} "
                            f"(its keys: {list(ALGORITHM_KEYS[algorithm]) or 'none'})")
    if algorithm == "none":
        extra = sorted(set(spec) - {"algorithm"})
        if extra:
            raise PipelineError(f"variant {name!r}: algorithm 'none' is the unquantized target; {extra} do not apply")
        return
    if spec.get("scheme") not in PRESET_SCHEMES:
        raise PipelineError(f"variant {name!r}: unknown quantization scheme {spec.get('scheme')!r} "
                            f"(compressed-tensors presets: {', '.join(sorted(PRESET_SCHEMES))})")
    if spec.get("kv_cache") not in (None, *KV_CACHE_SCHEMES):
        raise PipelineError(f"variant {name!r}: kv_cache must be one of {list(KV_CACHE_SCHEMES)} or absent")
    strength = spec.get("smoothing_strength")
    if strength is not None:
        if algorithm not in SMOOTHING_ALGORITHMS:
            raise PipelineError(f"variant {name!r}: smoothing_strength (SmoothQuant) applies to {list(SMOOTHING_ALGORITHMS)}, "
                                f"not {algorithm!r}")
        if not isinstance(strength, (int, float)) or isinstance(strength, bool) or not 0 < strength < 1:
            raise PipelineError(f"variant {name!r}: smoothing_strength must be a number in (0, 1), got {strength!r}")
    if spec.get("actorder") not in GPTQ_ACTORDERS:
        raise PipelineError(f"variant {name!r}: actorder must be one of {list(GPTQ_ACTORDERS)}, got {spec['actorder']!r}")
    for key in ("group_size", *CALIBRATION_KEYS):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise PipelineError(f"variant {name!r}: {key} must be a positive integer, got {value!r}")
    ignore = spec.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise PipelineError(f"variant {name!r}: ignore must be a list of module names or patterns")


def scheme_for(spec: VariantSpec):
    """The compressed-tensors scheme: the preset with the spec's overrides applied."""
    scheme = preset_name_to_scheme(spec.scheme, ["Linear"])
    if spec.group_size is not None:
        if scheme.weights is None or scheme.weights.strategy != "group":
            raise PipelineError(f"variant {spec.name!r}: group_size applies to grouped schemes only (e.g. W4A16), "
                                f"not {spec.scheme}")
        scheme.weights.group_size = int(spec.group_size)
    return scheme


def is_unquantized(spec: VariantSpec) -> bool:
    return spec.algorithm == "none"


def weight_group_size(spec: VariantSpec) -> int | None:
    if is_unquantized(spec):
        return None
    scheme = scheme_for(spec)
    return scheme.weights.group_size if scheme.weights is not None and scheme.weights.strategy == "group" else None


def _one_line(error: ValueError) -> str:
    """pydantic's ValidationError (a ValueError) spans several lines; keep field and reason."""
    if hasattr(error, "errors"):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    return str(error).strip().splitlines()[-1]


def build_recipe(spec: VariantSpec, ignore: list[str]) -> list:
    """Modifier list for oneshot(); imports are local so `--help` paths stay fast.

    AWQ in 0.14 is a transform (it only rescales channels), so it is followed by the
    QuantizationModifier that actually quantizes; the old single-AWQModifier form is deprecated.
    """
    if is_unquantized(spec):
        return []
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier

    quant = dict(config_groups={"group_0": scheme_for(spec)}, ignore=sorted(set(ignore) | set(spec.ignore)))
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
