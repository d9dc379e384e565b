"""Distillation data for the draft: what the target itself answers to domain prompts.

Speculative decoding accepts a draft token when it matches the target's choice, so the draft
learns the target's responses (greedy, and optionally sampled at the serving temperature)
rather than only the human-written ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from pipeline.core.io import atomic_write_text
from pipeline.core.stage import progress
from pipeline.data.formatting import prompt_ids, split_prompt_response
from pipeline.drafts.settings import DraftTrainingParams

IGNORE_INDEX = -100  # label value the causal-LM loss skips: prompt tokens and padding
TARGET = "target"  # an example's source: the target's own greedy answer
# generate(prompts, temperature, seed) -> one response per prompt, cut after the first EOS
Generate = Callable[[list[list[int]], float, int], list[list[int]]]


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def generate_batched(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[int]]:
    """Responses of `model` to tokenized prompts (left-padded batches), cut after the first EOS."""
    pad, eos = pad_id(tokenizer), tokenizer.eos_token_id
    torch.manual_seed(seed)
    sample = (
        dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 else dict(do_sample=False)
    )
    outs = []
    for i in progress(range(0, len(prompts), batch_size), desc="distill: target generates"):
        chunk = prompts[i : i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=model.device)
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            **sample,
        )
        for row in gen[:, width:].tolist():
            outs.append(row[: row.index(eos) + 1] if eos in row else row)
    return outs


def transformers_generate(model, tokenizer, max_new_tokens: int, batch_size: int) -> Generate:
    return lambda prompts, temperature, seed: generate_batched(
        model, tokenizer, prompts, max_new_tokens, batch_size, temperature, seed
    )


def build_distillation_set(
    generate: Generate, tokenizer, conversations: list[list[dict]], cfg: DraftTrainingParams, sampled: bool = True
) -> list[dict]:
    """Examples {input_ids, labels, source}, the prompt masked out of the loss: the target's greedy answer to
    each prompt (source "target"), cfg.sampled_responses sampled answers (when `sampled`; "sampled"), and the
    original answer when cfg.include_original_responses ("original"). The target's greedy answers are what a draft
    is accepted against at temperature 0, so draft_finetune ships by them (finetune.target_agreement)."""
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in conversations]
    triples = [(p, r, TARGET) for p, r in zip(prompts, generate(prompts, 0.0, cfg.seed))]
    for s in range(cfg.sampled_responses if sampled else 0):
        triples += [(p, r, "sampled") for p, r in zip(prompts, generate(prompts, cfg.temperature, cfg.seed + s + 1))]
    if cfg.include_original_responses:
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        triples += [
            (p, tokenizer(split_prompt_response(m)[1], add_special_tokens=False)["input_ids"] + eos, "original")
            for p, m in zip(prompts, conversations)
        ]
    return [{"input_ids": p + r, "labels": [IGNORE_INDEX] * len(p) + r, "source": src} for p, r, src in triples if r]


def write_examples(path: Path, examples: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in examples))


def read_examples(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
