"""What ships, decided in one place (pipeline/release/decision.py) from typed inputs: the speculative setting when
it pays and when it does not, a check that turns it off, the GEMM kernel where two come within noise, the tensor
parallelism the bundle reads with it, and each serving tier's setting."""

from __future__ import annotations

import dataclasses

import pytest

from eval_helpers import eval_summary
from pipeline.drafts.methods import Speculation
from pipeline.quantize.recipes import variant_spec
from pipeline.release import decision
from pipeline.serving import parallelism
from pipeline.serving.bench_record import PLAIN, Capacity, LoadLevel, ServeBenchRecord, ServeConfigResult
from pipeline.serving.capacity import CONCURRENCY
from pipeline.serving.settings import Slo
from pipeline.serving.tiers import parse_tiers
from tiny_project import serving_of, tiny_params, tiny_serving

SUMMARY = eval_summary(
    {
        "estimated_method": "eagle3",
        "estimated_num_speculative_tokens": 4,
        "methods": [{"method": "eagle3", "accepted_per_draft_token": 0.7, "first_token_acceptance": 0.7}],
    }
)


def level(c: int, tokens_per_s: float, accepted: float | None = None) -> LoadLevel:
    lat = {"mean": 10.0, "p50": 10.0, "p90": 11.0, "p99": 12.0}
    return LoadLevel(
        concurrency=c,
        num_prompts=32,
        completed=32,
        failed=0,
        duration_s=1.0,
        request_throughput=1.0,
        output_throughput=tokens_per_s,
        ttft_ms=lat,
        tpot_ms=lat,
        itl_ms=lat,
        e2el_ms=lat,
        accepted_per_draft_token=accepted,
    )


def config(k: int, by_c: dict[int, float], accepted: float | None = None) -> ServeConfigResult:
    return ServeConfigResult(
        num_speculative_tokens=k, startup_s=60.0, levels={f"c{c}": level(c, v, accepted) for c, v in by_c.items()}
    )


def record(eagle3: dict[int, float], accepted: float = 0.7, **fields) -> ServeBenchRecord:
    return ServeBenchRecord(
        variant="gptq-w4a16",
        gpu="H100",
        vllm_version="0.26.0",
        configs={PLAIN: config(0, {1: 100.0, 64: 3000.0}), "eagle3": config(4, eagle3, accepted)},
        **fields,
    )


def decide(serve: ServeBenchRecord, thresholds: dict | None = None) -> decision.Decision:
    ctx = decision.context_of(tiny_serving(), baseline=None)
    return decision.decide(decision.Inputs(SUMMARY, serve, thresholds or {}, ctx))


def test_speculation_that_pays_at_the_target_concurrency_ships_with_the_numbers_it_rests_on():
    d = decide(record({1: 150.0, 64: 3300.0}), {"min_accepted_per_draft_token": 0.5, "max_p99_itl_ms": 50})
    assert d.shipped == Speculation("eagle3", 4) and d.speculation.basis == decision.MEASURED
    assert d.speculation.speedup == pytest.approx(1.5)
    assert "(>= serving.speculation.min_gain 1.1)" in d.speculation.reason
    assert d.metrics["served_speculative_speedup"] == pytest.approx(1.5)
    assert d.metrics["served_output_tokens_per_s"] == 150.0  # the shipped config's own level, for the serving checks
    [check] = d.speculation_checks  # only the speculation group: the gate checks the rest
    assert (check.metric, check.value, check.passed) == ("served_accepted_per_draft_token", 0.7, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.kernel = "marlin"  # read by the gate, the bundle and the card: never changed on the way


def test_speculation_that_does_not_pay_ships_plain_decoding_and_its_checks_are_skipped():
    d = decide(record({1: 105.0, 64: 2000.0}), {"min_accepted_per_draft_token": 0.5})
    assert not d.shipped.enabled and d.speculation.candidate_k == 4
    assert "below serving.speculation.min_gain 1.1" in d.speculation.reason
    assert d.metrics["served_output_tokens_per_s"] == 100.0  # plain decoding's level is what ships
    assert [c.skipped for c in d.speculation_checks] == ["no speculation shipped"]


def test_a_candidate_that_fails_a_speculation_check_is_turned_off():
    d = decide(record({1: 150.0, 64: 3300.0}, accepted=0.2), {"min_accepted_per_draft_token": 0.5})
    assert not d.shipped.enabled and d.speculation.turned_off_by == ["min_accepted_per_draft_token"]
    assert "not shipped: min_accepted_per_draft_token" in d.speculation.reason
    assert [c.passed for c in d.speculation_checks] == [False]


def test_a_measured_candidate_whose_acceptance_dropped_against_the_baseline_is_turned_off():
    """x1.5 served, but EAGLE-3's first drafted token is accepted 0.7 of the time here (evaluate's estimate) against
    the baseline variant's 0.9: 0.2 over max_acceptance_drop_vs_bf16 0.1 turns it off; against 0.75 it ships."""
    serve, thresholds = record({1: 150.0, 64: 3300.0}), {"max_acceptance_drop_vs_bf16": 0.1}
    ctx = decision.context_of(tiny_serving(), baseline=None)

    def against(baseline: float) -> decision.Decision:
        with_baseline = dataclasses.replace(ctx, baseline_acceptance={"eagle3": baseline})
        return decision.decide(decision.Inputs(SUMMARY, serve, thresholds, with_baseline, "gptq-w4a16"))

    dropped = against(0.9)
    assert not dropped.shipped.enabled and dropped.speculation.turned_off_by == ["max_acceptance_drop_vs_bf16"]
    [check] = dropped.speculation_checks
    assert (check.metric, check.passed) == ("acceptance_drop_vs_bf16", False) and check.value == pytest.approx(0.2)
    assert against(0.75).shipped == Speculation("eagle3", 4)


def test_a_kernel_within_the_tie_at_the_target_loses_to_the_faster_under_load_and_ships_with_its_env():
    machete, marlin = config(0, {1: 405.0, 32: 5377.0}), config(0, {1: 402.0, 32: 6096.0})
    assert decision.choose_kernel({"machete": machete, "marlin": marlin}, 1, tie=0.04) == "marlin"
    assert decision.choose_kernel({"machete": machete, "marlin": marlin}, 1, tie=0.0) == "machete"
    env = {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel"}
    measured = record(
        {1: 105.0, 64: 2000.0}, kernels={"machete": machete, "marlin": marlin}, kernel="marlin", kernel_env=env
    )
    assert (decide(measured).kernel, decide(measured).kernel_env) == ("marlin", env)
    assert (decide(record({1: 105.0})).kernel, decide(record({1: 105.0})).kernel_env) == (None, None)


def with_capacity(c: ServeConfigResult, users: float) -> ServeConfigResult:
    slo = Slo(p99_ttft_ms=200, p99_itl_ms=50)
    found = Capacity(CONCURRENCY, slo, "bracket", users, users, 1, users, 1000.0, 1.0, None, users * 2, 64)
    return dataclasses.replace(c, capacity=found)


def test_a_kernel_faster_at_one_user_but_carrying_fewer_within_the_slo_does_not_ship():
    """raw/repro8b's choice: Marlin 270 tok/s at one user against Machete's 234, but 32 users at the SLO against 64."""
    marlin, machete = config(0, {1: 270.0, 16: 3239.0}), config(0, {1: 234.0, 16: 3173.0})
    by_kernel = {"machete": with_capacity(machete, 64), "marlin": with_capacity(marlin, 32)}
    assert decision.choose_kernel(by_kernel, 1, tie=0.04) == "machete"
    # equal capacity, or a kernel whose capacity was not searched: the speed at the target decides as before
    assert decision.choose_kernel({**by_kernel, "marlin": with_capacity(marlin, 64)}, 1, tie=0.04) == "marlin"
    assert decision.choose_kernel({**by_kernel, "marlin": marlin}, 1, tie=0.04) == "marlin"


def test_the_bundles_decision_carries_the_variants_tensor_parallelism_and_its_default_tier_shards_as_much():
    p = tiny_params(serving={"tensor_parallel_size": 2})
    serving = serving_of(p)
    tp = parallelism.decide("bf16", variant_spec(p["quantize"]["variants"], "bf16"), serving, None)
    gated = decide(record({1: 150.0, 64: 3300.0}))
    d = decision.shipped(
        gated.speculation,
        gated.capacity,
        record({1: 150.0, 64: 3300.0}),
        parse_tiers(serving),
        decision.context_of(serving),
        tp.tensor_parallel_size,
        tp.reason(),
    )
    assert (d.tensor_parallel_size, d.parallelism) == (2, tp.reason()) and "pinned" in d.parallelism
    [default] = [t.tier for t in d.tiers if t.tier.name == "default"]
    assert (default.tensor_parallel_size, default.gpus) == (2, 2)


def test_each_tier_ships_speculation_only_where_it_was_shown_to_pay_at_the_tiers_concurrency():
    serving = tiny_serving(
        tiers={
            "latency": {"max_num_seqs": 16, "concurrency": 1},
            "throughput": {"max_num_seqs": 256, "concurrency": 64},
            "quiet": {"concurrency": 1, "speculation": "off"},
            "mid": {"concurrency": 8},
        }
    )
    serve = record({1: 150.0, 64: 2000.0})  # x1.5 at 1, x0.67 at 64
    gated = decide(serve)
    d = decision.shipped(gated.speculation, gated.capacity, serve, parse_tiers(serving), decision.context_of(serving))
    by_tier = {t.tier.name: t for t in d.tiers}
    assert by_tier["default"].speculation == by_tier["latency"].speculation == Speculation("eagle3", 4)
    assert not by_tier["throughput"].speculation.enabled  # measured at 64: it loses there
    assert "below serving.speculation.min_gain" in by_tier["throughput"].why
    assert not by_tier["quiet"].speculation.enabled and "off for this tier" in by_tier["quiet"].why
    assert not by_tier["mid"].speculation.enabled and "not measured at concurrency 8" in by_tier["mid"].why


# --- across variants and tiers: the ranking, the pick and a tier's size ------------------------------------------


def claim(users_per_gpu: float, tokens_per_gpu: float, gpus: int = 1, lower_bound: bool = False):
    from pipeline.release.capacity_claim import CapacityClaim
    from pipeline.serving.settings import Slo

    return CapacityClaim(
        PLAIN, Slo(200, 50), "concurrency", "met", lower_bound, users_per_gpu * gpus, gpus, users_per_gpu,
        tokens_per_gpu, None,
    )  # fmt: skip


def test_the_cheapest_variant_per_gpu_that_passed_is_recommended_and_only_among_comparable_runs():
    """Most output tokens/s per GPU first whatever each variant's GPUs per replica; a variant that failed its gates
    is ranked, never picked; one not searched is not ranked; a search stopped at its bound below the pick, or runs
    on another GPU, leave the pick undecided."""
    serve = {v: dataclasses.replace(record({1: 150.0}), variant=v) for v in ("bf16", "gptq-w4a16", "fp8", "awq")}
    passed = {"bf16": True, "gptq-w4a16": True, "fp8": False, "awq": True}
    claims = {"bf16": claim(20, 500.0, gpus=4), "gptq-w4a16": claim(40, 900.0, gpus=2), "fp8": claim(60, 1200.0)}
    rows = decision.cost_rows(passed, {**claims, "awq": None}, serve)
    assert [(r.variant, r.gpus, r.passed) for r in rows] == [
        ("fp8", 1, False),
        ("gptq-w4a16", 2, True),
        ("bf16", 4, True),
    ]
    assert decision.cheapest(rows, serve) == ("gptq-w4a16", None)
    capped = decision.cost_rows(passed, {**claims, "bf16": claim(20, 500.0, gpus=4, lower_bound=True)}, serve)
    pick, why = decision.cheapest(capped, serve)
    assert pick is None and why.startswith("undecided: bf16 still met the SLO")
    elsewhere = {**serve, "bf16": dataclasses.replace(serve["bf16"], gpu="A100")}
    pick, why = decision.cheapest(decision.cost_rows(passed, claims, elsewhere), elsewhere)
    assert pick is None and why.startswith("measured on different GPUs or vLLM versions")


def test_a_tier_is_sized_to_the_users_it_carried_within_the_batches_measured_and_its_autoscaler_below_that():
    """max-num-seqs: the users the shipped config carried at the tier's SLO, never above the tier's own limit (256)
    nor serving.max_num_seqs (64: the largest batch measured), and only for a file not measured as it stands; the
    autoscaler's target: target_utilization of that."""
    from latency_model import Server, searched_record
    from pipeline.drafts.methods import NONE

    serving = tiny_serving()
    throughput = next(t for t in parse_tiers(serving) if t.name == "throughput")
    assert (throughput.engine["max_num_seqs"], serving.max_num_seqs) == (256, 64)
    forty, eighty = searched_record("bf16", Server(itl_slope=1.0)), searched_record("bf16", Server())
    sized = [
        decision.size_tier(throughput, NONE, forty, serving, 0.8, resizable=True),
        decision.size_tier(throughput, NONE, eighty, serving, 0.8, resizable=True),
        decision.size_tier(throughput, NONE, eighty, serving, 0.8, resizable=False),
    ]
    assert [(s.users, s.max_num_seqs, s.running_target) for s in sized] == [(40, 40, 32), (80, 64, 51), (80, None, 64)]
    skipped = decision.size_tier(throughput, NONE, ServeBenchRecord("bf16", skipped="no GPU"), serving, 0.8, True)
    assert (skipped.max_num_seqs, skipped.running_target) == (None, None) and "capacity not measured" in skipped.why
