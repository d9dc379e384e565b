"""params.yaml's keys checked as declared: the JSON schema generated from every concern's declarations
(pipeline/params/declare.py; written by `python -m pipeline.sections --write`, kept current by
tests/params/test_params_declared.py) refuses an unknown key (naming the nearest), a missing required one, a wrong
type or a value out of range, in one line. The rules that read more than one key are pipeline/rules.py's; this
module, as all of pipeline/params, imports no concern."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError

SCHEMA_FILE = Path(__file__).with_name("params.schema.json")


def check_schema(params: dict, path: Path, schema: dict | None = None) -> None:
    """params.schema.json (JSON Schema): every key known, the ranged knobs in range. One line: the key, and for
    a typo the keys allowed there with the nearest named."""
    import difflib
    import json

    import jsonschema

    validator = jsonschema.Draft202012Validator(schema or json.loads(SCHEMA_FILE.read_text()))
    error = jsonschema.exceptions.best_match(validator.iter_errors(params))
    if error is None:
        return
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        near = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
        raise PipelineError(
            f"{path}: unknown key {'.'.join([where, str(unknown[0])]).lstrip('.')}"
            + (f" (did you mean {near[0]}?)" if near else "")
            + f"; allowed here: {', '.join(allowed)}"
        )
    if error.validator == "required":
        raise PipelineError(f"{path}: {where + ': ' if where else ''}{error.message}")
    value = error.instance
    rule = {
        k: error.schema[k]
        for k in ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "enum")
        if k in error.schema
    }
    if not rule and "description" in error.schema:  # an anyOf of shapes: its description says which
        raise PipelineError(f"{path}: {where} is {value!r}; allowed: {error.schema['description']}")
    if "anyOf" in error.schema:  # a declared union (auto or an integer): each shape, then the bounds
        shapes = " or ".join(
            ", ".join(f"{k} {v}" for k, v in s.items() if k in ("type", "enum")) for s in error.schema["anyOf"]
        )
        rule = {"shapes": shapes, **rule}
        raise PipelineError(
            f"{path}: {where} is {value!r}; allowed: "
            + ", ".join(v if k == "shapes" else f"{k} {v}" for k, v in rule.items())
        )
    raise PipelineError(f"{path}: {where} is {value!r}; allowed: " + ", ".join(f"{k} {v}" for k, v in rule.items()))
