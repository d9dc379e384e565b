"""Stage `serve_bench@<variant>`: the variant served as it would ship, under load, plain and with each
speculative method of draft.method (each at the k its CPU estimate found best on this variant), on each GEMM
kernel vLLM offers it, with the k schedule its sweep suggests and at each tier of serve_bench.tiers
(pipeline/serving/sweep.py measures; pipeline/release/decision.py chooses the kernel and the schedule). Without
CUDA and vLLM, or with serve_bench.enabled false, the record says why it was skipped and the gate falls back to
the CPU estimate.
"""

from pipeline.core import paths, records
from pipeline.core.io import atomic_dir
from pipeline.core.stage import say, stage_main
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate import vllm_spec
from pipeline.evaluate.settings import EvaluateParams
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.recipes import check_known, variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import decision
from pipeline.serving import sweep
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.parallelism import serving_for
from pipeline.serving.settings import ServeBenchParams


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "serve_bench")
    p = load_params()
    cfg = parse_section(p, ServeBenchParams)
    variants = parse_section(p, QuantizeParams).variants
    check_known(variants, variant)
    serving = serving_for(variant, p)  # at the variant's own tensor parallelism (pipeline/serving/parallelism.py)
    # The default sweep serves serve.yaml as it ships: at serving.tensor_parallel_size, or not at all. Decided
    # before the recipe is parsed, which a skipped record never needs.
    reason = vllm_spec.skip_reason(cfg.enabled, "serve_bench.enabled", serving.tensor_parallel_size)
    with atomic_dir(paths.SERVE / variant) as tmp:
        if reason:
            record = ServeBenchRecord(variant=variant, skipped=reason)
        else:
            run = sweep.Settings(
                bench=cfg,
                serving=serving,
                draft=parse_section(p, DraftParams),
                temperature=parse_section(p, EvaluateParams).acceptance.temperature,
                spec=variant_spec(variants, variant),
            )
            choose = sweep.Choices(decision.choose_kernel, decision.schedule_to_measure)
            record = sweep.measure(tmp, variant, sweep.candidates(run, variant), run, choose)
        records.write(tmp / "record.json", record)
    records.write(f"metrics/serve-{variant}.json", record)
    sweep.write_plots(record, serving.slo)
    say(sweep.summary_line(record, min(cfg.concurrency)))


if __name__ == "__main__":
    main()
