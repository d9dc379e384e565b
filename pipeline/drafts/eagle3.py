"""EAGLE-3 heads trained on the domain: speculators' model and loss, a small loop of our own.

The head (speculators 0.9 `Eagle3DraftModel`) reads three of the target's hidden states (the inputs of
the layers in `aux_layers`, as vLLM's Llama collects them for eagle3) plus the embedding of the next
token, and predicts the token after it; training-time test (TTT) feeds its own hidden state back for
`ttt_steps` steps, as it drafts in vLLM. The data are the target's own answers to domain prompts
(artifacts/distill), so the head learns the target's behaviour where it is served. Why not
speculators' Trainer: it reads hidden states from files written by a vLLM data-generation server
and expects a torch.distributed launch; here the target runs in-process (transformers, CPU or GPU)
and its hidden states go straight into the loss. The checkpoint is speculators' format
(`speculators_model_type: eagle3`), which vLLM 0.26 loads for speculative_config method eagle3.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.drafts.settings import Eagle3Params

VERIFIER_IN_BUNDLE = "./model"  # the target's place in a bundle; never the build machine's path


# speculators compiles the head's forward where CUDA is present; packed batches change shape every step
# (a recompile each time) and the scoring hook must see every lm_head call, so it runs eagerly.
def eager():
    """A context that runs torch.compile'd code eagerly inside it only (set_stance applies when called, so it
    is made at each use, never at import, where it would change the stance for the whole process)."""
    return torch.compiler.set_stance("force_eager")


def aux_layer_ids(setting, num_layers: int) -> list[int]:
    """The target layers whose inputs the head reads. auto: vLLM's Llama default (2, L//2, L-3), spread
    evenly where that repeats a layer (small targets); explicit ids must be distinct and < L. Sorted: vLLM
    concatenates the states in layer order, whatever order the config lists them in."""
    if setting == "auto":
        ids = [2, num_layers // 2, num_layers - 3]
        if len(set(ids)) < 3 or min(ids) < 0:
            ids = sorted({max(0, round(i * (num_layers - 1) / 3)) for i in (1, 2, 3)} | {0})[-3:]
        if len(set(ids)) < 3:
            raise PipelineError(
                f"draft.eagle3: a target with {num_layers} layers is too shallow for an EAGLE-3 "
                "head (three distinct layers are needed)"
            )
        return sorted(ids)
    if max(setting) >= num_layers:
        raise PipelineError(
            f"draft.eagle3.aux_layers {setting}: the target has {num_layers} layers (ids 0..{num_layers - 1})"
        )
    return sorted(setting)


def check_compatible(head_dir: Path, target_config: dict) -> None:
    """A head for another target (hidden size, vocabulary, layers) fails here, before any scoring."""
    cfg = read_json(Path(head_dir) / "config.json")
    if cfg.get("speculators_model_type") != "eagle3":
        raise PipelineError(
            f"{head_dir}/config.json: not an EAGLE-3 head (speculators_model_type "
            f"{cfg.get('speculators_model_type')!r})"
        )
    layer = cfg["transformer_layer_config"]
    hidden = cfg.get("target_hidden_size") or layer["hidden_size"]
    problems = []
    if hidden != target_config["hidden_size"]:
        problems.append(f"hidden size {hidden} vs the target's {target_config['hidden_size']}")
    if layer["vocab_size"] != target_config["vocab_size"]:
        problems.append(f"vocabulary {layer['vocab_size']} vs the target's {target_config['vocab_size']}")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or []
    if not ids or max(ids) >= target_config["num_hidden_layers"]:
        problems.append(f"aux layers {ids} vs the target's {target_config['num_hidden_layers']} layers")
    if problems:
        raise PipelineError(f"{head_dir}: EAGLE-3 head does not fit this target: " + "; ".join(problems))


class TargetFeatures:
    """The target's hidden states as the head consumes them: the concatenated aux layers, and the last
    layer's output before the final norm (speculators' loss applies the target's norm and lm_head)."""

    def __init__(self, target, layer_ids: list[int]):
        self.target, self.layer_ids = target, layer_ids

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor):
        last: list[torch.Tensor] = []
        hook = self.target.model.norm.register_forward_hook(lambda _m, inp, _out: last.append(inp[0]))
        try:
            out = self.target(input_ids=ids, output_hidden_states=True)
        finally:
            hook.remove()
        aux = torch.cat([out.hidden_states[i] for i in self.layer_ids], dim=-1)
        return aux.float(), last[-1].float(), out.logits  # the head trains and scores in fp32


def build_head(target_dir: Path, cfg: Eagle3Params, layer_ids: list[int], token_counts: Counter):
    """A fresh head shaped from the target's config; embeddings and lm_head seeded from the target."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    # The head's own layers are initialised at random when it is built: seeded here, or two builds of the same
    # inputs train different heads (train() seeds the batch order only after the head exists).
    torch.manual_seed(cfg.seed)
    layer = create_transformer_layer_config(
        str(target_dir), cfg.num_layers, "llama", None, 0, list(range(cfg.num_layers))
    )
    layer._attn_implementation = "eager"  # flex attention needs a compiler; eager runs on CPU and GPU alike
    vocab = layer.vocab_size
    draft_vocab = cfg.draft_vocab_size or vocab
    if draft_vocab > vocab:
        raise PipelineError(f"draft.eagle3.draft_vocab_size {draft_vocab} exceeds the target's vocabulary ({vocab})")
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=draft_vocab,
        norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=layer_ids,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=cfg.ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(target_dir)),
        ),
    )
    head = Eagle3DraftModel(config)
    if draft_vocab < vocab:  # the most frequent tokens of the target's answers (speculators' t2d/d2t)
        d2t, t2d = build_vocab_mappings_from_distribution(dict(token_counts), draft_vocab, vocab)
        head.load_vocab_mappings(t2d, d2t)
    head.load_verifier_weights()
    return head


def pack(rows: list[dict], features: TargetFeatures, device) -> dict:
    """Rows (input_ids, labels) -> one packed sequence in speculators' layout (shift_batch per row: token
    x[t+1] beside the target's state at t, loss on the answer tokens), document ids keeping rows apart."""
    from speculators.models.eagle3.data import shift_batch

    parts = []
    for row in rows:
        ids = torch.tensor([row["input_ids"]], device=device)
        aux, last, _ = features(ids)
        parts.append(
            shift_batch(
                {
                    "input_ids": ids[0],
                    "hidden_states": aux[0],
                    "verifier_last_hidden_states": last[0],
                    "loss_mask": torch.tensor([label != -100 for label in row["labels"]], device=device),
                    "lengths": torch.tensor([ids.shape[1]]),
                    "position_ids": torch.arange(ids.shape[1], device=device),
                }
            )
        )
    cat = {
        k: torch.cat([p[k] for p in parts]).unsqueeze(0)
        for k in ("input_ids", "hidden_states", "verifier_last_hidden_states", "loss_mask", "position_ids")
    }
    cat["document_ids"] = torch.cat(
        [torch.full((len(p["input_ids"]),), i, device=device) for i, p in enumerate(parts)]
    ).unsqueeze(0)
    return cat


def train(head, features: TargetFeatures, rows: list[dict], cfg: Eagle3Params, device, progress) -> dict:
    """AdamW with a linear warm-up over `train_steps` batches of `batch_size` rows; speculators' TTT loss
    (KL to the target's distribution over ttt_steps draft steps). Returns the loss curve and timings."""
    from speculators.losses import resolve_loss_config

    if not rows:
        raise PipelineError("artifacts/distill/train.jsonl is empty: nothing to train the EAGLE-3 head on")
    torch.manual_seed(cfg.seed)
    head.to(device).train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate)
    warmup = max(1, cfg.train_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    loss_config = resolve_loss_config("kl_div", "eager")
    order = torch.randperm(len(rows)).tolist()
    curve, t0 = [], time.perf_counter()
    for step in progress(range(cfg.train_steps), desc="eagle3 head"):
        batch = [rows[order[(step * cfg.batch_size + i) % len(rows)]] for i in range(cfg.batch_size)]
        with eager():
            _, loss, metrics = head(
                **pack(batch, features, device),
                ttt_steps=cfg.ttt_steps,
                ttt_step_loss_decay=1.0,
                loss_config=loss_config,
            )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        curve.append(
            {
                "step": step + 1,
                "loss": float(loss.detach()),
                **{f"accuracy_step{s}": _ratio(metrics, f"full_acc_{s}") for s in range(cfg.ttt_steps)},
            }
        )
    head.eval()
    return {"curve": curve, "train_s": time.perf_counter() - t0, "trainable_parameters": sum(p.numel() for p in params)}


def _ratio(metrics: dict, key: str) -> float | None:
    total = float(metrics.get(f"{key}_total", 0))
    return float(metrics[f"{key}_sum"]) / total if total else None


def checkpoint_dtype(model_dir: Path) -> torch.dtype:
    """The dtype a checkpoint is stored (and by default served) in, from its config."""
    config = read_json(Path(model_dir) / "config.json")
    return getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")


def save(head, out: Path, target_dir: Path) -> None:
    """speculators' save_pretrained in the target checkpoint's dtype (vLLM serves the head in the target's
    dtype; fp32 weights would double the bytes its cost ratio counts), then the verifier path made
    bundle-relative: the build machine's absolute path would leak into every bundle and mean nothing where
    it is served."""
    import json

    head.to(checkpoint_dtype(target_dir)).save_pretrained(out)
    config_path = Path(out) / "config.json"
    config = json.loads(config_path.read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = VERIFIER_IN_BUNDLE
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def load(head_dir: Path, device="cpu"):
    """The head for scoring: built from its config and weights, without speculators' from_pretrained,
    which would resolve the (bundle-relative) verifier path to re-check the target."""
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(head_dir))
    config.speculators_config.verifier.name_or_path = None
    config.transformer_layer_config._attn_implementation = "eager"
    head = Eagle3DraftModel(config)
    state = {}
    for path in sorted(Path(head_dir).glob("*.safetensors")):
        state |= load_file(str(path))
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("verifier_")]  # the loss's copy of the target's head
    if missing or unexpected:
        raise PipelineError(
            f"{head_dir}: EAGLE-3 weights do not match its config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return head.to(device).eval()


@torch.no_grad()
def draft_logits(head, features: TargetFeatures, ids: list[int], steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The head's logits at every draft depth for every position of `ids` (teacher-forced on ids, as
    TTT trains it), mapped to the target's vocabulary, and the target's own logits.

    Depth s at shifted position i predicts ids[i + 2 + s]: the head sees the target's state at i and
    the token ids[i + 1]. Returns ([N-1, V] per depth, target logits [N, V])."""
    device = next(head.parameters()).device
    x = torch.tensor([ids], device=device)
    aux, _, target_logits = features(x)
    captured: list[torch.Tensor] = []
    hook = head.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out[0].float()))
    try:
        n = len(ids) - 1
        with eager():
            head(
                hidden_states=aux[:, :-1],
                input_ids=x[:, 1:],
                document_ids=torch.zeros(1, n, device=device, dtype=torch.long),
                ttt_steps=steps,
            )
    finally:
        hook.remove()
    if head.d2t is not None:  # reduced draft vocabulary: draft id d is target id d + d2t[d]
        vocab = target_logits.shape[-1]
        full = []
        for logits in captured:
            out = torch.full((logits.shape[0], vocab), float("-inf"), device=logits.device)
            out[:, torch.arange(logits.shape[1], device=logits.device) + head.d2t] = logits
            full.append(out)
        captured = full
    return captured, target_logits[0].float()


def scorer(head, features: TargetFeatures, temperature: float):
    """acceptance.Scorer for the head: a draft started at continuation position t sees the target's state
    two tokens back and the last token, then chains its own states for the deeper tokens (TTT's
    teacher-forced pass, exact at temperature 0; at T > 0 each depth scores sum min(p, q) along the
    target's path, as the draft-model estimate does)."""
    import torch.nn.functional as F

    def score(prompt: list[int], cont: list[int], end: int, max_k: int):
        p_len = len(prompt)
        if p_len < 2:
            raise PipelineError("an EAGLE-3 estimate needs prompts of at least two tokens")
        depths, target_logits = draft_logits(head, features, prompt + cont, max_k)
        starts = torch.arange(end)
        reach = torch.zeros(end, max_k)
        alive = torch.ones(end)
        for s in range(max_k):
            valid = starts + s < len(cont)
            pos = starts[valid]
            q = depths[s][pos + p_len - 2].cpu()
            truth = torch.tensor(cont)[pos + s]
            if temperature == 0:
                alpha = (q.argmax(-1) == truth).float()
            else:
                p = F.softmax(target_logits[pos + p_len + s - 1].cpu() / temperature, dim=-1)
                alpha = torch.minimum(p, F.softmax(q / temperature, dim=-1)).sum(-1).clamp(max=1.0)
            step = torch.zeros(end)
            step[valid] = alpha
            alive = alive * step
            reach[:, s] = alive
        return reach, None

    return score


def cost_ratio(head_dir: Path, target_dir: Path) -> float:
    """Weight bytes the head reads per drafted token over the target's: every tensor but the embedding
    table, of which a step reads one row (the same memory-bound model as the draft's weight_bytes)."""
    from safetensors import safe_open

    from pipeline.core.sizes import dir_size

    head_bytes = 0
    for path in Path(head_dir).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                if "embed_tokens" not in name:
                    t = f.get_slice(name)
                    n = 1
                    for d in t.get_shape():
                        n *= d
                    head_bytes += n * {"F32": 4, "BF16": 2, "F16": 2}.get(t.get_dtype(), 4)
    target_bytes = dir_size(target_dir, ".safetensors")
    if not head_bytes or not target_bytes:
        raise PipelineError(f"no .safetensors weights under {head_dir if not head_bytes else target_dir}")
    return head_bytes / target_bytes


@dataclass
class Eagle3Record:
    """artifacts/eagle3/record.json: the trained head, or why none was trained. The training's seconds are in
    artifacts/timings/eagle3.json (run-dependent: a record DVC hashes must rebuild bit for bit)."""

    skipped: str | None = None
    aux_layers: list[int] | None = None
    draft_vocab_size: int | None = None
    ttt_steps: int | None = None
    train_steps: int | None = None
    trainable_parameters: int | None = None
    final_loss: float | None = None
    accuracy_by_step: list[float | None] | None = None  # the last step's full-sequence accuracy per TTT step
    device: str | None = None
