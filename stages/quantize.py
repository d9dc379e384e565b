"""Stage `quantize@<variant>`: run the variant's llm-compressor recipe on the target; for a variant with `mixed:`, ship
the checkpoint mixed@<variant> quantized and scored for the per-layer layout it chose (one config group per scheme),
never a second quantization of it."""

import shutil
import time

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, read_json, write_json
from pipeline.core.stage import record_timings, say, stage_main
from pipeline.data.formatting import full_text
from pipeline.data.traffic import read_split
from pipeline.models.loading import load_tokenizer
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.distributed import quantize
from pipeline.quantize.oneshot import RUN_DEPENDENT
from pipeline.quantize.recipes import VariantSpec, is_unquantized, variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.quantize.summary import group_line, how


def searched_layout(spec: VariantSpec) -> dict | None:
    """mixed@<variant>'s layout of a variant with `mixed:` (None without: every layer in the variant's scheme)."""
    if spec.mixed is None:
        return None
    path = paths.MIXED / spec.name / paths.LAYOUT
    layout = read_json(path) if path.is_file() else {}
    if not layout.get("targets") or not (path.parent / paths.CHECKPOINT).is_dir():
        raise PipelineError(
            f"{path} holds no per-layer layout and checkpoint, and quantize.variants.{spec.name} has "
            f"a mixed: section: run its search first (`dvc repro quantize@{spec.name}` runs "
            f"mixed@{spec.name})"
        )
    return layout


def calibration_texts(spec: VariantSpec) -> list[str]:
    """The calibration split as the served model sees it; none for the unquantized copy (no tokenizer: seconds)."""
    if is_unquantized(spec):
        return []
    tokenizer = load_tokenizer(paths.TARGET)
    return [full_text(tokenizer, m) for m in read_split(paths.CALIBRATION)]


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "quantize")
    settings = parse_section(load_params(), QuantizeParams)
    spec = variant_spec(settings.variants, variant)
    layout = searched_layout(spec)  # before any model loads
    with atomic_dir(paths.QUANTIZED / variant) as tmp:
        t0 = time.perf_counter()
        if layout is not None:  # the checkpoint the search scored; its metrics as that quantization measured them
            shutil.copytree(paths.MIXED / variant / paths.CHECKPOINT, tmp, dirs_exist_ok=True)
            metrics = {**layout["quantized"], "mixed": layout["search"]}
            measured = {"wall_time_s": round(time.perf_counter() - t0, 2)}
        else:
            # quantize.distributed.gpus > 1: that many ranks under torchrun, rank 0 writing into tmp.
            metrics = quantize(
                paths.TARGET, tmp, spec, calibration_texts(spec), settings.calibration, settings.distributed
            )
            measured = {k: metrics.pop(k) for k in RUN_DEPENDENT if k in metrics}
    write_json(f"metrics/quantize-{variant}.json", metrics)
    record_timings(f"quantize-{variant}", measured)
    say(
        f"quantize {variant}: {how(metrics, measured)}, {metrics['size_before_mb']} MB -> "
        f"{metrics['size_after_mb']} MB (x{metrics['compression_ratio']}){group_line(metrics)}"
    )


if __name__ == "__main__":
    main()
