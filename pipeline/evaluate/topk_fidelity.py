"""Fidelity (perplexity, KL, top-1) from top-k log-probabilities, as an inference engine reports them.

vLLM's prompt logprobs give, at each position, the log-probabilities of its k most likely tokens plus the token that
is actually there, not the whole distribution. Perplexity and top-1 need no more than that (the actual token's and
the most likely token's). KL(P || Q) (P the baseline, Q the variant) is estimated on a coarser alphabet: the tokens
both engines report at the position, plus one tail bucket holding everything else,

    KL_S(P || Q) = sum_{t in S} p_t log(p_t / q_t) + p_T log(p_T / q_T),   p_T = 1 - sum_{t in S} p_t (q_T alike).

By the log-sum inequality this never exceeds the exact KL, and the chain rule of KL gives the gap exactly:
KL - KL_S = p_T * KL(P(.|T) || Q(.|T)), the baseline's tail mass times the divergence within the tail. It is 0 when
the tail is one token or the two distributions are proportional there; the tail mass is reported beside the
estimate (`kl_tail_mass`) so a reader can see how much of the distribution the estimate coarse-grains. Pure
functions over {token: logprob} maps: tested on CPU against the exact KL of small distributions
(tests/evaluate/test_topk_fidelity.py); the engine that produces the maps is pipeline/evaluate/vllm_fidelity.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.core.errors import PipelineError

TopLogprobs = Mapping[int, float]  # token id -> log-probability, the top k plus the actual token
KL_ESTIMATOR = "top-k tokens reported by both engines plus one tail bucket (a lower bound of the exact KL)"
MIN_TAIL = 1e-30  # a tail both report as empty still gets a finite log; p_T ~ 0 contributes ~0 either way


def tail_mass(logprobs: Iterable[float]) -> float:
    """1 - sum(exp(logprobs)), without the cancellation of subtracting a sum close to 1 (clamped at 0: top-k
    logprobs of a distribution can sum a rounding error above 1)."""
    values = list(logprobs)
    if not values:
        return 1.0
    top = max(values)
    log_sum = top + math.log(math.fsum(math.exp(v - top) for v in values))
    return max(0.0, -math.expm1(log_sum)) if log_sum < 0 else 0.0


def tail_bucket_kl(p: TopLogprobs, q: TopLogprobs) -> tuple[float, float]:
    """(KL_S(P || Q), p_T): the module docstring's estimate over the tokens both maps hold, and the baseline's mass
    outside them."""
    shared = p.keys() & q.keys()
    kl = math.fsum(math.exp(p[t]) * (p[t] - q[t]) for t in shared)
    p_tail, q_tail = tail_mass(p[t] for t in shared), tail_mass(q[t] for t in shared)
    if p_tail > 0:
        kl += p_tail * (math.log(p_tail) - math.log(max(q_tail, MIN_TAIL)))
    return max(kl, 0.0), p_tail  # a sum of a rounding error below 0 is 0: KL_S >= 0 exactly


def argmax(logprobs: TopLogprobs) -> int:
    return max(logprobs, key=logprobs.__getitem__)


@dataclass(frozen=True)
class Position:
    """One scored position: the token that is there and each engine's top-k map (which holds it)."""

    token: int
    baseline: TopLogprobs
    variant: TopLogprobs


def fidelity(positions: list[Position], top_k: int) -> tuple[dict, dict]:
    """(the same fidelity dict quality.fidelity computes exactly with transformers, the estimator's own record:
    top_k, the mean baseline tail mass and what the KL is)."""
    if not positions:
        raise PipelineError("no held-out response tokens to score (evaluate.heldout_limit, data.fractions.heldout)")
    nll_b = nll_v = kl = tail = agree = 0.0
    for pos in positions:
        if pos.token not in pos.baseline or pos.token not in pos.variant:
            raise PipelineError(f"prompt logprobs miss the scored token {pos.token}: the engine did not report it")
        nll_b -= pos.baseline[pos.token]
        nll_v -= pos.variant[pos.token]
        kl_pos, tail_pos = tail_bucket_kl(pos.baseline, pos.variant)
        kl, tail = kl + kl_pos, tail + tail_pos
        agree += argmax(pos.baseline) == argmax(pos.variant)
    n = len(positions)
    ppl_b, ppl_v = math.exp(nll_b / n), math.exp(nll_v / n)
    return (
        {
            "perplexity_baseline": ppl_b,
            "perplexity": ppl_v,
            "perplexity_increase_pct": 100 * (ppl_v / ppl_b - 1),
            "kl_divergence": kl / n,
            "top1_agreement": agree / n,
            "tokens": n,
        },
        {"kl_estimator": KL_ESTIMATOR, "top_k": top_k, "kl_tail_mass": tail / n},
    )


def argmax_path_matches(baseline: list[TopLogprobs], variant: list[TopLogprobs]) -> bool:
    """quality.greedy_match's condition over one prompt + path: the variant's argmax equals the baseline's at every
    position of the path."""
    return len(baseline) == len(variant) and all(argmax(b) == argmax(v) for b, v in zip(baseline, variant))
