"""Tables of benchmarks/gpu/SERVING.md: the CPU demo's bundles through the serve_bench stage on the GPU (kernel choice,
each speculative method, the k schedule), and the draft model's step cost on two vLLM versions.

Reads raw/demo-serve/ (the stage's record per variant, its serve configs, the CPU bundle's serve.yaml) and
raw/costs/versions/ (measure_costs.py's logs per vLLM). Decisions are the pipeline's own functions
(speculation_choice.decide, serve_bench.choose_kernel) over those records.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.release.speculation_choice import decide  # noqa: E402
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from render import Table, facts, num, times  # noqa: E402
from stages.serve_bench import choose_kernel  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
SERVED = RAW / "demo-serve"
VERSIONS = RAW / "costs/versions/out"
RUNS = ("demo-serve", "costs/versions")
BATCHES = (1, 4, 8, 16, 32, 64)


def params() -> dict:
    return yaml.safe_load((SERVED / "params.yaml").read_text())


def min_gain() -> float:
    return float(params()["serving"]["speculation"]["min_gain"])


def tok(config, c: int) -> float | None:
    level = config.at(c) if config is not None else None
    return level.output_throughput if level is not None else None


def walls() -> Table:
    rows = []
    for line in (SERVED / "walls.txt").read_text().splitlines():
        variant, _, rc, _, seconds, _ = line.split()  # "<variant> exit <rc> after <s> s"
        rows.append((variant, rc, seconds))
    return Table(("variant", "exit status", "wall time of the stage (s)"), tuple(rows))


def served(rec: ServeBenchRecord) -> Table:
    conc = params()["serve_bench"]["concurrency"]
    plain = rec.configs[PLAIN]

    def row(name, config):
        cells = []
        for c in conc:
            v, base = tok(config, c), tok(plain, c)
            cells.append("-" if v is None else f"{v:.0f}" + (f" (x{v / base:.2f})" if base and config is not plain else ""))
        first = config.at(conc[0])
        return (name, *cells, num(first.accepted_per_draft_token if first else None, 3),
                ", ".join(config.kernels_used) or "-")

    rows = [row(f"plain on {name}", config) for name, config in rec.kernels.items() if name != rec.kernel]
    rows.append(row(f"plain{' on ' + rec.kernel if rec.kernel else ''}", plain))
    rows += [row(f"{name} k={config.num_speculative_tokens}", config) for name, config in rec.speculative().items()]
    rows += [row(f"{method} k per batch {config.schedule}", config) for method, config in rec.schedules.items()]
    return Table(("config", *(f"c={c}" for c in conc), "vLLM accepted/drafted (c=1)", "kernels in vLLM's log"),
                 tuple(rows))


def conditions(rec: ServeBenchRecord) -> Table:
    return facts([("GPU", rec.gpu), ("vLLM", rec.vllm_version), ("date", rec.date),
                  ("load generator", rec.load_generator), ("max tokens", rec.max_tokens),
                  ("temperature", rec.temperature)], ("condition", "value"))


def kernel(rec: ServeBenchRecord) -> Table:
    p = params()
    target, tie = p["serving"]["target_concurrency"], p["serve_bench"].get("kernel_tie", 0.04)
    at = {k: tok(c, target) for k, c in rec.kernels.items()}
    return facts([*((f"plain decoding on {k} at concurrency {target} (tok/s)", num(v, 0)) for k, v in at.items()),
                  ("kernel the run served every other config on", rec.kernel),
                  (f"faster at concurrency {target} alone", choose_kernel(rec.kernels, target, 0.0)),
                  (f"the stage's pick now (serve_bench.kernel_tie {tie}: kernels within {tie:.0%} at concurrency "
                   f"{target} weighed over the whole sweep)", choose_kernel(rec.kernels, target, tie))])


def decision(rec: ServeBenchRecord) -> Table:
    target = params()["serving"]["target_concurrency"]
    d = decide(None, rec, target, min_gain())
    return facts([("target concurrency", target), ("serving.speculation.min_gain", min_gain()),
                  ("ships", f"**{d.speculation.label}**"), ("why", d.reason)])


def schedule(rec: ServeBenchRecord) -> Table:
    conc = params()["serve_bench"]["concurrency"]
    target = params()["serving"]["target_concurrency"]
    plain = rec.configs[PLAIN]
    d = decide(None, rec, target, min_gain())
    best = rec.speculative().get(d.method) if d.num_speculative_tokens and not d.schedule else None
    rows = []
    for method, config in rec.schedules.items():
        ratios = {c: tok(config, c) / tok(plain, c) for c in conc if tok(config, c) and tok(plain, c)}
        idle = [c for c in ratios if all(not (lo <= c <= hi and k) for lo, hi, k in config.schedule)]
        mine = math.exp(statistics.fmean(math.log(v) for v in ratios.values()))
        theirs = (math.exp(statistics.fmean(math.log(tok(best, c) / tok(plain, c)) for c in ratios))
                  if best is not None else 1.0)
        rows += [(f"{method} k={config.num_speculative_tokens} per batch {config.schedule}: geometric mean over "
                  "the sweep, x plain decoding", times(mine)),
                 (f"the best fixed setting ({d.speculation.label if best is not None else 'plain decoding'}): "
                  "geometric mean, x plain decoding", times(theirs)),
                 ("the schedule at the concurrencies in its k=0 ranges, x plain decoding",
                  ", ".join(f"c={c} {times(ratios[c])}" for c in idle)),
                 ("plain decoding's duration per level (s)", ", ".join(f"c={c} {plain.at(c).duration_s:.1f}"
                                                                        for c in conc))]
    return facts(rows)


def as_shipped(rec: ServeBenchRecord) -> Table:
    conc = params()["serve_bench"]["concurrency"]
    plain = rec.configs[PLAIN]
    same = (SERVED / "cpu-bundle-serve.yaml").read_bytes() == (SERVED / "serve" / "serve-plain.yaml").read_bytes()
    return facts([("the CPU bundle's serve.yaml is byte for byte the serve-plain.yaml served", "yes" if same else "NO"),
                  ("kernel serve-plain.yaml ran on", rec.kernel),
                  *((f"plain decoding at c={c} (tok/s)", num(tok(plain, c), 0)) for c in conc)])


def run_lines(log: Path) -> dict[int, float]:
    """batch -> ms per engine step of the RUN lines measure_costs.py prints (`RUN method k batch {json}`): each
    batch's last long generation, wall time over engine steps (num_drafts; plain decoding: tokens)."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("RUN "):
            continue
        _, _method, _k, batch, body = line.split(" ", 4)
        r, b = json.loads(body), int(batch)
        steps = r["num_drafts"] / b if r.get("num_drafts") else r["tokens"] / b
        out[b] = 1000.0 * r["wall_s"] / steps
    return out


def version_runs() -> list[Path]:
    return sorted(p for p in VERSIONS.iterdir() if p.is_dir() and p.name.startswith("vllm-"))


def shapes() -> list[str]:
    return sorted({s.name for r in version_runs() for s in r.iterdir() if s.is_dir()})


def step_table(shape: str) -> dict[str, dict[str, dict[int, float]]]:
    return {r.name.removeprefix("vllm-"): {f.stem: run_lines(f) for f in sorted((r / shape).glob("*.log"))}
            for r in version_runs()}


def versions(shape: str) -> Table:
    rows = []
    for version, configs in step_table(shape).items():
        plain = configs.get("plain-k0", {})
        for name in sorted(configs, key=lambda n: (n != "plain-k0", n)):
            k = int(name.rsplit("-k", 1)[1])
            cells = []
            for b in BATCHES:
                v, base = configs[name].get(b), plain.get(b)
                cells.append("-" if v is None else f"{v:.2f} ({(v - base) / k:.2f})" if k and base is not None
                             else f"{v:.2f}")
            rows.append((version, name, *cells))
    return Table(("vLLM", "config", *(f"batch {b}" for b in BATCHES)), tuple(rows))


def versions_ratio(shape: str) -> Table:
    table = step_table(shape)
    both = [v for v in table if "draft_model-k8" in table[v] and "plain-k0" in table[v]]
    a, b = both  # the older version first (sorted)
    per = {v: {bb: (table[v]["draft_model-k8"][bb] - table[v]["plain-k0"][bb]) / 8 for bb in BATCHES
               if bb in table[v]["draft_model-k8"] and bb in table[v]["plain-k0"]} for v in both}
    common = [bb for bb in BATCHES if bb in per[a] and bb in per[b]]
    return Table(("per drafted token at k = 8", *(f"batch {bb}" for bb in common)),
                 ((f"vLLM {b} over {a}", *(times(per[b][bb] / per[a][bb]) for bb in common)),))


def versions_installed() -> Table:
    rows = [(r.name.removeprefix("vllm-"),
             (VERSIONS / f"versions-{r.name.removeprefix('vllm-')}.txt").read_text().strip()) for r in version_runs()]
    return Table(("run", "installed (as the run printed them)"), tuple(rows))


def blocks() -> dict:
    out = {"walls": walls, "versions-installed": versions_installed}
    for path in sorted(SERVED.glob("serve-*.json")):
        rec = records.read(ServeBenchRecord, path)
        v = rec.variant
        out[f"conditions-{v}"] = lambda rec=rec: conditions(rec)
        out[f"served-{v}"] = lambda rec=rec: served(rec)
        if rec.kernels:
            out[f"kernel-{v}"] = lambda rec=rec: kernel(rec)
        out[f"decision-{v}"] = lambda rec=rec: decision(rec)
        if rec.schedules:
            out[f"schedule-{v}"] = lambda rec=rec: schedule(rec)
        out[f"as-shipped-{v}"] = lambda rec=rec: as_shipped(rec)
    for shape in shapes():
        out[f"versions-{shape}"] = lambda shape=shape: versions(shape)
        out[f"versions-ratio-{shape}"] = lambda shape=shape: versions_ratio(shape)
    return out


BLOCKS = blocks()
