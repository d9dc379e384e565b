"""One gate check: a metric's value against its threshold (pipeline/release/thresholds.py), and its verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipeline.core.values import is_number
from pipeline.release.thresholds import QUALITY, check_for


@dataclass
class GateCheck:
    check: str
    metric: str
    value: float | None
    threshold: float
    op: str
    passed: bool | None  # None: skipped, not applied (GATE.json must not call an unapplied check passed)
    note: str | None = None
    group: str = QUALITY
    skipped: str | None = None  # why a check that needs a GPU measurement was not applied

    @property
    def failed(self) -> bool:
        return self.passed is False

    def describe(self) -> str:
        """'top1_agreement=0.8956, needs >= 0.9 (short by 0.0044)': what failed and by how much."""
        if self.skipped:
            return f"{self.metric}: skipped ({self.skipped})"
        if self.value is None or self.note:
            return f"{self.metric}: {self.note or 'missing'}, needs {self.op} {self.threshold}"
        text = f"{self.metric}={short(self.value)}, needs {self.op} {self.threshold}"
        if not self.passed and isinstance(self.value, (int, float)) and not math.isnan(self.value):
            gap = abs(self.value - self.threshold)
            text += f" ({'over' if self.op == '<=' else 'short'} by {short(gap)})"
        return text


def check_variant(
    metrics: dict,
    thresholds: dict,
    group: str | None = None,
    skip_reason: str | None = None,
    reasons: dict[str, str] | None = None,
) -> list[GateCheck]:
    """The checks of one group (all when None). A missing optional metric is a skipped check, reported
    with skip_reason (reasons: a check's own, where it has one); a missing required one fails."""
    reasons = reasons or {}
    results = []
    for name, threshold in thresholds.items():
        spec = check_for(name)
        if group is not None and spec.group != group:
            continue
        metric = next((m for m in spec.metrics if metrics.get(m) is not None), spec.metrics[-1])
        value = metrics.get(metric)
        if value is None:
            if spec.required:
                results.append(GateCheck(name, metric, None, threshold, spec.op, False, "metric missing", spec.group))
            else:
                results.append(
                    GateCheck(
                        name,
                        metric,
                        None,
                        threshold,
                        spec.op,
                        None,
                        None,
                        spec.group,
                        reasons.get(name) or skip_reason or "not measured",
                    )
                )
            continue
        if not is_number(value):
            results.append(
                GateCheck(name, metric, None, threshold, spec.op, False, f"not a number ({value!r})", spec.group)
            )
            continue
        # NaN compares false everywhere, so a NaN metric fails its check.
        passed = value <= threshold if spec.op == "<=" else value >= threshold if spec.op == ">=" else value > threshold
        results.append(GateCheck(name, metric, value, threshold, spec.op, bool(passed), None, spec.group))
    return results


# An acceptance floor guards against a drafter whose rejected tokens each cost a forward pass (a draft model, an
# EAGLE-3 head); n-gram lookups cost no GPU work, so a low acceptance wastes only the verify tokens, which the
# measured or predicted speedup already counts: for n-gram the speedup against min_gain decides alone. The same holds
# for the drop against the baseline variant, which guards a draft trained against BF16: an n-gram lookup is trained
# against nothing, and its acceptance on this variant is already in this variant's speedup.
DRAFTER_COST_CHECKS = ("min_accepted_per_draft_token", "max_acceptance_drop_vs_bf16")


def drafter_cost_free(check: GateCheck) -> GateCheck:
    return replace(
        check,
        passed=None,
        note=None,
        skipped="n-gram lookups cost no GPU forward pass: its speedup against min_gain decides",
    )


def short(v):
    return f"{v:.4g}" if isinstance(v, float) else v
