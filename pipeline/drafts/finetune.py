"""Fine-tune the draft with transformers' Trainer: full fine-tune, or LoRA merged back into the
weights, resumable from checkpoints and deterministic by seed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import shutil
import zipfile
from pathlib import Path

import torch

from pipeline.core.errors import PipelineError
from pipeline.core.stage import say
from pipeline.drafts.distill import IGNORE_INDEX, TARGET
from pipeline.drafts.settings import DraftTrainingParams, Lora

# Settings that change neither the weights nor the logged curve, so a run may resume across them.
NOT_TRAINING_SETTINGS = ("resume",)
CHECKPOINT = re.compile(r"checkpoint-\d+")  # Trainer's checkpoint directory names
# Full fine-tune, LoRA adapter (merged only at the end) or sharded weights.
CHECKPOINT_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json")


class PadCollator:
    """Right-pads a batch; padding is masked from attention and from the loss."""

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


def check_training_settings(cfg: DraftTrainingParams, n_prompts: int) -> None:
    """Settings that would only fail, or log nothing, once training is under way."""
    per_prompt = 1 + cfg.sampled_responses + bool(cfg.include_original_responses)
    steps = math.ceil(n_prompts * per_prompt / cfg.batch_size) * cfg.epochs
    if steps < cfg.logging_steps:
        raise PipelineError(
            f"draft_training.logging_steps {cfg.logging_steps} exceeds the ~{steps} training "
            "steps, so no loss would be logged; lower it or train longer"
        )
    if cfg.save_steps % cfg.logging_steps:
        # Trainer averages the train loss over each logging window; a checkpoint inside a window
        # would make a resumed run log a different curve from an uninterrupted one.
        raise PipelineError(
            f"draft_training.save_steps ({cfg.save_steps}) must be a multiple of logging_steps ({cfg.logging_steps})"
        )


def checkpoint_dir(root: Path, base_dir: Path, cfg: DraftTrainingParams, train: list[dict], evals: list[dict]) -> Path:
    """A directory keyed by everything that shapes the run (settings, data, the base draft's
    weights), so `resume` only ever continues an interrupted run of the very same training."""
    h = hashlib.sha256()
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_TRAINING_SETTINGS}
    h.update(
        json.dumps(
            [settings, [t["input_ids"] for t in train], [e["input_ids"] for e in evals]], sort_keys=True
        ).encode()
    )
    for f in sorted(Path(base_dir).iterdir()):
        if f.suffix in (".safetensors", ".json"):
            h.update(f.name.encode())
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
    return Path(root) / h.hexdigest()[:16]


def load_for_training(base_dir: Path):
    """float32 master weights whatever the checkpoint's dtype; bf16 autocast does the GPU speed-up."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, trust_remote_code=False, use_safetensors=True
    )


def apply_lora(model, cfg: Lora):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lora)


def training_args(cfg: DraftTrainingParams, work_dir: Path, evaluate_first: bool):
    from transformers import TrainingArguments

    gpu = torch.cuda.is_available()
    return TrainingArguments(
        output_dir=str(work_dir),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_steps,
        weight_decay=0.0,
        # Evaluating at every logging step gives train and eval loss on the same steps (one plot row each).
        logging_steps=cfg.logging_steps,
        eval_strategy="steps",
        eval_steps=cfg.logging_steps,
        eval_on_start=evaluate_first,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=1,
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to="none",
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


def resumable_checkpoint(work_dir: Path) -> Path | None:
    """The newest complete checkpoint in work_dir, or None. Incomplete ones (a run killed while
    saving) are deleted: Trainer would pick the newest and fail on every later resume."""
    found = sorted(
        (d for d in work_dir.glob("checkpoint-*") if d.is_dir() and CHECKPOINT.fullmatch(d.name)),
        key=lambda d: int(d.name.split("-")[1]),
        reverse=True,
    )
    problems = {d: checkpoint_problem(d) for d in found}
    complete = [d for d in found if problems[d] is None]
    discarded = [d for d in found if problems[d]]
    for d in discarded:
        shutil.rmtree(d)
    if discarded:
        say(
            "draft training: discarded incomplete "
            + ", ".join(f"{d.name} ({problems[d]})" for d in discarded)
            + (f"; resuming from {complete[0].name}" if complete else "; starting afresh")
        )
    return complete[0] if complete else None


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None. Trainer writes trainer_state.json last,
    so its presence means the run got through the save; the file checks catch a truncated disk."""
    from safetensors import SafetensorError, safe_open

    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except FileNotFoundError:
        return "no trainer_state.json"
    except (OSError, ValueError):
        return "unreadable trainer_state.json"
    if not isinstance(state, dict) or "global_step" not in state:
        return "unreadable trainer_state.json"
    if not any((checkpoint / name).is_file() for name in CHECKPOINT_WEIGHTS):
        return "no model weights"
    for f in checkpoint.glob("*.safetensors"):
        try:
            with safe_open(f, "pt"):
                pass
        except (SafetensorError, OSError):
            return f"truncated {f.name}"
    for f in [*checkpoint.glob("*.pt"), *checkpoint.glob("*.pth"), *checkpoint.glob("*.bin")]:
        if not zipfile.is_zipfile(f):  # torch.save's format: a cut-off file has no zip directory
            return f"truncated {f.name}"
    return None


def fine_tune(
    base_dir: Path,
    pad_id: int,
    train: list[dict],
    evals: list[dict],
    cfg: DraftTrainingParams,
    work_dir: Path,
    callbacks: list | None = None,
):
    """Train the draft in base_dir; returns (merged float32 model, Trainer log history).

    With cfg.resume, a checkpoint left in work_dir by an interrupted run continues where it stopped."""
    from datasets import Dataset
    from transformers import Trainer, set_seed

    set_seed(cfg.seed)  # before LoRA: its adapter initialization is random
    model = load_for_training(base_dir)
    use_cache = model.config.use_cache  # Trainer turns the KV cache off for training; inference wants it back
    lora = cfg.lora.enabled
    if lora:
        model = apply_lora(model, cfg.lora)
    checkpoint = resumable_checkpoint(Path(work_dir)) if cfg.resume else None
    if checkpoint is None and Path(work_dir).exists():
        shutil.rmtree(work_dir)  # stale checkpoints of a run we are not resuming
    trainer = Trainer(
        model=model,
        args=training_args(cfg, work_dir, evaluate_first=checkpoint is None),
        train_dataset=Dataset.from_list(tokens_only(train)),
        eval_dataset=Dataset.from_list(tokens_only(evals)),
        data_collator=PadCollator(pad_id),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    trainer.evaluate()  # the final eval loss, whatever step training ended on
    model = trainer.model.merge_and_unload() if lora else trainer.model
    model.config.use_cache = use_cache
    return model.eval(), trainer.state.log_history


def tokens_only(examples: list[dict]) -> list[dict]:
    """What the Trainer reads of an example (its source tag is for target_agreement)."""
    return [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples]


@torch.no_grad()
def target_agreement(model, examples: list[dict]) -> float | None:
    """The share of the target's own greedy answer tokens (held-out examples of source "target") that the model
    predicts greedily from the prompt and the answer before them: at temperature 0, each is a drafted token the
    target accepts, so it is the draft's token acceptance without the target model (evaluate_draft's measure, on
    distill's held-out answers). None without such examples."""
    was_training = model.training
    model.eval()
    agreed = total = 0
    try:
        for e in (e for e in examples if e.get("source") == TARGET):
            ids = torch.tensor([e["input_ids"]], device=model.device)
            labels = torch.tensor(e["labels"][1:], device=model.device)
            predicted = model(input_ids=ids).logits[0, :-1].argmax(-1)
            scored = labels != IGNORE_INDEX
            agreed += (predicted[scored] == labels[scored]).sum().item()
            total += scored.sum().item()
    finally:
        model.train(was_training)
    return agreed / total if total else None


def loss_curve_rows(history: list[dict]) -> list[dict]:
    """Rows for `dvc plots`: step, train loss and eval loss, at the steps where both were logged."""
    train = {h["step"]: h["loss"] for h in history if "loss" in h}
    evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
    return [{"step": s, "train_loss": train[s], "eval_loss": evals[s]} for s in sorted(train.keys() & evals.keys())]


def summarize(history: list[dict]) -> dict:
    train = [h["loss"] for h in history if "loss" in h]
    evals = [h for h in history if "eval_loss" in h]
    return {
        "train_steps": max((h["step"] for h in history), default=0),
        "train_loss_first": train[0] if train else None,
        "train_loss_last": train[-1] if train else None,
        "eval_loss_untrained": next((h["eval_loss"] for h in evals if h["step"] == 0), None),
        "eval_loss_finetuned": evals[-1]["eval_loss"] if evals else None,
    }
