"""Speculative methods (draft.method): n-gram lookup and its estimate, the EAGLE-3 head (speculators' model,
trained here on the tiny demo target), the params checks, and the choice between methods."""
from __future__ import annotations

import json
import random
import sys
from collections import Counter

import numpy as np
import pytest
import torch
import yaml

from bundle_helpers import run_stage_in_process
from conftest import ROOT, copy_project, run, tiny_params
from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress
from pipeline.data.formatting import prompt_ids, row_to_messages, split_prompt_response
from pipeline.drafts import eagle3, methods, ngram
from pipeline.drafts.settings import Eagle3Params
from pipeline.evaluate import acceptance
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.release.speculation_choice import decide
from pipeline.serving.bench_record import PLAIN, SPECULATIVE, LoadLevel, ServeBenchRecord, ServeConfigResult

# ---- n-gram


def vllm_kmp_propose(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM 0.25's _find_longest_matched_ngram_and_propose_tokens (vllm/v1/spec_decode/ngram_proposer.py),
    transcribed as the oracle: KMP over the reversed tokens, longest match <= max_n, earliest occurrence."""
    total = len(tokens)
    if total < min_n:
        return []
    rev = np.array(tokens[::-1])
    lps = np.zeros(max_n, dtype=np.int32)
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)]


def test_ngram_proposals_are_vllms():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        lo = rng.randrange(1, 4)
        hi = rng.randrange(lo, 6)
        k = rng.randrange(1, 6)
        assert ngram.propose(tokens, k, lo, hi) == vllm_kmp_propose(tokens, lo, hi, k), (tokens, lo, hi, k)


@pytest.fixture(scope="module")
def target(demo_pair):
    return load_causal_lm(demo_pair[0])


@pytest.fixture(scope="module")
def prompts(demo_pair):
    tokenizer = load_tokenizer(demo_pair[0])
    lines = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:4]
    return [prompt_ids(tokenizer, split_prompt_response(row_to_messages(json.loads(line)))[0]) for line in lines]


def simulated_ngram_loop(target, prompt, n_tokens, k, lo, hi):
    """Greedy decoding with prompt-lookup speculation, step by step: (accepted, drafted, steps)."""
    cont, end = acceptance.target_continuation(target, prompt, n_tokens, 0.0, acceptance.stop_token_ids(target),
                                               overrun=k - 1)
    accepted = drafted = steps = 0
    t = 1  # the prefill samples token 0; lookups start after it
    while t < end:
        proposal = ngram.propose(prompt + cont[:t], k, lo, hi)[: len(cont) - t]
        j = 0
        while j < len(proposal) and proposal[j] == cont[t + j]:
            j += 1
        accepted, drafted, steps = accepted + j, drafted + len(proposal), steps + 1
        t += j + 1
    return accepted, drafted, steps


def test_ngram_estimate_is_the_greedy_loop(target, prompts):
    """At temperature 0 prompt lookup is deterministic, so the estimate must equal the real loop exactly:
    accepted and drafted tokens per decoding step, at the k the estimate chose (per prompt: pooled over
    prompts the loop weighs long answers more than the estimate's per-sequence schedule does)."""
    lo, hi, drafted = 1, 3, 0
    for prompt in prompts:
        est = acceptance.estimate_method(target, ngram.scorer(target, 0.0, lo, hi), [prompt], 24, 0.0, 4, 0.0, "ngram")
        accepted, drafts, steps = simulated_ngram_loop(target, prompt, 24, est.num_speculative_tokens, lo, hi)
        assert est.expected_accepted_tokens == pytest.approx(accepted / steps)
        assert est.drafted_tokens_per_step == pytest.approx(drafts / steps)
        drafted += drafts
    assert drafted > 0  # the prompts gave the lookup something to propose


# ---- EAGLE-3


def train_head(tmp_path_factory, demo_pair, target, **cfg_overrides):
    """A head trained for a few steps on the tiny target's own greedy answers, saved as the stage saves it."""
    tokenizer = load_tokenizer(demo_pair[0])
    rows = []
    for line in (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:24]:
        prompt = prompt_ids(tokenizer, split_prompt_response(row_to_messages(json.loads(line)))[0])
        cont, end = acceptance.target_continuation(target, prompt, 16, 0.0, acceptance.stop_token_ids(target))
        rows.append({"input_ids": prompt + cont[:end], "labels": [-100] * len(prompt) + cont[:end]})
    cfg = Eagle3Params.parse(dict(yaml.safe_load((ROOT / "params.yaml").read_text())["draft"]["eagle3"],
                                  train_steps=12, batch_size=4, **cfg_overrides))
    layers = eagle3.aux_layer_ids("auto", target.config.num_hidden_layers)
    counts = Counter(t for r in rows for t, label in zip(r["input_ids"], r["labels"]) if label != -100)
    head = eagle3.build_head(demo_pair[0], cfg, layers, counts)
    result = eagle3.train(head, eagle3.TargetFeatures(target, layers), rows, cfg, "cpu", progress)
    assert result["curve"][-1]["loss"] < result["curve"][0]["loss"]  # it learned something
    out = tmp_path_factory.mktemp("eagle3") / "model"
    eagle3.save(head, out, demo_pair[0])
    return out


def test_two_builds_of_the_head_from_the_same_inputs_are_identical(demo_pair, target):
    """Issue #32's determinism: the head's layers are initialised from draft.eagle3.seed, not from whatever the
    global RNG holds, so two fresh builds train the same head (before, one build's final loss was 0.328, the
    next one's 0.193)."""
    cfg = Eagle3Params.parse(yaml.safe_load((ROOT / "params.yaml").read_text())["draft"]["eagle3"])
    layers = eagle3.aux_layer_ids("auto", target.config.num_hidden_layers)
    torch.manual_seed(1)
    first = eagle3.build_head(demo_pair[0], cfg, layers, Counter()).state_dict()
    torch.manual_seed(2)  # another global state, as another process or stage order leaves it
    second = eagle3.build_head(demo_pair[0], cfg, layers, Counter()).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, demo_pair, target):
    return train_head(tmp_path_factory, demo_pair, target)


def test_a_reduced_draft_vocabulary_maps_back_to_the_targets(tmp_path_factory, demo_pair, target, prompts):
    """draft_vocab_size: the head scores only the answers' most frequent tokens (speculators' d2t/t2d), and
    its logits come back in the target's vocabulary, -inf outside the kept tokens."""
    small = train_head(tmp_path_factory, demo_pair, target, draft_vocab_size=64)
    config = json.loads((small / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["transformer_layer_config"]["vocab_size"] == target.config.vocab_size
    head = eagle3.load(small)
    assert head.d2t is not None and int(head.t2d.sum()) == 64
    features = eagle3.TargetFeatures(target, head.config.eagle_aux_hidden_state_layer_ids)
    depths, _ = eagle3.draft_logits(head, features, prompts[0], 2)
    kept = torch.isfinite(depths[0][0])
    assert depths[0].shape[-1] == target.config.vocab_size and int(kept.sum()) == 64
    assert torch.equal(kept, head.t2d.bool())  # the finite logits are exactly the kept target tokens


def test_head_is_saved_in_the_format_vllm_loads_for_eagle3(head_dir, target, demo_pair):
    from safetensors import safe_open

    config = json.loads((head_dir / "config.json").read_text())
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:  # the target checkpoint's dtype, not fp32
        assert {f.get_tensor(n).dtype for n in f.keys()} == {eagle3.checkpoint_dtype(demo_pair[0])}
    assert config["speculators_model_type"] == "eagle3"  # vLLM's speculators-format detection
    assert config["speculators_config"]["verifier"]["name_or_path"] == "./model"  # no build-machine path
    assert config["eagle_aux_hidden_state_layer_ids"] == sorted(config["eagle_aux_hidden_state_layer_ids"])
    assert config["transformer_layer_config"]["hidden_size"] == target.config.hidden_size
    eagle3.check_compatible(head_dir, target.config.to_dict())
    head = eagle3.load(head_dir)  # the saved weights, every one of them, back in the head that scores
    state = head.state_dict()
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        for name in f.keys():
            assert torch.equal(state[name].to(f.get_tensor(name).dtype), f.get_tensor(name)), name


@pytest.mark.parametrize("change,says", [({"hidden_size": 256}, "hidden size"), ({"vocab_size": 7}, "vocabulary"),
                                         ({"num_hidden_layers": 1}, "aux layers")])
def test_a_head_for_another_target_is_refused_in_one_line(head_dir, target, change, says):
    with pytest.raises(PipelineError) as e:
        eagle3.check_compatible(head_dir, {**target.config.to_dict(), **change})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_each_depth_predicts_from_what_precedes_it(head_dir, target, prompts):
    """The estimator's teacher-forced pass gives, at depth s and position i, what drafting from position i
    gives when its s earlier drafts were right (the only case in which depth s is scored): it sees the
    target's states up to i and tokens up to i + 1 + s, nothing later. The alignment vLLM's drafting has."""
    head = eagle3.load(head_dir)
    features = eagle3.TargetFeatures(target, head.config.eagle_aux_hidden_state_layer_ids)
    ids = (prompts[0] + prompts[1])[:24]
    full, _ = eagle3.draft_logits(head, features, ids, 3)
    for i in (4, 11, len(ids) - 5):
        for depth in range(3):
            prefix, _ = eagle3.draft_logits(head, features, ids[: i + 2 + depth], 3)
            assert torch.allclose(prefix[depth][i], full[depth][i], atol=1e-4), (i, depth)


def test_eagle3_estimate_scores_the_head(head_dir, target, prompts, demo_pair):
    head = eagle3.load(head_dir)
    features = eagle3.TargetFeatures(target, head.config.eagle_aux_hidden_state_layer_ids)
    cost = eagle3.cost_ratio(head_dir, demo_pair[0])
    assert 0 < cost  # the head's weights but its embedding table, over the target's
    est = acceptance.estimate_method(target, eagle3.scorer(head, features, 0.0), prompts, 16, 0.0, 4, cost, "eagle3")
    assert est.method == "eagle3" and 1 <= est.num_speculative_tokens <= 4
    per_pos = est.accepted_per_position
    assert all(a >= b - 1e-9 for a, b in zip(per_pos, per_pos[1:]))  # P(at least j accepted) never rises
    assert est.accepted_per_draft_token == pytest.approx(sum(per_pos) / est.num_speculative_tokens)


def test_aux_layers_fail_before_training():
    with pytest.raises(PipelineError, match="too shallow"):
        eagle3.aux_layer_ids("auto", 2)
    with pytest.raises(PipelineError, match="the target has 4 layers"):
        eagle3.aux_layer_ids([0, 1, 4], 4)


# ---- params


@pytest.mark.parametrize("draft,says", [
    ({"method": "medusa"}, "draft.method: unknown method 'medusa'"),
    ({"method": []}, "draft.method must be"),
    ({"method": ["ngram", "ngram"]}, "lists a method twice"),
    ({"method": "ngram", "ngram": {"prompt_lookup_min": 4, "prompt_lookup_max": 2}}, "prompt_lookup_min (4) must be <="),
    ({"method": "ngram", "ngram": {"prompt_lookup_min": 0, "prompt_lookup_max": 2}}, "prompt_lookup_min must be"),
    ({"method": "eagle3", "eagle3": {"aux_layers": [1, 1, 2]}}, "three distinct target layer ids"),
    ({"method": "eagle3", "eagle3": {"ttt_steps": 0}}, "draft.eagle3.ttt_steps"),
])
def test_bad_method_settings_fail_at_load_in_one_line(tmp_path, draft, says):
    from pipeline.params.check import load_checked

    params = tiny_params(draft=draft)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError) as e:
        load_checked(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_speculative_configs_are_vllms():
    assert methods.speculative_config(methods.NONE) is None
    assert methods.speculative_config(methods.Speculation("eagle3", 5)) == {
        "method": "eagle3", "num_speculative_tokens": 5, "model": "./eagle3"}
    assert methods.speculative_config(methods.Speculation("ngram", 4), {"prompt_lookup_min": 2, "prompt_lookup_max": 5}) \
        == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


# ---- the choice


def served(configs: dict[str, tuple[int, float]]) -> ServeBenchRecord:
    """Output tokens/s at concurrency 1 per config name: (k, tokens/s)."""
    lat = {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    return ServeBenchRecord("v", gpu="g", vllm_version="0.25.0", configs={
        name: ServeConfigResult(k, 10.0, {"c1": LoadLevel(1, 8, 8, 0, 1.0, 8.0, tok_s, lat, lat, lat, lat)})
        for name, (k, tok_s) in configs.items()})


def test_the_fastest_measured_method_ships_whatever_the_estimate_said():
    """The GPU profile's situation: the estimate favoured the draft model, the served head was faster."""
    estimate = {"speculative_method": "draft_model", "num_speculative_tokens": 8, "expected_speedup": 5.7}
    d = decide(estimate, served({PLAIN: (0, 345.0), "draft_model": (8, 157.0), "eagle3": (7, 1002.0),
                                 "ngram": (6, 166.0)}), 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens, d.basis) == ("eagle3", 7, "measured")
    assert d.compared == pytest.approx({"draft_model": 157 / 345, "eagle3": 1002 / 345, "ngram": 166 / 345})
    slow = decide(estimate, served({PLAIN: (0, 345.0), "eagle3": (7, 360.0)}), 1, min_gain=1.1)
    assert slow.num_speculative_tokens == 0 and slow.candidate_k == 7  # 1.04x is below min_gain


def test_a_legacy_record_is_the_draft_models():
    d = decide({}, served({PLAIN: (0, 100.0), SPECULATIVE: (4, 200.0)}), 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens) == ("draft_model", 4)


def test_methods_vllm_could_not_serve_never_ship_on_their_estimate():
    """Plain decoding was served and every speculative config failed to start: the decision is a measured
    'none', whatever the CPU estimate promised (it would have shipped an unserved head)."""
    estimate = {"speculative_method": "eagle3", "num_speculative_tokens": 7, "expected_speedup": 5.7}
    record = served({PLAIN: (0, 345.0)})
    record.failed_configs = {"eagle3": "vllm serve exited 1 before /health answered: unsupported head"}
    d = decide(estimate, record, 1, min_gain=1.1)
    assert (d.num_speculative_tokens, d.basis, d.method) == (0, "measured", None)
    assert "eagle3 not a candidate: failed to start" in d.reason


def test_one_methods_failed_requests_drop_only_that_method():
    record = served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0), "ngram": (6, 400.0)})
    record.configs["eagle3"].levels["c1"].failed = 3
    d = decide({}, record, 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens, d.basis) == ("ngram", 6, "measured")
    assert "eagle3 not a candidate: 3 failed requests" in d.reason
    record.configs[PLAIN].levels["c1"].failed = 1  # plain's failures void every comparison
    assert decide({}, record, 1, min_gain=1.1).num_speculative_tokens == 0


def test_a_method_that_failed_anywhere_in_its_sweep_is_not_a_candidate():
    """Clean at the target concurrency but failing at 32: the serving gate counts the whole sweep, so shipping it
    would fail the variant while a clean method was there."""
    import copy

    record = served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0), "ngram": (6, 400.0)})
    level = copy.deepcopy(record.configs["eagle3"].levels["c1"])
    level.concurrency, level.failed = 32, 2
    record.configs["eagle3"].levels["c32"] = level
    d = decide({}, record, 1, min_gain=1.1)
    assert d.method == "ngram" and "eagle3 not a candidate: 2 failed requests" in d.reason


def test_the_gate_checks_the_candidate_methods_acceptance_not_another_methods():
    """eagle3 was measured fastest but vLLM reported no acceptance for it: the check falls back to eagle3's own
    estimate, never to the draft model's offline vLLM number or the CPU-best method's."""
    from pipeline.release.gates import ServingContext, gate_variant

    summary = {"speculative_method": "draft_model", "accepted_per_draft_token": 0.9,
               "vllm_accepted_per_draft_token": 0.95, "accepted_per_draft_token_draft_model": 0.9,
               "accepted_per_draft_token_eagle3": 0.3}
    verdict = gate_variant(summary, served({PLAIN: (0, 345.0), "eagle3": (7, 1002.0)}),
                           {"min_accepted_per_draft_token": 0.5}, ServingContext(1, 1.1, None), allowed=False)
    check = verdict.applied("min_accepted_per_draft_token")
    assert (check.metric, check.value, check.passed) == ("accepted_per_draft_token", 0.3, False)
    assert verdict.speculation.num_speculative_tokens == 0 and "not shipped" in verdict.speculation.reason


def test_the_bundle_refuses_a_config_file_the_record_does_not_measure(tmp_path):
    """A serve-eagle3.yaml left by a config that failed (or an older run) is not a measurement."""
    from stages.bundle import check_measured_config
    from stages.serve_bench import discard

    text = "speculative-config: {}\n"
    (tmp_path / "raw").mkdir()
    for name in ("serve-eagle3.yaml", "raw/eagle3-c1.json", "serve-plain.yaml", "raw/plain-c1.json"):
        (tmp_path / name).write_text(text)
    with pytest.raises(PipelineError, match="no measurement of the eagle3 config"):
        check_measured_config(tmp_path, served({PLAIN: (0, 345.0)}), methods.Speculation("eagle3", 7), text)
    discard(tmp_path, "eagle3")  # what serve_bench does when a config fails
    assert sorted(p.name for p in tmp_path.rglob("*.*")) == ["plain-c1.json", "serve-plain.yaml"]
    check_measured_config(tmp_path, served({PLAIN: (0, 345.0)}), methods.NONE, text)  # plain was measured


def test_a_config_vllm_cannot_serve_is_recorded_and_leaves_no_file_but_plain_at_default_settings(tmp_path, capsys,
                                                                                                  monkeypatch):
    """serve_bench's one step per config: a method that fails is recorded and discarded and the sweep goes on,
    in a tier plain decoding too (the tier ends there); plain failing at the default settings fails the stage."""
    from pipeline.serving.tiers import Tier
    from stages import serve_bench

    def serve_config(out, serving_dir, variant, name, speculation, *args, tier=None, label=None):
        (out / "raw").mkdir(parents=True, exist_ok=True)
        for partial in (f"serve-{name}.yaml", f"raw/{label or name}-c1.json"):
            (out / partial).write_text("written before vLLM failed\n")
        if name != "ngram":
            raise PipelineError(f"vllm serve exited 1: {name} {'x' * 600}")
        return "measured"

    def attempt(out, name, failed, tier=None):
        return serve_bench.served_or_failed(out, tmp_path, "v", name, methods.NONE, (), failed, tier)

    monkeypatch.setattr(serve_bench, "serve_config", serve_config)
    failed = {}
    assert attempt(tmp_path, "ngram", failed) == "measured" and failed == {}
    assert attempt(tmp_path, "eagle3", failed) is None
    assert failed == {"eagle3": f"vllm serve exited 1: eagle3 {'x' * 600}"[:500]}
    assert "serve_bench v: eagle3 failed, the other configs go on: vllm serve exited 1" in capsys.readouterr().out
    with pytest.raises(PipelineError, match="plain"):
        attempt(tmp_path, PLAIN, failed)
    assert PLAIN not in failed
    in_tier = {}
    assert attempt(tmp_path / "tiers/throughput", PLAIN, in_tier, Tier("throughput", concurrency=64)) is None
    assert list(in_tier) == [PLAIN] and "serve_bench v: tier throughput plain failed: " in capsys.readouterr().out
    # Plain decoding on one of two kernels: recorded under the kernel's label, its raw files gone; the other kernel
    # may still serve plain decoding, so the stage goes on.
    kernels = {}
    assert serve_bench.served_or_failed(tmp_path, tmp_path, "v", PLAIN, methods.NONE, (), kernels,
                                        label="plain-machete", must=False) is None
    assert list(kernels) == ["plain-machete"]
    with pytest.raises(PipelineError, match="plain"):  # the only kernel: its failure fails the stage
        serve_bench.served_or_failed(tmp_path, tmp_path, "v", PLAIN, methods.NONE, (), {}, label="plain-marlin",
                                     must=True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*")) == [
        "raw/ngram-c1.json", "raw/plain-c1.json", "raw/plain-marlin-c1.json", "serve-ngram.yaml",
        "serve-plain.yaml"]  # the default plain's and the only kernel's: the stage fails there, and its whole
    # output directory with it


def test_without_a_measurement_the_best_estimated_method_decides():
    d = decide({"speculative_method": "ngram", "num_speculative_tokens": 5, "expected_speedup": 1.3,
                "expected_speedup_ngram": 1.3, "expected_speedup_draft_model": 1.2}, None, 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens, d.basis) == ("ngram", 5, "estimated")


# ---- the stages of methods that are not requested


def test_trained_methods_stages_make_nothing_when_only_ngram_is_requested(tmp_path, capfd):
    """draft.method [ngram]: no distillation, no fine-tuning, no served draft, no draft evaluation, no head; each
    stage records why (DVC still gets its outputs), without reading a model or data (the workspace holds only
    params.yaml). Each stage's main runs in this process: the five stages' imports once, not five interpreters."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(draft={"method": ["ngram"]}), sort_keys=False))
    for stage, why in (("distill", "neither draft_model nor eagle3 is in draft.method"),
                       ("draft_finetune", "draft_model is not in draft.method"),
                       ("eagle3", "eagle3 is not in draft.method"),
                       ("draft_quantize", "draft_model is not in draft.method"),
                       ("evaluate_draft", "draft_model is not in draft.method")):
        r = run_stage_in_process(tmp_path, capfd, f"stages.{stage}")
        assert r.returncode == 0 and f"skipped ({why})" in r.stdout, (stage, r.stdout[-2000:], r.stderr[-2000:])
    for out, why in (("distill", "neither draft_model nor eagle3 is in draft.method"),
                     ("draft-finetuned", "draft_model is not in draft.method")):
        assert [p.name for p in (tmp_path / "artifacts" / out).iterdir()] == ["skipped.json"]
        assert json.loads((tmp_path / "artifacts" / out / "skipped.json").read_text()) == {"skipped": why}
    assert json.loads((tmp_path / "artifacts/draft/served.json").read_text())["skipped"] == "draft_model is not in draft.method"
    assert json.loads((tmp_path / "artifacts/eagle3/record.json").read_text())["skipped"] == "eagle3 is not in draft.method"
    for metrics in ("draft_training", "draft"):
        assert json.loads((tmp_path / f"metrics/{metrics}.json").read_text()) == {"skipped": "draft_model is not in draft.method"}

# ---- the stage when eagle3 is not requested


@pytest.mark.slow
def test_eagle3_stage_records_why_no_head_was_trained(tmp_path, demo_pair):
    import shutil

    ws = copy_project(tmp_path, tiny_params(draft={"method": ["draft_model", "ngram"]}))
    shutil.copytree(demo_pair[0], ws / "artifacts/models/target")
    (ws / "artifacts/distill").mkdir(parents=True)
    r = run([sys.executable, "-m", "stages.eagle3"], ws)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((ws / "artifacts/eagle3/record.json").read_text())
    assert record["skipped"] == "eagle3 is not in draft.method" and not (ws / "artifacts/eagle3/model").exists()
