"""Stage `gate`: check every variant against params.yaml thresholds; any failure fails `dvc repro`."""
import sys

from pathlib import Path

from pipeline.core import records
from pipeline.core.io import write_csv, write_json
from pipeline.core.stage import stage_main
from pipeline.params.load import load_params
from pipeline.release import gates
from pipeline.serving import capacity
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.tiers import serving_slo

EVAL_DIR, SERVE_DIR = Path("artifacts/eval"), Path("artifacts/serve")
PARETO = Path("artifacts/gate/pareto.png")  # every variant's configs against the SLO; each bundle carries it


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params(check_recipes=False)  # recipes: checked by `sources`, first in every repro
    enabled = p["quantize"]["enabled"]
    metrics = {v: records.read_object(EVAL_DIR / v / "summary.json") for v in enabled}
    serve = {v: records.read(ServeBenchRecord, SERVE_DIR / v / "record.json") for v in enabled}
    report = gates.run(p, metrics, serve_by_variant=serve)
    write_json("metrics/gates.json", gates.summary(report))
    records.write("artifacts/gate/verdict.json", report)
    PARETO.unlink(missing_ok=True)
    capacity.pareto_png(PARETO, serve, serving_slo(p["serving"])[0])  # none without a measurement: the card says so
    write_csv("plots/quality.csv", [{"variant": v, "kl_divergence": m.get("kl_divergence"),
                                     "perplexity_increase_pct": m.get("perplexity_increase_pct"),
                                     "top1_agreement": m.get("top1_agreement"),
                                     "accepted_per_draft_token": m.get("accepted_per_draft_token")}
                                    for v, m in metrics.items()])
    sys.exit(gates.conclude(report))


if __name__ == "__main__":
    main()
