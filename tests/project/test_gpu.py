"""The GPU path against real vLLM, on the tiny demo pair. Runs where CUDA and vLLM are present;
elsewhere (CI) every test here is skipped with the reason, never simulated."""

from __future__ import annotations

import pytest
import torch

from pipeline.evaluate import acceptance, vllm_spec
from pipeline.models.loading import load_causal_lm
from tiny_project import demo_prompts

REASON = vllm_spec.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"GPU path: {REASON}")]
K, TOKENS = 3, 32


@pytest.fixture(scope="module")
def prompts(demo_pair):
    return demo_prompts(demo_pair[0], 16)


def test_vllm_speculation_matches_plain_decoding_and_the_cpu_estimate(demo_pair, prompts):
    target_dir, draft_dir = demo_pair
    measured = vllm_spec.measure(
        str(target_dir),
        str(draft_dir),
        prompts,
        K,
        max_tokens=TOKENS,
        temperature=0.0,
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        batch_sizes=(1,),
        enforce_eager=True,
        dtype="float32",
    )
    # Greedy speculative decoding is lossless: the same tokens as the target alone.
    assert measured["spec_output_matches_baseline"]
    per_pos = measured["accepted_per_position"]
    assert len(per_pos) == K and all(a >= b for a, b in zip(per_pos, per_pos[1:]))
    assert measured["baseline_tokens_per_s_bs1"] > 0 and measured["speculative_tokens_per_s_bs1"] > 0
    # The CPU estimator predicts vLLM's accepted/drafted ratio. Both in float32: this barely trained pair
    # has near-tied logits, where bf16 kernel differences alone would flip greedy choices.
    cpu = torch.device("cpu")
    estimate = acceptance.estimate(
        load_causal_lm(target_dir, cpu), load_causal_lm(draft_dir, cpu), prompts, TOKENS, 0.0, K, cost_ratio=0.1
    )
    expected_ratio = sum(estimate.accepted_per_position_by_k[str(K)]) / K  # at the k vLLM ran with
    print(
        f"vLLM accepted/drafted {measured['accepted_per_draft_token']:.3f} per position {per_pos}; "
        f"CPU estimate {expected_ratio:.3f}"
    )
    assert measured["accepted_per_draft_token"] == pytest.approx(expected_ratio, abs=0.1)
