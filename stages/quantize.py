"""Stage `quantize@<variant>`: run the variant's llm-compressor recipe on the target, in the per-layer layout
mixed@<variant> chose for a variant with `mixed:` (one config group per scheme)."""
from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, read_json, write_json
from pipeline.core.stage import record_timings, say, stage_main
from pipeline.data.formatting import full_text
from pipeline.data.traffic import read_split
from pipeline.models.loading import load_tokenizer
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.distributed import quantize
from pipeline.quantize.oneshot import RUN_DEPENDENT, quantize_model
from pipeline.quantize.recipes import VariantSpec, group_size_label, is_unquantized, variant_spec
from pipeline.quantize.settings import QuantizeParams


def searched_layout(spec: VariantSpec) -> dict | None:
    """mixed@<variant>'s layout of a variant with `mixed:` (None without: every layer in the variant's scheme)."""
    if spec.mixed is None:
        return None
    path = paths.MIXED / spec.name / paths.LAYOUT
    layout = read_json(path) if path.is_file() else {}
    if not layout.get("targets"):
        raise PipelineError(f"{path} holds no per-layer layout, and quantize.variants.{spec.name} has a mixed: "
                            f"section: run its search first (`dvc repro quantize@{spec.name}` runs mixed@{spec.name})")
    return layout


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "quantize")
    settings = parse_section(load_params(), QuantizeParams)
    spec = variant_spec(settings.variants, variant)
    layout = searched_layout(spec)  # before any model loads
    texts = []
    # The unquantized baseline is a copy that calibrates on nothing: no tokenizer (transformers, torch: seconds).
    if not is_unquantized(spec):
        tokenizer = load_tokenizer(paths.TARGET)
        # Calibrate on the domain's own traffic, formatted as the served model sees it.
        texts = [full_text(tokenizer, m) for m in read_split(paths.CALIBRATION)]
    with atomic_dir(paths.QUANTIZED / variant) as tmp:
        if layout is not None:  # mixed@<variant> refused quantize.distributed.gpus > 1
            metrics = {**quantize_model(paths.TARGET, tmp, spec, texts, settings.calibration, layout["targets"]),
                       "mixed": layout["search"]}
        else:
            # quantize.distributed.gpus > 1: that many ranks under torchrun, rank 0 writing into tmp.
            metrics = quantize(paths.TARGET, tmp, spec, texts, settings.calibration, settings.distributed)
    measured = {k: metrics.pop(k) for k in RUN_DEPENDENT if k in metrics}
    write_json(f"metrics/quantize-{variant}.json", metrics)
    record_timings(f"quantize-{variant}", measured)
    ranks = f", {metrics['processes']} processes" if metrics["processes"] > 1 else ""
    group = ""
    if metrics.get("group_size_reason"):
        group = (f"; group size {group_size_label(metrics['group_size'])}, not the configured "
                 f"{metrics['group_size_configured']}: "
                 + "; ".join(metrics["group_size_reason"]))
    mixed = ""
    if metrics.get("mixed"):
        mixed = "; per layer: " + ", ".join(f"{s} {layers}" for s, layers in metrics["mixed"]["layout"].items()
                                            if layers)
    say(f"quantize {variant}: {measured['wall_time_s']} s{ranks}, peak {measured['peak_memory_mb']:.0f} MB, "
        f"{metrics['size_before_mb']} MB -> "
          f"{metrics['size_after_mb']} MB (x{metrics['compression_ratio']}){group}{mixed}")


if __name__ == "__main__":
    main()
