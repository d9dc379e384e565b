"""The DVC graph tells the truth: each stage's code deps are exactly the project modules it imports
(transitively), and dvc.lock was produced by the code in the tree."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

# `python tests/dvc_deps.py --write` writes them
from dvc_deps import PACKAGES, PIPELINE_FILES, closure, covered, is_code_dep, pipeline_stages, stage_entries
from tiny_project import ROOT


@pytest.mark.parametrize("stage", sorted(stage_entries()))
def test_code_deps_are_exactly_the_import_closure(stage):
    entry, deps = stage_entries()[stage]
    needed = closure(ROOT / entry)
    missing = sorted(str(p) for p in needed if not covered(p, deps))
    assert not missing, (
        f"dvc.yaml stage {stage} imports {missing} but does not list them in deps (python tests/dvc_deps.py --write)"
    )
    # a folder of data inside a package is data, not code
    code_deps = [d for d in deps if is_code_dep(d)]
    extra = [d for d in code_deps if not any(p == Path(d) or Path(d) in p.parents for p in needed)]
    assert not extra, f"dvc.yaml stage {stage} lists code it never imports: {extra} (python tests/dvc_deps.py --write)"
    # A listed package directory must be wholly imported, else an unrelated edit re-runs the stage.
    for d in code_deps:
        if (ROOT / d).is_dir():
            files = {p.relative_to(ROOT) for p in (ROOT / d).rglob("*.py")}
            assert files <= needed, f"stage {stage} lists {d}/ but imports only part of it: {sorted(files - needed)}"


def test_dvc_deps_write_puts_the_closure_back(tmp_path):
    """`python tests/dvc_deps.py --write` on a copy of the project whose dvc.yaml lost a code dep of `gate` and
    lists one it never imports: the check fails naming the stage, --write restores the closure, and dvc.yaml reads
    back as it was (comments and the other stages' lines byte for byte)."""
    from dvc_deps import main

    for name in ("pipeline", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    original = (ROOT / "dvc.yaml").read_text()
    gate = yaml.safe_load(original)["stages"]["gate"]["deps"]
    assert "pipeline/release/gates.py" in gate and "pipeline/core/sizes.py" not in gate
    tampered = original.replace("pipeline/release/gates.py, ", "pipeline/core/sizes.py, ", 1)
    (tmp_path / "dvc.yaml").write_text(tampered)
    assert main(["--root", str(tmp_path)]) == 1
    assert main(["--root", str(tmp_path), "--write"]) == 0
    written = (tmp_path / "dvc.yaml").read_text()
    assert yaml.safe_load(written) == yaml.safe_load(original)

    def around_gate_deps(text: str) -> tuple[str, str]:
        return text[: text.index("\n  gate:\n")], text[text.index("\n    params: [gates,") :]

    assert around_gate_deps(written) == around_gate_deps(original)
    assert main(["--root", str(tmp_path)]) == 0


def test_dvc_deps_write_keeps_the_data_of_a_folder_it_lists_module_by_module(tmp_path):
    """evaluate imports every module of pipeline/evaluate, so dvc.yaml lists the folder whole; once one module is
    not imported (here a new one) --write lists the folder module by module, and the data it holds stays a dep."""
    from dvc_deps import main, stage_entries as entries

    for name in ("pipeline", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    assert "pipeline/evaluate" in entries()["evaluate"][1]
    (tmp_path / "pipeline/evaluate/table.json").write_text("{}\n")  # data a stage reads from inside the package
    (tmp_path / "pipeline/evaluate/unimported.py").write_text('"""Imported by no stage."""\n')
    shutil.copyfile(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    assert main(["--root", str(tmp_path), "--write"]) == 0
    listed = [d for d in entries(tmp_path)["evaluate"][1] if d.startswith("pipeline/evaluate")]
    assert "pipeline/evaluate/table.json" in listed and "pipeline/evaluate/settings.py" in listed
    assert "pipeline/evaluate" not in listed and "pipeline/evaluate/unimported.py" not in listed


def test_the_evaluate_stage_declares_the_cost_profiles_it_reads_outside_the_packages():
    """The serving-cost profiles are measured data: they live outside the code packages, so an edit to them is not a
    code change, and the one stage that reads them (evaluate, serving_costs.choose) lists their folder as a dep."""
    from pipeline.evaluate.serving_costs import PROFILE_DIR, available

    folder = PROFILE_DIR.relative_to(ROOT)
    assert folder.parts[0] not in PACKAGES and available(), f"{folder}: profiles inside a code package, or none"
    assert str(folder) in stage_entries()["evaluate"][1], f"dvc.yaml's evaluate stage does not list {folder}"


def test_the_artifact_layout_is_dvc_yamls():
    """pipeline/core/paths.py names the artifacts dvc.yaml's stages write and read (dvc.yaml keeps literal paths):
    every artifact dvc.yaml names is one of its paths (a foreach stage's `<dir>/${item}`: its dir), and every one of
    its paths is in dvc.yaml, lies inside an out there, holds one, or is one of the workspace's own, which DVC never
    tracks."""
    from pipeline.core import paths

    named = {v for v in vars(paths).values() if isinstance(v, Path)}
    untracked = {
        paths.ARTIFACTS,
        paths.LOGS,
        paths.CACHE,
        paths.DRAFT_CHECKPOINTS,
        paths.PUBLISH_STAGING,
        paths.TIMINGS,
    }
    outs, mentioned = set(), set()
    for stage in pipeline_stages().values():
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
    stray = {
        p
        for p in named - mentioned - untracked
        if not any(o in p.parents for o in outs) and not any(p in m.parents for m in mentioned)
    }
    assert not stray, f"pipeline/core/paths.py names artifacts no dvc.yaml stage writes: {sorted(map(str, stray))}"


def test_closure_sees_lazy_imports():
    """A guard on the test itself: an import inside a function body counts."""
    assert Path("pipeline/models/demo/models.py") in closure(ROOT / "stages/models.py")


def test_bytecode_beside_the_code_is_no_change_to_a_directory_dep():
    """Python writes __pycache__ into pipeline/models and pipeline/evaluate (directory deps) on import, by the tests or
    the stages themselves, wherever PYTHONDONTWRITEBYTECODE is unset: `dvc status` then called their stages stale
    against the committed lock (`dvc repro` would rerun them, and the test below failed)."""
    cache = ROOT / "pipeline/evaluate/__pycache__"
    made = not cache.exists()
    probe = cache / "bytecode_probe.cpython-311.pyc"
    cache.mkdir(exist_ok=True)
    probe.write_bytes(b"\x00" * 16)
    try:
        r = subprocess.run(["dvc", "status", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        changed = [
            (stage, path)
            for stage, changes in json.loads(r.stdout or "{}").items()
            for change in (changes if isinstance(changes, list) else [])
            if isinstance(change, dict)
            for path in (change.get("changed deps") or {})
            if path == "pipeline/evaluate"
        ]
        assert not changed, changed
    finally:
        probe.unlink()
        if made:
            cache.rmdir()


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
    for pipeline_file in PIPELINE_FILES:  # each dvc.yaml has its lock beside it
        lock_file = Path(pipeline_file).with_suffix(".lock")
        stages = yaml.safe_load((ROOT / pipeline_file).read_text())["stages"]
        locked = yaml.safe_load((ROOT / lock_file).read_text())["stages"]
        gone = sorted(
            name
            for name in locked
            if name.split("@")[0] not in stages or ("@" in name) != ("foreach" in stages[name.split("@")[0]])
        )
        assert not gone, f"{lock_file} holds stages {pipeline_file} no longer has: {gone}"


READERS_ONLY = {"models", "data", "quantize", "distill", "draft_finetune", "draft_quantize", "eagle3", "evaluate_draft"}


# One module per subpackage; the release, serving and params edits must leave the stages before evaluate fresh.
EDITS = {
    "pipeline/release/gates.py": True,
    "pipeline/release/thresholds.py": True,
    "pipeline/serving/tiers.py": True,
    "pipeline/params/check.py": True,
    "pipeline/core/names.py": False,
    "pipeline/models/loading.py": False,
    "pipeline/data/traffic.py": False,
    "pipeline/quantize/recipes.py": False,
    "pipeline/drafts/ngram.py": False,
    "pipeline/evaluate/quality.py": False,
}


def test_every_subpackage_has_an_edit_case():
    assert {Path(f).parent.name for f in EDITS} == {
        p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").exists()
    }


@pytest.mark.parametrize("edited", sorted(EDITS))
def test_an_edit_goes_stale_only_where_it_is_imported(tmp_path, edited):
    """Issue #31: params are checked as a whole once, by the always-run `sources` stage; the other stages only read
    them, so editing the gates, the thresholds, the tiers or the checks themselves leaves the models, data, quantized
    variants and drafts fresh. Real `dvc status` on a clone of HEAD (whose dvc.lock is its code's) with one line
    appended to a module of each subpackage: the stages it reports changed are exactly those whose deps cover it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    with open(clone / edited, "a") as f:
        f.write("\n# an edit\n")
    r = subprocess.run(["dvc", "status", "--json"], cwd=clone, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stale = {
        stage.split("@")[0].rsplit(":", 1)[-1]  # stages/dvc.yaml:sources -> sources
        for stage, changes in json.loads(r.stdout or "{}").items()
        for change in (changes if isinstance(changes, list) else [])
        if isinstance(change, dict)
        and any(
            state == "modified" and (dep == edited or Path(dep) in Path(edited).parents)  # a folder dep
            for dep, state in (change.get("changed deps") or {}).items()
        )
    }
    covering = {name for name, (_, deps) in stage_entries(clone).items() if covered(Path(edited), deps)}
    assert stale == covering and stale, (edited, stale, covering)
    if EDITS[edited]:
        assert not stale & READERS_ONLY, f"editing {edited} re-runs {sorted(stale & READERS_ONLY)}"
