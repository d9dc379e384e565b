"""Functional-check tasks in HumanEval's format from the held-out stdlib modules' doctests (issue #45 item 2).

A task is {task_id, prompt, canonical_solution, test, entry_point}, run as HumanEval runs it:
`prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"` (program()). The prompt is the imports the
function needs, its signature and its docstring (doctests included, as HumanEval's prompts carry examples); the
canonical solution is its real body; the test is `check(candidate)` made of its doctest examples, the function's
name replaced by `candidate`. Only functions of modules the `data` stage holds out (traffic.split itself, under
params.yaml's data.seed and data.fractions) are used, so the draft never trained on them.

A function is kept only when it is self-contained and pure: a public, undecorated, synchronous top-level function
whose free names are its arguments, builtins and imports of ALLOWED_IMPORTS (pure computation), that calls no builtin
of IMPURE_NAMES (I/O, eval, globals) nor method of IMPURE_ATTRIBUTES and uses no global/nonlocal; every doctest
example converts (no doctest directives, no printed output, exceptions only of builtin types); and, run in a
subprocess with a timeout, its test passes with the real body and fails with `pass` (a test that can't fail checks
nothing). These programs are stdlib code, not model output: a model's completions need the sandbox (another module's
job). The stdlib has few such functions (`candidates_all_modules` in traffic.source.json counts them before the split),
so the file is small.
"""

from __future__ import annotations

import ast
import builtins
import doctest
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.data.real_code import Function, split_function, stdlib_files
from pipeline.data.real_text import stdlib_root
from pipeline.data.settings import Fractions
from pipeline.data.traffic import conversation_key, split

# Modules whose functions compute without touching files, processes, the network, clocks or randomness.
ALLOWED_IMPORTS = frozenset(
    {
        "array",
        "base64",
        "binascii",
        "bisect",
        "builtins",
        "calendar",
        "cmath",
        "codecs",
        "collections",
        "collections.abc",
        "colorsys",
        "copy",
        "datetime",
        "decimal",
        "difflib",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "html",
        "itertools",
        "keyword",
        "math",
        "numbers",
        "operator",
        "re",
        "reprlib",
        "statistics",
        "string",
        "struct",
        "textwrap",
        "types",
        "typing",
        "unicodedata",
    }
)
# Builtins that do I/O, run code or reach the caller's namespace; methods of that kind on an argument.
IMPURE_NAMES = frozenset(
    {
        "open",
        "print",
        "input",
        "exec",
        "eval",
        "compile",
        "__import__",
        "exit",
        "quit",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "help",
    }
)
IMPURE_ATTRIBUTES = frozenset({"open", "read", "write", "system", "popen", "unlink", "rmdir", "connect", "send"})
TIMEOUT_S = 10
FAILING_BODY = "    pass\n"  # the test must fail with this


@dataclass(frozen=True)
class Task:
    """One HumanEval-format task; asdict() is its JSONL row."""

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


FIELDS = tuple(f.name for f in fields(Task))  # a HumanEval row's fields, in HumanEval's order


def task_from_row(row: object, where: str, exact: bool = False) -> Task:
    """A parsed JSONL row as a Task, else one error naming where (the file and line): every field a non-empty
    string; exact (a packaged file written verbatim): HumanEval's fields and nothing else."""
    if not isinstance(row, dict) or (exact and set(row) != set(FIELDS)):
        raise PipelineError(
            f"{where}: expected a JSON object of {'exactly ' if exact else ''}the fields {', '.join(FIELDS)}"
        )
    if bad := [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]:
        raise PipelineError(f"{where}: field {bad[0]!r} missing or not a non-empty string")
    return Task(*(row[f] for f in FIELDS))


def program(task: Task, completion: str) -> str:
    """What HumanEval executes for a completion of task.prompt."""
    return task.prompt + completion + "\n" + task.test + "\n" + f"check({task.entry_point})"


def passes(task: Task, completion: str, timeout_s: float = TIMEOUT_S) -> bool:
    """program(task, completion) exits 0 in a fresh isolated interpreter (-I) in a scratch directory within
    timeout_s. For the stdlib's own code only: it is no sandbox for a model's."""
    with tempfile.TemporaryDirectory(prefix="functional-") as tmp:
        path = Path(tmp) / "task.py"
        path.write_text(program(task, completion), encoding="utf-8")
        try:
            r = subprocess.run(
                [sys.executable, "-I", str(path)], cwd=tmp, capture_output=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def module_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """name bound by a module-level import -> (module, the import statement binding just that name)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                alias = f" as {a.asname}" if a.asname else ""
                out[a.asname or a.name.split(".")[0]] = (a.name, f"import {a.name}{alias}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                out[a.asname or a.name] = (
                    node.module,
                    f"from {node.module} import {a.name}" + (f" as {a.asname}" * bool(a.asname)),
                )
    return out


def free_names(node: ast.FunctionDef) -> set[str] | None:
    """Names node reads that it does not bind itself; None when it reaches outside by global/nonlocal, imports a
    module outside ALLOWED_IMPORTS or names an attribute of IMPURE_ATTRIBUTES."""
    loaded, bound = set(), {node.name}
    for n in ast.walk(node):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return None
        if isinstance(n, ast.Import) and any(a.name not in ALLOWED_IMPORTS for a in n.names):
            return None
        if isinstance(n, ast.ImportFrom) and n.module not in ALLOWED_IMPORTS:
            return None
        if isinstance(n, ast.Attribute) and n.attr in IMPURE_ATTRIBUTES:
            return None
        if isinstance(n, ast.Name):
            (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
            isinstance(n, ast.ExceptHandler) and n.name
        ):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update(a.asname or a.name.split(".")[0] for a in n.names)
    return loaded - bound


def needed_imports(node: ast.FunctionDef, imports: dict[str, tuple[str, str]]) -> list[str] | None:
    """The module-level import statements node needs, in source order; None when it is not self-contained and pure."""
    free = free_names(node)
    if free is None or free & IMPURE_NAMES:
        return None
    outside = free - set(dir(builtins))
    if any(name not in imports or imports[name][0] not in ALLOWED_IMPORTS for name in outside):
        return None
    return [stmt for name, (_, stmt) in imports.items() if name in outside]


class _Rename(ast.NodeTransformer):
    def __init__(self, name: str):
        self.name = name

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name("candidate", node.ctx) if node.id == self.name else node


def _example_lines(example: doctest.Example, entry_point: str) -> list[str] | None:
    """One doctest example as check() lines (an assert, a try/except for an expected builtin exception, or a
    statement); None when it does not convert faithfully."""
    try:
        tree = _Rename(entry_point).visit(ast.parse(example.source))
    except SyntaxError:
        return None
    source = ast.unparse(tree)
    if example.exc_msg is not None:
        exc = example.want.strip().splitlines()[-1].split(":")[0].strip()
        if not isinstance(getattr(builtins, exc, None), type) or not issubclass(getattr(builtins, exc), BaseException):
            return None
        return [
            "try:",
            *("    " + line for line in source.splitlines()),
            f"except {exc}:",
            "    pass",
            "else:",
            f"    raise AssertionError('expected {exc}')",
        ]
    if not example.want:
        return source.splitlines()
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    expr = tree.body[0].value
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "print":
        return None  # printed output, not a value
    want = example.want.rstrip("\n")
    try:
        literal = repr(ast.literal_eval(want)) == want
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        literal = False
    # a literal is compared by value, as HumanEval's tests do; anything else by its repr, as doctest does
    return [f"assert {source} == {want}" if literal else f"assert repr({source}) == {want!r}"]


def check_source(doc: str, entry_point: str) -> str | None:
    """`def check(candidate):` made of doc's doctest examples, or None when there are none or one does not convert."""
    try:
        examples = doctest.DocTestParser().get_examples(doc)
    except ValueError:
        return None
    lines = []
    for example in examples:
        if example.options:  # +ELLIPSIS, +SKIP, ...: not a plain comparison
            return None
        converted = _example_lines(example, entry_point)
        if converted is None:
            return None
        lines.extend(converted)
    if not any(line.startswith(("assert ", "try:")) for line in lines):
        return None
    return "def check(candidate):\n" + "".join(f"    {line}\n" for line in lines)


def candidate_task(node: ast.AST, fn: Function | None, imports: dict[str, tuple[str, str]]) -> Task | None:
    """The task for one top-level function, before it is run; None when it is not a candidate."""
    if fn is None or not isinstance(node, ast.FunctionDef) or node.decorator_list or ">>>" not in fn.doc:
        return None
    needed = needed_imports(node, imports)
    test = check_source(fn.doc, node.name)
    if needed is None or test is None:
        return None
    prompt = ("\n".join(needed) + "\n\n\n" if needed else "") + fn.stub + "\n"
    return Task(f"python-code/{fn.name}", prompt, fn.body + "\n", test, node.name)


def heldout_groups(groups: Iterable[str], fractions: Fractions, seed: int) -> set[str]:
    """The groups whose rows `data` holds out: traffic.split itself, on one placeholder conversation per group (a
    group's split depends only on its name, the seed and the fractions)."""
    names = sorted(set(groups))
    convs = [[{"role": "user", "content": g}, {"role": "assistant", "content": g}] for g in names]
    held = split(convs, fractions, seed, {conversation_key(c): g for c, g in zip(convs, names)})["heldout"]
    return {c[0]["content"] for c in held}


def module_candidates(module: str, source: str, max_chars: int) -> list[Task]:
    """Candidate tasks from one module's top-level functions, in source order, before they are run."""
    tree = ast.parse(source)
    imports, lines, out = module_imports(tree), source.splitlines(), []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            fn = split_function(node, lines, f"{module}.{node.name}", module, max_chars, min_body_lines=1)
            task = candidate_task(node, fn, imports)
            if task is not None:
                out.append(task)
    return out


@dataclass(frozen=True)
class Built:
    tasks: list[Task]  # held-out candidates whose test passes with the real body and fails with `pass`
    candidates: int  # held-out candidates run
    candidates_all: int  # candidates in every module, held out or not: what the stdlib offers at all


def build(fractions: Fractions, seed: int, max_chars: int, root: Path | None = None) -> Built:
    """The tasks from the modules `data` holds out under (fractions, seed), in sorted file order."""
    files = stdlib_files(root or stdlib_root())
    held = heldout_groups((module.split(".")[0] for module, _ in files), fractions, seed)
    found = [
        (module.split(".")[0], task)
        for module, source in files
        for task in module_candidates(module, source, max_chars)
    ]
    candidates = [t for group, t in found if group in held]
    kept = [t for t in candidates if passes(t, t.canonical_solution) and not passes(t, FAILING_BODY)]
    return Built(kept, len(candidates), len(found))


def rows(tasks: list[Task]) -> str:
    return "".join(json.dumps(asdict(t), ensure_ascii=False) + "\n" for t in tasks)
