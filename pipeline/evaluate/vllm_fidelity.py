"""Fidelity to the unquantized target through vLLM, each model sharded at the evaluate engines' tensor parallelism:
for a model that needs TP (or does not fit one GPU in transformers) this is the only way to score it as served.

Each model's engine loads once and reads prompt logprobs (SamplingParams(prompt_logprobs=k, max_tokens=1)): the top
k and the actual token at every position of prompt + response; pipeline/evaluate/topk_fidelity.py turns them into
the fidelity dict quality.fidelity computes exactly on CPU (the KL as its documented lower bound). Greedy match: the
baseline engine writes its greedy paths, then both engines read prompt + path and the variant matches where its
argmax equals the baseline's at every position, the same condition as quality.greedy_match.
Runs only where CUDA and vLLM are present (pipeline/evaluate/backend.py decides); nothing here is simulated.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.evaluate import topk_fidelity
from pipeline.evaluate.topk_fidelity import Position, TopLogprobs

# vLLM's default max_logprobs; the KL's tail bucket holds what the top 20 of both engines leave out (docs:
# gates-and-speculation.md#fidelity-through-vllm-at-the-variants-tensor-parallelism)
TOP_K = 20


@dataclass(frozen=True)
class Engine:
    """vllm.LLM's settings for one scoring engine."""

    tensor_parallel_size: int
    gpu_memory_utilization: float
    enforce_eager: bool = False
    dtype: str = "auto"  # the checkpoint's (the tests ask float32, to compare with transformers on CPU)

    def llm(self, model_dir: Path, max_model_len: int):
        from vllm import LLM

        from pipeline.core.multigpu import multicast_off
        from pipeline.evaluate.vllm_spec import spawn_engine_if_cuda_initialized

        spawn_engine_if_cuda_initialized()
        multicast_off(self.tensor_parallel_size)
        # one sequence at a time needs little KV cache; no prefix cache: prompt logprobs are recomputed per request
        return LLM(
            model=str(model_dir),
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=max_model_len,
            max_logprobs=TOP_K,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=False,
            seed=0,
            dtype=self.dtype,
        )


def _release(llm) -> None:
    import torch

    del llm
    gc.collect()
    torch.cuda.empty_cache()


def prompt_logprobs(llm, sequences: list[list[int]]) -> list[list[dict[int, float]]]:
    """Per sequence, per position j >= 1: {token: logprob} of the top TOP_K and the token at j, given tokens < j
    (position 0 has none: an empty map)."""
    from vllm import SamplingParams

    sampling = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOP_K, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], sampling, use_tqdm=False)
    return [[{t: lp.logprob for t, lp in (pos or {}).items()} for pos in o.prompt_logprobs] for o in outs]


def greedy_paths(llm, prompts: list[list[int]], n_tokens: int, eos_token_id: int | None) -> list[list[int]]:
    """The greedy tokens up to EOS (kept, as generation.greedy_continuations keeps its stop token) or n_tokens."""
    from vllm import SamplingParams

    sampling = SamplingParams(
        max_tokens=n_tokens,
        temperature=0.0,
        detokenize=False,
        stop_token_ids=[] if eos_token_id is None else [eos_token_id],
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def responses(
    maps: list[list[dict[int, float]]], examples: list[tuple[list[int], list[int]]]
) -> list[list[TopLogprobs]]:
    """The maps at the positions that predict each example's response tokens (as quality.response_logprobs)."""
    return [seq[len(prompt) : len(prompt) + len(response)] for seq, (prompt, response) in zip(maps, examples)]


@dataclass(frozen=True)
class Request:
    """What one fidelity run scores: held-out (prompt, response) pairs, and the prompts of the greedy-match check."""

    examples: list[tuple[list[int], list[int]]]
    greedy_prompts: list[list[int]]
    greedy_tokens: int
    eos_token_id: int | None

    def check(self) -> None:
        """quality.fidelity's and greedy_match's errors, before any engine starts."""
        if not any(response for _, response in self.examples):
            raise PipelineError("no held-out response tokens to score (evaluate.heldout_limit, data.fractions.heldout)")
        if not self.greedy_prompts:
            raise PipelineError("no held-out prompts for the greedy-match check (evaluate.greedy_prompts)")

    def max_model_len(self) -> int:
        longest = max(
            [len(p) + len(r) for p, r in self.examples] + [len(p) + self.greedy_tokens for p in self.greedy_prompts]
        )
        return longest + 1  # the one token each scoring request generates


@dataclass(frozen=True)
class Scored:
    """One model's prompt-logprob maps over the request's sequences: the held-out examples, then each greedy prompt
    followed by the baseline's greedy path (`paths`)."""

    maps: list[list[dict[int, float]]]
    paths: list[list[int]]


def score(model_dir: Path, request: Request, engine: Engine, paths: list[list[int]] | None = None) -> Scored:
    """model_dir's maps in one engine. The baseline (paths None) first writes its greedy paths; a variant reads the
    baseline's."""
    request.check()
    llm = engine.llm(model_dir, request.max_model_len())
    try:
        if paths is None:
            paths = greedy_paths(llm, request.greedy_prompts, request.greedy_tokens, request.eos_token_id)
        sequences = [p + r for p, r in request.examples] + [p + path for p, path in zip(request.greedy_prompts, paths)]
        return Scored(prompt_logprobs(llm, sequences), paths)
    finally:
        _release(llm)


def compare(request: Request, base: Scored, own: Scored) -> tuple[dict, dict]:
    """(quality.fidelity's dict plus greedy_match, the KL estimator's record) from the two models' maps."""
    examples, n = request.examples, len(request.examples)
    walked = list(zip(request.greedy_prompts, base.paths))
    positions = [
        Position(token, b, v)
        for (_, response), bs, vs in zip(
            examples, responses(base.maps[:n], examples), responses(own.maps[:n], examples)
        )
        for token, b, v in zip(response, bs, vs)
    ]
    out, estimator = topk_fidelity.fidelity(positions, TOP_K)
    matched = [
        topk_fidelity.argmax_path_matches(b, v)
        for b, v in zip(responses(base.maps[n:], walked), responses(own.maps[n:], walked))
    ]
    out["greedy_match"] = sum(matched) / len(matched)
    return out, estimator


def fidelity(baseline_dir: Path, variant_dir: Path, request: Request, engine: Engine) -> tuple[dict, dict]:
    """(quality.fidelity's dict plus greedy_match, the KL estimator's record), both models through vLLM at the
    engine's tensor parallelism, one after the other."""
    base = score(baseline_dir, request, engine)
    out, estimator = compare(request, base, score(variant_dir, request, engine, base.paths))
    return out, {**estimator, "backend": "vllm", "tensor_parallel_size": engine.tensor_parallel_size}
