"""Which speculative setting a bundle ships: one method (draft model, EAGLE-3, n-gram) at some k, or none.

Measured beats predicted. With a serving benchmark of the variant (GPU, vLLM), the method that gave the
most output tokens/s at `serving.target_concurrency` ships, and only when it beats plain decoding by
`serving.speculation.min_gain`. Without one, the served speed predicted from the CPU acceptance estimate and
a cost profile measured on a GPU (pipeline/evaluate/serving_costs.py) decides, where a prediction holds: the profiles
time requests decoding in lockstep, which is what a server sees with one request at a time. A server with
several requests mixes new requests' prefills into the speculative steps, which no profile measures (issue
#28 served the demo's draft model at 0.39x of plain decoding at concurrency 16 where lockstep steps predict a
gain), so a config ships speculation on a prediction only when it serves one request at a time
(max_num_seqs 1, concurrency 1) and the prediction there clears the margin. With no cost profile nothing is
predicted and nothing ships. "No speculation" is always a candidate, so a method that doesn't pay is never
shipped because it was the least bad one.

A k per batch size (vLLM's num_speculative_tokens_per_batch_size): speculation pays at small batches and loses
at large ones, where the verify step is compute-bound. serve_bench serves a schedule built from its own sweep (k
where the fixed config paid, none where it lost) and the schedule ships instead of the best fixed setting (plain
decoding or one method at one k) when, over the sweep's concurrencies, its geometric-mean speedup against plain
decoding is higher, and at target_concurrency it clears min_gain wherever it drafts there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pipeline.drafts.methods import DRAFT_MODEL, KSchedule, Speculation
from pipeline.evaluate.summary import EvalSummary
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord
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


SCHEDULE = "schedule"


def config_name(speculation: Speculation) -> str:
    """The serve_bench config (serve-<name>.yaml, record key) a speculative setting is measured as."""
    if not speculation.enabled:
        return PLAIN
    return f"{speculation.method}-{SCHEDULE}" if speculation.schedule else speculation.method


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


def k_at(schedule: KSchedule, batch: int) -> int:
    """The k vLLM drafts at this batch size (the last range's k carries on past its end)."""
    for lo, hi, k in schedule:
        if lo <= batch <= hi:
            return k
    return schedule[-1][2]


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else 0.0


def measured_pair(serve: ServeBenchRecord | None, concurrency: int, method: str):
    """(plain, speculative) LoadLevels of one method at the concurrency, when the benchmark measured both."""
    if serve is None or serve.skipped or PLAIN not in serve.configs:
        return None
    config = serve.speculative().get(method)
    if config is None:
        return None
    plain, spec = serve.configs[PLAIN].at(concurrency), config.at(concurrency)
    return (plain, spec) if plain and spec else None


def decide(summary: EvalSummary | None, serve: ServeBenchRecord | None, concurrency: int, min_gain: float,
           max_num_seqs: int = 1) -> SpeculationDecision:
    """Measured whenever plain decoding was served at the concurrency: then only a method served there without
    failed requests is a candidate, and none ships when none was (the estimate never overrides a measurement:
    a method vLLM failed to serve must not ship on its CPU estimate). summary: evaluate's, whose estimate decides
    otherwise (None: no estimate). max_num_seqs: the config's batch limit (a prediction holds only for a config
    that serves one request at a time)."""
    plain = (serve.configs[PLAIN].at(concurrency)
             if serve is not None and not serve.skipped and PLAIN in serve.configs else None)
    if plain is None:
        return _estimated(summary, min_gain, concurrency, max_num_seqs)
    if plain.failed:
        return _measured_none(concurrency, f"plain decoding had {plain.failed} failed requests in the serving "
                                           f"benchmark at concurrency {concurrency}; no speedup can be claimed")
    if not plain.output_throughput:
        return _measured_none(concurrency, f"plain decoding produced no tokens at concurrency {concurrency}")
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
    skipped = "".join(f"; {m} not a candidate: {why}" for m, why in dropped.items())
    if not measured:
        return _measured_none(concurrency, f"no speculative config was served without failures at concurrency "
                                           f"{concurrency}{skipped}")
    gains = {m: level.output_throughput / plain.output_throughput for m, level in measured.items()}
    method = max(gains, key=gains.get)
    gain, k = gains[method], serve.speculative()[method].num_speculative_tokens
    pays = gain >= min_gain
    others = "".join(f"; {m} x{g:.2f}" for m, g in gains.items() if m != method)
    fixed = SpeculationDecision(
        num_speculative_tokens=k if pays else 0, candidate_k=k, basis=MEASURED, speedup=gain, concurrency=concurrency,
        reason=(f"measured x{gain:.2f} plain decoding's output tokens/s at concurrency {concurrency} with "
                f"{method} k={k}"
                + (f" (>= serving.speculation.min_gain {min_gain})" if pays else
                   f", below serving.speculation.min_gain {min_gain}") + others + skipped),
        method=method, compared=gains if len(gains) > 1 else None)
    return _scheduled(serve, fixed, concurrency, min_gain) or fixed


def _sweep_speedups(serve: ServeBenchRecord, config) -> dict[int, float]:
    """A config's output tokens/s over plain decoding's at every concurrency both were measured at."""
    out = {}
    for key, level in config.levels.items():
        base = serve.configs[PLAIN].levels.get(key)
        if base is not None and base.output_throughput and not level.failed:
            out[level.concurrency] = level.output_throughput / base.output_throughput
    return out


def _scheduled(serve: ServeBenchRecord, fixed: SpeculationDecision, concurrency: int,
               min_gain: float) -> SpeculationDecision | None:
    """The measured k schedule that beats the best fixed setting (see the module docstring), or None."""
    best_fixed = (_sweep_speedups(serve, serve.speculative()[fixed.method]) if fixed.num_speculative_tokens
                  else None)
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
    than = (f"{fixed.method} k={fixed.num_speculative_tokens}" if fixed.num_speculative_tokens
            else "plain decoding")
    per_level = ", ".join(f"c{c} x{v:.2f}" for c, v in sorted(mine.items()))
    return replace(fixed, num_speculative_tokens=config.num_speculative_tokens,
                   candidate_k=config.num_speculative_tokens,
                   method=method, speedup=mine[concurrency], schedule=[list(r) for r in config.schedule],
                   reason=f"measured: {shipped.label} ({per_level} against plain decoding) beats {than}, the best "
                          f"fixed setting, over the sweep: geometric mean x{g_mine:.2f} against x{g_theirs:.2f}; "
                          f"the fixed settings: {fixed.reason}")


def _measured_none(concurrency: int, reason: str) -> SpeculationDecision:
    return SpeculationDecision(0, 0, MEASURED, None, concurrency, reason, method=None)


LOCKSTEP = ("a prediction holds only for one request at a time: with several, new requests' prefills mix into "
            "the speculative steps, which the lockstep cost profiles do not measure")


def _estimated(summary: EvalSummary | None, min_gain: float, concurrency: int,
               max_num_seqs: int) -> SpeculationDecision:
    """The predicted served speed of the best method and k (the evaluate stage picked them) against min_gain, for
    a config that serves one request at a time."""
    est = (summary or EvalSummary()).speculation
    k, expected, profile = est.num_speculative_tokens, est.expected_speedup, est.cost_profile
    method = est.method or DRAFT_MODEL
    if not k or expected is None:
        return SpeculationDecision(0, int(k or 0), ESTIMATED, None, None,
                                   "no served speed was predicted (no serving-cost profile for the serving GPU and "
                                   "vLLM, and no serving benchmark): plain decoding ships", method=method)
    k, expected = int(k), float(expected)
    predicted = {c: float(v) for c, v in est.predicted_by_concurrency().items()}
    compared = {m.method: float(m.expected_speedup) for m in est.methods if m.expected_speedup is not None}
    source = f"predicted from the CPU acceptance estimate and measured serving costs ({profile})"
    one_at_a_time = concurrency == 1 and max_num_seqs == 1
    pays = expected >= min_gain and one_at_a_time
    why = (f" (>= serving.speculation.min_gain {min_gain})" if expected >= min_gain else
           f", below serving.speculation.min_gain {min_gain}: plain decoding is predicted as fast or faster")
    if expected >= min_gain and not one_at_a_time:
        why = (f"; not shipped: this config serves up to {max_num_seqs} requests at once (serving.max_num_seqs) at "
               f"target concurrency {concurrency}, and {LOCKSTEP}; serve_bench measures it on a GPU, or "
               "serving.max_num_seqs: 1 makes a one-request config")
    return SpeculationDecision(
        num_speculative_tokens=k if pays else 0, candidate_k=k, basis=ESTIMATED, speedup=expected,
        concurrency=concurrency,
        reason=f"{source}: x{expected:.2f} served output tokens/s at concurrency {concurrency} with {method} k={k}"
               + why,
        method=method, compared=compared if len(compared) > 1 else None, predicted=predicted or None, profile=profile)


def without_speculation(decision: SpeculationDecision, checks: list[str], why: str) -> SpeculationDecision:
    """The decision with its candidate turned off by the gate checks named (why: what they found)."""
    return replace(decision, num_speculative_tokens=0, reason=f"{decision.reason}; not shipped: {why}",
                   turned_off_by=list(checks))


def candidate_metrics(summary: EvalSummary, method: str | None) -> dict:
    """The evaluate summary's metrics (what the gate's checks read by name) with its speculative numbers made the
    candidate method's: its headline accepted_per_draft_token is the CPU-best method's, and vllm_* (evaluate's
    offline vLLM run) are the draft model's, so another method must not be checked against them."""
    out = summary.to_metrics()
    if method is None:
        return out
    own = summary.speculation.estimate(method)
    if own is not None:
        out["accepted_per_draft_token"] = own.accepted_per_draft_token
    elif (summary.speculation.method or DRAFT_MODEL) != method:
        out.pop("accepted_per_draft_token", None)  # another method's; none is better than a wrong one
    if method != DRAFT_MODEL:
        for key in ("vllm_accepted_per_draft_token", "vllm_speculative_speedup"):
            out.pop(key, None)
    return out


def speculative_metrics(serve: ServeBenchRecord | None, concurrency: int, method: str | None,
                        scheduled: bool = False) -> dict:
    """Metrics of the candidate method's config as served, for the speculation checks (they take precedence
    over the evaluate stage's offline vLLM numbers and the CPU estimate). scheduled: the candidate is the method's
    k schedule; its speedup is the schedule's, its acceptance the fixed config's (the same drafter at the same k,
    and a schedule may not draft at this concurrency at all)."""
    pair = measured_pair(serve, concurrency, method) if method else None
    if pair is None:
        return {}
    plain, spec = pair
    served = spec
    if scheduled and method in serve.schedules and serve.schedules[method].at(concurrency) is not None:
        served = serve.schedules[method].at(concurrency)
    out = {"served_speculative_speedup": served.output_throughput / plain.output_throughput
           if plain.output_throughput else None}
    if spec.accepted_per_draft_token is not None:
        out["served_accepted_per_draft_token"] = spec.accepted_per_draft_token
    return out


def config_of(serve: ServeBenchRecord, speculation: Speculation):
    """The measured config that a speculative setting ships (plain when it has none)."""
    if not speculation.enabled:
        return serve.configs.get(PLAIN)
    if speculation.schedule:
        return serve.schedules.get(speculation.method)
    return serve.speculative().get(speculation.method)


def shipped_metrics(serve: ServeBenchRecord | None, baseline: ServeBenchRecord | None, speculation: Speculation,
                    concurrency: int) -> dict:
    """Latency, throughput and failed requests (over its whole sweep) of the config that ships, for the serving
    checks; the speedup against the baseline variant's plain decoding at concurrency 1, only when both were
    measured on the same GPU model with the same vLLM."""
    if serve is None or serve.skipped:
        return {}
    config = config_of(serve, speculation)
    if config is None:
        return {}
    out: dict = {"failed_requests": config.failed_requests}
    level = config.at(concurrency)
    if level is not None:
        out |= {"p99_itl_ms": level.itl_ms["p99"], "p99_ttft_ms": level.ttft_ms["p99"],
                "served_output_tokens_per_s": level.output_throughput}
    comparable = (baseline is not None and not baseline.skipped and baseline.gpu == serve.gpu
                  and baseline.vllm_version == serve.vllm_version)  # a ratio across GPUs or vLLMs means nothing
    base = baseline.configs.get(PLAIN) if comparable else None
    mine, theirs = config.at(1), base.at(1) if base else None
    if mine is not None and theirs is not None and theirs.output_throughput:
        out["speedup_vs_bf16"] = mine.output_throughput / theirs.output_throughput
    return out


def tier_speculation(tier: Tier, shipped: Speculation, shipped_concurrency: int, serve: ServeBenchRecord | None,
                     min_gain: float, predicted: dict[str, float] | None = None,
                     max_num_seqs: int | None = None) -> tuple[Speculation, str]:
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
        d = decide(None, _only(own, shipped.method), tier.concurrency, min_gain)
        return d.speculation, f"{d.reason} (this tier's own settings, serve_bench.tiers)"
    if predicted is not None:  # the gate's decision rests on a prediction: it holds for one request at a time
        if tier.concurrency != 1 or max_num_seqs != 1:
            return none, (f"not measured on a GPU; this tier serves up to {max_num_seqs} requests at concurrency "
                          f"{tier.concurrency}, and {LOCKSTEP}")
        return shipped, f"predicted x{predicted.get('1', 0.0):.2f} at concurrency 1, one request at a time"
    if tier.concurrency == shipped_concurrency:
        return shipped, "the gate's decision at this concurrency"
    if measured_pair(serve, tier.concurrency, shipped.method) is not None:
        d = decide(None, _only(serve, shipped.method), tier.concurrency, min_gain)
        return d.speculation, f"{d.reason} (the default config's sweep; the tier itself was not benchmarked)"
    return none, (f"speculation was not measured at concurrency {tier.concurrency}; it ships only where it was "
                  "shown to pay")


def _only(serve: ServeBenchRecord, method: str) -> ServeBenchRecord:
    """Plain decoding and one method's config: only the shipped method is in the bundle, so only it is weighed."""
    configs = {PLAIN: serve.configs[PLAIN]}
    if method in serve.speculative():
        configs[method] = serve.speculative()[method]
    return ServeBenchRecord(variant=serve.variant, gpu=serve.gpu, vllm_version=serve.vllm_version, configs=configs,
                            failed_configs={m: why for m, why in serve.failed_configs.items() if m == method},
                            schedules={m: c for m, c in serve.schedules.items() if m == method})
