"""params.yaml: loaded and checked as a whole before any stage does work.

Every stage calls load_params(), so `dvc repro` stops at its first stage with one line naming the
param when a threshold is a string, an override names no variant, a required gate is deleted or a
version is a YAML float, rather than after hours of quantization and training.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from pipeline.errors import PipelineError

PARAMS_FILE = Path(os.environ.get("MODELPREP_PARAMS", "params.yaml"))
SECTIONS = ("target", "draft", "demo", "data", "quantize", "draft_training", "draft_quantize", "evaluate", "gates",
            "serving", "publish")


def load_params(path: str | Path = PARAMS_FILE, check_recipes: bool = True) -> dict:
    """check_recipes=False skips building each variant's recipe (compressed-tensors takes seconds to
    import), for commands that only read the gates, such as `modelprep gate` on a metrics directory."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path} not found; run from the project root")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None
    validate(params, path, check_recipes)
    return params


def _section(params: dict, dotted: str, path: Path) -> dict:
    node = params
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise PipelineError(f"{path}: {dotted} must be a mapping")
    return node


def validate(params, path: Path, check_recipes: bool = True) -> None:
    """Raise PipelineError naming the first bad param; no model or data is read."""
    from pipeline.gates import CHECKS, check_thresholds
    from pipeline.names import check_name, check_variant_name, check_version

    if not isinstance(params, dict):
        raise PipelineError(f"{path}: expected a mapping of sections")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise PipelineError(f"{path}: missing sections {missing}")
    variants = _section(params, "quantize.variants", path)
    for name, raw in variants.items():
        try:
            if check_recipes:
                from pipeline.recipes import parse_variant

                parse_variant(name, raw)
            else:
                check_variant_name(name)
        except PipelineError as e:
            raise PipelineError(f"{path}: {e}") from None
    enabled = params["quantize"].get("enabled")
    if not isinstance(enabled, list) or not enabled or len(set(map(str, enabled))) != len(enabled):
        raise PipelineError(f"{path}: quantize.enabled must be a non-empty list of distinct variant names")
    _known(enabled, variants, "quantize.enabled", path)

    gates = _section(params, "gates", path)
    thresholds = _section(params, "gates.thresholds", path)
    check_thresholds(thresholds, f"{path}: gates.thresholds")
    required = sorted(k for k, c in CHECKS.items() if c.required and k not in thresholds)
    if required:
        raise PipelineError(f"{path}: gates.thresholds is missing required checks {required}; a release gate "
                            "can't be dropped by deleting its threshold")
    overrides = gates.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise PipelineError(f"{path}: gates.overrides must map variant names to thresholds")
    _known(list(overrides), variants, "gates.overrides", path)
    for variant, values in overrides.items():
        if not isinstance(values, dict):
            raise PipelineError(f"{path}: gates.overrides.{variant} must be a mapping of thresholds")
        check_thresholds(values, f"{path}: gates.overrides.{variant}")
    allow_fail = gates.get("allow_fail") or []
    if not isinstance(allow_fail, list):
        raise PipelineError(f"{path}: gates.allow_fail must be a list of variant names")
    _known(allow_fail, variants, "gates.allow_fail", path)

    draft_quant = _section(params, "draft_quantize", path).get("variant")
    if draft_quant is not None:
        _known([draft_quant], variants, "draft_quantize.variant", path)
    _check_wrapped(check_name, _section(params, "serving", path).get("name"), "serving.name", path)
    version = _section(params, "publish", path).get("version")
    if not isinstance(version, str):
        raise PipelineError(f"{path}: publish.version must be a string, got {version!r} ({type(version).__name__}); "
                            "quote it in YAML (version: '1.10' — unquoted 1.10 is the number 1.1)")
    if version != "auto":
        _check_wrapped(check_version, version, "publish.version", path)


def _known(names: list, variants: dict, param: str, path: Path) -> None:
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise PipelineError(f"{path}: {param} names unknown variants {unknown}; known: {sorted(variants)}")


def _check_wrapped(check, value, param: str, path: Path) -> None:
    if not isinstance(value, str):
        raise PipelineError(f"{path}: {param} must be a string, got {value!r}")
    try:
        check(value)
    except PipelineError as e:
        raise PipelineError(f"{path}: {param}: {e}") from None


def enabled_variant(params: dict, name: str):
    """The parsed VariantSpec of a variant in quantize.variants, or a one-line error naming the known ones."""
    from pipeline.recipes import parse_variant

    variants = params["quantize"]["variants"]
    if name not in variants:
        raise PipelineError(f"unknown variant {name!r}; known variants: {', '.join(sorted(variants))}")
    return parse_variant(name, variants[name])


def variant_argument(argv: list[str], stage: str) -> str:
    """The one VARIANT argument of a foreach stage (`python -m stages.<stage> VARIANT`)."""
    if len(argv) != 1:
        raise PipelineError(f"usage: python -m stages.{stage} VARIANT (one of quantize.enabled)")
    return argv[0]


def gate_thresholds(params: dict, variant: str) -> dict:
    gates = params["gates"]
    return {**gates["thresholds"], **(gates.get("overrides") or {}).get(variant, {})}
