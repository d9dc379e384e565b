"""The speculative methods' params, typed: `draft` (which methods, n-gram's window, the EAGLE-3 head),
`draft_training` (distillation and the draft model's fine-tune) and `draft_quantize`. draft.source is the models
stage's (pipeline/models/settings.py), read here too so that `draft` parses as one section."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.sections import Section
from pipeline.drafts.methods import DRAFT_MODEL, EAGLE3, GENERATORS, NGRAM, check_eagle3, check_ngram, parse_methods
from pipeline.models.settings import DraftSource, draft_source


@dataclass(frozen=True)
class Ngram:
    """draft.ngram: vLLM's prompt lookup window."""
    prompt_lookup_min: int
    prompt_lookup_max: int


@dataclass(frozen=True)
class Eagle3Params:
    """draft.eagle3: the head's shape and its training."""
    num_layers: int
    aux_layers: str | tuple[int, int, int]  # auto: vLLM's (2, L/2, L-3)
    draft_vocab_size: int | None  # None: the target's vocabulary
    ttt_steps: int
    train_steps: int
    batch_size: int
    learning_rate: float
    seed: int = 0

    @classmethod
    def parse(cls, raw: Mapping) -> Eagle3Params:
        """draft.eagle3, range-checked (methods.check_eagle3)."""
        check_eagle3(raw)
        aux = raw["aux_layers"]
        s = Section(raw, "draft.eagle3")
        return cls(num_layers=raw["num_layers"], aux_layers=aux if aux == "auto" else tuple(aux),
                   draft_vocab_size=raw.get("draft_vocab_size"), ttt_steps=raw["ttt_steps"],
                   train_steps=raw["train_steps"], batch_size=raw["batch_size"], learning_rate=raw["learning_rate"],
                   seed=s.int("seed", 0))


@dataclass(frozen=True)
class DraftParams:
    """params.yaml `draft`: the draft model's source and the speculative methods compared. ngram and eagle3 hold
    their settings when draft.method lists them, None otherwise (their keys are then not read)."""
    SECTION: ClassVar[str] = "draft"
    source: DraftSource
    method: tuple[str, ...]  # in the order given, no repeats
    ngram: Ngram | None = None
    eagle3: Eagle3Params | None = None

    @classmethod
    def parse(cls, section: dict) -> DraftParams:
        s = Section(section, cls.SECTION)
        methods = tuple(parse_methods(s.value("method", DRAFT_MODEL)))
        ngram = eagle3 = None
        if NGRAM in methods:
            raw = s.section("ngram").raw
            check_ngram(raw)
            ngram = Ngram(raw["prompt_lookup_min"], raw["prompt_lookup_max"])
        if EAGLE3 in methods:
            eagle3 = Eagle3Params.parse(s.section("eagle3").raw)
        return cls(source=draft_source(s), method=methods, ngram=ngram, eagle3=eagle3)

    def requests(self, method: str) -> bool:
        return method in self.method


@dataclass(frozen=True)
class DistillEngine:
    """draft_training.vllm: the vLLM engine that writes the target's answers (generator vllm)."""
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True


@dataclass(frozen=True)
class Lora:
    """draft_training.lora: fine-tune adapters merged back into the draft instead of every weight."""
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0


@dataclass(frozen=True)
class DraftTrainingParams:
    """params.yaml `draft_training`: distillation of the target's answers, then the draft model's fine-tune."""
    SECTION: ClassVar[str] = "draft_training"
    seed: int
    max_new_tokens: int
    generation_batch_size: int
    sampled_responses: int
    temperature: float
    include_original_responses: bool
    epochs: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    logging_steps: int
    eval_prompts: int
    save_steps: int
    resume: bool
    generator: str = "auto"  # auto | transformers | vllm
    vllm: DistillEngine = DistillEngine()
    lora: Lora = Lora()

    @classmethod
    def parse(cls, section: dict) -> DraftTrainingParams:
        s = Section(section, cls.SECTION)
        v, lo = s.section("vllm"), s.section("lora")
        return cls(
            seed=s.int("seed"), max_new_tokens=s.int("max_new_tokens", minimum=1),
            generation_batch_size=s.int("generation_batch_size", minimum=1),
            sampled_responses=s.int("sampled_responses", minimum=0), temperature=s.number("temperature"),
            include_original_responses=s.bool("include_original_responses"), epochs=s.number("epochs"),
            batch_size=s.int("batch_size", minimum=1), learning_rate=s.number("learning_rate"),
            warmup_steps=s.int("warmup_steps", minimum=0), logging_steps=s.int("logging_steps", minimum=1),
            eval_prompts=s.int("eval_prompts", minimum=0), save_steps=s.int("save_steps", minimum=1),
            resume=s.bool("resume"), generator=s.choice("generator", GENERATORS, "auto"),
            vllm=DistillEngine(v.number("gpu_memory_utilization", 0.5), v.bool("enforce_eager", True)),
            lora=Lora(lo.bool("enabled", False), lo.int("r", 16, minimum=1), lo.number("alpha", 32),
                      lo.number("dropout", 0.0)))


@dataclass(frozen=True)
class DraftQuantizeParams:
    """params.yaml `draft_quantize`: the served draft as trained (None) or quantized with a quantize.variants recipe."""
    SECTION: ClassVar[str] = "draft_quantize"
    variant: str | None = None

    @classmethod
    def parse(cls, section: dict) -> DraftQuantizeParams:
        return cls(Section(section, cls.SECTION).str_or_none("variant"))
