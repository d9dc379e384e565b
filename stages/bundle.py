"""Stage `bundle@<variant>`: assemble the serving-ready directory for one gated variant."""
import sys
from pathlib import Path

from pipeline.bundle import build_bundle, checkpoint_quantization, engine_args, model_card
from pipeline.config import enabled_variant, load_params, one_line_errors, variant_argument
from pipeline.draft import served_draft
from pipeline.errors import PipelineError
from pipeline.io import atomic_dir, read_json


@one_line_errors
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "bundle")
    p = load_params()
    spec = enabled_variant(p, variant)
    gate = read_json("artifacts/gate/verdict.json")["variants"][variant]
    if not (gate["passed"] or gate["allowed_failure"]):
        raise PipelineError(f"{variant} failed its gates; it is not bundled (gates.allow_fail publishes it flagged)")
    ev = Path("artifacts/eval") / variant
    summary, spec_est, gpu = read_json(ev / "summary.json"), read_json(ev / "speculative.json"), read_json(ev / "vllm.json")
    quant = read_json(f"metrics/quantize-{variant}.json")
    draft = served_draft("artifacts/draft")
    model_dir = Path("artifacts/quantized") / variant
    args = engine_args(spec, p["serving"], spec_est["num_speculative_tokens"], has_draft=True,
                       quantization=checkpoint_quantization(model_dir))
    card = model_card(variant, spec, summary, spec_est, gate, quant, p["serving"], gpu)
    with atomic_dir(Path("artifacts/bundles") / variant) as tmp:
        manifest = build_bundle(tmp, variant, model_dir, draft, args, card, p)
    print(f"bundle {variant}: {len(manifest['files'])} files, digest {manifest['bundle_digest'][:12]}")


if __name__ == "__main__":
    main(sys.argv[1:])
