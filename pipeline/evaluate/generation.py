"""Greedy generation for many prompts at once: one KV-cached forward per new token for a whole batch instead of
one per prompt (the evaluate stage's largest cost was per-prompt generation: 24 prompts x ~100 tokens, each a
forward dominated by per-call overhead on a small model).

Prompts are left-padded, with an attention mask and position ids that start at each prompt's first real token,
so every row computes the same function as its own unbatched run. The logits are not bit-identical to the
unbatched run (float32 GEMMs and attention over a padded length round differently, ~1e-6 on the demo), so a
near-tie between two tokens could in principle flip; tests/evaluate/test_generation.py and the demo's evaluate outputs
check that the tokens are the same as one prompt at a time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from pipeline.core.stage import progress_bar

# Rows per batch: bounds the padded KV cache (batch x (longest prompt + new tokens)) on a large target.
BATCH_SIZE = 32


@torch.no_grad()
def _greedy_batch(
    model,
    prompts: list[list[int]],
    n_tokens: int,
    stop_ids,
    overrun: int,
    pad_id: int,
    done: Callable[[list[int]], bool] | None = None,
) -> list[tuple[list[int], int]]:
    rows, width = len(prompts), max(map(len, prompts))
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each prompt's own positions, as unbatched
    device = model.device
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    # the prefill's last position only: a batch's [rows, width, vocab] logits would be rows times the unbatched run's
    # (GBs for a large vocabulary); the same values as the full logits' last row (checked on the demo models)
    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **last)
    tokens: list[list[int]] = [[] for _ in prompts]
    ends: list[int | None] = [None] * rows
    while True:
        nxt = out.logits[:, -1].argmax(-1)
        for i, token in enumerate(nxt.tolist()):
            t = tokens[i]
            if ends[i] is not None and len(t) >= ends[i] + overrun:
                continue  # this row is done; it still rides along in the batch
            t.append(token)
            if ends[i] is None and (token in stop_ids or len(t) >= n_tokens or (done is not None and done(t))):
                ends[i] = len(t)
        if all(end is not None and len(t) >= end + overrun for t, end in zip(tokens, ends)):
            return list(zip(tokens, ends))
        mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=nxt[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )


def greedy_continuations(
    model,
    prompts: list[list[int]],
    n_tokens: int,
    stop_ids=frozenset(),
    overrun: int = 0,
    batch_size: int = BATCH_SIZE,
    pad_id: int = 0,
    done: Callable[[list[int]], bool] | None = None,
    desc: str | None = None,
) -> list[tuple[list[int], int]]:
    """(tokens, response_length) per prompt, as acceptance.target_continuation at temperature 0: the model's
    greedy tokens up to its first stop token or n_tokens (or, given `done`, the first length at which done(tokens)
    holds: a stop that is text, not a token), then `overrun` more. The pad id only fills masked positions (any
    valid id). desc: a progress bar of that name over the prompts (the stage's log keeps its time)."""
    out: list[tuple[list[int], int]] = []
    bar = progress_bar(desc, total=len(prompts)) if desc else None
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        out += _greedy_batch(model, batch, n_tokens, stop_ids, overrun, pad_id, done)
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return out
