"""benchmarks/gpu/CAPACITY.md: users per GPU at the SLO, bundles as shipped and each served config."""

from __future__ import annotations

from render import Column as C, Facts, Spec, Text
from tables import read, served as s

RUNS = (
    "shipped",
    "demo-serve-bf16",
    "gpu-served",
    "gpu-served-3",
    "smollm2-gpu-3",
    "smollm2-gpu-4",
    "smollm2-gpu-5",
    "smollm2-gpu-6",
)
STAGE = (("demo-serve-bf16", ("bf16",)),)
GPU_PROFILE = (("gpu-served", ("bf16", "fp8-dynamic")), ("gpu-served-3", ("bf16", "gptq-w4a16")))
SMOLLM2 = (
    ("smollm2-gpu-3", ("bf16",)),
    ("smollm2-gpu-4", ("gptq-w4a16",)),
    ("smollm2-gpu-6", ("fp8-dynamic",)),
    ("smollm2-gpu-5", ("fp8-static", "awq-w4a16")),
)


def shipped_rows() -> list[dict]:
    """serve_shipped.py's result per bundle with its c=1 and c=16 levels and the first load over its capacity."""
    levels, results = read.shipped_levels(), [r for r in read.shipped()["results"] if "error" not in r]
    base = next(r["capacity"]["users_per_gpu"] for r in results if r["variant"] == read.BASELINE)
    return [
        {
            **r,
            "c1": levels[(v, "c1")],
            "c16": levels[(v, "c16")],
            "vs_base": cap["users_per_gpu"] / base,
            "users": s.capacity_cell(cap["users_per_gpu"], cap["status"], cap["ceiling"]),
            "miss": levels.get((v, f"capacity-c{cap['ceiling']:g}")),
        }
        for r in results
        for v, cap in [(r["variant"], r["capacity"])]
    ]


def slo():
    return read.record("demo-serve-bf16", "bf16").configs[read.PLAIN].capacity.slo


def shipped_conditions():
    doc = read.shipped()
    return [
        ("GPU", doc["gpu"]),
        ("vLLM", doc["vllm"]),
        ("concurrency", ", ".join(map(str, doc["concurrency"]))),
        ("SLO", slo().label()),
    ]


SHIPPED = Spec(
    shipped_rows,
    (
        C("bundle", "variant"),
        C("kernel (vLLM's log)", lambda r: ", ".join(r["kernels_used"]) or "default (unquantized)"),
        C("start (s)", "startup_s", "{:.0f}"),
        C("c=1 tok/s", lambda r: s.thousands(r["c1"].output_throughput)),
        C("c=16 tok/s", lambda r: s.thousands(r["c16"].output_throughput)),
        C("c=16 p99 TTFT / ITL (ms)", lambda r: f"{r['c16'].ttft_ms['p99']:.0f} / {r['c16'].itl_ms['p99']:.1f}"),
        C("users per GPU at the SLO", "users"),
        C("output tok/s per GPU there", lambda r: s.thousands(r["capacity"]["output_tokens_per_s_per_gpu"])),
        C("users vs bf16", "vs_base", "x{:.2f}"),
    ),
)
MISSES = (C("config", "config"), C("first load over capacity (users)", "users", "{:g}"), C("what it missed", "missed"))

BLOCKS = {
    "shipped-conditions": Facts(shipped_conditions, ("condition", "value")),
    "shipped": SHIPPED,
    "shipped-misses": Spec(
        lambda: [
            {"config": r["variant"], "users": r["capacity"]["ceiling"], "missed": ", ".join(slo().misses(r["miss"]))}
            for r in shipped_rows()
            if r["miss"]
        ],
        MISSES,
    ),
    "stage": Spec(
        lambda: s.many(*STAGE),
        (
            *s.CONFIG[2:],
            *s.per_c((1, 8, 32), "c={c} tok/s (x plain)", s.tok_x_plain),
            C("vLLM accepted/drafted", "accepted", "{:.3f}"),
            *s.CAPACITY,
        ),
    ),
    "stage-misses": Spec(lambda: s.misses("demo-serve-bf16"), MISSES),
    "gate": lambda: Text("```\n" + (read.RAW / "demo-serve-bf16/gate.txt").read_text().strip() + "\n```"),
    "gpu-profile": Spec(lambda: s.many(*GPU_PROFILE), (*s.CONFIG, *s.CAPACITY)),
    "smollm2": Spec(lambda: s.many(*SMOLLM2), (*s.CONFIG, *s.CAPACITY)),
}
