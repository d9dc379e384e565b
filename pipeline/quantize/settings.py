"""params.yaml `quantize`, typed: which variants are built, how they calibrate, over how many processes. A variant's
recipe stays a mapping here (quantize.variants.<name>): recipes.py parses it into a VariantSpec where a stage needs
one, with compressed-tensors, which this module does not import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pipeline.core.errors import PipelineError
from pipeline.core.sections import Section
from pipeline.params.declare import knob, parse_declared, section


@dataclass(frozen=True)
class Calibration:
    """quantize.calibration: the rows and length every calibrated recipe sees (a variant may override both), the
    layers left unquantized and how llm-compressor walks the model."""

    num_samples: int = knob(256, required=True, help="calibration rows (a variant may override)", minimum=1)
    max_seq_length: int = knob(512, required=True, help="tokens per row (a variant may override)", minimum=1)
    ignore: tuple[str, ...] = knob(("lm_head",), help="layers left unquantized (names or re: patterns)")
    pipeline: Literal["sequential", "basic", "datafree", "independent"] | None = knob(
        None, help="llm-compressor's calibration pipeline; null: it chooses"
    )
    offload: bool = knob(False, help="keep the weights in CPU RAM, one layer at a time on the GPU")
    # layer class names; None: llm-compressor infers them
    sequential_targets: str | tuple[str, ...] | None = knob(None, help="layer class names; null: inferred")
    # AWQ's scale-search grid on a host without a GPU, where a variant sets none
    cpu_awq_n_grid: int | None = knob(
        4, help="AWQ's scale-search grid on a host without a GPU; null: the default", minimum=1
    )

    @classmethod
    def parse(cls, raw: Mapping) -> Calibration:
        return parse_declared(cls, raw, "quantize.calibration")

    def with_overrides(self, num_samples: int | None, max_seq_length: int | None) -> Calibration:
        """A variant's own num_samples / max_seq_length over these (None: the section's)."""
        return replace(
            self,
            num_samples=self.num_samples if num_samples is None else num_samples,
            max_seq_length=self.max_seq_length if max_seq_length is None else max_seq_length,
        )


# quantize.variants.<v>.mixed: a per-layer precision search on top of the variant's scheme (pipeline/quantize/mixed.py)
MIXED_KEYS = ("schemes", "samples", "max_tries", "margin", "functional_tasks")
UNQUANTIZED = "UNQUANTIZED"  # compressed-tensors' preset name for a layer left in the checkpoint's dtype (BF16)


@dataclass(frozen=True)
class MixedSearch:
    """quantize.variants.<v>.mixed: the schemes a decoder layer may be promoted to from the variant's own (cheapest
    first, e.g. [W8A16, UNQUANTIZED]), the calibration rows the sensitivity and each verification score, how many
    layouts the walk quantizes and evaluates before it says none passes, and the share of each threshold's allowed
    loss the walk keeps in reserve (0.2: pass with a fifth of it to spare), as the gate scores held-out rows the walk
    never sees; and how many functional tasks past the gate's (evaluate.functional.limit) the walk's pass@1 check
    decodes where the gate bounds pass@1 (0: the walk leaves pass@1 to the gate)."""

    schemes: tuple[str, ...]
    samples: int = 16
    max_tries: int = 4
    margin: float = 0.0
    functional_tasks: int = 32

    @classmethod
    def parse(cls, raw: object, where: str) -> MixedSearch:
        s = Section(raw, where)
        unknown = sorted(set(s.raw) - set(MIXED_KEYS))
        if unknown:
            raise PipelineError(f"{where}: unknown keys {unknown} (known: {list(MIXED_KEYS)})")
        schemes = s.strs("schemes")
        if not schemes or len(set(schemes)) != len(schemes):
            raise s.fail("schemes", "a non-empty list of distinct scheme names", list(schemes))
        return cls(
            schemes=schemes,
            samples=s.int("samples", cls.samples, minimum=1),
            max_tries=s.int("max_tries", cls.max_tries, minimum=1),
            margin=margin_of(s),
            functional_tasks=s.int("functional_tasks", cls.functional_tasks, minimum=0),
        )


def margin_of(s: Section) -> float:
    margin = s.number("margin", MixedSearch.margin)
    if not 0 <= margin < 1:
        raise s.fail("margin", "a number in [0, 1)", margin)
    return float(margin)


@dataclass(frozen=True)
class Distributed:
    """quantize.distributed: gpus > 1 quantizes under torchrun, one process per GPU; 1 is the one-process path."""

    gpus: int = knob(1, help="processes (one per GPU) under torchrun; 1: the one-process path", minimum=1)
    timeout_s: float = knob(
        1800, help="a process left waiting on a stuck one fails the stage after this long", exclusive_minimum=0
    )


def at_least_one(enabled: tuple[str, ...]) -> None:
    if not enabled or len(set(enabled)) != len(enabled):
        raise PipelineError("quantize.enabled must be a non-empty list of distinct variant names")


@section("quantize")
@dataclass(frozen=True)
class QuantizeParams:
    """params.yaml `quantize`: the variants built, their calibration, how many processes."""

    enabled: tuple[str, ...] = knob(
        ("bf16", "fp8-dynamic", "fp8-static", "gptq-w4a16", "awq-w4a16"),
        required=True,
        help="the variants `dvc repro` builds, in order (quantize.variants names)",
    )
    calibration: Calibration = knob(Calibration(), required=True, help="what every calibrated recipe sees")
    distributed: Distributed = knob(Distributed(), help="llm-compressor's distributed oneshot")
    # name -> its recipe as written (recipes.enabled_variant parses one)
    variants: Mapping[str, Mapping] = knob({}, help="name -> recipe (pipeline/quantize/recipes.py parses each)")

    def __post_init__(self) -> None:
        at_least_one(self.enabled)
        unknown = [n for n in self.enabled if n not in self.variants]
        if unknown:
            raise PipelineError(f"quantize.enabled names unknown variants {unknown}; known: {sorted(self.variants)}")
