"""CPU speculative-acceptance estimator and the choice of num_speculative_tokens, on the tiny demo pair."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.evaluate import acceptance
from pipeline.models.loading import load_causal_lm
from speculation_estimates import choose_k
from tiny_project import demo_prompts

N_PROMPTS, N_TOKENS, MAX_K = 3, 10, 4


@pytest.fixture(scope="module")
def models(demo_pair):
    target_dir, draft_dir = demo_pair
    return load_causal_lm(target_dir), load_causal_lm(draft_dir)


@pytest.fixture(scope="module")
def prompts(demo_pair):
    return demo_prompts(demo_pair[0], N_PROMPTS)


@pytest.fixture(scope="module")
def random_draft(demo_pair):
    """The draft's architecture with fresh random weights: it knows nothing about the target."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(123)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(demo_pair[1])).eval()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_self_draft_is_always_accepted(models, prompts, temperature):
    target, _ = models
    est = acceptance.estimate(target, target, prompts, N_TOKENS, temperature, MAX_K, cost_ratio=0.25)
    assert est.token_acceptance == pytest.approx(1.0, abs=1e-4)
    assert est.accepted_per_position == pytest.approx([1.0] * MAX_K, abs=1e-4)
    # every drafted token accepted: the longest draft wins and yields (1 + k) / (1 + k c)
    assert est.num_speculative_tokens == MAX_K
    assert est.expected_speedup == pytest.approx((1 + MAX_K) / (1 + MAX_K * 0.25), rel=1e-4)


def test_random_draft_is_almost_never_accepted(models, prompts, random_draft):
    target, _ = models
    est = acceptance.estimate(target, random_draft, prompts, N_TOKENS, 0.0, MAX_K, cost_ratio=0.25)
    assert est.token_acceptance < 0.1
    assert est.expected_speedup < 1.0  # speculation with a useless draft costs time
    assert est.num_speculative_tokens == 1


def test_sampling_acceptance_is_one_minus_total_variation(models, prompts):
    """sum_x min(p, q) at temperature T, checked against 1 - TV(p, q) computed independently."""
    target, draft = models
    temperature = 0.7
    cont, _ = acceptance.target_continuation(target, prompts[0], N_TOKENS, temperature)
    alpha = acceptance.position_acceptance(target, draft, prompts[0], cont, temperature)
    ids = torch.tensor([prompts[0] + cont])
    with torch.no_grad():
        p = F.softmax(target(ids).logits[0] / temperature, -1)
        q = F.softmax(draft(ids).logits[0] / temperature, -1)
    positions = range(len(prompts[0]) - 1, len(prompts[0]) - 1 + N_TOKENS)
    expected = torch.stack([1 - 0.5 * (p[i] - q[i]).abs().sum() for i in positions])
    assert alpha.shape == (N_TOKENS,)
    assert torch.allclose(alpha, expected, atol=1e-4)
    assert 0.0 < alpha.mean() < 1.0


def test_continuations_greedy_matches_generate_and_sampling_is_seeded(models, prompts):
    target, _ = models
    # generate stops at EOS (min_new_tokens would instead suppress it and change the text), so the two agree on
    # generate's tokens, EOS included; without stop ids the continuation goes on to N_TOKENS.
    greedy = target.generate(
        torch.tensor([prompts[0]]), max_new_tokens=N_TOKENS, do_sample=False, pad_token_id=target.config.eos_token_id
    )[0, len(prompts[0]) :].tolist()
    tokens, end = acceptance.target_continuation(target, prompts[0], N_TOKENS)
    assert tokens[: len(greedy)] == greedy and len(tokens) == end == N_TOKENS
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(acceptance.target_continuation(target, prompts[0], N_TOKENS, temperature=1.5)[0])
    assert runs[0] == runs[1] and len(runs[0]) == N_TOKENS


def test_continuation_ends_at_the_stop_token_then_overruns(models, prompts):
    """A server stops at EOS, so the response ends there (EOS included: the draft must propose it);
    the overrun tokens past it are what a draft started near the end is scored on."""
    target, _ = models
    free, _ = acceptance.target_continuation(target, prompts[0], N_TOKENS)
    stop = free[3]
    end = free.index(stop) + 1
    assert acceptance.target_continuation(target, prompts[0], N_TOKENS, stop_ids={stop}) == (free[:end], end)
    assert acceptance.target_continuation(target, prompts[0], N_TOKENS, stop_ids={stop}, overrun=3) == (
        free[: end + 3],
        end,
    )
    assert acceptance.stop_token_ids(target) == {target.generation_config.eos_token_id}


def brute_force_per_position(alphas: list[list[int]], k: int, starts: list[int] | None = None) -> list[float]:
    """Greedy (0/1) acceptance, stepped the way vLLM steps: draft k tokens at t, count how many are
    accepted (j), the target adds one, the next step starts at t + j + 1. Position j's share is
    vLLM's num_accepted_tokens_per_pos[j] / num_drafts."""
    accepted_at, drafts = [0] * k, 0
    for i, a in enumerate(alphas):
        # position 0 is the prefill's token: the first draft starts after it
        t, end = 1, len(a) - k + 1 if starts is None else starts[i]
        while t < end:
            drafts += 1
            j = 0
            while j < k and a[t + j]:
                accepted_at[j] += 1
                j += 1
            t += j + 1
    return [n / drafts for n in accepted_at]


def test_per_position_acceptance_matches_vllm_counters_definition():
    alphas = [[1, 1, 0, 1, 1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 0, 1, 0]]
    tensors = [torch.tensor(a, dtype=torch.float) for a in alphas]
    for k in (1, 2, 3):
        assert acceptance.accepted_per_position(tensors, k) == pytest.approx(brute_force_per_position(alphas, k))
    # drafts start only within each response (here before positions 5 and 3)
    assert acceptance.accepted_per_position(tensors, 3, starts=[5, 3]) == pytest.approx(
        brute_force_per_position(alphas, 3, starts=[5, 3])
    )


def test_per_position_acceptance_is_the_expectation_over_sampled_acceptances():
    """Fractional acceptance (sampling): the expected schedule equals the average of simulated ones."""
    gen = torch.Generator().manual_seed(0)
    alphas = [torch.rand(40, generator=gen), torch.rand(30, generator=gen) ** 0.3]
    k, runs = 4, 4000
    accepted_at, drafts = [0] * k, 0
    for _ in range(runs):
        for a in alphas:
            t = 1
            while t < len(a) - k + 1:
                drafts += 1
                j = 0
                while j < k and torch.rand(1, generator=gen).item() < a[t + j]:
                    accepted_at[j] += 1
                    j += 1
                t += j + 1
    simulated = [n / drafts for n in accepted_at]
    assert acceptance.accepted_per_position(alphas, k) == pytest.approx(simulated, abs=0.01)


@torch.no_grad()
def greedy_speculative_decoding(target, draft, prompt: list[int], k: int, max_tokens: int, eos: int) -> list[int]:
    """A plain greedy speculative-decoding loop as vLLM runs it: the prefill samples the first token, then
    each step drafts k tokens, verifies them with one target pass and keeps the accepted ones plus the
    target's next token; returns accepted counts per step, like vLLM counts."""
    first = int(target(torch.tensor([prompt])).logits[0, -1].argmax())
    seq, produced, accepted = list(prompt) + [first], 1, []
    if first == eos or produced >= max_tokens:
        return accepted
    while True:
        proposal = []
        for _ in range(k):
            proposal.append(int(draft(torch.tensor([seq + proposal])).logits[0, -1].argmax()))
        choices = target(torch.tensor([seq + proposal])).logits[0, len(seq) - 1 :].argmax(-1).tolist()
        j = 0
        while j < k and proposal[j] == choices[j]:
            j += 1
        accepted.append(j)
        for token in choices[: j + 1]:
            seq.append(token)
            produced += 1
            if token == eos or produced >= max_tokens:
                return accepted


def test_estimate_matches_a_real_speculative_decoding_loop(models, prompts):
    """The estimator's expected counters against an actual greedy speculative-decoding run."""
    target, draft = models
    k, tokens = 3, 24
    steps = [
        greedy_speculative_decoding(target, draft, p, k, tokens, target.generation_config.eos_token_id) for p in prompts
    ]
    drafts = sum(len(s) for s in steps)
    measured = [sum(j > pos for s in steps for j in s) / drafts for pos in range(k)]
    est = acceptance.estimate(target, draft, prompts, tokens, 0.0, k, cost_ratio=0.1)
    assert est.accepted_per_position_by_k[str(k)] == pytest.approx(measured, abs=0.02)


@pytest.mark.parametrize("alpha,cost", [(0.9, 0.05), (0.6, 0.2), (0.3, 0.5), (0.8, 0.0)])
def test_choose_k_maximizes_the_closed_form_speedup(alpha, cost):
    """Constant per-token acceptance alpha: E[accepted + 1] = (1 - alpha^(k+1)) / (1 - alpha)."""
    per_pos = acceptance.accepted_per_position([torch.full((64,), alpha)], 8)
    k, speedups = choose_k(per_pos, cost)
    closed = {j: (1 - alpha ** (j + 1)) / ((1 - alpha) * (1 + j * cost)) for j in range(1, 9)}
    assert speedups == pytest.approx(closed, rel=1e-5)
    assert k == max(closed, key=closed.get)


def test_choose_k_trades_draft_length_against_cost():
    per_pos = acceptance.accepted_per_position([torch.full((32,), 0.7)], 8)
    assert choose_k(per_pos, 0.0)[0] == 8  # free drafts: always draft the most
    assert choose_k(per_pos, 1.0)[0] == 1  # a draft as costly as the target
    cheap, dear = choose_k(per_pos, 0.02)[0], choose_k(per_pos, 0.3)[0]
    assert cheap > dear


def test_cost_ratio_settings(demo_pair, models, prompts):
    target_dir, draft_dir = demo_pair
    sizes = [(d / "model.safetensors").stat().st_size for d in (draft_dir, target_dir)]
    assert acceptance.resolve_cost_ratio("weight_bytes", target_dir, draft_dir) == pytest.approx(sizes[0] / sizes[1])
    assert acceptance.resolve_cost_ratio(0.2, target_dir, draft_dir) == 0.2
    assert acceptance.resolve_cost_ratio("measured", target_dir, draft_dir) is None
    measured = acceptance.estimate(*models, prompts[:1], N_TOKENS, 0.0, MAX_K, cost_ratio=None).cost_ratio
    assert 0 < measured < 10
    for bad in ("fast", -1, 0, True, None):
        with pytest.raises(PipelineError, match="cost_ratio"):
            acceptance.resolve_cost_ratio(bad, target_dir, draft_dir)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"prompts": []}, "at least one"),
        ({"continuation_tokens": 3}, "continuation_tokens"),
        ({"max_k": 0}, "max_k"),
        ({"temperature": -0.5}, "temperature"),
    ],
)
def test_bad_settings_are_one_line_errors(models, prompts, kwargs, match):
    args = {"prompts": prompts, "continuation_tokens": N_TOKENS, "temperature": 0.0, "max_k": MAX_K, **kwargs}
    with pytest.raises(PipelineError, match=match):
        acceptance.estimate(
            models[0],
            models[1],
            args["prompts"],
            args["continuation_tokens"],
            args["temperature"],
            args["max_k"],
            cost_ratio=0.1,
        )


def test_tokens_past_the_end_of_a_response_do_not_count_as_served_tokens():
    """A 5-token answer (the prefill samples the first) drafted at k = 8 with every draft accepted: one step
    ends it, vLLM counts 8 accepted tokens, but only 4 of them are the answer's; a 41-token one takes 5 steps."""
    short = acceptance.schedule([acceptance.reach_from_alphas(torch.ones(20), 8, 5)], 8)
    assert short.accepted_per_step == pytest.approx(8.0) and short.tokens_per_step == pytest.approx(4.0)
    long = acceptance.schedule([acceptance.reach_from_alphas(torch.ones(60), 8, 41)], 8)
    assert long.tokens_per_step == pytest.approx(40 / 5) and long.accepted_per_step == pytest.approx(8.0)


def test_continuations_written_once_score_every_method_as_their_own_would(models, prompts):
    """The evaluate stage writes the target's continuations once per variant and scores each method on them: at
    temperature 0 that is exactly each method's own run; a list for other prompts is refused."""
    target, draft = models
    written = acceptance.target_continuations(target, prompts, N_TOKENS, 0.0, MAX_K)
    assert len(written) == len(prompts) and all(end <= len(tokens) for tokens, end in written)
    own = acceptance.estimate(target, draft, prompts, N_TOKENS, 0.0, MAX_K, cost_ratio=0.25)
    shared = acceptance.estimate(target, draft, prompts, N_TOKENS, 0.0, MAX_K, cost_ratio=0.25, continuations=written)
    assert shared == own
    with pytest.raises(ValueError, match="continuations for"):
        acceptance.estimate(target, draft, prompts, N_TOKENS, 0.0, MAX_K, cost_ratio=0.25, continuations=written[:1])
