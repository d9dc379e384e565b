"""What `dvc metrics show` shows: a few headline numbers per variant, written by the gate stage.

DVC's table has one row per metrics file and one column per key, the union over all files, so files with
different keys widen it (1,491 characters for the demo build, issue #49). Here each file is one measure keyed by
variant: every file has the same keys, so the table is one row per measure and one column per variant (within
120 characters for the demo's five variants: tests/release/test_metrics_headline.py). A measure nobody measured (the
serving benchmark's, without a GPU) has no file, and a variant without a value shows `-`. One folder per concern:

- `metrics/quality/`: fidelity to the unquantized target (the evaluate stage's): `kl_divergence`,
  `top1_agreement`, `perplexity_increase_pct`.
- `metrics/release/`: what the gate decided: `gate` (PASS, FAIL, or FAIL, allowed: shipped flagged by
  gates.allow_fail), `shipped_method` (none: plain decoding) and `shipped_k`; a blocked variant ships nothing and
  has no `shipped_*`.
- `metrics/speed/`: `estimated_method`, `estimated_k` and `estimated_speedup` (the CPU estimate's fastest method
  and its predicted served speedup at serving.target_concurrency: what could ship, not what does), and where the
  serving benchmark ran, `speedup_vs_bf16` and `capacity_vs_bf16` of what ships, as the gate checked them.

Everything else (`eval-<v>.json`, `gates.json`, `draft.json`, `quantize-<v>.json`, ...) is a plain output.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.io import atomic_dir, write_json
from pipeline.evaluate.summary import EvalSummary
from pipeline.release.gates import GateReport, VariantVerdict

QUALITY, RELEASE, SPEED = "quality", "release", "speed"  # the folders under metrics/ that dvc.yaml registers
FIDELITY = ("kl_divergence", "top1_agreement", "perplexity_increase_pct")  # Quality's fields, the gate's names
SERVED = ("speedup_vs_bf16", "capacity_vs_bf16")  # the gate's metrics of the config that ships
NO_SPECULATION = "none"

Value = float | int | str
Measures = dict[str, dict[str, Value]]  # measure -> variant -> value


def quality(summaries: dict[str, EvalSummary]) -> Measures:
    return _kept({name: {v: getattr(s.quality, name) for v, s in summaries.items()} for name in FIDELITY})


def gate_label(verdict: VariantVerdict) -> str:
    return "PASS" if verdict.passed else "FAIL, allowed" if verdict.allowed_failure else "FAIL"


def release(report: GateReport) -> Measures:
    """The verdict, and the speculative setting each shippable variant's bundle carries (the gate's decision)."""
    shipped = {
        v: d.speculation if (d := verdict.speculation) is not None else None
        for v, verdict in report.variants.items()
        if verdict.shippable
    }
    return _kept(
        {
            "gate": {v: gate_label(verdict) for v, verdict in report.variants.items()},
            "shipped_method": {
                v: s.method if s is not None and s.enabled else NO_SPECULATION for v, s in shipped.items()
            },
            "shipped_k": {v: s.k if s is not None and s.enabled else 0 for v, s in shipped.items()},
        }
    )


def served(verdict: VariantVerdict, metric: str) -> float | None:
    """A measured metric of the config that ships, as the gate's check read it; capacity_vs_bf16 also without its
    check (the capacity claim holds it)."""
    check = next((c for c in verdict.checks if c.metric == metric and not c.skipped and c.value is not None), None)
    if check is not None:
        return check.value
    if metric == "capacity_vs_bf16" and verdict.capacity is not None:
        return verdict.capacity.vs_bf16
    return None


def speed(summaries: dict[str, EvalSummary], report: GateReport) -> Measures:
    est = {v: s.speculation for v, s in summaries.items()}
    return _kept(
        {
            "estimated_method": {v: e.method for v, e in est.items()},
            "estimated_k": {v: e.num_speculative_tokens for v, e in est.items()},
            "estimated_speedup": {v: e.expected_speedup for v, e in est.items()},
            **{m: {v: served(verdict, m) for v, verdict in report.variants.items()} for m in SERVED},
        }
    )


def headline(summaries: dict[str, EvalSummary], report: GateReport) -> dict[str, Measures]:
    """folder -> measure -> variant -> value, for `write`."""
    return {QUALITY: quality(summaries), RELEASE: release(report), SPEED: speed(summaries, report)}


def write(root: str | Path, folders: dict[str, Measures]) -> None:
    """Each folder replaced whole (a measure measured last build and not this one leaves no stale file)."""
    for folder, measures in folders.items():
        with atomic_dir(Path(root) / folder) as tmp:
            for measure, values in measures.items():
                write_json(tmp / f"{measure}.json", values)


def _kept(measures: dict[str, dict[str, Value | None]]) -> Measures:
    """Without the variants that have no value, and without a measure that none has."""
    kept = {m: {v: x for v, x in values.items() if x is not None} for m, values in measures.items()}
    return {m: values for m, values in kept.items() if values}
