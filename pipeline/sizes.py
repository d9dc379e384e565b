"""File sizes of checkpoints."""
from __future__ import annotations

from pathlib import Path


def dir_size(path: str | Path, suffix: str = "") -> int:
    """Total bytes of the files under path whose names end with suffix."""
    return sum(f.stat().st_size for f in Path(path).rglob(f"*{suffix}") if f.is_file())
