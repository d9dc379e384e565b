"""Stage `distill`: the target's own answers to draft-train prompts, the draft's training data."""
from pathlib import Path

from pipeline.config import load_params
from pipeline.data import read_split
from pipeline.distill import build_distillation_set, write_examples
from pipeline.io import atomic_dir
from pipeline.loading import load_causal_lm, load_tokenizer
from pipeline.stage import say, stage_main

TARGET, DATA, OUT = Path("artifacts/models/target"), Path("artifacts/data"), Path("artifacts/distill")


@stage_main()
def main(argv: list[str]) -> None:
    cfg = load_params()["draft_training"]
    train_convs = read_split(DATA / "draft_train.jsonl")
    eval_convs = read_split(DATA / "heldout.jsonl")[: cfg["eval_prompts"]]
    target, tokenizer = load_causal_lm(TARGET), load_tokenizer(TARGET)
    train = build_distillation_set(target, tokenizer, train_convs, cfg)
    evals = build_distillation_set(target, tokenizer, eval_convs, cfg, sampled=False)
    with atomic_dir(OUT) as tmp:
        write_examples(tmp / "train.jsonl", train)
        write_examples(tmp / "eval.jsonl", evals)
    say(f"distill: {len(train)} training and {len(evals)} eval examples from {len(train_convs)} prompts, "
        f"{sum(len(e['input_ids']) for e in train)} tokens")


if __name__ == "__main__":
    main()
