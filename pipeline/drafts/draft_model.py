"""The draft's three jobs, one DVC stage each: distill the target's answers (distill), fine-tune the
base draft on them (draft_finetune), and produce the draft that is served (draft_quantize: the
fine-tuned weights as they are, or quantized with a quantize variant's recipe).

Every draft directory is a plain HF layout (safetensors, config, generation_config, tokenizer)
that vLLM loads as speculative_config={"method": "draft_model", "model": <dir>}.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import TrainerCallback

from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress_bar
from pipeline.data.formatting import full_text
from pipeline.drafts.finetune import (
    check_training_settings,
    checkpoint_dir,
    fine_tune,
    load_for_training,
    summarize,
    target_agreement,
)
from pipeline.drafts.settings import DraftTrainingParams
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.quantize.recipes import VariantSpec
from pipeline.quantize.settings import Calibration


class ConsoleProgress(TrainerCallback):
    """The fine-tune's progress bar on the console (Trainer's own bar goes to the stage's log)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = progress_bar("draft fine-tune", total=state.max_steps, initial=state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(1)

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()


def save_draft(model, tokenizer, out: Path, base_dir: Path) -> None:
    """Save in the base draft's own dtype (training ran in float32): same bytes per weight to read
    when serving, and the same weight-bytes cost ratio as the untrained draft."""
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(base_dir, trust_remote_code=False).dtype
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        model = model.to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def finetune_draft(
    base_dir: Path,
    pad: int,
    train: list[dict],
    evals: list[dict],
    cfg: DraftTrainingParams,
    work_root: Path,
    out: Path,
    n_prompts: int,
) -> tuple[dict, list[dict]]:
    """Fine-tune the base draft on distilled examples into out (a fresh directory); (metrics, log history).
    Checkpoints under work_root survive an interruption for `resume` and are cleared after success."""
    check_training_settings(cfg, n_prompts)
    work = checkpoint_dir(work_root, base_dir, cfg, train, evals)
    tuned, history = fine_tune(base_dir, pad, train, evals, cfg, work, callbacks=[ConsoleProgress()])
    summary = summarize(history)
    # both in float32, as trained: the two numbers differ by the weights only
    summary["target_agreement_untrained"] = target_agreement(load_for_training(base_dir).to(tuned.device), evals)
    summary["target_agreement_finetuned"] = target_agreement(tuned, evals)
    shipped, summary["ship_criterion"] = shipped_draft(summary)
    if shipped == "base":
        # A fine-tune that the target would accept less often than the base draft (a learning rate made for a draft
        # trained from scratch destroys a pretrained sibling; Qwen2.5-Coder-0.5B's fine-tune lowered held-out loss
        # and acceptance both) must not ship: the base draft's own files.
        shutil.copytree(base_dir, out, dirs_exist_ok=True)
    else:
        save_draft(tuned, load_tokenizer(base_dir), out, base_dir)
    shutil.rmtree(work_root, ignore_errors=True)
    return {
        "train_examples": len(train),
        "eval_examples": len(evals),
        "lora": cfg.lora.enabled,
        **summary,
        "shipped": shipped,
    }, history


def shipped_draft(summary: dict) -> tuple[str, str]:
    """(which draft ships, by what): "base" where the fine-tune agrees with fewer of the target's held-out greedy
    answer tokens than the untrained draft (what the target accepts at temperature 0), else "finetuned". Lower
    held-out loss is not enough: on Qwen2.5-Coder-0.5B the loss fell (0.640 -> 0.596) while token acceptance against
    the target fell too (0.907 -> 0.885, benchmarks/gpu/raw/qwen-coder-gpu-3). Without the target's answers among the
    held-out examples, the held-out loss decides."""
    before, after = summary.get("target_agreement_untrained"), summary.get("target_agreement_finetuned")
    if before is not None and after is not None:
        return ("base" if after < before else "finetuned"), "target_agreement"
    before, after = summary.get("eval_loss_untrained"), summary.get("eval_loss_finetuned")
    return ("base" if before is not None and after is not None and after > before else "finetuned"), "eval_loss"


def check_draft_quantization(
    spec: VariantSpec, draft_dir: Path, calibration: list[list[dict]], calibration_cfg: Calibration
) -> None:
    """The variant's recipe checked against the draft before any calibration runs (a group size that does not divide
    the draft's layer widths: refused where the variant sets it, else one that does, as for the target:
    recipes.choose_group_size)."""
    from pipeline.quantize.oneshot import resolve_group_size
    from pipeline.quantize.recipes import needs_calibration

    if needs_calibration(spec) and not calibration:
        raise PipelineError(
            f"draft_quantize.variant {spec.name!r} needs calibration data but the calibration split is empty"
        )
    ignore = sorted(set(calibration_cfg.ignore) | set(spec.ignore))
    resolve_group_size(load_causal_lm(draft_dir, torch.device("cpu")), spec, ignore)


def quantize_draft(
    draft_dir: Path, out: Path, spec: VariantSpec, calibration: list[list[dict]], calibration_cfg: Calibration
) -> dict:
    """draft_dir -> out with the quantize stage's own code, calibrated on the domain's traffic."""
    from pipeline.quantize.oneshot import quantize_model

    check_draft_quantization(spec, draft_dir, calibration, calibration_cfg)
    tokenizer = load_tokenizer(draft_dir)
    return quantize_model(draft_dir, out, spec, [full_text(tokenizer, m) for m in calibration], calibration_cfg)
