"""Batched greedy generation (pipeline/evaluate/generation.py) gives each prompt the tokens it gets alone, on the
tiny demo target: prompts of different lengths share a left-padded batch."""
from __future__ import annotations

import pytest
import torch

from tiny_project import demo_prompts
from pipeline.evaluate import acceptance, generation, quality

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
    out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=n_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    return out[0, len(prompt):].tolist()


def test_batched_greedy_equals_generate_and_prefixes_of_longer_runs(demo_target, prompts):
    eos = demo_target.config.eos_token_id
    runs = generation.greedy_continuations(demo_target, prompts, 8, {eos})
    assert [tokens for tokens, _ in runs] == [generate_greedy(demo_target, p, 8, eos) for p in prompts]
    longer = generation.greedy_continuations(demo_target, prompts, N_TOKENS, set(), OVERRUN)
    assert [generation.greedy_prefix(tokens, 8, eos) for tokens, _ in longer] == [tokens for tokens, _ in runs]
    # too short a run to tell where an 8-token greedy run ends: None, generated instead
    assert generation.greedy_prefix([5, 6, 7], 8, eos) is None and generation.greedy_prefix([5, eos], 8, eos) == [5, eos]


def test_greedy_match_with_known_variant_tokens(demo_target, prompts):
    """The variant's tokens read off its continuations count as its own generation; unknown ones are generated."""
    eos = demo_target.config.eos_token_id
    own = [tokens for tokens, _ in generation.greedy_continuations(demo_target, prompts, 8, {eos})]
    assert quality.greedy_match(demo_target, demo_target, prompts, 8, eos, variant_tokens=own) == 1.0
    known = [own[0] + [0], None, own[2]]  # one wrong, one to generate; the rest unknown: generated
    assert quality.greedy_match(demo_target, demo_target, prompts, 8, eos, variant_tokens=known) == \
        (len(prompts) - 1) / len(prompts)
