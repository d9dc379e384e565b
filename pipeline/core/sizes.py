"""File sizes of checkpoints. Every size the pipeline reports in MB is megabytes (10^6 bytes), as labelled."""

from __future__ import annotations

from pathlib import Path


def dir_size(path: str | Path, suffix: str = "") -> int:
    """Total bytes of the files under path whose names end with suffix."""
    return sum(f.stat().st_size for f in Path(path).rglob(f"*{suffix}") if f.is_file())


def megabytes(n_bytes: float, digits: int = 3) -> float:
    """Bytes in MB (10^6 bytes, not MiB): what every `*_mb` field and "MB" label of the pipeline means."""
    return round(n_bytes / 1e6, digits)


MB_PER_MIB = 2**20 / 1e6
RECORDED_IN_MIB_UNTIL = "e39f0c9"  # the commit that made `*_mb` MB; code before it wrote MiB under the same names


def mib_record_as_mb(record: dict) -> dict:
    """A record written before RECORDED_IN_MIB_UNTIL, whose `*_mb` numbers are MiB, with them in MB as labelled."""
    return {
        k: round(v * MB_PER_MIB, 3)
        if k.endswith("_mb") and isinstance(v, (int, float)) and not isinstance(v, bool)
        else v
        for k, v in record.items()
    }
