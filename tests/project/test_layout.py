"""The library's layout (README, Code layout): pipeline/ is one subpackage per step of the pipeline, plus three
modules at the top: the CLI, sections.py (imports every concern's settings, so the registry of declared sections is
whole) rules.py (the whole-file check: every rule across sections) and evaluation.py (the evaluate stage's work, which
composes quantize, drafts, serving and evaluate). The subpackages import one another without a
cycle; params sits below the concerns (they register their sections with pipeline/params/declare.py) and imports
none of them; no subpackage imports the top."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from dvc_deps import imported_modules, module_file
from tiny_project import ROOT

STEPS = ("core", "params", "models", "data", "quantize", "drafts", "evaluate", "serving", "release")


def package_of(path: Path) -> str | None:
    """The step package a pipeline file is in; None for the CLI and pipeline/__init__.py."""
    parts = path.relative_to(ROOT).parts
    return parts[1] if len(parts) > 2 and parts[0] == "pipeline" else None


def package_imports() -> dict[str, set[str]]:
    """step package -> the other step packages its modules import (lazy imports too)."""
    edges = defaultdict(set)
    for path in (ROOT / "pipeline").rglob("*.py"):
        source = package_of(path)
        for name in imported_modules(path) if source else ():
            found = module_file(name)
            target = package_of(found) if found else None
            if target and target != source:
                edges[source].add(target)
    return edges


TOP = ("cli.py", "sections.py", "rules.py", "evaluation.py")  # the modules above every step package


def test_pipeline_holds_the_step_packages_and_the_top_modules():
    top = {p.name for p in (ROOT / "pipeline").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", *TOP, *STEPS}


def test_the_step_packages_import_one_another_without_a_cycle():
    edges, left = package_imports(), set(STEPS)
    while left:  # peel off the packages that import nothing still left; a cycle never peels
        ready = {p for p in left if not edges[p] & left}
        assert ready, f"the step packages import one another in a cycle: { {p: sorted(edges[p] & left) for p in left} }"
        left -= ready


def test_params_imports_no_concern():
    """Concerns register their sections with params (declare.py); params checks them without importing one."""
    assert package_imports()["params"] <= {"core"}, sorted(package_imports()["params"])


def test_a_concern_imports_of_params_only_the_declarations_and_the_loader():
    """A stage reads its sections (load.py) declared with declare.py; the whole-file check is the top's (rules.py)."""
    for path in (ROOT / "pipeline").rglob("*.py"):
        step = package_of(path)
        if step in (None, "params"):
            continue
        used = {name for name in imported_modules(path) if name.startswith("pipeline.params")}
        assert used <= {"pipeline.params.declare", "pipeline.params.load"}, (str(path), sorted(used))


def test_no_step_package_imports_the_top():
    for path in (ROOT / "pipeline").rglob("*.py"):
        if package_of(path) is None:
            continue
        top = {name for name in imported_modules(path) if name in {f"pipeline.{m[:-3]}" for m in TOP}}
        assert not top, (str(path), sorted(top))


def test_a_step_packages_init_is_its_docstring_only():
    """Code imports a name from the module that defines it: no package re-exports another module's names."""
    for step in STEPS:
        body = ast.parse((ROOT / "pipeline" / step / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), step
