"""Numbers the top-level README may quote, computed from the committed raw output (no GPU, torch or pipeline).

    python benchmarks/summary.py    # both summaries as JSON

gpu_summary() is benchmarks/gpu/tables/results.py's (the same computation that renders RESULTS.md's tables);
quantize_summary() is benchmarks/quantize_bench.py's (the same that renders quantize.md).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path):
    # The scripts are not a package (they run as files on the GPU host); load them by path.
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def gpu_summary() -> dict:
    return _load(HERE / "gpu" / "tables" / "results.py").gpu_summary()


def quantize_summary() -> dict:
    return _load(HERE / "quantize_bench.py").quantize_summary()


if __name__ == "__main__":
    print(json.dumps({"gpu": gpu_summary(), "quantize": quantize_summary()}, indent=2))
