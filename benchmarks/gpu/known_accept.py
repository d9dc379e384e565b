"""Models whose speculative acceptance is known before they run, at a real target's shape (issue #50, item 8).

Random weights (`load_format=dummy`) time a speculative step whose drafts are all rejected; a served step accepts
most of them, and a drafter then runs over the accepted tokens too. To time steps with drafts accepted at shapes no
real model here has, this writes a target whose next token is a fixed function of the current one, and drafters
that compute the same function:

  target   the shape's Llama with every decoder layer's o_proj and down_proj zero, so the residual stream stays the
           token's embedding and the logits are lm_head . norm(embed[t]); embed[t] is lm_head's row of next[t]
           (rows random, near-orthogonal), so the argmax is next[t] with a margin of ~sqrt(hidden) over the
           runner-up. next[] walks cycles of CYCLE tokens. The other weights are random: a step costs what the
           shape costs (zeros multiply as fast as any other value).
  draft    the shape's draft (draft_model method) built the same way over its own random rows: it computes next[]
           exactly, so every drafted token is accepted (untied embeddings, unlike the shape's draft: a tied
           table can't map a token to another one's row).
  eagle3   a one-layer EAGLE-3 head whose fc passes the first auxiliary hidden state and whose layer adds nothing.
           vLLM gives the head position i's hidden state with the token after it, x[i+1], and asks for x[i+2]; the
           target's hidden state at i is embed[x[i]], the lm_head row of x[i+1], so the head's lm_head is the
           target's with its rows permuted (row next[a] = the target's row a): its first drafted token is
           next[x[i+1]]. Each later one is predicted from the head's own output, the same hidden state, so it
           repeats that token and is rejected (CYCLE > 1). Known: 1 accepted token a step, whatever k.
  n-gram   on the target's output, which repeats every CYCLE tokens: after the first cycle every lookup drafts k
           tokens and all are accepted.

  build SHAPE OUT     (GPU host: torch, transformers, safetensors) OUT/target, OUT/draft, OUT/eagle3 and
                      OUT/expected.json for a shape of measure_costs.SHAPES; measure_costs.py then times them with
                      their real weights (its `pool` items SHAPE:METHOD:K:real).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_costs import SHAPES, eagle3_config, llama_config  # noqa: E402

CYCLE = 16  # tokens before the target's output repeats (n-gram's lookups find it from the second cycle on)
SEED = 0


def next_tokens(vocab: int, generator):
    """next[t]: a random permutation of the vocabulary cut into cycles of CYCLE tokens (the tail's last cycle may
    be shorter)."""
    import torch

    perm = torch.randperm(vocab, generator=generator)
    nxt = torch.empty(vocab, dtype=torch.long)
    for start in range(0, vocab, CYCLE):
        cycle = perm[start : start + CYCLE]
        nxt[cycle] = torch.roll(cycle, -1)
    return nxt


def rows(vocab: int, hidden: int, generator):
    """Random rows of unit norm: near-orthogonal in `hidden` dimensions (cosines ~ 1/sqrt(hidden))."""
    import torch

    u = torch.randn(vocab, hidden, generator=generator)
    return u / u.norm(dim=1, keepdim=True)


def bigram_llama(cfg: dict, nxt, out: Path, generator) -> None:
    """A LlamaForCausalLM of `cfg` computing next[]; saved in bfloat16 with its config."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    torch.set_default_dtype(torch.bfloat16)  # an 8B model initialised in float32 would take twice the memory
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    u = rows(cfg["vocab_size"], cfg["hidden_size"], generator)
    with torch.no_grad():
        model.lm_head.weight.copy_(u)
        model.model.embed_tokens.weight.copy_(u[nxt])
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))  # the shape's own config, as measure_costs writes
    del model


def eagle3_head(target_cfg: dict, target_dir: Path, nxt, out: Path) -> None:
    """The EAGLE-3 head in the speculators layout vLLM loads (names as speculators' Eagle3DraftModel saves them)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    h, inter = target_cfg["hidden_size"], target_cfg["intermediate_size"]
    heads, kv = target_cfg["num_attention_heads"], target_cfg["num_key_value_heads"]
    head_dim = h // heads
    g = torch.Generator().manual_seed(SEED + 1)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    tensors = {}
    for path in sorted(target_dir.glob("model*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name, key in (
                ("model.embed_tokens.weight", "embed_tokens.weight"),
                ("lm_head.weight", "lm_head.weight"),
            ):
                if name in f.keys():
                    tensors[key] = f.get_tensor(name).clone()
    # row next[a] = the target's row a: a hidden state that is the target's row of x[i+1] predicts next[x[i+1]]
    tensors["lm_head.weight"] = tensors["lm_head.weight"][torch.argsort(nxt)].contiguous()
    fc = torch.zeros(h, 3 * h, dtype=torch.bfloat16)
    fc[:, :h] = torch.eye(h, dtype=torch.bfloat16)  # the first auxiliary hidden state: the token's embedding
    tensors |= {
        "fc.weight": fc,
        "layers.0.self_attn.q_proj.weight": rand(heads * head_dim, 2 * h),
        "layers.0.self_attn.k_proj.weight": rand(kv * head_dim, 2 * h),
        "layers.0.self_attn.v_proj.weight": rand(kv * head_dim, 2 * h),
        "layers.0.self_attn.o_proj.weight": torch.zeros(h, heads * head_dim, dtype=torch.bfloat16),
        "layers.0.mlp.gate_proj.weight": rand(inter, h),
        "layers.0.mlp.up_proj.weight": rand(inter, h),
        "layers.0.mlp.down_proj.weight": torch.zeros(h, inter, dtype=torch.bfloat16),
        "layers.0.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "layers.0.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "layers.0.hidden_norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(eagle3_config(target_cfg), indent=1))


def build(shape: str, out: Path) -> None:
    import torch

    t0 = time.time()
    target_cfg = llama_config(SHAPES[shape]["target"])
    draft_cfg = llama_config({**SHAPES[shape]["draft"], "tie_word_embeddings": False})
    g = torch.Generator().manual_seed(SEED)
    nxt = next_tokens(target_cfg["vocab_size"], g)
    bigram_llama(target_cfg, nxt, out / "target", g)
    bigram_llama(draft_cfg, nxt, out / "draft", g)
    eagle3_head(target_cfg, out / "target", nxt, out / "eagle3")
    expected = {
        "shape": shape,
        "cycle": CYCLE,
        "draft_model": "every drafted token accepted",
        "eagle3": "the first drafted token of each step accepted, the rest rejected",
        "ngram": f"every drafted token accepted once the output has repeated (after {CYCLE} tokens)",
        "build_s": round(time.time() - t0, 1),
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print("BUILT", json.dumps(expected), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        build(sys.argv[2], Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
