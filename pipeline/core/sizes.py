"""File sizes of checkpoints. Every size the pipeline reports in MB is megabytes (10^6 bytes), as labelled."""
from __future__ import annotations

from pathlib import Path


def dir_size(path: str | Path, suffix: str = "") -> int:
    """Total bytes of the files under path whose names end with suffix."""
    return sum(f.stat().st_size for f in Path(path).rglob(f"*{suffix}") if f.is_file())


def megabytes(n_bytes: float, digits: int = 3) -> float:
    """Bytes in MB (10^6 bytes, not MiB): what every `*_mb` field and "MB" label of the pipeline means."""
    return round(n_bytes / 1e6, digits)
