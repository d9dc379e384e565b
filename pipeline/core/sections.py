"""Read-only values from YAML (frozen, thawed), and Section: typed getters over a mapping that is a value rather than
a declared section (a variant's `mixed:` settings inside quantize.variants). params.yaml's sections are declared
(pipeline/params/declare.py), not read through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pipeline.core.errors import PipelineError
from pipeline.core.values import is_int, is_number

REQUIRED = object()  # a key with no default: its absence is an error naming it


class Section:
    """A mapping from params.yaml and where it sits (`draft_training.lora`); its getters return the key's value
    checked for type, or its default when the key is absent (a null is a value: only *_or_none getters take it)."""

    def __init__(self, raw: object, where: str):
        if not isinstance(raw, Mapping):
            raise PipelineError(f"{where} must be a mapping, got {raw!r}")
        self.raw, self.where = raw, where

    def key(self, name: str) -> str:
        return f"{self.where}.{name}"

    def value(self, name: str, default: object = REQUIRED) -> object:
        if name in self.raw:
            return self.raw[name]
        if default is REQUIRED:
            raise PipelineError(f"{self.key(name)} is missing")
        return default

    def fail(self, name: str, wanted: str, got: object) -> PipelineError:
        return PipelineError(f"{self.key(name)} must be {wanted}, got {got!r}")

    def section(self, name: str, default: Mapping | None = None) -> Section:
        """A nested mapping; null or absent reads as `default` (empty when None)."""
        raw = self.value(name, None)
        return Section((default or {}) if raw is None else raw, self.key(name))

    def int(self, name: str, default: object = REQUIRED, minimum: int | None = None) -> int:
        v = self.value(name, default)
        if not is_int(v) or (minimum is not None and v < minimum):
            raise self.fail(name, "an integer" + (f" >= {minimum}" if minimum is not None else ""), v)
        return v

    def int_or_none(self, name: str, default: object = None, minimum: int | None = None) -> int | None:
        return None if self.value(name, default) is None else self.int(name, minimum=minimum)

    def number(self, name: str, default: object = REQUIRED) -> float:
        v = self.value(name, default)
        if not is_number(v):
            raise self.fail(name, "a number", v)
        return v

    def number_or_none(self, name: str, default: object = None) -> float | None:
        return None if self.value(name, default) is None else self.number(name)

    def bool(self, name: str, default: object = REQUIRED) -> bool:
        v = self.value(name, default)
        if not isinstance(v, bool):
            raise self.fail(name, "true or false", v)
        return v

    def str(self, name: str, default: object = REQUIRED) -> str:
        v = self.value(name, default)
        if not isinstance(v, str):
            raise self.fail(name, "a string", v)
        return v

    def str_or_none(self, name: str, default: object = None) -> str | None:
        return None if self.value(name, default) is None else self.str(name)

    def choice(self, name: str, allowed: tuple, default: object = REQUIRED):
        v = self.value(name, default)
        if not any(v == a and type(v) is type(a) for a in allowed):  # 1 is not true, nor 1.0 the integer 1
            raise self.fail(name, "one of " + ", ".join(map(str, allowed)), v)
        return v

    def strs(self, name: str, default: object = REQUIRED) -> tuple[str, ...]:
        """A list of strings (null: none) as a tuple."""
        v = self.value(name, default)
        v = [] if v is None else v
        if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
            raise self.fail(name, "a list of strings", v)
        return tuple(v)

    def ints(self, name: str, default: object = REQUIRED) -> tuple[int, ...]:
        v = self.value(name, default)
        if not isinstance(v, (list, tuple)) or not all(is_int(i) for i in v):
            raise self.fail(name, "a list of integers", v)
        return tuple(v)

    def mapping(self, name: str, default: object = None) -> Mapping:
        """A mapping kept as it is (read-only), for settings another parser reads (variants, tiers, thresholds); null
        or absent: empty."""
        v = self.value(name, default)
        v = {} if v is None else v
        if not isinstance(v, Mapping):
            raise self.fail(name, "a mapping", v)
        return frozen(v)


def empty_mapping() -> Mapping:
    """A dataclass field's default for a mapping (field(default_factory=empty_mapping)): read-only, like frozen's."""
    return MappingProxyType({})


def frozen(value: object) -> object:
    """A mapping or list from YAML as read-only values all the way down: a frozen dataclass holding it stays frozen."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: object) -> object:
    """frozen's inverse: plain dicts and lists, for code that hands the value to a library or writes it as JSON."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    return value
