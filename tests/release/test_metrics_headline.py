"""`dvc metrics show` is a table a person reads in a terminal, and every metric name says what it is (issue #49).

The headline folders (pipeline/release/headline.py) are built here the way the gate stage builds them, from the
committed demo build's evaluation metrics and, for the GPU rows, the serving records of tests/latency_model.py;
`dvc metrics show` is real DVC on a copy of the project."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import pytest
import yaml

from eval_helpers import gate_report
from latency_model import Server, searched_record
from pipeline.core.errors import PipelineError
from pipeline.evaluate.summary import OLD_NAMES, EvalSummary, current_names, load_metrics
from pipeline.release import gates, headline
from pipeline.release.publish import EvalRecord
from tiny_project import ROOT, copy_project

PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())  # the demo's five variants: the table's width
VARIANTS = PARAMS["quantize"]["enabled"]
FLAGGED = "awq-w4a16"  # fails a quality check and ships flagged (gates.allow_fail): the widest gate label


def committed_summaries() -> dict[str, EvalSummary]:
    """The committed demo build's evaluation, as the gate reads it (metrics written before the rename too)."""
    return {v: load_metrics(ROOT / f"metrics/eval-{v}.json") for v in VARIANTS}


def served(variant: str) -> object:
    """A GPU-like serving record with a capacity search: the draft model pays on the quantized variants only."""
    faster = variant != "bf16"
    return searched_record(
        variant, Server(speed=100.0 + 10 * faster), spec_server=Server(speed=150.0 if faster else 100.0)
    )


def test_dvc_metrics_show_fits_120_columns_with_every_headline_row(tmp_path):
    """Issue #49: `dvc metrics show` was 1,491 characters wide (71 columns, mostly `-`), #29 before it ~4,900: every
    stage's metrics file was a row and the union of their keys the columns. Now every stage's detail is a plain
    output and the headline is one file per measure keyed by variant, so the table is one column per variant.
    Here at its widest: five variants, a GPU build's served rows, a flagged failure, a shipped method."""
    params = {**PARAMS, "gates": {**PARAMS["gates"], "allow_fail": [FLAGGED]}}
    project = copy_project(tmp_path, params)
    metrics = project / "metrics"
    metrics.mkdir()
    for detail in (ROOT / "metrics").glob("*.json"):  # the stages' detail files, beside the headline as built
        shutil.copy(detail, metrics / detail.name)
    summaries = committed_summaries()
    flagged = summaries[FLAGGED]
    summaries[FLAGGED] = dataclasses.replace(flagged, quality=dataclasses.replace(flagged.quality, kl_divergence=0.9))
    report = gate_report(params, summaries, serve_by_variant={v: served(v) for v in VARIANTS})
    folders = headline.headline(summaries, report)
    headline.write(metrics, folders)

    r = subprocess.run(["dvc", "metrics", "show"], cwd=project, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 120, r.stdout
    assert lines[0].split() == ["Path", *sorted(VARIANTS)]
    rows = {line.split()[0] for line in lines[1:]}
    assert rows == {f"metrics/{folder}/{measure}.json" for folder, measures in folders.items() for measure in measures}
    assert {
        "metrics/speed/speedup_vs_bf16.json",
        "metrics/speed/capacity_vs_bf16.json",
        "metrics/release/shipped_method.json",
        "metrics/quality/kl_divergence.json",
    } <= rows
    gate = json.loads((metrics / "release" / "gate.json").read_text())
    assert gate[FLAGGED] == "FAIL, allowed" and gate["bf16"] == "PASS"
    shipped = json.loads((metrics / "release" / "shipped_method.json").read_text())
    assert shipped["bf16"] == "none" and shipped["gptq-w4a16"] == "draft_model", shipped


def test_only_the_headline_folders_are_registered_as_metrics():
    """Every other stage's JSON (eval-<v>.json, gates.json, draft.json, ...) is a plain output, not a metric: one
    more registered file is one more row and its keys more columns."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    registered = [
        next(iter(m)) if isinstance(m, dict) else m
        for s in stages.values()
        for m in (s.get("do", s).get("metrics") or [])
    ]
    assert registered == [f"metrics/{f}" for f in (headline.QUALITY, headline.RELEASE, headline.SPEED)]
    outs = [
        next(iter(o)) if isinstance(o, dict) else o for s in stages.values() for o in s.get("do", s).get("outs", [])
    ]
    assert {
        "metrics/eval-${item}.json",
        "metrics/gates.json",
        "metrics/draft.json",
        "metrics/models.json",
        "metrics/quantize-${item}.json",
        "metrics/serve-${item}.json",
    } <= set(outs)


def test_a_variant_that_ships_no_speculation_shows_none_as_shipped_and_its_estimate_as_estimated():
    """The demo build on a CPU: eagle3 is predicted x1.5 on every variant, and none ships (the config serves up to
    64 requests at once). metrics/eval-*.json said `speculative_method eagle3`, `num_speculative_tokens 7`; now
    what ships is the gate's decision and the estimate is named one. A blocked variant ships nothing at all."""
    summaries = committed_summaries()
    blocked = "fp8-static"
    summaries[blocked] = dataclasses.replace(
        summaries[blocked], quality=dataclasses.replace(summaries[blocked].quality, top1_agreement=0.5)
    )
    report = gate_report(PARAMS, summaries)
    folders = headline.headline(summaries, report)
    release, speed = folders[headline.RELEASE], folders[headline.SPEED]
    ships = {v: report.variants[v].speculation.num_speculative_tokens for v in VARIANTS if v != blocked}
    assert not any(ships.values()), ships  # the committed build's decision, which this test is about
    assert release["shipped_method"] == {v: "none" for v in ships} and release["shipped_k"] == {v: 0 for v in ships}
    assert release["gate"][blocked] == "FAIL"
    assert speed["estimated_method"] == {v: s.speculation.method for v, s in summaries.items()}
    assert set(speed["estimated_method"].values()) == {"eagle3"}
    assert speed["estimated_speedup"] == {v: s.speculation.expected_speedup for v, s in summaries.items()}
    assert not {"speedup_vs_bf16", "capacity_vs_bf16"} & set(speed)  # nothing served: no row, not a row of `-`


def test_eval_metrics_name_the_estimate_and_the_bound():
    summary = committed_summaries()["bf16"]
    m = summary.to_metrics()
    assert not set(OLD_NAMES) & set(m)
    s = summary.speculation
    assert (
        m["estimated_method"],
        m["estimated_num_speculative_tokens"],
        m["estimated_speedup"],
        m["weight_bytes_speedup"],
    ) == (s.method, s.num_speculative_tokens, s.expected_speedup, s.ideal_speedup)
    assert [e["estimated_speedup"] for e in m["methods"]] == [e.expected_speedup for e in s.methods]
    assert not any("expected_speedup" in e for e in m["methods"])
    assert m["estimated_speedup_by_concurrency"] == [dataclasses.asdict(p) for p in s.predicted]


def older(metrics: dict) -> dict:
    """Metrics as files written before the rename hold them."""
    new_to_old = {new: old for old, new in OLD_NAMES.items()}
    out = {new_to_old.get(k, k): v for k, v in metrics.items()}
    out["methods"] = [
        {("expected_speedup" if k == "estimated_speedup" else k): v for k, v in e.items()} for e in out["methods"]
    ]
    return out


def test_files_with_the_older_names_still_read(tmp_path):
    """benchmarks/gpu/raw/*/metrics and bundles built before the rename hold the older names: `modelprep gate
    --metrics-dir`, load_metrics and publish read them as the same summary; the summary's own reader does not
    accept them (a test or a runner writing an old name learns it)."""
    summary = committed_summaries()["gptq-w4a16"]
    old = older(summary.to_metrics())
    assert {"speculative_method", "expected_speedup", "ideal_speedup", "predicted_speedup_by_concurrency"} <= set(old)
    (tmp_path / "eval-gptq-w4a16.json").write_text(json.dumps(old))
    assert load_metrics(tmp_path / "eval-gptq-w4a16.json") == summary
    assert gates.load_eval_metrics(tmp_path) == {"gptq-w4a16": summary}
    assert current_names(old) == summary.to_metrics()
    record = EvalRecord.of(summary, gate_report(PARAMS, {"gptq-w4a16": summary}).variants["gptq-w4a16"]).to_json()
    record["speculation_estimates"] = {"note": "", **older(summary.speculation_metrics())}
    assert EvalRecord.from_json(record, "EVAL.json").summary == summary
    with pytest.raises(PipelineError, match=r"unknown evaluation metrics \['expected_speedup', 'ideal_speedup'"):
        EvalSummary.from_metrics(old, "old.json")


def test_draft_metrics_name_the_weight_bytes_model(demo_pair):
    """metrics/draft.json's `expected_speedup_finetuned 5.08` was the weight-bytes model's speedup at the k that
    maximises it, not a prediction: it is `weight_bytes_speedup_finetuned` at `weight_bytes_k_finetuned`. The estimate
    evaluate_draft makes, of a draft that is always accepted (the target itself), at a draft cost of 0.25."""
    from pipeline.evaluate import acceptance
    from pipeline.models.loading import load_causal_lm
    from stages.evaluate_draft import draft_metrics
    from tiny_project import demo_prompts

    target, max_k = load_causal_lm(demo_pair[0]), 4
    est = acceptance.estimate(target, target, demo_prompts(demo_pair[0], 2), 8, 0.0, max_k, cost_ratio=0.25)
    m = draft_metrics("finetuned", est)
    assert set(m) == {
        "token_acceptance_finetuned",
        "accepted_per_draft_token_finetuned",
        "weight_bytes_k_finetuned",
        "weight_bytes_speedup_finetuned",
    }
    assert m["weight_bytes_k_finetuned"] == max_k
    assert m["weight_bytes_speedup_finetuned"] == pytest.approx((1 + max_k) / (1 + max_k * 0.25), rel=1e-4)
