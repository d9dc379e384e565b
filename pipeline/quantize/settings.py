"""params.yaml `quantize`, typed: which variants are built, how they calibrate, over how many processes. A variant's
recipe stays a mapping here (quantize.variants.<name>): recipes.py parses it into a VariantSpec where a stage needs
one, with compressed-tensors, which this module does not import."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from pipeline.core.errors import PipelineError
from pipeline.core.sections import Section
from pipeline.core.values import is_positive_int, is_positive_number

# quantize.calibration.pipeline: llm-compressor's calibration pipelines (None: it chooses)
PIPELINES = ("sequential", "basic", "datafree", "independent")


@dataclass(frozen=True)
class Calibration:
    """quantize.calibration: the rows and length every calibrated recipe sees (a variant may override both), the
    layers left unquantized and how llm-compressor walks the model."""
    num_samples: int
    max_seq_length: int
    ignore: tuple[str, ...] = ("lm_head",)
    pipeline: str | None = None
    offload: bool = False
    sequential_targets: str | tuple[str, ...] | None = None  # layer class names; None: llm-compressor infers them
    cpu_awq_n_grid: int | None = None  # AWQ's scale-search grid on a host without a GPU, where a variant sets none

    @classmethod
    def parse(cls, s: Section | Mapping) -> Calibration:
        """quantize.calibration (a Section of the quantize section, or the mapping itself)."""
        s = s if isinstance(s, Section) else Section(s, "quantize.calibration")
        targets = s.value("sequential_targets", None)
        if targets is not None and not isinstance(targets, str):
            targets = s.strs("sequential_targets")
        pipeline = s.value("pipeline", None)
        if pipeline not in (None, *PIPELINES):
            raise s.fail("pipeline", f"one of {list(PIPELINES)} or null", pipeline)
        return cls(num_samples=s.int("num_samples", minimum=1), max_seq_length=s.int("max_seq_length", minimum=1),
                   ignore=s.strs("ignore", ["lm_head"]), pipeline=pipeline, offload=s.bool("offload", False),
                   sequential_targets=targets, cpu_awq_n_grid=s.int_or_none("cpu_awq_n_grid", minimum=1))

    def with_overrides(self, num_samples: int | None, max_seq_length: int | None) -> Calibration:
        """A variant's own num_samples / max_seq_length over these (None: the section's)."""
        return replace(self, num_samples=self.num_samples if num_samples is None else num_samples,
                       max_seq_length=self.max_seq_length if max_seq_length is None else max_seq_length)


# quantize.variants.<v>.mixed: a per-layer precision search on top of the variant's scheme (pipeline/quantize/mixed.py)
MIXED_KEYS = ("schemes", "samples", "max_tries")
UNQUANTIZED = "UNQUANTIZED"  # compressed-tensors' preset name for a layer left in the checkpoint's dtype (BF16)


@dataclass(frozen=True)
class MixedSearch:
    """quantize.variants.<v>.mixed: the schemes a decoder layer may be promoted to from the variant's own (cheapest
    first, e.g. [W8A16, UNQUANTIZED]), the calibration rows the sensitivity and each verification score, and how many
    layouts the walk quantizes and evaluates before it says none passes."""
    schemes: tuple[str, ...]
    samples: int = 16
    max_tries: int = 4

    @classmethod
    def parse(cls, raw: object, where: str) -> MixedSearch:
        s = Section(raw, where)
        unknown = sorted(set(s.raw) - set(MIXED_KEYS))
        if unknown:
            raise PipelineError(f"{where}: unknown keys {unknown} (known: {list(MIXED_KEYS)})")
        schemes = s.strs("schemes")
        if not schemes or len(set(schemes)) != len(schemes):
            raise s.fail("schemes", "a non-empty list of distinct scheme names", list(schemes))
        return cls(schemes=schemes, samples=s.int("samples", cls.samples, minimum=1),
                   max_tries=s.int("max_tries", cls.max_tries, minimum=1))


DISTRIBUTED_KEYS = ("gpus", "timeout_s")


@dataclass(frozen=True)
class Distributed:
    """quantize.distributed: gpus > 1 quantizes under torchrun, one process per GPU; 1 is the one-process path."""
    gpus: int = 1
    timeout_s: float = 1800

    @classmethod
    def parse(cls, raw: object) -> Distributed:
        raw = raw or {}
        if not isinstance(raw, Mapping) or set(raw) - set(DISTRIBUTED_KEYS):
            raise PipelineError(f"quantize.distributed must be a mapping with keys {list(DISTRIBUTED_KEYS)}, "
                                f"got {raw!r}")
        out = cls(**raw)
        if not is_positive_int(out.gpus):
            raise PipelineError(f"quantize.distributed.gpus must be a positive integer, got {out.gpus!r}")
        if not is_positive_number(out.timeout_s):
            raise PipelineError(f"quantize.distributed.timeout_s must be a positive number of seconds, "
                                f"got {out.timeout_s!r}")
        return out


@dataclass(frozen=True)
class QuantizeParams:
    SECTION: ClassVar[str] = "quantize"
    enabled: tuple[str, ...]  # the variants `dvc repro` builds, in order
    calibration: Calibration
    distributed: Distributed
    variants: Mapping[str, Mapping]  # name -> its recipe as written (recipes.enabled_variant parses one)

    @classmethod
    def parse(cls, section: dict) -> QuantizeParams:
        s = Section(section, cls.SECTION)
        enabled = s.strs("enabled")
        if not enabled or len(set(enabled)) != len(enabled):
            raise PipelineError("quantize.enabled must be a non-empty list of distinct variant names")
        variants = s.mapping("variants")
        unknown = [n for n in enabled if n not in variants]
        if unknown:
            raise PipelineError(f"quantize.enabled names unknown variants {unknown}; known: {sorted(variants)}")
        return cls(enabled=enabled, calibration=Calibration.parse(s.section("calibration")),
                   distributed=Distributed.parse(s.value("distributed", None)), variants=variants)
