"""benchmarks/gpu/SCALE.md: a model of Llama-3-70B's shape (random weights) per variant and tensor parallel size on a
4x H100 host (benchmarks/gpu/scale_serve.py, raw/scale-70b*/ and raw/scale-host/scale/): per GPU against BF16 at its
own GPU count in the same run; one configuration beside others against alone; a TP-2 bundle's greedy outputs against
TP 1 (raw/tp-greedy/)."""

from __future__ import annotations

import json
import re

from render import Column as C, Facts, Spec
from tables import read, repro8b, tpeval

# each served run's plan (benchmarks/gpu/plans/) and the folder under the run that holds scale_serve.py's output
SERVED = {
    "scale-70b": ("scale-70b.json", "out"),
    "scale-70b-alternatives": ("scale-70b-alternatives.json", "out"),
    "scale-host": ("scale-70b-fp8-tp4.json", "scale"),  # scale_host.sh's step fp8-tp4, alone on the host
}
RUNS = (*SERVED, "tp-greedy", "tpeval", "repro8b")
RUN = read.RAW / "scale-70b"  # the conditions (every served run shares them: scale_serve.py's constants)
TOKENIZER = {  # what `vllm bench serve` drew its random prompt tokens from (scale_serve.py make's TOKENIZER)
    "scale-70b": "the chatml tokenizer of tests/tiny_chatml.py",
    "scale-70b-alternatives": "the chatml tokenizer of tests/tiny_chatml.py",
    "scale-host": "SmolLM2-135M-Instruct's (`.gpu/tok8b`)",
}
BASELINE = "bf16-tp4"  # in every served run, so ratios stay within one run
BESIDE, ALONE = [f"w4a16-tp1-g{i}" for i in range(4)], "w4a16-tp1-alone"
CONCURRENCY = (1, 16, 32, 64)
WEIGHTS_GIB = r"Actual usage is ([0-9.]+) GiB for weight"  # vLLM 0.26's gpu_worker line, per GPU
KV_TOKENS = r"GPU KV cache size: ([0-9,]+) tokens"


def out_dir(run: str, name: str):
    return read.RAW / run / SERVED[run][1] / name


def level(run: str, name: str, c: int) -> dict | None:
    path = out_dir(run, name) / f"c{c}.json"
    return json.loads(path.read_text()) if path.exists() else None


def users_at_slo(run: str, name: str, slo: dict) -> str | None:
    """The largest measured concurrency meeting the SLO and the smallest missing it: a bracket, not a search."""
    levels = {c: lvl for c in CONCURRENCY if (lvl := level(run, name, c))}
    met = [
        c
        for c, v in levels.items()
        if not v.get("failed") and v["p99_ttft_ms"] <= slo["p99_ttft_ms"] and v["p99_itl_ms"] <= slo["p99_itl_ms"]
    ]
    lo = max(met, default=None)
    hi = min((c for c in levels if c not in met and (lo is None or c > lo)), default=None)
    return None if not levels else f"{lo}" + " (>= measured max)" if hi is None else f"{lo or 0} to {hi - 1}"


def server_log(run: str, name: str, pattern: str) -> str | None:
    log = out_dir(run, name) / "server.brief.log"
    m = re.search(pattern, log.read_text()) if log.exists() else None
    return m[1] if m else None


def configs() -> list[dict]:
    """Each planned config of each served run with its levels, the configs that served beside it, its GPU count."""
    slo = read.project_params()["serving"]["slo"]
    rows = []
    for run, (plan_file, _) in SERVED.items():
        plan = json.loads((read.ROOT / "benchmarks/gpu/plans" / plan_file).read_text())
        for config in (c for wave in plan for c in wave):
            name, meta = config["name"], out_dir(run, config["name"]) / "config.json"
            rows.append(
                {
                    **config,
                    "run": run,
                    "gpus": len(config["gpus"]),
                    "levels": {c: level(run, name, c) for c in CONCURRENCY},
                    "beside": ", ".join(json.loads(meta.read_text())["beside"]) if meta.exists() else "",
                    "users": users_at_slo(run, name, slo),
                    "weights": server_log(run, name, WEIGHTS_GIB),
                    "kv": server_log(run, name, KV_TOKENS),
                }
            )
    return rows


def per_gpu() -> list[dict]:
    """Per GPU against the same run's BF16 at TP 4 (its GPU count), at the levels both reached; a run without BF16
    (scale-host's FP8 at TP 4, alone) has its own levels and no ratio. The alternatives run's four W4A16 copies that
    ran beside each other are shown by the beside/alone table instead."""
    rows, out = configs(), []
    for run in SERVED:
        base = next((r for r in rows if r["run"] == run and r["name"] == BASELINE), None)
        for r in (r for r in rows if r["run"] == run and r["name"] not in BESIDE[1:]):
            for c in CONCURRENCY:
                lvl, ref = r["levels"][c], base and base["levels"][c]
                if lvl and (ref or base is None):
                    per = lvl["output_throughput"] / r["gpus"]
                    out.append(
                        {
                            "run": run,
                            "name": r["name"],
                            "c": c,
                            "per": per,
                            "vs": per / (ref["output_throughput"] / base["gpus"]) if ref else None,
                            "gpu_hours": r["gpus"] / (lvl["output_throughput"] * 3600) * 1e6,
                        }
                    )
    return out


def beside_alone() -> list[dict]:
    """W4A16 at TP 1 on each of the four GPUs at once against the same config alone on GPU 0, per concurrency: the
    check that lets serve_bench run a variant's configurations on disjoint GPU sets at the same time."""
    run = "scale-70b-alternatives"
    rows = []
    for c in CONCURRENCY:
        beside = [level(run, n, c)["output_throughput"] for n in BESIDE]
        alone = level(run, ALONE, c)["output_throughput"]
        rows.append(
            {
                "c": c,
                "beside": " / ".join(f"{x:,.1f}" for x in beside),
                "alone": alone,
                "worst": max(abs(x / alone - 1) for x in beside) * 100,
            }
        )
    return rows


def greedy() -> dict:
    return json.loads((read.RAW / "tp-greedy" / "tp_greedy.json").read_text())


def greedy_facts():
    g = greedy()
    return [
        (
            "bundle",
            f"the CPU demo's `{g['bundle']}` bundle built with `serving.tensor_parallel_size: 2` "
            "(`raw/tp-greedy/build-params.diff`), its serve.yaml as shipped (`bundle-serve.yaml`)",
        ),
        (
            "served",
            f"shipped (TP {g['tensor_parallel_size_shipped']}) on GPUs {g['configs']['shipped']['gpus']}, "
            f"the same serve.yaml at TP 1 on GPU {g['configs']['tp1']['gpus']}, at the same time",
        ),
        ("prompts", f"{g['prompts']} held-out prompts, {g['tokens']} greedy tokens each"),
        ("identical outputs", f"{g['identical']} of {g['prompts']}"),
    ]


def greedy_differences() -> list[dict]:
    return [r for r in greedy()["rows"] if not r["identical"]]


def unrun() -> list[dict]:
    """Each planned config's levels a run did not measure, and why; where another run measured that config at every
    level, the row says which."""
    rows, every = [], configs()
    for r in every:
        missing = [c for c in CONCURRENCY if not r["levels"][c]]
        log = out_dir(r["run"], r["name"]) / f"c{missing[0]}.log" if missing else None
        elsewhere = [o["run"] for o in every if o["name"] == r["name"] and all(o["levels"][c] for c in missing)]
        if missing:
            rows.append(
                {
                    "run": r["run"],
                    "name": r["name"],
                    "missing": ", ".join(map(str, missing)),
                    "why": (
                        "its `vllm bench serve` client hung before sending a request (empty log); "
                        "the device time ran out"
                        if log.exists() and not log.read_text().strip()
                        else "not reached: the device time ran out"
                    )
                    + "".join(f"; measured in `{o}` (served, above)" for o in elsewhere if o != r["run"]),
                }
            )
    return rows


def conditions():
    specs = {run: json.loads((read.RAW / run / "run.json").read_text()) for run in SERVED}
    slo = read.project_params()["serving"]["slo"]
    gpus = {f"{s['gpu']['count']}x {s['gpu']['name']}" for s in specs.values()}
    vllm = {s["software"]["vllm"] for s in specs.values()}
    every = "every run" if len(specs) > 2 else "both runs"
    return [
        ("GPU", " / ".join(sorted(gpus)) + f" in {every} (NVLink between every pair: each run's `topo.txt`)"),
        ("vLLM", " / ".join(sorted(vllm))),
        (
            "model",
            (
                "80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256 (Llama-3-70B's); "
                "random weights (`--load-format dummy`)"
            ),
        ),
        (
            "traffic",
            ("random prompts of 512 tokens, 128 output tokens each (`--ignore-eos`), 2 prompts per user, at least 4"),
        ),
        (
            "prompt tokens drawn from",
            "; ".join(f"`{run}`: {TOKENIZER[run]}" for run in SERVED),
        ),
        ("server", "max-model-len 4096, max-num-seqs 64, gpu-memory-utilization 0.9"),
        ("SLO (serving.slo)", f"p99 TTFT <= {slo['p99_ttft_ms']} ms, p99 ITL <= {slo['p99_itl_ms']} ms"),
    ]


def tok(r: dict, c: int) -> str | None:
    v = r["levels"][c]
    return f"{v['output_throughput']:,.0f} ({v['output_throughput'] / r['gpus']:,.0f})" if v else None


NAME = C("config", lambda r: f"`{r['name']}`")
RUN_COL = C("run", lambda r: f"`{r['run']}`")


def pct(x: float | None) -> str | None:
    return None if x is None else f"{x:+.2f}%"


STEP = C("step", lambda r: f"`{r['step']}`")
GPTQ = (
    RUN_COL,
    STEP,
    C("GPUs", "gpus"),
    C("sequential onloading", "offload"),
    C("finished", "done"),
    C("beside", "beside"),
    C("step s (process start to exit)", "step_s", "{:.1f}"),
    C("quantize call s (tp_eval.py)", "wall_s"),
    C("pipeline wall s", "pipeline_s"),
    C("oneshot s", "oneshot_s"),
    C("peak GPU MB (pipeline, per process)", "peak_gpu_mb", "{:,.0f}"),
    C("peak MiB per GPU used (nvidia-smi)", "smi_mib"),
    C("checkpoint MB", "size_mb", "{:,.1f}"),
    C("GPTQ error, sum over modules (modules)", lambda r: r["error_sum"] and f"{r['error_sum']:,.1f} ({r['modules']})"),
    C("error sum vs 1 GPU (same run, checkpoint)", "error_vs_1gpu", lambda x: f"{x:+.3f}%"),
)
LAYERS = (
    RUN_COL,
    STEP,
    C("GPUs", "gpus"),
    C("layer-to-layer intervals timed", "layers"),
    C("median s per layer", "median", "{:.2f}"),
    C("mean s per layer", "mean", "{:.2f}"),
    C("sum s", "total", "{:.1f}"),
    C(
        "median x the whole model's layers, s (extrapolated from 2 layers, not measured)",
        lambda r: r["extrapolated_s"] and f"{r['extrapolated_s']:,.0f} ({r['full_layers']} layers)",
    ),
)
FIDELITY = (
    RUN_COL,
    C("checkpoint", lambda r: r["model"]),
    C("variant", lambda r: f"`{r['variant']}`"),
    C("TP", "tp"),
    C("perplexity", "perplexity", "{:,.4g}"),
    C("vs BF16", "perplexity_increase_pct", pct),
    C("KL (top-20 + tail, lower bound)", "kl_divergence", "{:.2e}"),
    C("top-1 agreement", "top1_agreement", "{:.4f}"),
    C("greedy match", "greedy_match", "{:.2f}"),
    C("error", lambda r: r["error"] and "failed (below)"),
)
BLOCKS = {
    "repro8b-facts": Facts(repro8b.facts, ("quantity", "value")),
    "repro8b-stages": Spec(
        repro8b.stage_rows,
        (
            C("stage", "stage"),
            C("ended (UTC)", "ended"),
            C("seconds", "seconds", "{:.0f}"),
            C("minutes from the start", "since_start", "{:.1f}"),
            C("peak GPU memory GiB, GPUs 0 / 1 / 2 / 3", "peak"),
        ),
    ),
    "repro8b-served": Spec(
        repro8b.served_rows,
        (
            C("variant", "variant"),
            C("config", "config"),
            C("GPU", "gpu"),
            C("served beside", "beside"),
            C("vllm serve start s", "startup", "{:.0f}"),
            C("c=1 tok/s", "c1", "{:,.0f}"),
            C("c=16 tok/s", "c16", "{:,.0f}"),
            C("users at the SLO", lambda r: f"{r['users']:.0f}" + (" (the search's bound)" if r["at_bound"] else "")),
        ),
    ),
    "repro8b-kernels": Spec(
        repro8b.kernel_rows,
        (
            C("W4A16 kernel", "kernel"),
            C("concurrency", "concurrency"),
            C("output tok/s", "tok_s", "{:,.0f}"),
            C("x BF16 (same run)", lambda r: r["bf16"] and r["tok_s"] / r["bf16"], "x{:.2f}"),
            C("p99 TTFT ms", "ttft", "{:.0f}"),
            C("BF16 p99 TTFT ms", "bf16_ttft", "{:.0f}"),
            C("p99 ITL ms", "itl", "{:.1f}"),
        ),
    ),
    "repro8b-gate": Spec(
        repro8b.gate_rows,
        (
            C("variant", "variant"),
            C("verdict", "verdict"),
            C("failed", "failed"),
            C("users per GPU at the SLO", lambda r: f"{r['users']:.0f}" + (" or more" if r["at_least"] else "")),
            C("output tok/s per GPU there", "per_gpu", "{:,.0f}"),
            C("capacity x BF16", "vs_bf16", "x{:.2f}"),
            C("speculation", "speculation"),
        ),
    ),
    "tpeval-conditions": Facts(tpeval.conditions, ("condition", "value")),
    "gptq-gpus": Spec(tpeval.quant_rows, GPTQ),
    "gptq-layers": Spec(tpeval.quant_rows, LAYERS),
    "tp-fidelity": Spec(tpeval.fidelity_rows, FIDELITY),
    "tpeval-failures": Spec(
        tpeval.failures,
        (
            RUN_COL,
            C("entry", "entry"),
            C("first error in run.log", "cause"),
            C("what it means", lambda r: tpeval.meaning(r["cause"])),
        ),
    ),
    "conditions": Facts(conditions, ("condition", "value")),
    "served": Spec(
        lambda: [r for r in configs() if any(r["levels"].values())],
        (
            RUN_COL,
            NAME,
            C("TP (GPUs)", "tp"),
            C("beside", lambda r: r["beside"] or "alone"),
            *(C(f"c={c} tok/s (per GPU)", lambda r, c=c: tok(r, c)) for c in CONCURRENCY),
            C("users at the SLO (measured levels)", "users"),
            C("weights GiB per GPU (vLLM)", "weights"),
            C("KV cache tokens", "kv"),
        ),
    ),
    "per-gpu": Spec(
        per_gpu,
        (
            RUN_COL,
            NAME,
            C("concurrency", "c"),
            C("output tok/s per GPU", "per", "{:,.0f}"),
            C("per GPU x BF16 at TP 4 (same run)", "vs", "x{:.2f}"),
            C("GPU-hours per million output tokens", "gpu_hours", "{:.2f}"),
        ),
    ),
    "beside-alone": Spec(
        beside_alone,
        (
            C("concurrency", "c"),
            C("tok/s beside three others (GPU 0 / 1 / 2 / 3)", "beside"),
            C("tok/s alone (GPU 0)", "alone", "{:,.1f}"),
            C("largest difference", "worst", "{:.2f}%"),
        ),
    ),
    "tp-greedy": Facts(greedy_facts, ("quantity", "value")),
    "tp-greedy-differences": Spec(
        greedy_differences,
        (
            C("held-out prompt", "prompt"),
            C("first differing token", "first_difference"),
            C("top-1 minus top-2 logprob there, TP 2", "margin_shipped"),
            C("same, TP 1", "margin_tp1"),
        ),
    ),
    "unrun": Spec(unrun, (RUN_COL, NAME, C("concurrency not measured", "missing"), C("why", "why"))),
}
