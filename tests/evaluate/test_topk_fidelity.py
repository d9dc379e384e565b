"""Fidelity from top-k logprobs (pipeline/evaluate/topk_fidelity.py) against the exact values of small full
distributions, and evaluate.backend's choice (pipeline/evaluate/backend.py). The vLLM engine that produces the
top-k maps runs only on a GPU host: tests/evaluate/test_vllm_fidelity.py."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import prompt_and_response_ids, row_to_messages
from pipeline.evaluate import backend, quality, topk_fidelity
from pipeline.evaluate.settings import EvaluateParams
from pipeline.evaluate.topk_fidelity import Position
from pipeline.models.loading import load_tokenizer
from tiny_project import ROOT, tiny_params


def exact_kl(p: list[float], q: list[float]) -> float:
    return math.fsum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def top(probs: list[float], k: int, also: int | None = None) -> dict[int, float]:
    """What vLLM reports at a position: the k most likely tokens' logprobs, plus token `also` (the actual one)."""
    order = sorted(range(len(probs)), key=lambda t: -probs[t])[:k]
    keep = set(order) | ({also} if also is not None else set())
    return {t: math.log(probs[t]) for t in keep}


P = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]


def test_every_token_reported_gives_the_exact_kl():
    q = [0.4, 0.3, 0.1, 0.05, 0.1, 0.05]
    kl, tail = topk_fidelity.tail_bucket_kl(top(P, 6), top(q, 6))
    assert kl == pytest.approx(exact_kl(P, q), rel=1e-12) and tail == pytest.approx(0.0, abs=1e-12)


def test_a_tail_proportional_in_both_loses_nothing():
    """The tail's conditional distributions equal (Q is P rescaled there, other mass): the chain rule's gap is 0."""
    q = [0.4, 0.3, 0.15, 0.075, 0.0375, 0.0375]  # tail {3, 4, 5}: 0.5/0.25/0.25 of its mass in both
    kl, tail = topk_fidelity.tail_bucket_kl(top(P, 3), top(q, 3))
    assert tail == pytest.approx(0.2)
    assert kl == pytest.approx(exact_kl(P, q), rel=1e-9) and kl > 0.01


def test_where_the_tail_matters_the_estimate_is_the_lower_bound_by_exactly_the_tail_term():
    """The tail moved inside itself (same mass, different shape): the coarse KL misses exactly
    p_T * KL(P(.|T) || Q(.|T)), and is below the exact KL by that much."""
    q = [0.5, 0.2, 0.12, 0.01, 0.09, 0.08]  # the same top 3; inside the tail, token 3 almost vanished
    kl, tail = topk_fidelity.tail_bucket_kl(top(P, 3), top(q, 3))
    p_t = [x / sum(P[3:]) for x in P[3:]]
    q_t = [x / sum(q[3:]) for x in q[3:]]
    assert tail == pytest.approx(0.2)
    assert exact_kl(P, q) - kl == pytest.approx(tail * exact_kl(p_t, q_t), rel=1e-9)
    assert kl < exact_kl(P, q) / 2  # here most of the divergence is inside the tail


def test_tokens_only_one_engine_reports_go_to_the_tail():
    """The variant's top 2 differ from the baseline's: only the tokens both report are compared one by one; the
    estimate is still at most the exact KL (the data-processing inequality holds for any partition)."""
    q = [0.1, 0.1, 0.4, 0.3, 0.05, 0.05]
    p_map, q_map = top(P, 2), top(q, 2)
    assert p_map.keys() & q_map.keys() == set()
    kl, tail = topk_fidelity.tail_bucket_kl(p_map, q_map)
    assert tail == pytest.approx(1.0) and kl == pytest.approx(0.0, abs=1e-12)
    kl_both, _ = topk_fidelity.tail_bucket_kl(top(P, 2, also=2), top(q, 2, also=0))  # each also reports the other's
    assert 0 < kl_both <= exact_kl(P, q)


def test_tail_mass_is_precise_when_tiny():
    lp = [math.log(0.999999), math.log(1e-7)]
    assert topk_fidelity.tail_mass(lp) == pytest.approx(9e-7, rel=1e-6)
    assert topk_fidelity.tail_mass([0.0, -50.0]) == 0.0  # a sum a rounding error above 1 is clamped


def test_fidelity_from_full_maps_equals_the_exact_transformers_computation():
    """Every token reported: the top-k fidelity is quality.fidelity's exact numbers (random logits of a 7-token
    vocabulary; the same float64 arithmetic on both sides up to summation order)."""
    gen = torch.Generator().manual_seed(0)
    base = F.log_softmax(torch.randn(12, 7, generator=gen, dtype=torch.float64), -1)
    var = F.log_softmax(base + 0.3 * torch.randn(12, 7, generator=gen, dtype=torch.float64), -1)
    tokens = torch.randint(0, 7, (12,), generator=gen)
    positions = [
        Position(int(t), dict(enumerate(b.tolist())), dict(enumerate(v.tolist()))) for t, b, v in zip(tokens, base, var)
    ]
    got, estimator = topk_fidelity.fidelity(positions, 7)
    kl = F.kl_div(var, base, log_target=True, reduction="sum").item() / 12
    nll_b = -base.gather(1, tokens[:, None]).sum().item() / 12
    nll_v = -var.gather(1, tokens[:, None]).sum().item() / 12
    assert got["kl_divergence"] == pytest.approx(kl, rel=1e-9)
    assert got["perplexity_baseline"] == pytest.approx(math.exp(nll_b), rel=1e-9)
    assert got["perplexity"] == pytest.approx(math.exp(nll_v), rel=1e-9)
    assert got["top1_agreement"] == (base.argmax(-1) == var.argmax(-1)).sum().item() / 12
    assert got["tokens"] == 12 and estimator["kl_tail_mass"] == pytest.approx(0.0, abs=1e-9)
    assert set(got) == {
        "perplexity_baseline",
        "perplexity",
        "perplexity_increase_pct",
        "kl_divergence",
        "top1_agreement",
        "tokens",
    }


def test_top_k_of_the_demo_model_bounds_its_exact_kl(demo_target, demo_pair):
    """On the demo target against a perturbed copy, top-5 maps cut from transformers' exact log-probabilities: the
    estimate is at most the exact KL, perplexity and top-1 are exact."""
    tokenizer = load_tokenizer(demo_pair[0])
    rows = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:3]
    examples = [prompt_and_response_ids(tokenizer, row_to_messages(json.loads(r))) for r in rows]
    variant = copy.deepcopy(demo_target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in variant.named_parameters():
            if "mlp" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3 * param.std())
    positions = []
    for prompt, response in examples:
        lp_b = quality.response_logprobs(demo_target, prompt, response)
        lp_v = quality.response_logprobs(variant, prompt, response)
        for j, token in enumerate(response):
            positions.append(
                Position(token, top(lp_b[j].exp().tolist(), 5, token), top(lp_v[j].exp().tolist(), 5, token))
            )
    got, estimator = topk_fidelity.fidelity(positions, 5)
    exact = quality.fidelity(demo_target, variant, examples)
    assert 0 < got["kl_divergence"] <= exact["kl_divergence"] + 1e-6
    assert got["perplexity"] == pytest.approx(exact["perplexity"], rel=1e-4)
    assert got["top1_agreement"] == pytest.approx(exact["top1_agreement"])
    assert 0 <= estimator["kl_tail_mass"] < 1


def test_a_token_the_engine_did_not_report_is_an_error():
    with pytest.raises(PipelineError, match="miss the scored token 3"):
        topk_fidelity.fidelity([Position(3, {0: -0.1}, {0: -0.1, 3: -3.0})], 1)
    with pytest.raises(PipelineError, match="no held-out response tokens"):
        topk_fidelity.fidelity([], 1)


def test_greedy_path_matches_by_argmax_at_every_position():
    a, b = {1: -0.1, 2: -3.0}, {1: -2.0, 2: -0.2}
    assert topk_fidelity.argmax_path_matches([a, a], [a, a])
    assert not topk_fidelity.argmax_path_matches([a, a], [a, b])
    assert topk_fidelity.argmax_path_matches([], [])


# ---- evaluate.backend


def test_auto_keeps_the_cpu_path_where_vllm_cannot_run():
    got = backend.choose("auto", 2, "no CUDA device", 0)
    assert (got.fidelity, got.lm_eval) == ("transformers", "hf") and "no CUDA device" in got.reason


def test_auto_scores_through_vllm_only_where_the_engines_need_several_gpus():
    assert (backend.choose("auto", 2, None, 2).fidelity, backend.choose("auto", 2, None, 2).lm_eval) == ("vllm", "vllm")
    one = backend.choose("auto", 1, None, 2)
    assert (one.fidelity, one.lm_eval) == ("transformers", "vllm")  # lm-eval through vLLM on a GPU, as before


def test_explicit_backends():
    assert backend.choose("transformers", 4, None, 1) == backend.Backends(
        "transformers", "hf", "evaluate.backend is transformers"
    )
    assert backend.choose("vllm", 1, None, 1).fidelity == "vllm"
    with pytest.raises(PipelineError, match="evaluate.backend is vllm but vLLM cannot run here: no CUDA device"):
        backend.choose("vllm", 1, "no CUDA device", 0)
    with pytest.raises(PipelineError, match="needs more GPUs than the 1 here"):
        backend.choose("auto", 2, None, 1)
    with pytest.raises(PipelineError, match="evaluate.backend must be one of auto, transformers, vllm"):
        backend.choose("tensorrt", 1, None, 1)


def test_the_setting_is_parsed_and_checked():
    p = tiny_params()
    assert EvaluateParams.parse(p["evaluate"]).backend == "auto"
    p["evaluate"]["backend"] = "vllm"
    assert EvaluateParams.parse(p["evaluate"]).backend == "vllm"
    p["evaluate"]["backend"] = "onnx"
    with pytest.raises(PipelineError, match="evaluate.backend"):
        EvaluateParams.parse(p["evaluate"])
