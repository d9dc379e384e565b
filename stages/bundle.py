"""Stage `bundle@<variant>`: assemble the serving-ready directory for one gated variant."""
from pathlib import Path

from pipeline import records
from pipeline.acceptance import SpeculativeEstimate
from pipeline.bundle import build_bundle, checkpoint_quantization, engine_args, model_card, provenance
from pipeline.config import enabled_variant, load_params, variant_argument
from pipeline.errors import PipelineError
from pipeline.gates import GateReport
from pipeline.io import atomic_dir, read_json
from pipeline.served_draft import MODEL
from pipeline.stage import say, stage_main
from pipeline.vllm_spec import VllmMeasurement

DRAFT = MODEL


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "bundle")
    p = load_params()
    spec = enabled_variant(p, variant)
    verdict = records.read(GateReport, "artifacts/gate/verdict.json").variants.get(variant)
    if verdict is None:
        raise PipelineError(f"artifacts/gate/verdict.json has no verdict for {variant}; run the gate stage")
    if not verdict.shippable:
        raise PipelineError(f"{variant} failed its gates; it is not bundled (gates.allow_fail publishes it flagged)")
    ev = Path("artifacts/eval") / variant
    summary = read_json(ev / "summary.json")
    est = records.read(SpeculativeEstimate, ev / "speculative.json")
    gpu = records.read(VllmMeasurement, ev / "vllm.json")
    quant = read_json(f"metrics/quantize-{variant}.json")
    model_dir = Path("artifacts/quantized") / variant
    args = engine_args(spec, p["serving"], est.num_speculative_tokens, has_draft=True,
                       quantization=checkpoint_quantization(model_dir))
    card = model_card(variant, spec, summary, est, verdict, quant, p["serving"], gpu)
    record = provenance(spec, p["serving"], read_json("metrics/models.json"))
    with atomic_dir(Path("artifacts/bundles") / variant) as tmp:
        manifest = build_bundle(tmp, variant, model_dir, DRAFT, args, card, record, verdict, summary)
    say(f"bundle {variant}: {len(manifest['files'])} files, digest {manifest['bundle_digest'][:12]}, "
        f"gates {verdict.label}, k={est.num_speculative_tokens}")


if __name__ == "__main__":
    main()
