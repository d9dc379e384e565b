"""Stage `mixed@<variant>`: the per-layer precision search of a variant with `mixed:` (pipeline/quantize/mixed.py):
each decoder layer's sensitivity, the frontier, and the walk to the cheapest layout passing the variant's own quality
thresholds; quantize@<variant> ships the checkpoint of the layout it writes, as the walk scored it. A variant without
`mixed:` gets a note saying so."""

import time
from collections.abc import Callable

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
def gate_bounds(params: dict, variant: str, functional: bool = False) -> tuple[mixed.Bound, ...]:
    """The variant's own quality thresholds (gates.thresholds with its overrides) on the metrics the walk measures:
    fidelity, and the pass@1 drop where the walk measures pass@1 (functional)."""
    thresholds = parse_section(params, GatesParams).for_variant(variant)
    walked = (*mixed.FIDELITY, mixed.PASS_AT_1_DROP) if functional else mixed.FIDELITY
    return tuple(
        mixed.Bound(name, check_for(name).metrics[0], check_for(name).op, float(bound))
        for name, bound in thresholds.items()
        if bound is not None and check_for(name).metrics[0] in walked
    )


def walk_pass_at_1(params: dict, spec: VariantSpec) -> Callable[[object], float] | None:
    """pass@1 of a model on the functional tasks past the gate's (evaluate.functional.limit), at most
    mixed.functional_tasks of them, where the gate bounds pass@1: a layout that keeps perplexity, KL and top-1 can
    still lose code (GPTQ W4A16 of Qwen2.5-Coder-1.5B: +3% perplexity, pass@1 down 0.094). None where the gate does
    not bound pass@1 or evaluate.functional is off, and, said in one line, where no task is left that the gate does
    not score."""
    from pipeline.evaluate import functional
    from pipeline.evaluate.settings import EvaluateParams
    from pipeline.models.loading import load_tokenizer

    if parse_section(params, GatesParams).for_variant(spec.name).get("max_pass_at_1_drop") is None:
        return None
    check = parse_section(params, EvaluateParams).functional
    if check.tasks is None or not spec.mixed.functional_tasks:
        return None
    every = functional.load_tasks(check.tasks)
    tasks = every[check.limit or len(every) :][: spec.mixed.functional_tasks]
    if not tasks:
        say(
            f"mixed {spec.name}: pass@1 left to the gate: evaluate.functional.limit leaves none of the "
            f"{len(every)} tasks in {check.tasks} unscored"
        )
        return None
    say(f"mixed {spec.name}: pass@1 checked on {len(tasks)} tasks the gate does not score ({check.tasks})")
    tokenizer, limits = load_tokenizer(paths.TARGET), functional.limits_of(check)
    return lambda model: functional.pass_at_1(model, tokenizer, tasks, check.max_new_tokens, limits).pass_at_1


def search(params: dict, settings: QuantizeParams, spec: VariantSpec) -> None:
    from pipeline.data.formatting import full_text, prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer

    if settings.distributed.gpus > 1:
        raise PipelineError(
            f"quantize.variants.{spec.name}.mixed quantizes in one process; set "
            "quantize.distributed.gpus: 1 or drop the variant's mixed section"
        )
    pass_at_1 = walk_pass_at_1(params, spec)
    bounds = gate_bounds(params, spec.name, functional=pass_at_1 is not None)
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
            pass_at_1=pass_at_1,
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
