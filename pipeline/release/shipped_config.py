"""The served config a speculative setting names, and the measured numbers of the one that ships.

Nothing here chooses: pipeline/release/decision.py decides what ships; these read a serving benchmark's record
for the config it names (serve-<name>.yaml, the record's key) and the metrics the gate checks it by.
"""

from __future__ import annotations

from pipeline.drafts.methods import DRAFT_MODEL, KSchedule, Speculation
from pipeline.evaluate.summary import EvalSummary
from pipeline.serving.bench_record import (  # noqa: F401 (config_name, SCHEDULE: re-exported)
    PLAIN,
    SCHEDULE,
    ServeBenchRecord,
    ServeConfigResult,
    config_name,
)


def config_of(serve: ServeBenchRecord, speculation: Speculation) -> ServeConfigResult | None:
    """The measured config that a speculative setting ships (plain when it has none)."""
    if not speculation.enabled:
        return serve.configs.get(PLAIN)
    if speculation.schedule:
        return serve.schedules.get(speculation.method)
    return serve.speculative().get(speculation.method)


def k_at(schedule: KSchedule, batch: int) -> int:
    """The k vLLM drafts at this batch size (the last range's k carries on past its end)."""
    for lo, hi, k in schedule:
        if lo <= batch <= hi:
            return k
    return schedule[-1][2]


def measured_pair(serve: ServeBenchRecord | None, concurrency: int, method: str):
    """(plain, speculative) LoadLevels of one method at the concurrency, when the benchmark measured both."""
    if serve is None or serve.skipped or PLAIN not in serve.configs:
        return None
    config = serve.speculative().get(method)
    if config is None:
        return None
    plain, spec = serve.configs[PLAIN].at(concurrency), config.at(concurrency)
    return (plain, spec) if plain and spec else None


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


def speculative_metrics(
    serve: ServeBenchRecord | None, concurrency: int, method: str | None, scheduled: bool = False
) -> dict:
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
    out = {
        "served_speculative_speedup": served.output_throughput / plain.output_throughput
        if plain.output_throughput
        else None
    }
    if spec.accepted_per_draft_token is not None:
        out["served_accepted_per_draft_token"] = spec.accepted_per_draft_token
    return out


def shipped_metrics(
    serve: ServeBenchRecord | None, baseline: ServeBenchRecord | None, speculation: Speculation, concurrency: int
) -> dict:
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
        out |= {
            "p99_itl_ms": level.itl_ms["p99"],
            "p99_ttft_ms": level.ttft_ms["p99"],
            "served_output_tokens_per_s": level.output_throughput,
        }
    base = baseline.configs.get(PLAIN) if comparable(serve, baseline) else None
    mine, theirs = config.at(1), base.at(1) if base else None
    if mine is not None and theirs is not None and theirs.output_throughput:
        out["speedup_vs_bf16"] = mine.output_throughput / theirs.output_throughput
    return out


def comparable(serve: ServeBenchRecord, baseline: ServeBenchRecord | None) -> bool:
    """Both measured on the same GPU model with the same vLLM: a ratio across GPUs or vLLMs means nothing."""
    return (
        baseline is not None
        and not baseline.skipped
        and baseline.gpu == serve.gpu
        and baseline.vllm_version == serve.vllm_version
    )
