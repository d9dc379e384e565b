"""Domain fine-tuning of the draft model by distillation from the target.

The draft is trained on what the target actually says for domain prompts (its greedy, and
optionally sampled, responses), which is what speculative decoding must predict.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from pipeline.errors import PipelineError
from pipeline.formatting import prompt_ids, split_prompt_response

IGNORE_INDEX = -100


def check_compatible(target_tok, draft_tok, target_config, draft_config, max_model_len: int) -> None:
    """vLLM's draft_model speculation needs the same vocabulary; fail before any training."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise PipelineError("draft tokenizer vocabulary differs from the target's; speculative decoding needs "
                            "an identical vocabulary (pick a draft from the same model family)")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(target_tok, attr) != getattr(draft_tok, attr):
            raise PipelineError(f"draft special token {attr} ({getattr(draft_tok, attr)}) differs from the "
                                f"target's ({getattr(target_tok, attr)})")
    if (target_tok.chat_template or "") != (draft_tok.chat_template or ""):
        raise PipelineError("draft chat template differs from the target's")
    if target_config.vocab_size != draft_config.vocab_size:
        raise PipelineError(f"draft embedding size {draft_config.vocab_size} differs from the target's "
                            f"{target_config.vocab_size}")
    if draft_config.max_position_embeddings < max_model_len:
        raise PipelineError(f"draft max_position_embeddings {draft_config.max_position_embeddings} is below the "
                            f"serving max_model_len {max_model_len}")


@torch.no_grad()
def generate_batched(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                     temperature: float = 0.0, seed: int = 0) -> list[list[int]]:
    """Responses of `model` to tokenized prompts (left-padded batches), stopping at EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(seed)
    outs = []
    for i in tqdm(range(0, len(prompts), batch_size), desc="distill: target generates", mininterval=2):
        chunk = prompts[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=model.device)
        sample = dict(do_sample=True, temperature=temperature, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id, **sample)
        for row in gen[:, width:].tolist():
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id) + 1]
            outs.append(row)
    return outs


def build_distillation_set(target, tokenizer, conversations: list[list[dict]], cfg: dict) -> list[dict]:
    """Training examples {input_ids, labels} with the prompt masked out of the loss."""
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in conversations]
    responses: list[tuple[list[int], list[int]]] = []
    gen = dict(max_new_tokens=cfg["max_new_tokens"], batch_size=cfg["generation_batch_size"])
    for p, r in zip(prompts, generate_batched(target, tokenizer, prompts, **gen)):
        responses.append((p, r))
    for s in range(cfg.get("sampled_responses", 0)):
        for p, r in zip(prompts, generate_batched(target, tokenizer, prompts, temperature=cfg["temperature"],
                                                  seed=cfg["seed"] + s + 1, **gen)):
            responses.append((p, r))
    if cfg.get("include_original_responses"):
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        for p, m in zip(prompts, conversations):
            responses.append((p, tokenizer(split_prompt_response(m)[1], add_special_tokens=False)["input_ids"] + eos))
    return [{"input_ids": p + r, "labels": [IGNORE_INDEX] * len(p) + r} for p, r in responses if r]


class PadCollator:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch: list[dict]) -> dict:
        width = max(len(b["input_ids"]) for b in batch)
        def pad(seq, value):
            return seq + [value] * (width - len(seq))
        return {
            "input_ids": torch.tensor([pad(b["input_ids"], self.pad_id) for b in batch]),
            "labels": torch.tensor([pad(b["labels"], IGNORE_INDEX) for b in batch]),
            "attention_mask": torch.tensor([pad([1] * len(b["input_ids"]), 0) for b in batch]),
        }


def apply_lora(model, cfg: dict):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg["r"], lora_alpha=cfg["alpha"], lora_dropout=cfg.get("dropout", 0.0),
                      target_modules=cfg.get("target_modules", "all-linear"), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def fine_tune(model, tokenizer, train: list[dict], evals: list[dict], cfg: dict, work_dir: Path):
    """transformers Trainer; full fine-tune or LoRA (merged back). Returns (model, log_history)."""
    from transformers import Trainer, TrainingArguments, set_seed

    from datasets import Dataset

    set_seed(cfg["seed"])
    if cfg.get("lora", {}).get("enabled"):
        model = apply_lora(model, cfg["lora"])
    args = TrainingArguments(
        output_dir=str(work_dir), num_train_epochs=cfg["epochs"], per_device_train_batch_size=cfg["batch_size"],
        per_device_eval_batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
        lr_scheduler_type="cosine", warmup_steps=cfg.get("warmup_steps", 0), weight_decay=0.0,
        logging_steps=cfg["logging_steps"], eval_strategy="epoch", save_strategy="epoch", save_total_limit=1,
        seed=cfg["seed"], data_seed=cfg["seed"], report_to=[], use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, disable_tqdm=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(train),
                      eval_dataset=Dataset.from_list(evals), data_collator=PadCollator(tokenizer.pad_token_id))
    resume = cfg.get("resume") and any(work_dir.glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    history = trainer.state.log_history
    model = trainer.model
    if cfg.get("lora", {}).get("enabled"):
        model = model.merge_and_unload()
    return model.eval(), history


def loss_curve_rows(history: list[dict]) -> list[dict]:
    """Rows for `dvc plots`: step, train loss, eval loss (where logged)."""
    return [{"step": h["step"], "split": "train" if "loss" in h else "eval", "loss": h.get("loss", h.get("eval_loss"))}
            for h in history if "loss" in h or "eval_loss" in h]


def summarize(history: list[dict]) -> dict:
    train = [h["loss"] for h in history if "loss" in h]
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    return {"train_loss_first": train[0] if train else None, "train_loss_last": train[-1] if train else None,
            "eval_loss_last": evals[-1] if evals else None}
