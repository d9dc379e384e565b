"""CPU estimator of speculative-decoding acceptance, and the choice of num_speculative_tokens.

For each held-out prompt the target writes its own continuation (greedy at temperature 0,
sampled at the serving temperature otherwise: the text speculative decoding produces is
distributed as the target's own samples); target and draft are then run over it. At each
position the probability that speculative sampling accepts the draft's token is
sum_x min(p(x), q(x)) with p, q at the serving temperature (Leviathan et al., 2023); at
temperature 0 it is 1 when the argmaxes agree and 0 otherwise. A draft of k tokens starting
at position t gets sum_{j=1..k} prod_{i<j} alpha[t+i] tokens accepted in expectation; the
target adds one more token per step. With c = draft/target cost per token, one step costs
1 + k*c target forwards, so the expected speedup is (1 + E[accepted]) / (1 + k*c).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from pipeline.errors import PipelineError

COST_RATIO_CHOICES = ("weight_bytes", "measured")


def _next_token(logits: torch.Tensor, temperature: float) -> int:
    """Greedy at temperature 0, else pure temperature sampling (no top-k/top-p, which the
    estimator's min(p, q) does not model either)."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(F.softmax(logits.float() / temperature, dim=-1), 1))


@torch.no_grad()
def target_continuation(target, prompt: list[int], n_tokens: int, temperature: float = 0.0) -> list[int]:
    """n tokens of the target, continuing through EOS like vLLM's ignore_eos=True (the GPU benchmark's
    setting), so CPU estimates and vLLM measurements see the same token stream."""
    out = target(input_ids=torch.tensor([prompt], device=target.device), use_cache=True)
    tokens = [_next_token(out.logits[0, -1], temperature)]
    for _ in range(n_tokens - 1):
        out = target(input_ids=torch.tensor([[tokens[-1]]], device=target.device),
                     past_key_values=out.past_key_values, use_cache=True)
        tokens.append(_next_token(out.logits[0, -1], temperature))
    return tokens


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


def accepted_per_position(alphas: list[torch.Tensor], k: int) -> list[float]:
    """P(at least j+1 draft tokens accepted) for j < k: vLLM's accepted_tokens_per_pos / drafts."""
    totals, starts = torch.zeros(k), 0
    for a in alphas:
        for t in range(len(a) - k + 1):
            totals += torch.cumprod(a[t:t + k], 0)
            starts += 1
    return (totals / max(starts, 1)).tolist()


def resolve_cost_ratio(setting, target_dir: str | Path, draft_dir: str | Path) -> float | None:
    """evaluate.acceptance.cost_ratio: 'weight_bytes' -> ratio of checkpoint sizes, 'measured' -> None
    (estimate() times both models), or a positive number taken as given."""
    if setting == "weight_bytes":
        return weight_bytes_ratio(target_dir, draft_dir)
    if setting == "measured":
        return None
    if isinstance(setting, (int, float)) and not isinstance(setting, bool) and setting > 0:
        return float(setting)
    raise PipelineError(f"evaluate.acceptance.cost_ratio must be {' | '.join(COST_RATIO_CHOICES)} "
                        f"or a positive number, got {setting!r}")


def draft_cost_ratio(target, draft, context: list[int], steps: int = 16) -> float:
    """Measured per-token decode cost of the draft relative to the target (KV-cached steps)."""
    def per_token(model) -> float:
        ids = torch.tensor([context], device=model.device)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=model.config.eos_token_id)  # warm
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                           pad_token_id=model.config.eos_token_id)
        return (time.perf_counter() - t0) / steps
    return per_token(draft) / per_token(target)


def weight_bytes_ratio(target_dir, draft_dir) -> float:
    """Decode at serving batch sizes is memory-bound: per-token cost tracks the weight bytes read.
    A better proxy for a GPU server than CPU timings of tiny models, which measure Python overhead."""
    from pipeline.sizes import dir_size

    target_bytes, draft_bytes = dir_size(target_dir, ".safetensors"), dir_size(draft_dir, ".safetensors")
    if not target_bytes or not draft_bytes:
        empty = target_dir if not target_bytes else draft_dir
        raise PipelineError(f"no .safetensors weights under {empty} to compute the draft/target cost ratio")
    return draft_bytes / target_bytes


def choose_k(per_position: list[float], cost_ratio: float) -> tuple[int, dict[int, float]]:
    """The k in 1..len(per_position) with the highest expected speedup."""
    speedups = {}
    for k in range(1, len(per_position) + 1):
        expected_accepted = sum(per_position[:k])
        speedups[k] = (1 + expected_accepted) / (1 + k * cost_ratio)
    best = max(speedups, key=speedups.get)
    return best, speedups


def check_settings(n_prompts: int, continuation_tokens: int, temperature: float, max_k: int) -> None:
    if n_prompts < 1:
        raise PipelineError("speculative acceptance needs at least one held-out prompt (evaluate.acceptance.prompts)")
    if not isinstance(max_k, int) or max_k < 1:
        raise PipelineError(f"evaluate.acceptance.max_k must be a positive integer, got {max_k!r}")
    if continuation_tokens < max_k:
        raise PipelineError(f"evaluate.acceptance.continuation_tokens ({continuation_tokens}) must be >= max_k "
                            f"({max_k}): a draft of k tokens needs k positions to be scored")
    if temperature < 0:
        raise PipelineError(f"evaluate.acceptance.temperature must be >= 0, got {temperature}")


def estimate(target, draft, prompts: list[list[int]], continuation_tokens: int, temperature: float, max_k: int,
             cost_ratio: float | None = None, seed: int = 0) -> dict:
    """Acceptance per position, expected speedup for k = 1..max_k and the best k; cost_ratio None
    times both models on the first prompt."""
    check_settings(len(prompts), continuation_tokens, temperature, max_k)
    torch.manual_seed(seed)  # sampled continuations at temperature > 0 are reproducible
    alphas = []
    for prompt in tqdm(prompts, desc="acceptance estimate", mininterval=2):
        cont = target_continuation(target, prompt, continuation_tokens, temperature)
        alphas.append(position_acceptance(target, draft, prompt, cont, temperature))
    if cost_ratio is None:
        cost_ratio = draft_cost_ratio(target, draft, prompts[0])
    per_pos = accepted_per_position(alphas, max_k)
    k, speedups = choose_k(per_pos, cost_ratio)
    return {
        "temperature": temperature,
        "acceptance_rate": torch.cat(alphas).mean().item(),
        "accepted_per_position": per_pos,
        "cost_ratio": cost_ratio,
        "expected_speedup_by_k": {str(j): s for j, s in speedups.items()},
        "num_speculative_tokens": k,
        "expected_accepted_tokens": sum(per_pos[:k]),
        # vLLM's num_accepted_tokens / num_draft_tokens at this k, to compare with a GPU run
        "accepted_per_draft_token": sum(per_pos[:k]) / k,
        "expected_speedup": speedups[k],
        "prompts": len(prompts),
    }
