"""Release gates: every check's value, threshold and verdict, from evaluation metrics."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.io import read_json
from pipeline.stage import say, warn


@dataclass(frozen=True)
class Check:
    """threshold key -> the metric(s) it reads, first present wins, and the comparison."""
    metrics: tuple[str, ...]
    op: str  # "<=", ">=" or ">"
    required: bool  # a gate can't pass on missing quality numbers; GPU-only metrics are skipped


CHECKS = {
    "max_perplexity_increase_pct": Check(("perplexity_increase_pct",), "<=", True),
    "max_kl_divergence": Check(("kl_divergence",), "<=", True),
    "min_top1_agreement": Check(("top1_agreement",), ">=", True),
    # vLLM's accepted/drafted token ratio: measured when a GPU run exists, else the CPU estimate of it.
    "min_accepted_per_draft_token": Check(("vllm_accepted_per_draft_token", "accepted_per_draft_token"), ">=", True),
    "min_vllm_speculative_speedup": Check(("vllm_speculative_speedup",), ">", False),
}


@dataclass
class GateCheck:
    check: str
    metric: str
    value: float | None
    threshold: float
    op: str
    passed: bool
    note: str | None = None

    def describe(self) -> str:
        """'top1_agreement=0.8956, needs >= 0.9 (short by 0.0044)': what failed and by how much."""
        if self.value is None or self.note:
            return f"{self.metric}: {self.note or 'missing'}, needs {self.op} {self.threshold}"
        text = f"{self.metric}={_short(self.value)}, needs {self.op} {self.threshold}"
        if not self.passed and isinstance(self.value, (int, float)) and not math.isnan(self.value):
            gap = abs(self.value - self.threshold)
            text += f" ({'over' if self.op == '<=' else 'short'} by {_short(gap)})"
        return text


@dataclass
class VariantVerdict:
    passed: bool
    allowed_failure: bool
    checks: list[GateCheck] = field(default_factory=list)

    @property
    def shippable(self) -> bool:
        return self.passed or self.allowed_failure

    @property
    def label(self) -> str:
        return "PASS" if self.passed else "FAIL (allowed, flagged)" if self.allowed_failure else "FAIL"


@dataclass
class GateReport:
    passed: bool
    variants: dict[str, VariantVerdict]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_thresholds(thresholds: dict, where: str) -> None:
    unknown = set(thresholds) - set(CHECKS)
    if unknown:
        raise PipelineError(f"{where}: unknown gate thresholds {sorted(unknown)}; known: {sorted(CHECKS)}")
    bad = {k: v for k, v in thresholds.items() if not _is_number(v) or math.isnan(v)}
    if bad:
        raise PipelineError(f"{where}: gate thresholds must be numbers: {bad}")


def check_variant(metrics: dict, thresholds: dict) -> list[GateCheck]:
    results = []
    for name, threshold in thresholds.items():
        spec = CHECKS[name]
        metric = next((m for m in spec.metrics if metrics.get(m) is not None), spec.metrics[-1])
        value = metrics.get(metric)
        if value is None:
            if spec.required:
                results.append(GateCheck(name, metric, None, threshold, spec.op, False, "metric missing"))
            continue
        if not _is_number(value):
            results.append(GateCheck(name, metric, None, threshold, spec.op, False, f"not a number ({value!r})"))
            continue
        # NaN compares false everywhere, so a NaN metric fails its check.
        passed = (value <= threshold if spec.op == "<=" else value >= threshold if spec.op == ">="
                  else value > threshold)
        results.append(GateCheck(name, metric, value, threshold, spec.op, bool(passed)))
    return results


def evaluate_gates(metrics_by_variant: dict[str, dict], thresholds_for, allow_fail: list[str]) -> GateReport:
    report = {}
    for variant, metrics in metrics_by_variant.items():
        checks = check_variant(metrics, thresholds_for(variant))
        passed = all(c.passed for c in checks)
        report[variant] = VariantVerdict(passed, (not passed) and variant in allow_fail, checks)
    return GateReport(all(v.shippable for v in report.values()), report)


def failed_checks(report: GateReport, allowed: bool) -> list[str]:
    """'variant: check (what, needs, by how much)' for the failed checks of blocking (allowed=False)
    or of allow_fail (allowed=True) variants."""
    return [f"{variant}: {c.check} ({c.describe()})"
            for variant, v in report.variants.items() if not v.passed and v.allowed_failure == allowed
            for c in v.checks if not c.passed]


def conclude(report: GateReport) -> int:
    """One line per variant, a warning for allowed failures, every blocking failure named; the exit code."""
    for variant, v in report.variants.items():
        failed = [c.check for c in v.checks if not c.passed]
        say(f"gate {variant}: {v.label}" + (f" ({', '.join(failed)})" if failed else f" ({len(v.checks)} checks)"))
    allowed = failed_checks(report, allowed=True)
    if allowed:
        warn("warning: failed gates allowed by allow_fail (the bundle's model card carries a warning): "
            + "; ".join(allowed))
    failed = failed_checks(report, allowed=False)
    if failed:
        warn("error: gate failed: " + "; ".join(failed))
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


def run(params: dict, metrics_by_variant: dict[str, dict], allow_fail: list[str] | None = None) -> GateReport:
    """Gate every variant with params.yaml's thresholds (validated by load_params); allow_fail adds
    to gates.allow_fail."""
    from pipeline.config import gate_thresholds

    allowed = list(params["gates"].get("allow_fail") or []) + list(allow_fail or [])
    known = set(metrics_by_variant) | set(params["quantize"]["variants"])
    unknown = [v for v in allowed if v not in known]
    if unknown:
        raise PipelineError(f"allow_fail names unknown variants {unknown}; known: {sorted(known)}")
    return evaluate_gates(metrics_by_variant, lambda v: gate_thresholds(params, v), allowed)


def _short(v):
    return f"{v:.4g}" if isinstance(v, float) else v
