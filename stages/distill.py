"""Stage `distill`: the target's own answers to draft-train prompts, the draft's training data."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir, write_skipped
from pipeline.core.stage import say, stage_main
from pipeline.data.traffic import read_split
from pipeline.drafts import methods
from pipeline.drafts.distill import build_distillation_set, transformers_generate, write_examples
from pipeline.drafts.distill_vllm import resolve_generator, vllm_generate
from pipeline.drafts.settings import DraftParams, DraftTrainingParams
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.params.load import load_params, parse_section
from pipeline.serving.parallelism import target_tensor_parallel
from pipeline.serving.settings import ServingParams

TRAINED = (methods.DRAFT_MODEL, methods.EAGLE3)  # the methods that learn from the target's answers


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    cfg, serving = parse_section(p, DraftTrainingParams), parse_section(p, ServingParams)
    if not set(TRAINED) & set(parse_section(p, DraftParams).method):  # n-gram alone: nothing learns from the answers
        skipped = f"neither {' nor '.join(TRAINED)} is in draft.method"
        write_skipped(paths.DISTILL, skipped)
        say(f"distill: skipped ({skipped})")
        return
    tp = target_tensor_parallel(p)  # the unquantized target's GPUs per replica (pipeline/serving/parallelism.py)
    generator = resolve_generator(cfg.generator, tp)
    train_convs = read_split(paths.DRAFT_TRAIN)
    eval_convs = read_split(paths.HELDOUT)[: cfg.eval_prompts]
    tokenizer = load_tokenizer(paths.TARGET)
    if generator == "vllm":
        generate = vllm_generate(
            paths.TARGET, tokenizer.eos_token_id, cfg.max_new_tokens, serving.max_model_len, cfg.vllm, tp
        )
    else:
        generate = transformers_generate(
            load_causal_lm(paths.TARGET), tokenizer, cfg.max_new_tokens, cfg.generation_batch_size
        )
    train = build_distillation_set(generate, tokenizer, train_convs, cfg)
    evals = build_distillation_set(generate, tokenizer, eval_convs, cfg, sampled=False)
    with atomic_dir(paths.DISTILL) as tmp:
        write_examples(tmp / "train.jsonl", train)
        write_examples(tmp / "eval.jsonl", evals)
    say(
        f"distill ({generator}): {len(train)} training and {len(evals)} eval examples from {len(train_convs)} prompts, "
        f"{sum(len(e['input_ids']) for e in train)} tokens"
    )


if __name__ == "__main__":
    main()
