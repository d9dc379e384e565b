"""The stages of speculative methods that draft.method does not request: each records why it made nothing."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from bundle_helpers import run_stage_in_process
from tiny_project import copy_project, run, tiny_params


def test_trained_methods_stages_make_nothing_when_only_ngram_is_requested(tmp_path, capfd):
    """draft.method [ngram]: no distillation, no fine-tuning, no served draft, no draft evaluation, no head; each
    stage records why (DVC still gets its outputs), without reading a model or data (the workspace holds only
    params.yaml). Each stage's main runs in this process: the five stages' imports once, not five interpreters."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(draft={"method": ["ngram"]}), sort_keys=False))
    for stage, why in (
        ("distill", "neither draft_model nor eagle3 is in draft.method"),
        ("draft_finetune", "draft_model is not in draft.method"),
        ("eagle3", "eagle3 is not in draft.method"),
        ("draft_quantize", "draft_model is not in draft.method"),
        ("evaluate_draft", "draft_model is not in draft.method"),
    ):
        r = run_stage_in_process(tmp_path, capfd, f"stages.{stage}")
        assert r.returncode == 0 and f"skipped ({why})" in r.stdout, (stage, r.stdout[-2000:], r.stderr[-2000:])
    for out, why in (
        ("distill", "neither draft_model nor eagle3 is in draft.method"),
        ("draft-finetuned", "draft_model is not in draft.method"),
    ):
        assert [p.name for p in (tmp_path / "artifacts" / out).iterdir()] == ["skipped.json"]
        assert json.loads((tmp_path / "artifacts" / out / "skipped.json").read_text()) == {"skipped": why}
    skipped = {
        name: json.loads((tmp_path / "artifacts" / name).read_text())["skipped"]
        for name in ("draft/served.json", "eagle3/record.json")
    }
    assert skipped == {
        "draft/served.json": "draft_model is not in draft.method",
        "eagle3/record.json": "eagle3 is not in draft.method",
    }
    for metrics in ("draft_training", "draft"):
        assert json.loads((tmp_path / f"metrics/{metrics}.json").read_text()) == {
            "skipped": "draft_model is not in draft.method"
        }


@pytest.mark.slow
def test_eagle3_stage_records_why_no_head_was_trained(tmp_path, demo_pair):
    import shutil

    ws = copy_project(tmp_path, tiny_params(draft={"method": ["draft_model", "ngram"]}))
    shutil.copytree(demo_pair[0], ws / "artifacts/models/target")
    (ws / "artifacts/distill").mkdir(parents=True)
    r = run([sys.executable, "-m", "stages.eagle3"], ws)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((ws / "artifacts/eagle3/record.json").read_text())
    assert record["skipped"] == "eagle3 is not in draft.method" and not (ws / "artifacts/eagle3/model").exists()
