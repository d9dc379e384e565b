"""Served speed predicted from measured serving costs: fitting a cost profile from the GPU script's raw
output, choosing the profile for a build, predicting per concurrency and k, and the rule
that ships speculation without a GPU measurement only where the prediction holds and pays.

The raw files here are generated from a known cost model (plain step time linear in tokens, a drafter
cost per drafted token rising with batch size) in the layout benchmarks/gpu/measure_costs.py writes; what is
under test is that the pipeline's fit recovers that model and decides from it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval_helpers import eval_summary
from pipeline.core.errors import PipelineError
from pipeline.drafts.methods import Speculation
from pipeline.evaluate import serving_costs
from pipeline.evaluate.summary import EvalSummary
from pipeline.release.decision import speculation_for as decide, tier_speculation
from pipeline.serving.tiers import Tier

TARGET = {
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
}
DRAFT = {**TARGET, "num_hidden_layers": 1}
BATCHES, SPEC_BATCHES, KS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], [1, 4, 8, 16, 32, 64], [2, 8]
SHORT, LONG = 32, 288


def plain_ms(tokens: float) -> float:
    return 2.0 + 0.01 * tokens


def draft_ms(batch: float) -> float:
    return 3.0 + 0.02 * batch


def spec_ms(batch: float, k: float) -> float:
    """The generating model: the verify pass over batch * (1 + k) tokens plus k drafted tokens."""
    return plain_ms(batch * (1 + k)) + k * draft_ms(batch)


def run(batch: int, n: int, k: int, accepted_per_step: float = 0.0, slower: float = 1.0) -> dict:
    """One timed generation of n tokens per request, as measure_costs.timed records it. With accepted drafts the
    last step overshoots max_tokens, and vLLM counts those accepted tokens too."""
    if k == 0:
        return {"wall_s": 0.05 + n * plain_ms(batch) / 1000, "tokens": batch * n}
    steps = math.ceil(n / (1 + accepted_per_step))
    overshoot = steps * (1 + accepted_per_step) - n
    return {
        "wall_s": 0.05 + steps * spec_ms(batch, k) * slower / 1000,
        "tokens": batch * n,
        "num_drafts": batch * steps,
        "num_draft_tokens": batch * steps * k,
        "num_accepted_tokens": batch * (n + overshoot - steps),
    }


def write_run(root: Path, methods=("draft_model", "eagle3"), ks=KS, accepted=None, slower=None) -> Path:
    """One measure_costs.py output folder (lease) for the shape `toy`; returns OUT/toy."""
    raw = root / "toy"
    raw.mkdir(parents=True)
    (root / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB\n")
    (root / "versions.txt").write_text("vllm 0.26.0 torch 2.11.0+cu130\n")
    (raw / "plain-k0.json").write_text(
        json.dumps(
            {
                "method": "plain",
                "k": 0,
                "runs": [{"batch": b, "short": run(b, SHORT, 0), "long": run(b, LONG, 0)} for b in BATCHES],
            }
        )
    )
    for m in methods:
        a = (accepted or {}).get(m, 0.0)
        for k in ks:
            x = (slower or {}).get((m, k), 1.0)
            (raw / f"{m}-k{k}.json").write_text(
                json.dumps(
                    {
                        "method": m,
                        "k": k,
                        "runs": [
                            {"batch": b, "short": [run(b, SHORT, k, a, x)] * 2, "long": [run(b, LONG, k, a, x)] * 2}
                            for b in SPEC_BATCHES
                        ],
                    }
                )
            )
    (raw / "ngram-k2.failed.json").write_text(json.dumps({"method": "ngram", "k": 2, "rc": 1, "error": "x"}))
    return raw


def shape_dir(root: Path) -> Path:
    shape = root / "shapes" / "toy"
    for role, cfg in (("target", TARGET), ("draft", DRAFT)):
        (shape / role).mkdir(parents=True, exist_ok=True)
        (shape / role / "config.json").write_text(json.dumps(cfg))
    return shape


@pytest.fixture
def profile(tmp_path) -> serving_costs.CostProfile:
    raw = write_run(tmp_path / "lease-1")
    return serving_costs.assemble([raw], shape_dir(tmp_path), "h100-vllm0.26.0-toy", "h100")


def test_the_measured_steps_are_recovered_whatever_the_drafts_acceptance(profile):
    assert profile.gpu_name == "NVIDIA H100 80GB HBM3" and profile.vllm_version == "0.26.0"
    assert profile.target["params"] == serving_costs.llama_params(TARGET)
    for b in BATCHES:
        assert profile.plain_step_ms[str(b)] == pytest.approx(plain_ms(b), rel=1e-9)
    assert set(profile.methods) == {"draft_model", "eagle3"}  # a failed engine's record is not a measurement
    cost = profile.methods["draft_model"]
    assert list(cost.step_ms) == ["2", "8"] and cost.drafter["num_hidden_layers"] == 1
    for k in KS:
        assert cost.drafted_per_step[str(k)] == pytest.approx(k)
        for b in SPEC_BATCHES:
            assert cost.step_ms[str(k)][str(b)] == pytest.approx(spec_ms(b, k), rel=1e-9)
    for b in (1, 3, 8, 40, 64):  # between the measured k and batch sizes: linear, as the generating model is
        for k in (1, 2, 4.5, 8):
            assert cost.spec_ms(b, k) == pytest.approx(spec_ms(b, k), rel=1e-9)


def test_all_accepted_lookups_are_counted_by_their_drafts_not_their_tokens(tmp_path):
    """n-gram lookups on random weights' repetitive output are all accepted: each step makes k + 1 tokens and the
    last one overshoots max_tokens, whose accepted tokens vLLM counts too. Counting steps by num_drafts recovers
    the step time exactly; counting tokens less accepted ones would not."""
    raw = write_run(tmp_path / "lease-1", methods=("ngram",), accepted={"ngram": 8.0}, ks=[8])
    prof = serving_costs.assemble([raw], shape_dir(tmp_path), "p", "h100")
    assert prof.methods["ngram"].drafted_per_step["8"] == pytest.approx(8)
    for b in SPEC_BATCHES:
        assert prof.methods["ngram"].step_ms["8"][str(b)] == pytest.approx(spec_ms(b, 8), rel=1e-9)


def test_a_plain_step_that_reads_faster_at_a_larger_batch_is_pooled_with_its_neighbour(tmp_path):
    raw = write_run(tmp_path / "lease-1")
    rec = json.loads((raw / "plain-k0.json").read_text())
    slow = next(r for r in rec["runs"] if r["batch"] == 4)
    slow["long"]["wall_s"] += 0.05 * (LONG - SHORT) / 1000  # batch 4 reads 0.05 ms slow, above batch 8's step
    (raw / "plain-k0.json").write_text(json.dumps(rec))
    prof = serving_costs.assemble([raw], shape_dir(tmp_path), "p", "h100")
    assert prof.plain_step_ms_measured["4"] == pytest.approx(plain_ms(4) + 0.05)
    pooled = (plain_ms(4) + 0.05 + plain_ms(8)) / 2
    assert prof.plain_step_ms["4"] == pytest.approx(pooled) and prof.plain_step_ms["8"] == pytest.approx(pooled)
    assert prof.plain_step_ms["16"] == pytest.approx(plain_ms(16))
    assert list(prof.plain_step_ms) == [str(b) for b in BATCHES]


def test_a_step_that_is_not_linear_in_k_shows_in_the_interpolation_error(tmp_path):
    raw = write_run(tmp_path / "lease-1", ks=[2, 4, 8], slower={("draft_model", 4): 1.2})
    prof = serving_costs.assemble([raw], shape_dir(tmp_path), "p", "h100")
    assert all(e == pytest.approx(1 - 1 / 1.2) for e in prof.methods["draft_model"].interpolation_error.values())
    assert all(e < 1e-9 for e in prof.methods["eagle3"].interpolation_error.values())


def test_each_method_is_taken_with_the_plain_steps_of_its_own_run(tmp_path):
    """A later lease re-measures one method: its steps are compared with that lease's plain decoding (ratios
    within one run), the other methods keep theirs."""
    first = write_run(tmp_path / "lease-1")
    second = write_run(tmp_path / "lease-2", methods=("eagle3",), slower={("eagle3", 2): 2.0, ("eagle3", 8): 2.0})
    rec = json.loads((second / "plain-k0.json").read_text())
    for r in rec["runs"]:  # that lease's machine is twice as slow at everything
        for key in ("short", "long"):
            r[key]["wall_s"] = 0.05 + (r[key]["wall_s"] - 0.05) * 2
    (second / "plain-k0.json").write_text(json.dumps(rec))
    prof = serving_costs.assemble([first, second], shape_dir(tmp_path), "p", "h100")
    assert prof.methods["eagle3"].run.endswith("lease-2/toy")
    assert prof.methods["draft_model"].run.endswith("lease-1/toy")
    for m in ("eagle3", "draft_model"):
        assert prof.speedup(m, 8, 4.0, 4) == pytest.approx(4.0 * plain_ms(8) / spec_ms(8, 4), rel=1e-9)
    assert prof.plain_step_ms["8"] == pytest.approx(2 * plain_ms(8))  # the newest run's, for plain tokens/s


def test_prediction_is_response_tokens_per_step_times_the_measured_step_ratio(profile):
    tokens = {"2": 2.6, "4": 3.8, "8": 5.2}  # the CPU estimate's response tokens per step at each k
    drafted = {"2": 2.0, "4": 4.0, "8": 8.0}
    choice = serving_costs.Choice(profile, "test", 1.0)
    pred = serving_costs.predict(choice, "draft_model", tokens, drafted, [1, 8, 64])
    for c in (1, 8, 64):
        for k in (2, 4, 8):
            want = tokens[str(k)] * plain_ms(c) / spec_ms(c, k)
            assert pred.speedup(c, k) == pytest.approx(want, rel=1e-9)
        assert pred.best_k[str(c)] == max((2, 4, 8), key=lambda k: pred.speedup(c, k))
        assert pred.plain_tokens_per_s[str(c)] == pytest.approx(1000 * c / plain_ms(c))
    assert serving_costs.predict(choice, "ngram", tokens, drafted, [1]) is None  # nothing measured for it


def test_a_draft_model_slower_than_plain_decoding_ships_nothing(tmp_path):
    """Issue #28's numbers: a speculative step of 29.8 ms at k = 8 on a target whose plain step is 2.45 ms; vLLM
    accepts 0.854 of drafted tokens (the CPU estimate was right), and served decoding still got slower."""
    plain = {"1": 2.45, "16": 2.6}
    prof = serving_costs.CostProfile(
        name="p",
        gpu="h100",
        gpu_name="H100",
        vllm_version="0.26.0",
        target={"params": 10**9},
        plain_step_ms=plain,
        runs=["test"],
        methods={
            "draft_model": serving_costs.MethodCost(
                run="test",
                drafter={},
                plain_step_ms=plain,
                step_ms={"8": {"1": 29.8, "16": 33.0}},
                step_ms_measured={},
                drafted_per_step={"8": 8.0},
            )
        },
    )
    # P(at least j accepted) = 0.965^j gives about 0.854 accepted per drafted token at k = 8
    accepted = {str(k): sum(0.965**j for j in range(1, k + 1)) for k in range(1, 9)}
    assert accepted["8"] / 8 == pytest.approx(0.854, abs=0.02)
    tokens = {k: 1 + a for k, a in accepted.items()}  # a long answer: every step's tokens count
    pred = serving_costs.predict(
        serving_costs.Choice(prof, "test"), "draft_model", tokens, {str(k): float(k) for k in range(1, 9)}, [1, 16]
    )
    assert max(pred.speedup_by_k["1"].values()) < 1.0 and max(pred.speedup_by_k["16"].values()) < 1.0
    summary = eval_summary(
        {
            "estimated_method": "draft_model",
            "estimated_num_speculative_tokens": pred.best_k["1"],
            "estimated_speedup": pred.speedup(1, pred.best_k["1"]),
            "cost_profile": "p",
            "estimated_speedup_by_concurrency": [
                {"concurrency": int(c), "speedup": v[str(pred.best_k["1"])]} for c, v in pred.speedup_by_k.items()
            ],
        }
    )
    d = decide(summary, None, 1, min_gain=1.1, max_num_seqs=1)
    assert d.num_speculative_tokens == 0 and d.basis == "estimated" and "measured serving costs (p)" in d.reason


def shipped_summary(predicted: dict[str, float], expected: float = 1.8) -> EvalSummary:
    return eval_summary(
        {
            "estimated_method": "eagle3",
            "estimated_num_speculative_tokens": 3,
            "estimated_speedup": expected,
            "cost_profile": "prof",
            "estimated_speedup_by_concurrency": [{"concurrency": int(c), "speedup": x} for c, x in predicted.items()],
        }
    )


def test_a_prediction_ships_only_in_a_config_that_serves_one_request_at_a_time():
    """Lockstep cost profiles are what a server sees with one request; with several, prefills mix into the
    speculative steps (issue #28: x0.39 at concurrency 16 where lockstep predicts a gain)."""
    ok = decide(shipped_summary({"1": 1.8, "64": 1.5}), None, 1, 1.1, max_num_seqs=1)
    assert ok.num_speculative_tokens == 3 and ok.predicted == {"1": 1.8, "64": 1.5} and ok.profile == "prof"
    batched = decide(shipped_summary({"1": 1.8, "64": 1.5}), None, 1, 1.1, max_num_seqs=64)
    assert batched.num_speculative_tokens == 0 and batched.candidate_k == 3
    assert "serves up to 64 requests at once (serving.max_num_seqs)" in batched.reason
    assert "prefills mix into the speculative steps" in batched.reason
    busy = decide(shipped_summary({"8": 1.8}, expected=1.8), None, 8, 1.1, max_num_seqs=1)
    assert busy.num_speculative_tokens == 0
    slow = decide(shipped_summary({"1": 1.05}, expected=1.05), None, 1, 1.1, max_num_seqs=1)
    assert slow.num_speculative_tokens == 0 and "below serving.speculation.min_gain 1.1" in slow.reason
    none = decide(
        eval_summary({"estimated_method": "eagle3", "estimated_num_speculative_tokens": 3, "estimated_speedup": None}),
        None,
        1,
        1.1,
    )
    assert none.num_speculative_tokens == 0 and "no served speed was predicted" in none.reason


def test_a_tier_gets_a_predicted_method_only_if_it_serves_one_request_at_a_time():
    shipped = Speculation("eagle3", 3)
    predicted = {"1": 1.8, "8": 1.3, "64": 1.02}
    one = tier_speculation(Tier("latency", concurrency=1), shipped, 1, None, 1.1, predicted, max_num_seqs=1)
    assert one[0] == shipped and "predicted x1.80 at concurrency 1, one request at a time" in one[1]
    for tier, seqs in ((Tier("latency", concurrency=1), 16), (Tier("mid", concurrency=8), 1)):
        chosen, why = tier_speculation(tier, shipped, 1, None, 1.1, predicted, max_num_seqs=seqs)
        assert not chosen.enabled and "prefills mix into the speculative steps" in why


def test_choosing_a_profile(tmp_path, profile):
    d = tmp_path / "profiles"
    d.mkdir()
    small = serving_costs.CostProfile(**{**profile.__dict__, "name": "small", "target": {"params": 10**8}})
    big = serving_costs.CostProfile(**{**profile.__dict__, "name": "big", "target": {"params": 8 * 10**9}})
    old = serving_costs.CostProfile(
        **{**profile.__dict__, "name": "old", "vllm_version": "0.25.0", "target": {"params": 10**9}}
    )
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
    """Every profile the pipeline ships is exactly what `python -m pipeline.evaluate.serving_costs assemble` (run by
    benchmarks/gpu/costs.sh) makes of the raw files under benchmarks/gpu/raw/costs/ its `runs` name, then `calibrate`
    with the served records its methods name."""
    root = Path(__file__).resolve().parents[2]
    profiles = serving_costs.available()
    for prof in profiles:
        runs = [Path(r) for r in prof.runs]
        assert all(not r.is_absolute() and (root / r).is_dir() for r in runs), prof.runs
        shape = root / "benchmarks/gpu/raw/costs/shapes" / runs[0].name
        import os

        cwd = os.getcwd()
        try:
            os.chdir(root)  # the profile names its runs relative to the project root, as costs.sh runs
            again = serving_costs.assemble(runs, shape, prof.name, prof.gpu)
            # the records its methods name, in order, each with the n-gram estimate read beside it (costs.sh's order)
            runs = list(dict.fromkeys(r for m in prof.methods.values() for r in m.served_runs))
            estimates = {r: e for m in prof.methods.values() for r, e in m.served_estimates.items()}
            served = []
            for r in runs:
                estimate = estimates.get(r)
                served.append(
                    serving_costs.ServedRun(
                        json.loads(Path(r).read_text()),
                        r,
                        json.loads(Path(estimate).read_text()) if estimate else None,
                        estimate,
                    )
                )
            if served:
                again = serving_costs.calibrate(again, served)
        finally:
            os.chdir(cwd)
        assert again == prof, prof.name
        assert all(v > 0 and math.isfinite(v) for v in prof.plain_step_ms.values())


def test_the_gpu_scripts_heads_read_the_layers_the_pipelines_heads_read():
    """measure_costs.py runs on the GPU host without the pipeline package; its EAGLE-3 shapes must still be the
    heads the eagle3 stage would train (a repeated layer made vLLM refuse the demo-shape head)."""
    import importlib.util

    from pipeline.drafts.eagle3 import aux_layer_ids

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("measure_costs", root / "benchmarks/gpu/measure_costs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for shape in script.SHAPES.values():
        n = shape["target"]["num_hidden_layers"]
        assert script.eagle3_config(shape["target"])["eagle_aux_hidden_state_layer_ids"] == aux_layer_ids("auto", n)


def test_a_short_answer_pays_for_the_drafting_in_its_prefill_step(profile):
    """N verification steps make R * N tokens after the prefill's; plain decoding takes that many steps of T, and
    speculation N steps of S plus the k tokens drafted in the prefill step (S - T): a short answer gains less."""
    for n, c in ((2.0, 1), (6.0, 8), (1000.0, 32)):
        want = 5.0 * n * plain_ms(c) / ((n + 1) * spec_ms(c, 8) - plain_ms(c))
        assert profile.speedup("draft_model", c, 5.0, 8, n) == pytest.approx(want, rel=1e-9)
    long = profile.speedup("draft_model", 8, 5.0, 8, 1e9)
    assert long == pytest.approx(profile.speedup("draft_model", 8, 5.0, 8), rel=1e-6)  # the long-answer limit
    assert profile.speedup("draft_model", 8, 5.0, 8, 2.0) < long


def test_costs_md_is_the_rendering_of_the_committed_raw_files():
    """benchmarks/gpu/COSTS.md: the profiles' tables and the served check from raw/costs and the committed profiles
    (benchmarks/tables/costs.py through benchmarks/render.py)."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_render", root / "benchmarks/render.py")
    render = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = render  # dataclasses look their module up there
    spec.loader.exec_module(render)
    out = render.render(root / "benchmarks/gpu/COSTS.md")
    assert out == (root / "benchmarks/gpu/COSTS.md").read_text()


def served_level(
    c: int, tokens_per_s: float, mal: float | None = None, accepted: float | None = None, failed: int = 0
) -> dict:
    return {
        "concurrency": c,
        "output_throughput": tokens_per_s,
        "mean_acceptance_length": mal,
        "accepted_per_draft_token": accepted,
        "failed": failed,
    }


def test_a_served_run_scales_model_drafters_step_costs_to_what_vllm_served(profile):
    """A served run whose EAGLE-3 step costs twice the profile's (and the draft model's 0.8 of it) at the drafted
    tokens vLLM reported: after calibration the profile predicts exactly the served speedup from the served tokens
    per step; n-gram (drafting on some steps only) and failed levels are left alone."""
    k, acc = 8, 0.75
    mal = 1 + acc * k
    levels = {"plain": {}, "eagle3": {}, "draft_model": {}, "ngram": {}}
    for c in (1, 8, 32):
        plain_tps = 1000 * c / plain_ms(c)
        levels["plain"][f"c{c}"] = served_level(c, plain_tps)
        for method, factor in (("eagle3", 2.0), ("draft_model", 0.8)):
            levels[method][f"c{c}"] = served_level(c, 1000 * c * mal / (spec_ms(c, k) * factor), mal, acc)
        levels["ngram"][f"c{c}"] = served_level(c, plain_tps * 0.8, 2.0, 0.3)
    levels["draft_model"]["c32"]["failed"] = 3
    record = {
        "configs": {
            name: {"num_speculative_tokens": 0 if name == "plain" else k, "levels": lv} for name, lv in levels.items()
        }
    }
    prof = profile.__class__(**{**profile.__dict__, "methods": {**profile.methods, "ngram": profile.methods["eagle3"]}})
    calibrated = serving_costs.calibrate(prof, [serving_costs.ServedRun(record, "raw/record.json")])
    eagle, draft = calibrated.methods["eagle3"], calibrated.methods["draft_model"]
    assert eagle.served_runs == ["raw/record.json"]
    assert eagle.served_scale == pytest.approx({"1": 2.0, "8": 2.0, "32": 2.0})
    assert draft.served_scale == pytest.approx({"1": 0.8, "8": 0.8})  # c=32 failed requests: not a measurement
    assert calibrated.methods["ngram"].served_scale == {}
    choice = serving_costs.Choice(calibrated, "test", 1.0)
    pred = serving_costs.predict(choice, "eagle3", {str(k): mal}, {str(k): float(k)}, [1, 8, 32])
    for c in (1, 8, 32):
        served = levels["eagle3"][f"c{c}"]["output_throughput"] / levels["plain"][f"c{c}"]["output_throughput"]
        assert pred.speedup(c, k) == pytest.approx(served, rel=1e-9)
    assert "scaled by a served run (raw/record.json)" in pred.basis
    uncalibrated = serving_costs.predict(
        serving_costs.Choice(profile, "test", 1.0), "eagle3", {str(k): mal}, {str(k): float(k)}, [1]
    )
    assert uncalibrated.speedup(1, k) == pytest.approx(2 * pred.speedup(1, k), rel=1e-9)
    assert "not calibrated" in uncalibrated.basis
    assert calibrated.uncalibrated() == prof  # the served calibration removed: the step timings alone


def test_ngram_is_calibrated_with_the_cpu_estimates_tokens_per_step(profile):
    """n-gram drafts on some steps only, so the served record alone does not give its tokens per step: with the
    variant's CPU estimate (tokens and drafted tokens per step at the served k) the calibrated profile predicts the
    served n-gram speedup exactly where it was served (slower than plain decoding here); a level whose requests failed
    is not a measurement."""
    k = 4
    estimate = {"tokens_per_step_by_k": {"2": 1.4, "4": 1.6}, "drafted_per_step_by_k": {"2": 0.6, "4": 1.0}}
    levels = {"plain": {}, "ngram": {}}
    for c in (1, 8, 32):
        plain_tps = 1000 * c / plain_ms(c)
        levels["plain"][f"c{c}"] = served_level(c, plain_tps)
        levels["ngram"][f"c{c}"] = served_level(c, plain_tps * 0.6, 3.4, 0.6)
    levels["ngram"]["c32"]["failed"] = 1
    record = {
        "configs": {
            name: {"num_speculative_tokens": 0 if name == "plain" else k, "levels": lv} for name, lv in levels.items()
        }
    }
    prof = profile.__class__(**{**profile.__dict__, "methods": {**profile.methods, "ngram": profile.methods["eagle3"]}})
    bare = serving_costs.predict(
        serving_costs.Choice(prof, "test", 1.0),
        "ngram",
        estimate["tokens_per_step_by_k"],
        estimate["drafted_per_step_by_k"],
        [1],
    )
    assert bare.speedup(1, k) != pytest.approx(0.6, rel=0.05)  # the step timings alone predict something else
    calibrated = serving_costs.calibrate(
        prof, [serving_costs.ServedRun(record, "raw/record.json", estimate, "raw/speculative-ngram.json")]
    )
    ngram = calibrated.methods["ngram"]
    assert sorted(ngram.served_scale) == ["1", "8"]
    assert ngram.served_estimates == {"raw/record.json": "raw/speculative-ngram.json"}
    pred = serving_costs.predict(
        serving_costs.Choice(calibrated, "test", 1.0),
        "ngram",
        estimate["tokens_per_step_by_k"],
        estimate["drafted_per_step_by_k"],
        [1, 8],
    )
    for c in (1, 8):
        assert pred.speedup(c, k) == pytest.approx(0.6, rel=1e-9)
    assert (
        serving_costs.calibrate(prof, [serving_costs.ServedRun(record, "raw/record.json")])
        .methods["ngram"]
        .served_scale
        == {}
    )
    assert calibrated.uncalibrated() == prof


def eagle_record(factor_by_c: dict[int, float], k: int = 8, acc: float = 0.75, failed_at: int | None = None) -> dict:
    """A served record whose EAGLE-3 step costs factor x the profile's S at each concurrency."""
    mal = 1 + acc * k
    plain = {f"c{c}": served_level(c, 1000 * c / plain_ms(c)) for c in factor_by_c}
    eagle = {f"c{c}": served_level(c, 1000 * c * mal / (spec_ms(c, k) * f), mal, acc) for c, f in factor_by_c.items()}
    if failed_at:
        eagle[f"c{failed_at}"]["failed"] = 2
    return {
        "configs": {
            "plain": {"num_speculative_tokens": 0, "levels": plain},
            "eagle3": {"num_speculative_tokens": k, "levels": eagle},
        }
    }


def test_several_served_runs_pool_by_the_geometric_mean_at_each_concurrency(profile):
    """Two leases of one shape served EAGLE-3 at 2x and 0.5x the profile's step cost at c=1 and 8: pooled, the
    scale is their geometric mean (1.0); at c=32 the second run's requests failed, so the first run's 3.0 stands
    alone. Both runs are named; an earlier calibration does not leak into a new one."""
    first = serving_costs.ServedRun(eagle_record({1: 2.0, 8: 2.0, 32: 3.0}), "a/record.json")
    second = serving_costs.ServedRun(eagle_record({1: 0.5, 8: 0.5, 32: 0.5}, failed_at=32), "b/record.json")
    pooled = serving_costs.calibrate(profile, [first, second])
    eagle = pooled.methods["eagle3"]
    assert eagle.served_scale == pytest.approx({"1": 1.0, "8": 1.0, "32": 3.0})
    assert eagle.served_runs == ["a/record.json", "b/record.json"]
    assert pooled.methods["draft_model"] == profile.methods["draft_model"]  # neither run served it
    again = serving_costs.calibrate(serving_costs.calibrate(profile, [second]), [first])
    assert again.methods["eagle3"].served_scale == pytest.approx({"1": 2.0, "8": 2.0, "32": 3.0})
    pred = serving_costs.predict(serving_costs.Choice(pooled, "test", 1.0), "eagle3", {"8": 7.0}, {"8": 8.0}, [1])
    assert "scaled by served runs (a/record.json, b/record.json)" in pred.basis


def test_calibrate_pairs_each_ngram_estimate_with_the_record_before_it(tmp_path, profile, capsys):
    """The command line reads records and n-gram estimates by their content: each estimate belongs to the record
    before it; an estimate with no record before it is refused with one line naming it, and the profile is left
    as it was."""
    path = tmp_path / "profile.json"
    prof = profile.__class__(**{**profile.__dict__, "methods": {**profile.methods, "ngram": profile.methods["eagle3"]}})
    serving_costs.write(prof, path)
    estimate = {"tokens_per_step_by_k": {"8": 1.6}, "drafted_per_step_by_k": {"8": 1.0}}
    files = {}
    for name, data in (("a.json", eagle_record({1: 2.0})), ("est.json", estimate), ("b.json", eagle_record({1: 0.5}))):
        files[name] = tmp_path / name
        files[name].write_text(json.dumps(data))
    rec = json.loads(files["a.json"].read_text())
    rec["configs"]["ngram"] = {
        "num_speculative_tokens": 8,
        "levels": {"c1": served_level(1, 0.6 * 1000 / plain_ms(1), 3.0, 0.3)},
    }
    files["a.json"].write_text(json.dumps(rec))
    before = path.read_text()
    assert serving_costs.main(["calibrate", str(path), str(files["est.json"]), str(files["a.json"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(files["est.json"]) in err[0]
    assert path.read_text() == before
    assert (
        serving_costs.main(["calibrate", str(path), str(files["a.json"]), str(files["est.json"]), str(files["b.json"])])
        == 0
    )
    out = serving_costs.load(path)
    assert out.methods["eagle3"].served_runs == [files["a.json"].as_posix(), files["b.json"].as_posix()]
    assert out.methods["eagle3"].served_scale == pytest.approx({"1": 1.0})
    assert out.methods["ngram"].served_runs == [files["a.json"].as_posix()]
    assert out.methods["ngram"].served_estimates == {files["a.json"].as_posix(): files["est.json"].as_posix()}
