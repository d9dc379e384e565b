"""Stage `draft_finetune`: fine-tune the base draft on the distilled examples (resumable)."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir, write_csv, write_json, write_skipped
from pipeline.core.stage import say, stage_main
from pipeline.data.traffic import read_split
from pipeline.drafts import methods
from pipeline.drafts.distill import pad_id, read_examples
from pipeline.drafts.draft_model import finetune_draft
from pipeline.drafts.finetune import loss_curve_rows
from pipeline.drafts.settings import DraftParams, DraftTrainingParams
from pipeline.models.loading import load_tokenizer
from pipeline.params.load import load_params, parse_section


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    cfg = parse_section(p, DraftTrainingParams)
    if methods.DRAFT_MODEL not in parse_section(p, DraftParams).method:  # nothing downstream reads a draft model then
        skipped = methods.not_requested(methods.DRAFT_MODEL)
        write_skipped(paths.DRAFT_FINETUNED, skipped)
        write_csv("plots/draft_loss.csv", [], ["step", "train_loss", "eval_loss"])
        write_json("metrics/draft_training.json", {"skipped": skipped})
        say(f"draft_finetune: skipped ({skipped})")
        return
    train, evals = read_examples(paths.DISTILL / "train.jsonl"), read_examples(paths.DISTILL / "eval.jsonl")
    n_prompts = len(read_split(paths.DRAFT_TRAIN))
    with atomic_dir(paths.DRAFT_FINETUNED) as tmp:
        metrics, history = finetune_draft(
            paths.DRAFT_BASE,
            pad_id(load_tokenizer(paths.DRAFT_BASE)),
            train,
            evals,
            cfg,
            paths.DRAFT_CHECKPOINTS,
            tmp,
            n_prompts,
        )
    write_csv("plots/draft_loss.csv", loss_curve_rows(history))
    write_json("metrics/draft_training.json", metrics)
    line = (
        f"draft_finetune: {metrics['train_steps']} steps, eval loss {metrics['eval_loss_untrained']:.3f} -> "
        f"{metrics['eval_loss_finetuned']:.3f}"
    )
    if metrics["target_agreement_finetuned"] is not None:
        line += (
            f", agreement with the target's answers {metrics['target_agreement_untrained']:.3f} -> "
            f"{metrics['target_agreement_finetuned']:.3f}"
        )
    if metrics["shipped"] == "base":
        by = "agrees with the target less" if metrics["ship_criterion"] == "target_agreement" else "is worse"
        line += (
            f"; the fine-tune {by} than the base draft, which ships unchanged (draft_training.learning_rate "
            f"{cfg.learning_rate} or draft_training.epochs may not suit a pretrained draft)"
        )
    say(line)


if __name__ == "__main__":
    main()
