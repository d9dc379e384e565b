"""What ships for a variant, decided in one place: the speculative method and its k (or k schedule), the GEMM
kernel, the capacity claim, and each serving tier's speculation. Everything here is a pure function of typed
inputs (evaluate's summary, serve_bench's records, the gates' thresholds and serving's policy); stages and the
gate, bundle, handoff and card only read the `Decision` it returns.

Where the decision lives between stages: serve_bench calls `choose_kernel` and `schedule_to_measure` while it
measures (every later config runs on the chosen kernel, so that choice must be made there) and records them; the
gate calls `decide` and writes its decision into artifacts/gate/verdict.json (VariantVerdict.speculation and
.capacity), which the bundle reads back with `shipped` rather than recomputing: `decide` reads the baseline
variant's record and the gates' thresholds, which are no inputs of a bundle, and the bundle's GATE.json must be
the very verdict publish re-checks.

The speculative setting. Measured beats predicted. With a serving benchmark of the variant (GPU, vLLM), the
method that gave the most output tokens/s at `serving.target_concurrency` ships, and only when it beats plain
decoding by `serving.speculation.min_gain`. Without one, the served speed predicted from the CPU acceptance
estimate and a cost profile measured on a GPU (pipeline/evaluate/serving_costs.py) decides, where a prediction
holds: the profiles time requests decoding in lockstep, which is what a server sees with one request at a time. A
server with several requests mixes new requests' prefills into the speculative steps, which no profile measures
(issue #28 served the demo's draft model at 0.39x of plain decoding at concurrency 16 where lockstep steps predict
a gain), so a config ships speculation on a prediction only when it serves one request at a time (max_num_seqs 1,
concurrency 1) and the prediction there clears the margin. With no cost profile nothing is predicted and nothing
ships. "No speculation" is always a candidate, so a method that doesn't pay is never shipped because it was the
least bad one. A candidate that fails a speculation check (gates' speculation group), or that carries fewer users
at the SLO than min_capacity_vs_bf16 where plain decoding carries enough, is turned off.

A k per batch size (vLLM's num_speculative_tokens_per_batch_size): speculation pays at small batches and loses
at large ones, where the verify step is compute-bound. serve_bench serves a schedule built from its own sweep (k
where the fixed config paid, none where it lost) and the schedule ships instead of the best fixed setting (plain
decoding or one method at one k) when, over the sweep's concurrencies, its geometric-mean speedup against plain
decoding is higher, and at target_concurrency it clears min_gain wherever it drafts there.

Across variants and tiers: `cost_rows` and `cheapest` rank the variants by output tokens/s per GPU at the SLO and
pick the one a serving team would (the gate's report renders them); `size_tier` sizes a tier's max-num-seqs and
its autoscaler from the measured capacity (the handoff kit renders it). The k each concurrency's prediction finds
fastest (serving_costs.predict) is an input, not a choice: evaluate writes it into its summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pipeline.drafts.methods import DRAFT_MODEL, NGRAM, NONE, KSchedule, Speculation
from pipeline.evaluate.summary import EvalSummary
from pipeline.release.capacity_claim import CapacityClaim, capacity_claim, capacity_metrics
from pipeline.release.checks import DRAFTER_COST_CHECKS, GateCheck, check_variant, drafter_cost_free
from pipeline.release.shipped_config import (
    candidate_metrics,
    config_name,
    config_of,
    k_at,
    measured_pair,
    shipped_metrics,
    speculative_metrics,
)
from pipeline.release.thresholds import SPECULATION
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord, ServeConfigResult
from pipeline.serving.capacity import CONCURRENCY, users_meeting
from pipeline.serving.settings import ServingParams
from pipeline.serving.tiers import Tier

MEASURED, ESTIMATED = "measured", "estimated"


@dataclass
class SpeculationDecision:
    num_speculative_tokens: int  # what ships; 0 = no speculative-config in the bundle
    candidate_k: int  # the k that was weighed against plain decoding
    basis: str  # measured (serving benchmark) | estimated (CPU acceptance and cost model)
    speedup: float | None  # speculative / plain output tokens/s (measured) or the expected speedup
    concurrency: int | None  # where a measured speedup was taken
    reason: str
    method: str | None = DRAFT_MODEL  # the candidate's method (pipeline/drafts/methods.py)
    compared: dict[str, float] | None = None  # every method's speedup, where more than one was weighed
    predicted: dict[str, float] | None = None  # estimated basis: concurrency -> predicted speedup at candidate_k
    profile: str | None = None  # the cost profile that predicted it
    schedule: list[list[int]] | None = None  # what ships is this k per batch-size range (k: its largest)
    # The gate checks that turned the candidate off after it was chosen (failed speculation checks, or
    # min_capacity_vs_bf16 where plain decoding carries the floor and the candidate does not); empty otherwise.
    turned_off_by: list[str] = field(default_factory=list)

    @property
    def speculation(self) -> Speculation:
        k = self.num_speculative_tokens
        schedule = tuple(tuple(r) for r in self.schedule) if k and self.schedule else None
        return Speculation(self.method if k else None, k, schedule)


def k_schedule(speedups: dict[int, float], k: int, min_gain: float, max_num_seqs: int) -> KSchedule | None:
    """The batch-size schedule a method's fixed-k sweep suggests: k at the concurrencies where it measured at least
    min_gain against plain decoding, none (0) elsewhere; a concurrency's range reaches halfway (geometrically) to
    the next one's, the last to max_num_seqs. None when that is the fixed config (k everywhere) or plain decoding."""
    levels = sorted(speedups)
    ks = [k if speedups[c] >= min_gain else 0 for c in levels]
    if not any(ks) or all(x == k for x in ks):
        return None
    ranges: list[tuple[int, int, int]] = []
    lo = 1
    for i, (c, kc) in enumerate(zip(levels, ks)):
        hi = max(lo, max_num_seqs) if i == len(levels) - 1 else max(lo, math.isqrt(c * levels[i + 1]))
        if ranges and ranges[-1][2] == kc:
            ranges[-1] = (ranges[-1][0], hi, kc)
        else:
            ranges.append((lo, hi, kc))
        lo = hi + 1
    return tuple(ranges)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else 0.0


def speculation_for(
    summary: EvalSummary | None,
    serve: ServeBenchRecord | None,
    concurrency: int,
    min_gain: float,
    max_num_seqs: int = 1,
) -> SpeculationDecision:
    """Measured whenever plain decoding was served at the concurrency: then only a method served there without
    failed requests is a candidate, and none ships when none was (the estimate never overrides a measurement:
    a method vLLM failed to serve must not ship on its CPU estimate). summary: evaluate's, whose estimate decides
    otherwise (None: no estimate). max_num_seqs: the config's batch limit (a prediction holds only for a config
    that serves one request at a time)."""
    plain = (
        serve.configs[PLAIN].at(concurrency)
        if serve is not None and not serve.skipped and PLAIN in serve.configs
        else None
    )
    if plain is None:
        return _estimated(summary, min_gain, concurrency, max_num_seqs)
    if plain.failed:
        return _measured_none(
            concurrency,
            f"plain decoding had {plain.failed} failed requests in the serving "
            f"benchmark at concurrency {concurrency}; no speedup can be claimed",
        )
    if not plain.output_throughput:
        return _measured_none(concurrency, f"plain decoding produced no tokens at concurrency {concurrency}")
    measured, dropped = _candidates(serve, concurrency)
    skipped = "".join(f"; {m} not a candidate: {why}" for m, why in dropped.items())
    if not measured:
        return _measured_none(
            concurrency, f"no speculative config was served without failures at concurrency {concurrency}{skipped}"
        )
    gains = {m: level.output_throughput / plain.output_throughput for m, level in measured.items()}
    method = max(gains, key=gains.get)
    k = serve.speculative()[method].num_speculative_tokens
    fixed = _measured_decision(gains, method, k, concurrency, min_gain, skipped)
    return _scheduled(serve, fixed, concurrency, min_gain) or fixed


def _candidates(serve: ServeBenchRecord, concurrency: int) -> tuple[dict, dict[str, str]]:
    """The speculative configs served at the concurrency without failed requests, and why each other one is not."""
    dropped = {m: f"failed to start ({(why.splitlines() or [''])[0][:120]})" for m, why in serve.failed_configs.items()}
    measured = {}
    for m, config in serve.speculative().items():
        level = config.at(concurrency)
        if level is None:
            dropped[m] = f"not measured at concurrency {concurrency}"
        elif config.failed_requests:  # anywhere in its sweep: the serving gate counts them all, and would fail it
            dropped[m] = f"{config.failed_requests} failed requests"  # only this method is out; the others still count
        else:
            measured[m] = level
    return measured, dropped


def _measured_decision(
    gains: dict[str, float], method: str, k: int, concurrency: int, min_gain: float, skipped: str
) -> SpeculationDecision:
    """The decision from the measured gain of the best method, before the concurrency sweep's schedule."""
    gain = gains[method]
    pays = gain >= min_gain
    others = "".join(f"; {m} x{g:.2f}" for m, g in gains.items() if m != method)
    return SpeculationDecision(
        num_speculative_tokens=k if pays else 0,
        candidate_k=k,
        basis=MEASURED,
        speedup=gain,
        concurrency=concurrency,
        reason=(
            f"measured x{gain:.2f} plain decoding's output tokens/s at concurrency {concurrency} with "
            f"{method} k={k}"
            + (
                f" (>= serving.speculation.min_gain {min_gain})"
                if pays
                else f", below serving.speculation.min_gain {min_gain}"
            )
            + others
            + skipped
        ),
        method=method,
        compared=gains if len(gains) > 1 else None,
    )


def _sweep_speedups(serve: ServeBenchRecord, config) -> dict[int, float]:
    """A config's output tokens/s over plain decoding's at every concurrency both were measured at."""
    out = {}
    for key, level in config.levels.items():
        base = serve.configs[PLAIN].levels.get(key)
        if base is not None and base.output_throughput and not level.failed:
            out[level.concurrency] = level.output_throughput / base.output_throughput
    return out


def _scheduled(
    serve: ServeBenchRecord, fixed: SpeculationDecision, concurrency: int, min_gain: float
) -> SpeculationDecision | None:
    """The measured k schedule that beats the best fixed setting (see the module docstring), or None."""
    best_fixed = _sweep_speedups(serve, serve.speculative()[fixed.method]) if fixed.num_speculative_tokens else None
    winner = None
    for method, config in serve.schedules.items():
        if config.failed_requests or not config.schedule or method in serve.failed_configs:
            continue
        mine = _sweep_speedups(serve, config)
        if concurrency not in mine:
            continue
        levels = sorted(mine)
        theirs = [best_fixed.get(c) for c in levels] if best_fixed is not None else [1.0] * len(levels)
        if None in theirs:
            continue  # compared only where both were measured
        schedule = tuple(tuple(r) for r in config.schedule)
        drafts_here = k_at(schedule, concurrency) > 0
        if drafts_here and mine[concurrency] < min_gain:
            continue
        g_mine, g_theirs = _geomean([mine[c] for c in levels]), _geomean(theirs)
        if g_mine > g_theirs and (winner is None or g_mine > winner[0]):
            winner = (g_mine, g_theirs, method, config, mine)
    if winner is None:
        return None
    g_mine, g_theirs, method, config, mine = winner
    shipped = Speculation(method, config.num_speculative_tokens, tuple(tuple(r) for r in config.schedule))
    than = f"{fixed.method} k={fixed.num_speculative_tokens}" if fixed.num_speculative_tokens else "plain decoding"
    per_level = ", ".join(f"c{c} x{v:.2f}" for c, v in sorted(mine.items()))
    return replace(
        fixed,
        num_speculative_tokens=config.num_speculative_tokens,
        candidate_k=config.num_speculative_tokens,
        method=method,
        speedup=mine[concurrency],
        schedule=[list(r) for r in config.schedule],
        reason=f"measured: {shipped.label} ({per_level} against plain decoding) beats {than}, the best "
        f"fixed setting, over the sweep: geometric mean x{g_mine:.2f} against x{g_theirs:.2f}; "
        f"the fixed settings: {fixed.reason}",
    )


def _measured_none(concurrency: int, reason: str) -> SpeculationDecision:
    return SpeculationDecision(0, 0, MEASURED, None, concurrency, reason, method=None)


LOCKSTEP = (
    "a prediction holds only for one request at a time: with several, new requests' prefills mix into "
    "the speculative steps, which the lockstep cost profiles do not measure"
)


def _estimated(
    summary: EvalSummary | None, min_gain: float, concurrency: int, max_num_seqs: int
) -> SpeculationDecision:
    """The predicted served speed of the best method and k (the evaluate stage picked them) against min_gain, for
    a config that serves one request at a time."""
    est = (summary or EvalSummary()).speculation
    k, expected, profile = est.num_speculative_tokens, est.expected_speedup, est.cost_profile
    method = est.method or DRAFT_MODEL
    if not k or expected is None:
        return SpeculationDecision(
            0,
            int(k or 0),
            ESTIMATED,
            None,
            None,
            "no served speed was predicted (no serving-cost profile for the serving GPU and "
            "vLLM, and no serving benchmark): plain decoding ships",
            method=method,
        )
    k, expected = int(k), float(expected)
    predicted = {c: float(v) for c, v in est.predicted_by_concurrency().items()}
    compared = {m.method: float(m.expected_speedup) for m in est.methods if m.expected_speedup is not None}
    source = f"predicted from the CPU acceptance estimate and measured serving costs ({profile})"
    one_at_a_time = concurrency == 1 and max_num_seqs == 1
    pays = expected >= min_gain and one_at_a_time
    why = (
        f" (>= serving.speculation.min_gain {min_gain})"
        if expected >= min_gain
        else f", below serving.speculation.min_gain {min_gain}: plain decoding is predicted as fast or faster"
    )
    if expected >= min_gain and not one_at_a_time:
        why = (
            f"; not shipped: this config serves up to {max_num_seqs} requests at once (serving.max_num_seqs) at "
            f"target concurrency {concurrency}, and {LOCKSTEP}; serve_bench measures it on a GPU, or "
            "serving.max_num_seqs: 1 makes a one-request config"
        )
    return SpeculationDecision(
        num_speculative_tokens=k if pays else 0,
        candidate_k=k,
        basis=ESTIMATED,
        speedup=expected,
        concurrency=concurrency,
        reason=f"{source}: x{expected:.2f} served output tokens/s at concurrency {concurrency} with {method} k={k}"
        + why,
        method=method,
        compared=compared if len(compared) > 1 else None,
        predicted=predicted or None,
        profile=profile,
    )


def without_speculation(decision: SpeculationDecision, checks: list[str], why: str) -> SpeculationDecision:
    """The decision with its candidate turned off by the gate checks named (why: what they found)."""
    return replace(
        decision, num_speculative_tokens=0, reason=f"{decision.reason}; not shipped: {why}", turned_off_by=list(checks)
    )


def tier_speculation(
    tier: Tier,
    shipped: Speculation,
    shipped_concurrency: int,
    serve: ServeBenchRecord | None,
    min_gain: float,
    predicted: dict[str, float] | None = None,
    max_num_seqs: int | None = None,
) -> tuple[Speculation, str]:
    """(speculation, why) for a tier. shipped: the gate's decision (disabled: the bundle has no drafter);
    predicted: its predicted speedup per concurrency, where the decision was predicted rather than measured;
    max_num_seqs: the tier's batch limit."""
    none = Speculation(None, 0)
    if not shipped.enabled:
        return none, "the bundle ships no speculation"
    if tier.speculation == "off":
        return none, f"off for this tier (serving.tiers.{tier.name}.speculation)"
    own = serve.tier(tier.name) if serve is not None else None
    if own is not None and PLAIN in own.configs:
        # Benchmarked at its own settings: that measurement decides, whatever the default sweep said.
        d = speculation_for(None, _only(own, shipped.method), tier.concurrency, min_gain)
        return d.speculation, f"{d.reason} (this tier's own settings, serve_bench.tiers)"
    if predicted is not None:  # the gate's decision rests on a prediction: it holds for one request at a time
        if tier.concurrency != 1 or max_num_seqs != 1:
            return none, (
                f"not measured on a GPU; this tier serves up to {max_num_seqs} requests at concurrency "
                f"{tier.concurrency}, and {LOCKSTEP}"
            )
        return shipped, f"predicted x{predicted.get('1', 0.0):.2f} at concurrency 1, one request at a time"
    if tier.concurrency == shipped_concurrency:
        return shipped, "the gate's decision at this concurrency"
    if measured_pair(serve, tier.concurrency, shipped.method) is not None:
        d = speculation_for(None, _only(serve, shipped.method), tier.concurrency, min_gain)
        return d.speculation, f"{d.reason} (the default config's sweep; the tier itself was not benchmarked)"
    return none, (
        f"speculation was not measured at concurrency {tier.concurrency}; it ships only where it was shown to pay"
    )


def _only(serve: ServeBenchRecord, method: str) -> ServeBenchRecord:
    """Plain decoding and one method's config: only the shipped method is in the bundle, so only it is weighed."""
    configs = {PLAIN: serve.configs[PLAIN]}
    if method in serve.speculative():
        configs[method] = serve.speculative()[method]
    return ServeBenchRecord(
        variant=serve.variant,
        gpu=serve.gpu,
        vllm_version=serve.vllm_version,
        configs=configs,
        failed_configs={m: why for m, why in serve.failed_configs.items() if m == method},
        schedules={m: c for m, c in serve.schedules.items() if m == method},
    )


# --- what serve_bench decides while it measures -------------------------------------------------------------


def throughput_at(config: ServeConfigResult, concurrency: int) -> float:
    level = config.at(concurrency)
    return level.output_throughput if level is not None and not level.failed else 0.0


def choose_kernel(by_kernel: dict[str, ServeConfigResult], target: int, tie: float) -> str:
    """Where every kernel's capacity at serving.slo was searched, only those carrying the most users compete: a
    kernel faster at one user but carrying fewer within the SLO costs more GPUs per user (benchmarks/gpu/raw/repro8b:
    Marlin the faster at one user, 32 users at the SLO against Machete's 64 or more). Among them, the most output
    tokens/s at the target concurrency; where others come within `tie` of it there (serve_bench.kernel_tie: noise
    between runs), the one with the highest geometric mean over the sweep, so a 1% lead at batch 1 does not ship a
    kernel 12% slower under load."""
    users = {name: c.capacity.users for name, c in by_kernel.items() if c.capacity is not None}
    if len(users) == len(by_kernel):
        most = max(users.values())
        by_kernel = {name: c for name, c in by_kernel.items() if users[name] == most}
    best = max(throughput_at(c, target) for c in by_kernel.values())
    close = [name for name, c in by_kernel.items() if throughput_at(c, target) >= best * (1 - tie)]

    def sweep(name: str) -> float:
        values = [lvl.output_throughput for lvl in by_kernel[name].levels.values() if not lvl.failed]
        return math.prod(values) ** (1 / len(values)) if values and min(values) > 0 else 0.0

    return max(close, key=lambda name: (sweep(name), throughput_at(by_kernel[name], target)))


def schedule_to_measure(
    configs: dict[str, ServeConfigResult], candidates: dict[str, int], min_gain: float, max_num_seqs: int
) -> tuple[str, KSchedule] | None:
    """(method, schedule) of the method whose schedule the sweep says is best (its fixed config's speedups
    where it drafts, 1 where it does not, geometric mean), or None when no method's sweep is mixed."""
    best = None
    plain = configs[PLAIN]
    for method in candidates:
        config = configs.get(method)
        if config is None or config.failed_requests:
            continue
        speedups = {
            lvl.concurrency: lvl.output_throughput / plain.at(lvl.concurrency).output_throughput
            for lvl in config.levels.values()
            if plain.at(lvl.concurrency) is not None and plain.at(lvl.concurrency).output_throughput
        }
        schedule = k_schedule(speedups, config.num_speculative_tokens, min_gain, max_num_seqs)
        if schedule is None:
            continue
        expected = math.prod(v if v >= min_gain else 1.0 for v in speedups.values()) ** (1 / len(speedups))
        if best is None or expected > best[0]:
            best = (expected, method, schedule)
    return None if best is None else best[1:]


# --- the decision the gate checks and the bundle ships ------------------------------------------------------


@dataclass(frozen=True)
class ServingContext:
    """The serving policy a decision is taken under: serving.target_concurrency, serving.speculation.min_gain,
    the baseline variant's serving benchmark (None: none), the default config's batch limit (a prediction holds
    for one request at a time), serving.baseline_variant as the reasons name it, serving.gpu_hour_cost and the
    baseline variant's acceptance per method."""

    target_concurrency: int
    min_gain: float
    baseline: ServeBenchRecord | None
    max_num_seqs: int = 1
    baseline_variant: str = "bf16"
    gpu_hour_cost: float | None = None
    # The baseline variant's share of first drafted tokens accepted by method (evaluate's estimate at k = 1), which
    # max_acceptance_drop_vs_bf16 compares with; None: the baseline was not evaluated in this gate run.
    baseline_acceptance: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Inputs:
    """What one variant's decision is computed from: evaluate's summary, its serving benchmark (None: none), the
    gates' thresholds for it (gates.thresholds with its overrides), the serving policy and the variant's name
    (None: the summary's)."""

    summary: EvalSummary
    serve: ServeBenchRecord | None
    thresholds: Mapping[str, float]
    context: ServingContext
    variant: str | None = None

    @property
    def name(self) -> str | None:
        return self.variant or self.summary.variant


@dataclass(frozen=True)
class TierChoice:
    """One serving tier's speculative setting and why (the bundle's serve-<tier>.yaml renders it)."""

    tier: Tier
    speculation: Speculation
    why: str


@dataclass(frozen=True)
class Decision:
    """What ships for one variant. speculation: the setting and why (turned off where a check said so); capacity:
    what the shipped config carries at the SLO (None: not searched); metrics: the numbers it rests on, which the
    gate checks (the candidate's, then the shipped config's, then its capacity ratio); speculation_checks: the
    speculation group as applied to the candidate; capacity_reason: why min_capacity_vs_bf16 has no value; kernel,
    kernel_env: the GEMM kernel serve_bench measured faster and its environment (None: none compared, vLLM's
    default); tiers: each serving tier's setting (the bundle's view; empty at the gate); tensor_parallel_size,
    parallelism: the variant's GPUs per replica and why, where the bundle read them from its checkpoint."""

    speculation: SpeculationDecision
    capacity: CapacityClaim | None = None
    metrics: Mapping[str, object] = field(default_factory=dict)
    speculation_checks: tuple[GateCheck, ...] = ()
    capacity_reason: str | None = None
    kernel: str | None = None
    kernel_env: Mapping[str, str] | None = None
    tiers: tuple[TierChoice, ...] = ()
    tensor_parallel_size: int | None = None  # GPUs per replica (pipeline/serving/parallelism.py decides it)
    parallelism: str | None = None  # why that many (TpDecision.reason)

    @property
    def shipped(self) -> Speculation:
        return self.speculation.speculation


def decide(inputs: Inputs) -> Decision:
    """The speculative candidate (speculation_for), turned off where a speculation check fails or where plain
    decoding carries min_capacity_vs_bf16 and the candidate does not; then what the shipped config measured."""
    ctx, serve = inputs.context, inputs.serve
    candidate = speculation_for(inputs.summary, serve, ctx.target_concurrency, ctx.min_gain, ctx.max_num_seqs)
    metrics = {
        **candidate_metrics(inputs.summary, candidate.method),
        **speculative_metrics(serve, ctx.target_concurrency, candidate.method, bool(candidate.schedule)),
    }
    drop, why_not = acceptance_drop(inputs, candidate.method)
    metrics |= drop
    candidate, spec_checks = _checked(candidate, metrics, inputs.thresholds, why_not)
    candidate, claim, ratio, reason = _capacity_trade(candidate, inputs)
    metrics |= shipped_metrics(serve, ctx.baseline, candidate.speculation, ctx.target_concurrency)
    metrics |= ratio
    kernel = serve.kernel if serve is not None else None
    return Decision(candidate, claim, metrics, tuple(spec_checks), reason, kernel, serve.kernel_env if kernel else None)


def _checked(
    candidate: SpeculationDecision,
    metrics: dict,
    thresholds: Mapping[str, float],
    reasons: dict[str, str] | None = None,
) -> tuple[SpeculationDecision, list[GateCheck]]:
    """The speculation checks of a candidate that ships speculation (n-gram skips the drafter's cost checks), and
    the candidate turned off where one fails; skipped checks where nothing speculative ships. reasons: why a
    check has no value, where it has its own reason."""
    if not candidate.num_speculative_tokens:
        return candidate, [
            replace(c, passed=None, note=None, skipped="no speculation shipped")
            for c in check_variant(metrics, dict(thresholds), SPECULATION)
        ]
    checks = [
        drafter_cost_free(c) if candidate.method == NGRAM and c.check in DRAFTER_COST_CHECKS else c
        for c in check_variant(metrics, dict(thresholds), SPECULATION, "not measured on a GPU", reasons)
    ]
    failed = [c for c in checks if c.failed]
    if failed:
        candidate = without_speculation(
            candidate, [c.check for c in failed], "; ".join(f"{c.check} ({c.describe()})" for c in failed)
        )
    return candidate, checks


ACCEPTANCE_DROP = "max_acceptance_drop_vs_bf16"


def acceptance_by_method(summary: EvalSummary | None) -> dict[str, float] | None:
    """A variant's share of first drafted tokens accepted by method (None: no summary), evaluate's estimate at k = 1:
    comparable between two variants whatever k each chose, where accepted per drafted token at each one's own k is
    not (it falls as k grows). A method without it (a summary from before the field) is left out."""
    if summary is None:
        return None
    return {
        m.method: m.first_token_acceptance for m in summary.speculation.methods if m.first_token_acceptance is not None
    }


def acceptance_drop(inputs: Inputs, method: str | None) -> tuple[dict, dict[str, str]]:
    """({acceptance_drop_vs_bf16: the baseline variant's acceptance minus this variant's}, {}) for the candidate
    method, or ({}, {max_acceptance_drop_vs_bf16: why not}). Only the candidate is compared, as every speculation
    check is: one that fails turns speculation off rather than falling back to another method. Both sides are
    evaluate's estimate, the one acceptance every variant has on the same prompts (a served one varies with the GPU
    and the load)."""
    ctx = inputs.context
    base = ctx.baseline_variant
    if inputs.name == base:
        return {}, {ACCEPTANCE_DROP: f"{base} is the baseline variant (serving.baseline_variant): nothing to compare"}
    if ctx.baseline_acceptance is None:
        return {}, {ACCEPTANCE_DROP: f"the baseline variant {base} was not evaluated in this gate run"}
    own, theirs = acceptance_by_method(inputs.summary).get(method), ctx.baseline_acceptance.get(method)
    if own is None:
        return {}, {ACCEPTANCE_DROP: f"no first-token acceptance of {method} recorded on this variant"}
    if theirs is None:
        return {}, {ACCEPTANCE_DROP: f"no first-token acceptance of {method} recorded on {base}"}
    return {"acceptance_drop_vs_bf16": theirs - own}, {}


def _capacity_trade(candidate: SpeculationDecision, inputs: Inputs):
    """(decision, claim, {capacity_vs_bf16} or {}, why no ratio): faster per request but fewer users at the SLO
    than min_capacity_vs_bf16: where plain decoding carries the floor it ships instead (as a failed speculation
    check turns the draft off); where it does not either, the candidate stays and the variant fails its check."""
    ctx, serve, floor = inputs.context, inputs.serve, inputs.thresholds.get("min_capacity_vs_bf16")
    claim, no_ratio = capacity_claim(
        serve, ctx.baseline, candidate.speculation, ctx.gpu_hour_cost, ctx.baseline_variant
    )
    ratio, undecided = capacity_metrics(claim, floor)
    if candidate.num_speculative_tokens and floor is not None and ratio and ratio["capacity_vs_bf16"] < floor:
        plain_claim, plain_no_ratio = capacity_claim(serve, ctx.baseline, NONE, ctx.gpu_hour_cost, ctx.baseline_variant)
        plain_ratio, plain_undecided = capacity_metrics(plain_claim, floor)
        if plain_ratio and plain_ratio["capacity_vs_bf16"] >= floor:
            candidate = without_speculation(
                candidate,
                ["min_capacity_vs_bf16"],
                f"min_capacity_vs_bf16: {claim.config} carries x{ratio['capacity_vs_bf16']:.2f} of "
                f"{ctx.baseline_variant} plain decoding's users at {claim.slo.label()}, plain decoding "
                f"x{plain_ratio['capacity_vs_bf16']:.2f}",
            )
            claim, no_ratio, ratio, undecided = plain_claim, plain_no_ratio, plain_ratio, plain_undecided
    return candidate, claim, ratio, undecided or no_ratio


def tier_choices(
    speculation: SpeculationDecision, tiers: list[Tier], serve: ServeBenchRecord | None, ctx: ServingContext
) -> tuple[TierChoice, ...]:
    """Each tier's speculative setting under the shipped decision (tier_speculation), at the tier's own batch
    limit (its max_num_seqs, else the default config's)."""
    return tuple(
        TierChoice(
            tier,
            *tier_speculation(
                tier,
                speculation.speculation,
                ctx.target_concurrency,
                serve,
                ctx.min_gain,
                speculation.predicted,
                tier.engine.get("max_num_seqs", ctx.max_num_seqs),
            ),
        )
        for tier in tiers
    )


def shipped(
    speculation: SpeculationDecision,
    capacity: CapacityClaim | None,
    serve: ServeBenchRecord,
    tiers: list[Tier],
    ctx: ServingContext,
    tensor_parallel_size: int | None = None,
    parallelism: str | None = None,
) -> Decision:
    """The gate's decision as artifacts/gate/verdict.json keeps it (speculation, capacity), with the kernel
    serve_bench measured faster (where it compared them; else vLLM's default), every tier's setting and the
    variant's tensor parallelism: what the bundle, its handoff kit and its card read."""
    return Decision(
        speculation,
        capacity,
        kernel=serve.kernel,
        kernel_env=serve.kernel_env if serve.kernel else None,
        tiers=tier_choices(speculation, tiers, serve, ctx),
        tensor_parallel_size=tensor_parallel_size,
        parallelism=parallelism,
    )


# --- a tier's size: max-num-seqs and its autoscaler's target from the measured capacity -------------------


@dataclass(frozen=True)
class TierSizing:
    """A tier of deploy.autoscale.tiers sized from the measured capacity at its SLO: the users its config carried
    per replica, the max-num-seqs it ships with (None: as configured) and the running requests per pod its
    autoscaler holds (None: no autoscaler); why: how, or why not."""

    why: str
    users: float | None = None
    at_least: bool = False
    max_num_seqs: int | None = None
    running_target: int | None = None


def size_tier(
    tier: Tier,
    chosen: Speculation,
    serve: ServeBenchRecord,
    serving: ServingParams,
    utilization: float,
    resizable: bool,
    own: ServeBenchRecord | None = None,
) -> TierSizing:
    """From the capacity search of the config the tier ships: the tier's own (own: serve_bench.tiers served it at
    its engine settings and searched at its SLO) where there is one, else the default sweep's, read at the tier's
    SLO. max-num-seqs: the users it carried
    within the tier's SLO, never above the tier's own limit nor serving.max_num_seqs (the batches the search ran
    at; larger ones were never measured), and only for a closed-loop search (an open loop's mean users say nothing
    of its peaks) of a file not measured as it stands (resizable: serve.yaml and benchmarked tiers ship as
    measured). The autoscaler holds utilization of that: running requests stop at max-num-seqs, so a target equal
    to it would never be exceeded."""
    if serve.skipped:
        return TierSizing(f"capacity not measured ({serve.skipped}): max-num-seqs as configured, no autoscaler")
    searched = config_of(own, chosen) if own is not None else None
    at_own_settings = searched is not None and searched.capacity is not None
    config = searched if at_own_settings else config_of(serve, chosen)
    met = users_meeting(config, tier.slo) if config is not None else None
    if met is None:
        return TierSizing(
            f"no capacity search of the {config_name(chosen)} config (serve_bench.capacity): "
            "max-num-seqs as configured, no autoscaler"
        )
    users, at_least = met
    if users < 1:
        return TierSizing(
            f"{config_name(chosen)} met {tier.slo.label()} at no load measured: max-num-seqs as "
            "configured, no autoscaler",
            users,
            at_least,
        )
    configured = tier.engine.get("max_num_seqs", serving.max_num_seqs)
    closed = config.capacity.arrival == CONCURRENCY
    size = min(configured, math.floor(users), serving.max_num_seqs) if closed and resizable else None
    target = max(1, math.floor(min(size or configured, users) * utilization))
    bound = "at least " if at_least else ""
    searched_where = "the tier's own search at its engine settings" if at_own_settings else "the default sweep's"
    how = (
        f"{bound}{users:.3g} users per replica at {tier.slo.label()} ({config_name(chosen)}, {searched_where}, "
        f"serve_bench on {serve.gpu}); "
        + (
            f"max-num-seqs {size} (of {configured} configured, batches "
            f"measured up to serving.max_num_seqs {serving.max_num_seqs})"
            if size is not None
            else "max-num-seqs as " + ("measured" if closed else "configured (an open-loop search)")
        )
        + f"; autoscaler at {target} running requests per pod ({utilization:g} of it)"
    )
    return TierSizing(how, users, at_least, size, target)


# --- across variants: the gate's ranking by cost per token at the SLO, and its pick -------------------------


@dataclass(frozen=True)
class CostRow:
    """One variant's shipped config at serving.slo, per GPU: a row of the gate's ranking (GateReport.per_gpu)."""

    variant: str
    config: str
    gpus: int  # per replica
    users: float  # per replica at the SLO
    users_per_gpu: float
    output_tokens_per_s_per_gpu: float | None
    cost_per_million_output_tokens: float | None
    at_least: bool  # the search stopped at its bound still meeting the SLO: per-GPU numbers are lower bounds
    passed: bool  # every quality and serving check (an allowed failure ships flagged, never recommended)
    gpu: str | None = None  # the GPU model it was measured on


def cost_rows(
    passed: Mapping[str, bool],
    claims: Mapping[str, CapacityClaim | None],
    serve_by_variant: Mapping[str, ServeBenchRecord],
) -> list[CostRow]:
    """The cross-variant ranking: each variant whose shipped config was searched at the SLO (claims: its capacity
    claim, None where not searched; passed: the gate's verdict), most output tokens/s per GPU first: cost per token
    is GPUs x hours over tokens, so per GPU the order is the same whatever each variant's GPU count."""
    rows = [
        CostRow(
            variant=name,
            config=c.config,
            gpus=c.gpus,
            users=c.users,
            users_per_gpu=c.users_per_gpu,
            output_tokens_per_s_per_gpu=c.output_tokens_per_s_per_gpu,
            cost_per_million_output_tokens=c.cost_per_million_output_tokens,
            at_least=c.lower_bound,
            passed=passed[name],
            gpu=serve_by_variant[name].gpu if name in serve_by_variant else None,
        )
        for name, c in claims.items()
        if c is not None
    ]
    return sorted(rows, key=lambda r: -(r.output_tokens_per_s_per_gpu or 0.0))


def cheapest(rows: list[CostRow], serve_by_variant: Mapping[str, ServeBenchRecord]) -> tuple[str | None, str | None]:
    """(the variant that passed the gate with the most output tokens/s per GPU within the SLO, why none): only among
    measurements on one GPU model and one vLLM, and not where a search that stopped at its bound could hide a
    cheaper one."""
    runs = {(r.gpu, serve_by_variant[r.variant].vllm_version) for r in rows if r.variant in serve_by_variant}
    if len(runs) > 1:
        return None, f"measured on different GPUs or vLLM versions ({sorted(map(str, runs))}): not comparable"
    ranked = [r for r in rows if r.passed and r.output_tokens_per_s_per_gpu]
    if not ranked:
        return None, "no variant that passed the gate was measured to meet the SLO (serve_bench.capacity)"
    best = ranked[0]
    if any(r.at_least for r in ranked[1:]):
        return None, (
            f"undecided: {', '.join(r.variant for r in ranked[1:] if r.at_least)} still met the SLO at the "
            "search's bound; raise serve_bench.capacity.max_concurrency"
        )
    return best.variant, None


def context_of(serving: ServingParams, baseline: ServeBenchRecord | None = None) -> ServingContext:
    """The serving policy as the serving section sets it (baseline: the baseline variant's record, where read)."""
    return ServingContext(
        target_concurrency=serving.target_concurrency,
        min_gain=serving.speculation.min_gain,
        baseline=baseline,
        max_num_seqs=serving.max_num_seqs,
        baseline_variant=serving.baseline_variant,
        gpu_hour_cost=serving.gpu_hour_cost,
    )
