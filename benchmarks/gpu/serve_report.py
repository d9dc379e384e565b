"""Render benchmarks/gpu/SERVING.md: the CPU demo's bundles served by the serve_bench stage on the GPU (kernel
choice, each speculative method, the k schedule) and the draft model's step cost on two vLLM versions.

Reads only committed files: benchmarks/gpu/raw/demo-serve/ (`session.sh demo-serve`: the stage's record per
variant, its serve configs, the CPU bundle's serve.yaml it is compared with) and benchmarks/gpu/raw/costs/versions/
(`session.sh draft-cost-versions`: measure_costs.py's output per vLLM). Every number is computed here; the
decisions are the pipeline's own functions (speculation.decide, serve_bench.choose_kernel) over those records.
Usage: python benchmarks/gpu/serve_report.py > benchmarks/gpu/SERVING.md
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.core import records  # noqa: E402
from pipeline.release.speculation_choice import decide  # noqa: E402
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from stages.serve_bench import choose_kernel  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw/demo-serve"
VERSIONS = ROOT / "benchmarks/gpu/raw/costs/versions/out"
MIN_GAIN = 1.1  # params.yaml serving.speculation.min_gain in the run (raw/demo-serve/params.yaml)


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def tok(config, c: int) -> float | None:
    level = config.at(c) if config is not None else None
    return level.output_throughput if level is not None else None


def served_section(variant: str, rec: ServeBenchRecord, params: dict) -> list[str]:
    conc = params["serve_bench"]["concurrency"]
    target = params["serving"]["target_concurrency"]
    tie = params["serve_bench"].get("kernel_tie", 0.04)
    plain = rec.configs[PLAIN]
    out = [f"### {variant}", "", f"{rec.gpu}, vLLM {rec.vllm_version}, {rec.date}; `vllm bench serve` over the demo's "
           f"held-out prompts, at most {rec.max_tokens} tokens, temperature {rec.temperature}. Output tokens/s, and "
           "in brackets x plain decoding at the same concurrency in this run:", "",
           "| config | " + " | ".join(f"c={c}" for c in conc) + " | vLLM accepted/drafted (c=1) | kernels in vLLM's log |",
           "| --- | " + " | ".join("---" for _ in conc) + " | --- | --- |"]

    def row(name, config):
        cells = []
        for c in conc:
            v, base = tok(config, c), tok(plain, c)
            cells.append("-" if v is None else f"{v:.0f}" + (f" (x{v / base:.2f})" if base and config is not plain else ""))
        acc = config.at(conc[0]).accepted_per_draft_token if config.at(conc[0]) else None
        return f"| {name} | " + " | ".join(cells) + f" | {fmt(acc, 3)} | {', '.join(config.kernels_used) or '-'} |"

    for name, config in rec.kernels.items():
        if name != rec.kernel:
            out.append(row(f"plain on {name}", config))
    out.append(row(f"plain{' on ' + rec.kernel if rec.kernel else ''}", plain))
    for name, config in rec.speculative().items():
        out.append(row(f"{name} k={config.num_speculative_tokens}", config))
    for method, config in rec.schedules.items():
        out.append(row(f"{method} k per batch {config.schedule}", config))
    out.append("")
    if rec.kernels:
        strict = choose_kernel(rec.kernels, target, 0.0)
        now = choose_kernel(rec.kernels, target, tie)
        at = {k: tok(c, target) for k, c in rec.kernels.items()}
        out += [f"Kernel: the run served plain decoding on {' and '.join(rec.kernels)} and ran every other config on "
                f"{rec.kernel} ({', '.join(f'{k} {v:.0f}' for k, v in at.items())} tok/s at concurrency {target}). "
                f"The faster at concurrency {target} alone is {strict}; with serve_bench.kernel_tie {tie} (kernels "
                f"within {tie:.0%} there are weighed over the whole sweep) the stage now picks {now}"
                + (f", which the run did not use: a build with this code ships {now}'s environment." if now != rec.kernel
                   else "."), ""]
    d = decide(None, rec, target, MIN_GAIN)
    out += [f"What a build with this measurement ships (`speculation.decide` at concurrency {target}, min_gain "
            f"{MIN_GAIN}): **{d.speculation.label}**. {d.reason}.", ""]
    best = rec.speculative().get(d.method) if d.num_speculative_tokens and not d.schedule else None
    for method, config in rec.schedules.items():
        ratios = {c: tok(config, c) / tok(plain, c) for c in conc if tok(config, c) and tok(plain, c)}
        idle = [c for c in ratios if all(not (lo <= c <= hi and k) for lo, hi, k in config.schedule)]
        mine = math.exp(statistics.fmean(math.log(v) for v in ratios.values()))
        theirs = (math.exp(statistics.fmean(math.log(tok(best, c) / tok(plain, c)) for c in ratios))
                  if best is not None else 1.0)
        out += [f"The schedule drafts {method} k={config.num_speculative_tokens} only in the batch ranges where its "
                f"fixed config beat plain decoding by min_gain. Over the sweep its geometric mean is x{mine:.2f} of "
                f"plain decoding against x{theirs:.2f} for "
                f"{d.speculation.label if best is not None else 'plain decoding'}, the best fixed setting: it does "
                f"not ship. At the concurrencies whose batch sizes fall in its k=0 ranges "
                f"({', '.join(f'c={c} x{ratios[c]:.2f}' for c in idle)}) it computes what plain decoding computes "
                "(until the batch drains into a drafting range), on PIECEWISE CUDA graphs instead of FULL ones (vLLM "
                "0.26 overrides them for dynamic speculation): the batch-1 loss is consistent with that mode's launch cost on a "
                "10M model (not measured apart here); the spread at higher concurrency is about what one run this short resolves ("
                + ", ".join(f"c={c} {plain.at(c).duration_s:.1f} s" for c in conc) + " of plain decoding per level).",
                ""]
    shipped_cpu = RAW / "cpu-bundle-serve.yaml"
    measured_plain = RAW / "serve" / "serve-plain.yaml"
    if shipped_cpu.is_file() and measured_plain.is_file():
        same = shipped_cpu.read_bytes() == measured_plain.read_bytes()
        out += [f"Served as shipped: the CPU build's bundle (`raw/demo-serve/cpu-bundle-serve.yaml`, no "
                f"speculative-config, no serve.env) is {'byte for byte' if same else 'NOT'} the `serve-plain.yaml` "
                f"this run served{' on ' + rec.kernel + ' (vLLM default, what the bundle gets without serve.env)' if rec.kernel == 'machete' else ''}: "
                "as shipped, it runs at x1.00 of its own plain decoding at every concurrency by construction; "
                + ", ".join(f"c={c} {tok(plain, c):.0f} tok/s" for c in conc) + ".", ""]
    return out


BATCHES = (1, 4, 8, 16, 32, 64)


def versions_section() -> list[str]:
    """Both vLLMs' engines in one lease. vLLM 0.25.0 wrote its ModelConfig into the speculative_config dict
    measure_costs.py saves, so its draft-model records failed to write after every timing had run (fixed since);
    their logs' RUN lines (each batch's last long generation, 288 tokens a request after a 128-token prompt) are
    what both versions have, and are compared here: wall time over engine steps, prefill and scheduling included."""
    if not VERSIONS.is_dir():
        return ["Not measured yet (`session.sh draft-cost-versions`).", ""]
    runs = sorted(p for p in VERSIONS.iterdir() if p.is_dir() and p.name.startswith("vllm-"))
    versions = "; ".join((VERSIONS / f"versions-{r.name.removeprefix('vllm-')}.txt").read_text().strip() for r in runs)
    out = [f"{(VERSIONS / 'gpu.txt').read_text().strip()}; {versions}. `measure_costs.py run` with random weights, "
           "one engine per config, vLLM's default CUDA graphs. vLLM 0.25.0's draft-model engines ran every timing but "
           "failed to save their records (a JSON error in measure_costs.py, fixed since: vLLM 0.25 writes an object "
           "into the speculative_config it is given), so both versions are compared on what their logs hold: each "
           "batch's last long generation (288 tokens a request after a 128-token prompt), wall time over engine "
           "steps (vLLM's num_drafts; plain decoding: tokens), prefill and scheduling included. In brackets: per "
           "drafted token, (step - plain step) / k.", ""]
    for shape in sorted({s.name for r in runs for s in r.iterdir() if s.is_dir()}):
        table = {r.name.removeprefix("vllm-"): {f.stem: run_lines(f) for f in sorted((r / shape).glob("*.log"))}
                 for r in runs}
        out += [f"Shape `{shape}`, ms per engine step:", "",
                "| vLLM | config | " + " | ".join(f"batch {b}" for b in BATCHES) + " |",
                "| --- | --- | " + " | ".join("---" for _ in BATCHES) + " |"]
        for version, configs in table.items():
            plain = configs.get("plain-k0", {})
            for name in sorted(configs, key=lambda n: (n != "plain-k0", n)):
                k = int(name.rsplit("-k", 1)[1])
                cells = []
                for b in BATCHES:
                    v, base = configs[name].get(b), plain.get(b)
                    if v is None:
                        cells.append("-")
                    elif k and base is not None:
                        cells.append(f"{v:.2f} ({(v - base) / k:.2f})")
                    else:
                        cells.append(f"{v:.2f}")
                out.append(f"| {version} | {name} | " + " | ".join(cells) + " |")
        both = [v for v in table if "draft_model-k8" in table[v] and "plain-k0" in table[v]]
        if len(both) == 2:
            a, b = both
            per = {v: {bb: (table[v]["draft_model-k8"][bb] - table[v]["plain-k0"][bb]) / 8 for bb in BATCHES
                       if bb in table[v]["draft_model-k8"] and bb in table[v]["plain-k0"]} for v in both}
            common = [bb for bb in BATCHES if bb in per[a] and bb in per[b]]
            out += ["", f"Per drafted token at k = 8, {b} over {a}: " + ", ".join(
                f"batch {bb} x{per[b][bb] / per[a][bb]:.2f}" for bb in common) + "."]
        out.append("")
    return out


def run_lines(log: Path) -> dict[int, float]:
    """batch -> ms per engine step of the RUN lines measure_costs.py prints (`RUN method k batch {json}`)."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("RUN "):
            continue
        _, _method, _k, batch, body = line.split(" ", 4)
        r, b = json.loads(body), int(batch)
        steps = r["num_drafts"] / b if r.get("num_drafts") else r["tokens"] / b
        out[b] = 1000.0 * r["wall_s"] / steps
    return out


def main() -> None:
    import yaml

    params = yaml.safe_load((RAW / "params.yaml").read_text())
    lines = ["# Serving choices measured on the GPU: kernel, speculative method, k per batch size (vLLM 0.26.0)", "",
             "<!-- rendered by python benchmarks/gpu/serve_report.py; do not edit -->", "",
             f"GPU: {(RAW / 'gpu.txt').read_text().strip()}. The serve_bench stage (`bash benchmarks/gpu/session.sh "
             "demo-serve`, profiles/gpu-demo-serve.yaml) over the CPU demo's artifacts as a CPU `dvc repro` built them: "
             "plain decoding on each kernel vLLM offers the variant, each method at the k its CPU estimate chose, "
             "then the k schedule the sweep suggests. Wall time per variant: "
             + "; ".join(line.strip() for line in (RAW / "walls.txt").read_text().splitlines()) + ".", "",
             "## Served", ""]
    for path in sorted(RAW.glob("serve-*.json")):
        rec = records.read(ServeBenchRecord, path)
        lines += served_section(rec.variant, rec, params)
    lines += ["## The draft model's step cost, vLLM 0.25.0 against 0.26.0 in one lease", ""] + versions_section()
    print("\n".join(lines).rstrip() + "\n", end="")


if __name__ == "__main__":
    main()
