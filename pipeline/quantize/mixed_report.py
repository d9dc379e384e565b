"""The mixed@<variant> stage's pieces around pipeline/quantize/mixed.py's search: the
note and plots of a variant without `mixed:`, the search's plots and its summary line."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir, write_json
from pipeline.core.plots import write_plot
from pipeline.quantize import mixed


def uniform(variant: str) -> None:
    """No search: the layout note quantize reads (unchanged by any threshold) and plot directories saying why."""
    with atomic_dir(paths.MIXED / variant) as tmp:
        write_json(tmp / paths.LAYOUT, {"variant": variant, "targets": None, "search": None})
    for directory in (mixed.SENSITIVITY_PLOT, mixed.FRONTIER_PLOT):
        write_plot(
            f"{directory}/{variant}",
            [],
            [],
            f"{variant} quantizes every layer alike (no mixed: section in "
            f"quantize.variants.{variant}): no per-layer search",
        )


def write_search_plots(name: str, found: mixed.Search) -> None:
    """The search's sensitivity and frontier plots under plots/."""
    write_plot(
        f"{mixed.SENSITIVITY_PLOT}/{name}",
        mixed.sensitivity_rows(found),
        ["layer", "kl_divergence", *(r.scheme for r in found.ladder if r.weights is not None)],
        "",
    )
    write_plot(
        f"{mixed.FRONTIER_PLOT}/{name}",
        mixed.frontier_rows(found),
        ["point", "predicted_mb", "predicted_kl", "measured_kl", "promoted_layer"],
        "",
    )


def search_line(name: str, record: dict) -> str:
    """The stage's one line: layouts tried, and the frontier point that passed or why none did."""
    layout = ", ".join(f"{s} layers {v}" for s, v in record["layout"].items() if v)
    return f"mixed {name}: {len(record['tries'])} layouts tried; " + (
        f"frontier point {record['frontier_point']} passed ({layout})"
        if record["passed"]
        else f"{record['reason'][0]}; quantizing the most expensive tried ({layout})"
    )
