"""Type tests for values read from YAML and JSON, where a bool is an int to Python but never a number here."""

from __future__ import annotations


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_positive_int(v) -> bool:
    return is_int(v) and v > 0


def is_positive_number(v) -> bool:
    return is_number(v) and v > 0
