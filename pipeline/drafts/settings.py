"""The speculative methods' params, typed: `draft` (which methods, n-gram's window, the EAGLE-3 head),
`draft_training` (distillation and the draft model's fine-tune) and `draft_quantize`. draft.source is the models
stage's (pipeline/models/settings.py), read here too so that `draft` parses as one section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pipeline.drafts.methods import DRAFT_MODEL, EAGLE3, NGRAM, NGRAM_MAX, check_eagle3, check_ngram, parse_methods
from pipeline.models.settings import DRAFT_SOURCE_SCHEMA, DraftSource, draft_source
from pipeline.params.declare import keys_schema, knob, parse_declared, section


@dataclass(frozen=True)
class Ngram:
    """draft.ngram: vLLM's prompt lookup window (methods.check_ngram: min <= max)."""

    prompt_lookup_min: int = knob(
        2, required=True, help="vLLM's prompt lookup window: shortest match", minimum=1, maximum=NGRAM_MAX
    )
    prompt_lookup_max: int = knob(
        5, required=True, help="vLLM's prompt lookup window: longest match", minimum=1, maximum=NGRAM_MAX
    )


@dataclass(frozen=True)
class Eagle3Params:
    """draft.eagle3: the head's shape and its training."""

    num_layers: int = knob(1, required=True, help="decoder layers in the head (EAGLE-3: 1)", minimum=1)
    aux_layers: Literal["auto"] | tuple[int, ...] = knob(
        "auto",
        required=True,
        help="three distinct target layers whose inputs the head reads; auto: vLLM's (2, L/2, L-3)",
    )
    draft_vocab_size: int | None = knob(
        None, required=True, help="null: the target's vocabulary; a number: the most frequent answer tokens", minimum=2
    )
    ttt_steps: int = knob(3, required=True, help="training-time-test steps", minimum=1)
    train_steps: int = knob(150, required=True, help="the head's training steps", minimum=1)
    batch_size: int = knob(8, required=True, help="conversations per step, packed into one sequence", minimum=1)
    learning_rate: float = knob(0.003, required=True, help="the head's learning rate", exclusive_minimum=0)
    seed: int = knob(0, help="the head's seed")

    @classmethod
    def parse(cls, raw: Mapping) -> Eagle3Params:
        """draft.eagle3, range-checked (methods.check_eagle3)."""
        check_eagle3(raw)
        aux = raw["aux_layers"]
        return parse_declared(cls, {**raw, "aux_layers": aux if aux == "auto" else tuple(aux)}, "draft.eagle3")


@section("draft")
@dataclass(frozen=True)
class DraftParams:
    """params.yaml `draft`: the draft model's source and the speculative methods compared. ngram and eagle3 hold
    their settings when draft.method lists them, None otherwise (their keys are then not read)."""

    source: DraftSource = knob(
        "demo",
        required=True,
        help="a target source sharing the target's tokenizer, or {from: target, layers: N}",
        schema=DRAFT_SOURCE_SCHEMA,
    )
    method: tuple[str, ...] = knob(
        ("draft_model", "eagle3", "ngram"),
        schema={},
        help="methods built and compared, one name or a list (draft_model, eagle3, ngram)",
    )
    # checked by methods.check_ngram / check_eagle3, and only when draft.method lists the method
    ngram: Ngram | None = knob(Ngram(), help="read when draft.method lists ngram", schema=keys_schema(Ngram))
    eagle3: Eagle3Params | None = knob(
        Eagle3Params(), help="read when draft.method lists eagle3", schema=keys_schema(Eagle3Params)
    )

    @classmethod
    def parse(cls, section: Mapping) -> DraftParams:
        """ngram and eagle3 are read (and checked) only when draft.method lists them: None otherwise."""
        methods = tuple(parse_methods(section.get("method", DRAFT_MODEL)))
        ngram = eagle3 = None
        if NGRAM in methods:
            raw = section.get("ngram") or {}
            check_ngram(raw)
            ngram = parse_declared(Ngram, raw, "draft.ngram")
        if EAGLE3 in methods:
            eagle3 = Eagle3Params.parse(section.get("eagle3") or {})
        return cls(source=draft_source(section), method=methods, ngram=ngram, eagle3=eagle3)

    def requests(self, method: str) -> bool:
        return method in self.method


@dataclass(frozen=True)
class DistillEngine:
    """draft_training.vllm: the vLLM engine that writes the target's answers (generator vllm)."""

    gpu_memory_utilization: float = knob(
        0.5, help="the distillation engine's share of the GPU's memory", exclusive_minimum=0, maximum=1
    )
    enforce_eager: bool = knob(True, help="true: no torch.compile / CUDA graphs")


@dataclass(frozen=True)
class Lora:
    """draft_training.lora: fine-tune adapters merged back into the draft instead of every weight."""

    enabled: bool = knob(False, help="fine-tune LoRA adapters instead of every weight")
    r: int = knob(16, help="the adapters' rank", minimum=1)
    alpha: float = knob(32, help="LoRA alpha")
    dropout: float = knob(0.0, help="LoRA dropout")


@section("draft_training")
@dataclass(frozen=True)
class DraftTrainingParams:
    """params.yaml `draft_training`: distillation of the target's answers, then the draft model's fine-tune."""

    seed: int = knob(0, required=True, help="distillation and fine-tune seed")
    max_new_tokens: int = knob(
        96, required=True, help="the target's greedy answer to each draft-train prompt", minimum=1
    )
    generation_batch_size: int = knob(32, required=True, help="transformers generator's batch", minimum=1)
    sampled_responses: int = knob(0, required=True, help="extra answers sampled at the serving temperature", minimum=0)
    temperature: float = knob(0.7, required=True, help="sampling temperature of the extra answers")
    include_original_responses: bool = knob(True, required=True, help="train on the traffic's own answers too")
    epochs: float = knob(3, required=True, help="fine-tune epochs")
    batch_size: int = knob(16, required=True, help="fine-tune batch", minimum=1)
    learning_rate: float = knob(0.002, required=True, help="fine-tune learning rate")
    warmup_steps: int = knob(5, required=True, help="learning-rate warmup", minimum=0)
    logging_steps: int = knob(5, required=True, help="train and eval loss logged every this many steps", minimum=1)
    eval_prompts: int = knob(
        32, required=True, help="held-out prompts whose target answers pick the shipped draft", minimum=0
    )
    save_steps: int = knob(50, required=True, help="checkpoint interval (a multiple of logging_steps)", minimum=1)
    resume: bool = knob(True, required=True, help="continue from the last checkpoint")
    generator: Literal["auto", "transformers", "vllm"] = knob("auto", help="auto: vLLM where CUDA and vLLM are present")
    vllm: DistillEngine = knob(DistillEngine(), help="the distillation engine (generator vllm)")
    lora: Lora = knob(Lora(), help="LoRA fine-tune")


@section("draft_quantize")
@dataclass(frozen=True)
class DraftQuantizeParams:
    """params.yaml `draft_quantize`: the served draft as trained (None) or quantized with a quantize.variants recipe."""

    variant: str | None = knob(None, help="a quantize.variants name to serve an INT4/FP8 draft; null: as trained")
