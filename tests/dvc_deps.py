"""The pipeline files' code deps from each stage's import closure: what tests/project/test_dvc_graph.py checks, and the
tool that writes them. The pipeline files: dvc.yaml and stages/dvc.yaml (the always-run `sources` stage).

    python tests/dvc_deps.py           # exit 1 and name the stages whose code deps differ from their closure
    python tests/dvc_deps.py --write   # rewrite those deps lists in place (everything else is kept as written)

A stage's code deps are the project files its entry point imports, transitively (lazy imports inside functions
too), with a package folder listed as the folder where the stage imports every module in it. Its other deps
(artifacts, data files, templates, `${...}` paths) stay where they are, after the code.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")
PIPELINE_FILES = ("dvc.yaml", "stages/dvc.yaml")  # every dvc.yaml of the project; a stage name is unique across them
WIDTH = 119  # a rewritten flow list wraps after the item that passes this column (PyYAML's rule)


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The project file of a dotted module name, or None for third-party modules."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an import statement anywhere in the file names (lazy imports inside functions too);
    `from pkg import name` counts pkg.name when that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}", root)}
    return names


def closure(entry: Path, root: Path = ROOT) -> set[Path]:
    """The project files a stage's entry point runs: itself, what it imports, and their packages' __init__."""
    seen, todo = set(), [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, root):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                found = module_file(".".join(parts[:i]), root)
                if found is not None:
                    todo.append(found)
    return {p.relative_to(root) for p in seen}


def pipeline_stages(root: Path = ROOT) -> dict[str, dict]:
    """stage name -> its definition, from every pipeline file the project has (a copy may hold only dvc.yaml)."""
    out: dict[str, dict] = {}
    for name in PIPELINE_FILES:
        if (root / name).is_file():
            stages = yaml.safe_load((root / name).read_text())["stages"]
            assert not set(stages) & set(out), f"{name} repeats stage names: {sorted(set(stages) & set(out))}"
            out.update(stages)
    return out


def stage_entries(root: Path = ROOT) -> dict[str, tuple[Path, list[str]]]:
    """stage name -> (entry file, declared deps) from the pipeline files."""
    stages = pipeline_stages(root)
    out = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        module = body["cmd"].split()[2]  # python -m stages.<name> [...]
        out[name] = (Path(*module.split(".")).with_suffix(".py"), body.get("deps", []))
    return out


def covered(path: Path, deps: list[str]) -> bool:
    return any(path == Path(d) or Path(d) in path.parents for d in deps)


def is_code_dep(dep: str, root: Path = ROOT) -> bool:
    """A module, or a package folder (one holding Python files; a folder of data inside a package is data)."""
    path = root / dep
    return dep.endswith(".py") or (path.is_dir() and dep.split("/")[0] in PACKAGES and any(path.rglob("*.py")))


def code_deps(entry: Path, root: Path = ROOT) -> list[str]:
    """The closure as dvc.yaml lists it: sorted, a package folder whose every module is imported as the folder
    (the outermost such folder below the top-level packages)."""
    needed = closure(root / entry, root)
    folders = set()
    for path in needed:
        for parent in reversed(path.parents[:-2]):  # pipeline/x, then pipeline/x/y: the outermost first
            modules = {p.relative_to(root) for p in (root / parent).rglob("*.py")}
            if modules <= needed:
                folders.add(parent)
                break
    kept = {p for p in needed if not any(f in p.parents for f in folders)}
    return sorted(str(p) for p in kept | folders)


def data_inside(folder: str, root: Path = ROOT) -> list[str]:
    """What a package folder holds besides Python (data, templates): a stage that listed the folder
    read it too, and keeps it as a dep when the folder is listed module by module instead."""
    return sorted(
        str(p.relative_to(root))
        for p in (root / folder).iterdir()
        if p.name != "__pycache__" and not p.name.endswith(".py") and not (p.is_dir() and any(p.rglob("*.py")))
    )


def wanted_deps(root: Path = ROOT) -> dict[str, list[str]]:
    """stage -> its deps as they should be: the code closure, then the declared non-code deps in their order (data
    in a package folder no longer listed whole kept; data inside a folder now listed whole dropped)."""
    out = {}
    for name, (entry, deps) in stage_entries(root).items():
        code = code_deps(entry, root)
        rest = []
        for d in deps:
            if not is_code_dep(d, root):
                rest.append(d)
            elif (root / d).is_dir() and d not in code:
                rest += data_inside(d, root)
        out[name] = code + [
            d for d in dict.fromkeys(rest) if not any(Path(c) in Path(d).parents for c in code if (root / c).is_dir())
        ]
    return out


def _item(dep: str) -> str:
    return f"'{dep}'" if "${" in dep else dep


def flow_list(key_indent: int, deps: list[str]) -> str:
    """`deps: [a, b, ...]` wrapped at WIDTH, continuation lines indented six past the key."""
    pieces = [_item(d) + "," for d in deps[:-1]] + [_item(deps[-1]) + "]"]
    lines, line = [], " " * key_indent + "deps: [" + pieces[0]
    for piece in pieces[1:]:
        if len(line) > WIDTH:  # as PyYAML wraps a flow list: a line ends once it is past the width
            lines.append(line)
            line = " " * (key_indent + 6) + piece
        else:
            line += " " + piece
    lines.append(line)
    return "\n".join(lines)


DEPS = re.compile(r"^( *)deps: \[[^\]]*\]", re.M)
STAGE = re.compile(r"^  (\w+):$", re.M)


def rewrite(text: str, wanted: dict[str, list[str]]) -> str:
    """dvc.yaml with the deps list of each stage in wanted replaced; comments and every other line (the other
    stages' lists too, which were wrapped by hand at various widths) unchanged."""
    starts = [(m.start(), m.group(1)) for m in STAGE.finditer(text)]

    def stage_at(pos: int) -> str:
        return [name for start, name in starts if start < pos][-1]

    def replace(m: re.Match) -> str:
        stage = stage_at(m.start())
        return flow_list(len(m.group(1)), wanted[stage]) if stage in wanted else m.group(0)

    return DEPS.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite dvc.yaml's deps from the import closures")
    ap.add_argument("--root", type=Path, default=ROOT, help="the project (default: this checkout)")
    args = ap.parse_args(argv)
    wanted = wanted_deps(args.root)
    declared = {name: deps for name, (_, deps) in stage_entries(args.root).items()}
    stale = [name for name in wanted if wanted[name] != declared[name]]
    for name in PIPELINE_FILES:
        path = args.root / name
        if not path.is_file():
            continue
        text = path.read_text()
        before = yaml.safe_load(text)
        mine = [stage for stage in stale if stage in before["stages"]]
        new = rewrite(text, {stage: wanted[stage] for stage in mine})
        if yaml.safe_load(new) != {
            **before,
            "stages": {stage: _with_deps(body, wanted[stage]) for stage, body in before["stages"].items()},
        }:
            raise SystemExit(f"dvc_deps: rewriting {name} would change more than its deps lists")
        if args.write and new != text:
            path.write_text(new)
    if args.write:
        print(f"deps rewritten for {', '.join(stale)}" if stale else "deps already match")
        return 0
    if stale:
        print(
            f"code deps differ from the import closure for {', '.join(stale)} (python tests/dvc_deps.py --write)",
            file=sys.stderr,
        )
        return 1
    return 0


def _with_deps(stage: dict, deps: list[str]) -> dict:
    if "do" in stage:
        return {**stage, "do": {**stage["do"], "deps": deps}}
    return {**stage, "deps": deps}


if __name__ == "__main__":
    sys.exit(main())
