"""The sources stage's report of the group sizes chosen for the target's layer widths. pipeline.quantize.recipes is
imported where used: it imports compressed-tensors (seconds), needed only when the sources stage's recipe check runs."""

from pipeline.core.stage import say
from pipeline.params.load import parse_section
from pipeline.quantize.settings import QuantizeParams
from pipeline.rules import group_sizes


def say_group_sizes(p: dict) -> None:
    """Each enabled variant whose group size was changed for the target's layer widths, and why."""
    from pipeline.quantize.recipes import group_size_label, variant_spec  # compressed-tensors: when needed

    quantize = parse_section(p, QuantizeParams)
    specs = [variant_spec(quantize.variants, v) for v in quantize.enabled]
    for name, group in group_sizes(p, specs).items():
        if group.reason:
            say(
                f"sources: quantize {name}: group_size {group.configured} -> {group_size_label(group.used)} "
                f"({group.reason})"
            )
