"""Stage `draft`: check compatibility, distill the target's answers, fine-tune the draft."""
import hashlib
import json
import shutil
from pathlib import Path

from pipeline import acceptance
from pipeline.config import load_params, one_line_errors
from pipeline.data import read_split
from pipeline.draft import build_distillation_set, check_compatible, fine_tune, loss_curve_rows, summarize
from pipeline.formatting import prompt_ids, split_prompt_response
from pipeline.io import atomic_dir, write_csv, write_json
from pipeline.loading import load_causal_lm, load_tokenizer

TARGET, BASE = Path("artifacts/models/target"), Path("artifacts/models/draft-base")
OUT = Path("artifacts/draft")


def estimate_acceptance(target, draft, tokenizer, heldout, cfg, draft_dir) -> dict:
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in heldout[: cfg["prompts"]]]
    ratio = cfg["cost_ratio"]
    ratio = (acceptance.weight_bytes_ratio(TARGET, draft_dir) if ratio == "weight_bytes"
             else None if ratio == "measured" else float(ratio))
    return acceptance.estimate(target, draft, prompts, cfg["continuation_tokens"], cfg["temperature"], cfg["max_k"],
                               ratio)


@one_line_errors
def main() -> None:
    p = load_params()
    cfg = p["draft_training"]
    target_tok, draft_tok = load_tokenizer(TARGET), load_tokenizer(BASE)
    target, draft = load_causal_lm(TARGET), load_causal_lm(BASE)
    check_compatible(target_tok, draft_tok, target.config, draft.config, p["serving"]["max_model_len"])

    train = build_distillation_set(target, target_tok, read_split("artifacts/data/draft_train.jsonl"), cfg)
    heldout = read_split("artifacts/data/heldout.jsonl")
    evals = build_distillation_set(target, target_tok, heldout[:32], {**cfg, "sampled_responses": 0})
    before = estimate_acceptance(target, draft, target_tok, heldout, p["evaluate"]["acceptance"], BASE)

    # Checkpoints live under a key of everything that shapes training, so `resume` never
    # continues a run made with other data or settings.
    key = hashlib.sha256(json.dumps([cfg, [t["input_ids"] for t in train]]).encode()).hexdigest()[:16]
    work = Path("artifacts/.cache/draft") / key
    tuned, history = fine_tune(draft, draft_tok, train, evals, cfg, work)
    after = estimate_acceptance(target, tuned, target_tok, heldout, p["evaluate"]["acceptance"], BASE)

    with atomic_dir(OUT) as tmp:
        tuned.save_pretrained(tmp / "model")
        draft_tok.save_pretrained(tmp / "model")
        if cfg.get("quantize"):
            from pipeline.config import enabled_variant
            from pipeline.quantize import quantize_model
            from pipeline.formatting import full_text

            texts = [full_text(draft_tok, m) for m in read_split("artifacts/data/calibration.jsonl")]
            quantize_model(tmp / "model", tmp / "model-quantized", cfg["quantize"],
                           enabled_variant(p, cfg["quantize"]), texts, p["quantize"]["calibration"])
    shutil.rmtree(work, ignore_errors=True)
    write_csv("plots/draft_loss.csv", loss_curve_rows(history))
    metrics = {"train_examples": len(train), **summarize(history),
               "acceptance_rate_untrained": before["acceptance_rate"], "acceptance_rate_finetuned": after["acceptance_rate"],
               "expected_speedup_untrained": before["expected_speedup"],
               "expected_speedup_finetuned": after["expected_speedup"],
               "num_speculative_tokens_finetuned": after["num_speculative_tokens"]}
    write_json("metrics/draft.json", metrics)
    print(f"draft: acceptance {before['acceptance_rate']:.3f} (untrained) -> {after['acceptance_rate']:.3f} "
          f"(fine-tuned)")


if __name__ == "__main__":
    main()
