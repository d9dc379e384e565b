"""Which speculative setting a bundle ships: the draft at some k, or none (k = 0).

Measured beats estimated. With a serving benchmark of the variant (GPU, vLLM), the setting that gave
more output tokens/s at `serving.target_concurrency` ships, speculation only when it beats plain
decoding by `serving.speculation.min_gain`. Without one, the CPU estimate decides the same way: its
best k ships only when the expected speedup clears the same margin; "no speculation" is always a
candidate, so a draft that doesn't pay is never shipped because it was the least bad k.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.serve_records import PLAIN, SPECULATIVE, ServeBenchRecord
from pipeline.tiers import Tier

MEASURED, ESTIMATED = "measured", "estimated"


@dataclass
class SpeculationDecision:
    num_speculative_tokens: int  # what ships; 0 = no speculative-config in the bundle
    candidate_k: int  # the k that was weighed against plain decoding
    basis: str  # measured (serving benchmark) | estimated (CPU acceptance and cost model)
    speedup: float | None  # speculative / plain output tokens/s (measured) or the expected speedup
    concurrency: int | None  # where a measured speedup was taken
    reason: str


def measured_pair(serve: ServeBenchRecord | None, concurrency: int):
    """(plain, speculative) LoadLevels at the concurrency, when the benchmark measured both."""
    if serve is None or serve.skipped or PLAIN not in serve.configs or SPECULATIVE not in serve.configs:
        return None
    plain, spec = serve.configs[PLAIN].at(concurrency), serve.configs[SPECULATIVE].at(concurrency)
    return (plain, spec) if plain and spec else None


def decide(summary: dict, serve: ServeBenchRecord | None, concurrency: int, min_gain: float) -> SpeculationDecision:
    pair = measured_pair(serve, concurrency)
    if pair is None:
        k, expected = summary.get("num_speculative_tokens"), summary.get("expected_speedup")
        if not k or expected is None:
            return SpeculationDecision(0, 0, ESTIMATED, None, None,
                                       "the metrics carry no speculative estimate (num_speculative_tokens, expected_speedup)")
        k, expected = int(k), float(expected)
        pays = expected >= min_gain
        return SpeculationDecision(
            num_speculative_tokens=k if pays else 0, candidate_k=k, basis=ESTIMATED, speedup=expected,
            concurrency=None,
            reason=(f"CPU estimate: x{expected:.2f} expected at k={k}"
                    + (f" (>= serving.speculation.min_gain {min_gain})" if pays else
                       f", below serving.speculation.min_gain {min_gain}: plain decoding is expected to be "
                       "as fast or faster")))
    plain, spec = pair
    k = serve.configs[SPECULATIVE].num_speculative_tokens
    if plain.failed or spec.failed:
        return SpeculationDecision(0, k, MEASURED, None, concurrency,
                                   f"failed requests in the serving benchmark at concurrency {concurrency} "
                                   f"(plain {plain.failed}, speculative {spec.failed}); no speedup can be claimed")
    gain = spec.output_throughput / plain.output_throughput
    pays = gain >= min_gain
    return SpeculationDecision(
        num_speculative_tokens=k if pays else 0, candidate_k=k, basis=MEASURED, speedup=gain, concurrency=concurrency,
        reason=(f"measured x{gain:.2f} plain decoding's output tokens/s at concurrency {concurrency} with k={k}"
                + (f" (>= serving.speculation.min_gain {min_gain})" if pays else
                   f", below serving.speculation.min_gain {min_gain}")))


def without_speculation(decision: SpeculationDecision, why: str) -> SpeculationDecision:
    return replace(decision, num_speculative_tokens=0, reason=f"{decision.reason}; not shipped: {why}")


def speculative_metrics(serve: ServeBenchRecord | None, concurrency: int) -> dict:
    """Metrics of the speculative config as served, for the speculation checks (they take precedence
    over the evaluate stage's offline vLLM numbers and the CPU estimate)."""
    pair = measured_pair(serve, concurrency)
    if pair is None:
        return {}
    plain, spec = pair
    out = {"served_speculative_speedup": spec.output_throughput / plain.output_throughput if plain.output_throughput
           else None}
    if spec.accepted_per_draft_token is not None:
        out["served_accepted_per_draft_token"] = spec.accepted_per_draft_token
    return out


def shipped_metrics(serve: ServeBenchRecord | None, baseline: ServeBenchRecord | None, k: int,
                    concurrency: int) -> dict:
    """Latency, throughput and failed requests (over its whole sweep) of the config that ships, for the serving
    checks; the speedup against the baseline variant's plain decoding at concurrency 1, only when both were
    measured on the same GPU model with the same vLLM."""
    if serve is None or serve.skipped:
        return {}
    config = serve.configs.get(SPECULATIVE if k else PLAIN)
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


def tier_speculation(tier: Tier, shipped_k: int, shipped_concurrency: int, serve: ServeBenchRecord | None,
                     min_gain: float) -> tuple[int, str]:
    """(num_speculative_tokens, why) for a tier. shipped_k: the gate's decision (0: the bundle has no draft)."""
    if not shipped_k:
        return 0, "the bundle ships no draft"
    if tier.speculation == "off":
        return 0, f"off for this tier (serving.tiers.{tier.name}.speculation)"
    if tier.concurrency == shipped_concurrency:
        return shipped_k, "the gate's decision at this concurrency"
    if measured_pair(serve, tier.concurrency) is not None:
        d = decide({}, serve, tier.concurrency, min_gain)
        return d.num_speculative_tokens, f"{d.reason} (the default config's sweep; the tier itself was not benchmarked)"
    return 0, (f"speculation was not measured at concurrency {tier.concurrency}; it ships only where it was "
               "shown to pay")
