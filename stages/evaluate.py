"""Stage `evaluate@<variant>`: quality vs. the unquantized target, lm-eval, speculative acceptance.

Wiring only; the work is pipeline/evaluation.py's."""

from pipeline import evaluation as run
from pipeline.core.stage import stage_main
from pipeline.params.load import load_params, variant_argument


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "evaluate")
    ctx = run.configure(variant, load_params())  # a backend that can't run here fails before any work
    inputs = run.read_inputs(ctx.run)
    measured, model = run.measure_loaded(ctx, inputs)
    run.measure_engines(ctx, inputs, measured, model)
    del model
    run.write_outputs(ctx, measured)
    run.report(ctx, measured)


if __name__ == "__main__":
    main()
