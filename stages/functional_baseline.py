"""Stage `functional_baseline`: the unquantized target's pass@1 on evaluate.functional.tasks, measured once for
every variant (each evaluate@<variant> compares its own pass@1 with this one; bf16's is this one). Generated code runs
only in the sandbox (pipeline/evaluate/sandbox.py). With no tasks set, a record saying so."""

from pipeline.core import paths
from pipeline.core.io import write_json
from pipeline.core.stage import say, stage_main
from pipeline.evaluate import functional
from pipeline.evaluate.settings import EvaluateParams
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.params.load import load_params, parse_section


@stage_main()
def main(argv: list[str]) -> None:
    cfg = parse_section(load_params(), EvaluateParams).functional
    tasks = functional.tasks_of(cfg)  # a bad task file fails here, before the model loads
    paths.FUNCTIONAL_BASELINE.parent.mkdir(parents=True, exist_ok=True)
    if tasks is None:
        reason = "evaluate.functional.tasks is not set"
        write_json(paths.FUNCTIONAL_BASELINE, {"skipped": reason})
        say(f"functional_baseline: skipped ({reason})")
        return
    tokenizer, target = load_tokenizer(paths.TARGET), load_causal_lm(paths.TARGET)
    run = functional.pass_at_1(target, tokenizer, tasks, cfg.max_new_tokens, functional.limits_of(cfg))
    functional.write_baseline(paths.FUNCTIONAL_BASELINE, run, cfg)
    say(
        f"functional_baseline: pass@1 {run.pass_at_1:.3f} over {run.tasks} tasks (the unquantized target, "
        "measured once for every variant)"
    )


if __name__ == "__main__":
    main()
