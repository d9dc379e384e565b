"""The DVC graph tells the truth: each stage's code deps are exactly the project modules it imports
(transitively), and dvc.lock was produced by the code in the tree."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

PACKAGES = ("pipeline", "stages")


def module_file(name: str) -> Path | None:
    """The project file of a dotted module name, or None for third-party modules."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement anywhere in the file names (lazy imports inside functions too);
    `from pkg import name` counts pkg.name when that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")}
    return names


def closure(entry: Path) -> set[Path]:
    """The project files a stage's entry point runs: itself, what it imports, and their packages' __init__."""
    seen, todo = set(), [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                found = module_file(".".join(parts[:i]))
                if found is not None:
                    todo.append(found)
    return {p.relative_to(ROOT) for p in seen}


def stage_entries(root: Path = ROOT) -> dict[str, tuple[Path, list[str]]]:
    """stage name -> (entry file, declared deps) from dvc.yaml."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        module = body["cmd"].split()[2]  # python -m stages.<name> [...]
        out[name] = (Path(*module.split(".")).with_suffix(".py"), body.get("deps", []))
    return out


def covered(path: Path, deps: list[str]) -> bool:
    return any(path == Path(d) or Path(d) in path.parents for d in deps)


@pytest.mark.parametrize("stage", sorted(stage_entries()))
def test_code_deps_are_exactly_the_import_closure(stage):
    entry, deps = stage_entries()[stage]
    needed = closure(ROOT / entry)
    missing = sorted(str(p) for p in needed if not covered(p, deps))
    assert not missing, f"dvc.yaml stage {stage} imports {missing} but does not list them in deps"
    # a folder of data inside a package (pipeline/evaluate/cost_profiles) is data, not code
    code_deps = [d for d in deps if d.endswith(".py") or (ROOT / d).is_dir() and d.split("/")[0] in PACKAGES
                 and any((ROOT / d).rglob("*.py"))]
    extra = [d for d in code_deps if not any(p == Path(d) or Path(d) in p.parents for p in needed)]
    assert not extra, f"dvc.yaml stage {stage} lists code it never imports: {extra}"
    # A listed package directory must be wholly imported, else an unrelated edit re-runs the stage.
    for d in code_deps:
        if (ROOT / d).is_dir():
            files = {p.relative_to(ROOT) for p in (ROOT / d).rglob("*.py")}
            assert files <= needed, f"stage {stage} lists {d}/ but imports only part of it: {sorted(files - needed)}"


def test_the_artifact_layout_is_dvc_yamls():
    """pipeline/core/paths.py names the artifacts dvc.yaml's stages write and read (dvc.yaml keeps literal paths):
    every artifact dvc.yaml names is one of its paths (a foreach stage's `<dir>/${item}`: its dir), and every one of
    its paths is in dvc.yaml, lies inside an out there, holds one, or is one of the workspace's own, which DVC never
    tracks."""
    from pipeline.core import paths

    named = {v for v in vars(paths).values() if isinstance(v, Path)}
    untracked = {paths.ARTIFACTS, paths.LOGS, paths.CACHE, paths.DRAFT_CHECKPOINTS, paths.PUBLISH_STAGING, paths.TIMINGS}
    outs, mentioned = set(), set()
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        body = stage.get("do", stage)
        for kind in ("outs", "deps"):
            for entry in body.get(kind, []):
                path = entry if isinstance(entry, str) else next(iter(entry))
                if path.startswith("artifacts"):
                    path = Path(path.removesuffix("/${item}"))
                    mentioned.add(path)
                    if kind == "outs":
                        outs.add(path)
    missing = sorted(map(str, mentioned - named))
    assert not missing, f"dvc.yaml names artifacts pipeline/core/paths.py does not: {missing}"
    stray = {p for p in named - mentioned - untracked
             if not any(o in p.parents for o in outs) and not any(p in m.parents for m in mentioned)}
    assert not stray, f"pipeline/core/paths.py names artifacts no dvc.yaml stage writes: {sorted(map(str, stray))}"


def test_closure_sees_lazy_imports():
    """A guard on the test itself: an import inside a function body counts."""
    assert Path("pipeline/models/demo/models.py") in closure(ROOT / "stages/models.py")


def test_dvc_lock_matches_the_code_in_the_tree():
    """dvc.lock is committed from a `dvc repro` of the committed code: every code and params dep it
    records has the md5 the file has now. (`dvc status` reports the rest: outputs not built here.)"""
    r = subprocess.run(["dvc", "status", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stale = []
    for stage, changes in json.loads(r.stdout or "{}").items():
        for change in changes if isinstance(changes, list) else []:
            if not isinstance(change, dict):
                continue
            for path, state in (change.get("changed deps") or {}).items():
                if not path.startswith("artifacts/") and state in ("modified", "new", "not in cache"):
                    stale.append(f"{stage}: {path} {state}")
    assert not stale, "dvc.lock was not produced by the code in the tree (run `dvc repro`): " + "; ".join(stale)


def test_dvc_lock_holds_only_stages_that_exist():
    """A stage removed from dvc.yaml leaves no entry in the committed lock (benchmarks/cpu/demo_build.sh --lock
    builds it without the old lock); the lock's names are dvc.yaml's, foreach stages expanded as name@item."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    locked = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    gone = sorted(name for name in locked if name.split("@")[0] not in stages
                  or ("@" in name) != ("foreach" in stages[name.split("@")[0]]))
    assert not gone, f"dvc.lock holds stages dvc.yaml no longer has: {gone}"


def test_dvc_metrics_show_is_a_table_a_person_can_read(tmp_path):
    """Issue #29: `dvc metrics show` was a table ~4,900 characters wide (8,188 for the demo build of 2171ace): every
    check of every variant from metrics/gates.json, every method's estimate and prediction per variant, and on a GPU
    the serving benchmark's record (configs x concurrencies x percentiles). Real DVC over the metrics the stages write
    now, from the committed demo build: the gate summary, eval files with per-method detail in lists, the serving
    record (a GPU-like one, measured at four concurrencies) as a plain output."""
    from conftest import copy_project, tiny_params
    from pipeline.core import records
    from pipeline.core.io import read_json, write_json
    from pipeline.release import gates
    from pipeline.serving.bench_record import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult

    params = tiny_params()
    project = copy_project(tmp_path, params)
    metrics = project / "metrics"
    metrics.mkdir()
    for name in ("models", "data", "draft_training", "eagle3", "draft"):
        shutil.copy(ROOT / f"metrics/{name}.json", metrics / f"{name}.json")
    lat = {"mean": 5.0, "p50": 5.0, "p90": 8.0, "p99": 9.0}
    summaries = {}
    for v in params["quantize"]["enabled"]:
        summaries[v] = {k: x for k, x in records.eval_summary(read_json(ROOT / f"metrics/eval-{v}.json")).items()
                        if not k.endswith("_sample_len")}  # lm-eval's bookkeeping, no longer a score (test_lmeval.py)
        write_json(metrics / f"eval-{v}.json", records.eval_metrics(summaries[v]))
        quant = read_json(ROOT / f"metrics/quantize-{v}.json")
        write_json(metrics / f"quantize-{v}.json", {**quant, "group_size_configured": quant["group_size"],
                                                    "group_size_reason": []})
        levels = {f"c{c}": LoadLevel(c, 64, 64, 0, 3.0, 10.0, 900.0, dict(lat), dict(lat), dict(lat), dict(lat), 0.7)
                  for c in (1, 8, 32, 64)}
        records.write(metrics / f"serve-{v}.json", ServeBenchRecord(v, gpu="NVIDIA H100", vllm_version="0.26.0", configs={
            PLAIN: ServeConfigResult(0, 30.0, levels), "eagle3": ServeConfigResult(3, 31.0, levels),
            "ngram": ServeConfigResult(3, 31.0, levels)}))
    write_json(metrics / "gates.json", gates.summary(gates.run(params, summaries)))
    r = subprocess.run(["dvc", "metrics", "show"], cwd=project, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0].split()
    assert not [h for h in header if h.startswith(("configs.", "variants.", "methods", "predicted_speedup"))], header
    assert {"all_passed", "variants_failed", "perplexity_increase_pct", "kl_divergence", "expected_speedup",
            "group_size", "size_after_mb"} <= set(header)
    assert {f"metrics/eval-{v}.json" for v in params["quantize"]["enabled"]} <= {line.split()[0] for line in lines[1:]}
    assert max(map(len, lines)) < 1800, max(map(len, lines))


READERS_ONLY = {"models", "data", "quantize", "distill", "draft_finetune", "draft_quantize", "eagle3", "evaluate_draft"}


@pytest.mark.parametrize("edited", ["pipeline/release/gates.py", "pipeline/release/thresholds.py",
                                    "pipeline/serving/tiers.py", "pipeline/params/check.py"])
def test_an_edit_goes_stale_only_where_it_is_imported(tmp_path, edited):
    """Issue #31: params are checked as a whole once, by the always-run `sources` stage; the other stages only read
    them, so editing the gates, the thresholds, the tiers or the checks themselves leaves the models, data, quantized
    variants and drafts fresh. Real `dvc status` on a clone of HEAD (whose dvc.lock is its code's) with one line
    appended to the file: the stages it reports changed are exactly those whose deps cover the file."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    with open(clone / edited, "a") as f:
        f.write("\n# an edit\n")
    r = subprocess.run(["dvc", "status", "--json"], cwd=clone, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stale = {stage.split("@")[0] for stage, changes in json.loads(r.stdout or "{}").items()
             for change in (changes if isinstance(changes, list) else []) if isinstance(change, dict)
             and (change.get("changed deps") or {}).get(edited) == "modified"}
    covering = {name for name, (_, deps) in stage_entries(clone).items() if covered(Path(edited), deps)}
    assert stale == covering and stale, (edited, stale, covering)
    assert not stale & READERS_ONLY, f"editing {edited} re-runs {sorted(stale & READERS_ONLY)}"
