"""The record of a speculative-decoding estimate (pipeline/evaluate/acceptance.py computes it), in a module of its
own without torch: the stages that only read it (bundle, serve_bench's skip) then start without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.evaluate.serving_costs import ServedPrediction


@dataclass
class SpeculativeEstimate:
    """The CPU estimate for one target/draft pair. Two acceptance numbers, never to be mixed up:
    token_acceptance is the mean per-token probability that a draft token is accepted (every
    response position counts once); accepted_per_draft_token is what vLLM reports as
    num_accepted_tokens / num_draft_tokens at k = num_speculative_tokens, which is lower because a
    rejection discards the rest of the draft."""

    temperature: float
    token_acceptance: float
    accepted_per_draft_token: float
    num_speculative_tokens: int
    accepted_per_position: list[float]  # P(at least j accepted), j = 1..k, as vLLM reports it at this k
    accepted_per_position_by_k: dict[str, list[float]]
    expected_accepted_tokens: float  # per step, at this k
    cost_ratio: float  # draft/target cost per token of the ideal bound (weight bytes, or as configured)
    expected_speedup: float | None  # predicted served speedup at this k (serving_costs); None: no cost profile
    expected_speedup_by_k: dict[str, float]
    prompts: int
    method: str = "draft_model"  # pipeline/drafts/methods.py
    drafted_tokens_per_step: float | None = None  # k for a model drafter; n-gram lookups propose fewer
    accepted_per_step_by_k: dict[str, float] = field(default_factory=dict)  # E[accepted tokens] per step
    drafted_per_step_by_k: dict[str, float] = field(default_factory=dict)  # E[drafted tokens] per step
    tokens_per_step_by_k: dict[str, float] = field(default_factory=dict)  # response tokens per step (Schedule)
    steps_per_response_by_k: dict[str, float] = field(default_factory=dict)  # verification steps per response
    ideal_speedup: float | None = None  # (1 + accepted) / (1 + drafted * cost_ratio) at ideal_k: a bound
    ideal_k: int | None = None
    served: ServedPrediction | None = None  # served speed per concurrency and k, from a measured cost profile
    break_even_acceptance: float | None = None  # accepted per draft token below which the served speedup is < 1

    @property
    def break_even(self) -> float:
        """Below this accepted/drafted ratio speculation is slower than plain decoding: the measured serving
        costs' break-even where a prediction exists, else the ideal bound's cost ratio."""
        return self.cost_ratio if self.break_even_acceptance is None else self.break_even_acceptance
