"""Ship what pays: the speculative setting chosen from serving measurements or CPU estimates, the serving
gates, the /metrics sampler against a real Prometheus exposition, and the serve_bench stage's skip record.

Serving measurements here are inputs (LoadLevel values as `vllm bench serve` reports them); what is under
test is what the pipeline decides and gates from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import yaml

from bundle_helpers import run_stage, stage_workspace
from eval_helpers import eval_summaries, eval_summary, gate_report
from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.evaluate.summary import EvalSummary
from pipeline.release import gates
from pipeline.release.decision import speculation_for as decide
from pipeline.serving import load_generator, sweep
from pipeline.serving.bench_record import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult
from tiny_project import ROOT, run, tiny_params

INT4, BF16 = "gptq-w4a16", "bf16"


def level(
    concurrency: int, tokens_per_s: float, p99_itl: float = 8.0, failed: int = 0, accepted: float | None = None
) -> LoadLevel:
    lat = {"mean": p99_itl / 2, "p50": p99_itl / 2, "p90": p99_itl * 0.8, "p99": p99_itl}
    return LoadLevel(
        concurrency=concurrency,
        num_prompts=32,
        completed=32 - failed,
        failed=failed,
        duration_s=3.0,
        request_throughput=10.0,
        output_throughput=tokens_per_s,
        ttft_ms=dict(lat),
        tpot_ms=dict(lat),
        itl_ms=dict(lat),
        e2el_ms=dict(lat),
        accepted_per_draft_token=accepted,
    )


def record(
    variant: str, plain: dict[int, float], spec: dict[int, float], k: int = 4, method: str = "draft_model", **kw
) -> ServeBenchRecord:
    """Measured output tokens/s per concurrency for the plain and one speculative method's configs."""
    return ServeBenchRecord(
        variant=variant,
        gpu="test GPU",
        vllm_version="0.25.0",
        date="2026-11-24",
        configs={
            PLAIN: ServeConfigResult(0, 30.0, {f"c{c}": level(c, t, **kw) for c, t in plain.items()}),
            method: ServeConfigResult(k, 31.0, {f"c{c}": level(c, t, accepted=0.7, **kw) for c, t in spec.items()}),
        },
    )


def metrics(params: dict, **overrides) -> dict:
    return {
        "perplexity_increase_pct": 0.5,
        "kl_divergence": 0.01,
        "top1_agreement": 0.97,
        "accepted_per_draft_token": 0.8,
        "estimated_num_speculative_tokens": 4,
        "estimated_speedup": 2.5,
        **overrides,
    }


# ---- the decision


@pytest.mark.parametrize("expected,ships", [(2.5, 4), (1.05, 0), (0.89, 0)])
def test_without_a_measurement_the_cpu_estimate_decides_and_k0_is_a_candidate(expected, ships):
    d = decide(
        eval_summary({"estimated_num_speculative_tokens": 4, "estimated_speedup": expected}), None, 1, min_gain=1.1
    )
    assert d.num_speculative_tokens == ships and d.basis == "estimated" and d.candidate_k == 4
    assert ("below serving.speculation.min_gain" in d.reason) == (ships == 0)


def test_a_measurement_overrules_the_estimate():
    """The demo's situation on an H100: the CPU model promised x2.5, the served draft runs at 0.4x."""
    slow = record(INT4, plain={1: 500.0, 8: 3000.0}, spec={1: 200.0, 8: 1500.0})
    d = decide(eval_summary({"estimated_num_speculative_tokens": 4, "estimated_speedup": 2.5}), slow, 1, min_gain=1.1)
    assert (d.num_speculative_tokens, d.basis, d.concurrency) == (0, "measured", 1)
    assert d.speedup == pytest.approx(0.4) and "x0.40" in d.reason
    fast = record(INT4, plain={1: 100.0, 8: 700.0}, spec={1: 180.0, 8: 650.0})
    assert decide(None, fast, 1, 1.1).num_speculative_tokens == 4
    assert decide(None, fast, 8, 1.1).num_speculative_tokens == 0  # at 8 concurrent requests it does not pay


def test_failed_requests_are_never_averaged_into_a_speedup():
    flaky = record(INT4, plain={1: 100.0}, spec={1: 180.0}, failed=2)
    d = decide(eval_summary({"estimated_num_speculative_tokens": 4, "estimated_speedup": 2.5}), flaky, 1, 1.1)
    assert d.num_speculative_tokens == 0 and "failed requests" in d.reason


# ---- the gates on serving measurements


def gate(params, variant_metrics, serve):
    return gate_report(params, eval_summaries(variant_metrics), serve_by_variant=serve)


def test_serving_checks_apply_to_the_config_that_ships_and_compare_with_bf16():
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    serve = {
        BF16: record(BF16, plain={1: 100.0}, spec={1: 90.0}),
        INT4: record(INT4, plain={1: 150.0}, spec={1: 240.0}, p99_itl=9.0),
    }
    report = gate(p, {BF16: metrics(p), INT4: metrics(p)}, serve)
    assert report.all_passed
    v = report.variants[INT4]
    assert v.speculation.num_speculative_tokens == 4 and v.speculation.basis == "measured"
    checks = {c.check: c for c in v.checks}
    assert checks["min_speedup_vs_bf16"].value == pytest.approx(2.4)  # 240 tok/s shipped vs bf16 plain 100
    assert checks["max_p99_itl_ms"].value == 9.0 and checks["max_failed_requests"].value == 0
    assert checks["min_accepted_per_draft_token"].metric == "served_accepted_per_draft_token"
    # bf16's own draft does not pay (90 < 100 tok/s): it ships plain, and plain is exactly the baseline
    b = report.variants[BF16]
    assert b.speculation.num_speculative_tokens == 0
    assert {c.check: c for c in b.checks}["min_speedup_vs_bf16"].value == pytest.approx(1.0)
    assert {c.check: c for c in b.checks}["min_accepted_per_draft_token"].skipped == "no speculation shipped"


def test_latency_and_failure_gates_fail_the_variant():
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    serve = {
        BF16: record(BF16, plain={1: 100.0}, spec={1: 90.0}),
        INT4: record(INT4, plain={1: 95.0}, spec={1: 90.0}, p99_itl=250.0, failed=1),
    }
    report = gate(p, {BF16: metrics(p), INT4: metrics(p)}, serve)
    failed = {c.check for c in report.variants[INT4].checks if c.failed}
    assert failed == {"max_p99_itl_ms", "max_failed_requests", "min_speedup_vs_bf16"}
    assert not report.all_passed
    lines = gates.failed_checks(report, allowed=False)
    assert f"{INT4}: max_p99_itl_ms (p99_itl_ms=250, needs <= 100.0 (over by 150))" in lines


def test_a_skipped_benchmark_skips_the_serving_checks_with_its_reason():
    p = tiny_params()
    report = gate(p, {INT4: metrics(p)}, {INT4: ServeBenchRecord(INT4, skipped="no CUDA device")})
    checks = {c.check: c for c in report.variants[INT4].checks}
    for name in ("max_p99_itl_ms", "max_p99_ttft_ms", "max_failed_requests", "min_speedup_vs_bf16"):
        assert checks[name].passed is None and checks[name].skipped == "not measured: no CUDA device"
    assert report.variants[INT4].speculation.basis == "estimated"


def test_gate_cli_reads_serving_metrics_from_the_metrics_dir(tmp_path):
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    out = tmp_path / "metrics"
    out.mkdir()
    for v in (BF16, INT4):
        (out / f"eval-{v}.json").write_text(json.dumps(metrics(p)))
    records.write(out / f"serve-{BF16}.json", record(BF16, plain={1: 100.0}, spec={1: 90.0}))
    records.write(out / f"serve-{INT4}.json", record(INT4, plain={1: 95.0}, spec={1: 80.0}))
    r = run(["modelprep", "gate", "--metrics-dir", str(out), "--params", str(tmp_path / "params.yaml")], tmp_path)
    assert r.returncode == 1
    [line] = [line for line in r.stdout.splitlines() if line.startswith(f"gate {INT4}: ")]
    assert line.startswith(f"gate {INT4}: FAIL: ") and ", 1 failed (min_speedup_vs_bf16)" in line
    assert line.endswith("; ships without speculation (measured)")
    assert "speedup_vs_bf16=0.95, needs >= 1.0 (short by 0.05)" in r.stderr
    (out / f"serve-{INT4}.json").write_text('{"variant": "x", "configs": {"plain": 3}}')
    r = run(["modelprep", "gate", "--metrics-dir", str(out), "--params", str(tmp_path / "params.yaml")], tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "serve-gptq-w4a16.json" in r.stderr


# ---- /metrics sampling and plots


def test_sampler_reads_kv_cache_use_under_load_from_a_real_exposition():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    kv = prometheus_client.Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", ["engine"], registry=registry)
    waiting = prometheus_client.Gauge("vllm:num_requests_waiting", "queue", ["engine"], registry=registry)
    kv.labels("0").set(0.1)
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with load_generator.MetricsSampler(url, interval_s=0.05) as sampler:
            time.sleep(0.3)
            kv.labels("0").set(0.93)
            waiting.labels("0").set(5)
            time.sleep(0.3)
            kv.labels("0").set(0.2)
            time.sleep(0.3)
        measured = sampler.apply(level(1, 100.0))
    finally:
        server.shutdown()
    assert measured.kv_cache_usage_max == pytest.approx(0.93) and measured.requests_waiting_max == 5
    assert 0.1 < measured.kv_cache_usage_mean < 0.93


def test_plots_have_a_row_per_config_and_concurrency_and_none_when_skipped():
    """Long form (dvc.yaml's lines_by_config template draws a line per config): the method's k in its label."""
    rec = record(INT4, plain={1: 100.0, 8: 600.0}, spec={8: 500.0, 1: 150.0}, k=5)
    rows, header = sweep.plot_rows(rec, *sweep.PLOTS["plots/serve_throughput"])
    assert header == ["concurrency", "config", "output_tokens_per_s"]
    assert rows == [
        {"concurrency": 1, "config": "plain", "output_tokens_per_s": 100.0},
        {"concurrency": 8, "config": "plain", "output_tokens_per_s": 600.0},
        {"concurrency": 1, "config": "draft_model k=5", "output_tokens_per_s": 150.0},
        {"concurrency": 8, "config": "draft_model k=5", "output_tokens_per_s": 500.0},
    ]
    assert sweep.plot_rows(ServeBenchRecord(INT4, skipped="no CUDA device"), "x", None) == (
        [],
        ["concurrency", "config", "x"],
    )


# ---- the stage without a GPU, and the bundle it leads to


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, demo_pair):
    return stage_workspace(tmp_path_factory.mktemp("serving"), demo_pair, {INT4: {}})


def test_stage_records_why_it_was_skipped(workspace):
    from pipeline.evaluate import vllm_spec

    reason = vllm_spec.unavailable_reason()
    if reason is None:
        pytest.skip("CUDA and vLLM are present: the stage measures here")
    r = run_stage(workspace, "stages.serve_bench", INT4)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"serve_bench {INT4}: skipped ({reason})"
    saved = records.read(ServeBenchRecord, workspace / f"metrics/serve-{INT4}.json")
    assert saved == ServeBenchRecord(INT4, skipped=reason)
    # each chart's directory holds only the note (.dvcignore hides it: `dvc plots show` draws no empty chart)
    for chart in ("serve_itl", "serve_throughput", "serve_pareto"):
        assert [p.name for p in (workspace / "plots" / chart / INT4).iterdir()] == ["skipped.txt"]
        assert (workspace / "plots" / chart / INT4 / "skipped.txt").read_text() == f"serve_bench {INT4}: {reason}\n"
    p = yaml.safe_load((workspace / "params.yaml").read_text())
    p["serve_bench"]["enabled"] = True  # asked for explicitly: an error, not a silent skip
    (workspace / "params.yaml").write_text(yaml.safe_dump(p))
    try:
        r = run_stage(workspace, "stages.serve_bench", INT4)
        assert r.returncode == 2 and "serve_bench.enabled is true but the GPU path cannot run" in r.stderr
    finally:
        p["serve_bench"]["enabled"] = "auto"
        (workspace / "params.yaml").write_text(yaml.safe_dump(p))


def test_a_draft_that_does_not_pay_is_not_shipped(workspace):
    """The gate turns speculation off; the bundle then has no draft, no speculative-config, and says why."""
    p = yaml.safe_load((workspace / "params.yaml").read_text())
    summary = EvalSummary.load(workspace / f"artifacts/eval/{INT4}/summary.json")
    report = gate_report(p, {INT4: replace(summary, speculation=replace(summary.speculation, expected_speedup=0.89))})
    records.write(workspace / "artifacts/gate/verdict.json", report)
    r = run_stage(workspace, "stages.bundle", INT4)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no speculation (estimated)" in r.stdout
    b = workspace / "artifacts/bundles" / INT4
    assert not (b / "draft").exists()
    assert "speculative-config" not in yaml.safe_load((b / "serve.yaml").read_text())
    card = (b / "README.md").read_text()
    assert (
        "Served without speculative decoding: predicted from the CPU acceptance estimate and measured serving "
        "costs (test-profile): x0.89 served output tokens/s at concurrency 1"
    ) in card
    assert "below serving.speculation.min_gain 1.1" in card
    assert "Acceptance monitoring" not in card


def test_benchmark_prompts_tokenize_to_the_evaluated_prompt_ids(demo_pair):
    """What the load generator sends over the completions API is, token for token, the prompt the
    acceptance estimate and the quality scores used (no second BOS, no second chat template)."""
    from pipeline.data.formatting import prompt_ids, prompt_text, row_to_messages, split_prompt_response
    from pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer(demo_pair[0])
    lines = (ROOT / "data/demo/traffic.jsonl").read_text().splitlines()[:20]
    assert tokenizer.chat_template
    for messages in (row_to_messages(json.loads(line)) for line in lines):
        prompt = split_prompt_response(messages)[0]
        text, add_special = prompt_text(tokenizer, prompt)
        assert tokenizer(text, add_special_tokens=add_special)["input_ids"] == prompt_ids(tokenizer, prompt)


# ---- the real `vllm bench serve` output (benchmarks/cpu/bench_client.py: vLLM 0.25's client against a CPU
# reference server, one run clean and one with every 3rd request answered with HTTP 500)

BENCH_RAW = ROOT / "benchmarks/cpu/raw/vllm-bench-serve"


@pytest.mark.parametrize("name", ["ok-c1", "ok-c4", "failing-c1", "failing-c4"])
def test_parses_vllm_bench_serve_results(name):
    raw = json.loads((BENCH_RAW / f"{name}.json").read_text())
    lvl = load_generator.parse_result(raw, name)
    assert lvl.concurrency == raw["max_concurrency"] and lvl.num_prompts == raw["num_prompts"]
    assert lvl.completed + lvl.failed == lvl.num_prompts
    assert lvl.output_throughput == raw["output_throughput"] and lvl.itl_ms["p99"] == raw["p99_itl_ms"]
    for latency in (lvl.ttft_ms, lvl.tpot_ms, lvl.itl_ms, lvl.e2el_ms):
        assert latency["p50"] <= latency["p90"] <= latency["p99"]
    assert lvl.accepted_per_draft_token is None  # no draft on that server: no spec_decode counters
    if name.startswith("failing"):
        # every failure is counted and its error kept; the latencies cover the successful requests only
        assert lvl.failed == sum(1 for e in raw["errors"] if e) > 0 and lvl.errors == ["Internal Server Error"]
    else:
        assert lvl.failed == 0 and lvl.errors == []


def test_a_result_without_a_percentile_is_one_error_line():
    raw = json.loads((BENCH_RAW / "ok-c1.json").read_text())
    del raw["p99_itl_ms"]
    with pytest.raises(PipelineError, match=r"^x.json: `vllm bench serve` result has no 'p99_itl_ms'$"):
        load_generator.parse_result(raw, "x.json")


def test_bench_command_runs_the_real_client_when_vllm_is_here(tmp_path):
    """Live version of the above: set VLLM_BENCH_PYTHON to a Python with vLLM 0.25 (CI has none)."""
    python = os.environ.get("VLLM_BENCH_PYTHON")
    if not python:
        pytest.skip("VLLM_BENCH_PYTHON is not set: vLLM's client is not installed here (CI never has it)")
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/cpu/bench_client.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_BENCH_PYTHON": python},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok-c4"]["failed"] == 0 and summary["failing-c4"]["failed"] == 3
