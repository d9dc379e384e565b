"""params.yaml `data`, typed: the traffic file and how it is split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.params.declare import knob, section

PROMPT_FORMATS = ("chat_template", "plain")


@dataclass(frozen=True)
class Fractions:
    """data.fractions: the shares of traffic held out and used for calibration; the rest trains the draft."""

    calibration: float = knob(0.2, required=True, help="share of traffic used for calibration")
    heldout: float = knob(0.2, required=True, help="share of traffic held out for evaluation")


@section("data")
@dataclass(frozen=True)
class DataParams:
    """params.yaml `data`: the traffic file and how it is split."""

    traffic: str = knob("data/demo/traffic.jsonl", required=True, help="the traffic, JSONL conversations")
    seed: int = knob(0, required=True, help="the split's seed")
    fractions: Fractions = knob(Fractions(), required=True, help="the split; the rest trains the draft")
    max_tokens: int = knob(1024, required=True, help="longer conversations are dropped", minimum=1)
    # How prompts are laid out (pipeline/data/formatting.py)
    prompt_format: Literal["chat_template", "plain"] = knob(
        "chat_template", help="chat_template: the target's own; plain: each turn's text on its own line (a base model)"
    )
