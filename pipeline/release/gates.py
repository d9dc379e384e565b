"""Release gates: every check's value, threshold and verdict, from evaluation metrics. What ships is decided in
pipeline/release/decision.py; the gate checks it and writes both into artifacts/gate/verdict.json."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.core.stage import say, warn
from pipeline.drafts.methods import METHODS
from pipeline.evaluate.summary import METHOD_SPEEDUP, PREDICTED, EvalSummary, current_names
from pipeline.release import decision
from pipeline.release.capacity_claim import AT_LEAST, AT_MOST, CapacityClaim  # noqa: F401 (re-exported)
from pipeline.release.checks import GateCheck, check_variant, short  # noqa: F401 (GateCheck: re-exported)
from pipeline.release.decision import CostRow, ServingContext, SpeculationDecision
from pipeline.release.settings import GatesParams
from pipeline.release.thresholds import QUALITY, SERVING, SPECULATION
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.settings import ServingParams


@dataclass
class VariantVerdict:
    passed: bool  # every quality and serving check passed (speculation checks only turn the draft off)
    allowed_failure: bool
    checks: list[GateCheck] = field(default_factory=list)
    speculation: SpeculationDecision | None = None
    capacity: CapacityClaim | None = None  # None: not measured (no serving benchmark, or no capacity search)

    @property
    def shippable(self) -> bool:
        return self.passed or self.allowed_failure

    def applied(self, check: str) -> GateCheck | None:
        """The check as applied to a value (None when it was not configured, had no value or was skipped)."""
        return next((c for c in self.checks if c.check == check and c.value is not None and not c.skipped), None)

    @property
    def label(self) -> str:
        return "PASS" if self.passed else "FAIL (allowed, flagged)" if self.allowed_failure else "FAIL"


@dataclass
class GateReport:
    """The gate run. all_passed: every variant passed every quality and serving check (allowed failures are
    failures); published_with_failures: the variants that failed and ship anyway, flagged, by gates.allow_fail;
    blocked: those that failed without it (the gate stage fails)."""

    all_passed: bool
    variants: dict[str, VariantVerdict]
    published_with_failures: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    allow_fail: list[str] = field(default_factory=list)  # gates.allow_fail (and --allow-fail) as applied
    # Each variant's shipped config at the SLO, cheapest per output token first (most output tokens/s per GPU), and
    # the variant that passed a serving team would pick (None: nothing comparable was searched, with why).
    per_gpu: list[CostRow] = field(default_factory=list)
    recommended: str | None = None
    recommended_note: str | None = None

    @property
    def shippable(self) -> bool:
        """No blocking failure: every variant passed or is allowed to fail."""
        return not self.blocked


NO_FUNCTIONAL = "not measured: evaluate.functional.tasks is not set (no functional check of generated code)"


def quality_skip_reasons(summary: EvalSummary) -> dict[str, str]:
    """Why an optional quality check has no value, where the summary says (the functional check was off)."""
    return {"max_pass_at_1_drop": NO_FUNCTIONAL} if summary.functional is None else {}


def gate_variant(
    summary: EvalSummary,
    serve: ServeBenchRecord | None,
    thresholds: dict,
    ctx: ServingContext,
    allowed: bool,
    variant: str | None = None,
) -> VariantVerdict:
    """Check the variant's quality and the config that ships, as pipeline/release/decision.py decided it.

    A draft that fails a speculation check is turned off there (the bundle ships without speculative-config, its
    card says why); only quality and serving checks fail a variant."""
    d = decision.decide(decision.Inputs(summary, serve, thresholds, ctx, variant))
    not_served = (
        serve.skipped
        if serve is not None and serve.skipped
        else "no serving benchmark"
        if serve is None
        else "no serving benchmark of the baseline variant on the same GPU and vLLM"
    )
    reasons = {"min_capacity_vs_bf16": f"not measured: {d.capacity_reason}"} if d.capacity_reason else {}
    metrics = dict(d.metrics)
    checks = (
        check_variant(metrics, thresholds, QUALITY, reasons=quality_skip_reasons(summary))
        + list(d.speculation_checks)
        + check_variant(metrics, thresholds, SERVING, f"not measured: {not_served}", reasons)
    )
    passed = not any(c.failed for c in checks if c.group != SPECULATION)
    return VariantVerdict(passed, (not passed) and allowed, checks, d.speculation, d.capacity)


def evaluate_gates(
    summaries: dict[str, EvalSummary],
    thresholds_for,
    allow_fail: list[str],
    serve_by_variant: dict[str, ServeBenchRecord] | None = None,
    ctx: ServingContext | None = None,
) -> GateReport:
    serve_by_variant = serve_by_variant or {}
    ctx = ctx or ServingContext(target_concurrency=1, min_gain=1.0, baseline=None)
    # every variant's acceptance is compared with the baseline's (max_acceptance_drop_vs_bf16)
    ctx = replace(ctx, baseline_acceptance=decision.acceptance_by_method(summaries.get(ctx.baseline_variant)))
    report = {
        v: gate_variant(m, serve_by_variant.get(v), thresholds_for(v), ctx, v in allow_fail, v)
        for v, m in summaries.items()
    }
    rows = decision.cost_rows(
        {n: v.passed for n, v in report.items()}, {n: v.capacity for n, v in report.items()}, serve_by_variant
    )
    recommended, why = decision.cheapest(rows, serve_by_variant)
    return GateReport(
        all_passed=all(v.passed for v in report.values()),
        variants=report,
        published_with_failures=[n for n, v in report.items() if v.allowed_failure],
        blocked=[n for n, v in report.items() if not v.shippable],
        allow_fail=sorted(set(allow_fail)),
        per_gpu=rows,
        recommended=recommended,
        recommended_note=why,
    )


def summary(report: GateReport) -> dict:
    """metrics/gates.json: what the gate run decided, in a few scalar columns for `dvc metrics show` (all_passed is
    false whenever a variant failed, allowed or not), and per variant in a list (which DVC's table leaves out): its
    verdict, failed checks and the speculation that ships. Every check's value and threshold stay in
    artifacts/gate/verdict.json."""
    return {
        "all_passed": report.all_passed,
        "variants_passed": sum(v.passed for v in report.variants.values()),
        "variants_failed": sum(not v.passed for v in report.variants.values()),
        "published_with_failures": report.published_with_failures,
        "blocked": report.blocked,
        "allow_fail": report.allow_fail,
        "variants": [
            {
                "variant": name,
                "passed": v.passed,
                "allowed_failure": v.allowed_failure,
                "verdict": v.label,
                "counts": check_counts(v),
                "failed_checks": [c.check for c in v.checks if c.failed and c.group != SPECULATION],
                "failed_speculation_checks": [c.check for c in v.checks if c.failed and c.group == SPECULATION],
                "speculation": None
                if v.speculation is None
                else {
                    "method": v.speculation.method if v.speculation.num_speculative_tokens else None,
                    "num_speculative_tokens": v.speculation.num_speculative_tokens,
                    "basis": v.speculation.basis,
                    "reason": v.speculation.reason,
                },
                "capacity": None
                if v.capacity is None
                else {
                    "slo": v.capacity.slo.label(),
                    "users_per_gpu": v.capacity.users_per_gpu,
                    "at_least": v.capacity.lower_bound,
                    "output_tokens_per_s_per_gpu": v.capacity.output_tokens_per_s_per_gpu,
                    "vs_bf16": v.capacity.vs_bf16,
                    "vs_bf16_bound": v.capacity.vs_bf16_bound,
                    "gpus": v.capacity.gpus,
                    "baseline_gpus": v.capacity.baseline_gpus,
                    "cost_per_million_output_tokens": v.capacity.cost_per_million_output_tokens,
                    "cost_vs_bf16": v.capacity.cost_vs_bf16,
                },
            }
            for name, v in report.variants.items()
        ],
        "recommended": recommended_summary(report),
    }


def recommended_summary(report: GateReport) -> dict | None:
    """The cheapest variant that passed, per output token at the SLO, and on how many GPUs a replica runs."""
    row = next((r for r in report.per_gpu if r.variant == report.recommended), None)
    return (
        None
        if row is None
        else {
            "variant": row.variant,
            "config": row.config,
            "gpus": row.gpus,
            "output_tokens_per_s_per_gpu": row.output_tokens_per_s_per_gpu,
            "cost_per_million_output_tokens": row.cost_per_million_output_tokens,
        }
    )


def recommendation_line(report: GateReport) -> str | None:
    """'gate: lowest cost per output token at the SLO: int4 (plain) on 1 GPU per replica, ...', or None where no
    config was searched."""
    if not report.per_gpu:
        return None
    rows = ", ".join(
        f"{r.variant} {short(r.output_tokens_per_s_per_gpu or 0.0)} tok/s/GPU on {r.gpus}"
        + (
            f" ({short(r.cost_per_million_output_tokens)} per M tokens)"
            if r.cost_per_million_output_tokens is not None
            else ""
        )
        for r in report.per_gpu
    )
    if report.recommended is None:
        return f"gate: no recommendation ({report.recommended_note}); per GPU at the SLO: {rows}"
    best = next(r for r in report.per_gpu if r.variant == report.recommended)
    return (
        f"gate: lowest cost per output token at the SLO: {best.variant} ({best.config}) on {best.gpus} "
        f"GPU{'s' if best.gpus > 1 else ''} per replica; per GPU: {rows}"
    )


def check_counts(v: VariantVerdict) -> dict[str, int]:
    """How many checks passed, failed (a failed speculation check turns speculation off rather than failing the
    variant: counted apart) and were skipped (nothing measured, or no speculation shipped to check)."""
    applied = [c for c in v.checks if not c.skipped]
    return {
        "checks": len(v.checks),
        "passed": sum(c.passed is True for c in applied),
        "failed": sum(c.failed and c.group != SPECULATION for c in applied),
        "speculation_failed": sum(c.failed and c.group == SPECULATION for c in applied),
        "skipped": len(v.checks) - len(applied),
    }


def verdict_line(variant: str, v: VariantVerdict) -> str:
    """'gate bf16: PASS: 4 of 10 checks passed, 1 speculation check failed (min_accepted_per_draft_token: no
    speculation ships), 5 skipped; ships without speculation (estimated)': every check counted once, as what it was."""
    n = check_counts(v)
    failed = [c.check for c in v.checks if c.failed and c.group != SPECULATION]
    spec_failed = [c.check for c in v.checks if c.failed and c.group == SPECULATION]
    parts = [f"{n['passed']} of {n['checks']} checks passed"]
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(failed)})")
    if spec_failed:
        parts.append(
            f"{len(spec_failed)} speculation check{'s' if len(spec_failed) > 1 else ''} failed "
            f"({', '.join(spec_failed)}: no speculation ships)"
        )
    if n["skipped"]:
        parts.append(f"{n['skipped']} skipped")
    return f"gate {variant}: {v.label}: {', '.join(parts)}{_shipped_setting(v.speculation)}"


def failed_checks(report: GateReport, allowed: bool) -> list[str]:
    """'variant: check (what, needs, by how much)' for the failed checks of blocking (allowed=False)
    or of allow_fail (allowed=True) variants."""
    return [
        f"{variant}: {c.check} ({c.describe()})"
        for variant, v in report.variants.items()
        if not v.passed and v.allowed_failure == allowed
        for c in v.checks
        if c.failed and c.group != SPECULATION
    ]


def conclude(report: GateReport) -> int:
    """One line per variant, a warning for allowed failures, every blocking failure named; the exit code."""
    for variant, v in report.variants.items():
        say(verdict_line(variant, v))
    line = recommendation_line(report)
    if line:
        say(line)
    allowed = failed_checks(report, allowed=True)
    if allowed:
        warn(
            "warning: failed gates allowed by allow_fail (the bundle's model card carries a warning): "
            + "; ".join(allowed)
        )
    failed = failed_checks(report, allowed=False)
    if failed:
        warn("error: gate failed: " + "; ".join(failed))
        return 1
    return 0


def _shipped_setting(chosen: SpeculationDecision | None) -> str:
    if chosen is None:
        return ""
    k = chosen.num_speculative_tokens
    gave_way = (
        f"; {chosen.method} k={chosen.candidate_k} gave way: fewer users at the SLO than min_capacity_vs_bf16"
        if not k and "min_capacity_vs_bf16" in chosen.turned_off_by
        else ""
    )
    return f"; ships {f'{chosen.method} k={k}' if k else 'without speculation'} ({chosen.basis}{gave_way})"


def load_eval_metrics(metrics_dir: str | Path, variants: list[str] | None = None) -> dict[str, EvalSummary]:
    """eval-<variant>.json files from a metrics directory (this pipeline's or another runner's)."""
    metrics_dir = Path(metrics_dir)
    if not metrics_dir.is_dir():
        raise PipelineError(f"metrics directory {metrics_dir} not found")
    found = {
        f.stem.removeprefix("eval-"): EvalSummary.from_metrics(listed(current_names(records.read_object(f))), str(f))
        for f in sorted(metrics_dir.glob("eval-*.json"))
    }
    if variants is not None:
        missing = [v for v in variants if v not in found]
        if missing:
            raise PipelineError(f"no evaluation metrics for {missing} in {metrics_dir}")
        found = {v: found[v] for v in variants}
    if not found:
        raise PipelineError(f"no eval-*.json metrics in {metrics_dir}")
    return found


# an older flat file's <field>_<method> -> the field of a `methods` entry
METHOD_FIELDS = {
    "accepted_per_draft_token": "accepted_per_draft_token",
    "num_speculative_tokens": "num_speculative_tokens",
    "expected_speedup": METHOD_SPEEDUP,
}


def listed(metrics: dict) -> dict:
    """Metrics in the layout metrics/eval-<v>.json has now, from a runner's older flat one (each method's numbers as
    <field>_<method> for the methods of pipeline/drafts/methods.py, the predicted speedups a dict by concurrency,
    as benchmarks/gpu/raw/*/metrics hold them; current_names first renames its other keys); metrics already in lists
    are returned as they are."""
    if "methods" in metrics:
        return metrics
    out = dict(metrics)
    found = [m for m in METHODS if any(f"{f}_{m}" in out for f in METHOD_FIELDS)]
    found.sort(key=lambda m: min(list(out).index(f"{f}_{m}") for f in METHOD_FIELDS if f"{f}_{m}" in out))
    out["methods"] = [
        {"method": m, **{field: out.pop(f"{f}_{m}", None) for f, field in METHOD_FIELDS.items()}} for m in found
    ]
    if isinstance(out.get(PREDICTED), dict):
        out[PREDICTED] = [{"concurrency": int(c), "speedup": x} for c, x in out[PREDICTED].items()]
    return out


def load_serve_metrics(metrics_dir: str | Path, variants: list[str]) -> dict[str, ServeBenchRecord]:
    """serve-<variant>.json files (the serving benchmark's records) present in a metrics directory."""
    return {
        v: records.read(ServeBenchRecord, f) for v in variants if (f := Path(metrics_dir) / f"serve-{v}.json").is_file()
    }


def run(
    cfg: GatesParams,
    serving: ServingParams,
    variants: Iterable[str],
    summaries: dict[str, EvalSummary],
    allow_fail: list[str] | None = None,
    serve_by_variant: dict[str, ServeBenchRecord] | None = None,
) -> GateReport:
    """Gate every variant (summaries: evaluate's, by variant) with params.yaml's thresholds (checked by
    pipeline/params/check.py); variants: quantize.variants' names; allow_fail adds to gates.allow_fail.
    serve_by_variant: serving benchmark records, where they exist."""
    allowed = list(cfg.allow_fail) + list(allow_fail or [])
    known = set(summaries) | set(variants)
    unknown = [v for v in allowed if v not in known]
    if unknown:
        raise PipelineError(f"allow_fail names unknown variants {unknown}; known: {sorted(known)}")
    serve_by_variant = serve_by_variant or {}
    ctx = decision.context_of(serving, serve_by_variant.get(serving.baseline_variant))
    return evaluate_gates(summaries, cfg.for_variant, allowed, serve_by_variant, ctx)
