"""Named parameter profiles: an overlay of params.yaml values (profiles/<name>.yaml).

`modelprep profile gpu` writes the GPU demo profile's values over params.yaml, as `dvc exp run
--set-param` would one at a time, so `dvc repro` then tracks them like any other param change. An
overlay key that params.yaml lacks is an error (a typo must not add a param nothing reads), and the
result must pass params validation before params.yaml is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_write_text
from pipeline.params.load import read_yaml_mapping

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"


def profile_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    if not name_or_path.replace("-", "").replace("_", "").isalnum():
        raise PipelineError(f"profile name {name_or_path!r}: letters, digits, - and _ only (or a .yaml path)")
    return PROFILES_DIR / f"{name_or_path}.yaml"


# Mappings whose keys are the user's to choose (a variant's recipe knobs, a variant's gate thresholds): a profile may
# add a key there (AWQ's n_grid on one variant), which params validation then checks like any other value.
OPEN = ("quantize.variants.", "gates.overrides.")
# Mappings whose keys are environment variable names: a profile may add any (a kernel pin in serving.env).
USER_KEYED = ("serving.env", "serving.secret_env")


def overlay(base: dict, values: dict, where: str = "") -> tuple[dict, list[str]]:
    """base with values written over it, and the dotted keys whose value changed."""
    out, changed = dict(base), []
    for key, value in values.items():
        dotted = f"{where}.{key}" if where else str(key)
        open_here = f"{where}.".startswith(OPEN) and where.count(".") == 2
        if key not in base and not open_here and where not in USER_KEYED:
            raise PipelineError(f"profile sets {dotted}, which params.yaml does not have")
        if key not in base:
            out[key] = value
            changed.append(dotted)
            continue
        if isinstance(value, dict) and isinstance(base[key], dict):
            out[key], sub = overlay(base[key], value, dotted)
            changed += sub
        elif base[key] != value:
            out[key] = value
            changed.append(dotted)
    return out, changed


def write_keeping_comments(params_path: Path, merged: dict, changed: list[str]) -> None:
    """Set the changed keys in params.yaml's own text (ruamel round trip, as `dvc exp run -S` does),
    so its comments stay."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    rt = YAML()
    rt.width = 120
    # a value an earlier profile quoted ("off") must stay quoted when a later profile rewrites the file
    rt.preserve_quotes = True
    rt.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    rt.representer.add_representer(float, lambda r, v: r.represent_scalar("tag:yaml.org,2002:float", _yaml11_float(v)))
    doc = rt.load(params_path.read_text(encoding="utf-8"))
    for dotted in changed:
        *parents, leaf = dotted.split(".")
        node, value = doc, merged
        for key in parents:
            node, value = node[key], value[key]
        new = value[leaf]
        if isinstance(new, dict) and not isinstance(node.get(leaf), dict):
            # a scalar becoming a mapping (draft.source: {from: target, ...}) stays one line: a block mapping
            # would open below the comment of the key that follows
            new = CommentedMap(new)
            new.fa.set_flow_style()
        node[leaf] = _quoted_where_yaml11_differs(new)
    buf = io.StringIO()
    rt.dump(doc, buf)
    text = buf.getvalue()
    # ruamel writes YAML 1.2, where `off` is a string; the stages read params with PyYAML (YAML 1.1), where an
    # unquoted `off` is false. What is written must read back as what was merged.
    if yaml.safe_load(text) != merged:
        raise PipelineError(f"{params_path}: the profile's values would not read back as written; nothing written")
    atomic_write_text(params_path, text)


def _yaml11_float(value: float) -> str:
    """A float as PyYAML (YAML 1.1) reads it back: ruamel's 2e-05 has no dot and would come back a string."""
    text = repr(value)
    if text in ("inf", "-inf", "nan"):
        return {"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}[text]
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent and exponent[0] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}" if exponent else mantissa


def _quoted_where_yaml11_differs(value):
    """Strings that PyYAML would read as another type (off, yes, 1e3, null) stay strings: double-quoted."""
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    if isinstance(value, str) and yaml.safe_load(value) != value:
        return DoubleQuotedScalarString(value)
    if isinstance(value, dict):
        for key in value:
            value[key] = _quoted_where_yaml11_differs(value[key])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _quoted_where_yaml11_differs(item)
    return value


def apply_profile(name_or_path: str, params_path: Path, validate: Callable[[dict, Path], None]) -> list[str]:
    """Write the profile over params_path (validated first, by the whole-file check pipeline/rules.py passes in:
    params imports no concern); returns the dotted keys changed."""
    merged, changed = overlay(
        read_yaml_mapping(params_path, "params file"), read_yaml_mapping(profile_path(name_or_path), "profile")
    )
    validate(merged, params_path)
    if changed:
        write_keeping_comments(params_path, merged, changed)
    return changed
