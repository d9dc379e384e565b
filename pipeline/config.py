"""params.yaml access and the one-line-error contract shared by every stage."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import yaml

from pipeline.errors import PipelineError

PARAMS_FILE = Path(os.environ.get("MODELPREP_PARAMS", "params.yaml"))


def load_params(path: str | Path = PARAMS_FILE) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path} not found; run from the project root")
    return yaml.safe_load(path.read_text())


def enabled_variant(params: dict, name: str) -> dict:
    """The recipe spec of an enabled variant, or a one-line error naming the known ones."""
    variants = params["quantize"]["variants"]
    if name not in variants:
        raise PipelineError(f"unknown variant {name!r}; known variants: {', '.join(sorted(variants))}")
    return variants[name]


def variant_argument(argv: list[str], stage: str) -> str:
    """The one VARIANT argument of a foreach stage (`python -m stages.<stage> VARIANT`)."""
    if len(argv) != 1:
        raise PipelineError(f"usage: python -m stages.{stage} VARIANT (one of quantize.enabled)")
    return argv[0]


def gate_thresholds(params: dict, variant: str) -> dict:
    gates = params["gates"]
    return {**gates["thresholds"], **(gates.get("overrides") or {}).get(variant, {})}


def one_line_errors(main):
    """Bad input -> `error: <message>` on stderr and exit 2, never a traceback."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except PipelineError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    return wrapper
