"""CPU estimator of speculative-decoding acceptance, and the choice of num_speculative_tokens.

For each held-out prompt the target writes its own continuation (greedy at temperature 0,
sampled at the serving temperature otherwise: the text speculative decoding produces is
distributed as the target's own samples), up to its end-of-sequence token, where a server
stops, plus k-1 tokens past it for the drafts that start near the end; target and draft are
then run over it. At each position the probability that
speculative sampling accepts the draft's token is sum_x min(p(x), q(x)) with p, q at the
serving temperature (Leviathan et al., 2023); at temperature 0 it is 1 when the argmaxes agree
and 0 otherwise. A draft of k tokens starting at position t gets
sum_{j=1..k} prod_{i<j} alpha[t+i] tokens accepted in expectation; the target adds one more
token per step, and the next draft starts after it (vLLM's schedule, followed in expectation). The first
response token is the prefill's: vLLM drafts only after it, so the first draft starts at position 1. With
c = draft/target cost per token, one step costs 1 + k*c target forwards, so (1 + E[accepted]) / (1 + k*c)
is the speedup an ideal server would give (`ideal_speedup`, with c the weight-bytes ratio: a labelled bound).
What ships is decided on the served speed predicted from serving costs measured on a GPU
(pipeline/evaluate/serving_costs.py): `expected_speedup` and the chosen k are that prediction's, at
serving.target_concurrency, or absent where no cost profile applies.

Past EOS a model's continuation is off its training distribution and drafts stop matching: on
an H100, vLLM's acceptance for the demo fell from 0.84 to 0.43 when generation was forced on
through EOS (benchmarks/gpu/history/vllm-0.25.md). So both this estimator and the GPU path stop at EOS,
and drafts start only within the response.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress
from pipeline.evaluate import generation
from pipeline.evaluate.estimate import SpeculativeEstimate
from pipeline.evaluate.serving_costs import ServedPrediction

COST_RATIO_CHOICES = ("weight_bytes", "measured")
# The prefill step samples response token 0 and the drafter first proposes after it (vLLM v1 drafts in the
# step that sampled the prefill's token), so drafts start at continuation position 1, never 0.
FIRST_DRAFT = 1


def _next_token(logits: torch.Tensor, temperature: float) -> int:
    """Greedy at temperature 0, else pure temperature sampling (no top-k/top-p, which the
    estimator's min(p, q) does not model either)."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(F.softmax(logits.float() / temperature, dim=-1), 1))


def stop_token_ids(model) -> set[int]:
    """The ids that end a response: generation_config's eos (an int or a list), else config's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


@torch.no_grad()
def target_continuation(
    target,
    prompt: list[int],
    n_tokens: int,
    temperature: float = 0.0,
    stop_ids: set[int] | frozenset = frozenset(),
    overrun: int = 0,
) -> tuple[list[int], int]:
    """(tokens, response_length): up to n tokens of the target, the response ending with its first
    stop token as a server stops, then `overrun` tokens past that end. A draft started near the end
    still proposes k tokens and vLLM still scores all of them, so the estimator scores them too."""
    out = target(input_ids=torch.tensor([prompt], device=target.device), use_cache=True)
    tokens, end = [_next_token(out.logits[0, -1], temperature)], None
    while True:
        if end is None and (tokens[-1] in stop_ids or len(tokens) >= n_tokens):
            end = len(tokens)
        if end is not None and len(tokens) >= end + overrun:
            return tokens, end
        out = target(
            input_ids=torch.tensor([[tokens[-1]]], device=target.device),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        tokens.append(_next_token(out.logits[0, -1], temperature))


@torch.no_grad()
def position_acceptance(target, draft, prompt: list[int], continuation: list[int], temperature: float) -> torch.Tensor:
    """alpha[t]: probability that the draft's proposal for continuation position t is accepted."""
    ids = torch.tensor([prompt + continuation], device=target.device)
    sl = slice(len(prompt) - 1, len(prompt) - 1 + len(continuation))
    p_logits = target(input_ids=ids).logits[0, sl].float()
    q_logits = draft(input_ids=ids.to(draft.device)).logits[0, sl].float().to(p_logits.device)
    if temperature == 0:
        return (p_logits.argmax(-1) == q_logits.argmax(-1)).float().cpu()
    p = F.softmax(p_logits / temperature, dim=-1)
    q = F.softmax(q_logits / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1).clamp(max=1.0).cpu()


def reach_from_alphas(alpha: torch.Tensor, k: int, end: int) -> torch.Tensor:
    """[end, k]: P(at least j+1 of the k tokens drafted at t accepted) for a drafter whose proposal for a
    position does not depend on where its draft started (a draft model with the whole context)."""
    padded = torch.cat([alpha.float(), torch.zeros(max(0, end + k - 1 - len(alpha)))])
    return padded[: end + k - 1].unfold(0, k, 1).cumprod(1)


@dataclass
class Schedule:
    accepted_per_position: list[float]  # P(at least j accepted) per draft, as vLLM reports it
    accepted_per_step: float  # E[accepted tokens] per decoding step (a step without a draft accepts 0)
    drafted_per_step: float  # E[draft tokens] per step (k for a model drafter; less for n-gram lookups)
    # Response tokens per step as served: the tokens up to the end of each response over the steps it took, so a
    # last step's tokens accepted past EOS count for nothing (plain decoding makes one token a step)
    tokens_per_step: float = 0.0
    steps_per_response: float = 0.0  # E[verification steps] per response (the prefill step not counted)


def schedule(reaches: list[torch.Tensor], k: int, lengths: list[torch.Tensor] | None = None) -> Schedule:
    """vLLM's schedule in expectation over sequences: a step at position t drafts lengths[t] tokens (k when
    None) whose acceptance reach is reaches[t]; with j accepted the target adds one and the next step
    starts at t + j + 1. Where drafts start depends on what was accepted, so this is a distribution over
    start positions rather than a draft at every position, which misweights mixed stretches (on the
    demo: 0.84 vs 0.86 of the real loop). reaches[i] is [T_i, k]: drafts start at FIRST_DRAFT..T_i-1."""
    totals, drafts, steps, drafted, useful = torch.zeros(k), 0.0, 0.0, 0.0, 0.0
    for i, reach_all in enumerate(reaches):
        n_starts = reach_all.shape[0]
        useful += max(0, n_starts - FIRST_DRAFT)
        start_mass = torch.zeros(n_starts + k + 1)  # P(a step starts at position t)
        start_mass[FIRST_DRAFT] = 1.0
        for t in range(FIRST_DRAFT, n_starts):
            mass = float(start_mass[t])
            if mass == 0.0:
                continue
            reach = reach_all[t, :k].float()
            n = k if lengths is None else int(lengths[i][t])
            steps += mass
            if n:
                totals += mass * reach
                drafts += mass
                drafted += mass * n
            exactly = torch.cat([torch.ones(1), reach]) - torch.cat([reach, torch.zeros(1)])  # P(exactly j)
            start_mass[t + 1 : t + k + 2] += mass * exactly
    return Schedule(
        accepted_per_position=(totals / max(drafts, 1e-12)).tolist(),
        accepted_per_step=float(totals.sum()) / max(steps, 1e-12),
        drafted_per_step=drafted / max(steps, 1e-12),
        tokens_per_step=useful / max(steps, 1e-12),
        steps_per_response=steps / max(len(reaches), 1),
    )


def accepted_per_position(alphas: list[torch.Tensor], k: int, starts: list[int] | None = None) -> list[float]:
    """P(at least j+1 draft tokens accepted) for j < k, as vLLM's accepted_tokens_per_pos / num_drafts, for
    a draft model's per-position acceptance alphas; drafts start before starts[i] (default: where k
    positions remain)."""
    ends = [len(a) - k + 1 if starts is None else starts[i] for i, a in enumerate(alphas)]
    return schedule([reach_from_alphas(a, k, end) for a, end in zip(alphas, ends)], k).accepted_per_position


def resolve_cost_ratio(setting, target_dir: str | Path, draft_dir: str | Path) -> float | None:
    """evaluate.acceptance.cost_ratio: 'weight_bytes' -> ratio of checkpoint sizes, 'measured' -> None
    (estimate() times both models), or a positive number taken as given."""
    if setting == "weight_bytes":
        return weight_bytes_ratio(target_dir, draft_dir)
    if setting == "measured":
        return None
    if isinstance(setting, (int, float)) and not isinstance(setting, bool) and setting > 0:
        return float(setting)
    raise PipelineError(
        f"evaluate.acceptance.cost_ratio must be {' | '.join(COST_RATIO_CHOICES)} or a positive number, got {setting!r}"
    )


def draft_cost_ratio(target, draft, context: list[int], steps: int = 16) -> float:
    """Measured per-token decode cost of the draft relative to the target (KV-cached steps)."""

    def per_token(model) -> float:
        ids = torch.tensor([context], device=model.device)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=model.config.eos_token_id)  # warm
            t0 = time.perf_counter()
            model.generate(
                ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=model.config.eos_token_id
            )
        return (time.perf_counter() - t0) / steps

    return per_token(draft) / per_token(target)


def weight_bytes_ratio(target_dir, draft_dir) -> float:
    """Decode at serving batch sizes is memory-bound: per-token cost tracks the weight bytes read.
    A better proxy for a GPU server than CPU timings of tiny models, which measure Python overhead."""
    from pipeline.core.sizes import dir_size

    target_bytes, draft_bytes = dir_size(target_dir, ".safetensors"), dir_size(draft_dir, ".safetensors")
    if not target_bytes or not draft_bytes:
        empty = target_dir if not target_bytes else draft_dir
        raise PipelineError(f"no .safetensors weights under {empty} to compute the draft/target cost ratio")
    return draft_bytes / target_bytes


def best_k(
    expected_accepted: dict[int, float], cost_ratio: float, drafted: dict[int, float] | None = None
) -> tuple[int, dict[int, float]]:
    """The k with the highest expected speedup (1 + E[accepted | k]) / (1 + E[drafted | k] * cost_ratio);
    drafted defaults to k tokens per step (a model drafter)."""
    speedups = {
        k: (1 + accepted) / (1 + (k if drafted is None else drafted[k]) * cost_ratio)
        for k, accepted in expected_accepted.items()
    }
    return max(speedups, key=speedups.get), speedups


def check_settings(n_prompts: int, continuation_tokens: int, temperature: float, max_k: int) -> None:
    if n_prompts < 1:
        raise PipelineError("speculative acceptance needs at least one held-out prompt (evaluate.acceptance.prompts)")
    if not isinstance(max_k, int) or max_k < 1:
        raise PipelineError(f"evaluate.acceptance.max_k must be a positive integer, got {max_k!r}")
    if continuation_tokens < max_k + FIRST_DRAFT:
        raise PipelineError(
            f"evaluate.acceptance.continuation_tokens ({continuation_tokens}) must be > max_k "
            f"({max_k}): the first token is the prefill's, and a draft of k tokens after it needs k "
            "positions to be scored"
        )
    if temperature < 0:
        raise PipelineError(f"evaluate.acceptance.temperature must be >= 0, got {temperature}")


# A method's scorer: (prompt, continuation, end, max_k) -> (reach [end, max_k], draft lengths [end] or None
# for always max_k). reach[t, j]: P(at least j+1 of the tokens drafted at continuation position t accepted).
Scorer = Callable[[list[int], list[int], int, int], tuple[torch.Tensor, torch.Tensor | None]]


def draft_model_scorer(target, draft, temperature: float) -> Scorer:
    def score(prompt, cont, end, max_k):
        return reach_from_alphas(position_acceptance(target, draft, prompt, cont, temperature), max_k, end), None

    return score


def estimate(
    target,
    draft,
    prompts: list[list[int]],
    continuation_tokens: int,
    temperature: float,
    max_k: int,
    cost_ratio: float | None = None,
    seed: int = 0,
    continuations: list[tuple[list[int], int]] | None = None,
) -> SpeculativeEstimate:
    """The draft model's estimate; cost_ratio None times both models on the first prompt."""
    if cost_ratio is None:
        cost_ratio = draft_cost_ratio(target, draft, prompts[0]) if prompts else 0.0
    return estimate_method(
        target,
        draft_model_scorer(target, draft, temperature),
        prompts,
        continuation_tokens,
        temperature,
        max_k,
        cost_ratio,
        method="draft_model",
        seed=seed,
        continuations=continuations,
    )


def target_continuations(
    target, prompts: list[list[int]], continuation_tokens: int, temperature: float, max_k: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    """What the target writes after each prompt ((tokens, response length), as target_continuation): the same
    for every method, so the evaluate stage writes them once per variant and each method is scored on the same
    text (a paired comparison; at temperature 0 exactly what each method's own run would write)."""
    check_settings(len(prompts), continuation_tokens, temperature, max_k)
    stop_ids = stop_token_ids(target)
    if temperature == 0:  # all prompts in one batch, the same tokens as target_continuation's (generation.py)
        return generation.greedy_continuations(
            target, prompts, continuation_tokens, stop_ids, overrun=max_k - 1, desc="target continuations"
        )
    torch.manual_seed(seed)  # sampled continuations at temperature > 0 are reproducible: one prompt at a time, in order
    return [
        target_continuation(target, prompt, continuation_tokens, temperature, stop_ids, overrun=max_k - 1)
        for prompt in progress(prompts, desc="target continuations")
    ]


def estimate_method(
    target,
    scorer: Scorer,
    prompts: list[list[int]],
    continuation_tokens: int,
    temperature: float,
    max_k: int,
    cost_ratio: float,
    method: str,
    seed: int = 0,
    continuations: list[tuple[list[int], int]] | None = None,
) -> SpeculativeEstimate:
    """Acceptance per position, expected speedup for k = 1..max_k and the best k, for any drafter: the
    target writes each continuation (continuations: already written by target_continuations with the same
    settings), the scorer says how its drafts would be accepted along it."""
    check_settings(len(prompts), continuation_tokens, temperature, max_k)
    if continuations is None:
        continuations = target_continuations(target, prompts, continuation_tokens, temperature, max_k, seed)
    elif len(continuations) != len(prompts):
        raise ValueError(f"{len(continuations)} continuations for {len(prompts)} prompts")
    reaches, lengths = [], []
    for prompt, (cont, end) in progress(list(zip(prompts, continuations)), desc=f"acceptance estimate ({method})"):
        reach, length = scorer(prompt, cont, end, max_k)
        reaches.append(reach)
        lengths.append(torch.full((end,), max_k) if length is None else length)
    # Each k has its own schedule (where the next draft starts depends on k), so each is scored; a k-token
    # draft is the first k tokens of the max_k one (true of all three methods).
    by_k = {j: schedule([r[:, :j] for r in reaches], j, [n.clamp(max=j) for n in lengths]) for j in range(1, max_k + 1)}
    k, speedups = best_k(
        {j: s.accepted_per_step for j, s in by_k.items()}, cost_ratio, {j: s.drafted_per_step for j, s in by_k.items()}
    )
    chosen = by_k[k]
    proposed = torch.cat([r[FIRST_DRAFT:, 0][n[FIRST_DRAFT:] > 0] for r, n in zip(reaches, lengths)])
    return SpeculativeEstimate(
        temperature=temperature,
        token_acceptance=proposed.mean().item() if len(proposed) else 0.0,
        accepted_per_draft_token=chosen.accepted_per_step / chosen.drafted_per_step if chosen.drafted_per_step else 0.0,
        num_speculative_tokens=k,
        accepted_per_position=chosen.accepted_per_position,
        accepted_per_position_by_k={str(j): s.accepted_per_position for j, s in by_k.items()},
        expected_accepted_tokens=chosen.accepted_per_step,
        cost_ratio=cost_ratio,
        expected_speedup=speedups[k],
        expected_speedup_by_k={str(j): v for j, v in speedups.items()},
        prompts=len(prompts),
        method=method,
        drafted_tokens_per_step=chosen.drafted_per_step,
        accepted_per_step_by_k={str(j): s.accepted_per_step for j, s in by_k.items()},
        drafted_per_step_by_k={str(j): s.drafted_per_step for j, s in by_k.items()},
        tokens_per_step_by_k={str(j): s.tokens_per_step for j, s in by_k.items()},
        steps_per_response_by_k={str(j): s.steps_per_response for j, s in by_k.items()},
        ideal_speedup=speedups[k],
        ideal_k=k,
    )


def at_k(est: SpeculativeEstimate, k: int) -> SpeculativeEstimate:
    """The estimate with its k-dependent numbers taken at k (every k's schedule was scored)."""
    accepted, drafted = est.accepted_per_step_by_k[str(k)], est.drafted_per_step_by_k[str(k)]
    return replace(
        est,
        num_speculative_tokens=k,
        accepted_per_position=est.accepted_per_position_by_k[str(k)],
        expected_accepted_tokens=accepted,
        drafted_tokens_per_step=drafted,
        accepted_per_draft_token=accepted / drafted if drafted else 0.0,
    )


def with_served_prediction(
    est: SpeculativeEstimate, prediction: ServedPrediction | None, concurrency: int
) -> SpeculativeEstimate:
    """What decides shipping: the k predicted fastest as served at `concurrency`, and its predicted speedup.
    Without a prediction (no cost profile for the serving GPU and vLLM) there is no expected speedup: the
    ideal bound is kept, labelled, and never ships anything by itself."""
    if prediction is None:
        return replace(at_k(est, est.ideal_k), expected_speedup=None, expected_speedup_by_k={}, served=None)
    k = prediction.best_k[str(concurrency)]
    chosen, speedup = at_k(est, k), prediction.speedup(concurrency, k)
    # speedup is (tokens per step) x (plain step / speculative step), tokens per step about 1 + accepted: it falls
    # to 1 where tokens per step falls by the factor `speedup`
    tokens = est.tokens_per_step_by_k[str(k)]
    even = max(0.0, (tokens / speedup - 1) / chosen.drafted_tokens_per_step) if chosen.drafted_tokens_per_step else None
    return replace(
        chosen,
        expected_speedup=speedup,
        expected_speedup_by_k=dict(prediction.speedup_by_k[str(concurrency)]),
        served=prediction,
        break_even_acceptance=even,
    )
