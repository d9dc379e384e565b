"""Typed values at stage seams: dataclasses written with `asdict` and read back with validation.

A stage that reads another stage's JSON gets a checked object or one error line naming the file
and the field, instead of a KeyError three calls later.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json
from pipeline.core.values import is_int, is_number

R = TypeVar("R")


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a type hint (the subset the records use)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return is_number(value)
    if hint is int:
        return is_int(value)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return isinstance(value, hint)


def from_dict(cls: type[R], data: Any, where: str) -> R:
    """Build a dataclass from parsed JSON, checking every field's presence and type (nested too)."""
    if not isinstance(data, dict):
        raise PipelineError(f"{where}: expected a JSON object for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PipelineError(f"{where}: unknown fields {unknown} for {cls.__name__}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PipelineError(f"{where}: missing field {name!r} ({cls.__name__})")
            continue
        value, hint = data[name], hints[name]
        if not _matches(value, hint):
            raise PipelineError(f"{where}: field {name!r} is {value!r}, expected {hint}")
        kwargs[name] = _convert(value, hint, f"{where}: {name}")
    return cls(**kwargs)


def _convert(value: Any, hint: Any, where: str) -> Any:
    """Nested dataclasses (directly, in lists, as dict values) built from their JSON objects."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        return next((_convert(value, a, where) for a in args if _matches(value, a)), value)
    if origin is list:
        return [_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        return {k: _convert(v, args[1], f"{where}.{k}") for k, v in value.items()}
    return value


def read_object(path: str | Path) -> dict:
    """A JSON object from a file; missing, malformed or not an object is one error line naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path} not found; run the stage that writes it (dvc repro)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{path} must hold a JSON object")
    return data


def read(cls: type[R], path: str | Path) -> R:
    """A record from a JSON file; a missing or malformed file is one error line naming it."""
    return from_dict(cls, read_object(path), str(path))


def write(path: str | Path, record) -> None:
    write_json(path, dataclasses.asdict(record))
