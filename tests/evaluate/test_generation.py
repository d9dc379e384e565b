"""Batched greedy generation (pipeline/evaluate/generation.py) gives each prompt the tokens it gets alone, on the
tiny demo target: prompts of different lengths share a left-padded batch."""

from __future__ import annotations

import pytest
import torch

from pipeline.evaluate import acceptance, generation, quality
from tiny_project import demo_prompts

N_TOKENS, OVERRUN = 12, 3


@pytest.fixture(scope="module")
def prompts(demo_pair):
    out = demo_prompts(demo_pair[0], 6)
    assert len(set(map(len, out))) > 1  # padding is exercised only with prompts of different lengths
    return out


def test_batched_continuations_equal_one_prompt_at_a_time(demo_target, prompts):
    stop = acceptance.stop_token_ids(demo_target)
    alone = [acceptance.target_continuation(demo_target, p, N_TOKENS, 0.0, stop, OVERRUN) for p in prompts]
    assert generation.greedy_continuations(demo_target, prompts, N_TOKENS, stop, OVERRUN) == alone
    # batches split anywhere give the same rows
    assert generation.greedy_continuations(demo_target, prompts, N_TOKENS, stop, OVERRUN, batch_size=4) == alone
    # a stop token the model writes early ends that row's response and its overrun there, the others go on
    first = alone[0][0][2]
    early = [acceptance.target_continuation(demo_target, p, N_TOKENS, 0.0, {first}, OVERRUN) for p in prompts]
    assert generation.greedy_continuations(demo_target, prompts, N_TOKENS, {first}, OVERRUN) == early
    assert early[0][1] <= 3 and len(early[0][0]) == early[0][1] + OVERRUN


@torch.no_grad()
def generate_greedy(model, prompt: list[int], n_tokens: int, eos_token_id: int | None) -> list[int]:
    """transformers' generate(), one prompt at a time: what greedy_match ran before it batched."""
    out = model.generate(
        torch.tensor([prompt], device=model.device),
        max_new_tokens=n_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    return out[0, len(prompt) :].tolist()


def test_batched_greedy_equals_generate(demo_target, prompts):
    eos = demo_target.config.eos_token_id
    runs = generation.greedy_continuations(demo_target, prompts, 8, {eos})
    assert [tokens for tokens, _ in runs] == [generate_greedy(demo_target, p, 8, eos) for p in prompts]


def test_greedy_match_is_whether_the_variant_generates_the_same_tokens(demo_target, prompts):
    """The teacher-forced check counts exactly the prompts whose generate() run equals the baseline's: a copy of the
    target with noise on its weights matches on some prompts and not on others."""
    import copy

    eos = demo_target.config.eos_token_id
    alone = [generate_greedy(demo_target, p, 8, eos) for p in prompts]
    for scale in (0.1, 0.3, 1.0, 3.0):  # the least noise that makes the variant miss on some prompts only
        variant = copy.deepcopy(demo_target)
        torch.manual_seed(0)
        with torch.no_grad():
            for w in variant.parameters():
                w.add_(torch.randn_like(w) * scale * w.std())
        same = [generate_greedy(variant, p, 8, eos) == a for p, a in zip(prompts, alone)]
        if 0 < sum(same) < len(prompts):
            break
    else:
        pytest.fail("no noise scale gave a variant that matches on some prompts and misses on others")
    assert quality.greedy_match(demo_target, variant, prompts, 8, eos) == sum(same) / len(prompts)
    assert quality.greedy_match(demo_target, copy.deepcopy(demo_target), prompts, 8, eos) == 1.0
