"""What may be published: a verified bundle whose own gate verdict is the current one and shippable.

The bundle carries its verdict (GATE.json) and its numbers (EVAL.json), both hashed by its
MANIFEST.json. A bundle left over from an earlier build (its verdict differs from the current
gate run), a failed one not in gates.allow_fail, or one whose files don't match its manifest is
refused with one line, whoever runs the publish stage and however.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.evaluate.summary import EvalSummary, current_names
from pipeline.release.decision import SpeculationDecision
from pipeline.release.gates import GateReport, VariantVerdict
from pipeline.release.manifest import verify
from pipeline.release.shipped_config import candidate_metrics

GATE = "GATE.json"
EVAL = "EVAL.json"
# EVAL.json: the evaluate summary's metrics (metrics/eval-<v>.json) with what is about speculation moved under two
# keys, so that a CPU estimate (e.g. n-gram x1.46 at k=8) never reads as what the bundle serves: `speculation_shipped`
# is the gate's decision (method, k, basis, why), `speculation_estimates` every method's estimate and evaluate's
# offline vLLM numbers.
SHIPPED, ESTIMATES = "speculation_shipped", "speculation_estimates"
ESTIMATES_NOTE = (
    "estimates and measurements of the speculative methods compared on this variant; they do not say "
    "what ships: speculation_shipped does (serve.yaml's speculative-config)"
)


@dataclass(frozen=True)
class ShippedSpeculation:
    """EVAL.json's speculation_shipped: the gate's decision as the bundle serves it (method and speedup only where a
    k ships; the candidate's, when it does not, are in reason)."""

    method: str | None
    num_speculative_tokens: int
    basis: str | None
    speedup: float | None
    reason: str

    @classmethod
    def of(cls, decision: SpeculationDecision | None) -> ShippedSpeculation:
        if decision is None:
            return cls(None, 0, None, None, "no gate decision")
        k = decision.num_speculative_tokens
        return cls(decision.method if k else None, k, decision.basis, decision.speedup if k else None, decision.reason)


@dataclass(frozen=True)
class EvalRecord:
    """EVAL.json, which the bundle stage writes and publish reads: the evaluate summary it was made from (its quality
    numbers at the top level, the estimates under speculation_estimates, marked as such) and what ships."""

    summary: EvalSummary
    shipped: ShippedSpeculation

    @classmethod
    def of(cls, summary: EvalSummary, verdict: VariantVerdict) -> EvalRecord:
        return cls(summary, ShippedSpeculation.of(verdict.speculation))

    def to_json(self) -> dict:
        return {
            **self.summary.quality_metrics(),
            SHIPPED: dataclasses.asdict(self.shipped),
            ESTIMATES: {"note": ESTIMATES_NOTE, **self.summary.speculation_metrics()},
        }

    @classmethod
    def from_json(cls, record: dict, where: str) -> EvalRecord:
        """to_json's inverse; one error line naming `where` for a record from before the estimates moved."""
        if not isinstance(record.get(ESTIMATES), dict):
            raise PipelineError(f"{where}: no {ESTIMATES} object; rebuild the bundle (`dvc repro`)")
        estimates = {k: v for k, v in record[ESTIMATES].items() if k != "note"}
        summary = EvalSummary.from_metrics(
            current_names({**{k: v for k, v in record.items() if k not in (SHIPPED, ESTIMATES)}, **estimates}), where
        )  # a bundle built before the rename too
        return cls(summary, records.from_dict(ShippedSpeculation, record.get(SHIPPED), f"{where}: {SHIPPED}"))


def check_thresholds(verdict: VariantVerdict, variant: str, thresholds: dict) -> None:
    """The verdict records the threshold of every check it applied; one that params.yaml has changed since (a
    raised bar, a removed or added check) makes it stale: publishing it would tag a build passed on old rules."""
    applied = {c.check: c.threshold for c in verdict.checks}
    changed = sorted(name for name in set(applied) | set(thresholds) if applied.get(name) != thresholds.get(name))
    if changed:
        name = changed[0]
        raise PipelineError(
            f"{variant}: its gate verdict was reached with {name} = {applied.get(name, 'unset')}, "
            f"params.yaml now says {thresholds.get(name, 'unset')}"
            + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
            + "; re-run the gate (`dvc repro`) before publishing"
        )


def shippable_verdict(
    bundle: Path, variant: str, current: GateReport, allow_fail: list[str], thresholds: dict | None = None
) -> VariantVerdict:
    verdict = records.read(VariantVerdict, bundle / GATE)
    now = current.variants.get(variant)
    if now is None or dataclasses.asdict(now) != dataclasses.asdict(verdict):
        raise PipelineError(
            f"{bundle} was built from another gate run than the current one "
            "(artifacts/gate/verdict.json); rebuild it with `dvc repro`"
        )
    if thresholds is not None:
        check_thresholds(verdict, variant, thresholds)
    if not verdict.passed and not (verdict.allowed_failure and variant in allow_fail):
        failed = ", ".join(c.check for c in verdict.checks if c.failed)
        raise PipelineError(f"{variant} failed its gates ({failed}) and is not in gates.allow_fail; not published")
    return verdict


@contextlib.contextmanager
def pinned_copy(bundle: Path, digest: str, staging: Path):
    """A private copy of the bundle, verified to be the one whose verdict and tags were checked (digest): a bundle
    directory swapped or rebuilt between that check and the upload (a concurrent `bundle@v` renames a new one
    into place) can then not be published under the other's tags. Removed afterwards."""
    staging.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle.name}.", dir=staging))
    try:
        copy = tmp / bundle.name
        shutil.copytree(bundle, copy, symlinks=True)  # a link is copied as one, then refused by verify
        found = verify(copy)["bundle_digest"]
        if found != digest:
            raise PipelineError(
                f"{bundle} changed while it was being published (digest {found[:12]}, checked "
                f"{digest[:12]}); publish it again"
            )
        yield copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def accepted_per_draft_token(verdict: VariantVerdict, summary: EvalSummary) -> str:
    """The shipped method's accepted/drafted ratio as the gate checked it (served, else estimated), not the
    evaluate summary's unsuffixed one, which is the CPU-best method's; n/a when nothing ships."""
    decision = verdict.speculation
    if decision is None or not decision.num_speculative_tokens:
        return "n/a"
    checked = verdict.applied("min_accepted_per_draft_token")
    value = (
        checked.value
        if checked is not None  # else the shipped method's own estimate
        else candidate_metrics(summary, decision.method).get("accepted_per_draft_token")
    )
    return "n/a" if value is None else f"{value:.3f}"


def release_tags(
    bundle: Path,
    variant: str,
    version_setting: str,
    allow_fail: list[str],
    current: GateReport,
    thresholds: dict | None = None,
) -> tuple[str, dict]:
    """(version, tags) of a bundle that may be published; verified and its verdict re-checked (against the
    thresholds now in force, when given). version_setting: publish.version (auto: the bundle's content hash)."""
    manifest = verify(bundle)
    verdict = shippable_verdict(bundle, variant, current, allow_fail, thresholds)
    summary = EvalRecord.from_json(read_json(bundle / EVAL), str(bundle / EVAL)).summary
    version = manifest["bundle_digest"][:12] if version_setting == "auto" else version_setting
    tags = {
        "variant": variant,
        "bundle_digest": manifest["bundle_digest"],
        "gates": "passed" if verdict.passed else "failed-allowed",
        "accepted_per_draft_token": accepted_per_draft_token(verdict, summary),
        "num_speculative_tokens": str(
            verdict.speculation.num_speculative_tokens
            if verdict.speculation
            else summary.speculation.num_speculative_tokens
        ),
        "speculation_basis": verdict.speculation.basis if verdict.speculation else "estimated",
        "speculative_method": (verdict.speculation.method or "none")
        if verdict.speculation and verdict.speculation.num_speculative_tokens
        else "none",
    }
    return version, tags
