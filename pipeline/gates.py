"""Release gates: every check's value, threshold and verdict, from evaluation metrics."""
from __future__ import annotations

import json
import math
import sys
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


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_variant(metrics: dict, thresholds: dict) -> list[dict]:
    unknown = set(thresholds) - set(CHECKS)
    if unknown:
        raise PipelineError(f"unknown gate thresholds {sorted(unknown)}; known: {sorted(CHECKS)}")
    bad = {k: v for k, v in thresholds.items() if not _is_number(v) or math.isnan(v)}
    if bad:
        raise PipelineError(f"gate thresholds must be numbers: {bad}")
    results = []
    for name, threshold in thresholds.items():
        metric, op = CHECKS[name]
        value = metrics.get(metric)
        if value is None:
            if metric in REQUIRED:
                results.append({"check": name, "metric": metric, "value": None, "threshold": threshold,
                                "passed": False, "note": "metric missing"})
            continue
        if not _is_number(value):
            results.append({"check": name, "metric": metric, "value": value, "threshold": threshold,
                            "passed": False, "note": "not a number"})
            continue
        # NaN compares false everywhere, so a NaN metric fails its check.
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


def failed_checks(report: dict, allowed: bool) -> list[str]:
    """'variant: check (metric=value vs threshold)' for the failed checks of blocking (allowed=False)
    or of allow_fail (allowed=True) variants."""
    return [f"{variant}: {c['check']} ({c['metric']}={_short(c['value'])} {c.get('op', 'vs')} {c['threshold']})"
            for variant, v in report["variants"].items() if not v["passed"] and v["allowed_failure"] == allowed
            for c in v["checks"] if not c["passed"]]


def conclude(report: dict) -> int:
    """Print the report, warn about allowed failures, name every blocking failure; the exit code."""
    print_report(report)
    allowed = failed_checks(report, allowed=True)
    if allowed:
        print("warning: failed gates allowed by allow_fail (the bundle's model card carries a warning): "
              + "; ".join(allowed), file=sys.stderr)
    failed = failed_checks(report, allowed=False)
    if failed:
        print("error: gate failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def load_eval_metrics(metrics_dir: str | Path, variants: list[str] | None = None) -> dict[str, dict]:
    """eval-<variant>.json files from a metrics directory (this pipeline's or another runner's)."""
    metrics_dir = Path(metrics_dir)
    if not metrics_dir.is_dir():
        raise PipelineError(f"metrics directory {metrics_dir} not found")
    found = {}
    for f in sorted(metrics_dir.glob("eval-*.json")):
        try:
            metrics = read_json(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PipelineError(f"{f} is not valid JSON ({e})") from None
        if not isinstance(metrics, dict):
            raise PipelineError(f"{f} must hold a JSON object of metrics")
        found[f.stem.removeprefix("eval-")] = metrics
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

    if not isinstance(params.get("gates"), dict) or "thresholds" not in params["gates"]:
        raise PipelineError("params have no gates.thresholds section")
    allowed = list(params["gates"].get("allow_fail") or []) + list(allow_fail or [])
    known = set(metrics_by_variant) | set((params.get("quantize") or {}).get("variants") or {})
    unknown = [v for v in allowed if v not in known]
    if unknown:
        raise PipelineError(f"allow_fail names unknown variants {unknown}; known: {sorted(known)}")
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
