"""params.yaml `data`, typed: the traffic file and how it is split."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.sections import Section


@dataclass(frozen=True)
class Fractions:
    """data.fractions: the shares of traffic held out and used for calibration; the rest trains the draft."""
    calibration: float
    heldout: float


@dataclass(frozen=True)
class DataParams:
    SECTION: ClassVar[str] = "data"
    traffic: str  # JSONL path
    seed: int
    fractions: Fractions
    max_tokens: int  # longer conversations are dropped

    @classmethod
    def parse(cls, section: dict) -> DataParams:
        s = Section(section, cls.SECTION)
        f = s.section("fractions")
        return cls(traffic=s.str("traffic"), seed=s.int("seed"),
                   fractions=Fractions(f.number("calibration"), f.number("heldout")),
                   max_tokens=s.int("max_tokens", minimum=1))
