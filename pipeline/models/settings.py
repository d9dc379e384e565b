"""The model sources' params, typed: `target`, `demo` and `draft.source` (the draft section's other keys are the
speculative methods', pipeline/drafts/settings.py). Light on purpose: the `models` and `sources` stages read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from pipeline.core.errors import PipelineError
from pipeline.params.declare import Knob, knob, parse_key, section

SOURCES = "demo, smollm2, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, a model directory, a .gguf file"
DRAFT_SOURCE_SCHEMA = {  # draft.source: a source as target.source, or the target's first layers
    "description": f"{SOURCES}, a Hub repo id, or {{from: target, layers: N}}",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["from", "layers"],
            "properties": {"from": {"enum": ["target"]}, "layers": {"type": "integer", "minimum": 1}},
        },
    ],
}


@dataclass(frozen=True)
class LayerDraft:
    """draft.source {from: target, layers: N}: the draft is the target's first N decoder layers with its
    embeddings, final norm and head (the same tokenizer by construction), then fine-tuned as any draft."""

    layers: int


DraftSource = str | LayerDraft  # a model source as target.source takes it, or the target's own first layers


def source(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise PipelineError(f"{where} must be a string, got {value!r}")
    if not value.strip():
        raise PipelineError(
            f"{where} must be a model source (demo, a directory, a .gguf file or a Hub repo id), got {value!r}"
        )
    return value


def draft_source(section: Mapping) -> DraftSource:
    """draft.source: a model source, or {from: target, layers: N}."""
    if "source" not in section:
        raise PipelineError("draft.source is missing")
    raw = section["source"]
    if not isinstance(raw, Mapping):
        return source(raw, "draft.source")
    if set(raw) != {"from", "layers"} or raw["from"] != "target":
        raise PipelineError(f"draft.source must be a model source or {{from: target, layers: N}}, got {raw!r}")
    return LayerDraft(parse_key(raw["layers"], int, Knob("", minimum=1), "draft.source.layers"))


@dataclass(frozen=True)
class DraftSourceParams:
    """draft.source alone: the part of the `draft` section the sources and models stages read (its other keys are
    the speculative methods', pipeline/drafts/settings.py, which those stages do not depend on)."""

    SECTION: ClassVar[str] = "draft"
    source: DraftSource

    @classmethod
    def parse(cls, section: Mapping) -> DraftSourceParams:
        if not isinstance(section, Mapping):
            raise PipelineError(f"draft must be a mapping, got {section!r}")
        return cls(draft_source(section))


@section("target")
@dataclass(frozen=True)
class TargetParams:
    """params.yaml `target`: where the model to prepare comes from."""

    source: str = knob(
        "demo", required=True, min_length=1, help=f"{SOURCES}, or a Hub repo id (org/name)", parse=source
    )
    revision: str | None = knob(None, help="a Hub source's branch, tag or commit")
    # `models` stops when the target's perplexity on the answers of a few rows of its own traffic is above this: a
    # tokenizer, prompt format or weights that do not fit the text, found before any stage spends time on them
    max_perplexity: float = knob(
        1000,
        exclusive_minimum=1,
        help="models stops when the target's perplexity on a few rows of its own traffic is above this",
    )


@dataclass(frozen=True)
class DemoModel:
    """demo.target / demo.draft: a Llama's shape and its brief pretraining."""

    hidden_size: int = knob(384, required=True, help="hidden width", minimum=1)
    intermediate_size: int = knob(1024, required=True, help="MLP width", minimum=1)
    num_hidden_layers: int = knob(6, required=True, help="decoder layers", minimum=1)
    num_attention_heads: int = knob(6, required=True, help="attention heads", minimum=1)
    num_key_value_heads: int = knob(2, required=True, help="KV heads", minimum=1)
    train_steps: int = knob(150, required=True, help="pretraining steps", minimum=1)
    lr: float = knob(0.002, required=True, help="pretraining learning rate")
    domain_share: float = knob(0.0, help="the draft's share of domain text in its mostly generic pretraining")


DEMO_DRAFT = DemoModel(128, 384, 2, 2, 1, 100, 0.003, 0.05)


@section("demo")
@dataclass(frozen=True)
class DemoParams:
    """params.yaml `demo`: the embedded target and draft pair, built and pretrained on CPU."""

    seed: int = knob(0, required=True, help="the demo's seed")
    vocab_size: int = knob(4096, required=True, help="at most: the templated corpus saturates below it", minimum=1)
    domain_rows: int = knob(3000, required=True, help="synthetic support conversations for pretraining")
    seq_len: int = knob(128, required=True, help="pretraining sequence length", minimum=1)
    batch_size: int = knob(16, required=True, help="pretraining batch", minimum=1)
    max_position_embeddings: int = knob(2048, required=True, help="the models' context", minimum=1)
    target: DemoModel = knob(DemoModel(), required=True, help="the target's shape and pretraining")
    draft: DemoModel = knob(DEMO_DRAFT, required=True, help="the draft's shape and pretraining")
    general_corpus: Literal["synthetic", "python-docs"] = knob(
        "synthetic", help="synthetic: templated sentences | python-docs: installed Python docstrings"
    )
    general_sentences: int | None = knob(3000, help="generic prose, most of what the draft sees (synthetic)")
    general_chars: int | None = knob(8000000, help="python-docs: characters of docstrings read")
