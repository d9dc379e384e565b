"""Quantization-fidelity metrics against the unquantized target, on the tiny demo model."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import prompt_and_response_ids, prompt_ids, row_to_messages, split_prompt_response
from pipeline.evaluate import quality
from pipeline.models.loading import load_causal_lm, load_tokenizer
from tiny_project import ROOT


@pytest.fixture(scope="module")
def target(demo_pair):
    return load_causal_lm(demo_pair[0])


@pytest.fixture(scope="module")
def perturbed(target):
    """The target with noise on its MLP weights, standing in for a lossy quantization."""
    model = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mlp" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3 * param.std())
    return model


@pytest.fixture(scope="module")
def conversations():
    lines = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:4]
    return [row_to_messages(json.loads(line)) for line in lines]


@pytest.fixture(scope="module")
def examples(demo_pair, conversations):
    tokenizer = load_tokenizer(demo_pair[0])
    return [prompt_and_response_ids(tokenizer, m) for m in conversations]


def test_identical_models_agree_exactly(target, examples):
    m = quality.fidelity(target, target, examples)
    assert m["kl_divergence"] == pytest.approx(0.0, abs=1e-6)
    assert m["top1_agreement"] == 1.0
    assert m["perplexity_increase_pct"] == pytest.approx(0.0, abs=1e-6)
    assert m["tokens"] == sum(len(r) for _, r in examples)


def test_perturbed_copy_diverges(target, perturbed, examples):
    m = quality.fidelity(target, perturbed, examples)
    assert m["kl_divergence"] > 1e-3
    assert 0.0 <= m["top1_agreement"] < 1.0
    assert m["perplexity"] != pytest.approx(m["perplexity_baseline"])


def test_kl_is_baseline_to_variant_averaged_over_response_tokens(target, perturbed, examples):
    """Recomputed from full-sequence logits: sum_x p_base(x) (log p_base(x) - log p_var(x))."""
    kl_sum, n = 0.0, 0
    for prompt, response in examples:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            lb = F.log_softmax(target(ids).logits[0], -1)
            lv = F.log_softmax(perturbed(ids).logits[0], -1)
        rows = slice(len(prompt) - 1, len(prompt) + len(response) - 1)  # positions predicting response tokens
        kl_sum += (lb[rows].exp() * (lb[rows] - lv[rows])).sum().item()
        n += len(response)
    assert quality.fidelity(target, perturbed, examples)["kl_divergence"] == pytest.approx(kl_sum / n, rel=1e-4)


def test_perplexity_counts_response_tokens_only(target, examples):
    """Matches transformers' own loss with the prompt masked out (labels -100)."""
    prompt, response = examples[0]
    ids = torch.tensor([prompt + response])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    with torch.no_grad():
        loss = target(input_ids=ids, labels=labels).loss.item()
    assert quality.fidelity(target, target, examples[:1])["perplexity_baseline"] == pytest.approx(
        math.exp(loss), rel=1e-4
    )


def test_greedy_match(demo_pair, target, conversations):
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(demo_pair[0])
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in conversations[:2]]
    torch.manual_seed(0)
    untrained = AutoModelForCausalLM.from_config(target.config).eval()
    assert quality.greedy_match(target, target, prompts, 8, tokenizer.eos_token_id) == 1.0
    assert quality.greedy_match(target, untrained, prompts, 8, tokenizer.eos_token_id) == 0.0


def test_nothing_to_score_is_an_error(target):
    with pytest.raises(PipelineError, match="held-out"):
        quality.fidelity(target, target, [])
    with pytest.raises(PipelineError, match="greedy"):
        quality.greedy_match(target, target, [], 4, None)
