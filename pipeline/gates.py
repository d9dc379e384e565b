"""Release gates: every check's value, threshold and verdict, from evaluation metrics."""
from __future__ import annotations

from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.io import read_json

# threshold key -> (metric key, comparison). A metric that was not measured is skipped,
# except those listed in REQUIRED: a gate can't pass on missing quality numbers.
CHECKS = {
    "max_perplexity_increase_pct": ("perplexity_increase_pct", "<="),
    "max_kl_divergence": ("kl_divergence", "<="),
    "min_top1_agreement": ("top1_agreement", ">="),
    "min_acceptance_rate": ("acceptance_rate", ">="),
    "min_measured_speedup": ("measured_speedup", ">"),
}
REQUIRED = {"perplexity_increase_pct", "kl_divergence", "top1_agreement", "acceptance_rate"}


def check_variant(metrics: dict, thresholds: dict) -> list[dict]:
    unknown = set(thresholds) - set(CHECKS)
    if unknown:
        raise PipelineError(f"unknown gate thresholds {sorted(unknown)}; known: {sorted(CHECKS)}")
    results = []
    for name, threshold in thresholds.items():
        metric, op = CHECKS[name]
        value = metrics.get(metric)
        if value is None:
            if metric in REQUIRED:
                results.append({"check": name, "metric": metric, "value": None, "threshold": threshold,
                                "passed": False, "note": "metric missing"})
            continue
        passed = value <= threshold if op == "<=" else value >= threshold if op == ">=" else value > threshold
        results.append({"check": name, "metric": metric, "value": value, "threshold": threshold, "op": op,
                        "passed": bool(passed)})
    return results


def evaluate_gates(metrics_by_variant: dict[str, dict], thresholds_for, allow_fail: list[str]) -> dict:
    """{variant: {passed, allowed_failure, checks}} plus the overall verdict."""
    report = {}
    for variant, metrics in metrics_by_variant.items():
        checks = check_variant(metrics, thresholds_for(variant))
        passed = all(c["passed"] for c in checks)
        report[variant] = {"passed": passed, "allowed_failure": (not passed) and variant in allow_fail,
                           "checks": checks}
    ok = all(v["passed"] or v["allowed_failure"] for v in report.values())
    return {"passed": ok, "variants": report}


def failures(report: dict) -> list[str]:
    return [f"{variant}: {c['check']} ({c['metric']}={c['value']} vs {c['threshold']})"
            for variant, v in report["variants"].items() if not v["passed"] and not v["allowed_failure"]
            for c in v["checks"] if not c["passed"]]


def load_eval_metrics(metrics_dir: str | Path, variants: list[str] | None = None) -> dict[str, dict]:
    """eval-<variant>.json files from a metrics directory (this pipeline's or another runner's)."""
    metrics_dir = Path(metrics_dir)
    files = sorted(metrics_dir.glob("eval-*.json"))
    found = {f.stem.removeprefix("eval-"): read_json(f) for f in files}
    if variants is not None:
        missing = [v for v in variants if v not in found]
        if missing:
            raise PipelineError(f"no evaluation metrics for {missing} in {metrics_dir}")
        found = {v: found[v] for v in variants}
    if not found:
        raise PipelineError(f"no eval-*.json metrics in {metrics_dir}")
    return found


def run(params: dict, metrics_by_variant: dict[str, dict], allow_fail: list[str] | None = None) -> dict:
    """Gate every variant with params.yaml's thresholds; allow_fail adds to gates.allow_fail."""
    from pipeline.config import gate_thresholds

    allowed = list(params["gates"].get("allow_fail") or []) + list(allow_fail or [])
    return evaluate_gates(metrics_by_variant, lambda v: gate_thresholds(params, v), allowed)


def print_report(report: dict) -> None:
    for variant, v in report["variants"].items():
        verdict = "PASS" if v["passed"] else "FAIL (allowed, flagged)" if v["allowed_failure"] else "FAIL"
        print(f"gate {variant}: {verdict}")
        for c in v["checks"]:
            print(f"    {'ok  ' if c['passed'] else 'FAIL'} {c['check']}: {c['metric']}={_short(c['value'])} "
                  f"{c.get('op', '')} {c['threshold']}")


def _short(v):
    return f"{v:.4g}" if isinstance(v, float) else v
