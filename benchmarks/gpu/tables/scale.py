"""Tables of benchmarks/gpu/SCALE.md: a model of Llama-3-70B's shape (random weights) served per variant and tensor
parallel size on a 4x H100 host (benchmarks/gpu/scale_serve.py; raw/scale-70b/). Per GPU and GPU-hours per million
output tokens, each variant against BF16 at its own GPU count; users at the chat SLO from the measured levels."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from render import Table, facts, num  # noqa: E402

RUN = ROOT / "benchmarks/gpu/raw/scale-70b"
RUNS = ("scale-70b",)
PLAN = ROOT / "benchmarks/gpu/plans/scale-70b.json"
BASELINE = "bf16-tp4"
CONCURRENCY = (1, 16, 32, 64)


def slo() -> dict:
    """params.yaml's serving.slo: the chat objective capacity is measured against."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())["serving"]["slo"]


def planned() -> list[dict]:
    return [config for wave in json.loads(PLAN.read_text()) for config in wave]


def level(name: str, c: int) -> dict | None:
    path = RUN / "out" / name / f"c{c}.json"
    return json.loads(path.read_text()) if path.exists() else None


def meets(lvl: dict, objective: dict) -> bool:
    return (not lvl.get("failed") and lvl["p99_ttft_ms"] <= objective["p99_ttft_ms"]
            and lvl["p99_itl_ms"] <= objective["p99_itl_ms"])


def users_at_slo(name: str, objective: dict) -> str:
    """The largest measured concurrency meeting the SLO, and the smallest missing it: a bracket, not a search."""
    levels = {c: lvl for c in CONCURRENCY if (lvl := level(name, c))}
    met = [c for c, lvl in levels.items() if meets(lvl, objective)]
    missed = [c for c, lvl in levels.items() if not meets(lvl, objective)]
    if not levels:
        return "-"
    lo = max(met) if met else None
    hi = min((c for c in missed if lo is None or c > lo), default=None)
    return (f"{lo}" if hi is None else f"{lo or 0} to {hi - 1}") + (" (>= measured max)" if hi is None else "")


def from_server_log(name: str, pattern: str) -> str:
    """The first group of pattern in a config's server log (cut to memory lines on the host), or - without one."""
    log = RUN / "out" / name / "server.brief.log"
    m = re.search(pattern, log.read_text()) if log.exists() else None
    return m[1] if m else "-"


WEIGHTS_GIB = r"Actual usage is ([0-9.]+) GiB for weight"  # vLLM 0.26's gpu_worker line, per GPU
KV_TOKENS = r"GPU KV cache size: ([0-9,]+) tokens"


def conditions() -> Table:
    spec = json.loads((RUN / "run.json").read_text())
    shape = ("80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256 (Llama-3-70B's); random "
             "weights (`--load-format dummy`)")
    return facts([("GPU", f"{spec['gpu']['count']}x {spec['gpu']['name']} (NVLink between every pair: `topo.txt`)"),
                  ("vLLM", spec["software"]["vllm"]), ("model", shape),
                  ("traffic", "random prompts of 512 tokens, 128 output tokens each (`--ignore-eos`), 2 prompts per "
                              "user, at least 4"),
                  ("server", "max-model-len 4096, max-num-seqs 64, gpu-memory-utilization 0.9"),
                  ("SLO (serving.slo)", f"p99 TTFT <= {slo()['p99_ttft_ms']} ms, p99 ITL <= {slo()['p99_itl_ms']} ms")],
                 ("condition", "value"))


def served() -> Table:
    objective, rows = slo(), []
    for config in planned():
        name, gpus = config["name"], len(config["gpus"])
        levels = [level(name, c) for c in CONCURRENCY]
        if not any(levels):
            continue
        record = RUN / "out" / name / "config.json"
        beside = json.loads(record.read_text())["beside"] if record.exists() else []
        cells = [f"{lvl['output_throughput']:,.0f} ({lvl['output_throughput'] / gpus:,.0f})" if lvl else "-"
                 for lvl in levels]
        rows.append((f"`{name}`", str(config["tp"]), ", ".join(beside) or "alone", *cells,
                     users_at_slo(name, objective), from_server_log(name, WEIGHTS_GIB),
                     from_server_log(name, KV_TOKENS)))
    return Table(("config", "TP (GPUs)", "beside", *(f"c={c} tok/s (per GPU)" for c in CONCURRENCY),
                  "users at the SLO (measured levels)", "weights GiB per GPU (vLLM)", "KV cache tokens"), tuple(rows))


def per_gpu() -> Table:
    """Each config's output tokens/s per GPU against BF16's at its own GPU count, and GPU-hours per million output
    tokens (multiply by a GPU-hour price for the cost), at every concurrency both measured."""
    base = {c: level(BASELINE, c) for c in CONCURRENCY}
    base_gpus = next(len(c["gpus"]) for c in planned() if c["name"] == BASELINE)
    rows = []
    for config in planned():
        name, gpus = config["name"], len(config["gpus"])
        for c in CONCURRENCY:
            lvl = level(name, c)
            if not lvl or not base[c]:
                continue
            per, bper = lvl["output_throughput"] / gpus, base[c]["output_throughput"] / base_gpus
            rows.append((f"`{name}`", str(c), f"{per:,.0f}", f"x{per / bper:.2f}",
                         num(gpus / (lvl["output_throughput"] * 3600) * 1e6, 2)))
    return Table(("config", "concurrency", "output tok/s per GPU", "per GPU x BF16 at TP 4",
                  "GPU-hours per million output tokens"), tuple(rows))


def unrun() -> Table:
    rows = []
    for config in planned():
        missing = [str(c) for c in CONCURRENCY if not level(config["name"], c)]
        if missing:
            log = RUN / "out" / config["name"] / f"c{missing[0]}.log"
            why = ("its `vllm bench serve` client hung before sending a request (empty log); the device time ran out"
                   if log.exists() and not log.read_text().strip() else "not reached: the device time ran out")
            rows.append((f"`{config['name']}`", ", ".join(missing), why))
    return Table(("config", "concurrency not measured", "why"), tuple(rows))


BLOCKS = {"conditions": conditions, "served": served, "per-gpu": per_gpu, "unrun": unrun}
