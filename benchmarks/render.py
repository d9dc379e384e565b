"""Benchmark tables as data: one renderer fills the marked blocks of hand-written markdown from raw run folders.

A page is a markdown file whose first lines name its page spec:

    <!-- tables: benchmarks/tables/serving.py -->

and whose generated parts sit between markers, everything else being prose written by hand:

    <!-- begin smollm2 -->
    | run | variant | config | ...     (written by this script; do not edit)
    <!-- end smollm2 -->

The page spec (benchmarks/tables/<page>.py) has `BLOCKS`, block name -> a `Spec` (a function giving the rows, read
from raw files by benchmarks/tables/read.py and served.py, and the `Column`s shown: a field name or a small named
function, and a format), a `Facts` (quantity/value pairs), or any function of no arguments returning a `Table` or
`Text`; and `RUNS`, the raw run folders it reads (relative to `RUNS_UNDER`, default benchmarks/gpu/raw; each holds a
`run.json`, see benchmarks/run_spec.py). The block `runs` is built in: one provenance row per run (date, GPU,
driver, vLLM, torch, profile, code, command). Every block in the markdown must have a definition and every
definition a block, so a table cannot silently drop out of a page.

    python benchmarks/render.py                # re-render every page under benchmarks/ (and docs/ with a header)
    python benchmarks/render.py FILE.md ...    # only these
    python benchmarks/render.py --check        # exit 1 naming the pages whose blocks differ from their rendering
    python benchmarks/render.py --json FILE.md # the same tables as JSON ({block: {columns, rows} or {text}})
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_spec beside this file, also when loaded by path from a test

from run_spec import RunSpec, load as load_run  # noqa: E402

HEADER = re.compile(r"^<!-- tables: (\S+) -->$", re.M)
BLOCK = re.compile(r"^<!-- begin (?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- end (?P=name) -->$", re.M | re.S)
MARKER = re.compile(r"^<!-- (begin|end) ([\w.-]+) -->$", re.M)


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def markdown(self) -> str:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"row {row} has {len(row)} cells for {len(self.columns)} columns {self.columns}")

        def line(cells) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"  # a bare | would split the cell

        lines = [line(self.columns), "| " + " | ".join("---" for _ in self.columns) + " |"]
        lines += [line(row) for row in self.rows]
        return "\n".join(lines)


@dataclass(frozen=True)
class Text:
    """A generated block that is not a table (a transcript, a list); plain markdown."""

    body: str

    def markdown(self) -> str:
        return self.body.rstrip("\n")


@dataclass(frozen=True)
class Column:
    """One column of a table: its header and how a row gives its cell (None renders as "-"). `value` is a field
    name (a dict key or an attribute of the row) or a small named function of the row."""

    header: str
    value: str | Callable[[Any], Any]
    fmt: str | Callable[[Any], str] = "{}"

    def cell(self, row: Any) -> str:
        v = field_of(row, self.value) if isinstance(self.value, str) else self.value(row)
        if v is None:
            return "-"
        return self.fmt(v) if callable(self.fmt) else self.fmt.format(v)


def field_of(row: Any, name: str) -> Any:
    return row.get(name) if isinstance(row, dict) else getattr(row, name)


def table(rows: Iterable[Any], columns: Iterable[Column]) -> Table:
    cols = tuple(columns)
    return Table(tuple(c.header for c in cols), tuple(tuple(c.cell(r) for c in cols) for r in rows))


@dataclass(frozen=True)
class Spec:
    """A table declared as data: a function giving its rows (read from raw run folders) and the columns it shows.
    A page's BLOCKS map block names to Specs; `empty` is the one row shown when there are no rows."""

    rows: Callable[[], Iterable[Any]]
    columns: tuple[Column, ...]
    empty: tuple[str, ...] | None = None

    def __call__(self) -> Table:
        out = table(self.rows(), self.columns)
        return out if out.rows or self.empty is None else Table(out.columns, (self.empty,))


@dataclass(frozen=True)
class Facts:
    """A two-column table of single values: a function giving (quantity, value) pairs."""

    pairs: Callable[[], Iterable[tuple[str, Any]]]
    header: tuple[str, str] = ("quantity", "value")

    def __call__(self) -> Table:
        return facts(self.pairs(), self.header)


def facts(pairs: Iterable[tuple[str, Any]], header: tuple[str, str] = ("quantity", "value")) -> Table:
    """A two-column table of single computed values, for numbers that prose would otherwise carry."""
    return Table(header, tuple((k, "-" if v is None else str(v)) for k, v in pairs))


def num(x: float | None, digits: int = 2, thousands: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}" if thousands else f"{x:.{digits}f}"


def times(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"x{x:.{digits}f}"


def runs_table(folders: Iterable[str], raw: Path) -> Table:
    """The built-in `runs` block: each run's spec (benchmarks/run_spec.py), the provenance prose no longer carries."""
    rows = []
    for folder in folders:
        spec: RunSpec = load_run(raw / folder)
        sw = spec.software
        rows.append(
            (
                f"`{folder}`",
                spec.date or "-",
                spec.gpu.describe(),
                sw.get("vllm", "-"),
                sw.get("torch", "-"),
                f"`{spec.profile}`" if spec.profile else "-",
                spec.commit or "-",
                "; ".join(f"`{c}`" for c in spec.commands),
            )
        )
    return Table(("run", "date", "GPU (driver)", "vLLM", "torch", "profile", "code at", "command"), tuple(rows))


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def definitions(markdown: Path) -> tuple[Path, dict[str, Callable[[], Table | Text]]]:
    text = markdown.read_text()
    header = HEADER.search(text)
    if header is None:
        raise SystemExit(f"{shown(markdown)}: no '<!-- tables: PATH -->' line naming its table definitions")
    path = ROOT / header.group(1)  # relative to the repository root (or absolute)
    if not path.is_file():
        raise SystemExit(f"{shown(markdown)}: table definitions {header.group(1)} do not exist")
    spec = importlib.util.spec_from_file_location(f"tables_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    blocks = dict(getattr(module, "BLOCKS"))
    if hasattr(module, "RUNS"):
        raw = Path(getattr(module, "RUNS_UNDER", ROOT / "benchmarks/gpu/raw"))
        blocks.setdefault("runs", lambda: runs_table(module.RUNS, raw))
    return path, blocks


def render(markdown: Path) -> str:
    """The markdown with every block replaced by its definition's output; the prose around them as it is."""
    text = markdown.read_text()
    path, blocks = definitions(markdown)
    where = shown(markdown)
    opened = [m.group(2) for m in MARKER.finditer(text) if m.group(1) == "begin"]
    found = [m.group("name") for m in BLOCK.finditer(text)]
    if opened != found:
        raise SystemExit(
            f"{where}: unmatched markers (begin without end, or nested): {sorted(set(opened) ^ set(found)) or opened}"
        )
    if len(set(found)) != len(found):
        raise SystemExit(f"{where}: a block appears twice: {sorted({n for n in found if found.count(n) > 1})}")
    missing, unused = sorted(set(found) - set(blocks)), sorted(set(blocks) - set(found))
    if missing:
        raise SystemExit(f"{where}: blocks {missing} have no definition in {shown(path)}")
    if unused:
        raise SystemExit(f"{where}: definitions {unused} of {shown(path)} have no block in it")

    def fill(m: re.Match) -> str:
        name = m.group("name")
        return f"<!-- begin {name} -->\n{blocks[name]().markdown()}\n<!-- end {name} -->"

    return BLOCK.sub(fill, text)


def as_data(markdown: Path) -> dict[str, dict]:
    """Every block of a report as plain data, the same values the markdown shows (one typed table, two outputs)."""
    _, blocks = definitions(markdown)
    out = {}
    for name, build in blocks.items():
        block = build()
        # by shape, not class: a definitions module imports this file as `render`, which may be another copy of it
        out[name] = (
            {"columns": list(block.columns), "rows": [list(r) for r in block.rows]}
            if hasattr(block, "columns")
            else {"text": block.body}
        )
    return out


def reports(under: Path = ROOT / "benchmarks") -> list[Path]:
    """The benchmark pages, plus docs pages that carry measured blocks (docs/scale.md), so --check covers them."""
    found = [p for p in under.rglob("*.md") if "raw" not in p.parts]
    docs = sorted((ROOT / "docs").glob("*.md")) if under == ROOT / "benchmarks" else []
    return sorted(p for p in found + docs if HEADER.search(p.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a report differs")
    ap.add_argument("--json", action="store_true", help="print the reports' tables as JSON instead")
    args = ap.parse_args(argv)
    if args.json:
        print(
            json.dumps({str(shown(md)): as_data(md) for md in [f.resolve() for f in args.files] or reports()}, indent=1)
        )
        return 0
    stale = []
    for md in [f.resolve() for f in args.files] or reports():
        out = render(md)
        if out != md.read_text():
            stale.append(md)
            if not args.check:
                md.write_text(out)
                print(f"wrote {shown(md)}")
    if args.check and stale:
        print(
            "differ from their rendering (python benchmarks/render.py): " + ", ".join(str(shown(p)) for p in stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
