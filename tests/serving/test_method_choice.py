"""Which speculative method ships: the fastest measured config beats any estimate, a config that failed anywhere is
no candidate (and serve_bench and the bundle keep no file of it), the gate checks the chosen method's own acceptance,
and without a measurement the best estimate decides."""

from __future__ import annotations

import pytest

from eval_helpers import eval_summary
from pipeline.core.errors import PipelineError
from pipeline.drafts import methods
from pipeline.release.decision import speculation_for as decide
from pipeline.serving.bench_record import PLAIN, SPECULATIVE, LoadLevel, ServeBenchRecord, ServeConfigResult


def served(configs: dict[str, tuple[int, float]]) -> ServeBenchRecord:
    """Output tokens/s at concurrency 1 per config name: (k, tokens/s)."""
    lat = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    return ServeBenchRecord(
        "v",
        gpu="g",
        vllm_version="0.25.0",
        configs={
            name: ServeConfigResult(k, 10.0, {"c1": LoadLevel(1, 8, 8, 0, 1.0, 8.0, tok_s, lat, lat, lat, lat)})
            for name, (k, tok_s) in configs.items()
        },
    )


def test_the_fastest_measured_method_ships_whatever_the_estimate_said():
    """The GPU profile's situation: the estimate favoured the draft model, the served head was faster."""
    estimate = eval_summary(
        {"estimated_method": "draft_model", "estimated_num_speculative_tokens": 8, "estimated_speedup": 5.7}
    )
    d = decide(
        estimate,
        served({PLAIN: (0, 345.0), "draft_model": (8, 157.0), "eagle3": (7, 1002.0), "ngram": (6, 166.0)}),
        1,
        min_gain=1.1,
    )
    assert (d.method, d.num_speculative_tokens, d.basis) == ("eagle3", 7, "measured")
    assert d.compared == pytest.approx({"draft_model": 157 / 345, "eagle3": 1002 / 345, "ngram": 166 / 345})
    slow = decide(estimate, served({PLAIN: (0, 345.0), "eagle3": (7, 360.0)}), 1, min_gain=1.1)
    assert slow.num_speculative_tokens == 0 and slow.candidate_k == 7  # 1.04x is below min_gain


def test_a_legacy_record_is_the_draft_models():
    d = decide(None, served({PLAIN: (0, 100.0), SPECULATIVE: (4, 200.0)}), 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens) == ("draft_model", 4)


def test_methods_vllm_could_not_serve_never_ship_on_their_estimate():
    """Plain decoding was served and every speculative config failed to start: the decision is a measured
    'none', whatever the CPU estimate promised (it would have shipped an unserved head)."""
    estimate = eval_summary(
        {"estimated_method": "eagle3", "estimated_num_speculative_tokens": 7, "estimated_speedup": 5.7}
    )
    record = served({PLAIN: (0, 345.0)})
    record.failed_configs = {"eagle3": "vllm serve exited 1 before /health answered: unsupported head"}
    d = decide(estimate, record, 1, min_gain=1.1)
    assert (d.num_speculative_tokens, d.basis, d.method) == (0, "measured", None)
    assert "eagle3 not a candidate: failed to start" in d.reason


def test_one_methods_failed_requests_drop_only_that_method():
    record = served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0), "ngram": (6, 400.0)})
    record.configs["eagle3"].levels["c1"].failed = 3
    d = decide(None, record, 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens, d.basis) == ("ngram", 6, "measured")
    assert "eagle3 not a candidate: 3 failed requests" in d.reason
    record.configs[PLAIN].levels["c1"].failed = 1  # plain's failures void every comparison
    assert decide(None, record, 1, min_gain=1.1).num_speculative_tokens == 0


def test_a_method_that_failed_anywhere_in_its_sweep_is_not_a_candidate():
    """Clean at the target concurrency but failing at 32: the serving gate counts the whole sweep, so shipping it
    would fail the variant while a clean method was there."""
    import copy

    record = served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0), "ngram": (6, 400.0)})
    level = copy.deepcopy(record.configs["eagle3"].levels["c1"])
    level.concurrency, level.failed = 32, 2
    record.configs["eagle3"].levels["c32"] = level
    d = decide(None, record, 1, min_gain=1.1)
    assert d.method == "ngram" and "eagle3 not a candidate: 2 failed requests" in d.reason


def test_the_gate_checks_the_candidate_methods_acceptance_not_another_methods():
    """eagle3 was measured fastest but vLLM reported no acceptance for it: the check falls back to eagle3's own
    estimate, never to the draft model's offline vLLM number or the CPU-best method's."""
    from pipeline.release.gates import ServingContext, gate_variant, verdict_line

    summary = eval_summary(
        {
            "estimated_method": "draft_model",
            "accepted_per_draft_token": 0.9,
            "vllm_accepted_per_draft_token": 0.95,
            "methods": [
                {"method": "draft_model", "accepted_per_draft_token": 0.9},
                {"method": "eagle3", "accepted_per_draft_token": 0.3},
            ],
        }
    )
    verdict = gate_variant(
        summary,
        served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0)}),
        {"min_accepted_per_draft_token": 0.5},
        ServingContext(1, 1.1, None),
        allowed=False,
    )
    check = verdict.applied("min_accepted_per_draft_token")
    assert (check.metric, check.value, check.passed) == ("accepted_per_draft_token", 0.3, False)
    assert verdict.speculation.num_speculative_tokens == 0 and "not shipped" in verdict.speculation.reason
    assert verdict.speculation.turned_off_by == ["min_accepted_per_draft_token"]
    assert "gave way" not in verdict_line("int4", verdict)  # a failed check is no capacity trade


def test_the_bundle_refuses_a_config_file_the_record_does_not_measure(tmp_path):
    """A serve-eagle3.yaml left by a config that failed (or an older run) is not a measurement."""
    from pipeline.release.assembly import check_measured_config
    from pipeline.serving.sweep import discard

    text = "speculative-config: {}\n"
    (tmp_path / "raw").mkdir()
    for name in ("serve-eagle3.yaml", "raw/eagle3-c1.json", "serve-plain.yaml", "raw/plain-c1.json"):
        (tmp_path / name).write_text(text)
    with pytest.raises(PipelineError, match="no measurement of the eagle3 config"):
        check_measured_config(tmp_path, served({PLAIN: (0, 345.0)}), methods.Speculation("eagle3", 7), text)
    discard(tmp_path, "eagle3")  # what serve_bench does when a config fails
    assert sorted(p.name for p in tmp_path.rglob("*.*")) == ["plain-c1.json", "serve-plain.yaml"]
    check_measured_config(tmp_path, served({PLAIN: (0, 345.0)}), methods.NONE, text)  # plain was measured


def test_a_config_vllm_cannot_serve_is_recorded_and_leaves_no_file_but_plain_at_default_settings(tmp_path, capsys):
    """serve_bench's one step per config: a method that fails is recorded and discarded and the sweep goes on,
    in a tier plain decoding too (the tier ends there); plain failing at the default settings fails the stage."""
    from pipeline.serving import sweep
    from pipeline.serving.tiers import Tier

    def attempt(out, name, failed, tier=None, label=None, must=None):
        def serve_config():
            (out / "raw").mkdir(parents=True, exist_ok=True)
            for partial in (f"serve-{name}.yaml", f"raw/{label or name}-c1.json"):
                (out / partial).write_text("written before vLLM failed\n")
            if name != "ngram":
                raise PipelineError(f"vllm serve exited 1: {name} {'x' * 600}")
            return "measured"

        job = sweep.Job(name, methods.NONE, {}, failed, tier=tier, label=label, must=must)
        return sweep.served_or_failed(out, "v", job, serve_config)

    failed = {}
    assert attempt(tmp_path, "ngram", failed) == "measured" and failed == {}
    assert attempt(tmp_path, "eagle3", failed) is None
    assert failed == {"eagle3": f"vllm serve exited 1: eagle3 {'x' * 600}"[:500]}
    assert "serve_bench v: eagle3 failed, the other configs go on: vllm serve exited 1" in capsys.readouterr().out
    with pytest.raises(PipelineError, match="plain"):
        attempt(tmp_path, PLAIN, failed)
    assert PLAIN not in failed
    in_tier = {}
    assert attempt(tmp_path / "tiers/throughput", PLAIN, in_tier, Tier("throughput", concurrency=64)) is None
    assert list(in_tier) == [PLAIN] and "serve_bench v: tier throughput plain failed: " in capsys.readouterr().out
    # Plain decoding on one of two kernels: recorded under the kernel's label, its raw files gone; the other kernel
    # may still serve plain decoding, so the stage goes on.
    kernels = {}
    assert attempt(tmp_path, PLAIN, kernels, label="plain-machete", must=False) is None
    assert list(kernels) == ["plain-machete"]
    with pytest.raises(PipelineError, match="plain"):  # the only kernel: its failure fails the stage
        attempt(tmp_path, PLAIN, {}, label="plain-marlin", must=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*")) == [
        "raw/ngram-c1.json",
        "raw/plain-c1.json",
        "raw/plain-marlin-c1.json",
        "serve-ngram.yaml",
        "serve-plain.yaml",
    ]  # the default plain's and the only kernel's: the stage fails there, and its whole
    # output directory with it


def test_without_a_measurement_the_best_estimated_method_decides():
    d = decide(
        eval_summary(
            {
                "estimated_method": "ngram",
                "estimated_num_speculative_tokens": 5,
                "estimated_speedup": 1.3,
                "methods": [
                    {"method": "ngram", "estimated_speedup": 1.3},
                    {"method": "draft_model", "estimated_speedup": 1.2},
                ],
            }
        ),
        None,
        1,
        min_gain=1.1,
    )
    assert (d.method, d.num_speculative_tokens, d.basis) == ("ngram", 5, "estimated")
    assert d.compared == {"ngram": 1.3, "draft_model": 1.2}
