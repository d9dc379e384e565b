"""Served speed predicted from measured serving costs: fitting a cost profile from the GPU script's raw
output, choosing the profile for a build, predicting per concurrency and k, and the rule
that ships speculation without a GPU measurement only where the prediction pays at every declared tier.

The raw files here are generated from a known cost model (plain step time linear in tokens, a drafter
cost per drafted token rising with batch size) in the layout benchmarks/gpu/measure_costs.py writes; what is
under test is that the pipeline's fit recovers that model and decides from it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeline import serving_costs
from pipeline.errors import PipelineError
from pipeline.speculation import decide, tier_speculation
from pipeline.methods import Speculation
from pipeline.tiers import Tier

TARGET = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 4, "vocab_size": 1000}
DRAFT = {**TARGET, "num_hidden_layers": 1}
BATCHES, SPEC_BATCHES, KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], [1, 4, 8, 16, 32, 64], [2, 8]
SHORT, LONG = 32, 288
ACCEPTED_PER_STEP = 1.5  # what the random-weight drafter happened to get accepted; must not bias the costs


def plain_ms(tokens: float) -> float:
    return 2.0 + 0.01 * tokens


def draft_ms(batch: float) -> float:
    return 3.0 + 0.02 * batch


def run(batch: int, n: int, k: int) -> dict:
    """One timed generation of n tokens per request, as measure_costs.timed records it."""
    if k == 0:
        return {"wall_s": 0.05 + n * plain_ms(batch) / 1000, "tokens": batch * n}
    steps = n / (1 + ACCEPTED_PER_STEP)
    step = plain_ms(batch * (1 + k)) + k * draft_ms(batch)
    return {"wall_s": 0.05 + steps * step / 1000, "tokens": batch * n, "num_drafts": batch * steps,
            "num_draft_tokens": batch * steps * k, "num_accepted_tokens": batch * steps * ACCEPTED_PER_STEP}


def write_raw(root: Path, methods=("draft_model", "eagle3")) -> tuple[Path, Path]:
    raw, shape = root / "out" / "toy", root / "shapes" / "toy"
    raw.mkdir(parents=True)
    for role, cfg in (("target", TARGET), ("draft", DRAFT)):
        (shape / role).mkdir(parents=True)
        (shape / role / "config.json").write_text(json.dumps(cfg))
    (root / "out" / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB\n")
    (root / "out" / "versions.txt").write_text("vllm 0.26.0 torch 2.11.0+cu130\n")
    (raw / "plain-k0.json").write_text(json.dumps({"method": "plain", "k": 0, "runs": [
        {"batch": b, "short": run(b, SHORT, 0), "long": run(b, LONG, 0)} for b in BATCHES]}))
    for m in methods:
        for k in KS:
            (raw / f"{m}-k{k}.json").write_text(json.dumps({"method": m, "k": k, "runs": [
                {"batch": b, "short": run(b, SHORT, k), "long": run(b, LONG, k)} for b in SPEC_BATCHES]}))
    (raw / "ngram-k2.failed.json").write_text(json.dumps({"method": "ngram", "k": 2, "rc": 1, "error": "x"}))
    return raw, shape


@pytest.fixture
def profile(tmp_path) -> serving_costs.CostProfile:
    raw, shape = write_raw(tmp_path)
    return serving_costs.assemble(raw, shape, "h100-vllm0.26.0-toy", "h100", "test")


def test_the_fit_recovers_the_costs_whatever_the_drafts_acceptance(profile):
    assert profile.gpu_name == "NVIDIA H100 80GB HBM3" and profile.vllm_version == "0.26.0"
    assert profile.target["params"] == serving_costs.llama_params(TARGET)
    for b in BATCHES:
        assert profile.plain_step_ms[str(b)] == pytest.approx(plain_ms(b), rel=1e-9)
    assert set(profile.methods) == {"draft_model", "eagle3"}  # a failed engine's record is not a measurement
    cost = profile.methods["draft_model"]
    assert cost.measured_k == KS and cost.drafter["num_hidden_layers"] == 1
    for b in SPEC_BATCHES:
        assert cost.draft_ms_per_token[str(b)] == pytest.approx(draft_ms(b), rel=1e-9)
        assert cost.drafted_per_step[str(b)] == pytest.approx(8)
        assert cost.holdout_error[str(b)] < 1e-9  # the linear model is exact on data it generated


def test_a_plain_step_that_reads_faster_at_a_larger_batch_is_pooled_with_its_neighbour(tmp_path):
    raw, shape = write_raw(tmp_path)
    rec = json.loads((raw / "plain-k0.json").read_text())
    slow = next(r for r in rec["runs"] if r["batch"] == 4)
    slow["long"]["wall_s"] += 0.05 * (LONG - SHORT) / 1000  # batch 4 reads 0.05 ms slow, above batch 8's step
    (raw / "plain-k0.json").write_text(json.dumps(rec))
    prof = serving_costs.assemble(raw, shape, "p", "h100", "test")
    assert prof.plain_step_ms_measured["4"] == pytest.approx(plain_ms(4) + 0.05)
    pooled = (plain_ms(4) + 0.05 + plain_ms(8)) / 2
    assert prof.plain_step_ms["4"] == pytest.approx(pooled) and prof.plain_step_ms["8"] == pytest.approx(pooled)
    assert prof.plain_step_ms["16"] == pytest.approx(plain_ms(16)) and list(prof.plain_step_ms) == [str(b) for b in BATCHES]


def test_a_nonlinear_drafter_shows_in_the_holdout_error(tmp_path):
    raw, shape = write_raw(tmp_path)
    rec = json.loads((raw / "draft_model-k8.json").read_text())
    for r in rec["runs"]:  # k=8 steps 20% slower than the k=2 fit implies
        for key in ("short", "long"):
            r[key]["wall_s"] = 0.05 + (r[key]["wall_s"] - 0.05) * 1.2
    (raw / "draft_model-k8.json").write_text(json.dumps(rec))
    prof = serving_costs.assemble(raw, shape, "p", "h100", "test")
    assert all(e > 0.05 for e in prof.methods["draft_model"].holdout_error.values())
    assert all(e < 1e-9 for e in prof.methods["eagle3"].holdout_error.values())


def test_prediction_is_accepted_tokens_times_the_measured_step_ratio(profile):
    accepted = {"2": 1.6, "4": 2.8, "8": 4.2}
    drafted = {"2": 2.0, "4": 4.0, "8": 8.0}
    choice = serving_costs.Choice(profile, "test", 1.0)
    pred = serving_costs.predict(choice, "draft_model", accepted, drafted, [1, 8, 64])
    for c in (1, 8, 64):
        for k in (2, 4, 8):
            want = (1 + accepted[str(k)]) * plain_ms(c) / (plain_ms(c * (1 + k)) + k * draft_ms(c))
            assert pred.speedup(c, k) == pytest.approx(want, rel=1e-9)
        assert pred.best_k[str(c)] == max((2, 4, 8), key=lambda k: pred.speedup(c, k))
        assert pred.plain_tokens_per_s[str(c)] == pytest.approx(1000 * c / plain_ms(c))
    assert serving_costs.predict(choice, "ngram", accepted, drafted, [1]) is None  # nothing measured for it


def test_the_issue_28_draft_model_loses_and_ships_nothing(tmp_path):
    """vLLM's draft-model path at ~3 ms per drafted token on a target whose plain step is 2.45 ms: vLLM accepts
    0.854 of drafted tokens at k=8 (the CPU estimate was right), and served decoding still got slower."""
    prof = serving_costs.CostProfile(
        name="p", gpu="h100", gpu_name="H100", vllm_version="0.26.0", target={"params": 10**9},
        plain_step_ms={"1": 2.45, "16": 2.6, "144": 4.0}, source="test",
        methods={"draft_model": serving_costs.MethodCost({}, {"1": 3.0, "16": 3.2}, {"1": 8, "16": 8}, {}, [8])})
    # P(at least j accepted) = 0.965^j gives about 0.854 accepted per drafted token at k = 8
    accepted = {str(k): sum(0.965 ** j for j in range(1, k + 1)) for k in range(1, 9)}
    assert accepted["8"] / 8 == pytest.approx(0.854, abs=0.02)
    pred = serving_costs.predict(serving_costs.Choice(prof, "test"), "draft_model", accepted,
                                 {str(k): float(k) for k in range(1, 9)}, [1, 16])
    assert max(pred.speedup_by_k["1"].values()) < 1.0 and max(pred.speedup_by_k["16"].values()) < 1.0
    summary = {"speculative_method": "draft_model", "num_speculative_tokens": pred.best_k["1"],
               "expected_speedup": pred.speedup(1, pred.best_k["1"]), "cost_profile": "p",
               "predicted_speedup_by_concurrency": {c: v[str(pred.best_k["1"])] for c, v in pred.speedup_by_k.items()}}
    d = decide(summary, None, 1, min_gain=1.1, declared={"throughput": 16})
    assert d.num_speculative_tokens == 0 and d.basis == "estimated" and "measured serving costs (p)" in d.reason


def shipped_summary(predicted: dict[str, float], expected: float = 1.8) -> dict:
    return {"speculative_method": "eagle3", "num_speculative_tokens": 3, "expected_speedup": expected,
            "cost_profile": "prof", "predicted_speedup_by_concurrency": predicted}


def test_speculation_ships_only_where_no_declared_tier_loses():
    ok = decide(shipped_summary({"1": 1.8, "64": 1.05}), None, 1, 1.1, declared={"throughput": 64})
    assert ok.num_speculative_tokens == 3 and ok.predicted == {"1": 1.8, "64": 1.05} and ok.profile == "prof"
    loses = decide(shipped_summary({"1": 1.8, "64": 0.7}), None, 1, 1.1, declared={"throughput": 64})
    assert loses.num_speculative_tokens == 0 and loses.candidate_k == 3
    assert "tier throughput at concurrency 64 is predicted x0.70, slower than plain decoding" in loses.reason
    unknown = decide(shipped_summary({"1": 1.8}), None, 1, 1.1, declared={"batch": 128})
    assert unknown.num_speculative_tokens == 0 and "not predicted" in unknown.reason
    none = decide({"speculative_method": "eagle3", "num_speculative_tokens": 3, "expected_speedup": None}, None, 1, 1.1)
    assert none.num_speculative_tokens == 0 and "no served speed was predicted" in none.reason


def test_a_tier_gets_the_shipped_method_only_where_it_is_predicted_to_pay():
    shipped = Speculation("eagle3", 3)
    predicted = {"1": 1.8, "8": 1.3, "64": 1.02}
    fast = tier_speculation(Tier("mid", concurrency=8), shipped, 1, None, 1.1, predicted)
    assert fast[0] == shipped and "predicted x1.30 at concurrency 8" in fast[1]
    slow = tier_speculation(Tier("throughput", concurrency=64), shipped, 1, None, 1.1, predicted)
    assert not slow[0].enabled and "below serving.speculation.min_gain" in slow[1]
    blind = tier_speculation(Tier("big", concurrency=128), shipped, 1, None, 1.1, predicted)
    assert not blind[0].enabled and "not measured or predicted" in blind[1]


def test_choosing_a_profile(tmp_path, profile):
    d = tmp_path / "profiles"
    d.mkdir()
    small = serving_costs.CostProfile(**{**profile.__dict__, "name": "small", "target": {"params": 10**8}})
    big = serving_costs.CostProfile(**{**profile.__dict__, "name": "big", "target": {"params": 8 * 10**9}})
    old = serving_costs.CostProfile(**{**profile.__dict__, "name": "old", "vllm_version": "0.25.0",
                                       "target": {"params": 10**9}})
    for p in (small, big, old):
        serving_costs.write(p, d / f"{p.name}.json")
    pick = serving_costs.choose("auto", None, 2 * 10**9, d)
    assert pick.profile.name == "big" and pick.target_params_ratio == pytest.approx(0.25)
    assert "serving.gpu is null" in pick.reason  # another vLLM's costs are never used, however near its target
    assert serving_costs.choose("auto", "h100", 3 * 10**8, d).profile.name == "small"
    none = serving_costs.choose("auto", "a10g", 10**9, d)
    assert none.profile is None and "no serving-cost profile measured on a10g with vLLM 0.26.0" in none.reason
    assert serving_costs.choose("small", "a10g", 10**9, d).profile.name == "small"
    with pytest.raises(PipelineError, match="no profile named 'nope'"):
        serving_costs.choose("nope", None, 10**9, d)
    bad = d / "bad.json"
    bad.write_text(json.dumps({**json.loads((d / "small.json").read_text()), "plain_step_ms": {"1": -1}}))
    with pytest.raises(PipelineError, match="bad.json: plain_step_ms must hold positive"):
        serving_costs.choose(str(bad), None, 10**9, d)


def test_llama_params_counts_a_real_model(demo_pair):
    """The parameter count profiles are matched on equals transformers' own count for a real model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    target = demo_pair[0]
    model = AutoModelForCausalLM.from_pretrained(target)
    cfg = AutoConfig.from_pretrained(target).to_dict()
    assert serving_costs.llama_params(cfg) == model.num_parameters()


def test_committed_profiles_are_the_assembly_of_committed_raw_output():
    """Every profile the pipeline ships is exactly what `python -m pipeline.serving_costs assemble` makes of the
    raw files under benchmarks/gpu/raw/costs/ (the command is in the profile's source field)."""
    root = Path(__file__).resolve().parents[1]
    profiles = serving_costs.available()
    for prof in profiles:
        raw_dir = root / prof.source.split(" ")[0]
        shape = root / "benchmarks/gpu/raw/costs/shapes" / raw_dir.name
        again = serving_costs.assemble(raw_dir, shape, prof.name, prof.gpu, prof.source)
        assert again == prof, prof.name
        assert all(v > 0 and math.isfinite(v) for v in prof.plain_step_ms.values())
