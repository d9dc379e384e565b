"""The one-line summary stages/quantize.py prints for a variant: how it was made and its per-layer groups."""

from pipeline.quantize.recipes import group_size_label


def how(metrics: dict, measured: dict) -> str:
    """How the checkpoint was made: copied from mixed@'s search, or its wall time, ranks and peak memory."""
    if metrics.get("mixed"):
        return f"mixed@'s scored checkpoint copied in {measured['wall_time_s']} s"
    ranks = f", {metrics['processes']} processes" if metrics["processes"] > 1 else ""
    return f"{measured['wall_time_s']} s{ranks}, peak {measured['peak_memory_mb']:.0f} MB"


def group_line(metrics: dict) -> str:
    """The group size actually used where it differs from the configured one, and a mixed layout's schemes."""
    group = (
        f"; group size {group_size_label(metrics['group_size'])}, not the configured "
        f"{metrics['group_size_configured']}: " + "; ".join(metrics["group_size_reason"])
        if metrics.get("group_size_reason")
        else ""
    )
    mixed = metrics.get("mixed") and ", ".join(f"{s} {v}" for s, v in metrics["mixed"]["layout"].items() if v)
    return group + (f"; per layer: {mixed}" if mixed else "")
