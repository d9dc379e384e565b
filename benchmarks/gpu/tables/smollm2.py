"""Tables of benchmarks/gpu/SMOLLM2-GPU.md: SmolLM2-135M-Instruct through the pipeline on the GPU, as far as the run got.

Reads raw/smollm2-gpu/ alone: the run's params.yaml, its timestamped repro.log, metrics/ and eval/bf16/ of the
stages that finished, the EAGLE-3 head's record, the gate's output, and the unfinished serve_bench@bf16's serve
configs, `vllm bench serve` results (serve/bf16/raw/*.json.gz, written as each run ends) and server logs. The stage's
own record was never written, so the served tables read `vllm bench serve`'s results directly.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from render import Table, Text, facts  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
RUN = RAW / "smollm2-gpu-3"  # the third lease: serve_bench@bf16 whole (its record), evaluate@gptq-w4a16
RUN1 = RAW / "smollm2-gpu"  # the first lease: serve_bench@bf16's sweep without its record
RUN2 = RAW / "smollm2-gpu-2"  # a second lease of the same profile: through evaluate@bf16 and every quantize stage
RUNS = ("smollm2-gpu", "smollm2-gpu-2", "smollm2-gpu-3")
LEASES = (("smollm2-gpu", RUN1), ("smollm2-gpu-2", RUN2), ("smollm2-gpu-3", RUN))
CPU_QUANTIZE = ROOT / "benchmarks/raw/quantize-smollm2.json"  # quantize_bench.py on the 2-core CPU
METHODS = ("draft_model", "eagle3", "ngram")
CONFIGS = ("plain", *METHODS)
# Published vLLM runs of EAGLE-3 on Llama-3.1-8B-Instruct over MT-Bench accept about this share of drafted tokens
# (mean accepted length 2.4-3.5 at k = 2-7): quoted, not measured here; the prose cites the source's words.
PUBLISHED_EAGLE3_RATIO = (0.5, 0.7)


def load(path: Path):
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def params() -> dict:
    return yaml.safe_load((RUN / "params.yaml").read_text())


def variants() -> list[str]:
    return list(params()["quantize"]["enabled"])


def repro_lines() -> list[tuple[int, str]]:
    """repro.log's lines as (seconds into `dvc repro`, text); the run timestamped each line."""
    out = []
    for line in (RUN / "repro.log").read_text().splitlines():
        m = re.match(r"^(\d+) (.*)$", line)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def stage_times(lines) -> list[tuple[str, int, int, bool]]:
    """(stage, start s, end s, finished): a stage runs from its 'Running stage' line to the next one's (DVC's lock
    update included); the last one to the log's last line."""
    starts = [(t, re.search(r"Running stage '([^']+)'", s).group(1)) for t, s in lines if "Running stage '" in s]
    last = lines[-1][0]
    return [(name, t, starts[i + 1][0] if i + 1 < len(starts) else last, i + 1 < len(starts))
            for i, (t, name) in enumerate(starts)]


def stage_summary_line(lines, stage: str) -> str | None:
    """The stage's own one-line summary (the line the stage prints that starts with its name)."""
    base = stage.split("@")[0]
    for _, s in lines:
        if "%|" in s or "it/s]" in s:  # progress bars
            continue
        if s.startswith(f"{base} ") or s.startswith(f"{base}:") or s.startswith(f"{base} ("):
            if stage == base or stage.split("@")[1] in s.split(":")[0]:
                return s
    return None


def bench_runs(variant: str = "bf16", run: Path = RUN) -> dict:
    """config -> {concurrency: result, ('capacity', c): result} from `vllm bench serve`'s raw JSON."""
    runs: dict = {}
    for f in sorted((run / "serve" / variant / "raw").glob("*.json.gz")):
        m = re.match(r"^(.+?)-(capacity-)?c(\d+)\.json\.gz$", f.name)
        config, capacity, c = m.group(1), bool(m.group(2)), int(m.group(3))
        runs.setdefault(config, {})[("capacity", c) if capacity else c] = load(f)
    return runs


def sweep_levels(results: dict) -> list[int]:
    return sorted(k for k in results if isinstance(k, int))


def served_k(config: str, variant: str = "bf16") -> int | None:
    path = RUN / "serve" / variant / f"serve-{config}.yaml"
    if not path.is_file():
        return None
    spec = (yaml.safe_load(path.read_text()) or {}).get("speculative-config") or {}
    return spec.get("num_speculative_tokens")


def evals() -> dict[str, dict]:
    return {v: load(RUN / "metrics" / f"eval-{v}.json") for v in variants()
            if (RUN / "metrics" / f"eval-{v}.json").is_file()}


def eagle3_record() -> dict:
    rec = load(RUN / "metrics" / "eagle3.json")
    if (RUN / "timings" / "eagle3.json").is_file():  # runs since timings left metrics/: seconds in timings/
        rec = {**rec, **load(RUN / "timings" / "eagle3.json")}
    return rec


def server_starts(variant: str = "bf16", run: Path = RUN) -> list[tuple[str, int | None, str]]:
    """(config, seconds from the server log's first line to vLLM's 'Available routes' line, its engine-init line)."""
    out = []
    for f in sorted((run / "logs").glob(f"serve_bench@{variant}.*-server.log")):
        config = f.name[len(f"serve_bench@{variant}."):-len("-server.log")]
        first, ready, _ = server_moments(config, run, variant)
        init = re.findall(r"init engine \(profile, create kv cache, warmup model\) took "
                          r"([0-9.]+ s \(compilation: [0-9.]+ s\))", f.read_text())
        secs = int((ready - first).total_seconds()) if ready and first else None
        out.append((config, secs, "; ".join(init)))
    return out


def server_moments(config: str, run: Path, variant: str = "bf16") -> tuple[datetime, datetime | None, datetime | None]:
    """The server log's first line, its 'Available routes' line and the API server's shutdown line."""
    text = (run / "logs" / f"serve_bench@{variant}.{config}-server.log").read_text()

    def stamp(pattern: str) -> datetime | None:
        m = re.search(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) " + pattern, text)
        return datetime.strptime(m.group(1), "%m-%d %H:%M:%S") if m else None

    return stamp(""), stamp(r"\[[^]]+\] Available routes"), stamp(r"\[[^]]+\] \[shutdown\] API server: shutdown triggered")


def serve_record(variant: str = "bf16") -> dict:
    return load(RUN / "serve" / variant / "record.json")


def within_slo(r: dict, slo: dict) -> bool:
    return r["p99_ttft_ms"] <= slo["p99_ttft_ms"] and r["p99_itl_ms"] <= slo["p99_itl_ms"] and not r["failed"]


# -- blocks ---------------------------------------------------------------------------------------------------


def setup() -> Table:
    p = params()
    sb = p["serve_bench"]
    first = min(r["date"] for results in bench_runs().values() for r in results.values())
    return facts([
        ("GPU, driver, memory (`gpu.txt`)", (RUN / "gpu.txt").read_text().strip()),
        ("target (`target.source`)", f"`{p['target']['source']}`"),
        ("traffic (`data.traffic`)", f"`{p['data']['traffic']}`"),
        ("variants, in order (`quantize.enabled`)", ", ".join(f"`{v}`" for v in p["quantize"]["enabled"])),
        ("speculative methods (`draft.method`)", ", ".join(f"`{m}`" for m in p["draft"]["method"])),
        ("serve_bench concurrency", ", ".join(map(str, sb["concurrency"]))),
        ("prompts per user / at least", f"{sb['prompts_per_concurrency']} / {sb['min_prompts']}"),
        ("max tokens out", sb["max_tokens"]),
        ("k schedule", sb["k_schedule"]),
        ("capacity search: at most probes / users", f"{sb['capacity']['max_probes']} / "
                                                      f"{sb['capacity']['max_concurrency']}"),
        ("serving.slo: p99 TTFT ms / p99 ITL ms", f"{p['serving']['slo']['p99_ttft_ms']} / "
                                                  f"{p['serving']['slo']['p99_itl_ms']}"),
        ("first `vllm bench serve` run (UTC)", f"{first[:4]}-{first[4:6]}-{first[6:8]} {first[9:11]}:{first[11:13]}"),
    ], header=("setting (the run's params.yaml, gpu.txt, results)", "value"))


def progress() -> Table:
    p = params()
    stages = stage_times(repro_lines())
    ran = {name for name, *_ in stages}
    last_name, last_start, last_end, _ = stages[-1]
    never = [f"{s}@{v}" for s in ("quantize", "evaluate", "serve_bench") for v in p["quantize"]["enabled"]
             if f"{s}@{v}" not in ran]
    never += [s for s in ("evaluate_draft", "gate", "bundle", "publish") if s not in ran]
    return facts([
        ("stage running when the run ended", f"`{last_name}`"),
        ("its start, s into `dvc repro`", last_start),
        ("the log's last line, s", last_end),
        ("stages never started", ", ".join(f"`{s}`" for s in never)),
    ])


def sweep_progress() -> Table:
    levels = params()["serve_bench"]["concurrency"]
    rows = []
    for config, results in bench_runs().items():
        done = sweep_levels(results)
        rows.append((f"`{config}`", ", ".join(map(str, done)),
                     "yes" if all(c in results for c in levels) else "no",
                     ", ".join(str(k[1]) for k in results if isinstance(k, tuple)) or "-"))
    return Table(("config (`serve_bench@bf16`)", "sweep concurrency run", "sweep complete", "capacity probes at"),
                 tuple(rows))


def stages() -> Table:
    lines = repro_lines()
    rows = []
    for name, start, end, done in stage_times(lines):
        summary = stage_summary_line(lines, name) or ""
        rows.append((f"`{name}`", str(start), f"{end - start}{'' if done else ' to the last line (unfinished)'}",
                     summary.replace("|", "/")[:220]))
    return Table(("stage", "start s", "s", "what it printed"), tuple(rows))


def quality() -> Table:
    ev = evals()
    base = ev.get(params()["serving"]["baseline_variant"])
    rows = []
    for v in variants():
        e = ev.get(v)
        if e is None:
            rows.append((f"`{v}`", f"not evaluated: `evaluate@{v}` never started", "", "", "", "", "", "", ""))
            continue
        lm = e.get("lm_eval_domain_heldout_byte_perplexity")
        rel = None if base is None or lm is None else 100.0 * (lm / base["lm_eval_domain_heldout_byte_perplexity"] - 1)
        rows.append((f"`{v}`", fmt(e["perplexity"], 2), f"{e['perplexity_increase_pct']:+.2f}%",
                     fmt(e["kl_divergence"], 4), fmt(e["top1_agreement"]), fmt(e["greedy_match"]), str(e["tokens"]),
                     fmt(lm), "-" if rel is None else f"{rel:+.2f}%"))
    return Table(("variant", "held-out ppl", "ppl change", "KL", "top-1", "greedy match", "scored tokens",
                  "lm-eval byte ppl", "lm-eval byte ppl vs BF16"), tuple(rows))


def thresholds() -> Table:
    """The quality thresholds (the ones a variant's evaluate metrics meet), with each variant's override."""
    g = params()["gates"]
    overrides = g.get("overrides") or {}
    rows = []
    for key in ("max_perplexity_increase_pct", "max_kl_divergence", "min_top1_agreement", "max_heldout_perplexity"):
        over = ", ".join(f"`{v}` {o[key]}" for v, o in overrides.items() if key in o)
        rows.append((f"`{key}`", str(g["thresholds"][key]), over or "-"))
    return Table(("threshold (`gates.thresholds`)", "value", "override (`gates.overrides`)"), tuple(rows))


def gate() -> Text:
    return Text("```\n" + (RUN / "gate.txt").read_text().rstrip() + "\n```")


def drafts_per_step() -> Table:
    runs = bench_runs()
    rows = []
    for m in METHODS:
        if m not in runs:
            continue
        levels = sweep_levels(runs[m])
        drafted = sum(runs[m][c]["spec_decode_draft_tokens"] for c in levels)
        drafts = sum(runs[m][c]["spec_decode_num_drafts"] for c in levels)
        rows.append((f"`{m}`", str(served_k(m)), f"{drafted / drafts:.2f}"))
    return Table(("method", "k served", "drafted tokens / drafts (vLLM's counters, sweep levels)"), tuple(rows))


def estimate_at(est: dict, k: int | None) -> tuple[float | None, float | None]:
    """The estimate's accepted/drafted and mean accepted length at k (a drafting step drafts k tokens)."""
    if not k:
        return None, None
    acc, dr = est["accepted_per_step_by_k"][str(k)], est["drafted_per_step_by_k"][str(k)]
    return acc / dr, 1 + acc * k / dr


def acceptance() -> Table:
    runs = bench_runs()
    rows = []
    for m in METHODS:
        k = served_k(m)
        est_ratio, est_len = estimate_at(load(RUN / "eval" / "bf16" / f"speculative-{m}.json"), k)
        levels = sweep_levels(runs.get(m, {}))
        if not levels:
            rows.append((f"`{m}`", str(k), "not served", "", "", "", "", "", fmt(est_ratio), fmt(est_len)))
        tot = [0, 0, 0]
        for c in levels:
            r = runs[m][c]
            d, a, n = r["spec_decode_draft_tokens"], r["spec_decode_accepted_tokens"], r["spec_decode_num_drafts"]
            tot = [tot[0] + d, tot[1] + a, tot[2] + n]
            rows.append((f"`{m}`", str(k), str(c), str(r["completed"]), str(d), str(a), fmt(a / d), fmt(1 + a / n, 2),
                         fmt(est_ratio), fmt(est_len, 2)))
        if len(levels) > 1:
            rows.append((f"`{m}`", str(k), "all sweep levels", "", str(tot[0]), str(tot[1]), fmt(tot[1] / tot[0]),
                         fmt(1 + tot[1] / tot[2], 2), fmt(est_ratio), fmt(est_len, 2)))
    return Table(("method", "k served", "concurrency", "requests", "drafted", "accepted", "accepted/drafted",
                  "mean accepted length", "estimate: accepted/drafted", "estimate: mean accepted length"),
                 tuple(rows))


def eagle3_head() -> Table:
    rec = eagle3_record()
    est = load(RUN / "eval" / "bf16" / "speculative-eagle3.json")
    served = [r for key, r in bench_runs().get("eagle3", {}).items() if isinstance(key, int)]
    ratio = (sum(r["spec_decode_accepted_tokens"] for r in served) / sum(r["spec_decode_draft_tokens"] for r in served)
             if served else None)
    lo, hi = PUBLISHED_EAGLE3_RATIO
    rows = [("training steps", rec["train_steps"]),
            ("trainable parameters", f"{rec['trainable_parameters']:,}"),
            ("draft vocabulary", rec["draft_vocab_size"]),
            ("aux layers", rec["aux_layers"]),
            ("final loss", f"{rec['final_loss']:.2f}"),
            ("accuracy by step", ", ".join(f"{a:.3f}" for a in rec["accuracy_by_step"])),
            ("k served", served_k("eagle3"))]
    for k in (2, 4, 7):
        if str(k) in est["accepted_per_step_by_k"]:
            r, length = estimate_at(est, k)
            rows.append((f"estimate at k={k}: accepted/drafted / mean accepted length", f"{r:.3f} / {length:.2f}"))
    rows.append(("served accepted/drafted over the sweep", fmt(ratio)))
    if ratio is not None:
        where = "below" if ratio < lo else "within" if ratio <= hi else "above"
        rows.append((f"against the published {lo}-{hi}", where))
    return facts(rows, header=("EAGLE-3 head (`metrics/eagle3.json`, the estimate, the served counters)", "value"))


def speed() -> Table:
    runs = bench_runs()
    levels = params()["serve_bench"]["concurrency"]
    plain = runs.get("plain", {})
    rows = []
    for cfg in CONFIGS:
        if cfg not in runs:
            continue
        cells = []
        for c in levels:
            r = runs[cfg].get(c)
            if r is None:
                cells += ["not run", ""]
                continue
            p = plain.get(c)
            cells += [f"{r['output_throughput']:.0f}",
                      f"{r['output_throughput'] / p['output_throughput']:.2f}x" if p else "-"]
        rows.append((f"`{cfg}`", str(served_k(cfg) or "-"), *cells))
    header = tuple(h for c in levels for h in (f"c={c} tok/s", "vs plain"))
    return Table(("config", "k", *header), tuple(rows))


def predicted() -> Table:
    runs = bench_runs()
    plain = runs.get("plain", {})
    e = evals()["bf16"]
    rows = []
    for p in e["methods"]:
        m = p["method"]
        measured = (runs[m][1]["output_throughput"] / plain[1]["output_throughput"]
                    if 1 in runs.get(m, {}) and 1 in plain else None)
        rows.append((f"`{m}`", str(p["num_speculative_tokens"]), f"x{p['expected_speedup']:.2f}",
                     "-" if measured is None else f"x{measured:.2f}", f"`{e['cost_profile']}`"))
    return Table(("method", "k", "predicted speedup at c=1 (`metrics/eval-bf16.json`)", "measured at c=1",
                  "cost profile"), tuple(rows))


def every_run() -> Table:
    runs = bench_runs()
    slo = params()["serving"]["slo"]
    rows = []
    for cfg in CONFIGS:
        for key in sorted(runs.get(cfg, {}), key=lambda k: (isinstance(k, tuple), k[1] if isinstance(k, tuple) else k)):
            r = runs[cfg][key]
            name = f"capacity probe c={key[1]}" if isinstance(key, tuple) else f"sweep c={key}"
            rows.append((f"`{cfg}`", name, str(r["completed"]), str(r["failed"]), f"{r['duration']:.2f}",
                         f"{r['output_throughput']:.0f}", f"{r['p99_ttft_ms']:.1f}", f"{r['p99_itl_ms']:.1f}",
                         f"{r['p99_tpot_ms']:.2f}", "yes" if within_slo(r, slo) else "no"))
    return Table(("config", "run", "requests", "failed", "duration s", "output tok/s", "p99 TTFT", "p99 ITL",
                  "p99 TPOT", "within the objective"), tuple(rows))


def starts() -> Table:
    return Table(("config", "start to ready s", "engine init"),
                 tuple((f"`{c}`", "not ready" if s is None else str(s), init or "-") for c, s, init in server_starts()))


def training() -> Table:
    p = params()
    dt = load(RUN / "metrics" / "draft_training.json")
    rec = eagle3_record()
    return facts([
        ("draft model: the target's first layers", p["draft"]["source"]["layers"]),
        ("draft model: fine-tuning steps / examples / epochs",
         f"{dt['train_steps']} / {dt['train_examples']} / {p['draft_training']['epochs']}"),
        ("draft model: eval loss untrained -> fine-tuned",
         f"{dt['eval_loss_untrained']:.3f} -> {dt['eval_loss_finetuned']:.3f}"),
        ("EAGLE-3 head: steps / seconds / device", f"{rec['train_steps']} / {rec['train_s']:.0f} / {rec['device']}"),
        ("EAGLE-3 head: final loss", f"{rec['final_loss']:.2f}"),
    ])


def not_measured() -> Table:
    ev = evals()
    secs = [s for _, s, _ in server_starts() if s is not None]
    return facts([
        ("variants without quality numbers", ", ".join(f"`{v}`" for v in variants() if v not in ev)),
        ("variants without a served result", ", ".join(f"`{v}`" for v in variants()
                                                       if not (RUN / "serve" / v / "raw").is_dir())),
        ("one `vllm serve` start, s", f"{min(secs)}-{max(secs)}"),
    ])



def second_quantize() -> Table:
    """Each variant's quantize stage in the second lease (H100), beside quantize_bench.py's CPU run of the same
    algorithm at the same calibration rows and AWQ grid, one torch thread, where one exists."""
    run_params = yaml.safe_load((RUN2 / "params.yaml").read_text())["quantize"]
    cpu = json.loads(CPU_QUANTIZE.read_text())["runs"]
    rows = []
    for v in run_params["enabled"]:
        m = json.loads((RUN2 / "metrics" / f"quantize-{v}.json").read_text())
        t = json.loads((RUN2 / "timings" / f"quantize-{v}.json").read_text())
        if m.get("algorithm") in (None, "none"):
            continue  # bf16: nothing is quantized
        n_grid = run_params["variants"].get(v, {}).get("n_grid")
        same = [r for r in cpu if r["algorithm"] == m["algorithm"] and r["calibration_samples"] == m["calibration_samples"]
                and (r["settings"].get("n_grid") or 20) == (n_grid or 20) and r.get("torch_threads") == 1]
        cpu_s = same[0]["wall_time_s"] if same else None
        rows.append((f"`{v}`", m["algorithm"], str(m["group_size"] or "-"), str(m["calibration_samples"] or "-"),
                     "-" if n_grid is None else str(n_grid), fmt(t["wall_time_s"], 1), fmt(t["peak_gpu_memory_mb"], 0),
                     fmt(m["size_after_mb"], 1), fmt(cpu_s, 1), "-" if cpu_s is None else f"x{cpu_s / t['wall_time_s']:.0f}"))
    return Table(("variant", "algorithm", "group size", "calibration rows", "AWQ grid", "H100 wall, s", "peak GPU MB",
                  "size, MB", "2-core CPU wall, s (1 thread)", "CPU / H100"), tuple(rows))


def step_time() -> Table:
    """Served time per engine step at concurrency 1, from `vllm bench serve`'s counters: a step emits one token plus
    the drafted tokens it accepted, so steps = output tokens - accepted tokens, and a step's time is the mean TPOT
    times the tokens per step; beside the step time the cost profile holds for the config at batch 1 (plain, or the
    method at the nearest k it was measured at)."""
    runs = bench_runs()
    profile = json.loads((ROOT / "pipeline/evaluate/cost_profiles" / f"{evals()['bf16']['cost_profile']}.json").read_text())
    rows = []
    for cfg in CONFIGS:
        r = runs.get(cfg, {}).get(1)
        if r is None:
            continue
        accepted = r.get("spec_decode_accepted_tokens") or 0
        per_step = r["total_output_tokens"] / (r["total_output_tokens"] - accepted)
        k = served_k(cfg)
        if cfg == "plain":
            prof, prof_k = profile["plain_step_ms"]["1"], "-"
        else:
            measured = profile["methods"][cfg]["step_ms"]
            prof_k = min(measured, key=lambda x: abs(int(x) - k))
            prof = measured[prof_k]["1"]
        rows.append((f"`{cfg}`", str(k or "-"), f"{r['mean_tpot_ms']:.2f}", f"{per_step:.2f}",
                     f"{r['mean_tpot_ms'] * per_step:.2f}", f"{prof:.2f} (k={prof_k})" if cfg != "plain" else f"{prof:.2f}"))
    return Table(("config", "k served", "mean TPOT ms", "tokens per step", "step ms, served",
                  f"step ms at batch 1, cost profile `{profile['name']}`"), tuple(rows))


def bf16_leases() -> Table:
    """The BF16 numbers every lease measured, each from its own run folder."""
    def numbers(run: Path) -> dict[str, str]:
        e = json.loads((run / "metrics" / "eval-bf16.json").read_text())
        d = json.loads((run / "metrics" / "draft_training.json").read_text())
        h = json.loads((run / "metrics" / "eagle3.json").read_text())
        out = {"held-out perplexity": fmt(e["perplexity"], 3), "lm-eval byte perplexity":
               fmt(e["lm_eval_domain_heldout_byte_perplexity"], 4),
               "draft fine-tune eval loss": fmt(d["eval_loss_finetuned"], 3),
               "EAGLE-3 head final loss / step-1 accuracy": f"{h['final_loss']:.3f} / {h['accuracy_by_step'][0]:.3f}"}
        for est in e["methods"]:
            out[f"{est['method']} accepted per drafted token at k={est['num_speculative_tokens']} (CPU estimate)"] = \
                fmt(est["accepted_per_draft_token"], 4)
        return out
    cols = [(name, numbers(run)) for name, run in LEASES]
    keys = list(cols[-1][1])
    return Table(("quantity", *(f"`{name}`" for name, _ in cols)),
                 tuple((k, *(c.get(k, "-") for _, c in cols)) for k in keys))


def speed_leases() -> Table:
    """BF16's served tokens/s per config and concurrency in the first and the third lease (same params), each with
    its ratio to that lease's own plain decoding."""
    levels = params()["serve_bench"]["concurrency"]
    first, third = bench_runs(run=RUN1), bench_runs(run=RUN)
    rows = []
    for cfg in CONFIGS:
        for c in levels:
            cells = []
            for runs in (first, third):
                r, p = runs.get(cfg, {}).get(c), runs.get("plain", {}).get(c)
                cells += (["not run", "-"] if r is None else
                          [f"{r['output_throughput']:.0f}", f"{r['output_throughput'] / p['output_throughput']:.2f}x"])
            rows.append((f"`{cfg}`", str(c), *cells))
    return Table(("config", "concurrency", "`smollm2-gpu` tok/s", "vs its plain", "`smollm2-gpu-3` tok/s",
                  "vs its plain"), tuple(rows))


def capacity() -> Table:
    """serve_bench@bf16's capacity search per config (its record): the largest closed-loop load whose p99 latencies
    met serving.slo, and what it carried there, against plain decoding in the same run."""
    rec = serve_record()
    plain = rec["configs"]["plain"]["capacity"]
    rows = []
    for cfg, result in rec["configs"].items():
        cap = result["capacity"]
        rows.append((f"`{cfg}`", str(result["num_speculative_tokens"] or "-"), cap["status"],
                     f"{cap['users_per_gpu']:.0f}", f"{cap['users_per_gpu'] / plain['users_per_gpu']:.2f}x",
                     f"{cap['output_tokens_per_s_per_gpu']:.0f}",
                     f"{cap['output_tokens_per_s_per_gpu'] / plain['output_tokens_per_s_per_gpu']:.2f}x",
                     f"{cap['request_goodput']:.1f}"))
    return Table(("config", "k", "search ended", "users per GPU at the SLO", "vs plain", "output tok/s per GPU there",
                  "vs plain", "request goodput, req/s"), tuple(rows))


def bench_time() -> Table:
    """Per config of serve_bench@bf16 in the first lease (each sweep level and capacity probe its own `vllm bench
    serve` process) and the third (one kept bench worker per stage, pipeline/serving/bench_worker.py): from the server
    log's first line to ready, and from ready to the API server's shutdown (the sweep and the capacity probes)."""
    rows = []
    for cfg in CONFIGS:
        cells = []
        for run in (RUN1, RUN):
            first, ready, down = server_moments(cfg, run)
            n = len(bench_runs(run=run).get(cfg, {}))
            cells += ["-" if ready is None else str(int((ready - first).total_seconds())),
                      "did not end (lease over)" if down is None or ready is None
                      else str(int((down - ready).total_seconds())), str(n)]
        rows.append((f"`{cfg}`", *cells))
    return Table(("config", "`smollm2-gpu`: start to ready s", "ready to shutdown s", "bench runs",
                  "`smollm2-gpu-3`: start to ready s", "ready to shutdown s", "bench runs"), tuple(rows))


BLOCKS = {"setup": setup, "progress": progress, "sweep-progress": sweep_progress, "stages": stages,
          "quality": quality, "thresholds": thresholds, "gate": gate, "drafts-per-step": drafts_per_step,
          "acceptance": acceptance, "eagle3-head": eagle3_head, "speed": speed, "predicted": predicted,
          "every-run": every_run, "starts": starts, "training": training, "not-measured": not_measured,
          "second-quantize": second_quantize, "bf16-leases": bf16_leases, "speed-leases": speed_leases,
          "capacity": capacity, "bench-time": bench_time, "step-time": step_time}
