"""Stage `gate`: check every variant against params.yaml thresholds; any failure fails `dvc repro`."""
import sys

from pipeline import gates
from pipeline.config import load_params, one_line_errors
from pipeline.io import read_json, write_csv, write_json

EVAL_DIR = "artifacts/eval"


@one_line_errors
def main() -> None:
    p = load_params()
    metrics = {v: read_json(f"{EVAL_DIR}/{v}/summary.json") for v in p["quantize"]["enabled"]}
    report = gates.run(p, metrics)
    write_json("metrics/gates.json", report)
    write_json("artifacts/gate/verdict.json", report)
    write_csv("plots/quality.csv", [{"variant": v, "kl_divergence": m.get("kl_divergence"),
                                     "perplexity_increase_pct": m.get("perplexity_increase_pct"),
                                     "top1_agreement": m.get("top1_agreement"), "acceptance_rate": m.get("acceptance_rate")}
                                    for v, m in metrics.items()])
    sys.exit(gates.conclude(report))


if __name__ == "__main__":
    main()
