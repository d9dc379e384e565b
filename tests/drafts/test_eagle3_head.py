"""The EAGLE-3 head (speculators' model), trained here on the tiny demo target: deterministic builds, a reduced draft
vocabulary, the checkpoint vLLM loads, the refusal of a head built for another target, and its estimate."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import yaml

from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress
from pipeline.drafts import eagle3
from pipeline.drafts.settings import Eagle3Params
from pipeline.evaluate import acceptance
from tiny_project import ROOT, demo_prompts


def train_head(tmp_path_factory, demo_pair, target, **cfg_overrides):
    """A head trained for a few steps on the tiny target's own greedy answers, saved as the stage saves it."""
    rows = []
    for prompt in demo_prompts(demo_pair[0], 24):
        cont, end = acceptance.target_continuation(target, prompt, 16, 0.0, acceptance.stop_token_ids(target))
        rows.append({"input_ids": prompt + cont[:end], "labels": [-100] * len(prompt) + cont[:end]})
    cfg = Eagle3Params.parse(
        dict(
            yaml.safe_load((ROOT / "params.yaml").read_text())["draft"]["eagle3"],
            train_steps=12,
            batch_size=4,
            **cfg_overrides,
        )
    )
    layers = eagle3.aux_layer_ids("auto", target.config.num_hidden_layers)
    counts = Counter(t for r in rows for t, label in zip(r["input_ids"], r["labels"]) if label != -100)
    head = eagle3.build_head(demo_pair[0], cfg, layers, counts)
    result = eagle3.train(head, eagle3.TargetFeatures(target, layers), rows, cfg, "cpu", progress)
    assert result["curve"][-1]["loss"] < result["curve"][0]["loss"]  # it learned something
    out = tmp_path_factory.mktemp("eagle3") / "model"
    eagle3.save(head, out, demo_pair[0])
    return out


def test_two_builds_of_the_head_from_the_same_inputs_are_identical(demo_pair, demo_target):
    """Issue #32's determinism: the head's layers are initialised from draft.eagle3.seed, not from whatever the
    global RNG holds, so two fresh builds train the same head (before, one build's final loss was 0.328, the
    next one's 0.193)."""
    cfg = Eagle3Params.parse(yaml.safe_load((ROOT / "params.yaml").read_text())["draft"]["eagle3"])
    layers = eagle3.aux_layer_ids("auto", demo_target.config.num_hidden_layers)
    torch.manual_seed(1)
    first = eagle3.build_head(demo_pair[0], cfg, layers, Counter()).state_dict()
    torch.manual_seed(2)  # another global state, as another process or stage order leaves it
    second = eagle3.build_head(demo_pair[0], cfg, layers, Counter()).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, demo_pair, demo_target):
    return train_head(tmp_path_factory, demo_pair, demo_target)


def test_a_reduced_draft_vocabulary_maps_back_to_the_targets(
    tmp_path_factory, demo_pair, demo_target, demo_target_prompts
):
    """draft_vocab_size: the head scores only the answers' most frequent tokens (speculators' d2t/t2d), and
    its logits come back in the target's vocabulary, -inf outside the kept tokens."""
    small = train_head(tmp_path_factory, demo_pair, demo_target, draft_vocab_size=64)
    config = json.loads((small / "config.json").read_text())
    assert config["draft_vocab_size"] == 64
    assert config["transformer_layer_config"]["vocab_size"] == demo_target.config.vocab_size
    head = eagle3.load(small)
    assert head.d2t is not None and int(head.t2d.sum()) == 64
    features = eagle3.TargetFeatures(demo_target, head.config.eagle_aux_hidden_state_layer_ids)
    depths, _ = eagle3.draft_logits(head, features, demo_target_prompts[0], 2)
    kept = torch.isfinite(depths[0][0])
    assert depths[0].shape[-1] == demo_target.config.vocab_size and int(kept.sum()) == 64
    assert torch.equal(kept, head.t2d.bool())  # the finite logits are exactly the kept target tokens


def test_head_is_saved_in_the_format_vllm_loads_for_eagle3(head_dir, demo_target, demo_pair):
    from safetensors import safe_open

    config = json.loads((head_dir / "config.json").read_text())
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:  # the target checkpoint's dtype, not fp32
        assert {f.get_tensor(n).dtype for n in f.keys()} == {eagle3.checkpoint_dtype(demo_pair[0])}
    assert config["speculators_model_type"] == "eagle3"  # vLLM's speculators-format detection
    assert config["speculators_config"]["verifier"]["name_or_path"] == "./model"  # no build-machine path
    assert config["eagle_aux_hidden_state_layer_ids"] == sorted(config["eagle_aux_hidden_state_layer_ids"])
    assert config["transformer_layer_config"]["hidden_size"] == demo_target.config.hidden_size
    eagle3.check_compatible(head_dir, demo_target.config.to_dict())
    head = eagle3.load(head_dir)  # the saved weights, every one of them, back in the head that scores
    state = head.state_dict()
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        for name in f.keys():
            assert torch.equal(state[name].to(f.get_tensor(name).dtype), f.get_tensor(name)), name


@pytest.mark.parametrize(
    "change,says",
    [
        ({"hidden_size": 256}, "hidden size"),
        ({"vocab_size": 7}, "vocabulary"),
        ({"num_hidden_layers": 1}, "aux layers"),
    ],
)
def test_a_head_for_another_target_is_refused_in_one_line(head_dir, demo_target, change, says):
    with pytest.raises(PipelineError) as e:
        eagle3.check_compatible(head_dir, {**demo_target.config.to_dict(), **change})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_each_depth_predicts_from_what_precedes_it(head_dir, demo_target, demo_target_prompts):
    """The estimator's teacher-forced pass gives, at depth s and position i, what drafting from position i
    gives when its s earlier drafts were right (the only case in which depth s is scored): it sees the
    target's states up to i and tokens up to i + 1 + s, nothing later. The alignment vLLM's drafting has."""
    head = eagle3.load(head_dir)
    features = eagle3.TargetFeatures(demo_target, head.config.eagle_aux_hidden_state_layer_ids)
    ids = (demo_target_prompts[0] + demo_target_prompts[1])[:24]
    full, _ = eagle3.draft_logits(head, features, ids, 3)
    for i in (4, 11, len(ids) - 5):
        for depth in range(3):
            prefix, _ = eagle3.draft_logits(head, features, ids[: i + 2 + depth], 3)
            assert torch.allclose(prefix[depth][i], full[depth][i], atol=1e-4), (i, depth)


def test_eagle3_estimate_scores_the_head(head_dir, demo_target, demo_target_prompts, demo_pair):
    head = eagle3.load(head_dir)
    features = eagle3.TargetFeatures(demo_target, head.config.eagle_aux_hidden_state_layer_ids)
    cost = eagle3.cost_ratio(head_dir, demo_pair[0])
    assert 0 < cost  # the head's weights but its embedding table, over the target's
    est = acceptance.estimate_method(
        demo_target, eagle3.scorer(head, features, 0.0), demo_target_prompts, 16, 0.0, 4, cost, "eagle3"
    )
    assert est.method == "eagle3" and 1 <= est.num_speculative_tokens <= 4
    per_pos = est.accepted_per_position
    assert all(a >= b - 1e-9 for a, b in zip(per_pos, per_pos[1:]))  # P(at least j accepted) never rises
    assert est.accepted_per_draft_token == pytest.approx(sum(per_pos) / est.num_speculative_tokens)


def test_aux_layers_fail_before_training():
    with pytest.raises(PipelineError, match="too shallow"):
        eagle3.aux_layer_ids("auto", 2)
    with pytest.raises(PipelineError, match="the target has 4 layers"):
        eagle3.aux_layer_ids([0, 1, 4], 4)
