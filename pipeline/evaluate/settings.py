"""params.yaml `evaluate`, typed: fidelity to the target, lm-eval, the CPU acceptance estimate and vLLM's
offline measurement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.params.declare import knob, section

COST_RATIOS = ("weight_bytes", "measured")  # evaluate.acceptance.cost_ratio, or a number
ENABLED = (True, False, "auto")  # evaluate.vllm.enabled (and serve_bench.enabled)
Enabled = Literal[True, False, "auto"]
BACKENDS = ("auto", "transformers", "vllm")  # evaluate.backend (pipeline/evaluate/backend.py)
Backend = Literal["auto", "transformers", "vllm"]


@dataclass(frozen=True)
class LmEval:
    tasks: tuple[str, ...] = knob(("domain_heldout",), help="evals/ tasks and standard lm-eval tasks installed locally")
    limit: int | None = knob(64, help="documents per task; null: all", minimum=1)


@dataclass(frozen=True)
class Acceptance:
    """evaluate.acceptance: the CPU estimate of speculative acceptance at the serving temperature."""

    temperature: float = knob(0.0, required=True, help="serving temperature; 0: greedy acceptance")
    continuation_tokens: int = knob(96, required=True, help="at most, per continuation (it ends at EOS)", minimum=1)
    prompts: int = knob(24, required=True, help="prompts continued", minimum=1)
    max_k: int = knob(8, required=True, help="the largest k estimated", minimum=1)
    cost_ratio: Literal["weight_bytes", "measured"] | float = knob(
        "weight_bytes", help="the ideal bound only (weight_bytes, measured or a number): never decides what ships"
    )


@dataclass(frozen=True)
class VllmEval:
    """evaluate.vllm: the GPU path (skipped with a reason without CUDA or vLLM)."""

    enabled: Enabled = knob("auto", required=True, help="auto: where CUDA and vLLM are present")
    prompts: int = knob(64, required=True, help="prompts measured", minimum=1)
    max_tokens: int = knob(96, required=True, help="tokens per prompt", minimum=1)
    gpu_memory_utilization: float = knob(0.3, required=True, help="vLLM's share of the GPU's memory")
    throughput_batch_sizes: tuple[int, ...] = knob(
        (1, 32),
        help="offline tokens/s with and without the draft at these batch sizes; []: leave speed to serve_bench",
        minimum=1,
    )
    enforce_eager: bool = knob(False, help="true: no torch.compile / CUDA graphs (faster start)")


@dataclass(frozen=True)
class FunctionalCheck:
    """evaluate.functional: pass@1 on HumanEval-format tasks, each completion run in the sandbox
    (pipeline/evaluate/functional.py, sandbox.py). tasks None: off (nothing measured, the gate's check skipped)."""

    tasks: str | None = knob(None, help="a JSONL file of HumanEval-format tasks under evals/; null: off", min_length=1)
    limit: int | None = knob(None, help="the first N tasks; null: all", minimum=1)
    max_new_tokens: int = knob(
        384, help="per completion (it ends earlier at a control token such as EOS, or a stop sequence)", minimum=1
    )
    timeout_s: float = knob(10, help="wall clock per program (its process group killed past it)", exclusive_minimum=0)
    cpu_s: int = knob(5, help="CPU seconds per program", minimum=1)
    memory_mb: int = knob(1024, help="address space per program", minimum=64)


@section("evaluate")
@dataclass(frozen=True)
class EvaluateParams:
    """params.yaml `evaluate`: fidelity, lm-eval, the acceptance estimate, vLLM's measurement, pass@1."""

    heldout_limit: int = knob(64, required=True, help="held-out conversations scored per variant", minimum=1)
    greedy_tokens: int = knob(16, required=True, help="greedy tokens compared per prompt", minimum=1)
    greedy_prompts: int = knob(24, required=True, help="prompts whose greedy continuations are compared", minimum=0)
    lm_eval: LmEval = knob(LmEval(), required=True, help="lm-eval tasks")
    acceptance: Acceptance = knob(Acceptance(), required=True, help="the CPU acceptance estimate")
    vllm: VllmEval = knob(VllmEval(), required=True, help="vLLM's offline measurement (GPU)")
    functional: FunctionalCheck = knob(FunctionalCheck(), help="pass@1 of the target and each variant")
    backend: Backend = knob(
        "auto",
        help="fidelity and lm-eval engine: auto (vLLM where the variant spans GPUs), "
        "transformers or vllm (pipeline/evaluate/backend.py)",
    )
