"""Distillation through vLLM's offline engine: the `distill` stage's generator where CUDA and vLLM are present."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.multigpu import multicast_off
from pipeline.drafts.distill import Generate
from pipeline.drafts.methods import GENERATORS
from pipeline.drafts.settings import DistillEngine
from pipeline.evaluate.vllm_spec import spawn_engine_if_cuda_initialized, unavailable_reason


def engine_kwargs(model_dir: Path, max_model_len: int, engine: DistillEngine, tensor_parallel_size: int = 1) -> dict:
    """vllm.LLM's arguments for distillation: draft_training.vllm's settings, sharded as the target is served
    (a target that needs several GPUs to serve needs them to answer here too)."""
    return {
        "model": str(Path(model_dir).resolve()),
        "max_model_len": max_model_len,
        "seed": 0,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "enforce_eager": engine.enforce_eager,
        "tensor_parallel_size": tensor_parallel_size,
    }


def vllm_generate(
    model_dir: Path,
    eos_token_id: int | None,
    max_new_tokens: int,
    max_model_len: int,
    engine: DistillEngine,
    tensor_parallel_size: int = 1,
) -> Generate:
    """Generation through vLLM's offline engine (one engine for every call); as served, so a 1B
    target answers thousands of prompts in seconds rather than transformers' minutes."""
    from vllm import LLM, SamplingParams

    spawn_engine_if_cuda_initialized()
    multicast_off(tensor_parallel_size)
    llm = LLM(**engine_kwargs(model_dir, max_model_len, engine, tensor_parallel_size))

    def generate(prompts: list[list[int]], temperature: float, seed: int) -> list[list[int]]:
        params = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_new_tokens, seed=seed)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        responses = []
        for o in outs:
            ids = list(o.outputs[0].token_ids)
            # A response that stopped at EOS ends with it, as generate_batched's do (the draft learns to stop).
            if o.outputs[0].finish_reason == "stop" and eos_token_id is not None and ids[-1:] != [eos_token_id]:
                ids.append(eos_token_id)
            responses.append(ids)
        return responses

    return generate


def resolve_generator(setting, tensor_parallel_size: int = 1) -> str:
    """`auto`: vLLM where CUDA, vLLM and tensor_parallel_size GPUs are present, else transformers; `vllm` without
    them is an error."""
    if setting not in GENERATORS:
        raise PipelineError(f"draft_training.generator must be one of {list(GENERATORS)}, got {setting!r}")
    if setting == "transformers":
        return setting
    reason = unavailable_reason(tensor_parallel_size)
    if reason and setting == "vllm":
        raise PipelineError(f"draft_training.generator is vllm but vLLM cannot run here: {reason}")
    return "transformers" if reason else "vllm"
