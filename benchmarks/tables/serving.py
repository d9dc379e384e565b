"""benchmarks/gpu/SERVING.md: each config's served speed, the kernel and the speculation a build ships."""

from __future__ import annotations

from pipeline.release.decision import choose_kernel, speculation_for as decide
from render import Column as C, Facts, Spec, times
from tables import mixed, read, served as s

DEMO = (("demo-serve", ("gptq-w4a16",)),)
GPU_PROFILE = (("gpu-served", ("bf16", "fp8-dynamic")), ("gpu-served-3", ("bf16", "gptq-w4a16")))
SMOLLM2 = (
    ("smollm2-gpu-3", ("bf16",)),
    ("smollm2-gpu-4", ("gptq-w4a16",)),
    ("smollm2-gpu-6", ("fp8-dynamic",)),
    ("smollm2-gpu-5", ("fp8-static", "awq-w4a16")),
)
RUNS = (*(run for run, _ in (*DEMO, *GPU_PROFILE, *SMOLLM2)), "mixed8b")


def choices(*groups) -> list[dict]:
    """Per served variant: the kernel the stage picks and the speculation a build ships, by the pipeline's rules
    with the run's own params (serving.target_concurrency, serve_bench.kernel_tie, speculation.min_gain)."""
    rows = []
    for run, variants in groups:
        p = read.params(run)
        target, gain = p["serving"]["target_concurrency"], float(p["serving"]["speculation"]["min_gain"])
        tie = p["serve_bench"].get("kernel_tie", 0.04)
        for variant in variants:
            rec = read.record(run, variant)
            d = decide(None, rec, target, gain)
            kernels = {k: c.at(target).output_throughput for k, c in rec.kernels.items()}
            rows.append(
                {
                    "run": f"`{run}`",
                    "variant": f"`{variant}`",
                    "target": target,
                    "served_on": rec.kernel,
                    "kernels": ", ".join(f"{k} {t:.0f}" for k, t in kernels.items()),
                    "pick": choose_kernel(rec.kernels, target, tie) if kernels else None,
                    "ships": f"**{d.speculation.label}**",
                    "why": d.reason,
                }
            )
    return rows


def config_columns(conc: tuple[int, ...]) -> tuple[C, ...]:
    return (
        *s.CONFIG,
        *s.per_c(conc, "c={c} tok/s (x plain)", s.tok_x_plain),
        C("vLLM accepted/drafted", "accepted", "{:.3f}"),
    )


CHOICES = (
    C("run", "run"),
    C("variant", "variant"),
    C("target concurrency", "target"),
    C("plain tok/s there, per kernel", lambda r: r["kernels"] or None),
    C("kernel served on", "served_on"),
    C("kernel the stage picks", "pick"),
    C("the speculation rule picks", "ships"),
    C("why", "why"),
)

MIXED = (
    C("variant", lambda r: f"`{r['variant']}`"),
    C("decoder layers per scheme", "layout"),
    C("checkpoint GB", "bytes", lambda b: f"{b / 1e9:.2f}"),
    *(C(f"c={c} tok/s", f"c{c}", "{:,.0f}") for c in mixed.CONCURRENCY),
    *(C(f"c={c} x BF16", f"x{c}", times) for c in mixed.CONCURRENCY),
    *(C(f"c={c} x INT4", f"u{c}", times) for c in mixed.CONCURRENCY),
    C("kernel in vLLM's log", "kernel"),
)
BLOCKS = {
    "mixed-conditions": Facts(mixed.conditions, ("condition", "value")),
    "mixed": Spec(mixed.rows, MIXED),
    "mixed-size": Facts(mixed.size_facts),
    "mixed-greedy": Spec(
        mixed.greedy,
        (
            C("pair", "pair"),
            C("token agreement", "token_agreement", "{:.4f}"),
            C("identical prompts", lambda r: f"{r['identical_prompts']} of {r['prompts']}"),
            C("mean first difference (token)", "mean_first_difference"),
        ),
    ),
    "demo": Spec(lambda: s.many(*DEMO), (*config_columns((1, 8, 16, 32)), C("kernels in vLLM's log", "kernels"))),
    "gpu-profile": Spec(
        lambda: s.many(*GPU_PROFILE),
        (*config_columns((1, 8, 32)), *s.per_c((1, 32), "c={c} x BF16 plain", lambda r, c: r.vs_base.get(c), times)),
    ),
    "smollm2": Spec(lambda: s.many(*SMOLLM2), config_columns((1, 8, 32))),
    "choices": Spec(lambda: choices(*DEMO, *GPU_PROFILE, *SMOLLM2), CHOICES),
}
