"""The draft stage's work: check the draft fits the target, distill the target's answers,
fine-tune, and measure speculative acceptance on held-out prompts before and after.

The result is a plain HF-layout directory (safetensors, config, generation_config, tokenizer)
that vLLM loads as speculative_config={"method": "draft_model", "model": <dir>/model}, plus
<dir>/model-quantized when draft_training.quantize names a quantize variant.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from pipeline import acceptance
from pipeline.config import enabled_variant
from pipeline.distill import build_distillation_set, pad_id
from pipeline.draft_compat import check_compatible
from pipeline.draft_training import check_training_settings, checkpoint_dir, fine_tune, summarize
from pipeline.errors import PipelineError
from pipeline.formatting import full_text, prompt_ids, split_prompt_response
from pipeline.io import atomic_dir
from pipeline.loading import load_causal_lm, load_tokenizer


def estimate_acceptance(target, draft, tokenizer, heldout: list[list[dict]], acc_cfg: dict, target_dir: Path,
                        draft_dir: Path) -> dict:
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in heldout[: acc_cfg["prompts"]]]
    return acceptance.estimate(target, draft, prompts, acc_cfg["continuation_tokens"], acc_cfg["temperature"],
                               acc_cfg["max_k"], acceptance.resolve_cost_ratio(acc_cfg["cost_ratio"], target_dir,
                                                                                draft_dir))


def check_draft_quantization(params: dict, base_dir: Path, calibration: list[list[dict]]) -> dict | None:
    """The quantize variant for the draft, checked against the draft before training starts."""
    from pipeline.quantize import check_group_size
    from pipeline.recipes import needs_calibration, validate_spec, weight_group_size

    name = params["draft_training"]["quantize"]
    if not name:
        return None
    spec = enabled_variant(params, name)
    validate_spec(name, spec)
    if needs_calibration(spec) and not calibration:
        raise PipelineError(f"draft_training.quantize {name!r} needs calibration data but the calibration split "
                            "is empty")
    ignore = sorted(set(params["quantize"]["calibration"].get("ignore", [])) | set(spec.get("ignore", [])))
    check_group_size(load_causal_lm(base_dir, torch.device("cpu")), weight_group_size(spec), ignore)
    return spec


def save_draft(model, tokenizer, out: Path, base_dir: Path) -> None:
    """Save in the base draft's own dtype (training ran in float32): same bytes per weight to read
    when serving, and the same weight-bytes cost ratio as the untrained draft."""
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(base_dir, trust_remote_code=False).dtype
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        model = model.to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_draft(target_dir: Path, base_dir: Path, out_dir: Path, train_convs: list[list[dict]],
                heldout_convs: list[list[dict]], params: dict, work_root: Path,
                calibration_convs: list[list[dict]] = ()) -> tuple[dict, list[dict]]:
    """Write out_dir/model (and model-quantized); return (metrics, Trainer log history)."""
    cfg, acc_cfg = params["draft_training"], params["evaluate"]["acceptance"]
    check_compatible(target_dir, base_dir, params["serving"]["max_model_len"])
    check_training_settings(cfg, len(train_convs))
    quant_spec = check_draft_quantization(params, base_dir, calibration_convs)

    tokenizer = load_tokenizer(target_dir)
    target, base = load_causal_lm(target_dir), load_causal_lm(base_dir)
    train = build_distillation_set(target, tokenizer, train_convs, cfg)
    evals = build_distillation_set(target, tokenizer, heldout_convs[: cfg["eval_prompts"]], cfg, sampled=False)
    before = estimate_acceptance(target, base, tokenizer, heldout_convs, acc_cfg, target_dir, base_dir)
    del base

    work = checkpoint_dir(work_root, base_dir, cfg, train, evals)
    tuned, history = fine_tune(base_dir, pad_id(tokenizer), train, evals, cfg, work)
    metrics = {"train_examples": len(train), "eval_examples": len(evals), "lora": cfg["lora"]["enabled"],
               **summarize(history)}
    with atomic_dir(out_dir) as tmp:
        save_draft(tuned, load_tokenizer(base_dir), tmp / "model", base_dir)
        del tuned
        # Measured on the saved draft, as served (its dtype), not on the in-memory training copy.
        after = estimate_acceptance(target, load_causal_lm(tmp / "model"), tokenizer, heldout_convs, acc_cfg,
                                    target_dir, tmp / "model")
        metrics |= {"acceptance_rate_untrained": before["acceptance_rate"],
                    "acceptance_rate_finetuned": after["acceptance_rate"],
                    "expected_speedup_untrained": before["expected_speedup"],
                    "expected_speedup_finetuned": after["expected_speedup"],
                    "num_speculative_tokens_finetuned": after["num_speculative_tokens"]}
        if quant_spec is not None:
            metrics |= quantize_draft(target, tokenizer, tmp, quant_spec, heldout_convs, calibration_convs, params,
                                      target_dir)
    shutil.rmtree(work_root, ignore_errors=True)  # checkpoints only serve an interrupted run
    return metrics, history


def quantize_draft(target, tokenizer, out: Path, spec: dict, heldout_convs, calibration_convs, params: dict,
                   target_dir: Path) -> dict:
    """out/model -> out/model-quantized with the quantize stage's own code, and its acceptance."""
    from pipeline.quantize import quantize_model

    name = params["draft_training"]["quantize"]
    texts = [full_text(tokenizer, m) for m in calibration_convs]
    q = quantize_model(out / "model", out / "model-quantized", name, spec, texts, params["quantize"]["calibration"])
    quantized = estimate_acceptance(target, load_causal_lm(out / "model-quantized"), tokenizer, heldout_convs,
                                    params["evaluate"]["acceptance"], target_dir, out / "model-quantized")
    return {"quantized_variant": name, "quantized_size_mb": q["size_after_mb"],
            "acceptance_rate_finetuned_quantized": quantized["acceptance_rate"],
            "expected_speedup_finetuned_quantized": quantized["expected_speedup"]}


def served_draft(out_dir: str | Path) -> Path:
    """The draft a bundle ships (the quantized one when built), so evaluation measures that one."""
    quantized = Path(out_dir) / "model-quantized"
    return quantized if quantized.exists() else Path(out_dir) / "model"
