"""The bundle stage's work for one gated variant: read what it ships (the gate's verdict and decision, the
evaluation, the serving benchmark, the settings), check the serve.yaml it renders is the one serve_bench measured,
then assemble, sign and attest the directory. Everything is read and checked before the model is copied."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths, records
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.core.names import registry_name
from pipeline.data.traffic import heldout_prompts
from pipeline.drafts import methods
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate.estimate import SpeculativeEstimate
from pipeline.evaluate.summary import EvalSummary
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.quantize.recipes import VariantSpec, variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import attestation, decision, signing
from pipeline.release.binding import RELEASE, Binding
from pipeline.release.bundle import PARETO, CardInputs, build_bundle, finish_bundle, model_card, provenance
from pipeline.release.gates import GateReport, VariantVerdict
from pipeline.release.handoff import GENERIC_PROMPTS, HandoffInputs, bundle_location, write_handoff
from pipeline.release.settings import DeployParams, MonitoringParams, PublishParams
from pipeline.release.shipped_config import config_name, config_of
from pipeline.release.warmup import rendered_prompts
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.config import checkpoint_quantization, engine_args, serve_yaml, server_env, speculative_config_for
from pipeline.serving.parallelism import decision_for, resolved
from pipeline.serving.settings import ServingParams
from pipeline.serving.tiers import parse_tiers


@dataclass(frozen=True)
class Evidence:
    """What the variant was gated on: evaluate's summary, the candidate method's CPU estimate (its speculation in
    the card), the offline vLLM measurement, the serving benchmark's record and the quantize metrics."""

    summary: EvalSummary
    estimate: SpeculativeEstimate
    gpu: VllmMeasurement
    serve: ServeBenchRecord
    quant: dict


@dataclass(frozen=True)
class Sections:
    """The params.yaml sections the bundle reads, typed (the stage parses them: params sits above release)."""

    quantize: QuantizeParams
    serving: ServingParams  # as written: tensor_parallel_size may be auto
    draft: DraftParams
    deploy: DeployParams
    monitoring: MonitoringParams
    publish: PublishParams


@dataclass(frozen=True)
class BundleInputs:
    """Everything one bundle is assembled from, read and checked (read_inputs)."""

    variant: str
    spec: VariantSpec
    report: GateReport
    verdict: VariantVerdict
    decision: decision.Decision
    evidence: Evidence
    model_dir: Path
    quantization: str | None
    serving: ServingParams  # at the variant's own tensor parallelism
    draft: DraftParams
    deploy: DeployParams
    monitoring: MonitoringParams
    publish: PublishParams
    engine_args: dict  # serve.yaml's
    provenance: dict  # PROVENANCE.json, with the release binding
    warmup: list[tuple[str, bool]]  # the warm-up's prompts, rendered


def gated(variant: str) -> tuple[GateReport, VariantVerdict]:
    """The gate's report and this variant's verdict; one error line where it has none or failed unallowed."""
    report = records.read(GateReport, paths.VERDICT)
    verdict = report.variants.get(variant)
    if verdict is None or verdict.speculation is None:
        raise PipelineError(f"{paths.VERDICT} has no verdict for {variant}; run the gate stage")
    if not verdict.shippable:
        raise PipelineError(f"{variant} failed its gates; it is not bundled (gates.allow_fail publishes it flagged)")
    return report, verdict


def evidence(variant: str, verdict: VariantVerdict) -> Evidence:
    ev = paths.EVAL / variant
    est_file = ev / f"speculative-{verdict.speculation.method}.json"  # the candidate's estimate
    return Evidence(
        summary=EvalSummary.load(ev / "summary.json"),
        estimate=records.read(SpeculativeEstimate, est_file if est_file.is_file() else ev / "speculative.json"),
        gpu=records.read(VllmMeasurement, ev / "vllm.json"),
        serve=records.read(ServeBenchRecord, paths.SERVE / variant / "record.json"),
        quant=read_json(f"metrics/quantize-{variant}.json"),
    )


def read_inputs(variant: str, p: Mapping, sections: Sections) -> BundleInputs:
    """Read and check everything the bundle ships, before any file of it is written (p: params.yaml as read)."""
    spec = variant_spec(sections.quantize.variants, variant)
    report, verdict = gated(variant)
    found = evidence(variant, verdict)
    model_dir = paths.QUANTIZED / variant
    quantization = checkpoint_quantization(model_dir)
    # at the variant's own tensor parallelism, from its checkpoint: serve.yaml, engine_args.json, manifests, card
    parallel = decision_for(variant, p, model_dir)
    serving = resolved(sections.serving, parallel.tensor_parallel_size)
    draft, publish = sections.draft, sections.publish
    shipped = decision.shipped(
        verdict.speculation,
        verdict.capacity,
        found.serve,
        parse_tiers(serving),
        decision.context_of(serving),
        parallel.tensor_parallel_size,
        parallel.reason(),
    )
    args = engine_args(spec, serving, speculative_config_for(shipped.shipped, draft, serving), quantization)
    check_measured_config(paths.SERVE / variant, found.serve, shipped.shipped, serve_yaml(args))
    # PROVENANCE.json records the serving section as params.yaml writes it
    record = provenance(spec, p[ServingParams.SECTION], read_json("metrics/models.json"))
    # the registry name and version it is for: signed with the rest, checked by publish and resolution
    record[RELEASE] = Binding(registry_name(serving.name, variant), variant, publish.version).as_record()
    return BundleInputs(
        variant,
        spec,
        report,
        verdict,
        shipped,
        found,
        model_dir,
        quantization,
        serving,
        draft,
        sections.deploy,
        sections.monitoring,
        publish,
        args,
        record,
        warmup_prompts(model_dir, sections.deploy),
    )


def warmup_prompts(model_dir: Path, deploy: DeployParams) -> list[tuple[str, bool]]:
    """deploy.warmup_prompts prompts (held-out traffic where deploy.warmup_from_traffic, else generic ones),
    rendered with the model's chat template: one tokenizer load per build, not per bundle."""
    n = deploy.warmup_prompts
    prompts = (
        heldout_prompts(paths.HELDOUT, n)
        if deploy.warmup_from_traffic
        else [[{"role": "user", "content": GENERIC_PROMPTS[i % len(GENERIC_PROMPTS)]}] for i in range(n)]
    )
    return rendered_prompts(model_dir, prompts, paths.CACHE)


def assemble(out: Path, b: BundleInputs) -> dict:
    """The bundle in `out`: model, drafter, configs, handoff kit, card and manifest, then its signature and
    attestation where publish.signing has a key; the manifest."""
    shipped, serve = b.decision.shipped, b.evidence.serve
    drafter = (
        (methods.ARTIFACT_DIRS[shipped.method], methods.BUNDLE_DIRS[shipped.method])
        if shipped.method in methods.ARTIFACT_DIRS
        else None
    )
    # The kernel serve_bench measured faster on this GPU where it compared them; else the unmeasured default.
    env = server_env(b.spec, b.serving, b.decision.kernel_env)
    build_bundle(out, b.model_dir, drafter, b.engine_args, b.provenance, b.verdict, b.evidence.summary, env)
    tiers, alerts = write_handoff(out, _handoff_inputs(b, env))
    chart = paths.PARETO  # drawn by the gate, over every variant, where one was measured
    if chart.is_file():
        shutil.copyfile(chart, out / PARETO)
    for plan in tiers:
        if plan.name in serve.tiers:
            check_measured_config(
                paths.SERVE / b.variant, serve, plan.speculation, (out / plan.serve_file).read_text(), plan.name
            )
    card = model_card(_card_inputs(b, tiers, alerts, env, PARETO if chart.is_file() else None))
    manifest = finish_bundle(out, b.variant, card)
    key = b.publish.signing.private_key
    if key:  # over every file, the manifest and the card included
        signing.sign(out, key)
        attestation.attest(out, key, chain_inputs())  # what it was made from, same key
    return manifest


def _handoff_inputs(b: BundleInputs, env: dict[str, str]) -> HandoffInputs:
    return HandoffInputs(
        b.variant,
        b.spec,
        b.serving,
        b.draft,
        b.deploy,
        b.monitoring,
        b.verdict,
        b.decision,
        b.evidence.estimate.break_even,
        b.evidence.serve,
        b.quantization,
        b.warmup,
        env,
    )


def _card_inputs(b: BundleInputs, tiers: list, alerts: object, env: dict[str, str], pareto: str | None) -> CardInputs:
    return CardInputs(
        b.variant,
        b.spec,
        b.evidence.summary,
        b.evidence.estimate,
        b.verdict,
        b.evidence.quant,
        b.serving,
        b.evidence.gpu,
        b.evidence.serve,
        tiers,
        alerts,
        b.deploy,
        bundle_location(b.deploy, b.serving.name, b.variant),
        env,
        pareto,
        b.report,
        b.decision.parallelism,
    )


def summary_line(b: BundleInputs, manifest: dict) -> str:
    return (
        f"bundle {b.variant}: {len(manifest['files'])} files, digest {manifest['bundle_digest'][:12]}, "
        f"gates {b.verdict.label}, "
        + b.decision.shipped.label
        + f" ({b.verdict.speculation.basis})"
        + (", signed" if b.publish.signing.private_key else "")
    )


def check_measured_config(
    serve_dir: Path, serve: ServeBenchRecord, speculation: methods.Speculation, shipped: str, tier: str | None = None
) -> None:
    """The serve.yaml that ships (serve-<tier>.yaml for a benchmarked tier) is byte for byte the one the serving
    benchmark ran, and that run is in its record (a config file alone proves nothing: one that failed to start
    leaves no measurement)."""
    record = serve.tier(tier) if tier else serve
    if serve.skipped or record is None:
        return
    name = config_name(speculation)
    where = serve_dir / "tiers" / tier if tier else serve_dir
    if config_of(record, speculation) is None:
        raise PipelineError(
            f"{serve_dir}/record.json has no measurement of the {name} config"
            + (f" of tier {tier}" if tier else "")
            + " that ships; re-run `dvc repro` so the gate "
            "and serve_bench agree"
        )
    measured = where / f"serve-{name}.yaml"
    if not measured.is_file() or measured.read_text() != shipped:
        raise PipelineError(
            f"the bundle's {'serve-' + tier + '.yaml' if tier else 'serve.yaml'} differs from "
            f"{measured}, which serve_bench measured; re-run `dvc repro` so both come from the same "
            "params"
        )


def chain_inputs() -> list[attestation.Input]:
    """The attested inputs (deps of this stage in dvc.yaml): the base model as fetched, with its source's
    fingerprint, and the calibration and draft-training data."""
    sources = read_json(paths.SOURCES) if paths.SOURCES.is_file() else {}
    return [
        attestation.dir_input("base-model", paths.TARGET, {"source": sources.get("target")}),
        attestation.file_input("calibration-data", paths.CALIBRATION),
        attestation.file_input("training-data", paths.DRAFT_TRAIN),
    ]
