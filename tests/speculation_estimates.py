"""A good draft's acceptance and the speculative estimate the pipeline's own k choice makes from it."""

from __future__ import annotations

# Per-position acceptance P(at least j accepted) and draft/target cost ratio of a good draft.
PER_POSITION = [0.92, 0.85, 0.77, 0.70, 0.62, 0.55, 0.47, 0.40]
COST_RATIO = 0.25
TOKEN_ACCEPTANCE = 0.88


def choose_k(per_position: list[float], cost_ratio: float) -> tuple[int, dict[int, float]]:
    """The pipeline's k choice (acceptance.best_k) when every k sees these per-position rates."""
    from pipeline.evaluate.acceptance import best_k

    return best_k({k: sum(per_position[:k]) for k in range(1, len(per_position) + 1)}, cost_ratio)


def speculative_estimate():
    """A SpeculativeEstimate whose k is chosen by the pipeline's own best_k."""
    from pipeline.evaluate.estimate import SpeculativeEstimate

    k, speedups = choose_k(PER_POSITION, COST_RATIO)
    return SpeculativeEstimate(
        temperature=0.0,
        token_acceptance=TOKEN_ACCEPTANCE,
        accepted_per_draft_token=sum(PER_POSITION[:k]) / k,
        num_speculative_tokens=k,
        accepted_per_position=PER_POSITION[:k],
        accepted_per_position_by_k={str(j): PER_POSITION[:j] for j in speedups},
        expected_accepted_tokens=sum(PER_POSITION[:k]),
        cost_ratio=COST_RATIO,
        expected_speedup=speedups[k],
        expected_speedup_by_k={str(j): s for j, s in speedups.items()},
        prompts=8,
    )
