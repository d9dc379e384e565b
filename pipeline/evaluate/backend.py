"""evaluate.backend: where evaluate scores fidelity (perplexity, KL, top-1, greedy match) and runs lm-eval.

- transformers: fidelity exactly, both models in transformers on one device; lm-eval's `hf` model on CPU.
- vllm: both through vLLM at the evaluate engines' tensor parallelism (pipeline/evaluate/vllm_fidelity.py, lm-eval's
  `vllm` model); an error, before any work, where vLLM can't run.
- auto (the default): transformers wherever vLLM can't run (the CPU build, unchanged); on a GPU host with vLLM,
  fidelity through vLLM where the variant's evaluate engines shard over several GPUs (its serving TP > 1, or its
  weights do not fit evaluate.vllm's share of one GPU: pipeline/serving/parallelism.py evaluate_tp), exact in
  transformers otherwise; lm-eval through vLLM as before.
A GPU host with fewer GPUs than the engines need is an error wherever vLLM would run (lmeval.backend's reason).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.evaluate.settings import BACKENDS


@dataclass(frozen=True)
class Backends:
    """The resolved choice: fidelity's (transformers | vllm) and lm-eval's model type (hf | vllm), and why."""

    fidelity: str
    lm_eval: str
    reason: str


def choose(setting: str, engine_tp: int, unavailable: str | None, gpus: int) -> Backends:
    """The backends for evaluate.backend `setting`, engines sharded over engine_tp GPUs, on a host where vLLM can't
    run for `unavailable` (None: it can) with `gpus` GPUs."""
    if setting not in BACKENDS:
        raise PipelineError(f"evaluate.backend must be one of {', '.join(BACKENDS)}, got {setting!r}")
    if setting == "transformers":
        return Backends("transformers", "hf", "evaluate.backend is transformers")
    if unavailable is not None:
        if setting == "vllm":
            raise PipelineError(f"evaluate.backend is vllm but vLLM cannot run here: {unavailable}")
        return Backends("transformers", "hf", f"auto: {unavailable}")
    from pipeline.evaluate.vllm_spec import too_few_gpus

    too_few = too_few_gpus(engine_tp, gpus)
    if too_few:
        raise PipelineError(f"evaluate.lm_eval runs through vLLM sharded as served, but {too_few}")
    if setting == "vllm":
        return Backends("vllm", "vllm", "evaluate.backend is vllm")
    if engine_tp > 1:
        return Backends("vllm", "vllm", f"auto: the variant's evaluate engines shard over {engine_tp} GPUs")
    return Backends("transformers", "vllm", "auto: one GPU holds the variant (fidelity exact in transformers)")


def resolve(setting: str, engine_tp: int) -> Backends:
    """choose() on this host: vLLM's availability and the GPUs torch sees (CUDA_VISIBLE_DEVICES limits them)."""
    from pipeline.evaluate.vllm_spec import unavailable_reason

    unavailable = unavailable_reason()
    if unavailable is not None:
        return choose(setting, engine_tp, unavailable, 0)
    import torch

    return choose(setting, engine_tp, None, torch.cuda.device_count())
