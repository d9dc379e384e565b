"""Traffic loading, validation, dedup and deterministic splitting."""

from __future__ import annotations

import json
import sys

import pytest

from pipeline.core.errors import PipelineError
from pipeline.data.settings import Fractions
from pipeline.data.traffic import dedup, load_traffic, split
from tiny_project import copy_project, run

FRACTIONS = Fractions(calibration=0.2, heldout=0.2)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def row(i):
    return json.dumps({"prompt": f"question {i}?", "response": f"answer {i}."})


def test_prompt_response_and_messages_rows_load_as_conversations(tmp_path):
    msgs = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    convs = load_traffic(write_lines(tmp_path / "t.jsonl", [row(1), json.dumps(msgs), ""]))
    assert convs[0] == [{"role": "user", "content": "question 1?"}, {"role": "assistant", "content": "answer 1."}]
    assert [m["role"] for m in convs[1]] == ["system", "user", "assistant"]


@pytest.mark.parametrize(
    "bad, expected",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"prompt": "only a prompt"}), "'response'"),
        (json.dumps({"messages": [{"role": "user", "content": "no answer"}]}), "must end with an assistant turn"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "role"),
        (json.dumps(["a", "list"]), "expected a JSON object"),
        ('{"messages": ' + "[" * 100000 + "]" * 100000 + "}", "JSON nested too deeply"),
    ],
)
def test_malformed_row_names_its_line(tmp_path, bad, expected):
    path = write_lines(tmp_path / "t.jsonl", [row(1), row(2), bad])
    with pytest.raises(PipelineError) as e:
        load_traffic(path)
    assert f"{path}:3" in str(e.value) and expected in str(e.value)


def test_dedup_ignores_whitespace_differences():
    a = [{"role": "user", "content": "How  do I?"}, {"role": "assistant", "content": "Like this."}]
    b = [{"role": "user", "content": "How do I?"}, {"role": "assistant", "content": "Like  this."}]
    assert dedup([a, b, a]) == [a]


def test_split_is_deterministic_stable_and_disjoint(tmp_path):
    convs = load_traffic(write_lines(tmp_path / "t.jsonl", [row(i) for i in range(400)]))
    first, again = split(convs, FRACTIONS, seed=0), split(list(reversed(convs)), FRACTIONS, seed=0)
    key = lambda s: sorted(json.dumps(c) for c in s)  # noqa: E731
    assert all(key(first[n]) == key(again[n]) for n in first)
    # A row keeps its split when the file grows: no held-out row leaks into training later.
    grown = split(
        convs + load_traffic(write_lines(tmp_path / "u.jsonl", [row(i) for i in range(400, 500)])), FRACTIONS, seed=0
    )
    assert set(key(first["heldout"])) <= set(key(grown["heldout"]))
    sizes = {n: len(v) for n, v in first.items()}
    assert sum(sizes.values()) == 400 and 40 < sizes["heldout"] < 120 and 40 < sizes["calibration"] < 120
    assert split(convs, FRACTIONS, seed=1)["heldout"] != first["heldout"]


def test_data_stage_rejects_malformed_file_with_one_line(tmp_path, demo_pair):
    proj = copy_project(tmp_path)
    (proj / "artifacts" / "models").mkdir(parents=True)
    import shutil

    shutil.copytree(demo_pair[0], proj / "artifacts" / "models" / "target")
    traffic = proj / "data" / "demo" / "traffic.jsonl"
    lines = traffic.read_text().splitlines()
    lines[4] = '{"prompt": "missing response"}'
    traffic.write_text("\n".join(lines) + "\n")
    r = run([sys.executable, "-m", "stages.data"], proj)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "traffic.jsonl:5" in r.stderr, r.stderr
    assert not (proj / "artifacts" / "data").exists()


def test_data_stage_line_says_which_rows_were_dropped_and_why(tmp_path, demo_pair):
    """Issue #29: the `data` line must say when rows were dropped, how many and why (duplicates, over
    data.max_tokens), and say so when none were."""
    import shutil

    import yaml

    proj = copy_project(tmp_path)
    max_tokens = yaml.safe_load((proj / "params.yaml").read_text())["data"]["max_tokens"]
    shutil.copytree(demo_pair[0], proj / "artifacts" / "models" / "target")
    long_answer = json.dumps({"prompt": "tell me everything", "response": " ".join(["word"] * 3000)})
    write_lines(proj / "data" / "demo" / "traffic.jsonl", [row(i) for i in range(60)] + [row(3), row(7), long_answer])
    r = run([sys.executable, "-m", "stages.data"], proj)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((proj / "metrics" / "data.json").read_text())
    assert (metrics["rows"], metrics["duplicates_dropped"], metrics["too_long_dropped"]) == (63, 2, 1)
    kept = ", ".join(f"{k} {metrics[k]}" for k in ("calibration", "draft_train", "heldout"))
    assert r.stdout.strip() == (
        "data: 63 rows read, 3 dropped (2 duplicates of an earlier conversation, 1 longer than "
        f"data.max_tokens {max_tokens} tokens) -> 60 kept: {kept}"
    )

    write_lines(proj / "data" / "demo" / "traffic.jsonl", [row(i) for i in range(60)])
    r = run([sys.executable, "-m", "stages.data"], proj)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("data: 60 rows read, none dropped -> 60 kept: calibration ")


def test_a_huge_row_is_skipped_unread_and_counted(tmp_path):
    """A 20 MB row can't fit data.max_tokens: read_traffic skips it in bounded reads (never holding it whole),
    counts it, and goes on with the next line."""
    from pipeline.data.traffic import read_traffic

    huge = json.dumps({"prompt": "x" * 20_000_000, "response": "y"})
    path = write_lines(tmp_path / "t.jsonl", [row(1), huge, row(2)])
    rows, oversized = read_traffic(path, max_row_bytes=4096)
    assert oversized == 1 and [m[0]["content"] for m in rows] == ["question 1?", "question 2?"]
    assert read_traffic(path)[1] == 0 and len(read_traffic(path)[0]) == 3  # unbounded: read as before
