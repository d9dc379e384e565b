"""The embedded `demo` model source: a tiny Llama target and a smaller draft that share one
BPE tokenizer trained locally, each pretrained briefly so their outputs are not noise.

The target learns the domain (support answers) and generic prose; the draft mostly learns
generic prose, like an off-the-shelf small model would. That gap is what the `draft`
stage's domain fine-tuning closes. Deterministic by seed on a given machine.

On a GPU (the `gpu` profile: a 1B-parameter target) pretraining runs there in bf16 autocast with
float32 master weights; on CPU it is float32 throughout, as before.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pipeline.core.errors import PipelineError, one_of
from pipeline.core.stage import progress_bar
from pipeline.data.formatting import row_to_messages
from pipeline.models.demo.corpus import GENERAL_CORPORA, docstring_paragraphs
from pipeline.models.demo.traffic import generate_general_text, generate_traffic
from pipeline.models.settings import DemoModel, DemoParams

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
# Llama-3-like chat layout with the roles as single special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(spec: DemoModel, tokenizer: PreTrainedTokenizerFast, max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def pack(token_lists: list[list[int]], seq_len: int) -> torch.Tensor:
    """Concatenate documents and cut into fixed-length training rows (standard LM packing)."""
    flat = [t for ids in token_lists for t in ids]
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len]).view(n, seq_len)


def general_text(cfg: DemoParams, seed: int) -> list[str]:
    """Generic text: templated sentences (CPU demo) or installed Python docstrings (GPU profile)."""
    kind = cfg.general_corpus
    if kind == "synthetic":
        return generate_general_text(cfg.general_sentences, seed=seed)
    if kind == "python-docs":
        return docstring_paragraphs(cfg.general_chars)
    raise PipelineError(f"demo.general_corpus must be {one_of(GENERAL_CORPORA)}, got {kind!r}")


def pretrain(
    model: LlamaForCausalLM, rows: torch.Tensor, steps: int, batch_size: int, lr: float, seed: int, desc: str
) -> list[float]:
    """Cosine-decayed AdamW on random packed rows. On CUDA: bf16 autocast, fused AdamW, rows on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    cuda = next(model.parameters()).is_cuda
    opt = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95), **({"fused": True} if cuda else {})
    )
    if cuda:
        rows = rows.cuda()
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    losses = []
    bar = progress_bar(desc, items=range(steps))
    for _ in bar:
        batch = rows[torch.randint(len(rows), (batch_size,), generator=gen).to(rows.device)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses


def _check_vocab_size(cfg: DemoParams, size: int) -> None:
    """With real text (the GPU profile) the vocabulary size is the point: a shortfall is an error. The CPU demo's
    templated corpus saturates below demo.vocab_size by design (metrics/models.json records the real size)."""
    if cfg.general_corpus == "python-docs" and size < cfg.vocab_size:
        raise PipelineError(
            f"demo.vocab_size {cfg.vocab_size}: the demo corpus supports only {size} "
            "tokens; lower it or add text (demo.general_corpus: python-docs, demo.general_chars)"
        )


def build_demo_pair(target_dir: Path, draft_dir: Path, cfg: DemoParams) -> tuple[dict, dict]:
    """Build, pretrain and save the demo target and draft. Returns a summary for metrics and each role's
    pretraining seconds (run-dependent: not a metric: pipeline/core/stage.py, record_timings)."""
    seed = cfg.seed
    torch.manual_seed(seed)
    random.seed(seed)
    # A pretraining corpus drawn from the same domain generator as the traffic, with its own seed.
    domain_rows = generate_traffic(cfg.domain_rows, seed=seed + 1000)
    general = general_text(cfg, seed=seed + 2000)
    tokenizer = train_tokenizer(
        [m["content"] for r in domain_rows for m in row_to_messages(r)] + general, cfg.vocab_size
    )
    _check_vocab_size(cfg, len(tokenizer))
    domain_ids = [
        tokenizer.apply_chat_template(row_to_messages(r), tokenize=True, return_dict=False) for r in domain_rows
    ]
    general_ids = tokenizer([s + "\n" for s in general])["input_ids"]
    seq_len = cfg.seq_len
    seconds = {}
    summary = {
        "vocab_size": len(tokenizer),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "pretraining_tokens": {"domain": sum(map(len, domain_ids)), "general": sum(map(len, general_ids))},
    }
    for role, out_dir, docs in (
        ("target", target_dir, domain_ids + general_ids),
        # The draft is a generic small model: mostly prose, a sliver of the domain.
        ("draft", draft_dir, general_ids + domain_ids[: int(len(domain_ids) * cfg.draft.domain_share)]),
    ):
        spec = cfg.target if role == "target" else cfg.draft
        shuffled = list(docs)
        random.Random(seed).shuffle(shuffled)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialized where it trains
            model = LlamaForCausalLM(llama_config(spec, tokenizer, cfg.max_position_embeddings))
        started = time.perf_counter()
        losses = pretrain(
            model,
            pack(shuffled, seq_len),
            spec.train_steps,
            cfg.batch_size,
            spec.lr,
            seed,
            desc=f"pretrain demo {role}",
        )
        train_s = time.perf_counter() - started
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        # Saved in bf16 like real checkpoints; the pipeline upcasts to float32 on CPU.
        model.to(torch.bfloat16).save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        summary[role] = {
            "params": sum(p.numel() for p in model.parameters()),
            "final_loss": losses[-1],
            "train_steps": spec.train_steps,
        }
        seconds[role] = {"train_s": round(train_s, 1)}
    return summary, seconds
