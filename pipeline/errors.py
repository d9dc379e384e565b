"""One error type for every bad input the user can fix; stages turn it into one line."""
from __future__ import annotations


class PipelineError(Exception):
    """A problem with the user's input or environment, reported as one line, exit code 2."""
