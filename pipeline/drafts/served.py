"""What artifacts/draft holds (core/paths.py DRAFT): the draft bundles serve, as trained or quantized (stage
draft_quantize), and this record of which (DRAFT_RECORD)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServedDraft:
    quantized_variant: str | None  # a quantize.variants name, or None for the fine-tuned weights as trained
    size_mb: float | None
    skipped: str | None = None  # why there is no draft model (draft.method does not list draft_model)
