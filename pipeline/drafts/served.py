"""What artifacts/draft holds: the draft bundles serve, as trained or quantized (stage draft_quantize)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DRAFT_DIR = Path("artifacts/draft")
MODEL = DRAFT_DIR / "model"
RECORD = DRAFT_DIR / "served.json"


@dataclass
class ServedDraft:
    quantized_variant: str | None  # a quantize.variants name, or None for the fine-tuned weights as trained
    size_mb: float | None
    skipped: str | None = None  # why there is no draft model (draft.method does not list draft_model)
