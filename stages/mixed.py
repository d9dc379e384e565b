"""Stage `mixed@<variant>`: the per-layer precision search of a variant with `mixed:` (pipeline/quantize/mixed.py):
each decoder layer's sensitivity, the frontier, and the walk to the cheapest layout passing the variant's own quality
thresholds; quantize@<variant> ships the checkpoint of the layout it writes, as the walk scored it. A variant without
`mixed:` gets a note saying so."""

import time

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, write_json
from pipeline.core.stage import record_timings, say, stage_main
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize import mixed
from pipeline.quantize.mixed_report import search_line, uniform, write_search_plots
from pipeline.quantize.recipes import VariantSpec, variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.release.settings import GatesParams
from pipeline.release.thresholds import check_for


# the gate's thresholds are release's: the stage joins them to quantize's search (quantize imports no release)
def gate_bounds(params: dict, variant: str) -> tuple[mixed.Bound, ...]:
    """The variant's own quality thresholds (gates.thresholds with its overrides) on the metrics the walk measures."""
    thresholds = parse_section(params, GatesParams).for_variant(variant)
    return tuple(
        mixed.Bound(name, check_for(name).metrics[0], check_for(name).op, float(bound))
        for name, bound in thresholds.items()
        if bound is not None and check_for(name).metrics[0] in mixed.FIDELITY
    )


def search(params: dict, settings: QuantizeParams, spec: VariantSpec) -> None:
    from pipeline.data.formatting import full_text, prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer

    if settings.distributed.gpus > 1:
        raise PipelineError(
            f"quantize.variants.{spec.name}.mixed quantizes in one process; set "
            "quantize.distributed.gpus: 1 or drop the variant's mixed section"
        )
    bounds = gate_bounds(params, spec.name)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(paths.TARGET)
    rows = read_split(paths.CALIBRATION)
    with atomic_dir(paths.MIXED / spec.name) as tmp:  # the shipped layout's checkpoint kept in it, for quantize@
        found = mixed.search(
            paths.TARGET,
            spec,
            [full_text(tokenizer, m) for m in rows],
            [prompt_and_response_ids(tokenizer, m) for m in rows],
            settings.calibration,
            bounds,
            keep=tmp / paths.CHECKPOINT,
        )
        record = mixed.search_metrics(found)
        write_json(
            tmp / paths.LAYOUT,
            {
                "variant": spec.name,
                "targets": mixed.shipped_targets(found),
                "search": record,
                "quantized": mixed.shipped_metrics(found),
            },
        )
    write_search_plots(spec.name, found)
    record_timings(f"mixed-{spec.name}", {"wall_time_s": round(time.perf_counter() - t0, 2)})
    say(search_line(spec.name, record))


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "mixed")
    params = load_params()
    settings = parse_section(params, QuantizeParams)
    spec = variant_spec(settings.variants, variant)
    if spec.mixed is None:
        uniform(variant)
    else:
        search(params, settings, spec)


if __name__ == "__main__":
    main()
