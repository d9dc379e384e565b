"""n-gram (prompt lookup) speculation, scored on the CPU.

vLLM's NgramProposer (vllm/v1/spec_decode/ngram_proposer.py) looks for the longest suffix of the tokens
so far (prompt + output), between prompt_lookup_min and prompt_lookup_max tokens long, that occurred
earlier, takes its earliest occurrence, and proposes the up to k tokens that followed it; with no
match the step drafts nothing. The proposals are deterministic, so the estimate needs no draft model:
at temperature 0 a proposed token is accepted when it is the target's own next token; at temperature T
speculative sampling accepts a deterministic proposal x with probability p_T(x).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def propose(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The tokens vLLM's prompt lookup proposes after `context` (empty: no match)."""
    total = len(context)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = context[total - n :]
        for start in range(total - n):  # earliest occurrence that ends before the suffix's last token
            if context[start : start + n] == suffix:
                follow = start + n
                return context[follow : follow + k]
    return []


def scorer(target, temperature: float, min_n: int, max_n: int):
    """acceptance.Scorer for prompt lookup against the target's own continuation."""

    @torch.no_grad()
    def score(prompt: list[int], cont: list[int], end: int, max_k: int):
        probs = None
        if temperature > 0:
            ids = torch.tensor([prompt + cont], device=target.device)
            logits = target(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(cont)].float()
            probs = F.softmax(logits / temperature, dim=-1).cpu()
        reach, lengths = torch.zeros(end, max_k), torch.zeros(end, dtype=torch.long)
        for t in range(end):
            proposal = propose(prompt + cont[:t], max_k, min_n, max_n)[: len(cont) - t]
            lengths[t] = len(proposal)
            alive = 1.0
            for j, token in enumerate(proposal):
                alive *= float(token == cont[t + j]) if probs is None else float(probs[t + j, token])
                reach[t, j] = alive
        return reach, lengths

    return score
