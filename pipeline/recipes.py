"""Variant specs from params.yaml -> llm-compressor modifier lists (the recipe).

A variant spec names an `algorithm` (awq, gptq, rtn) and a compressed-tensors preset
`scheme`; everything else passes straight through as overrides (group size, dampening,
actorder, ignore list, kv-cache scheme), the way llm-compressor's own recipes do.
"""
from __future__ import annotations

from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES, preset_name_to_scheme

from pipeline.errors import PipelineError

ALGORITHMS = ("awq", "gptq", "rtn")
# FP8 KV cache with calibrated per-tensor scales: lets vLLM serve with kv_cache_dtype=fp8.
KV_CACHE_SCHEMES = {"fp8": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                            "symmetric": True}}
# Keys of a variant spec that shape the scheme or the modifiers; anything else is a typo.
SPEC_KEYS = {"algorithm", "scheme", "group_size", "ignore", "kv_cache", "actorder", "dampening_frac",
             "block_size", "duo_scaling", "n_grid", "offload_device"}


def validate_spec(name: str, spec: dict) -> None:
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise PipelineError(f"variant {name!r}: unknown recipe keys {sorted(unknown)} (known: {sorted(SPEC_KEYS)})")
    if spec.get("algorithm") not in ALGORITHMS:
        raise PipelineError(f"variant {name!r}: algorithm must be one of {ALGORITHMS}, got {spec.get('algorithm')!r}")
    if spec.get("scheme") not in PRESET_SCHEMES:
        raise PipelineError(f"variant {name!r}: unknown quantization scheme {spec.get('scheme')!r} "
                            f"(compressed-tensors presets: {', '.join(sorted(PRESET_SCHEMES))})")
    if spec.get("kv_cache") not in (None, *KV_CACHE_SCHEMES):
        raise PipelineError(f"variant {name!r}: kv_cache must be one of {list(KV_CACHE_SCHEMES)} or absent")


def scheme_for(spec: dict):
    """The compressed-tensors scheme: the preset with the spec's overrides applied."""
    scheme = preset_name_to_scheme(spec["scheme"], ["Linear"])
    if spec.get("group_size") is not None:
        if scheme.weights is None or scheme.weights.strategy != "group":
            raise PipelineError(f"group_size applies to grouped schemes only, not {spec['scheme']}")
        scheme.weights.group_size = int(spec["group_size"])
    return scheme


def weight_group_size(spec: dict) -> int | None:
    scheme = scheme_for(spec)
    return scheme.weights.group_size if scheme.weights is not None and scheme.weights.strategy == "group" else None


def build_recipe(name: str, spec: dict, default_ignore: list[str]) -> list:
    """Modifier list for oneshot(); imports are local so `--help` paths stay fast."""
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier

    validate_spec(name, spec)
    quant = dict(config_groups={"group_0": scheme_for(spec)},
                 ignore=sorted(set(default_ignore) | set(spec.get("ignore", []))))
    if spec.get("kv_cache"):
        quant["kv_cache_scheme"] = QuantizationArgs(**KV_CACHE_SCHEMES[spec["kv_cache"]])
    algorithm = spec["algorithm"]
    if algorithm == "gptq":
        extra = {k: spec[k] for k in ("actorder", "dampening_frac", "block_size") if k in spec}
        return [GPTQModifier(**quant, **extra)]
    if algorithm == "awq":
        extra = {k: spec[k] for k in ("duo_scaling", "n_grid", "offload_device") if k in spec}
        return [AWQModifier(**extra), QuantizationModifier(**quant)]
    return [QuantizationModifier(**quant)]


def needs_calibration(spec: dict) -> bool:
    """Dynamic-activation RTN schemes (FP8_DYNAMIC, W8A16...) need no data unless a KV scale is calibrated."""
    if spec["algorithm"] != "rtn" or spec.get("kv_cache"):
        return True
    scheme = scheme_for(spec)
    acts = scheme.input_activations
    return acts is not None and not acts.dynamic
