"""Quantization fidelity on held-out traffic, against the unquantized target.

Perplexity of the responses given their prompts (response tokens only), mean token-level
KL(baseline || variant) of the next-token distributions, top-1 agreement, and greedy
generation match. KL and top-1 see every position, so they move before perplexity does.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress
from pipeline.evaluate import generation


@torch.no_grad()
def response_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Log-probabilities (float32) of the next token at each position that predicts a response token."""
    ids = torch.tensor([prompt + response], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
    return F.log_softmax(logits, dim=-1)


def fidelity(baseline, variant, examples: list[tuple[list[int], list[int]]]) -> dict:
    if not any(response for _, response in examples):
        raise PipelineError("no held-out response tokens to score (evaluate.heldout_limit, data.fractions.heldout)")
    nll_base = nll_var = kl = agree = n = 0.0
    for prompt, response in progress(examples, desc="teacher-forced fidelity"):
        lp_b = response_logprobs(baseline, prompt, response)
        lp_v = response_logprobs(variant, prompt, response)
        target = torch.tensor(response, device=lp_b.device)
        nll_base -= lp_b.gather(1, target[:, None]).sum().item()
        nll_var -= lp_v.gather(1, target[:, None]).sum().item()
        kl += F.kl_div(lp_v, lp_b, log_target=True, reduction="sum").item()
        agree += (lp_b.argmax(-1) == lp_v.argmax(-1)).sum().item()
        n += len(response)
    ppl_b, ppl_v = math.exp(nll_base / n), math.exp(nll_var / n)
    return {
        "perplexity_baseline": ppl_b,
        "perplexity": ppl_v,
        "perplexity_increase_pct": 100 * (ppl_v / ppl_b - 1),
        "kl_divergence": kl / n,
        "top1_agreement": agree / n,
        "tokens": int(n),
    }


def greedy_match(baseline, variant, prompts: list[list[int]], n_tokens: int, eos_token_id: int | None,
                 variant_tokens: list[list[int] | None] | None = None) -> float:
    """Fraction of prompts whose first n generated tokens are identical to the baseline's. variant_tokens[i]: the
    variant's greedy tokens for prompts[i] where already known (generation.greedy_prefix of its continuations, which
    the evaluate stage writes anyway); None entries, or all without it, are generated here. Each model generates
    for all its prompts in one batch (generation.py): on the CPU the same tokens as one prompt at a time with
    generate() (tested); on a GPU bf16 tokens can change with the batch's shape, so both sides share one."""
    if not prompts:
        raise PipelineError("no held-out prompts for the greedy-match check (evaluate.greedy_prompts)")
    stop = frozenset() if eos_token_id is None else {eos_token_id}

    def written(model, todo: list[int]) -> dict[int, list[int]]:
        runs = generation.greedy_continuations(model, [prompts[i] for i in todo], n_tokens, stop) if todo else []
        return {i: tokens for i, (tokens, _) in zip(todo, runs)}

    base = written(baseline, list(range(len(prompts))))
    var = {i: t for i, t in enumerate((variant_tokens or [])[: len(prompts)]) if t is not None}
    var |= written(variant, [i for i in range(len(prompts)) if i not in var])
    return sum(base[i] == var[i] for i in range(len(prompts))) / len(prompts)
