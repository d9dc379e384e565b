"""A `dvc repro` with nothing changed, and the `sources` stage it always runs (issue #32, item 2), timed in a
built workspace.

    python benchmarks/cpu/repro_nochange.py                  # in a built workspace (the README's first command)
    python benchmarks/cpu/repro_nochange.py --commit-lock    # a workspace whose artifacts/ came from elsewhere:
                                                             # `dvc commit -f` first (rewrites dvc.lock)

Three measurements, each the median (and min) of --runs runs, wall and CPU seconds (CPU: the child processes'
user+sys, which another job on the machine does not inflate the way it does wall time):
  1. `python -m stages.sources` with the workspace's params: cold (artifacts/cache/ removed: no stat cache, no
     recipe-check memory) and warm (both kept).
  2. the same stage on a local model source: a copy of the workspace's built target and draft, the target with
     a further --model-mib MiB safetensors file (a 135M-parameter BF16 checkpoint is about 260 MiB), in a
     scratch copy of the project; cold (no stat cache) and warm. The files are in the page cache either way
     (caches are not dropped on a shared machine): a first read from disk costs more.
  3. `dvc repro` in the workspace, after one untimed run, with the stages each run ran (only `sources`, when
     nothing changed).
Writes --out (JSON) and prints it. The load average before and after is recorded: the numbers are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its children, stdout+stderr); a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {cwd} ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout + r.stderr


def summary(samples: list[tuple[float, float]]) -> dict:
    walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
    return {
        "runs": len(samples),
        "wall_s_median": round(statistics.median(walls), 2),
        "wall_s_min": round(min(walls), 2),
        "cpu_s_median": round(statistics.median(cpus), 2),
    }


def stage_runs(proj: Path, runs: int, env: dict) -> dict:
    """Cold (artifacts/cache/ removed) once, then warm `runs` times; the last summary line."""
    shutil.rmtree(proj / "artifacts/cache", ignore_errors=True)
    wall, cpu, out = timed([sys.executable, "-m", "stages.sources"], proj, env)
    cold = {**summary([(wall, cpu)]), "said": out.strip().splitlines()[-1]}
    warm = [timed([sys.executable, "-m", "stages.sources"], proj, env) for _ in range(runs)]
    return {"cold": cold, "warm": {**summary([w[:2] for w in warm]), "said": warm[-1][2].strip().splitlines()[-1]}}


def local_source_project(workspace: Path, scratch: Path, model_mib: int) -> Path:
    """A scratch project whose target and draft are local directories: the workspace's built models, the target
    grown by model_mib MiB of weights."""
    target, draft = scratch / "target", scratch / "draft"
    shutil.copytree(workspace / "artifacts/models/target", target)
    shutil.copytree(workspace / "artifacts/models/draft-base", draft)
    if model_mib:
        rng = np.random.default_rng(0)
        save_file(
            {"extra": rng.integers(0, 256, size=model_mib << 20, dtype=np.uint8)}, str(target / "extra.safetensors")
        )
    proj = scratch / "proj"
    proj.mkdir()
    for name in ("pipeline", "stages"):
        shutil.copytree(workspace / name, proj / name, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["target"]["source"], params["draft"]["source"] = str(target), str(draft)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    time.sleep(2.1)  # past the stat cache's racy window even on whole-second timestamps: files just written aren't kept
    return proj


def repro_runs(workspace: Path, runs: int, env: dict) -> dict:
    timed(["dvc", "repro"], workspace, env)  # settles whatever a first run after a change does
    samples, ran = [], []
    for _ in range(runs):
        wall, cpu, out = timed(["dvc", "repro"], workspace, env)
        samples.append((wall, cpu))
        ran.append(re.findall(r"^Running stage '(?:[^':]+:)?([^']+)'", out, re.M))
    return {**summary(samples), "stages_run": sorted({s for r in ran for s in r})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=ROOT)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model-mib", type=int, default=256)
    ap.add_argument("--commit-lock", action="store_true", help="dvc commit -f first (rewrites dvc.lock)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/cpu/raw/repro-nochange.json")
    args = ap.parse_args()
    ws = args.workspace.resolve()
    if not (ws / "artifacts/models/target/config.json").is_file():
        sys.exit(f"{ws} is not a built workspace (no artifacts/models/target): run the README's first command")
    # the workspace's own code, whatever package an editable install points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ws), os.environ.get("PYTHONPATH")]))}
    if args.commit_lock:
        timed(["dvc", "commit", "-f", "-q"], ws, env)
    record = {
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "yaml_c_parser": subprocess.run(
            [sys.executable, "-c", "import ruamel.yaml.main as m; print(m.CParser is not None)"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout.strip()
        == "True",
        "sources_stage": stage_runs(ws, args.runs, env),
    }
    with tempfile.TemporaryDirectory() as scratch:
        proj = local_source_project(ws, Path(scratch), args.model_mib)
        record["sources_stage_local"] = {"model_mib": args.model_mib, **stage_runs(proj, args.runs, env)}
    record["dvc_repro"] = repro_runs(ws, args.runs, env)
    record["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
