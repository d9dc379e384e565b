"""The evaluate stage's summary of one variant, typed: what the gate, the bundle and publish read.

`artifacts/eval/<v>/summary.json` holds the record as written by `records.write`. `to_metrics()` is its flat view,
`metrics/eval-<v>.json` (a plain output, not a DVC metric: `dvc metrics show` has the gate's headline files,
pipeline/release/headline.py): the fidelity numbers, the CPU estimate's best method and k as `estimated_*` (the gate
decides what ships: it need not be this), the weight-bytes model's speedup as `weight_bytes_speedup` (neither a bound
nor a prediction: a served step costs more than its weight bytes), each method's estimate and the predicted speedup per
concurrency in lists, lm-eval scores as `lm_eval_<task>_<metric>` (the names the gate thresholds
`min_lm_eval_<task>_<metric>` read). `from_metrics` reads that view back, for a metrics directory
(`modelprep gate --metrics-dir`) and a bundle's EVAL.json; `current_names` maps the names older files hold
(benchmarks/gpu/raw/*/metrics, bundles built before the rename) to these.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json

LM_EVAL = "lm_eval_"  # a score's metric name: lm_eval_<task>_<metric>
FUNCTIONAL = "functional_"  # functional_tasks: how many tasks pass_at_1 is over
PREDICTED = "estimated_speedup_by_concurrency"


@dataclass(frozen=True)
class Quality:
    """Fidelity to the unquantized target on held-out responses (pipeline/evaluate/quality.py); None: not measured."""

    perplexity_baseline: float | None = None
    perplexity: float | None = None
    perplexity_increase_pct: float | None = None
    kl_divergence: float | None = None
    top1_agreement: float | None = None
    tokens: int | None = None
    greedy_match: float | None = None


@dataclass(frozen=True)
class Functional:
    """pass@1 on evaluate.functional.tasks (pipeline/evaluate/functional.py): the unquantized target's, this
    variant's, and the drop between them (baseline minus variant: 0.05 is five tasks in a hundred lost)."""

    tasks: int
    pass_at_1_baseline: float
    pass_at_1: float
    pass_at_1_drop: float
    outcomes: dict[str, int] = field(default_factory=dict)  # this variant's tasks by sandbox outcome
    baseline_outcomes: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict:
        return {
            f"{FUNCTIONAL}tasks": self.tasks,
            "pass_at_1_baseline": self.pass_at_1_baseline,
            "pass_at_1": self.pass_at_1,
            "pass_at_1_drop": self.pass_at_1_drop,
        }

    @classmethod
    def from_metrics(cls, data: dict) -> dict | None:
        """Functional's fields popped from a flat metrics dict (None when it holds none: the check was off)."""
        names = list(cls(0, 0.0, 0.0, 0.0).metrics())
        if not any(n in data for n in names):
            return None
        values = {n: data.pop(n, None) for n in names}
        return {"tasks": values[f"{FUNCTIONAL}tasks"], **{n: values[n] for n in names[1:]}}


@dataclass(frozen=True)
class MethodEstimate:
    """One speculative method's CPU estimate on this variant, at the k predicted fastest as served."""

    method: str
    accepted_per_draft_token: float | None = None  # at num_speculative_tokens, which each variant chooses
    num_speculative_tokens: int | None = None
    expected_speedup: float | None = None  # predicted served speedup at serving.target_concurrency; None: no profile
    # the share of first drafted tokens accepted (k = 1): the same drafts compared whatever k each variant chose
    first_token_acceptance: float | None = None


@dataclass(frozen=True)
class PredictedSpeedup:
    concurrency: int
    speedup: float


@dataclass(frozen=True)
class OfflineVllm:
    """evaluate's offline vLLM run of the draft model (evaluate.vllm), where it ran."""

    accepted_per_draft_token: float | None = None
    speculative_speedup: float | None = None  # at batch size 1; None: evaluate.vllm.throughput_batch_sizes has none


@dataclass(frozen=True)
class SpeculativeSummary:
    """The method predicted fastest (its numbers unsuffixed in the metrics), every method's, the prediction per
    concurrency at the best method's k, and the offline vLLM numbers (the draft model's, whatever method is best)."""

    method: str | None = None  # None: not recorded (a summary from before several methods: the draft model's)
    token_acceptance: float | None = None
    accepted_per_draft_token: float | None = None
    num_speculative_tokens: int | None = None
    expected_speedup: float | None = None
    cost_profile: str | None = None  # the serving-cost profile that predicted it; None: none applied
    ideal_speedup: float | None = None  # the weight-bytes bound, for reference only
    predicted: list[PredictedSpeedup] = field(default_factory=list)
    methods: list[MethodEstimate] = field(default_factory=list)
    vllm: OfflineVllm | None = None

    def estimate(self, method: str | None) -> MethodEstimate | None:
        return next((m for m in self.methods if m.method == method), None)

    def predicted_by_concurrency(self) -> dict[str, float]:
        return {str(p.concurrency): p.speedup for p in self.predicted}


# metric name -> SpeculativeSummary field, in the order the metrics list them. The method and k are the CPU
# estimate's best, not what ships (the gate's decision: metrics/gates.json, metrics/release/), hence `estimated_`.
HEADLINE = {
    "estimated_method": "method",
    "token_acceptance": "token_acceptance",
    "accepted_per_draft_token": "accepted_per_draft_token",
    "estimated_num_speculative_tokens": "num_speculative_tokens",
    "estimated_speedup": "expected_speedup",
    "cost_profile": "cost_profile",
    "weight_bytes_speedup": "ideal_speedup",
}
METHOD_SPEEDUP = "estimated_speedup"  # each method's entry in `methods`: MethodEstimate.expected_speedup
# The names metrics files held before they said what they are (issue #49): old -> current.
OLD_NAMES = {
    "speculative_method": "estimated_method",
    "num_speculative_tokens": "estimated_num_speculative_tokens",
    "expected_speedup": "estimated_speedup",
    "ideal_speedup": "weight_bytes_speedup",
    "predicted_speedup_by_concurrency": PREDICTED,
}
VLLM = {"vllm_accepted_per_draft_token": "accepted_per_draft_token", "vllm_speculative_speedup": "speculative_speedup"}
LISTS = ("methods", PREDICTED)


@dataclass(frozen=True)
class EvalSummary:
    variant: str | None = None
    quality: Quality = field(default_factory=Quality)
    speculation: SpeculativeSummary = field(default_factory=SpeculativeSummary)
    lm_eval: dict[str, float] = field(default_factory=dict)  # "<task>_<metric>" -> score
    functional: Functional | None = None  # None: evaluate.functional.tasks not set (written only when measured)

    @classmethod
    def load(cls, path: str | Path) -> EvalSummary:
        """The record evaluate wrote (artifacts/eval/<v>/summary.json); a missing or malformed one is one error
        line naming the file and the field."""
        return check_possible(records.read(cls, path), str(path))

    def write(self, path: str | Path) -> None:
        data = dataclasses.asdict(self)
        if self.functional is None:
            del data["functional"]  # a build without the check writes what it wrote before there was one
        write_json(path, data)

    def quality_metrics(self) -> dict:
        """The variant, its fidelity, its pass@1 (where measured) and its lm-eval scores: what is about the model,
        not about speculation."""
        return {
            "variant": self.variant,
            **dataclasses.asdict(self.quality),
            **(self.functional.metrics() if self.functional else {}),
            **{f"{LM_EVAL}{name}": score for name, score in self.lm_eval.items()},
        }

    def speculation_metrics(self) -> dict:
        """The speculative estimates as metrics: the best method's headline numbers, the offline vLLM ones, then
        the lists (each method, the prediction per concurrency)."""
        s = self.speculation
        out = {key: getattr(s, name) for key, name in HEADLINE.items()}
        if s.vllm is not None:
            out["vllm_accepted_per_draft_token"] = s.vllm.accepted_per_draft_token
            if s.vllm.speculative_speedup is not None:
                out["vllm_speculative_speedup"] = s.vllm.speculative_speedup
        out["methods"] = [_method_metrics(m) for m in s.methods]
        out[PREDICTED] = [dataclasses.asdict(p) for p in s.predicted]
        return out

    def to_metrics(self) -> dict:
        """metrics/eval-<v>.json: the variant and its fidelity, the headline speculative numbers, the lm-eval
        scores, the offline vLLM numbers, then the lists."""
        quality, spec = self.quality_metrics(), self.speculation_metrics()
        headline = {k: spec.pop(k) for k in HEADLINE}
        lists = {k: spec.pop(k) for k in LISTS}
        scores = {k: v for k, v in quality.items() if k.startswith(LM_EVAL)}
        fidelity = {k: v for k, v in quality.items() if k not in scores}
        return {**fidelity, **headline, **scores, **spec, **lists}

    @classmethod
    def from_metrics(cls, metrics: dict, where: str) -> EvalSummary:
        """to_metrics' inverse (where: the file, for the error line). A metric missing is a value not measured; a
        name that is none of the summary's is an error."""
        if not isinstance(metrics, dict):
            raise PipelineError(f"{where}: expected a JSON object of evaluation metrics")
        data = dict(metrics)
        quality = {f.name: data.pop(f.name) for f in dataclasses.fields(Quality) if f.name in data}
        functional = Functional.from_metrics(data)
        spec = {name: data.pop(key) for key, name in HEADLINE.items() if key in data}
        spec["methods"] = [_method_estimate(m) for m in data.pop("methods", [])]
        spec["predicted"] = data.pop(PREDICTED, [])
        vllm = {name: data.pop(key) for key, name in VLLM.items() if key in data}
        if vllm:
            spec["vllm"] = vllm
        variant = data.pop("variant", None)
        lm_eval = {key[len(LM_EVAL) :]: data.pop(key) for key in list(data) if key.startswith(LM_EVAL)}
        if data:
            raise PipelineError(f"{where}: unknown evaluation metrics {sorted(data)}")
        return check_possible(
            records.from_dict(
                cls,
                {
                    "variant": variant,
                    "quality": quality,
                    "speculation": spec,
                    "lm_eval": lm_eval,
                    "functional": functional,
                },
                where,
            ),
            where,
        )


# The values each metric can take at all (issue #47, round four's own attack: a KL of -0.5, a top-1 agreement of 1.7
# or an acceptance of 2.5 per drafted token passed every gate). NaN is left to the gate, which fails it; a tiny
# negative KL is float rounding of two equal distributions.
FRACTIONS = ("top1_agreement", "greedy_match")
KL_ROUNDING = 1e-6


def check_possible(summary: EvalSummary, where: str) -> EvalSummary:
    """The summary, or one line naming the first metric whose value no measurement can produce."""
    q = summary.quality
    values = [(name, getattr(q, name), 0.0, 1.0) for name in FRACTIONS]
    values += [
        ("kl_divergence", q.kl_divergence, -KL_ROUNDING, math.inf),
        ("perplexity", q.perplexity, 1.0, math.inf),
        ("perplexity_baseline", q.perplexity_baseline, 1.0, math.inf),
        ("tokens", q.tokens, 0, math.inf),
        ("accepted_per_draft_token", summary.speculation.accepted_per_draft_token, 0.0, 1.0),
    ]
    values += [
        (f"methods[{m.method}].{field}", getattr(m, field), 0.0, 1.0)
        for m in summary.speculation.methods
        for field in ("accepted_per_draft_token", "first_token_acceptance")
    ]
    if summary.functional is not None:
        f = summary.functional
        values += [
            ("pass_at_1", f.pass_at_1, 0.0, 1.0),
            ("pass_at_1_baseline", f.pass_at_1_baseline, 0.0, 1.0),
            ("pass_at_1_drop", f.pass_at_1_drop, -1.0, 1.0),
        ]
    for name, value, low, high in values:
        if value is not None and not math.isnan(value) and not low <= value <= high:
            raise PipelineError(
                f"{where}: {name} is {value}, which no measurement can give (it lies in "
                f"[{low:g}, {high:g}]); the metrics were not produced by evaluate"
            )
    return summary


def _method_metrics(m: MethodEstimate) -> dict:
    out = dataclasses.asdict(m)
    first = out.pop("first_token_acceptance")
    out[METHOD_SPEEDUP] = out.pop("expected_speedup")
    if first is not None:  # files from before the field hold none; they read back as they were
        out["first_token_acceptance"] = first
    return out


def _method_estimate(entry):
    """A `methods` entry as MethodEstimate's fields (anything else is left for records.from_dict to name)."""
    if not isinstance(entry, dict) or METHOD_SPEEDUP not in entry:
        return entry
    out = dict(entry)
    out["expected_speedup"] = out.pop(METHOD_SPEEDUP)
    return out


def current_names(metrics: dict) -> dict:
    """Evaluation metrics with the names older files hold (OLD_NAMES, `expected_speedup` in each `methods` entry)
    renamed to the current ones, in place in the key order; a file with both an old and its current name keeps both
    (from_metrics then names the old one as unknown)."""
    if not isinstance(metrics, dict):
        return metrics
    out = {(OLD_NAMES[k] if k in OLD_NAMES and OLD_NAMES[k] not in metrics else k): v for k, v in metrics.items()}
    if isinstance(out.get("methods"), list):
        out["methods"] = [
            {(METHOD_SPEEDUP if k == "expected_speedup" and METHOD_SPEEDUP not in e else k): v for k, v in e.items()}
            if isinstance(e, dict)
            else e
            for e in out["methods"]
        ]
    return out


def load_metrics(path: str | Path) -> EvalSummary:
    """An EvalSummary from a metrics file (metrics/eval-<v>.json, this pipeline's or another runner's, older names
    too)."""
    return EvalSummary.from_metrics(current_names(records.read_object(path)), str(path))
