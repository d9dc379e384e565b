"""The real-text traffic generator (pipeline/data/real_text.py, issue #29 item 4): conversations about the running
Python's standard library whose answers are its real docstrings, deterministic, capped, grouped by module so
the data stage holds whole modules out."""

from __future__ import annotations

import inspect
import json
import platform
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.data import real_text
from pipeline.data.settings import Fractions
from pipeline.data.traffic import conversation_key, read_grouped, read_source, split
from tiny_project import ROOT, copy_project, run

ROWS, CAP = 240, 600
FRACTIONS = Fractions(calibration=0.2, heldout=0.2)


@pytest.fixture(scope="module")
def documents():
    return real_text.stdlib_documents()


@pytest.fixture(scope="module")
def rows(documents):
    return real_text.generate(ROWS, 0, CAP, documents)


def answers(row):
    msgs = row["messages"]
    return [(msgs[i]["content"], msgs[i + 1]["content"]) for i in range(0, len(msgs), 2)]


def test_same_seed_same_rows_another_seed_other_rows(documents, rows):
    assert real_text.generate(ROWS, 0, CAP, documents) == rows
    assert real_text.generate(ROWS, 1, CAP, documents) != rows
    assert len({json.dumps(r["messages"]) for r in rows}) == ROWS  # distinct: the data stage would drop repeats


def test_every_answer_is_the_real_documentation_of_an_object_of_the_rows_module(documents, rows):
    by_name = {d.name: d for d in documents}
    for row in rows:
        entries = by_name[row["group"]].entries
        for question, answer in answers(row):
            # the object the question names, or whose documentation it pastes
            named = [e for e in entries if e.name in question or real_text.capped(e.doc, CAP) in question]
            assert named, question
            assert answer in {
                text
                for e in named
                for text in (
                    real_text.capped(e.doc, CAP),
                    real_text.capped(e.summary, CAP),
                    real_text.capped(f"{e.name}{e.signature}\n\n{e.summary}", CAP),
                )
            }, (question, answer)


def test_docstrings_are_what_inspect_reads_from_the_imported_module(documents):
    """ast reads what help() shows, without importing anything."""
    import json as json_module
    import textwrap

    entries = {e.name: e for d in documents for e in d.entries}
    for obj, name in (
        (json_module.dumps, "json.dumps"),
        (textwrap.TextWrapper.wrap, "textwrap.TextWrapper.wrap"),
        (json_module, "json"),
    ):
        assert entries[name].doc == inspect.getdoc(obj)
    assert entries["json.dumps"].signature.startswith("(obj, *, skipkeys=False")


def test_single_and_multi_turn_short_and_long_answers_within_the_cap(rows):
    turns = [len(r["messages"]) // 2 for r in rows]
    assert sum(t == 1 for t in turns) > ROWS / 3 and sum(t > 1 for t in turns) > ROWS / 6 and max(turns) == 3
    lengths = [len(a) for r in rows for _, a in answers(r)]
    assert max(lengths) <= CAP + len(" ...") and min(lengths) >= real_text.MIN_DOC_CHARS // 4
    assert sum(n < 120 for n in lengths) > len(lengths) / 4 and sum(n > CAP / 2 for n in lengths) > len(lengths) / 20
    pasted = [q for r in rows for q, _ in answers(r) if "\n\n" in q]  # documentation pasted into the question
    assert pasted and max(len(q) for q in pasted) <= CAP + 200


def test_capped_keeps_whole_paragraphs_and_cuts_a_long_first_one_at_a_word():
    assert real_text.capped("one two.\n\nthree four.", 100) == "one two.\n\nthree four."
    assert real_text.capped("one two.\n\nthree four.", 12) == "one two."
    assert real_text.capped("alpha beta gamma delta", 13) == "alpha beta ..."


def test_the_split_holds_whole_documents_out(tmp_path, rows):
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs, groups, _ = read_grouped(path)
    assert len(groups) == ROWS and set(groups.values()) == {r["group"] for r in rows}
    splits = split(convs, FRACTIONS, 0, groups)
    by_split = {name: {groups[conversation_key(m)] for m in s} for name, s in splits.items()}
    assert not by_split["heldout"] & (by_split["draft_train"] | by_split["calibration"])
    assert not by_split["calibration"] & by_split["draft_train"]
    assert sum(map(len, splits.values())) == ROWS and len(by_split["heldout"]) >= 5
    # without the groups, rows of one module land in several splits: the split is by row
    ungrouped = split(convs, FRACTIONS, 0)
    row_split = {name: {groups[conversation_key(m)] for m in s} for name, s in ungrouped.items()}
    assert row_split["heldout"] & row_split["draft_train"]


def test_a_group_that_is_not_a_string_names_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    good = {"prompt": "q?", "response": "a.", "group": "json"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "group": 3}) + "\n")
    with pytest.raises(PipelineError, match=rf"{path}:2: 'group' must be a non-empty string"):
        read_grouped(path)


def test_cli_writes_the_traffic_and_its_python_version(tmp_path):
    from pipeline.cli import main

    out = tmp_path / "docs" / "traffic.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["traffic", "python-docs", "--out", str(out), "--rows", "30", "--seed", "3"])
    assert e.value.code == 0
    assert [json.loads(line)["messages"] for line in out.read_text().splitlines()] == [
        r["messages"] for r in real_text.generate(30, 3, 1200)
    ]
    assert read_source(out) == {
        "generator": "python-docs",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "seed": 3,
    }


def test_the_committed_traffic_is_this_generators_output():
    """data/python-docs/traffic.jsonl (profiles/smollm2.yaml's traffic) is `modelprep traffic python-docs` on the
    Python its record names; another version has other docstrings, so it is only regenerated on that one."""
    committed = ROOT / "data" / "python-docs" / "traffic.jsonl"
    record = json.loads((ROOT / "data" / "python-docs" / "traffic.source.json").read_text())
    if record["python"] != platform.python_version():
        pytest.skip(f"the committed traffic was made on Python {record['python']}, this is {platform.python_version()}")
    rows = real_text.generate(record["rows"], record["seed"], record["max_answer_chars"])
    assert committed.read_text() == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    profile = yaml.safe_load((ROOT / "profiles" / "smollm2.yaml").read_text())
    assert profile["data"]["traffic"] == "data/python-docs/traffic.jsonl"


def test_the_data_stage_splits_generated_traffic_by_module_and_records_the_python(tmp_path, demo_pair, rows):
    import shutil

    proj = copy_project(tmp_path)
    shutil.copytree(demo_pair[0], proj / "artifacts" / "models" / "target")
    traffic = proj / "data" / "python-docs" / "traffic.jsonl"
    real_text.write(traffic, 120, 0, CAP)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["data"]["traffic"] = "data/python-docs/traffic.jsonl"
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = run([sys.executable, "-m", "stages.data"], proj)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((proj / "metrics" / "data.json").read_text())
    assert metrics["source"]["python"] == platform.python_version() and metrics["source"]["generator"] == "python-docs"
    kept = metrics["calibration"] + metrics["draft_train"] + metrics["heldout"]
    assert kept == 120 - metrics["too_long_dropped"] and min(metrics["groups"].values()) >= 1
    group_of = {conversation_key(r["messages"]): r["group"] for r in map(json.loads, traffic.read_text().splitlines())}
    seen = {
        name: {
            group_of[conversation_key(json.loads(line)["messages"])]
            for line in (proj / "artifacts" / "data" / f"{name}.jsonl").read_text().splitlines()
        }
        for name in ("calibration", "draft_train", "heldout")
    }
    assert {k: len(v) for k, v in seen.items()} == metrics["groups"]
    assert not seen["heldout"] & (seen["draft_train"] | seen["calibration"])


def test_an_ungrouped_file_keeps_its_metrics(tmp_path):
    """The demo's traffic has no groups and no source record: metrics/data.json gains no keys for it."""
    assert read_source(ROOT / "data" / "demo" / "traffic.jsonl") is None
    convs, groups, _ = read_grouped(ROOT / "data" / "demo" / "traffic.jsonl")
    assert groups == {} and len(convs) == 1200
    assert not Path(ROOT / "data" / "demo" / "traffic.source.json").exists()
