"""The real-code traffic generator and its functional tasks (pipeline/data/real_code.py, functional_code.py, issue #45
item 2): conversations whose answers are the running Python's real stdlib source, deterministic, grouped by module so
the data stage holds whole modules out, and HumanEval-format tasks from the held-out modules' doctests."""

from __future__ import annotations

import ast
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.data import functional_code, real_code
from pipeline.data.real_text import stdlib_root
from pipeline.data.settings import DataParams
from pipeline.data.traffic import conversation_key, read_grouped, split
from tiny_project import ROOT

ROWS, CAP = 200, 1600
COMMITTED = ROOT / "data" / "python-code"
HUMANEVAL_KEYS = {"task_id", "prompt", "canonical_solution", "test", "entry_point"}


@pytest.fixture(scope="module")
def modules():
    return real_code.code_modules(CAP)


@pytest.fixture(scope="module")
def rows(modules):
    return real_code.generate(ROWS, 0, CAP, modules)


def project_data(params: dict | None = None) -> DataParams:
    params = params or yaml.safe_load((ROOT / "params.yaml").read_text())
    return DataParams.parse(params["data"])


def committed_tasks() -> list[dict]:
    return [json.loads(line) for line in (COMMITTED / "functional.jsonl").read_text().splitlines()]


def fenced(text: str) -> str | None:
    """The code of a ```python block answer, else None."""
    if text.startswith("```python\n") and text.endswith("\n```"):
        return text[len("```python\n") : -len("\n```")]
    return None


def test_same_seed_same_rows_another_seed_other_rows(modules, rows):
    assert real_code.generate(ROWS, 0, CAP, modules) == rows
    assert real_code.generate(ROWS, 1, CAP, modules) != rows
    assert len({json.dumps(r["messages"]) for r in rows}) == ROWS  # distinct: the data stage would drop repeats


def test_every_answer_is_real_source_or_docstring_of_a_function_of_the_rows_module(modules, rows):
    by_name = {m.name: m for m in modules}
    kinds = {"code": 0, "body": 0, "text": 0}
    for row in rows:
        functions = by_name[row["group"]].functions
        msgs = row["messages"]
        for question, answer in ((msgs[i]["content"], msgs[i + 1]["content"]) for i in range(0, len(msgs), 2)):
            asked = [f for f in functions if f.stub in question or f.without_docstring in question]
            assert asked, question
            code = fenced(answer)
            if code is not None:
                assert code in {f.code for f in asked} | {f.body for f in asked}, (question, answer)
                kinds["code" if code in {f.code for f in asked} else "body"] += 1
                ast.parse(code if code in {f.code for f in asked} else "def f():\n" + code)  # real, complete Python
            else:
                assert any(answer in (real_code.capped(f.summary, CAP), real_code.capped(f.doc, CAP)) for f in asked)
                assert all(f.doc not in question for f in asked if f.without_docstring in question)  # not given away
                kinds["text"] += 1
    assert min(kinds.values()) > ROWS / 20, kinds


def test_a_follow_up_that_says_one_function_calls_the_other_is_true(modules, rows):
    import re

    by_display = {(m.name, f.display): f for m in modules for f in m.functions}
    said = 0
    for row in rows:
        follow = row["messages"][2]["content"].split("\n")[0] if len(row["messages"]) > 2 else ""
        for caller, callee in re.findall(r"`([\w.]+)` calls it|it calls `([\w.]+)`", follow, re.IGNORECASE):
            asked = re.match(r"[^`]*`([\w.]+)`", follow).group(1)
            caller, callee = (caller, asked) if caller else (asked, callee)
            code = by_display[row["group"], caller].body
            assert re.search(rf"\b{re.escape(by_display[row['group'], callee].short)}\(", code), (caller, callee)
            said += 1
    assert said > ROWS / 20


def test_functions_are_read_from_the_real_files_with_realistic_lengths(modules):
    import inspect
    import json.decoder
    import shlex
    import textwrap

    functions = {f.name: f for m in modules for f in m.functions}
    for obj, name in (
        (json.decoder.JSONDecoder.decode, "json.decoder.JSONDecoder.decode"),
        (shlex.split, "shlex.split"),
        (textwrap.TextWrapper.wrap, "textwrap.TextWrapper.wrap"),
    ):
        source = textwrap.dedent(inspect.getsource(obj)).rstrip("\n")
        assert functions[name].doc == inspect.getdoc(obj)
        # the stub and body as written, only the blank lines between docstring and body dropped
        assert source.startswith(functions[name].stub) and source.endswith(functions[name].body)
    assert all(len(f.code) <= CAP and len(f.body.splitlines()) >= real_code.MIN_BODY_LINES for f in functions.values())
    # a docstring that opens with an old-style signature line is summarized by its first sentence-paragraph
    assert functions["functools.reduce"].doc.startswith("reduce(function, iterable[, initial]) -> value\n\n")
    assert functions["functools.reduce"].summary.startswith("Apply a function of two arguments cumulatively")
    assert "textwrap.TextWrapper._split" not in functions  # private
    assert "textwrap.TextWrapper.fill" not in functions  # a one-line body
    assert len(functions) > 1000 and len(modules) > 100


def test_generated_files_and_test_suites_are_skipped(modules):
    root = stdlib_root()
    for generated in ("encodings/cp1252.py", "keyword.py", "token.py", "stringprep.py"):
        assert real_code.is_generated((root / generated).read_text(encoding="utf-8")), generated
    assert not real_code.is_generated((root / "json" / "__init__.py").read_text())
    names = {f.module for m in modules for f in m.functions}
    assert "encodings.cp1252" not in names and not any(".test" in n or n.startswith("test") for n in names)
    assert "encodings.punycode" in names  # hand-written codecs stay


def test_the_data_split_holds_whole_modules_out_and_the_functional_tasks_come_from_them(tmp_path, modules, rows):
    """The data stage's own split (traffic.split, by group) under params.yaml's data settings: no module has rows
    in both held-out and training or calibration, and every task's module is one of the held-out ones."""
    data = project_data()
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs, groups, _ = read_grouped(path)
    splits = split(convs, data.fractions, data.seed, groups)
    by_split = {name: {groups[conversation_key(m)] for m in s} for name, s in splits.items()}
    assert not by_split["heldout"] & (by_split["draft_train"] | by_split["calibration"])
    assert len(by_split["heldout"]) >= 5
    task_modules = {t["task_id"].split("/")[1].split(".")[0] for t in committed_tasks()}
    assert task_modules and not task_modules & (by_split["draft_train"] | by_split["calibration"])
    # a group's split is its own (its name, the seed, the fractions): asked among all the traffic's modules
    assert task_modules <= functional_code.heldout_groups(
        {m.name for m in modules} | task_modules, data.fractions, data.seed
    )


def test_every_profile_using_the_code_traffic_holds_the_functional_modules_out(modules):
    """A profile that changes data.seed or data.fractions would move other modules into training: the committed
    tasks are only held out under the split recorded with them."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    record = json.loads((COMMITTED / "traffic.source.json").read_text())["functional"]
    settings = [project_data(params)]
    for profile in sorted((ROOT / "profiles").glob("*.yaml")):
        overlay = yaml.safe_load(profile.read_text()) or {}
        if (overlay.get("data") or {}).get("traffic") == "data/python-code/traffic.jsonl":
            settings.append(project_data({"data": {**params["data"], **overlay["data"]}}))
    assert record["split"] == {
        "seed": settings[0].seed,
        "calibration": settings[0].fractions.calibration,
        "heldout": settings[0].fractions.heldout,
    }
    for data in settings:  # a profile may split otherwise, as long as the tasks' modules stay held out
        held = functional_code.heldout_groups(
            {m.name for m in modules} | set(record["modules"]), data.fractions, data.seed
        )
        assert record["modules"] and set(record["modules"]) <= held


def humaneval_program(task: dict, completion: str) -> str:
    """As HumanEval's execution.py composes it (written out here, not taken from the code under test)."""
    return task["prompt"] + completion + "\n" + task["test"] + "\n" + f"check({task['entry_point']})"


def run_program(source: str, tmp_path: Path) -> int:
    path = tmp_path / "program.py"
    path.write_text(source)
    return subprocess.run(
        [sys.executable, "-I", str(path)], cwd=tmp_path, capture_output=True, timeout=30, check=False
    ).returncode


def test_the_committed_functional_tasks_pass_with_their_canonical_solutions_and_fail_without(tmp_path):
    tasks = committed_tasks()
    assert tasks and all(set(t) == HUMANEVAL_KEYS for t in tasks) and len({t["task_id"] for t in tasks}) == len(tasks)
    for task in tasks:
        assert run_program(humaneval_program(task, task["canonical_solution"]), tmp_path) == 0, task["task_id"]
        assert run_program(humaneval_program(task, "    pass\n"), tmp_path) != 0, task["task_id"]
        # the prompt is imports + signature + docstring, ending where the body starts
        tree = ast.parse(task["prompt"] + "    ...\n")
        fn = tree.body[-1]
        assert isinstance(fn, ast.FunctionDef) and fn.name == task["entry_point"] and ">>>" in ast.get_docstring(fn)
        assert all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body[:-1])
        assert task["test"].startswith("def check(candidate):\n") and "assert " in task["test"]


def test_impure_or_not_self_contained_functions_make_no_task():
    source = '''
import os
import re

LIMIT = 3

def reads(path):
    """Read it.

    >>> reads('x')
    'x'
    """
    return open(path).read()

def uses_os(name):
    """Env.

    >>> uses_os('HOME')
    'x'
    """
    return os.environ[name]

def uses_constant(n):
    """Limit.

    >>> uses_constant(1)
    True
    """
    return n < LIMIT

def pure(text):
    """Words.

    >>> pure('a b')
    ['a', 'b']
    >>> pure(3)
    Traceback (most recent call last):
    TypeError: expected string or bytes-like object, got 'int'
    """
    return re.findall(r"\\w+", text)

def skipped(n):
    """Directive.

    >>> skipped(2)  # doctest: +SKIP
    4
    """
    return n * n
'''
    tree = ast.parse(source)
    imports = functional_code.module_imports(tree)
    needed = {n.name: functional_code.needed_imports(n, imports) for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert needed == {"reads": None, "uses_os": None, "uses_constant": None, "pure": ["import re"], "skipped": []}
    assert functional_code.check_source(ast.get_docstring(tree.body[-1]), "skipped") is None
    check = functional_code.check_source(ast.get_docstring(tree.body[-2]), "pure")
    assert check == (
        "def check(candidate):\n    assert candidate('a b') == ['a', 'b']\n"
        "    try:\n        candidate(3)\n    except TypeError:\n        pass\n"
        "    else:\n        raise AssertionError('expected TypeError')\n"
    )


def test_cli_writes_the_committed_files_byte_for_byte(tmp_path):
    """Two runs give the same files: the committed ones (`modelprep traffic python-code`, defaults) are made again
    here, on the Python version their record names (another has other source, so other rows)."""
    record = json.loads((COMMITTED / "traffic.source.json").read_text())
    if record["python"] != platform.python_version():
        pytest.skip(f"the committed traffic was made on Python {record['python']}, this is {platform.python_version()}")
    out = tmp_path / "code" / "traffic.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "traffic", "python-code", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    for name in ("traffic.jsonl", "traffic.source.json", "functional.jsonl"):
        assert (out.parent / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    assert record["rows"] == 300 and record["functional"]["tasks"] == len(committed_tasks())
    assert f"{record['functional']['tasks']} tasks" in r.stdout


@pytest.mark.parametrize("kind", ["python-code", "python-docs", "human-eval"])
@pytest.mark.parametrize(
    "bad, says",
    [
        ("dir", "is a directory"),
        ("dir.jsonl", "is a directory"),
        ("file/traffic.jsonl", "is not a directory"),
        ("traffic.txt", "expected a .jsonl file"),
    ],
)
def test_a_bad_out_is_one_line_before_any_work(tmp_path, capsys, kind, bad, says):
    from pipeline.cli import main

    (tmp_path / "dir").mkdir()
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as e:
        main(["traffic", kind, "--out", str(tmp_path / bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --out ") and says in err, err
    assert sorted(tmp_path.rglob("*")) == before  # nothing half-written
