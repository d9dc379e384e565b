"""One error type for every bad input the user can fix; stages turn it into one line."""

from __future__ import annotations


class PipelineError(Exception):
    """A problem with the user's input or environment, reported as one line, exit code 2."""


def one_of(values: tuple[str, ...]) -> str:
    """'a, b or c': the allowed values as an error message lists them."""
    return f"{', '.join(values[:-1])} or {values[-1]}" if len(values) > 1 else values[0]
