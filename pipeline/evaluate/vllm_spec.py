"""GPU path: real vLLM speculative decoding with the draft, measured from vLLM's own metrics.

Only runs where CUDA and vLLM are importable; elsewhere `unavailable_reason()` says why and the
pipeline records the skip. Nothing here is ever simulated.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.core.multigpu import multicast_off


@dataclass
class VllmMeasurement:
    """What the evaluate stage records from real vLLM speculative decoding, or why it was skipped."""

    skipped: str | None = None
    num_speculative_tokens: int | None = None
    accepted_per_draft_token: float | None = None  # vLLM's num_accepted_tokens / num_draft_tokens
    accepted_per_position: list[float] | None = None
    mean_accepted_tokens: float | None = None  # per draft (per step)
    speculative_output_matches_baseline: bool | None = None
    tokens_per_s: dict[str, float] = field(default_factory=dict)  # "baseline_bs1", "speculative_bs32", ...
    speculative_speedup: dict[str, float] = field(default_factory=dict)  # "bs1": speculative / baseline tokens/s
    counters: dict[str, Any] = field(default_factory=dict)  # vllm:spec_decode_* as read from LLM.get_metrics()

    @classmethod
    def from_measure(cls, raw: dict) -> "VllmMeasurement":
        """The typed view of measure()'s flat result (which GPU benchmark scripts also write as is)."""
        speed = {
            k.removesuffix("_tokens_per_s").replace("_tokens_per_s_", "_"): v
            for k, v in raw.items()
            if "_tokens_per_s_bs" in k
        }
        return cls(
            num_speculative_tokens=raw.get("num_speculative_tokens"),
            accepted_per_draft_token=raw.get("accepted_per_draft_token"),
            accepted_per_position=raw.get("accepted_per_position"),
            mean_accepted_tokens=raw.get("mean_accepted_tokens"),
            speculative_output_matches_baseline=raw.get("spec_output_matches_baseline"),
            tokens_per_s=speed,
            speculative_speedup={
                k.removeprefix("measured_speedup_"): v for k, v in raw.items() if k.startswith("measured_speedup_")
            },
            counters=raw.get("vllm_metrics") or {},
        )


def too_few_gpus(tensor_parallel_size: int, gpus: int, what: str = "serving.tensor_parallel_size") -> str | None:
    """Why an engine sharded over tensor_parallel_size GPUs can't start on a host with `gpus` (None: it can)."""
    if tensor_parallel_size <= gpus:
        return None
    return f"{what} {tensor_parallel_size} needs more GPUs than the {gpus} here"


# Device files without which torch sees no GPU: NVIDIA's control device, ROCm's kernel driver, WSL's GPU bridge.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def unavailable_reason(tensor_parallel_size: int = 1) -> str | None:
    """Why vLLM can't run here at serving's tensor parallelism (None: it can). GPUs are counted as torch sees
    them, so CUDA_VISIBLE_DEVICES limits them as it limits vLLM."""
    # Without any GPU device file torch sees no device: the answer, without importing torch (seconds on the CPU
    # demo, where serve_bench's five stages do nothing else).
    if not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return "no CUDA device"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    return too_few_gpus(tensor_parallel_size, torch.cuda.device_count())


def skip_reason(enabled, param: str, tensor_parallel_size: int = 1) -> str | None:
    """Why a GPU path (param: auto | true | false) does not run here, or None when it runs; `true`
    without CUDA and vLLM (or with fewer GPUs than tensor_parallel_size) is an error rather than a silent skip."""
    if enabled not in (True, False, "auto"):
        raise PipelineError(f"{param} must be auto, true or false, got {enabled!r}")
    reason = f"disabled in params ({param})" if enabled is False else unavailable_reason(tensor_parallel_size)
    if reason and enabled is True:
        raise PipelineError(f"{param} is true but the GPU path cannot run: {reason}")
    return reason


def spawn_engine_if_cuda_initialized() -> None:
    """vLLM forks its engine process by default; after this process has run transformers on the GPU
    (the evaluate stage, the GPU tests) the forked child cannot initialize CUDA. On the H100 that
    happened even with torch.cuda.is_initialized() false, so always spawn unless told otherwise."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def _spec_metrics(llm) -> dict:
    """Counters from LLM.get_metrics(): drafts, draft tokens, accepted tokens, accepted per position."""
    out = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:spec_decode"):
            continue
        key = m.name.removeprefix("vllm:spec_decode_")
        out[key] = list(m.values) if hasattr(m, "values") else getattr(m, "value", None)
    return out


def _tokens_per_s(llm, prompts: list, sampling, batch_size: int, rounds: int) -> float:
    """Decode throughput at a fixed batch size, after one warm-up batch (compilation, caches)."""
    batches = [[prompts[(r * batch_size + i) % len(prompts)] for i in range(batch_size)] for r in range(rounds + 1)]
    llm.generate(batches[0], sampling, use_tqdm=False)
    t0, tokens = time.perf_counter(), 0
    for batch in batches[1:]:
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, sampling, use_tqdm=False))
    return tokens / (time.perf_counter() - t0)


def acceptance_from_metrics(m: dict) -> dict:
    """vLLM's counters -> accepted_per_draft_token (accepted / drafted tokens) and P(position j accepted)."""
    out = {}
    drafted, accepted, drafts = m.get("num_draft_tokens"), m.get("num_accepted_tokens"), m.get("num_drafts")
    if drafted:
        out["accepted_per_draft_token"] = accepted / drafted
    if drafts and m.get("num_accepted_tokens_per_pos"):
        out["accepted_per_position"] = [a / drafts for a in m["num_accepted_tokens_per_pos"]]
        out["mean_accepted_tokens"] = accepted / drafts
    return out


def engine_configs(
    model_dir: str,
    draft_dir: str | None,
    k: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    tensor_parallel_size: int = 1,
    draft_tensor_parallel_size: int | None = None,
    **llm_kwargs,
) -> list[tuple[str, dict]]:
    """(label, vllm.LLM keyword arguments) of the baseline engine and, with a draft, the speculative one: both
    sharded as served (serving.tensor_parallel_size; the draft at serving.speculation.draft_tensor_parallel_size,
    None leaving vLLM's default), so the acceptance measured is the acceptance served."""
    base = dict(
        model=model_dir,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        disable_log_stats=False,
        seed=0,
        **llm_kwargs,
    )
    configs = [("baseline", base)]
    if draft_dir:
        spec = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": k}
        if draft_tensor_parallel_size is not None:
            spec["draft_tensor_parallel_size"] = draft_tensor_parallel_size
        configs.append(("speculative", {**base, "speculative_config": spec}))
    return configs


def _measure_engine(
    llm, label: str, spec: bool, work: tuple, batch_sizes: tuple[int, ...], result: dict, keep: bool
) -> None:
    """One engine's pass over every prompt (acceptance for the draft, tokens kept when `keep`), then its tokens/s.
    `work`: the prompts and the sampling params."""
    prompts, sampling = work
    outs = llm.generate(prompts, sampling, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    if spec:
        result["vllm_metrics"] = _spec_metrics(llm)
        result.update(acceptance_from_metrics(result["vllm_metrics"]))
        result["spec_output_matches_baseline"] = tokens == result.get("tokens")
    elif keep:
        result["tokens"] = tokens
    for bs in batch_sizes:
        result[f"{label}_tokens_per_s_bs{bs}"] = _tokens_per_s(llm, prompts, sampling, bs, rounds=8 if bs == 1 else 2)


def _add_speedups(result: dict, batch_sizes: tuple[int, ...]) -> None:
    """The draft's speedup over the baseline at each batch size both were timed at."""
    for bs in batch_sizes:
        if f"speculative_tokens_per_s_bs{bs}" in result:
            result[f"measured_speedup_bs{bs}"] = (
                result[f"speculative_tokens_per_s_bs{bs}"] / result[f"baseline_tokens_per_s_bs{bs}"]
            )


def measure(
    model_dir: str,
    draft_dir: str | None,
    prompt_token_ids: list[list[int]],
    k: int,
    max_tokens: int,
    temperature: float,
    gpu_memory_utilization: float,
    max_model_len: int,
    batch_sizes: tuple[int, ...] = (1, 32),
    return_tokens: bool = False,
    tensor_parallel_size: int = 1,
    draft_tensor_parallel_size: int | None = None,
    **llm_kwargs,
) -> dict:
    """tokens/s with and without the draft at each batch size, plus vLLM's acceptance counters
    from one pass over every prompt (read before the throughput runs re-use prompts)."""
    import gc

    import torch
    from vllm import LLM, SamplingParams

    spawn_engine_if_cuda_initialized()
    multicast_off(max(tensor_parallel_size, draft_tensor_parallel_size or 1))
    # Stop at EOS as a server does: forced on past it (ignore_eos) the target writes off-distribution
    # text the draft can't predict, and acceptance halved on the H100 run (benchmarks/gpu/history/vllm-0.25.md).
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=0)
    prompts = [{"prompt_token_ids": p} for p in prompt_token_ids]
    result: dict = {
        "num_speculative_tokens": k,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "prompts": len(prompts),
    }
    for label, kw in engine_configs(
        model_dir,
        draft_dir,
        k,
        gpu_memory_utilization,
        max_model_len,
        tensor_parallel_size,
        draft_tensor_parallel_size,
        **llm_kwargs,
    ):
        t0 = time.perf_counter()
        llm = LLM(**kw)
        result[f"{label}_load_s"] = time.perf_counter() - t0
        keep = return_tokens or bool(draft_dir)
        _measure_engine(llm, label, bool(kw.get("speculative_config")), (prompts, sampling), batch_sizes, result, keep)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    _add_speedups(result, batch_sizes)
    if not return_tokens:
        result.pop("tokens", None)
    return result
