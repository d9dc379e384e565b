"""Stage `gate`: check every variant against params.yaml thresholds; any failure fails `dvc repro`."""
import sys

from pipeline import gates, records
from pipeline.config import load_params
from pipeline.io import read_json, write_csv
from pipeline.stage import stage_main

EVAL_DIR = "artifacts/eval"


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params(check_recipes=False)  # recipes: checked by `sources`, first in every repro
    metrics = {v: read_json(f"{EVAL_DIR}/{v}/summary.json") for v in p["quantize"]["enabled"]}
    report = gates.run(p, metrics)
    records.write("metrics/gates.json", report)
    records.write("artifacts/gate/verdict.json", report)
    write_csv("plots/quality.csv", [{"variant": v, "kl_divergence": m.get("kl_divergence"),
                                     "perplexity_increase_pct": m.get("perplexity_increase_pct"),
                                     "top1_agreement": m.get("top1_agreement"),
                                     "accepted_per_draft_token": m.get("accepted_per_draft_token")}
                                    for v, m in metrics.items()])
    sys.exit(gates.conclude(report))


if __name__ == "__main__":
    main()
