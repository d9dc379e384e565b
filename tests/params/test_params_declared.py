"""Each setting declared once (pipeline/params/declare.py): the schema, the per-key checks, the typed section and
docs/params.md's table all come from the declarations beside each concern; a key added in one place is validated,
documented and parsed. Real params.yaml, the real schema check, no mocks."""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, is_dataclass

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.params.check import SCHEMA_FILE, check_schema
from pipeline.params.declare import declared_fields, default_of, knob, knob_of, members, params_schema, section
from pipeline.sections import DOCS_FILE, KINDS, docs_text, schema_text
from tiny_project import ROOT


def shipped() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_the_schema_file_is_generated_from_the_declarations():
    assert SCHEMA_FILE.read_text() == schema_text(), "stale: run python -m pipeline.sections --write"


def test_the_docs_table_is_generated_from_the_declarations():
    current = DOCS_FILE.read_text()
    assert docs_text(current) == current, "stale: run python -m pipeline.sections --write"


def free_mapping(tp) -> bool:
    return any(t is Mapping or typing.get_origin(t) is Mapping for t in members(tp))


def differences(kind: type, raw: Mapping, where: str, declared: object = None) -> list[str]:
    """Keys whose declared default (of the section, or of the sub-section's declared default) differs from
    params.yaml's value; mappings read entry by entry by their concern are skipped."""
    out = []
    for f, tp in declared_fields(kind):
        default, key = default_of(f) if declared is None else getattr(declared, f.name), f"{where}.{f.name}"
        if free_mapping(tp) or f.name not in raw and not knob_of(f).required:
            continue
        if f.name not in raw:
            out.append(f"{key}: required, not in params.yaml")
        elif is_dataclass(default):
            out += differences(type(default), raw[f.name], key, default)
        elif (tuple(raw[f.name]) if isinstance(raw[f.name], list) else raw[f.name]) != default:
            out.append(f"{key}: declared {default!r}, params.yaml {raw[f.name]!r}")
    return out


def test_the_declared_defaults_are_params_yamls_shipped_values():
    params = shipped()
    assert list(KINDS) == list(params)
    assert [d for name, kind in KINDS.items() for d in differences(kind, params[name], name)] == []


def test_the_declared_defaults_are_the_shipped_values_type_for_type():
    """1000 and 1000.0 are equal, as are True and 1: a default must also be a value its own check takes."""
    from pipeline.params.declare import parse_key

    for name, kind in KINDS.items():
        for f, tp in declared_fields(kind):
            default = default_of(f)
            if default is MISSING or is_dataclass(default) or knob_of(f).parse or knob_of(f).schema is not None:
                continue
            parse_key(default, tp, knob_of(f), f"{name}.{f.name}")


TOY: dict[str, type] = {}  # a registry of this test's own: the project's is left as it is


@section("toy", TOY)
@dataclass(frozen=True)
class ToyParams:
    """A section declared here and nowhere else."""

    rate: float = knob(0.5, help="how fast the toy goes", exclusive_minimum=0, maximum=1)


def test_a_key_declared_in_one_place_is_validated_documented_and_parsed(tmp_path):
    sections = {**KINDS, **TOY}
    params, path = {**shipped(), "toy": {"rate": 0.25}}, tmp_path / "params.yaml"
    schema = params_schema(sections)
    check_schema(params, path, schema)  # validated: a good value passes ...
    with pytest.raises(PipelineError) as e:  # ... a bad one is one line naming the file and the key
        check_schema({**params, "toy": {"rate": 2}}, path, schema)
    assert str(e.value) == f"{path}: toy.rate is 2; allowed: type number, maximum 1, exclusiveMinimum 0"
    with pytest.raises(PipelineError, match=r"^unknown key toy.rat \(did you mean rate\?\)"):
        ToyParams.parse({"rat": 0.3})
    with pytest.raises(PipelineError, match=r"^toy.rate must be a number in \(0, 1\], got 'fast'$"):
        ToyParams.parse({"rate": "fast"})
    assert "| `toy.rate` | a number in (0, 1] | `0.5` | how fast the toy goes |" in docs_text(
        DOCS_FILE.read_text(), sections
    )  # documented
    assert ToyParams.parse({"rate": 0.25}).rate == 0.25 and ToyParams.parse({}).rate == 0.5  # parsed, typed
    assert "toy" not in json.loads(SCHEMA_FILE.read_text())["properties"]  # the project's registry untouched


def test_a_misspelled_key_names_the_nearest_from_the_generated_schema(tmp_path):
    params = shipped()
    params["serve_bench"]["kernel_ties"] = params["serve_bench"].pop("kernel_tie")
    with pytest.raises(PipelineError, match=r"unknown key serve_bench.kernel_ties \(did you mean kernel_tie\?\)"):
        check_schema(params, tmp_path / "params.yaml")
