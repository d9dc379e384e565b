"""Each setting declared once: a params.yaml section is a frozen dataclass whose fields are its keys, each field a
`knob` (its default, range, choices and help); the field's annotation is its type. From the declarations come the
JSON schema (params.schema.json, `python -m pipeline.sections --write`), the per-key checks (type, range,
choices, an unknown key with the nearest named), the typed section a stage reads (`parse_declared`) and
docs/params.md's table.

A concern declares its sections beside its code (pipeline/<concern>/settings.py) and registers them here
(`register`); this module imports no concern: pipeline/sections.py imports every concern's settings, so that the
whole-file check sees every section. A rule that needs more than one key's value is a `rule` of the section
(`__post_init__` of its dataclass, one line naming the key) or, across sections, pipeline/rules.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Literal, Union

from pipeline.core.errors import PipelineError
from pipeline.core.sections import frozen
from pipeline.core.values import is_int, is_number

META = "modelprep"  # the key of a knob's Knob in its dataclass field's metadata
DERIVED = "modelprep-derived"  # metadata of a field that is no key: its parse sets it from another key's value


@dataclass(frozen=True)
class Knob:
    """What a field's annotation does not say: its help and range. required: absence is an error (the default is
    then the shipped value, documented and compared with params.yaml's, never filled in). parse/schema: a value
    with a shape of its own (a source, the tiers) parsed by the concern's function, with its JSON schema."""

    help: str
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    min_length: int | None = None
    parse: Callable[[Any, str], Any] | None = None
    schema: Mapping | None = None


def knob(default: Any = MISSING, *, help: str, required: bool = False, **rules: Any) -> Any:
    """A dataclass field declaring one params.yaml key. A mutable default (a list, a dict) is frozen (tuple,
    read-only mapping) and given through a factory."""
    meta = {META: Knob(help, required, **rules)}
    if default is MISSING:
        return field(metadata=meta)
    value = frozen(default)
    if isinstance(value, (tuple, Mapping)) or is_dataclass(value):
        return field(default_factory=lambda: value, metadata=meta)
    return field(default=value, metadata=meta)


REGISTRY: dict[str, type] = {}  # section name -> its declared dataclass, as the concerns register them


def register(kind: type, registry: dict[str, type] = REGISTRY) -> type:
    """A concern's section, known to the whole-file check, the schema and the docs."""
    name = kind.SECTION
    if name in registry and registry[name] is not kind:
        raise PipelineError(f"section {name} is registered twice ({registry[name].__name__}, {kind.__name__})")
    registry[name] = kind
    return kind


def knob_of(f: dataclasses.Field) -> Knob:
    return f.metadata.get(META) or Knob(help="")


def hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def declared_fields(kind: type) -> list[tuple[dataclasses.Field, Any]]:
    """The fields that are keys (a ClassVar, such as SECTION, is not a field), with their resolved types."""
    types_of = hints(kind)
    return [(f, types_of[f.name]) for f in fields(kind) if f.init and not f.metadata.get(DERIVED)]


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


# --- the typed value -------------------------------------------------------------------------------------------


def members(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)


def convert(value: Any, tp: Any, where: str) -> Any:
    """value as type tp, or MISSING where it is not one (the caller says what was wanted)."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return None if value is None else MISSING
    if tp is bool:
        return value if isinstance(value, bool) else MISSING
    if tp is int:
        return value if is_int(value) else MISSING
    if tp is float:
        return value if is_number(value) else MISSING
    if tp is str:
        return value if isinstance(value, str) else MISSING
    if origin is Literal:
        return value if any(value == a and type(value) is type(a) for a in typing.get_args(tp)) else MISSING
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return MISSING
        out = [convert(v, typing.get_args(tp)[0], where) for v in value]
        return MISSING if any(v is MISSING for v in out) else tuple(out)
    if tp is Mapping or origin is Mapping:
        return frozen(value) if isinstance(value, Mapping) else MISSING
    if is_section(tp):
        return parse_declared(tp, value, where) if isinstance(value, Mapping) else MISSING
    raise TypeError(f"{where}: no conversion for the declared type {tp!r}")


def wanted(tp: Any, k: Knob) -> str:
    """What a value of this declaration must be, as an error line says it: `auto or an integer >= 1`."""

    def one(t: Any, alone: bool) -> str:
        if t is type(None):
            return "null"
        if t is bool:
            return "true or false"
        if t in (int, float):
            if t is float and k.exclusive_minimum == 0 and k.minimum is None and k.maximum is None:
                return "a positive number"
            noun = "an integer" if t is int else "a number"
            lo = (
                f"[{k.minimum:g}"
                if k.minimum is not None
                else f"({k.exclusive_minimum:g}"
                if k.exclusive_minimum is not None
                else None
            )
            hi = (
                f"{k.maximum:g}]"
                if k.maximum is not None
                else f"{k.exclusive_maximum:g})"
                if k.exclusive_maximum is not None
                else None
            )
            if lo and hi:
                return f"{noun} in {lo}, {hi}"
            if lo:
                return f"{noun} {'>=' if lo[0] == '[' else 'above'} {lo[1:]}"
            return f"{noun} {'<=' if hi[-1] == ']' else 'below'} {hi[:-1]}" if hi else noun
        if t is str:
            return "a string" if not k.min_length else "a non-empty string"
        if typing.get_origin(t) is Literal:
            names = typing.get_args(t)
            return ("one of " if alone or len(names) > 1 else "") + ", ".join(map(str, names))
        if typing.get_origin(t) is tuple:
            inner = typing.get_args(t)[0]
            return "a list of " + {int: "integers", str: "strings", float: "numbers"}.get(inner, "values")
        return "a mapping"

    options = sorted(members(tp), key=lambda t: typing.get_origin(t) is not Literal)  # auto or an integer
    return " or ".join(one(t, len(options) == 1) for t in options)


def in_range(value: Any, k: Knob) -> bool:
    """A number (or each number of a list) within the knob's bounds; a string at least min_length long."""
    if isinstance(value, tuple):
        return all(in_range(v, k) for v in value)
    if isinstance(value, str):
        return k.min_length is None or len(value.strip()) >= k.min_length
    if not is_number(value):
        return True
    return not (
        (k.minimum is not None and value < k.minimum)
        or (k.maximum is not None and value > k.maximum)
        or (k.exclusive_minimum is not None and value <= k.exclusive_minimum)
        or (k.exclusive_maximum is not None and value >= k.exclusive_maximum)
    )


def parse_key(value: Any, tp: Any, k: Knob, where: str) -> Any:
    """One key's value, typed and in range, or one line naming it. A null for a mapping, list or section that
    can't be null reads as empty (YAML's `key:` with nothing under it)."""
    if k.parse is not None:
        return k.parse(value, where)
    options = members(tp)
    if value is None and type(None) not in options:
        if any(is_section(t) for t in options):
            value = {}
        elif any(typing.get_origin(t) is tuple for t in options):
            value = []
        elif any(t is Mapping or typing.get_origin(t) is Mapping for t in options):
            value = {}
    for t in options:
        out = convert(value, t, where)
        if out is not MISSING:
            if not in_range(out, k):
                break
            return out
    raise PipelineError(f"{where} must be {wanted(tp, k)}, got {value!r}")


def unknown_key(raw: Mapping, allowed: list[str], where: str) -> None:
    unknown = sorted(str(key) for key in raw if key not in allowed)
    if unknown:
        near = difflib.get_close_matches(unknown[0], allowed, n=1)
        raise PipelineError(
            f"unknown key {where}.{unknown[0]}"
            + (f" (did you mean {near[0]}?)" if near else "")
            + f"; allowed here: {', '.join(sorted(allowed))}"
        )


def parse_declared(kind: type, raw: Any, where: str | None = None) -> Any:
    """A declared section (or sub-section) from its mapping: every key typed and in range, a missing one its
    default, a required one missing or an unknown one refused; one line naming the dotted key."""
    where = where or kind.SECTION
    if not isinstance(raw, Mapping):
        raise PipelineError(f"{where} must be a mapping, got {raw!r}")
    declared = declared_fields(kind)
    unknown_key(raw, [f.name for f, _ in declared], where)
    values = {}
    for f, tp in declared:
        k = knob_of(f)
        if f.name in raw:
            values[f.name] = parse_key(raw[f.name], tp, k, f"{where}.{f.name}")
        elif k.required or default_of(f) is MISSING:
            raise PipelineError(f"{where}.{f.name} is missing")
    return kind(**values)


def declared_parse(cls: type, section: Mapping) -> Any:
    """The `parse` classmethod of a declared section (what load.parse_section calls)."""
    return parse_declared(cls, section)


def section(name: str, registry: dict[str, type] = REGISTRY) -> Callable[[type], type]:
    """Class decorator: a frozen dataclass declared as params.yaml's section `name`, registered, with `parse`
    (parse_declared, unless the class has its own)."""

    def wrap(kind: type) -> type:
        kind.SECTION = name
        if "parse" not in kind.__dict__:
            kind.parse = classmethod(declared_parse)
        return register(kind, registry)

    return wrap


# --- the JSON schema -------------------------------------------------------------------------------------------


def type_schema(tp: Any) -> dict:
    origin = typing.get_origin(tp)
    simple = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is tuple:
        return {"type": "array", "items": type_schema(typing.get_args(tp)[0])}
    if tp is Mapping or origin is Mapping:
        return {"type": "object"}
    if is_section(tp):
        return section_schema(tp)
    options = members(tp)
    if len(options) > 1:
        plain = [type_schema(t) for t in options]
        if all(set(s) == {"type"} for s in plain):
            return {"type": [s["type"] for s in plain]}
        return {"anyOf": plain}
    raise TypeError(f"no JSON schema for the declared type {tp!r}")


def key_schema(tp: Any, k: Knob) -> dict:
    out = dict(k.schema) if k.schema is not None else type_schema(tp)
    if not k.required and k.schema is None and out.get("type") in ("object", "array"):
        out["type"] = [out["type"], "null"]  # parse_key reads an optional mapping's or list's null as empty
    rules = {
        "minimum": k.minimum,
        "maximum": k.maximum,
        "exclusiveMinimum": k.exclusive_minimum,
        "exclusiveMaximum": k.exclusive_maximum,
        "minLength": k.min_length,
    }
    rules = {key: v for key, v in rules.items() if v is not None}
    if out.get("type") == "array":  # a list's bounds are its items'
        out["items"] = {**out["items"], **rules}
    else:
        out.update(rules)
    if k.help and "description" not in out:
        out["description"] = k.help
    return out


def keys_schema(kind: type) -> dict:
    """A section's keys, each checked by the section's own parse (not by the schema): unknown keys are refused."""
    return {
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": {f.name: {"description": knob_of(f).help} for f, _ in declared_fields(kind)},
    }


def section_schema(kind: type) -> dict:
    declared = declared_fields(kind)
    out = {
        "type": "object",
        "additionalProperties": False,
        "properties": {f.name: key_schema(tp, knob_of(f)) for f, tp in declared},
    }
    required = [f.name for f, _ in declared if knob_of(f).required or default_of(f) is MISSING]
    if required:
        out["required"] = required
    return out


def params_schema(sections: Mapping[str, type]) -> dict:
    """params.yaml's JSON schema, from the registered sections in params.yaml's order."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "modelprep params.yaml",
        "type": "object",
        "additionalProperties": False,
        "required": list(sections),
        "properties": {name: section_schema(kind) for name, kind in sections.items()},
    }


# --- the docs table --------------------------------------------------------------------------------------------


def shown(value: Any) -> str:
    if value is MISSING:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, tuple):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {shown(v)}" for key, v in value.items()) + "}"
    if is_dataclass(value):
        return ""
    return str(value)


def rows(kind: type, where: str) -> list[tuple[str, str, str, str]]:
    """(key, allowed, default, help) of every key of a section, a sub-section's keys after its own row. A value
    with a parser of its own says what it takes in its schema's description; a free mapping (the variants, the
    thresholds) shows no shipped value: its entries are its concern's to read."""
    out = []
    for f, tp in declared_fields(kind):
        k, key = knob_of(f), f"{where}.{f.name}"
        custom = k.parse is not None or k.schema is not None
        sub = None if custom else next((t for t in members(tp) if is_section(t)), None)
        free = any(t is Mapping or typing.get_origin(t) is Mapping for t in members(tp))
        allowed = (
            "see below"
            if sub is not None
            else (k.schema or {}).get("description", wanted(tp, k))
            if custom
            else wanted(tp, k)
        )
        out.append((key, allowed, "" if free else shown(default_of(f)), k.help))
        if sub is not None:
            out += rows(sub, key)
    return out


def docs_table(sections: Mapping[str, type]) -> str:
    """docs/params.md's generated table: every declared key, what it takes, its shipped value and its help."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| key | takes | shipped | what it does |", "| --- | --- | --- | --- |"]
    for name, kind in sections.items():
        lines += [
            f"| `{key}` | {cell(allowed)} | {cell(f'`{default}`' if default else '')} | {cell(text)} |"
            for key, allowed, default, text in rows(kind, name)
        ]
    return "\n".join(lines)
