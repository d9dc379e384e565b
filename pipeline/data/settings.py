"""params.yaml `data`, typed: the traffic file and how it is split."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.sections import Section

PROMPT_FORMATS = ("chat_template", "plain")


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
    # How prompts are laid out: chat_template (the target's own; a model without one is refused for this chat
    # traffic) or plain (each turn's text on its own line: a base model, said so at `models`;
    # pipeline/data/formatting.py)
    prompt_format: str = "chat_template"

    @classmethod
    def parse(cls, section: dict) -> DataParams:
        s = Section(section, cls.SECTION)
        f = s.section("fractions")
        return cls(traffic=s.str("traffic"), seed=s.int("seed"),
                   fractions=Fractions(f.number("calibration"), f.number("heldout")),
                   max_tokens=s.int("max_tokens", minimum=1),
                   prompt_format=s.choice("prompt_format", PROMPT_FORMATS, "chat_template"))
