"""The model sources' params, typed: `target`, `demo` and `draft.source` (the draft section's other keys are the
speculative methods', pipeline/drafts/settings.py). Light on purpose: the `models` and `sources` stages read it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.errors import PipelineError
from pipeline.core.sections import Section


@dataclass(frozen=True)
class LayerDraft:
    """draft.source {from: target, layers: N}: the draft is the target's first N decoder layers with its
    embeddings, final norm and head (the same tokenizer by construction), then fine-tuned as any draft."""
    layers: int


DraftSource = str | LayerDraft  # a model source as target.source takes it, or the target's own first layers


def source(section: Section, name: str = "source") -> str:
    value = section.str(name)
    if not value.strip():
        raise section.fail(name, "a model source (demo, a directory, a .gguf file or a Hub repo id)", value)
    return value


def draft_source(section: Section) -> DraftSource:
    """draft.source: a model source, or {from: target, layers: N}."""
    raw = section.value("source")
    if not isinstance(raw, dict):
        return source(section)
    cut = section.section("source")
    if set(raw) != {"from", "layers"} or raw["from"] != "target":
        raise PipelineError(f"{cut.where} must be a model source or {{from: target, layers: N}}, got {raw!r}")
    return LayerDraft(cut.int("layers", minimum=1))


@dataclass(frozen=True)
class DraftSourceParams:
    """draft.source alone: the part of the `draft` section the sources and models stages read (its other keys are
    the speculative methods', pipeline/drafts/settings.py, which those stages do not depend on)."""
    SECTION: ClassVar[str] = "draft"
    source: DraftSource

    @classmethod
    def parse(cls, section: dict) -> DraftSourceParams:
        return cls(draft_source(Section(section, cls.SECTION)))


@dataclass(frozen=True)
class TargetParams:
    """params.yaml `target`: where the model to prepare comes from."""
    SECTION: ClassVar[str] = "target"
    source: str
    revision: str | None = None  # a Hub source's branch, tag or commit
    # `models` stops when the target's perplexity on the answers of a few rows of its own traffic is above this: a
    # tokenizer, prompt format or weights that do not fit the text, found before any stage spends time on them
    max_perplexity: float = 1000.0

    @classmethod
    def parse(cls, section: dict) -> TargetParams:
        s = Section(section, cls.SECTION)
        bound = s.number("max_perplexity", 1000.0)
        if not bound > 1:
            raise s.fail("max_perplexity", "a number above 1 (a perplexity)", bound)
        return cls(source(s), s.str_or_none("revision"), float(bound))


@dataclass(frozen=True)
class DemoModel:
    """demo.target / demo.draft: a Llama's shape and its brief pretraining."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    train_steps: int
    lr: float
    domain_share: float = 0.0  # the draft's: the share of domain text in its mostly generic pretraining

    @classmethod
    def parse(cls, s: Section) -> DemoModel:
        return cls(*(s.int(k, minimum=1) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                   "num_attention_heads", "num_key_value_heads", "train_steps")),
                   lr=s.number("lr"), domain_share=s.number("domain_share", 0.0))


@dataclass(frozen=True)
class DemoParams:
    """params.yaml `demo`: the embedded target and draft pair, built and pretrained on CPU."""
    SECTION: ClassVar[str] = "demo"
    seed: int
    vocab_size: int
    domain_rows: int
    seq_len: int
    batch_size: int
    max_position_embeddings: int
    target: DemoModel
    draft: DemoModel
    general_corpus: str = "synthetic"  # synthetic | python-docs (pipeline/models/demo/corpus.py GENERAL_CORPORA)
    general_sentences: int | None = None  # synthetic: sentences generated
    general_chars: int | None = None  # python-docs: characters of docstrings read

    @classmethod
    def parse(cls, section: dict) -> DemoParams:
        s = Section(section, cls.SECTION)
        return cls(seed=s.int("seed"), vocab_size=s.int("vocab_size", minimum=1), domain_rows=s.int("domain_rows"),
                   seq_len=s.int("seq_len", minimum=1), batch_size=s.int("batch_size", minimum=1),
                   max_position_embeddings=s.int("max_position_embeddings", minimum=1),
                   target=DemoModel.parse(s.section("target")), draft=DemoModel.parse(s.section("draft")),
                   general_corpus=s.str("general_corpus", "synthetic"),
                   general_sentences=s.int_or_none("general_sentences"), general_chars=s.int_or_none("general_chars"))
