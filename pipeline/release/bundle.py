"""Serving-ready bundle: weights, draft, vLLM configs, model card and a hashed manifest."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2

from pipeline.core.io import atomic_write_text, write_json
from pipeline.core.paths import BUILD_OUTPUTS
from pipeline.evaluate.estimate import SpeculativeEstimate
from pipeline.evaluate.summary import EvalSummary
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.quantize.recipes import VariantSpec
from pipeline.release.gates import VariantVerdict
from pipeline.release.latency import GATE_KEYS, gate_ms, relation, targets
from pipeline.release.manifest import write_manifest
from pipeline.release.publish import EVAL, GATE, EvalRecord
from pipeline.release.settings import DeployParams
from pipeline.release.thresholds import SPECULATION
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord
from pipeline.serving.config import serve_env, serve_yaml, served_model_name
from pipeline.serving.kernel_log import layout_kernels
from pipeline.serving.settings import ServingParams

CARD_TEMPLATE = "model_card.md.j2"  # pipeline/release/templates/
PROVENANCE = "PROVENANCE.json"

LIBRARIES = ["torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval", "dvc", "vllm"]
# Prometheus counters vLLM 0.26 exports for speculative decoding (vllm/v1/spec_decode/metrics.py);
# the card tells on-call to watch them.
SPEC_METRICS = [
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
]


def provenance(spec: VariantSpec, serving: Mapping, sources: dict) -> dict:
    """How the bundle was built, from what the bundle stage declares to DVC (so it is never stale):
    the recipe, the serving params as params.yaml writes them (credentials removed) and the model sources' content
    hashes.
    No absolute paths of the machine that built it."""
    from pipeline.core.redact import redact_params

    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    from pipeline.quantize.hardware import requirements

    # git_dirty: the code was edited. The build's own outputs that git tracks (dvc.lock, metrics/, plots/, which
    # `dvc repro` rewrites as it goes) are left out, or every bundle of a fresh clone's build would say dirty.
    edited = git("status", "--porcelain", "--", ".", *(f":(exclude){p}" for p in BUILD_OUTPUTS))
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(edited) if edited is not None else None,
        "variant": spec.name,
        "recipe": dataclasses.asdict(spec),
        "hardware": requirements(spec).as_record(),
        "serving": redact_params(serving),
        "sources": redact_params(sources),
        "libraries": versions,
    }


def _num(v, digits: int = 4, signed: bool = False) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    return str(v)


def _counter(name: str) -> str:
    """Name on /metrics: prometheus_client exposes a counter with a `_total` suffix."""
    return f"{name}_total"


def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pipeline.release", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["num"] = _num
    env.filters["per_position"] = lambda values: " / ".join(f"{a:.2f}" for a in values or []) or "n/a"
    env.filters["sentence"] = lambda text: text[:1].upper() + text[1:]  # "the EAGLE-3 head" opening a sentence
    return env.get_template(CARD_TEMPLATE)


def serving_rows(serve: ServeBenchRecord) -> list[dict]:
    """The card's serving table: one row per config and concurrency, as measured: plain decoding on each kernel
    compared (the chosen one is plain decoding itself), each method at its k, each k schedule."""
    named = [(f"plain on {kernel}", config) for kernel, config in serve.kernels.items() if kernel != serve.kernel]
    named += [
        (name if not config.num_speculative_tokens else f"{name} (k={config.num_speculative_tokens})", config)
        for name, config in serve.configs.items()
    ]
    named += [(f"{method} (k per batch: {config.schedule})", config) for method, config in serve.schedules.items()]
    return [
        {"config": name, "level": level}
        for name, config in named
        for level in sorted(config.levels.values(), key=lambda lvl: lvl.concurrency)
    ]


PARETO = "capacity.png"  # the gate's chart of every variant's configs against the SLO, where one was measured


def _load(value: float, arrival: str) -> str:
    return f"{value:g} users" if arrival == "concurrency" else f"{value:.3g} req/s"


def capacity_rows(serve: ServeBenchRecord) -> list[dict]:
    """The card's capacity table: each config searched (plain decoding, each method, each k schedule), its capacity
    and how the search ended, in words."""
    if serve.skipped:
        return []
    named = [
        (name if not c.num_speculative_tokens else f"{name} (k={c.num_speculative_tokens})", c)
        for name, c in serve.configs.items()
    ]
    named += [(f"{method} (k per batch: {c.schedule})", c) for method, c in serve.schedules.items()]
    rows = []
    for name, config in named:
        cap = config.capacity
        if cap is None:
            continue
        at = _load(cap.load, cap.arrival)
        ceiling = _load(cap.ceiling, cap.arrival) if cap.ceiling is not None else None
        search = {
            "found": f"{at}; {ceiling} missed it",
            "at_bound": f"at least {at}: met at the search's bound",
            "never": "none: one user at a time already misses it"
            if cap.arrival == "concurrency"
            else "none: one request at a time already misses it",
        }.get(cap.status) or (
            f"between {at} and {ceiling} (probes ran out)"
            if ceiling
            else f"at least {at} (probes ran out while it still met it)"
        )
        rows.append(
            {
                "config": name,
                "cap": cap,
                "level": cap.level,
                "search": search + f"; {len(cap.probes)} probes" + (f"; {cap.note}" if cap.note else ""),
            }
        )
    return rows


@dataclass(frozen=True)
class CardInputs:
    """What the bundle's README.md is rendered from. tiers, alerts: the handoff kit's TierPlans and AlertLevels
    (pipeline/release/handoff.py), when the bundle carries one; server_env: serve.env's variables (the card says to
    load it when there are any); pareto: the capacity chart's file in the bundle, where there is one; ranking: the
    gate's GateReport, whose per-GPU ranking of every variant the card shows; parallelism: why
    serving.tensor_parallel_size is what it is (parallelism.TpDecision.reason). The speculation it describes is the
    verdict's (the gate's decision, pipeline/release/decision.py)."""

    variant: str
    spec: VariantSpec
    summary: EvalSummary
    est: SpeculativeEstimate
    verdict: VariantVerdict
    quant: dict
    serving: ServingParams
    gpu: VllmMeasurement
    serve: ServeBenchRecord
    tiers: list | None = None
    alerts: object = None
    deploy: DeployParams | None = None
    bundle_path: str | None = None
    server_env: dict[str, str] | None = None
    pareto: str | None = None
    ranking: object = None
    parallelism: str | None = None


def model_card(card: CardInputs) -> str:
    """The bundle's README.md, rendered from pipeline/release/templates/model_card.md.j2."""
    from pipeline.quantize.hardware import requirements

    verdict, serving, alerts, ranking, serve = card.verdict, card.serving, card.alerts, card.ranking, card.serve
    rows = targets(
        serving.slo,
        gate_ms(verdict.checks),
        alerts.alert_ms() if alerts else None,
        alerts.latency_source if alerts else None,
    )
    predicted = predicted_rows(card.est)
    plain = None if serve.skipped else serve.configs.get(PLAIN)
    layout = (
        layout_kernels(card.quant["mixed"]["layout"], plain.kernel_schemes if plain else None)
        if card.quant.get("mixed")
        else []
    )
    return _template().render(
        variant=card.variant,
        spec=card.spec,
        quality=card.summary.quality,
        est=card.est,
        verdict=verdict,
        quant=card.quant,
        serving=serving,
        gpu=card.gpu,
        decision=verdict.speculation,
        serve=serve,
        serving_rows=serving_rows(serve),
        tiers=card.tiers or [],
        alerts=alerts,
        deploy=card.deploy,
        bundle_path=card.bundle_path,
        hardware=requirements(card.spec).as_record(),
        failed_checks=[f"{c.check} ({c.describe()})" for c in verdict.checks if c.failed and c.group != SPECULATION],
        lm_eval=[(key, value, lm_eval_meaning(key)) for key, value in card.summary.lm_eval.items()],
        served_name=served_model_name(serving, card.variant),
        predicted_rows=predicted,
        predicted_drop=steepest_drop(predicted),
        bound=speedup_bound(card.est, predicted),
        latency_targets=rows,
        latency_relation=relation(rows),
        latency_gate_keys=list(GATE_KEYS.values()),
        alert_ms=alerts.alert_ms() if alerts else {},
        spec_counters=[f"`{_counter(m)}`" for m in SPEC_METRICS],
        method_rows=method_rows(card.summary, verdict.speculation),
        method_names=METHOD_NAMES,
        server_env=card.server_env or {},
        capacity_rows=capacity_rows(serve),
        slo=serving.slo,
        arrival=serving.arrival,
        pareto=card.pareto,
        per_gpu=ranking.per_gpu if ranking else [],
        recommended=ranking.recommended if ranking else None,
        recommended_note=ranking.recommended_note if ranking else None,
        parallelism=card.parallelism,
        layout_kernels=layout,
    )


# What the demo's lm-eval task (evals/domain_heldout.yaml) scores: the held-out traffic's own responses, not the
# target's, so its numbers read on another scale than the comparisons with the target above them in the card.
LM_EVAL_MEANINGS = {
    "domain_heldout_acc": "share of held-out responses this variant writes whole, token for token, as its greedy "
    "answer to their prompts",
    "domain_heldout_byte_perplexity": "perplexity of the held-out responses per UTF-8 byte (any tokenizer)",
    "domain_heldout_bits_per_byte": "bits per byte of the held-out responses (log2 of the byte perplexity)",
}


def lm_eval_meaning(key: str) -> str:
    return LM_EVAL_MEANINGS.get(key, "an lm-eval score (`evaluate.lm_eval.tasks`)")


@dataclass(frozen=True)
class PredictedRow:
    """One concurrency of the served prediction at the shipped k: tokens/s plain and speculative, the speculative
    step's cost over a plain step's (the profile's, as the prediction used it) and the speedup."""

    concurrency: str
    plain: float
    speculative: float
    step_cost: float
    speedup: float
    best_k: int

    @property
    def slower(self) -> bool:
        return self.speedup < 1


def predicted_rows(est: SpeculativeEstimate) -> list[PredictedRow]:
    """The card's predicted table. The step cost inverts serving_costs' model, speedup = R N / ((N + 1) S - 1) with
    S the speculative step over a plain one, R the tokens per step and N the steps per response (R / S on long
    answers), so it is the S the prediction used."""
    if est.served is None:
        return []
    k = str(est.num_speculative_tokens)
    tokens = tokens_per_step(est)
    steps = est.steps_per_response_by_k.get(k)
    rows = []
    for c, plain in est.served.plain_tokens_per_s.items():
        speedup = est.served.speedup_by_k[c][k]
        cost = (tokens * steps / speedup + 1) / (steps + 1) if steps else tokens / speedup
        rows.append(PredictedRow(c, plain, plain * speedup, cost, speedup, est.served.best_k[c]))
    return rows


@dataclass(frozen=True)
class PredictedDrop:
    before: str
    after: str
    cost_before: float
    cost_after: float
    speedup_before: float
    speedup_after: float


def steepest_drop(rows: list[PredictedRow], at_least: float = 0.2) -> PredictedDrop | None:
    """The largest fall of the predicted speedup from one concurrency to the next (at least this fraction of it),
    which the card explains by the step cost beside it; None where none falls that far."""
    pairs = [(a, b) for a, b in zip(rows, rows[1:]) if b.speedup < a.speedup * (1 - at_least)]
    if not pairs:
        return None
    a, b = max(pairs, key=lambda pair: pair[0].speedup / pair[1].speedup)
    return PredictedDrop(a.concurrency, b.concurrency, a.step_cost, b.step_cost, a.speedup, b.speedup)


def tokens_per_step(est: SpeculativeEstimate) -> float:
    """Response tokens a step makes at the estimate's k (1 + accepted, less those past the response's end)."""
    return est.tokens_per_step_by_k.get(str(est.num_speculative_tokens), 1 + est.expected_accepted_tokens)


@dataclass(frozen=True)
class SpeedupBound:
    """The speedup at the shipped k if drafting and verifying cost nothing over a plain step: the tokens per step.
    A speculative step does a plain step's work and more, so no served speedup at this k exceeds it (the weight-bytes
    ideal does not bound it: a target step costs more than its weight bytes wherever per-step overheads or
    dequantizing kernels count, and the served speedup then exceeds that ideal). predicted_max: the highest predicted
    speedup at this k over the concurrencies, for the card to set beside it."""

    tokens_per_step: float
    predicted_max: float | None


def speedup_bound(est: SpeculativeEstimate, rows: list[PredictedRow]) -> SpeedupBound:
    return SpeedupBound(tokens_per_step(est), max((r.speedup for r in rows), default=None))


METHOD_NAMES = {
    "draft_model": "the domain-tuned draft model",
    "eagle3": "the EAGLE-3 head",
    "ngram": "n-gram prompt lookup",
    None: "none",
}


def method_rows(summary: EvalSummary, decision) -> list[dict]:
    """Each compared method: its CPU estimate (evaluate) and, where served, its measured speedup."""
    measured = (
        (decision.compared or {decision.method: decision.speedup})
        if decision is not None and decision.basis == "measured"
        else {}
    )
    return [
        {
            "method": m.method,
            "k": m.num_speculative_tokens,
            "accepted": m.accepted_per_draft_token,
            "expected": m.expected_speedup,
            "measured": measured.get(m.method),
        }
        for m in summary.speculation.methods
    ]


def build_bundle(
    out: Path,
    model_dir: Path,
    drafter: tuple[Path, str] | None,
    args: dict,
    provenance_record: dict,
    verdict: VariantVerdict,
    summary: EvalSummary,
    env: dict,
) -> None:
    """The model, the shipped method's weights (drafter: (source, directory in the bundle), e.g. the draft
    model to ./draft or the EAGLE-3 head to ./eagle3; None for n-gram or no speculation) and the configs;
    the card and the manifest come last (they describe everything else)."""
    # Real copies, not hard links: a bundle must not change when its sources do.
    shutil.copytree(model_dir, out / "model")
    if drafter is not None:
        shutil.copytree(drafter[0], out / drafter[1])
    if env:
        atomic_write_text(out / "serve.env", serve_env(env))
    atomic_write_text(out / "serve.yaml", serve_yaml(args))
    write_json(out / "engine_args.json", args)
    write_json(out / PROVENANCE, provenance_record)
    write_json(out / GATE, dataclasses.asdict(verdict))  # publish re-checks it against the current gate run
    write_json(out / EVAL, EvalRecord.of(summary, verdict).to_json())


def finish_bundle(out: Path, variant: str, card: str) -> dict:
    atomic_write_text(out / "README.md", card)
    return write_manifest(out, {"variant": variant})
