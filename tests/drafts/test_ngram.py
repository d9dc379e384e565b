"""n-gram (prompt lookup) speculation: proposals identical to vLLM's, and an estimate that equals the greedy
decoding loop it predicts, on the tiny demo target."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.drafts import ngram
from pipeline.evaluate import acceptance


def vllm_kmp_propose(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM 0.25's _find_longest_matched_ngram_and_propose_tokens (vllm/v1/spec_decode/ngram_proposer.py),
    transcribed as the oracle: KMP over the reversed tokens, longest match <= max_n, earliest occurrence."""
    total = len(tokens)
    if total < min_n:
        return []
    rev = np.array(tokens[::-1])
    lps = np.zeros(max_n, dtype=np.int32)
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + min(k, total - start)]


def test_ngram_proposals_are_vllms():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        lo = rng.randrange(1, 4)
        hi = rng.randrange(lo, 6)
        k = rng.randrange(1, 6)
        assert ngram.propose(tokens, k, lo, hi) == vllm_kmp_propose(tokens, lo, hi, k), (tokens, lo, hi, k)


def simulated_ngram_loop(target, prompt, n_tokens, k, lo, hi):
    """Greedy decoding with prompt-lookup speculation, step by step: (accepted, drafted, steps)."""
    cont, end = acceptance.target_continuation(
        target, prompt, n_tokens, 0.0, acceptance.stop_token_ids(target), overrun=k - 1
    )
    accepted = drafted = steps = 0
    t = 1  # the prefill samples token 0; lookups start after it
    while t < end:
        proposal = ngram.propose(prompt + cont[:t], k, lo, hi)[: len(cont) - t]
        j = 0
        while j < len(proposal) and proposal[j] == cont[t + j]:
            j += 1
        accepted, drafted, steps = accepted + j, drafted + len(proposal), steps + 1
        t += j + 1
    return accepted, drafted, steps


def test_ngram_estimate_is_the_greedy_loop(demo_target, demo_target_prompts):
    """At temperature 0 prompt lookup is deterministic, so the estimate must equal the real loop exactly:
    accepted and drafted tokens per decoding step, at the k the estimate chose (per prompt: pooled over
    prompts the loop weighs long answers more than the estimate's per-sequence schedule does)."""
    lo, hi, drafted = 1, 3, 0
    for prompt in demo_target_prompts:
        est = acceptance.estimate_method(
            demo_target, ngram.scorer(demo_target, 0.0, lo, hi), [prompt], 24, 0.0, 4, 0.0, "ngram"
        )
        accepted, drafts, steps = simulated_ngram_loop(demo_target, prompt, 24, est.num_speculative_tokens, lo, hi)
        assert est.expected_accepted_tokens == pytest.approx(accepted / steps)
        assert est.drafted_tokens_per_step == pytest.approx(drafts / steps)
        drafted += drafts
    assert drafted > 0  # the prompts gave the lookup something to propose
