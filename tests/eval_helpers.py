"""Evaluation summaries for tests, from metrics as metrics/eval-<v>.json names them (read by the pipeline's own
EvalSummary.from_metrics: a name the summary does not have fails the test that wrote it)."""
from __future__ import annotations

from pipeline.evaluate.summary import EvalSummary


def eval_summary(metrics: dict) -> EvalSummary:
    return EvalSummary.from_metrics(metrics, "test metrics")


def eval_summaries(metrics_by_variant: dict[str, dict]) -> dict[str, EvalSummary]:
    return {v: eval_summary(m) for v, m in metrics_by_variant.items()}
