"""Stage `bundle@<variant>`: assemble the serving-ready directory for one gated variant."""
import shutil
from pathlib import Path

from pipeline.core import paths, records
from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, read_json
from pipeline.core.names import registry_name
from pipeline.core.stage import say, stage_main
from pipeline.data.traffic import heldout_prompts
from pipeline.drafts import methods
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate.estimate import SpeculativeEstimate
from pipeline.evaluate.summary import EvalSummary
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import attestation, signing
from pipeline.release.binding import RELEASE, Binding
from pipeline.release.bundle import PARETO, build_bundle, finish_bundle, model_card, provenance
from pipeline.release.gates import GateReport
from pipeline.release.handoff import GENERIC_PROMPTS, bundle_location, write_handoff
from pipeline.release.settings import DeployParams, MonitoringParams, PublishParams
from pipeline.release.shipped_config import config_name, config_of
from pipeline.release.warmup import rendered_prompts
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.config import checkpoint_quantization, engine_args, serve_yaml, server_env, speculative_config_for
from pipeline.serving.parallelism import decision_for, resolved
from pipeline.serving.settings import ServingParams


def check_measured_config(serve_dir: Path, serve: ServeBenchRecord, speculation: methods.Speculation,
                          shipped: str, tier: str | None = None) -> None:
    """The serve.yaml that ships (serve-<tier>.yaml for a benchmarked tier) is byte for byte the one the serving
    benchmark ran, and that run is in its record (a config file alone proves nothing: one that failed to start
    leaves no measurement)."""
    record = serve.tier(tier) if tier else serve
    if serve.skipped or record is None:
        return
    name = config_name(speculation)
    where = serve_dir / "tiers" / tier if tier else serve_dir
    if config_of(record, speculation) is None:
        raise PipelineError(f"{serve_dir}/record.json has no measurement of the {name} config"
                            + (f" of tier {tier}" if tier else "") + " that ships; re-run `dvc repro` so the gate "
                            "and serve_bench agree")
    measured = where / f"serve-{name}.yaml"
    if not measured.is_file() or measured.read_text() != shipped:
        raise PipelineError(f"the bundle's {'serve-' + tier + '.yaml' if tier else 'serve.yaml'} differs from "
                            f"{measured}, which serve_bench measured; re-run `dvc repro` so both come from the same "
                            "params")


def chain_inputs() -> list[attestation.Input]:
    """The attested inputs (deps of this stage in dvc.yaml): the base model as fetched, with its source's
    fingerprint, and the calibration and draft-training data."""
    sources = read_json(paths.SOURCES) if paths.SOURCES.is_file() else {}
    return [attestation.dir_input("base-model", paths.TARGET, {"source": sources.get("target")}),
            attestation.file_input("calibration-data", paths.CALIBRATION),
            attestation.file_input("training-data", paths.DRAFT_TRAIN)]


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "bundle")
    p = load_params()
    spec = variant_spec(parse_section(p, QuantizeParams).variants, variant)
    report = records.read(GateReport, paths.VERDICT)
    verdict = report.variants.get(variant)
    if verdict is None or verdict.speculation is None:
        raise PipelineError(f"{paths.VERDICT} has no verdict for {variant}; run the gate stage")
    if not verdict.shippable:
        raise PipelineError(f"{variant} failed its gates; it is not bundled (gates.allow_fail publishes it flagged)")
    ev, serve_dir = paths.EVAL / variant, paths.SERVE / variant
    summary = EvalSummary.load(ev / "summary.json")
    shipped = verdict.speculation.speculation
    candidate = verdict.speculation.method  # its estimate describes the speculation in the card
    est_file = ev / f"speculative-{candidate}.json"
    est = records.read(SpeculativeEstimate, est_file if est_file.is_file() else ev / "speculative.json")
    gpu = records.read(VllmMeasurement, ev / "vllm.json")
    serve = records.read(ServeBenchRecord, serve_dir / "record.json")
    quant = read_json(f"metrics/quantize-{variant}.json")
    model_dir = paths.QUANTIZED / variant
    quantization = checkpoint_quantization(model_dir)
    # at the variant's own tensor parallelism, from its checkpoint: serve.yaml, engine_args.json, manifests, card
    parallel = decision_for(variant, p, model_dir)
    serving = resolved(parse_section(p, ServingParams), parallel.tensor_parallel_size)
    draft = parse_section(p, DraftParams)
    deploy, publish = parse_section(p, DeployParams), parse_section(p, PublishParams)
    signing_keys = publish.signing
    args = engine_args(spec, serving, speculative_config_for(shipped, draft, serving), quantization)
    check_measured_config(serve_dir, serve, shipped, serve_yaml(args))
    # PROVENANCE.json records the serving section as params.yaml writes it
    record = provenance(spec, p[ServingParams.SECTION], read_json("metrics/models.json"))
    # the registry name and version it is for: signed with the rest, checked by publish and resolution
    record[RELEASE] = Binding(registry_name(serving.name, variant), variant, publish.version).as_record()
    n = deploy.warmup_prompts
    prompts = (heldout_prompts(paths.HELDOUT, n)
               if deploy.warmup_from_traffic else
               [[{"role": "user", "content": GENERIC_PROMPTS[i % len(GENERIC_PROMPTS)]}] for i in range(n)])
    warm = rendered_prompts(model_dir, prompts, paths.CACHE)  # one tokenizer load per build, not per bundle
    with atomic_dir(paths.BUNDLES / variant) as tmp:
        drafter = ((methods.ARTIFACT_DIRS[shipped.method], methods.BUNDLE_DIRS[shipped.method])
                   if shipped.method in methods.ARTIFACT_DIRS else None)
        # The kernel serve_bench measured faster on this GPU where it compared them; else the unmeasured default.
        env = server_env(spec, serving, serve.kernel_env if serve.kernel else None)
        build_bundle(tmp, model_dir, drafter, args, record, verdict, summary, env)
        tiers, alerts = write_handoff(tmp, variant, spec, serving, draft, deploy, parse_section(p, MonitoringParams),
                                      verdict, est.break_even, serve, quantization, warm, env)
        chart = paths.PARETO  # drawn by the gate, over every variant, where one was measured
        if chart.is_file():
            shutil.copyfile(chart, tmp / PARETO)
        for plan in tiers:
            if plan.name in serve.tiers:
                check_measured_config(serve_dir, serve, plan.speculation, (tmp / plan.serve_file).read_text(),
                                      plan.name)
        card = model_card(variant, spec, summary, est, verdict, quant, serving, gpu, serve, tiers, alerts,
                          deploy, bundle_location(deploy, serving.name, variant), env,
                          PARETO if chart.is_file() else None, report, parallel.reason())
        manifest = finish_bundle(tmp, variant, card)
        if signing_keys.private_key:  # over every file, the manifest and the card included
            signing.sign(tmp, signing_keys.private_key)
            attestation.attest(tmp, signing_keys.private_key, chain_inputs())  # what it was made from, same key
    say(f"bundle {variant}: {len(manifest['files'])} files, digest {manifest['bundle_digest'][:12]}, "
        f"gates {verdict.label}, " + shipped.label
        + f" ({verdict.speculation.basis})" + (", signed" if signing_keys.private_key else ""))


if __name__ == "__main__":
    main()
