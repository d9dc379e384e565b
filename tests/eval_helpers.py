"""Evaluation summaries for tests, from metrics as metrics/eval-<v>.json names them (read by the pipeline's own
EvalSummary.from_metrics: a name the summary does not have fails the test that wrote it), and the gates run on them."""

from __future__ import annotations

from pipeline.evaluate.summary import EvalSummary
from pipeline.release import gates
from pipeline.release.settings import GatesParams
from tiny_project import serving_of


def eval_summary(metrics: dict) -> EvalSummary:
    return EvalSummary.from_metrics(metrics, "test metrics")


def eval_summaries(metrics_by_variant: dict[str, dict]) -> dict[str, EvalSummary]:
    return {v: eval_summary(m) for v, m in metrics_by_variant.items()}


def gate_report(params: dict, summaries: dict[str, EvalSummary], **kw) -> gates.GateReport:
    """gates.run on the sections of a params.yaml mapping it reads, parsed as the gate stage parses them."""
    return gates.run(
        GatesParams.parse(params["gates"]), serving_of(params), params["quantize"]["variants"], summaries, **kw
    )
