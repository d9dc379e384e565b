"""The release-gate checks: which metric each threshold reads, how it compares, and what it decides.

Kept apart from the gate logic so that the params check (pipeline/params/check.py, run by the `sources` stage and the
CLI) reads the thresholds without depending on the gate's and the serving benchmark's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.core.values import is_number

QUALITY, SPECULATION, SERVING = "quality", "speculation", "serving"


@dataclass(frozen=True)
class Check:
    """threshold key -> the metric(s) it reads, first present wins, and the comparison."""

    metrics: tuple[str, ...]
    op: str  # "<=", ">=" or ">"
    required: bool  # a gate can't pass on missing quality numbers; GPU-only metrics are skipped
    group: str = QUALITY  # speculation checks decide whether the draft ships, not whether the variant does
    bounds: tuple[float, float] | None = None  # [low, high) its threshold can take (None: any finite number)


CHECKS = {
    "max_perplexity_increase_pct": Check(("perplexity_increase_pct",), "<=", True),
    "max_kl_divergence": Check(("kl_divergence",), "<=", True),
    "min_top1_agreement": Check(("top1_agreement",), ">=", True),
    # vLLM's accepted/drafted token ratio: as served under load, else from the evaluate stage's vLLM run,
    # else the CPU estimate of it.
    "min_accepted_per_draft_token": Check(
        ("served_accepted_per_draft_token", "vllm_accepted_per_draft_token", "accepted_per_draft_token"),
        ">=",
        True,
        SPECULATION,
    ),
    # The share of first drafted tokens accepted lost against the baseline variant (serving.baseline_variant), same
    # method: the baseline's minus this variant's, both evaluate's estimate at k = 1, in absolute points (0.1: 0.8 ->
    # 0.7). A quantized verifier that rejects the draft trained against BF16 much more often than BF16 does.
    "max_acceptance_drop_vs_bf16": Check(("acceptance_drop_vs_bf16",), "<=", False, SPECULATION, (0.0, 1.0)),
    "min_vllm_speculative_speedup": Check(
        ("served_speculative_speedup", "vllm_speculative_speedup"), ">", False, SPECULATION
    ),
    # The config that ships, measured by the serving benchmark at serving.target_concurrency.
    "max_p99_itl_ms": Check(("p99_itl_ms",), "<=", False, SERVING),
    "max_p99_ttft_ms": Check(("p99_ttft_ms",), "<=", False, SERVING),
    "max_failed_requests": Check(("failed_requests",), "<=", False, SERVING),
    # Output tokens/s at concurrency 1 over the baseline variant's plain decoding, same run.
    "min_speedup_vs_bf16": Check(("speedup_vs_bf16",), ">=", False, SERVING),
    # Users per GPU at serving.slo (serve_bench's capacity search) over the baseline variant's plain decoding.
    "min_capacity_vs_bf16": Check(("capacity_vs_bf16",), ">=", False, SERVING),
    # Absolute quality: the checks above compare each variant with its own target, so a broken target passes
    # them all; these catch it. Perplexity of the held-out responses (not relative to anything).
    "max_heldout_perplexity": Check(("perplexity",), "<=", False),
    # Does it still write code that works: pass@1 of the unquantized target minus the variant's on
    # evaluate.functional.tasks (completions run in pipeline/evaluate/sandbox.py); skipped, with why, where unset.
    "max_pass_at_1_drop": Check(("pass_at_1_drop",), "<=", False),
}
# Absolute lm-eval thresholds, one per task score: min_lm_eval_<task>_<metric> / max_lm_eval_<task>_<metric>
# read metrics' lm_eval_<task>_<metric> (e.g. min_lm_eval_domain_heldout_acc). A score that is missing fails.
LM_EVAL_OPS = {"min_lm_eval_": ">=", "max_lm_eval_": "<="}


def check_for(name: str) -> Check:
    """The check a threshold key names: a fixed one, or an lm-eval score bound."""
    if name in CHECKS:
        return CHECKS[name]
    for prefix, op in LM_EVAL_OPS.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            bound = prefix.removesuffix("lm_eval_")  # "min_" / "max_": the metric is the key without it
            return Check((name.removeprefix(bound),), op, True)
    raise PipelineError(f"unknown gate threshold {name!r}")


def lm_eval_task_of(name: str, tasks: list[str]) -> str | None:
    """The task an lm-eval threshold names (the longest task name it starts with), None if none."""
    rest = next((name[len(p) :] for p in LM_EVAL_OPS if name.startswith(p)), "")  # the matched prefix, not its length
    matches = [t for t in tasks if rest.startswith(f"{t}_")]
    return max(matches, key=len) if matches else None


def _is_known(name: str) -> bool:
    try:
        check_for(name)
    except PipelineError:
        return False
    return True


def check_thresholds(thresholds: dict, where: str) -> None:
    unknown = {k for k in thresholds if not _is_known(k)}  # check_for: the one place a key's meaning is decided
    if unknown:
        raise PipelineError(
            f"{where}: unknown gate thresholds {sorted(unknown)}; known: {sorted(CHECKS)} and "
            "min_lm_eval_<task>_<metric> / max_lm_eval_<task>_<metric>"
        )
    bad = {k: v for k, v in thresholds.items() if not is_number(v) or math.isnan(v)}
    if bad:
        name = next(iter(bad))
        raise PipelineError(
            f"{where}.{name} is {bad[name]!r}: gate thresholds must be numbers"
            + (f" (and {[k for k in bad if k != name]})" if len(bad) > 1 else "")
        )
    # .inf (or -.inf) passes every value: a gate written so that it can never fail is a deleted gate
    endless = sorted(k for k, v in thresholds.items() if math.isinf(v))
    if endless:
        raise PipelineError(
            f"{where}: {endless[0]} is {thresholds[endless[0]]}: a gate threshold must be finite "
            "(delete the key to drop an optional check; required ones can't be dropped)"
        )
    for name, value in thresholds.items():
        bounds = check_for(name).bounds
        # [low, high): a bound at the top of what is measured could never fail, and a gate that cannot fail is none
        if bounds is not None and not bounds[0] <= value < bounds[1]:
            raise PipelineError(f"{where}.{name} is {value}: must be at least {bounds[0]:g} and below {bounds[1]:g}")
