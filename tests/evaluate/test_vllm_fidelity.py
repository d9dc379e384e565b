"""Fidelity through vLLM (pipeline/evaluate/vllm_fidelity.py) against transformers' exact numbers on the demo pair,
at tensor parallel 1 and, on a host with two GPUs, 2. Runs where CUDA and vLLM are present; elsewhere (CI) every test
here is skipped with the reason, never simulated. The math over the engines' top-k maps is tested on CPU in
tests/evaluate/test_topk_fidelity.py."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.data.formatting import prompt_and_response_ids, row_to_messages
from pipeline.evaluate import quality, vllm_fidelity, vllm_spec
from pipeline.models.loading import load_causal_lm, load_tokenizer
from tiny_project import ROOT

REASON = vllm_spec.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"GPU path: {REASON}")]


@pytest.fixture(scope="module")
def perturbed_dir(demo_pair, tmp_path_factory):
    """The target with noise on its MLP weights, saved: a stand-in for a lossy quantization that vLLM can load."""
    model = load_causal_lm(demo_pair[0], torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mlp" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3 * param.std())
    out = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(out)
    load_tokenizer(demo_pair[0]).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def request_(demo_pair):
    tokenizer = load_tokenizer(demo_pair[0])
    lines = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:8]
    examples = [prompt_and_response_ids(tokenizer, row_to_messages(json.loads(line))) for line in lines]
    return vllm_fidelity.Request(examples, [p for p, _ in examples], 16, tokenizer.eos_token_id)


def run(demo_pair, variant_dir, request_, tp: int) -> dict:
    engine = vllm_fidelity.Engine(tp, 0.3, enforce_eager=True, dtype="float32")
    got, estimator = vllm_fidelity.fidelity(demo_pair[0], variant_dir, request_, engine)
    assert estimator["tensor_parallel_size"] == tp and estimator["top_k"] == vllm_fidelity.TOP_K
    return got


def test_vllm_fidelity_agrees_with_transformers(demo_pair, perturbed_dir, request_):
    cpu = torch.device("cpu")
    target, variant = load_causal_lm(demo_pair[0], cpu), load_causal_lm(perturbed_dir, cpu)
    exact = quality.fidelity(target, variant, request_.examples)
    got = run(demo_pair, perturbed_dir, request_, 1)
    print(f"vLLM {got} transformers {exact}")
    assert got["tokens"] == exact["tokens"]
    assert got["perplexity"] == pytest.approx(exact["perplexity"], rel=0.01)
    assert got["kl_divergence"] <= exact["kl_divergence"] * 1.02 + 1e-4  # the top-k estimate is a lower bound
    assert got["top1_agreement"] == pytest.approx(exact["top1_agreement"], abs=0.02)
    same = run(demo_pair, demo_pair[0], request_, 1)
    assert same["kl_divergence"] == pytest.approx(0.0, abs=1e-5) and same["greedy_match"] == 1.0


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_same_fidelity_at_tensor_parallel_2(demo_pair, perturbed_dir, request_):
    one, two = run(demo_pair, perturbed_dir, request_, 1), run(demo_pair, perturbed_dir, request_, 2)
    assert two["perplexity"] == pytest.approx(one["perplexity"], rel=1e-3)
    assert two["kl_divergence"] == pytest.approx(one["kl_divergence"], rel=0.02, abs=1e-5)
    assert two["top1_agreement"] == pytest.approx(one["top1_agreement"], abs=0.01)
