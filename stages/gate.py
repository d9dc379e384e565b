"""Stage `gate`: check every variant against params.yaml thresholds; any failure fails `dvc repro`."""

import sys

from pipeline.core import paths, records
from pipeline.core.io import write_csv, write_json
from pipeline.core.stage import stage_main
from pipeline.evaluate.summary import EvalSummary
from pipeline.params.load import load_params, parse_section
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import gates, headline
from pipeline.release.settings import GatesParams
from pipeline.serving import capacity
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.settings import ServingParams


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()  # checked as a whole by `sources`, first in every repro
    quantize, serving = parse_section(p, QuantizeParams), parse_section(p, ServingParams)
    summaries = {v: EvalSummary.load(paths.EVAL / v / "summary.json") for v in quantize.enabled}
    serve = {v: records.read(ServeBenchRecord, paths.SERVE / v / "record.json") for v in quantize.enabled}
    report = gates.run(parse_section(p, GatesParams), serving, quantize.variants, summaries, serve_by_variant=serve)
    write_json("metrics/gates.json", gates.summary(report))  # the detail; `dvc metrics show` has the headline:
    headline.write("metrics", headline.headline(summaries, report))
    records.write(paths.VERDICT, report)
    paths.PARETO.unlink(missing_ok=True)
    # none without a measurement: the card says so
    capacity.pareto_png(paths.PARETO, serve, serving.slo)
    write_csv(
        "plots/quality.csv",
        [
            {
                "variant": v,
                "kl_divergence": s.quality.kl_divergence,
                "perplexity_increase_pct": s.quality.perplexity_increase_pct,
                "top1_agreement": s.quality.top1_agreement,
                "accepted_per_draft_token": s.speculation.accepted_per_draft_token,
            }
            for v, s in summaries.items()
        ],
    )
    sys.exit(gates.conclude(report))


if __name__ == "__main__":
    main()
