"""The GPU host's scripts (benchmarks/gpu/*.py) run only there, so nothing here runs them: a pipeline name they
import that was renamed or removed would first fail on a leased GPU. Each one must at least import on this CPU
machine, as a script (its own folder first on the path, the repo root on PYTHONPATH)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
RUNS_AT_IMPORT = {"greedy_determinism.py"}  # a script body (it puts a model on CUDA), not a module: compiled only


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.py")))
def test_gpu_script_imports_on_cpu(script):
    path = GPU / script
    if script in RUNS_AT_IMPORT:
        compile(path.read_text(), str(path), "exec")
        return
    # run as the host runs it: sys.path[0] is the script's folder; import it by its file without __main__
    code = f"import sys, runpy; sys.path.insert(0, {str(GPU)!r}); runpy.run_path({str(path)!r}, run_name='imported')"
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"{script} does not import: {r.stderr.strip().splitlines()[-1:]}"
