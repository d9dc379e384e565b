"""Speculative methods: which ones a build compares (`draft.method`) and the speculative-config each ships.

- draft_model: a separate small model with the target's tokenizer (stages distill -> draft_finetune ->
  draft_quantize), served from ./draft.
- eagle3: an EAGLE-3 head over the target's hidden states (stage eagle3, speculators' model and loss),
  served from ./eagle3.
- ngram: prompt lookup; nothing to train, the settings are the method.

Light on purpose (no torch): params validation imports it before any stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.values import is_int, is_positive_int, is_positive_number

DRAFT_MODEL, EAGLE3, NGRAM = "draft_model", "eagle3", "ngram"
METHODS = (DRAFT_MODEL, EAGLE3, NGRAM)
# Where each trained method sits in a bundle and in serve_bench's bundle-shaped directory.
BUNDLE_DIRS = {DRAFT_MODEL: "draft", EAGLE3: "eagle3"}
# Where the stages leave each trained method's served weights (draft_quantize, eagle3), for bundles to copy.
ARTIFACT_DIRS = {DRAFT_MODEL: paths.DRAFT_MODEL, EAGLE3: paths.EAGLE3_MODEL}
NGRAM_MAX = 16  # longer lookups than this only slow the CPU-side search; vLLM's default max is 5
# draft_training.generator: what answers the draft-train prompts in the distill stage (distill_vllm.resolve_generator)
GENERATORS = ("auto", "transformers", "vllm")


# vLLM 0.26's dynamic speculative decoding: (first batch size, last batch size, k) inclusive ranges, the first
# starting at 1, k 0 meaning no drafting at those batch sizes (vllm/v1/spec_decode/dynamic/utils.py).
KSchedule = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Speculation:
    """What a serving config speculates with: a method at k draft tokens (k 0: none), or with a k per batch-size
    range (schedule; k is then its largest, vLLM's num_speculative_tokens)."""

    method: str | None
    k: int
    schedule: KSchedule | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.method and self.k)

    @property
    def label(self) -> str:
        """How cards and summary lines name it: `eagle3 k=4`, `eagle3 k=4 at batch 1-2, none from 3`."""
        if not self.enabled:
            return "no speculation"
        if not self.schedule:
            return f"{self.method} k={self.k}"
        last = len(self.schedule) - 1  # vLLM carries the last range's k to every larger batch
        return f"{self.method} " + ", ".join(
            (f"k={k}" if k else "none") + (f" from batch {lo}" if i == last else f" at batch {lo}-{hi}")
            for i, (lo, hi, k) in enumerate(self.schedule)
        )


def check_schedule(schedule: KSchedule, where: str) -> None:
    """The rules vLLM 0.26 enforces on num_speculative_tokens_per_batch_size, checked where it is rendered so a
    bundle never carries one its server refuses at start."""
    if not schedule:
        raise PipelineError(f"{where}: an empty k schedule")
    previous = 0
    for lo, hi, k in schedule:
        if not (is_int(lo) and is_int(hi) and is_int(k)) or lo <= previous or hi < lo or k < 0:
            raise PipelineError(
                f"{where}: k schedule {list(map(list, schedule))} must be sorted, non-overlapping "
                "inclusive [first batch, last batch, k >= 0] ranges"
            )
        previous = hi
    if schedule[0][0] != 1:
        raise PipelineError(f"{where}: a k schedule's first range must start at batch size 1")
    if max(k for _, _, k in schedule) <= 0:
        raise PipelineError(f"{where}: a k schedule that never drafts is plain decoding")


NONE = Speculation(None, 0)


def requested(p: dict) -> list[str]:
    """draft.method as a list: one name or a list of them, in the order given, no repeats."""
    return parse_methods(p["draft"].get("method", DRAFT_MODEL))


def parse_methods(raw) -> list[str]:
    """draft.method's value (one name or a list of them) as a list, in the order given; one line when it is wrong."""
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names:
        raise PipelineError(
            f"draft.method must be one of {', '.join(METHODS)} or a non-empty list of them, got {raw!r}"
        )
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise PipelineError(f"draft.method: unknown method {unknown[0]!r} (choose from {', '.join(METHODS)})")
    if len(set(names)) != len(names):
        raise PipelineError(f"draft.method lists a method twice: {names}")
    return names


def not_requested(method: str) -> str:
    """Why a method's stage made nothing: the one wording every skipped record uses."""
    return f"{method} is not in draft.method"


def check_ngram(cfg: dict) -> None:
    """draft.ngram: vLLM's prompt_lookup_min/max, range-checked before any stage runs."""
    lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
    for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if not is_int(v) or not 1 <= v <= NGRAM_MAX:
            raise PipelineError(f"draft.ngram.{name} must be an integer in 1..{NGRAM_MAX}, got {v!r}")
    if lo > hi:
        raise PipelineError(f"draft.ngram.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")


def check_eagle3(cfg: dict) -> None:
    """draft.eagle3's shape and training knobs; the head-vs-target checks need the target (drafts/eagle3.py)."""
    for name in ("num_layers", "ttt_steps", "train_steps", "batch_size"):
        v = cfg.get(name)
        if not is_positive_int(v):
            raise PipelineError(f"draft.eagle3.{name} must be a positive integer, got {v!r}")
    lr = cfg.get("learning_rate")
    if not is_positive_number(lr):
        raise PipelineError(f"draft.eagle3.learning_rate must be a positive number, got {lr!r}")
    vocab = cfg.get("draft_vocab_size")
    if vocab is not None and not (is_int(vocab) and vocab >= 2):
        raise PipelineError(
            f"draft.eagle3.draft_vocab_size must be null (the target's vocabulary) or an integer >= 2, got {vocab!r}"
        )
    layers = cfg.get("aux_layers")
    if layers != "auto" and (
        not isinstance(layers, list)
        or len(layers) != 3
        or not all(is_int(i) and i >= 0 for i in layers)
        or len(set(layers)) != 3
    ):
        raise PipelineError(f"draft.eagle3.aux_layers must be auto or three distinct target layer ids, got {layers!r}")


def speculative_config(
    spec: Speculation, ngram: dict | None = None, draft_tensor_parallel_size: int | None = None
) -> dict | None:
    """vLLM 0.26's speculative_config for a bundle laid out as ./model, ./draft, ./eagle3.
    draft_tensor_parallel_size: the draft model's (None: vLLM's default, the target's); other methods have none."""
    if not spec.enabled:
        return None
    config: dict = {"method": spec.method, "num_speculative_tokens": spec.k}
    if spec.schedule:
        check_schedule(spec.schedule, "speculative_config")
        if spec.k != max(k for _, _, k in spec.schedule):
            raise PipelineError(f"speculative_config: k {spec.k} is not the schedule's largest k")
        # Dynamic speculation switches vLLM 0.26 to PIECEWISE CUDA graphs (config/vllm.py,
        # _maybe_override_dynamic_sd_cudagraph_mode): serve_bench measures the schedule itself for that reason.
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in spec.schedule]
    if spec.method in BUNDLE_DIRS:
        config["model"] = f"./{BUNDLE_DIRS[spec.method]}"
    if spec.method == NGRAM:
        ngram = ngram or {}
        config |= {"prompt_lookup_min": ngram["prompt_lookup_min"], "prompt_lookup_max": ngram["prompt_lookup_max"]}
    if spec.method == DRAFT_MODEL and draft_tensor_parallel_size is not None:
        config["draft_tensor_parallel_size"] = draft_tensor_parallel_size
    return config
