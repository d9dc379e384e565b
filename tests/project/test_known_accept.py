"""benchmarks/gpu/known_accept.py: models whose speculative acceptance is known before vLLM runs them (issue #50).

Built at the demo's shape on CPU and run in transformers: the target's greedy output follows the planted next[] and
repeats every CYCLE tokens, the draft model's greedy output is the target's, and the EAGLE-3 head, read as vLLM runs
it (position i's auxiliary hidden states with token i+1, predicting token i+2), drafts the target's token. vLLM's
own acceptance counters on a GPU are the final check (benchmarks/gpu/COSTS.md, "Drafts accepted at 8B")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))
import known_accept  # noqa: E402

PROMPT = 24
NEW = 40


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("known")
    known_accept.build("demo", out)
    vocab = json.loads((out / "target" / "config.json").read_text())["vocab_size"]
    nxt = known_accept.next_tokens(vocab, torch.Generator().manual_seed(known_accept.SEED))
    return out, nxt


def greedy(folder: Path, prompt: torch.Tensor) -> list[int]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)
    return out[0, PROMPT:].tolist()


def test_target_follows_next_and_repeats(built):
    out, nxt = built
    prompt = torch.randint(10, 1200, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    seq = [prompt[0, -1].item(), *greedy(out / "target", prompt)]
    assert all(nxt[a].item() == b for a, b in zip(seq, seq[1:]))
    assert seq[1 : 1 + known_accept.CYCLE] == seq[1 + known_accept.CYCLE : 1 + 2 * known_accept.CYCLE]


def test_draft_model_drafts_the_targets_tokens(built):
    out, _ = built
    prompt = torch.randint(10, 1200, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    assert greedy(out / "draft", prompt) == greedy(out / "target", prompt)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def test_eagle3_first_draft_is_the_targets_token(built):
    """vLLM's EAGLE-3 step: fc over the auxiliary hidden states of position i (the residual stream entering each
    aux layer), hidden_norm (norm_before_residual), a layer whose o_proj and down_proj are zero, norm, lm_head; its
    argmax must be token i+2 of the target's own greedy sequence (wherever the target generated it)."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    out, _ = built
    head = load_file(str(out / "eagle3" / "model.safetensors"))
    cfg = json.loads((out / "eagle3" / "config.json").read_text())
    eps = cfg["transformer_layer_config"]["rms_norm_eps"]
    assert not head["layers.0.self_attn.o_proj.weight"].any() and not head["layers.0.mlp.down_proj.weight"].any()
    target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.bfloat16)
    prompt = torch.randint(10, 1200, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    ids = target.generate(prompt, max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    aux = torch.cat([states[i] for i in cfg["eagle_aux_hidden_state_layer_ids"]], dim=-1).float()
    hidden = rms(aux @ head["fc.weight"].float().T, head["layers.0.hidden_norm.weight"], eps)
    logits = rms(hidden, head["norm.weight"], eps) @ head["lm_head.weight"].float().T
    # vLLM drafts from position P-1 on (the prefill's last hidden state with the token it sampled)
    drafted = logits.argmax(-1)[0, PROMPT - 1 : -2]
    assert torch.equal(drafted, ids[0, PROMPT + 1 :])
