"""A draft cut from the target's first layers (draft.source {from: target, layers: N}), and its params."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.errors import PipelineError
from pipeline.models.draft_compat import check_compatible
from pipeline.models.layer_draft import build_layer_draft
from pipeline.models.loading import check_checkpoint_tensors, load_causal_lm
from pipeline.models.settings import DraftSourceParams, LayerDraft
from pipeline.rules import validate
from tiny_chatml import chatml_tokenizer, save_checkpoint, tiny_llama
from tiny_project import ROOT, tiny_params


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(directory, model): a 4-layer Llama with its own head (untied), so the head is a tensor of its own to carry."""
    tokenizer = chatml_tokenizer()
    model = tiny_llama(tokenizer, layers=4, tied=False, seed=1)
    return save_checkpoint(tmp_path_factory.mktemp("target"), model, tokenizer), model


def test_the_draft_is_the_targets_first_layers_embeddings_norm_and_head(tmp_path, target):
    target_dir, model = target
    summary = build_layer_draft(target_dir, tmp_path / "draft", 2)
    draft_dir = tmp_path / "draft"
    check_checkpoint_tensors(draft_dir, "draft")  # config and weights describe one 2-layer model
    check_compatible(target_dir, draft_dir, max_model_len=2048)  # same tokenizer, vocabulary and context
    config, target_config = (json.loads((d / "config.json").read_text()) for d in (draft_dir, target_dir))
    assert config == {**target_config, "num_hidden_layers": 2}
    weights, source = load_file(draft_dir / "model.safetensors"), load_file(target_dir / "model.safetensors")
    kept = {k for k in source if not any(k.startswith(f"model.layers.{i}.") for i in (2, 3))}
    assert set(weights) == kept and "lm_head.weight" in kept and "model.norm.weight" in kept
    assert [k for k in kept if not torch.equal(weights[k], source[k])] == []
    assert summary == {
        "kind": "target",
        "layers": 2,
        "of_target_layers": 4,
        "parameters": sum(t.numel() for t in weights.values()),
    }
    # It computes what the target computes through its first two layers, then the target's norm and head
    draft = load_causal_lm(draft_dir, torch.device("cpu"))
    ids = torch.tensor([[1, 40, 41, 42, 43, 2, 1]])
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[2]  # after layer 1, before the final norm
        assert torch.allclose(draft(ids).logits, model.lm_head(model.model.norm(hidden)), atol=1e-5)
        assert draft.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=2).shape == (1, ids.shape[1] + 5)
    assert (draft_dir / "tokenizer.json").read_bytes() == (target_dir / "tokenizer.json").read_bytes()


def test_a_draft_as_deep_as_the_target_is_refused(tmp_path, target):
    with pytest.raises(
        PipelineError,
        match=r"draft.source.layers is 4, but the target has 4 decoder layers "
        r"\(config.json num_hidden_layers\); a draft takes fewer: 1 to 3",
    ):
        build_layer_draft(target[0], tmp_path / "draft", 4)


def test_layer_types_are_cut_with_the_layers(tmp_path, target):
    """Configs with one entry per layer (Qwen3, Gemma: layer_types) keep one per draft layer."""
    target_dir = tmp_path / "target"
    target_dir.mkdir()
    for f in target[0].iterdir():
        (target_dir / f.name).write_bytes(f.read_bytes())
    config = json.loads((target_dir / "config.json").read_text())
    (target_dir / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * 4}))
    build_layer_draft(target_dir, tmp_path / "draft", 3)
    assert json.loads((tmp_path / "draft/config.json").read_text())["layer_types"] == ["full_attention"] * 3


@pytest.mark.parametrize(
    "draft, message",
    [
        ({"from": "target", "layers": 0}, "draft.source.layers is 0; allowed: type integer, minimum 1"),
        ({"from": "target", "layers": True}, "draft.source.layers is True; allowed: type integer, minimum 1"),
        ({"from": "sibling", "layers": 2}, "draft.source.from is 'sibling'; allowed: enum ['target']"),
        ({"from": "target"}, "draft.source: 'layers' is a required property"),
        ({"from": "target", "layers": 2, "depth": 2}, "unknown key draft.source.depth"),
        (
            3,
            "draft.source is 3; allowed: demo, smollm2, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, a model directory, a "
            ".gguf file, a Hub repo id, or {from: target, layers: N}",
        ),
        ("target", "draft.source: a draft from the target needs its depth: draft.source: {from: target, layers: N}"),
    ],
)
def test_draft_source_params_are_checked_before_any_stage(draft, message):
    params = tiny_params(target={"source": "/models/t", "revision": None}, draft={"source": draft})
    with pytest.raises(PipelineError, match=re.escape(message)):
        validate(params, ROOT / "params.yaml", check_recipes=False)


def test_a_draft_from_the_demo_target_is_refused_and_a_real_one_parsed():
    with pytest.raises(PipelineError, match="takes the layers of a real target; target.source demo builds its own"):
        validate(tiny_params(draft={"source": {"from": "target", "layers": 1}}), ROOT / "params.yaml", False)
    params = tiny_params(
        target={"source": "/models/t", "revision": None}, draft={"source": {"from": "target", "layers": 3}}
    )
    validate(params, ROOT / "params.yaml", check_recipes=False)
    assert DraftSourceParams.parse(params["draft"]).source == LayerDraft(3)
    assert DraftSourceParams.parse(tiny_params()["draft"]).source == "demo"
