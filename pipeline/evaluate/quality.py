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
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return F.log_softmax(logits, dim=-1)


def fidelity(baseline, variant, examples: list[tuple[list[int], list[int]]]) -> dict:
    if not any(response for _, response in examples):
        raise PipelineError("no held-out response tokens to score (evaluate.heldout_limit, data.fractions.heldout)")
    nll_base = nll_var = kl = agree = n = 0.0
    for prompt, response in progress(examples, desc="teacher-forced fidelity"):
        lp_b = response_logprobs(baseline, prompt, response)
        # on the baseline's device: a decompressed checkpoint can stay on CPU beside a baseline on CUDA
        # (raw/tpeval exact-demo: gather's index on cuda:0, the variant's logprobs on cpu), as greedy_match does
        lp_v = response_logprobs(variant, prompt, response).to(lp_b.device)
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


def greedy_match(baseline, variant, prompts: list[list[int]], n_tokens: int, eos_token_id: int | None) -> float:
    """Fraction of prompts for which the variant's greedy run writes the baseline's first n tokens (up to its EOS).

    The baseline writes its greedy path (all prompts in one batch, generation.py); then each model reads prompt +
    path in one unbatched forward, as `fidelity` does, and the variant matches a prompt where its next-token argmax
    equals the baseline's at every position of the path: the condition for its own greedy run to write the same
    tokens, without generating it. Both sides go through the same computation, so a variant with the baseline's
    weights matches at 1.0 on any device. Two generations compared did not on the H100: BF16 matched itself at
    0.9375 (benchmarks/gpu/raw/smollm2-gpu-4, -5) while its teacher-forced logits over the held-out text were
    identical (KL 0.0)."""
    if not prompts:
        raise PipelineError("no held-out prompts for the greedy-match check (evaluate.greedy_prompts)")
    stop = frozenset() if eos_token_id is None else {eos_token_id}
    paths = generation.greedy_continuations(baseline, prompts, n_tokens, stop, desc="greedy match: target's paths")
    matched = sum(
        torch.equal(
            response_logprobs(baseline, prompt, path).argmax(-1).cpu(),
            response_logprobs(variant, prompt, path).argmax(-1).cpu(),
        )
        for prompt, (path, _) in zip(prompts, paths)
    )
    return matched / len(prompts)
