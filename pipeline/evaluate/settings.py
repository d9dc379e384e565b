"""params.yaml `evaluate`, typed: fidelity to the target, lm-eval, the CPU acceptance estimate and vLLM's
offline measurement."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.sections import Section
from pipeline.core.values import is_number

COST_RATIOS = ("weight_bytes", "measured")  # evaluate.acceptance.cost_ratio, or a number
ENABLED = (True, False, "auto")  # evaluate.vllm.enabled (and serve_bench.enabled)
BACKENDS = ("auto", "transformers", "vllm")  # evaluate.backend (pipeline/evaluate/backend.py)


@dataclass(frozen=True)
class LmEval:
    tasks: tuple[str, ...]  # evals/ tasks and standard lm-eval tasks installed locally
    limit: int | None = None  # documents per task; None: all


@dataclass(frozen=True)
class Acceptance:
    """evaluate.acceptance: the CPU estimate of speculative acceptance at the serving temperature."""
    temperature: float
    continuation_tokens: int
    prompts: int
    max_k: int
    cost_ratio: str | float = "weight_bytes"  # weight_bytes | measured | a number


@dataclass(frozen=True)
class VllmEval:
    """evaluate.vllm: the GPU path (skipped with a reason without CUDA or vLLM)."""
    enabled: bool | str
    prompts: int
    max_tokens: int
    gpu_memory_utilization: float
    throughput_batch_sizes: tuple[int, ...] = ()
    enforce_eager: bool = False


@dataclass(frozen=True)
class FunctionalCheck:
    """evaluate.functional: pass@1 on HumanEval-format tasks, each completion run in the sandbox
    (pipeline/evaluate/functional.py, sandbox.py). tasks None: off (nothing measured, the gate's check skipped)."""
    tasks: str | None = None  # a JSONL file of task_id, prompt, canonical_solution, test, entry_point
    limit: int | None = None  # the first N tasks; None: all
    max_new_tokens: int = 384  # per completion (it ends earlier at EOS or a HumanEval stop sequence)
    timeout_s: float = 10.0  # wall clock per program, the sandbox's process group killed past it
    cpu_s: int = 5  # CPU seconds per program
    memory_mb: int = 1024  # address space per program


@dataclass(frozen=True)
class EvaluateParams:
    SECTION: ClassVar[str] = "evaluate"
    heldout_limit: int
    greedy_tokens: int
    greedy_prompts: int
    lm_eval: LmEval
    acceptance: Acceptance
    vllm: VllmEval
    functional: FunctionalCheck = FunctionalCheck()
    backend: str = "auto"  # fidelity and lm-eval: auto | transformers | vllm (pipeline/evaluate/backend.py)

    @classmethod
    def parse(cls, section: dict) -> EvaluateParams:
        s = Section(section, cls.SECTION)
        lm, acc, vl = s.section("lm_eval"), s.section("acceptance"), s.section("vllm")
        ratio = acc.value("cost_ratio", "weight_bytes")
        if ratio not in COST_RATIOS and not is_number(ratio):
            raise acc.fail("cost_ratio", "weight_bytes, measured or a number", ratio)
        return cls(
            heldout_limit=s.int("heldout_limit", minimum=1), greedy_tokens=s.int("greedy_tokens", minimum=1),
            greedy_prompts=s.int("greedy_prompts", minimum=0),
            lm_eval=LmEval(lm.strs("tasks", []), lm.int_or_none("limit", minimum=1)),
            acceptance=Acceptance(acc.number("temperature"), acc.int("continuation_tokens", minimum=1),
                                  acc.int("prompts", minimum=1), acc.int("max_k", minimum=1), ratio),
            vllm=VllmEval(vl.choice("enabled", ENABLED), vl.int("prompts", minimum=1), vl.int("max_tokens", minimum=1),
                          vl.number("gpu_memory_utilization"), vl.ints("throughput_batch_sizes", []),
                          vl.bool("enforce_eager", False)),
            functional=parse_functional(s.section("functional", {})),
            backend=s.choice("backend", BACKENDS, "auto"))


def parse_functional(f: Section) -> FunctionalCheck:
    d = FunctionalCheck()
    timeout = f.number("timeout_s", d.timeout_s)
    if timeout <= 0:
        raise f.fail("timeout_s", "a number of seconds above 0", timeout)
    return FunctionalCheck(f.str_or_none("tasks"), f.int_or_none("limit", minimum=1),
                           f.int("max_new_tokens", d.max_new_tokens, minimum=1), timeout,
                           f.int("cpu_s", d.cpu_s, minimum=1), f.int("memory_mb", d.memory_mb, minimum=64))
