"""benchmarks/gpu/SCALE.md: a model of Llama-3-70B's shape (random weights) per variant and tensor parallel size on a
4x H100 host (benchmarks/gpu/scale_serve.py, raw/scale-70b/): per GPU against BF16 at its own GPU count."""
from __future__ import annotations

import json
import re

from render import Column as C, Facts, Spec
from tables import read

RUN = read.RAW / "scale-70b"
RUNS = ("scale-70b",)
PLAN = read.ROOT / "benchmarks/gpu/plans/scale-70b.json"
BASELINE = "bf16-tp4"
CONCURRENCY = (1, 16, 32, 64)
WEIGHTS_GIB = r"Actual usage is ([0-9.]+) GiB for weight"  # vLLM 0.26's gpu_worker line, per GPU
KV_TOKENS = r"GPU KV cache size: ([0-9,]+) tokens"


def level(name: str, c: int) -> dict | None:
    path = RUN / "out" / name / f"c{c}.json"
    return json.loads(path.read_text()) if path.exists() else None


def users_at_slo(name: str, slo: dict) -> str | None:
    """The largest measured concurrency meeting the SLO and the smallest missing it: a bracket, not a search."""
    levels = {c: lvl for c in CONCURRENCY if (lvl := level(name, c))}
    met = [c for c, v in levels.items() if not v.get("failed") and v["p99_ttft_ms"] <= slo["p99_ttft_ms"]
           and v["p99_itl_ms"] <= slo["p99_itl_ms"]]
    lo = max(met, default=None)
    hi = min((c for c in levels if c not in met and (lo is None or c > lo)), default=None)
    return None if not levels else f"{lo}" + " (>= measured max)" if hi is None else f"{lo or 0} to {hi - 1}"


def server_log(name: str, pattern: str) -> str | None:
    log = RUN / "out" / name / "server.brief.log"
    m = re.search(pattern, log.read_text()) if log.exists() else None
    return m[1] if m else None


def configs() -> list[dict]:
    """Each planned config with its levels, the configs that served beside it, and its GPU count."""
    slo = read.project_params()["serving"]["slo"]
    rows = []
    for config in (c for wave in json.loads(PLAN.read_text()) for c in wave):
        name, meta = config["name"], RUN / "out" / config["name"] / "config.json"
        rows.append({**config, "gpus": len(config["gpus"]), "levels": {c: level(name, c) for c in CONCURRENCY},
                     "beside": ", ".join(json.loads(meta.read_text())["beside"]) if meta.exists() else "",
                     "users": users_at_slo(name, slo), "weights": server_log(name, WEIGHTS_GIB),
                     "kv": server_log(name, KV_TOKENS)})
    return rows


def per_gpu() -> list[dict]:
    rows = configs()
    base = next(r for r in rows if r["name"] == BASELINE)
    return [{"name": r["name"], "c": c, "per": r["levels"][c]["output_throughput"] / r["gpus"],
             "vs": (r["levels"][c]["output_throughput"] / r["gpus"])
             / (base["levels"][c]["output_throughput"] / base["gpus"]),
             "gpu_hours": r["gpus"] / (r["levels"][c]["output_throughput"] * 3600) * 1e6}
            for r in rows for c in CONCURRENCY if r["levels"][c] and base["levels"][c]]


def unrun() -> list[dict]:
    rows = []
    for r in configs():
        missing = [c for c in CONCURRENCY if not r["levels"][c]]
        log = RUN / "out" / r["name"] / f"c{missing[0]}.log" if missing else None
        if missing:
            rows.append({"name": r["name"], "missing": ", ".join(map(str, missing)), "why": (
                "its `vllm bench serve` client hung before sending a request (empty log); the device time ran out"
                if log.exists() and not log.read_text().strip() else "not reached: the device time ran out")})
    return rows


def conditions():
    spec, slo = json.loads((RUN / "run.json").read_text()), read.project_params()["serving"]["slo"]
    return [("GPU", f"{spec['gpu']['count']}x {spec['gpu']['name']} (NVLink between every pair: `topo.txt`)"),
            ("vLLM", spec["software"]["vllm"]),
            ("model", ("80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256 (Llama-3-70B's); "
                       "random weights (`--load-format dummy`)")),
            ("traffic", ("random prompts of 512 tokens, 128 output tokens each (`--ignore-eos`), 2 prompts per user, "
                         "at least 4")),
            ("server", "max-model-len 4096, max-num-seqs 64, gpu-memory-utilization 0.9"),
            ("SLO (serving.slo)", f"p99 TTFT <= {slo['p99_ttft_ms']} ms, p99 ITL <= {slo['p99_itl_ms']} ms")]


def tok(r: dict, c: int) -> str | None:
    v = r["levels"][c]
    return f"{v['output_throughput']:,.0f} ({v['output_throughput'] / r['gpus']:,.0f})" if v else None


NAME = C("config", lambda r: f"`{r['name']}`")
BLOCKS = {
    "conditions": Facts(conditions, ("condition", "value")),
    "served": Spec(lambda: [r for r in configs() if any(r["levels"].values())], (
        NAME, C("TP (GPUs)", "tp"), C("beside", lambda r: r["beside"] or "alone"),
        *(C(f"c={c} tok/s (per GPU)", lambda r, c=c: tok(r, c)) for c in CONCURRENCY),
        C("users at the SLO (measured levels)", "users"), C("weights GiB per GPU (vLLM)", "weights"),
        C("KV cache tokens", "kv"))),
    "per-gpu": Spec(per_gpu, (NAME, C("concurrency", "c"), C("output tok/s per GPU", "per", "{:,.0f}"),
                              C("per GPU x BF16 at TP 4", "vs", "x{:.2f}"),
                              C("GPU-hours per million output tokens", "gpu_hours", "{:.2f}"))),
    "unrun": Spec(unrun, (NAME, C("concurrency not measured", "missing"), C("why", "why"))),
}
