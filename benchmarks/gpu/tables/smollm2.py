"""Tables of benchmarks/gpu/SMOLLM2-GPU.md: SmolLM2-135M-Instruct through the pipeline on the GPU, lease by lease.

Reads the six leases' folders under raw/: smollm2-gpu-4 (every evaluate stage, serve_bench@gptq-w4a16 whole with its
record, serve_bench@fp8-dynamic in part) for the run's progress, quality, gate and the served GPTQ W4A16 tables;
smollm2-gpu-3 for serve_bench@bf16 (the one lease that served BF16 whole, its record) and its gate; smollm2-gpu-5
(serve_bench@fp8-static and @awq-w4a16 whole) and smollm2-gpu-6 (serve_bench@fp8-dynamic whole) beside those two
where every variant as served is compared, each against its own plain decoding; the first two where leases are
compared; raw/greedy-determinism for the repeatability of batched greedy generation on the H100; costs/lease-3's
logs (the runs of the cost profile the estimates used) for how vLLM scheduled each method there. Each lease's folder
holds the run's params.yaml, its timestamped repro.log, metrics/ and eval/<variant>/ of the stages that finished, the
stage records, `vllm bench serve`'s results (serve/<variant>/raw/*.json.gz) and the stage and server logs. Every
number in the report is computed here from those files; the decisions are the pipeline's own
(serve_bench.choose_kernel) over the records.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import sys
from datetime import datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.evaluate.summary import current_names  # noqa: E402  (the runs' older metric names)
from pipeline.serving.bench_record import ServeBenchRecord  # noqa: E402
from render import Table, Text, facts  # noqa: E402
from stages.serve_bench import choose_kernel  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
RUN = RAW / "smollm2-gpu-4"  # the fourth lease: every evaluate stage, serve_bench@gptq-w4a16 whole (its record)
RUN1 = RAW / "smollm2-gpu"  # the first lease: serve_bench@bf16's sweep without its record
RUN2 = RAW / "smollm2-gpu-2"  # a second lease of the same profile: through evaluate@bf16 and every quantize stage
RUN3 = RAW / "smollm2-gpu-3"  # the third lease: serve_bench@bf16 whole (its record), evaluate@gptq-w4a16
RUN5 = RAW / "smollm2-gpu-5"  # the fifth: serve_bench@fp8-static and @awq-w4a16 whole, @fp8-dynamic in part
RUN6 = RAW / "smollm2-gpu-6"  # the sixth: serve_bench@fp8-dynamic whole
GREEDY = RAW / "greedy-determinism"  # benchmarks/gpu/greedy_determinism.py on the H100
RUNS = ("smollm2-gpu", "smollm2-gpu-2", "smollm2-gpu-3", "smollm2-gpu-4", "smollm2-gpu-5", "smollm2-gpu-6",
        "greedy-determinism", "costs/lease-3")  # costs/lease-3: the runs of the cost profile the estimates used
LEASES = (("smollm2-gpu", RUN1), ("smollm2-gpu-2", RUN2), ("smollm2-gpu-3", RUN3), ("smollm2-gpu-4", RUN),
          ("smollm2-gpu-5", RUN5), ("smollm2-gpu-6", RUN6))
BEFORE = LEASES[:3]  # the leases before the fourth, whose folder (RUN) the run sections read
CPU_QUANTIZE = ROOT / "benchmarks/raw/quantize-smollm2.json"  # quantize_bench.py on the 2-core CPU
METHODS = ("draft_model", "eagle3", "ngram")
CONFIGS = ("plain", *METHODS)
BASELINE = "bf16"
GPTQ = "gptq-w4a16"
AWQ = "awq-w4a16"
FP8_PART = "fp8-dynamic-unfinished"  # serve_bench@fp8-dynamic's temporary folder when the lease ended
# Published vLLM runs of EAGLE-3 on Llama-3.1-8B-Instruct over MT-Bench accept about this share of drafted tokens
# (mean accepted length 2.4-3.5 at k = 2-7): quoted, not measured here; the prose cites the source's words.
PUBLISHED_EAGLE3_RATIO = (0.5, 0.7)
PREDICTION_TOLERANCE = 0.20  # CAPACITY.md's target for a predicted served speedup: within 20% of the served one
SOURCES_STAGE = "stages/dvc.yaml:sources"  # DVC's name for the sources stage since it moved to its own file


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


def pct(ratio: float) -> str:
    """A ratio as a signed percentage change."""
    return f"{100 * (ratio - 1):+.1f}%"


def params(run: Path = RUN) -> dict:
    return yaml.safe_load((run / "params.yaml").read_text())


def variants(run: Path = RUN) -> list[str]:
    return list(params(run)["quantize"]["enabled"])


def repro_lines(run: Path = RUN, log: str = "repro.log") -> list[tuple[int, str]]:
    """The run's `dvc repro` log lines as (seconds into `dvc repro`, text); the run timestamped each line."""
    out = []
    for line in (run / log).read_text().splitlines():
        m = re.match(r"^(\d+) (.*)$", line)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def stage_times(lines) -> list[tuple[str, int, int, bool]]:
    """(stage, start s, end s, finished): a stage runs from its 'Running stage' line to the next one's (DVC's lock
    update included); the last one to the log's last line, finished if DVC updated its lock after it. The sources
    stage keeps its old name (`sources`) after its move to stages/dvc.yaml."""
    starts = [(i, t, re.search(r"Running stage '([^']+)'", s).group(1).replace(SOURCES_STAGE, "sources"))
              for i, (t, s) in enumerate(lines) if "Running stage '" in s]
    last = lines[-1][0]
    locked_at_end = any("Updating lock file" in s for _, s in lines[starts[-1][0]:])
    return [(name, t, starts[n + 1][1] if n + 1 < len(starts) else last, n + 1 < len(starts) or locked_at_end)
            for n, (_, t, name) in enumerate(starts)]


def stage_seconds(run: Path) -> dict[str, tuple[int, bool]]:
    """Each stage's first run in the lease: (seconds, finished)."""
    out: dict[str, tuple[int, bool]] = {}
    for name, start, end, done in stage_times(repro_lines(run)):
        out.setdefault(name, (end - start, done))
    return out


def stage_summary_line(lines, stage: str) -> str | None:
    """The stage's own one-line summary (the line the stage prints that starts with its name)."""
    base = stage.split("@")[0]
    for _, s in lines:
        if "%|" in s or "it/s]" in s or "s/it]" in s:  # progress bars
            continue
        if s.startswith(f"{base} ") or s.startswith(f"{base}:") or s.startswith(f"{base} ("):
            if stage == base or stage.split("@")[1] in s.split(":")[0]:
                return s
    return None


def bench_runs(variant: str, run: Path) -> dict:
    """config -> {concurrency: result, ('capacity', c): result} from `vllm bench serve`'s raw JSON."""
    runs: dict = {}
    for f in sorted((run / "serve" / variant / "raw").glob("*.json.gz")):
        m = re.match(r"^(.+?)-(capacity-)?c(\d+)\.json\.gz$", f.name)
        config, capacity, c = m.group(1), bool(m.group(2)), int(m.group(3))
        runs.setdefault(config, {})[("capacity", c) if capacity else c] = load(f)
    return runs


def sweep_levels(results: dict) -> list[int]:
    return sorted(k for k in results if isinstance(k, int))


def served_k(config: str, variant: str, run: Path) -> int | None:
    path = run / "serve" / variant / f"serve-{config}.yaml"
    if not path.is_file():
        return None
    spec = (yaml.safe_load(path.read_text()) or {}).get("speculative-config") or {}
    return spec.get("num_speculative_tokens")


def evals(run: Path = RUN) -> dict[str, dict]:
    return {v: current_names(load(run / "metrics" / f"eval-{v}.json")) for v in variants(run)
            if (run / "metrics" / f"eval-{v}.json").is_file()}


def eagle3_record(run: Path = RUN) -> dict:
    rec = load(run / "metrics" / "eagle3.json")
    if (run / "timings" / "eagle3.json").is_file():  # runs since timings left metrics/: seconds in timings/
        rec = {**rec, **load(run / "timings" / "eagle3.json")}
    return rec


def server_configs(variant: str, run: Path) -> list[str]:
    """The configs whose `vllm serve` log the stage wrote, in the order they were served (the log's first line)."""
    names = [f.name[len(f"serve_bench@{variant}."):-len("-server.log")]
             for f in (run / "logs").glob(f"serve_bench@{variant}.*-server.log")]
    return sorted(names, key=lambda c: server_moments(c, run, variant)[0])


def server_starts(variant: str, run: Path) -> list[tuple[str, int | None, str]]:
    """(config, seconds from the server log's first line to vLLM's 'Available routes' line, its engine-init line)."""
    out = []
    for config in sorted(server_configs(variant, run)):
        first, ready, _ = server_moments(config, run, variant)
        text = (run / "logs" / f"serve_bench@{variant}.{config}-server.log").read_text()
        init = re.findall(r"init engine \(profile, create kv cache, warmup model\) took "
                          r"([0-9.]+ s \(compilation: [0-9.]+ s\))", text)
        secs = int((ready - first).total_seconds()) if ready and first else None
        out.append((config, secs, "; ".join(init)))
    return out


def server_moments(config: str, run: Path, variant: str = BASELINE
                   ) -> tuple[datetime, datetime | None, datetime | None]:
    """The server log's first line, its 'Available routes' line and the API server's shutdown line."""
    text = (run / "logs" / f"serve_bench@{variant}.{config}-server.log").read_text()

    def stamp(pattern: str) -> datetime | None:
        m = re.search(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) " + pattern, text)
        return datetime.strptime(m.group(1), "%m-%d %H:%M:%S") if m else None

    return stamp(""), stamp(r"\[[^]]+\] Available routes"), stamp(r"\[[^]]+\] \[shutdown\] API server: shutdown triggered")


def serve_record(variant: str, run: Path) -> dict:
    return load(run / "serve" / variant / "record.json")


def typed_record(variant: str, run: Path) -> ServeBenchRecord:
    return records.read(ServeBenchRecord, run / "serve" / variant / "record.json")


def served_variants() -> list[tuple[str, str, Path]]:
    """(variant, lease, folder) for each variant whose serve_bench stage ran to its record on the H100, in
    quantize.enabled order (the newest such lease where several did)."""
    out = []
    for v in variants():
        whole = [(name, run) for name, run in LEASES if (run / "serve" / v / "record.json").is_file()]
        if whole:
            out.append((v, *whole[-1]))
    return out


def within_slo(r: dict, slo: dict) -> bool:
    return r["p99_ttft_ms"] <= slo["p99_ttft_ms"] and r["p99_itl_ms"] <= slo["p99_itl_ms"] and not r["failed"]


def kernel_configs(variant: str, run: Path) -> list[str]:
    """The served configs in the stage's order: plain on each kernel it compared (or plain), then each method. A
    stage that compared kernels also wrote the chosen kernel's results as `plain`: the same bytes, checked here."""
    runs = bench_runs(variant, run)
    kernels = [c for c in runs if c.startswith("plain-")]
    for k in kernels:
        if k == f"plain-{serve_record(variant, run)['kernel']}":
            for key, result in runs[k].items():
                assert runs["plain"][key] == result, (variant, k, key)
    return [*(sorted(kernels) or ["plain"]), *(m for m in METHODS if m in runs)]


def gate_sections(run: Path) -> dict[str, tuple[str, str]]:
    """gate.txt per variant: (the command and its output, the verdict line's text after 'gate <variant>: ')."""
    out = {}
    for section in re.split(r"^(?=\$ )", (run / "gate.txt").read_text(), flags=re.M):
        m = re.search(r"--variant (\S+)", section)
        if m:
            verdict = re.search(rf"^gate {re.escape(m.group(1))}: (.*)$", section, re.M)
            out[m.group(1)] = (section.rstrip(), verdict.group(1) if verdict else "")
    return out


def gate_failures(run: Path, variant: str) -> list[tuple[str, str]]:
    """(check, why) for each check the gate failed for the variant, read off its 'error: gate failed:' line."""
    text, _ = gate_sections(run)[variant]
    m = re.search(r"^error: gate failed: (.*)$", text, re.M)
    if not m:
        return []
    out = []
    for part in re.split(r"; (?=[\w.-]+: )", m.group(1)):
        name, _, rest = part.partition(": ")
        if name != variant:
            continue
        check, why = re.match(r"(\w+) \((.*)\)$", rest).groups()
        out.append((check, why))
    return out


# -- the run --------------------------------------------------------------------------------------------------


def setup() -> Table:
    p = params()
    sb = p["serve_bench"]
    first = min(r["date"] for v in (GPTQ, FP8_PART) for results in bench_runs(v, RUN).values()
                for r in results.values())
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
        ("serving.target_concurrency / serve_bench.kernel_tie", f"{p['serving']['target_concurrency']} / "
                                                                f"{sb['kernel_tie']}"),
        ("the same params.yaml in", ", ".join(f"`{name}`" for name, run in LEASES if run != RUN and params(run) == p)),
        ("first `vllm bench serve` run (UTC)", f"{first[:4]}-{first[4:6]}-{first[6:8]} {first[9:11]}:{first[11:13]}"),
    ], header=("setting (the run's params.yaml, gpu.txt, results)", "value"))


def ran_whole_elsewhere(stage: str) -> str | None:
    """Another lease where the stage ran to its end (the newest), if one did."""
    for name, run in reversed(LEASES):
        if run != RUN and stage_seconds(run).get(stage, (0, False))[1]:
            return name
    return None


def progress() -> Table:
    p = params()
    stages = stage_times(repro_lines())
    ran = {name for name, *_ in stages}
    last_name, last_start, last_end, _ = stages[-1]
    never = [f"{s}@{v}" for s in ("quantize", "evaluate", "serve_bench") for v in p["quantize"]["enabled"]
             if f"{s}@{v}" not in ran]
    never += [s for s in ("evaluate_draft", "gate", "bundle", "publish") if s not in ran]

    def name(stage: str) -> str:
        other = ran_whole_elsewhere(stage)
        return f"`{stage}`" + (f" (ran whole in `{other}`)" if other else "")

    return facts([
        ("stage running when the run ended", f"`{last_name}`"),
        ("its start, s into `dvc repro`", last_start),
        ("the log's last line, s", last_end),
        ("stages never started", ", ".join(name(s) for s in never)),
    ])


def sweep_progress() -> Table:
    levels = params()["serve_bench"]["concurrency"]
    rows = []
    for variant, stage in ((GPTQ, GPTQ), (FP8_PART, "fp8-dynamic")):
        runs = bench_runs(variant, RUN)
        configs = kernel_configs(variant, RUN) if variant == GPTQ else [c for c in CONFIGS if c in runs]
        for config in configs:
            results = runs[config]
            rows.append((f"`{variant}`", f"`{config}`", ", ".join(map(str, sweep_levels(results))),
                         "yes" if all(c in results for c in levels) else "no",
                         ", ".join(str(k[1]) for k in results if isinstance(k, tuple)) or "-"))
        for f in sorted((RUN / "serve" / variant).glob("serve-*.yaml")):
            config = f.stem[len("serve-"):]
            if config not in runs:
                _, ready, _ = server_moments(config, RUN, stage)
                rows.append((f"`{variant}`", f"`{config}`", "none: its `vllm serve` "
                             + ("was ready" if ready else "had not answered yet") + " when the lease ended", "no", "-"))
    return Table(("serve folder", "config", "sweep concurrency run", "sweep complete", "capacity probes at"),
                 tuple(rows))


def stages() -> Table:
    lines = repro_lines()
    rows = []
    for name, start, end, done in stage_times(lines):
        summary = stage_summary_line(lines, name) or ""
        rows.append((f"`{name}`", str(start), f"{end - start}{'' if done else ' to the last line (unfinished)'}",
                     summary.replace("|", "/")[:220]))
    return Table(("stage", "start s", "s", "what it printed"), tuple(rows))


def stage_leases() -> Table:
    """Each stage's seconds (its first run in the lease) in every lease that started it."""
    per = [(name, stage_seconds(run)) for name, run in LEASES]
    order = list(dict.fromkeys([*stage_seconds(RUN), *(s for _, secs in per for s in secs)]))

    def cell(secs, stage):
        if stage not in secs:
            return "-"
        s, done = secs[stage]
        return f"{s}" if done else f"{s} (unfinished)"

    return Table(("stage", *(f"`{name}`" for name, _ in per)),
                 tuple((f"`{s}`", *(cell(secs, s) for _, secs in per)) for s in order))


def stage_note() -> Text:
    secs = stage_seconds(RUN)
    now = {v: secs[f"evaluate@{v}"][0] for v in variants() if f"evaluate@{v}" in secs}
    before = [sec for name, run in BEFORE for stage, (sec, done) in stage_seconds(run).items()
              if stage.startswith("evaluate@") and done]
    serve = secs[f"serve_bench@{GPTQ}"][0]
    n = len(server_configs(GPTQ, RUN))
    return Text(f"In this lease an `evaluate` stage took {min(now.values())}-{max(now.values())} s per variant "
                f"({len(now)} variants) against {min(before)}-{max(before)} s in the earlier leases; "
                f"`serve_bench@{GPTQ}` took {serve} s for its {n} `vllm serve` configs (plain on each of its "
                f"kernels and the {len(METHODS)} methods), each with its sweep and capacity search.")


# -- quality and the gate -------------------------------------------------------------------------------------


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


QUALITY_CHECKS = (("max_perplexity_increase_pct", "perplexity_increase_pct", "{:+.2f}%"),
                  ("max_kl_divergence", "kl_divergence", "{:.4f}"),
                  ("min_top1_agreement", "top1_agreement", "{:.3f}"),
                  ("max_heldout_perplexity", "perplexity", "{:.2f}"))


def quality_gate() -> Table:
    """Each variant's fidelity metrics against its thresholds (params.yaml, overrides applied), and the gate's
    verdict and failed checks as gate.txt has them."""
    g = params()["gates"]
    ev = evals()
    verdicts = gate_sections(RUN)
    rows = []
    for v in variants():
        limits = {**g["thresholds"], **(g.get("overrides") or {}).get(v, {})}
        cells = []
        for check, key, form in QUALITY_CHECKS:
            x, limit = ev[v][key], limits[check]
            ok = x <= limit if check.startswith("max_") else x >= limit
            cells.append(f"{form.format(x)} (needs {'<=' if check.startswith('max_') else '>='} {limit}: "
                         f"{'meets' if ok else 'fails'})")
        failed = "; ".join(f"`{c}`: {why}" for c, why in gate_failures(RUN, v)) or "-"
        rows.append((f"`{v}`", *cells, verdicts[v][1] if v in verdicts else "not gated", failed))
    return Table(("variant", *(f"{key} (`{check}`)" for check, key, _ in QUALITY_CHECKS),
                  "gate (`gate.txt`)", "failed checks (`gate.txt`)"), tuple(rows))


def gate() -> Text:
    return Text("```\n" + (RUN / "gate.txt").read_text().rstrip() + "\n```")


def bf16_gate() -> Text:
    return Text("```\n" + gate_sections(RUN3)[BASELINE][0] + "\n```")


def variant_numbers(run: Path, variant: str) -> dict[str, str]:
    """The variant's evaluate numbers in one lease: quality against BF16 and the CPU acceptance estimate."""
    e = json.loads((run / "metrics" / f"eval-{variant}.json").read_text())
    out = {"held-out perplexity": fmt(e["perplexity"], 3), "KL / top-1": f"{e['kl_divergence']:.4f} / "
           f"{e['top1_agreement']:.4f}", "greedy match (16 prompts)": fmt(e["greedy_match"], 4),
           "lm-eval byte perplexity": fmt(e["lm_eval_domain_heldout_byte_perplexity"], 4)}
    for est in e["methods"]:
        out[f"{est['method']}: k / accepted per drafted token (CPU estimate)"] = \
            f"{est['num_speculative_tokens']} / {est['accepted_per_draft_token']:.4f}"
    return out


def lease_table(cols: list[tuple[str, dict[str, str]]]) -> Table:
    keys = list(dict.fromkeys(k for _, c in reversed(cols) for k in c))
    return Table(("quantity", *(f"`{name}`" for name, _ in cols)),
                 tuple((k, *(c.get(k, "-") for _, c in cols)) for k in keys))


def gptq_leases() -> Table:
    """gptq-w4a16's evaluate numbers in the two leases that ran evaluate@gptq-w4a16 (same params)."""
    return lease_table([(name, variant_numbers(run, GPTQ)) for name, run in LEASES
                        if (run / "metrics" / f"eval-{GPTQ}.json").is_file()])


# -- BF16 as served (the third lease's serve_bench@bf16) ------------------------------------------------------


def drafts_per_step(variant: str = BASELINE, run: Path = RUN3) -> Table:
    runs = bench_runs(variant, run)
    rows = []
    for m in METHODS:
        if m not in runs:
            continue
        levels = sweep_levels(runs[m])
        drafted = sum(runs[m][c]["spec_decode_draft_tokens"] for c in levels)
        drafts = sum(runs[m][c]["spec_decode_num_drafts"] for c in levels)
        rows.append((f"`{m}`", str(served_k(m, variant, run)), f"{drafted / drafts:.2f}"))
    return Table(("method", "k served", "drafted tokens / drafts (vLLM's counters, sweep levels)"), tuple(rows))


def estimate_at(est: dict, k: int | None) -> tuple[float | None, float | None]:
    """The estimate's accepted/drafted and mean accepted length at k (a drafting step drafts k tokens)."""
    if not k:
        return None, None
    acc, dr = est["accepted_per_step_by_k"][str(k)], est["drafted_per_step_by_k"][str(k)]
    return acc / dr, 1 + acc * k / dr


def served_acceptance(variant: str, run: Path) -> dict[str, tuple[int, int, int]]:
    """method -> (drafted, accepted, drafts) summed over the sweep levels."""
    runs = bench_runs(variant, run)
    out = {}
    for m in METHODS:
        levels = sweep_levels(runs.get(m, {}))
        if levels:
            out[m] = tuple(sum(runs[m][c][f"spec_decode_{key}"] for c in levels)
                           for key in ("draft_tokens", "accepted_tokens", "num_drafts"))
    return out


def acceptance(variant: str = BASELINE, run: Path = RUN3, estimate_variant: str | None = None) -> Table:
    runs = bench_runs(variant, run)
    rows = []
    for m in METHODS:
        k = served_k(m, variant, run)
        est_ratio, est_len = estimate_at(load(run / "eval" / (estimate_variant or variant) / f"speculative-{m}.json"), k)
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


def acceptance_note(variant: str = BASELINE, run: Path = RUN3) -> Text:
    """The estimate against vLLM's served accepted/drafted over the sweep, per method, in words."""
    parts = []
    for m, (drafted, accepted, _) in served_acceptance(variant, run).items():
        est, _ = estimate_at(load(run / "eval" / variant / f"speculative-{m}.json"), served_k(m, variant, run))
        served = accepted / drafted
        side = "above" if est > served else "below"
        parts.append(f"{abs(est - served):.3f} {side} it for `{m}` ({est:.3f} vs {served:.3f})")
    return Text("Over the sweep, the estimate's accepted/drafted is " + ", ".join(parts[:-1])
                + f" and {parts[-1]}.")


def eagle3_head() -> Table:
    rec = eagle3_record(RUN3)
    est = load(RUN3 / "eval" / BASELINE / "speculative-eagle3.json")
    served = [r for key, r in bench_runs(BASELINE, RUN3).get("eagle3", {}).items() if isinstance(key, int)]
    ratio = (sum(r["spec_decode_accepted_tokens"] for r in served) / sum(r["spec_decode_draft_tokens"] for r in served)
             if served else None)
    lo, hi = PUBLISHED_EAGLE3_RATIO
    rows = [("training steps", rec["train_steps"]),
            ("trainable parameters", f"{rec['trainable_parameters']:,}"),
            ("draft vocabulary", rec["draft_vocab_size"]),
            ("aux layers", rec["aux_layers"]),
            ("final loss", f"{rec['final_loss']:.2f}"),
            ("accuracy by step", ", ".join(f"{a:.3f}" for a in rec["accuracy_by_step"])),
            ("k served", served_k("eagle3", BASELINE, RUN3))]
    for k in (2, 4, 7):
        if str(k) in est["accepted_per_step_by_k"]:
            r, length = estimate_at(est, k)
            rows.append((f"estimate at k={k}: accepted/drafted / mean accepted length", f"{r:.3f} / {length:.2f}"))
    rows.append(("served accepted/drafted over the sweep", fmt(ratio)))
    if ratio is not None:
        where = "below" if ratio < lo else "within" if ratio <= hi else "above"
        rows.append((f"against the published {lo}-{hi}", where))
    return facts(rows, header=("EAGLE-3 head (`metrics/eagle3.json`, the estimate, the served counters)", "value"))


def speed_cells(variant: str, run: Path, cfg: str, against: dict | None = None) -> list[str]:
    """A config's output tokens/s at each sweep level and its ratio to the variant's own plain decoding in the same run
    (the chosen kernel's, where the stage compared kernels); given another run's plain results (`against`), the ratio
    to those too."""
    runs = bench_runs(variant, run)
    cells = []
    for c in params(run)["serve_bench"]["concurrency"]:
        t = runs[cfg][c]["output_throughput"]
        cells += [f"{t:.0f}", f"{t / runs['plain'][c]['output_throughput']:.2f}x"]
        if against is not None:
            cells.append(f"{t / against[c]['output_throughput']:.2f}x")
    return cells


def speed_table(variant: str, run: Path, against: tuple[str, dict] | None = None) -> Table:
    """The variant's output tokens/s per config and sweep level against its own plain decoding; `against`: (a label,
    another run's plain results) for a ratio across runs."""
    levels = params(run)["serve_bench"]["concurrency"]
    label, plain = against or (None, None)
    rows = tuple((f"`{cfg}`", str(served_k(cfg, variant, run) or "-"), *speed_cells(variant, run, cfg, plain))
                 for cfg in kernel_configs(variant, run))
    header = tuple(h for c in levels for h in (f"c={c} tok/s", "vs its plain", *((label,) if label else ())))
    return Table(("config", "k", *header), rows)


def speed() -> Table:
    return speed_table(BASELINE, RUN3)


def predicted_rows(variant: str, run: Path) -> list[dict]:
    """Per method: the evaluate stage's predicted served speedup over plain decoding at the k served, at c=1 (the eval
    summary's `expected_speedup`, the same number as speculative-<method>.json's at c=1) and c=32
    (speculative-<method>.json; the summary holds other concurrencies for its chosen method only), beside the
    served ratio to the variant's own plain decoding."""
    runs = bench_runs(variant, run)
    summary = {m["method"]: m for m in load(run / "eval" / variant / "summary.json")["speculation"]["methods"]}
    rows = []
    for m in METHODS:
        est = load(run / "eval" / variant / f"speculative-{m}.json")
        k = served_k(m, variant, run)
        by_c = est["served"]["speedup_by_k"]
        assert summary[m]["num_speculative_tokens"] == k and summary[m]["expected_speedup"] == by_c["1"][str(k)]
        rows.append({"method": m, "k": k, "profile": est["served"]["profile"],
                     **{c: (by_c[str(c)][str(k)],
                            runs[m][c]["output_throughput"] / runs["plain"][c]["output_throughput"]) for c in (1, 32)}})
    return rows


def predicted_cells(row: dict, tie: float) -> list[str]:
    """predicted, served (each with its side of 1.0: a served ratio within serve_bench.kernel_tie is a tie),
    predicted / served and the 20% test, at c=1 and at c=32."""
    def side(x: float) -> str:
        return "within the tie" if abs(x - 1) <= tie else "faster" if x > 1 else "slower"

    cells = []
    for c in (1, 32):
        pred, served = row[c]
        cells += [f"x{pred:.2f} ({side(pred)})", f"x{served:.2f} ({side(served)})", f"{pred / served:.2f}",
                  "yes" if abs(pred / served - 1) <= PREDICTION_TOLERANCE else "no"]
    return cells


PREDICTED_COLUMNS = tuple(h for c in (1, 32) for h in (f"predicted c={c}", f"served c={c}", "predicted / served",
                                                         f"within {PREDICTION_TOLERANCE:.0%}"))


def predicted_table(variant: str, run: Path) -> Table:
    tie = params(run)["serve_bench"]["kernel_tie"]
    rows = tuple((f"`{r['method']}`", str(r["k"]), *predicted_cells(r, tie), f"`{r['profile']}`")
                 for r in predicted_rows(variant, run))
    return Table(("method", "k", *PREDICTED_COLUMNS, "cost profile"), rows)


def predicted() -> Table:
    return predicted_table(BASELINE, RUN3)


def predicted_note() -> Text:
    """Which predictions land on the measured side of 1.0 at c=1 (BF16, third lease), in words."""
    runs = bench_runs(BASELINE, RUN3)
    plain = runs["plain"][1]["output_throughput"]
    first = bench_runs(BASELINE, RUN1)
    parts = []
    for p in evals(RUN3)[BASELINE]["methods"]:
        m, pred = p["method"], p["estimated_speedup"]
        meas = runs[m][1]["output_throughput"] / plain
        same = (pred >= 1) == (meas >= 1)
        extra = ""
        if m == "eagle3" and m in first and 1 in first[m]:
            extra = f"; x{first[m][1]['output_throughput'] / first['plain'][1]['output_throughput']:.2f} in the first lease"
        parts.append(f"`{m}` x{pred:.2f} predicted, x{meas:.2f} measured "
                     f"({'the same side of 1.0' if same else 'the other side of 1.0'}{extra})")
    return Text("At concurrency 1: " + "; ".join(parts) + ".")


def every_run(variant: str = BASELINE, run: Path = RUN3, configs: tuple[str, ...] | None = None) -> Table:
    runs = bench_runs(variant, run)
    slo = params(run)["serving"]["slo"]
    rows = []
    for cfg in configs or CONFIGS:
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
                 tuple((f"`{c}`", "not ready" if s is None else str(s), init or "-")
                       for c, s, init in server_starts(BASELINE, RUN3)))


def step_rows(variant: str, run: Path, configs) -> list[tuple]:
    """(config, k, mean TPOT, tokens per step, served step ms, profile step ms, profile k) at concurrency 1."""
    runs = bench_runs(variant, run)
    profile_name = evals(run)[variant if variant in evals(run) else BASELINE]["cost_profile"]
    profile = json.loads((ROOT / "data/serving-cost-profiles" / f"{profile_name}.json").read_text())
    rows = []
    for cfg in configs:
        r = runs.get(cfg, {}).get(1)
        if r is None:
            continue
        accepted = r.get("spec_decode_accepted_tokens") or 0
        per_step = r["total_output_tokens"] / (r["total_output_tokens"] - accepted)
        k = served_k(cfg, variant, run)
        if cfg.startswith("plain"):
            prof, prof_k = profile["plain_step_ms"]["1"], None
        else:
            measured = profile["methods"][cfg]["step_ms"]
            prof_k = min(measured, key=lambda x: abs(int(x) - k))
            prof = measured[prof_k]["1"]
        rows.append((cfg, k, r["mean_tpot_ms"], per_step, r["mean_tpot_ms"] * per_step, prof, prof_k, profile["name"]))
    return rows


def step_time() -> Table:
    """Served time per engine step at concurrency 1, from `vllm bench serve`'s counters: a step emits one token plus
    the drafted tokens it accepted, so steps = output tokens - accepted tokens, and a step's time is the mean TPOT
    times the tokens per step; beside the step time the cost profile holds for the config at batch 1 (plain, or the
    method at the nearest k it was measured at)."""
    return step_table(step_rows(BASELINE, RUN3, CONFIGS))


def step_table(rows) -> Table:
    """step_rows as a table: served step time beside the cost profile's at batch 1."""
    return Table(("config", "k served", "mean TPOT ms", "tokens per step", "step ms, served",
                  f"step ms at batch 1, cost profile `{rows[0][7]}`"),
                 tuple((f"`{c}`", str(k or "-"), f"{tpot:.2f}", f"{per:.2f}", f"{step:.2f}",
                        f"{prof:.2f}" if pk is None else f"{prof:.2f} (k={pk})")
                       for c, k, tpot, per, step, prof, pk, _ in rows))


def step_note() -> Text:
    by = {r[0]: r for r in step_rows(BASELINE, RUN3, CONFIGS)}
    _, k, _, _, step, prof, pk, _ = by["ngram"]
    below = [f"`{m}`" for m in ("draft_model", "eagle3") if by[m][4] < by[m][5]]
    return Text(f"An n-gram step served on real text at k = {k} took {step:.2f} ms against the profile's {prof:.2f} ms, "
                f"which was measured with random weights at k = {pk} only; "
                + (" and ".join(below) + " steps came in below their profile entries." if below else
                   "the other methods' steps came in above their profile entries."))


# -- GPTQ W4A16 as served (this lease's serve_bench@gptq-w4a16) -------------------------------------------------


def geometric_mean(values) -> float:
    values = list(values)
    return math.prod(values) ** (1 / len(values))


def kernel_table(variant: str, run: Path) -> Table:
    """Plain decoding of a W4A16 variant on each GEMM kernel the stage compared (its record's `kernels`)."""
    rec = serve_record(variant, run)
    levels = params(run)["serve_bench"]["concurrency"]
    rows = []
    for name, config in rec["kernels"].items():
        tok = [config["levels"][f"c{c}"]["output_throughput"] for c in levels]
        tpot = [config["levels"][f"c{c}"]["tpot_ms"]["mean"] for c in levels]
        cap = config["capacity"]
        rows.append((f"`{name}`", *(f"{t:.0f}" for t in tok), f"{geometric_mean(tok):.0f}", *(f"{t:.2f}" for t in tpot),
                     f"{cap['output_tokens_per_s_per_gpu']:.0f} at {cap['users_per_gpu']:.0f} users ({cap['status']})",
                     f"{config['startup_s']:.0f}", ", ".join(config["kernels_used"])))
    return Table(("kernel", *(f"c={c} tok/s" for c in levels), "geometric mean over the sweep",
                  *(f"c={c} mean TPOT ms" for c in levels), "at the capacity search's end, tok/s",
                  "`vllm serve` start s (record)", "GEMM kernels in vLLM's log"), tuple(rows))


def kernel_choice(variant: str, run: Path) -> Table:
    """The stage's kernel choice over its record: the first kernel compared against the second, and the rule."""
    rec = typed_record(variant, run)
    p = params(run)
    target, tie = p["serving"]["target_concurrency"], p["serve_bench"]["kernel_tie"]
    levels = p["serve_bench"]["concurrency"]
    names = list(rec.kernels)
    first, second = names[0], names[1]
    a, b = rec.kernels[first], rec.kernels[second]
    rows = [(f"`{first}`'s output tok/s against `{second}`'s at c={c}",
             pct(a.at(c).output_throughput / b.at(c).output_throughput)) for c in levels]
    rows.append((f"`{first}`'s output tok/s against `{second}`'s, geometric mean over the sweep",
                 pct(geometric_mean(a.at(c).output_throughput for c in levels)
                     / geometric_mean(b.at(c).output_throughput for c in levels))))
    rows += [(f"`{first}`'s mean TPOT against `{second}`'s at c={c} (negative: faster per token)",
              pct(a.at(c).tpot_ms["mean"] / b.at(c).tpot_ms["mean"])) for c in levels]
    faster_at_target = choose_kernel(rec.kernels, target, 0.0)
    rows += [(f"faster at serving.target_concurrency ({target}) alone", f"`{faster_at_target}`"),
             (f"within serve_bench.kernel_tie ({tie:.0%}) of each other there",
              "yes" if min(a.at(target).output_throughput, b.at(target).output_throughput)
              >= max(a.at(target).output_throughput, b.at(target).output_throughput) * (1 - tie) else "no"),
             ("the stage's pick (the record's `kernel`), every other config served on it", f"`{rec.kernel}`"),
             ("`choose_kernel` over the record now", f"`{choose_kernel(rec.kernels, target, tie)}`")]
    return facts(rows, header=(f"kernel choice (`serve/{variant}/record.json`)", "value"))


def gptq_speed() -> Table:
    """gptq-w4a16's output tokens/s per config and concurrency, against its own plain decoding (this lease) and
    against BF16's plain decoding served in the third lease (same params, same GPU model, another machine)."""
    return speed_table(GPTQ, RUN, ("vs BF16 plain (`smollm2-gpu-3`)", bench_runs(BASELINE, RUN3)["plain"]))


def capacity_rows(variant: str, run: Path) -> list[tuple[str, ...]]:
    """The variant's capacity search per config (its record) against its own plain decoding (at_bound: the search
    met the SLO at its largest load, so the capacity is at least that)."""
    rec = serve_record(variant, run)
    plain = rec["configs"]["plain"]["capacity"]
    rows = []
    for cfg, result in rec["configs"].items():
        cap = result["capacity"]
        name = f"plain-{rec['kernel']}" if cfg == "plain" and rec.get("kernel") else cfg
        u, t = cap["users_per_gpu"], cap["output_tokens_per_s_per_gpu"]
        rows.append((f"`{name}`", str(result["num_speculative_tokens"] or "-"), cap["status"], capacity_cell(cap),
                     ratio_cell(u / plain["users_per_gpu"], cap, plain), f"{t:.0f}",
                     f"{t / plain['output_tokens_per_s_per_gpu']:.2f}x", f"{cap['request_goodput']:.1f}"))
    return rows


CAPACITY_COLUMNS = ("config", "k", "search ended", "users per GPU at the SLO", "vs its plain",
                    "output tok/s per GPU there", "vs its plain", "request goodput, req/s")


def gptq_acceptance() -> Table:
    return acceptance(GPTQ, RUN)


def gptq_acceptance_note() -> Text:
    return acceptance_note(GPTQ, RUN)


def capacity_cell(cap: dict) -> str:
    return f"{cap['users_per_gpu']:.0f}" + (" (at least: the search's bound)" if cap["status"] == "at_bound" else "")


def ratio_cell(x: float, cap: dict, base: dict) -> str:
    """A ratio of capacities; a lower bound where the numerator's search ended at its bound, an upper bound where
    only the denominator's did."""
    if cap["status"] == "at_bound" and base["status"] != "at_bound":
        return f"at least {x:.2f}x"
    if base["status"] == "at_bound" and cap["status"] != "at_bound":
        return f"at most {x:.2f}x"
    return f"{x:.2f}x"


def capacity(variant: str = BASELINE, run: Path = RUN3) -> Table:
    """A variant's capacity search per config (its record; BF16's by default): the largest closed-loop load whose p99
    latencies met serving.slo, and what it carried there, against plain decoding in the same run."""
    return Table(CAPACITY_COLUMNS, tuple(capacity_rows(variant, run)))


def gptq_capacity() -> Table:
    """gptq-w4a16's capacity per config against its own plain decoding and BF16's plain decoding in the third lease's
    record (a ratio across leases)."""
    rec = serve_record(GPTQ, RUN)
    bf16 = serve_record(BASELINE, RUN3)["configs"]["plain"]["capacity"]
    rows = []
    for row, result in zip(capacity_rows(GPTQ, RUN), rec["configs"].values()):
        cap = result["capacity"]
        rows.append((*row, ratio_cell(cap["users_per_gpu"] / bf16["users_per_gpu"], cap, bf16),
                     f"{cap['output_tokens_per_s_per_gpu'] / bf16['output_tokens_per_s_per_gpu']:.2f}x"))
    rows.append(("`bf16` plain (`smollm2-gpu-3`)", "-", bf16["status"], capacity_cell(bf16), "-",
                 f"{bf16['output_tokens_per_s_per_gpu']:.0f}", "-", f"{bf16['request_goodput']:.1f}", "1.00x", "1.00x"))
    return Table((*CAPACITY_COLUMNS, "users vs BF16 plain", "tok/s vs BF16 plain"), tuple(rows))


def gptq_capacity_note() -> Text:
    p = params()
    sb, slo = p["serve_bench"], p["serving"]["slo"]
    serve = yaml.safe_load((RUN / "serve" / GPTQ / "serve-plain.yaml").read_text())
    rec = serve_record(GPTQ, RUN)
    bound = [f"`plain-{rec['kernel']}`" if c == "plain" else f"`{c}`" for c, r in rec["configs"].items()
             if r["capacity"]["status"] == "at_bound"]
    return Text(f"The search's largest load is serve_bench.capacity.max_concurrency = {sb['capacity']['max_concurrency']}"
                f" users, which is also the served config's `max-num-seqs` ({serve['max-num-seqs']}); "
                + ", ".join(bound) + f" met the objective (p99 TTFT <= {slo['p99_ttft_ms']} ms, p99 ITL <= "
                f"{slo['p99_itl_ms']} ms) there, so their capacity is at least that and their ratios to BF16 are lower "
                "bounds.")


def gptq_predicted() -> Table:
    """The evaluate stage's predicted speedup over plain decoding (the H100 cost profile) against the served ratio to
    gptq-w4a16's own plain decoding."""
    return predicted_table(GPTQ, RUN)


def gptq_step_time() -> Table:
    return variant_step_table(GPTQ, RUN)


def gptq_every_run() -> Table:
    return every_run(GPTQ, RUN, tuple(kernel_configs(GPTQ, RUN)))


def gptq_bench_time() -> Table:
    """Per `vllm serve` of serve_bench@gptq-w4a16 (in the order served): from the server log's first line to ready,
    vLLM's engine-init line, the stage's own start measurement, and from ready to the API server's shutdown (the
    sweep and the capacity probes, on one kept bench worker)."""
    rec = serve_record(GPTQ, RUN)
    runs = bench_runs(GPTQ, RUN)
    init = {c: i for c, _, i in server_starts(GPTQ, RUN)}
    rows = []
    for cfg in server_configs(GPTQ, RUN):
        first, ready, down = server_moments(cfg, RUN, GPTQ)
        kernel = cfg[len("plain-"):] if cfg.startswith("plain-") else None
        result = rec["kernels"][kernel] if kernel else rec["configs"][cfg]
        rows.append((f"`{cfg}`", str(int((ready - first).total_seconds())), init[cfg] or "-",
                     f"{result['startup_s']:.0f}", str(int((down - ready).total_seconds())), str(len(runs[cfg]))))
    return Table(("config", "start to ready s (log)", "engine init", "start s (record)", "ready to shutdown s",
                  "bench runs"), tuple(rows))


def fp8_partial() -> Table:
    """What serve_bench@fp8-dynamic measured before the lease ended (its temporary folder; no record), against its
    own plain decoding, gptq-w4a16's (this lease) and BF16's (the third lease) at the same concurrency."""
    runs = bench_runs(FP8_PART, RUN)
    gptq, bf16 = bench_runs(GPTQ, RUN)["plain"], bench_runs(BASELINE, RUN3)["plain"]
    slo = params()["serving"]["slo"]
    rows = []
    for cfg in [c for c in CONFIGS if c in runs]:
        for key in sorted(runs[cfg], key=lambda k: (isinstance(k, tuple), k[1] if isinstance(k, tuple) else k)):
            r = runs[cfg][key]
            t = r["output_throughput"]
            sweep = isinstance(key, int)
            rows.append((f"`{cfg}`", f"sweep c={key}" if sweep else f"capacity probe c={key[1]}", f"{t:.0f}",
                         f"{t / runs['plain'][key]['output_throughput']:.2f}x" if sweep else "-",
                         f"{t / gptq[key]['output_throughput']:.2f}x" if sweep else "-",
                         f"{t / bf16[key]['output_throughput']:.2f}x" if sweep else "-",
                         f"{r['p99_ttft_ms']:.1f}", f"{r['p99_itl_ms']:.1f}", "yes" if within_slo(r, slo) else "no"))
    return Table(("config", "run", "output tok/s", "vs its plain", "vs gptq-w4a16 plain (this lease)",
                  "vs BF16 plain (`smollm2-gpu-3`)", "p99 TTFT", "p99 ITL", "within the objective"), tuple(rows))


def plain_variants() -> Table:
    """Plain decoding of every variant in every lease that served it (whole, or cut short: its stage's temporary
    folder), per sweep level: output tokens/s divides the tokens the responses had by the run's duration, and the
    variants stop at their own EOS, so it also compares response lengths; the mean TPOT (time per output token after
    the first) does not. Rows of different leases compare different machines."""
    levels = params()["serve_bench"]["concurrency"]
    served = [(d.name.removesuffix("-unfinished"), name, run, d.name)
              for name, run in LEASES if (run / "serve").is_dir() for d in sorted((run / "serve").iterdir())
              if "plain" in bench_runs(d.name, run)]
    served.sort(key=lambda s: variants().index(s[0]))
    rows = []
    for variant, lease, run, folder in served:
        cut = "" if folder == variant else " (stage cut short)"
        for cfg in (k for k in kernel_configs(folder, run) if k.startswith("plain")):
            for c in levels:
                r = bench_runs(folder, run)[cfg][c]
                rows.append((f"`{variant}`", f"`{lease}`{cut}", f"`{cfg}`", str(c), str(r["completed"]),
                             f"{r['total_output_tokens'] / r['completed']:.1f}", f"{r['output_throughput']:.0f}",
                             f"{r['mean_tpot_ms']:.2f}", f"{r['mean_ttft_ms']:.1f}"))
    return Table(("variant", "lease", "config", "concurrency", "requests", "output tokens per request",
                  "output tok/s", "mean TPOT ms", "mean TTFT ms"), tuple(rows))


# -- every variant as served (each in the lease whose serve_bench stage wrote its record) -------------------------


def served_overview() -> Table:
    """Where each variant was served whole, what its stage served, the kernel it kept and the gate over that lease's
    metrics (the lease's gate.txt, CPU)."""
    rows = []
    for v, lease, run in served_variants():
        rec = serve_record(v, run)
        _, verdict = gate_sections(run)[v]
        rows.append((f"`{v}`", f"`{lease}`", load(run / "run.json")["commit"][:7],
                     ", ".join(f"`{c}`" for c in kernel_configs(v, run)),
                     f"`{rec['kernel']}`" if rec.get("kernel") else "-", verdict))
    return Table(("variant", "served whole in", "code at", "configs served", "kernel kept",
                  "gate over that lease's metrics (`gate.txt`)"), tuple(rows))


def per_variant(table) -> Table:
    """One table over every variant served whole: each variant's rows of table(variant, folder) after its variant
    and serving lease (the ratios inside stay within that lease's run)."""
    tables = [(v, lease, table(v, run)) for v, lease, run in served_variants()]
    assert len({t.columns for _, _, t in tables}) == 1
    return Table(("variant", "lease", *tables[0][2].columns),
                 tuple((f"`{v}`", f"`{lease}`", *row) for v, lease, t in tables for row in t.rows))


def acceptance_totals(variant: str, run: Path) -> Table:
    """vLLM's accepted/drafted and mean accepted length over the variant's sweep levels against the evaluate stage's
    estimate at the k served (eval/<variant>/speculative-<method>.json, the same lease)."""
    rows = []
    for m, (drafted, accepted, drafts) in served_acceptance(variant, run).items():
        k = served_k(m, variant, run)
        est_ratio, est_len = estimate_at(load(run / "eval" / variant / f"speculative-{m}.json"), k)
        served = accepted / drafted
        rows.append((f"`{m}`", str(k), str(drafted), str(accepted), fmt(served), fmt(1 + accepted / drafts, 2),
                     fmt(est_ratio), fmt(est_len, 2), f"{est_ratio - served:+.3f}"))
    return Table(("method", "k served", "drafted", "accepted", "accepted/drafted", "mean accepted length",
                  "estimate: accepted/drafted", "estimate: mean accepted length", "estimate - served"), tuple(rows))


def served_note() -> Text:
    """What beats its own plain decoding (beyond serve_bench.kernel_tie, the noise the stage allows between runs),
    what carries more users, how many predictions pass the 20% test."""
    levels = params()["serve_bench"]["concurrency"]
    tie = params()["serve_bench"]["kernel_tie"]
    faster, ties, more, fewer, n, within = [], [], [], [], 0, {1: 0, 32: 0}
    for v, lease, run in served_variants():
        runs = bench_runs(v, run)
        for m in METHODS:
            for c in levels:
                x = runs[m][c]["output_throughput"] / runs["plain"][c]["output_throughput"]
                if abs(x - 1) <= tie or x > 1:
                    (ties if abs(x - 1) <= tie else faster).append(f"`{v}` `{m}` at c={c} ({x:.2f}x)")
        rec = serve_record(v, run)["configs"]
        plain = rec["plain"]["capacity"]["users_per_gpu"]
        for m in METHODS:
            u = rec[m]["capacity"]["users_per_gpu"]
            if u != plain:
                (more if u > plain else fewer).append(f"`{v}` `{m}` ({u:.0f} against {plain:.0f})")
        for r in predicted_rows(v, run):
            n += 1
            for c in within:
                pred, served = r[c]
                within[c] += abs(pred / served - 1) <= PREDICTION_TOLERANCE
    return Text(f"Faster than its own plain decoding by more than {tie:.0%}: {', '.join(faster) or 'none'}; within "
                f"{tie:.0%} of it: {', '.join(ties) or 'none'}; every other method at every concurrency is slower. "
                f"More users at the SLO than its plain decoding: {', '.join(more) or 'none'}; fewer: "
                f"{', '.join(fewer) or 'none'}; the others as many. Of the {n} predictions (variant and method), "
                f"{within[1]} are within {PREDICTION_TOLERANCE:.0%} of the served ratio at c=1 and {within[32]} at "
                "c=32.")


def scheduling() -> Table:
    """What each server log of the variants' serving leases says about asynchronous scheduling and the model runner,
    per config (plain counted once per kernel), beside what the logs of the cost profile's runs say (the profile
    the evaluate stage predicted from: its `runs`, one vLLM engine per method and k, random weights)."""
    profiles = {load(run / "eval" / v / "summary.json")["speculation"]["cost_profile"]
                for v, _, run in served_variants()}
    assert len(profiles) == 1
    profile = load(ROOT / "data/serving-cost-profiles" / f"{profiles.pop()}.json")
    per: dict[str, dict[str, set]] = {}

    def note(kind: str, text: str, key: str) -> dict[str, set]:
        d = per.setdefault(kind, {"logs": set(), "async": set(), "runner": set(), "why": set(), "profile": set()})
        d["async" if key == "served" else "profile"] |= set(re.findall(r"Asynchronous scheduling is (enabled|disabled)",
                                                                      text))
        return d

    for v, lease, run in served_variants():
        for cfg in server_configs(v, run):
            text = (run / "logs" / f"serve_bench@{v}.{cfg}-server.log").read_text()
            d = note("plain" if cfg.startswith("plain") else cfg, text, "served")
            d["logs"].add(f"{v}.{cfg}")
            d["runner"] |= {f"V1 ({m})" for m in re.findall(r"Model Runner V2 does not yet support ([^;]+);", text)}
            d["runner"] |= {"V2"} if "Using V2 Model Runner" in text else set()
            d["why"] |= set(re.findall(r"(Async scheduling not supported with [^.]*?) and will be disabled", text))
    for folder in profile["runs"]:
        for log in sorted((ROOT / folder).glob("*-k*.log")):
            note(log.name.split("-k")[0], log.read_text(), "profile")
    return Table(("config", "server logs", "asynchronous scheduling, served", "why (vLLM's warning)", "model runner",
                  f"asynchronous scheduling in the runs of the cost profile `{profile['name']}`"),
                 tuple((f"`{k}`", str(len(d["logs"])), ", ".join(sorted(d["async"])),
                        "; ".join(sorted(d["why"])) or "-", "; ".join(sorted(d["runner"])) or "-",
                        ", ".join(sorted(d["profile"])) or "-") for k, d in per.items() if d["logs"]))


def variant_step_table(variant: str, run: Path) -> Table:
    """step_table over each config the variant's stage served (plain on each kernel compared, then the methods)."""
    return step_table(step_rows(variant, run, kernel_configs(variant, run)))


def lease_ends() -> Table:
    """Every lease's `dvc repro` from its timestamped repro.log: how long the log runs, the stage it ended in, and
    the serve_bench stages with results: a record, or results in a folder without one (cut short)."""
    rows = []
    for name, run in LEASES:
        last, _, end, done = stage_times(repro_lines(run))[-1]
        folders = sorted((run / "serve").iterdir()) if (run / "serve").is_dir() else []
        records = [f"`{d.name}`" for d in folders if (d / "record.json").is_file()]
        part = [f"`{d.name.removesuffix('-unfinished')}`" for d in folders
                if not (d / "record.json").is_file() and any(bench_runs(d.name, run).values())]
        rows.append((f"`{name}`", str(end), f"`{last}`", "yes" if done else "no (the lease ended)",
                     ", ".join(records) or "none", ", ".join(part) or "-"))
    return Table(("lease", "the log's last line, s", "last stage started", "it finished",
                  "serve records written", "serve_bench cut short, with results"), tuple(rows))


def greedy_determinism() -> Table:
    """benchmarks/gpu/greedy_determinism.py's RESULT lines: batched greedy generation (the evaluate stage's) on a
    model of SmolLM2-135M's shape with random weights, two identical copies and one model twice."""
    rows = []
    for line in (GREEDY / "greedy-determinism.txt").read_text().splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            rows.append((f"`{r['mode']}`", fmt(r["copy_vs_copy"], 4), fmt(r["same_model_twice"], 4), str(r["prompts"]),
                         str(r["tokens"]), r["torch"]))
    return Table(("mode", "copy against copy (share of prompts with identical tokens)", "one model twice", "prompts",
                  "tokens each", "torch"), tuple(rows))


# -- leases compared ------------------------------------------------------------------------------------------


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
    served_whole = [v for v in variants() if (RUN / "serve" / v / "record.json").is_file()]
    elsewhere = [f"`{v}` (`{name}`)" for v, name, run in served_variants() if run != RUN]
    part = [f"`{d.name[:-len('-unfinished')]}` ({', '.join(f'`{c}`' for c in bench_runs(d.name, RUN))})"
            for d in sorted((RUN / "serve").glob("*-unfinished"))]
    touched = {*served_whole, *(d.name[:-len("-unfinished")] for d in (RUN / "serve").glob("*-unfinished")),
               *(v for v, _, _ in served_variants())}
    secs = [s for v in (GPTQ, "fp8-dynamic") for _, s, _ in server_starts(v, RUN) if s is not None]
    return facts([
        ("variants without quality numbers", ", ".join(f"`{v}`" for v in variants() if v not in ev) or "none"),
        ("variants served whole in this lease (a record)", ", ".join(f"`{v}`" for v in served_whole)),
        ("served whole in another lease (a record)", ", ".join(elsewhere) or "none"),
        ("served in part (configs with results)", ", ".join(part) or "none"),
        ("never served", ", ".join(f"`{v}`" for v in variants() if v not in touched) or "none"),
        ("one `vllm serve` start in this lease, s", f"{min(secs)}-{max(secs)}"),
    ])


def time_note() -> Text:
    """Where this lease's `dvc repro` time went, from its repro.log."""
    secs = stage_seconds(RUN)
    lines = repro_lines()
    evaluate = sum(s for name, (s, _) in secs.items() if name.startswith("evaluate@"))
    serve = secs[f"serve_bench@{GPTQ}"][0]
    first_eval = min(t for name, t, _, _ in stage_times(lines) if name.startswith("evaluate@"))
    return Text(f"This lease's `dvc repro` ran {lines[-1][0]} s: {first_eval} s to the first `evaluate` stage (sources, "
                f"models, data, every quantize stage, the draft model and the EAGLE-3 head), {evaluate} s for the "
                f"{sum(n.startswith('evaluate@') for n in secs)} `evaluate` stages, {serve} s for "
                f"`serve_bench@{GPTQ}`, and the rest in `serve_bench@fp8-dynamic` until the device time ended.")


def second_quantize() -> Table:
    """Each variant's quantize stage in the second and the fourth lease (H100), beside quantize_bench.py's CPU run of
    the same algorithm at the same calibration rows and AWQ grid, one torch thread, where one exists."""
    run_params = yaml.safe_load((RUN2 / "params.yaml").read_text())["quantize"]
    fourth = yaml.safe_load((RUN / "params.yaml").read_text())["quantize"]
    assert (fourth["enabled"], fourth["variants"]) == (run_params["enabled"], run_params["variants"])
    cpu = json.loads(CPU_QUANTIZE.read_text())["runs"]
    rows = []
    for v in run_params["enabled"]:
        m = json.loads((RUN2 / "metrics" / f"quantize-{v}.json").read_text())
        t = json.loads((RUN2 / "timings" / f"quantize-{v}.json").read_text())
        t4 = json.loads((RUN / "timings" / f"quantize-{v}.json").read_text())
        if m.get("algorithm") in (None, "none"):
            continue  # bf16: nothing is quantized
        n_grid = run_params["variants"].get(v, {}).get("n_grid")
        same = [r for r in cpu if r["algorithm"] == m["algorithm"] and r["calibration_samples"] == m["calibration_samples"]
                and (r["settings"].get("n_grid") or 20) == (n_grid or 20) and r.get("torch_threads") == 1]
        cpu_s = same[0]["wall_time_s"] if same else None
        rows.append((f"`{v}`", m["algorithm"], str(m["group_size"] or "-"), str(m["calibration_samples"] or "-"),
                     "-" if n_grid is None else str(n_grid), fmt(t["wall_time_s"], 1), fmt(t4["wall_time_s"], 1),
                     fmt(t["peak_gpu_memory_mb"], 0), fmt(m["size_after_mb"], 1), fmt(cpu_s, 1),
                     "-" if cpu_s is None else f"x{cpu_s / t['wall_time_s']:.0f}"))
    return Table(("variant", "algorithm", "group size", "calibration rows", "AWQ grid", "H100 wall, s (`smollm2-gpu-2`)",
                  "H100 wall, s (`smollm2-gpu-4`)", "peak GPU MB", "size, MB", "2-core CPU wall, s (1 thread)",
                  "CPU / H100 (`smollm2-gpu-2`)"), tuple(rows))


def bf16_leases() -> Table:
    """The BF16 numbers every lease measured, each from its own run folder."""
    def numbers(run: Path) -> dict[str, str]:
        out = variant_numbers(run, BASELINE)
        d = json.loads((run / "metrics" / "draft_training.json").read_text())
        h = eagle3_record(run)
        out["draft fine-tune eval loss"] = fmt(d["eval_loss_finetuned"], 3)
        out["EAGLE-3 head final loss / step-1 accuracy"] = f"{h['final_loss']:.3f} / {h['accuracy_by_step'][0]:.3f}"
        out["EAGLE-3 head training s"] = f"{h['train_s']:.0f}"
        return out
    return lease_table([(name, numbers(run)) for name, run in LEASES
                        if (run / "metrics" / f"eval-{BASELINE}.json").is_file()])


def speed_leases() -> Table:
    """BF16's served tokens/s per config and concurrency in the first and the third lease (same params), each with
    its ratio to that lease's own plain decoding."""
    levels = params(RUN3)["serve_bench"]["concurrency"]
    first, third = bench_runs(BASELINE, RUN1), bench_runs(BASELINE, RUN3)
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


def speed_leases_note() -> Text:
    first, third = bench_runs(BASELINE, RUN1), bench_runs(BASELINE, RUN3)
    a, b = first["plain"][1]["output_throughput"], third["plain"][1]["output_throughput"]
    flips = [f"`{cfg}` at c={c}" for cfg in METHODS for c in sweep_levels(third.get(cfg, {}))
             if c in first.get(cfg, {}) and
             (first[cfg][c]["output_throughput"] >= first["plain"][c]["output_throughput"]) !=
             (third[cfg][c]["output_throughput"] >= third["plain"][c]["output_throughput"])]
    return Text(f"The third lease's plain decoding at concurrency 1 is {abs(100 * (1 - b / a)):.0f}% "
                f"{'below' if b < a else 'above'} the first's ({b:.0f} and {a:.0f} tok/s); the configs that change "
                f"sides of plain decoding between the two leases: {', '.join(flips) or 'none'}.")


def bench_time() -> Table:
    """Per config of serve_bench@bf16 in the first lease (each sweep level and capacity probe its own `vllm bench
    serve` process) and the third (one kept bench worker per stage, pipeline/serving/bench_worker.py): from the server
    log's first line to ready, and from ready to the API server's shutdown (the sweep and the capacity probes)."""
    rows = []
    for cfg in CONFIGS:
        cells = []
        for run in (RUN1, RUN3):
            first, ready, down = server_moments(cfg, run)
            n = len(bench_runs(BASELINE, run).get(cfg, {}))
            cells += ["-" if ready is None else str(int((ready - first).total_seconds())),
                      "did not end (lease over)" if down is None or ready is None
                      else str(int((down - ready).total_seconds())), str(n)]
        rows.append((f"`{cfg}`", *cells))
    return Table(("config", "`smollm2-gpu`: start to ready s", "ready to shutdown s", "bench runs",
                  "`smollm2-gpu-3`: start to ready s", "ready to shutdown s", "bench runs"), tuple(rows))


def bench_time_note() -> Text:
    def spans(run: Path, variant: str, configs) -> tuple[list[int], list[int]]:
        ready_s, bench_s = [], []
        for cfg in configs:
            first, ready, down = server_moments(cfg, run, variant)
            if ready and first:
                ready_s.append(int((ready - first).total_seconds()))
            if ready and down:
                bench_s.append(int((down - ready).total_seconds()))
        return ready_s, bench_s

    _, one = spans(RUN1, BASELINE, CONFIGS)
    r3, kept = spans(RUN3, BASELINE, CONFIGS)
    r4, kept4 = spans(RUN, GPTQ, server_configs(GPTQ, RUN))
    return Text(f"The benchmarking on a running server went from {min(one)}-{max(one)} s to {min(kept)}-{max(kept)} s "
                f"per config ({min(kept4)}-{max(kept4)} s for `{GPTQ}`'s configs in the fourth lease); a config's "
                f"cost is now mostly its `vllm serve` start ({min(r3 + r4)}-{max(r3 + r4)} s in the third and fourth "
                "leases) and the process launch before the server's first log line.")


def calibrated_rows() -> list[dict]:
    """Each served variant but the one the committed SmolLM2 profile is calibrated by (serving_costs.calibrate, run
    by costs.sh), predicted again by that profile from its own CPU estimate at the k served: out of sample."""
    from pipeline.evaluate import serving_costs

    prof = next(p for p in serving_costs.available() if p.name.endswith("smollm2-135m"))
    own = {r for m in prof.methods.values() for r in m.served_runs}
    rows = []
    for variant, lease, run in served_variants():
        if any(f"{run.name}/serve/{variant}/" in r for r in own):
            continue
        runs = bench_runs(variant, run)
        for m in METHODS:
            est = load(run / "eval" / variant / f"speculative-{m}.json")
            k = served_k(m, variant, run)
            pred = serving_costs.predict(serving_costs.Choice(prof, "committed", 1.0), m, est["tokens_per_step_by_k"],
                                         est["drafted_per_step_by_k"], [1, 8, 32], est.get("steps_per_response_by_k"))
            rows.append({"variant": variant, "lease": lease, "method": m, "k": k,
                         **{c: (pred.speedup(c, k), runs[m][c]["output_throughput"]
                                / runs["plain"][c]["output_throughput"]) for c in (1, 8, 32)}})
    return rows


def calibrated_predicted() -> Table:
    rows = []
    for r in calibrated_rows():
        cells = []
        for c in (1, 8, 32):
            pred, served = r[c]
            cells += [f"x{pred:.2f} / x{served:.2f}", "yes" if abs(pred / served - 1) <= PREDICTION_TOLERANCE else "no"]
        rows.append((f"`{r['variant']}`", r["lease"], f"`{r['method']}`", str(r["k"]), *cells))
    return Table(("variant", "lease", "method", "k", *(h for c in (1, 8, 32) for h in (
        f"c={c} predicted / served", f"within {PREDICTION_TOLERANCE:.0%}"))), tuple(rows))


def calibrated_note() -> Text:
    rows = calibrated_rows()
    parts = []
    for c in (1, 8, 32):
        ok = sum(abs(r[c][0] / r[c][1] - 1) <= PREDICTION_TOLERANCE for r in rows)
        side = sum((r[c][0] >= 1) == (r[c][1] >= 1) for r in rows)
        parts.append(f"c={c}: {ok} of {len(rows)} within {PREDICTION_TOLERANCE:.0%}, {side} on the served side of 1.0")
    ngram = [r for r in rows if r["method"] == "ngram"]
    worst = max(abs(r[c][0] / r[c][1] - 1) for r in ngram for c in (1, 8, 32))
    return Text("; ".join(parts) + f". n-gram is predicted slower than plain decoding for every variant now "
                f"({sum(r[c][0] < 1 for r in ngram for c in (1, 8, 32))} of {3 * len(ngram)} cells), its largest "
                f"miss {100 * worst:.0f}%.")


BLOCKS = {"setup": setup, "progress": progress, "sweep-progress": sweep_progress, "stages": stages,
          "stage-leases": stage_leases, "stage-note": stage_note, "time-note": time_note,
          "quality": quality, "thresholds": thresholds, "quality-gate": quality_gate, "gate": gate,
          "gptq-leases": gptq_leases, "bf16-gate": bf16_gate,
          "drafts-per-step": drafts_per_step, "acceptance": acceptance, "acceptance-note": acceptance_note,
          "eagle3-head": eagle3_head, "speed": speed, "predicted": predicted, "predicted-note": predicted_note,
          "every-run": every_run, "starts": starts, "capacity": capacity, "step-time": step_time,
          "step-note": step_note,
          "gptq-kernel": partial(kernel_table, GPTQ, RUN),
          "gptq-kernel-choice": partial(kernel_choice, GPTQ, RUN), "gptq-speed": gptq_speed,
          "gptq-acceptance": gptq_acceptance, "gptq-acceptance-note": gptq_acceptance_note,
          "gptq-capacity": gptq_capacity, "gptq-capacity-note": gptq_capacity_note, "gptq-predicted": gptq_predicted,
          "gptq-step-time": gptq_step_time, "gptq-every-run": gptq_every_run, "gptq-bench-time": gptq_bench_time,
          "fp8-partial": fp8_partial, "plain-variants": plain_variants,
          "served-overview": served_overview, "served-speed": partial(per_variant, speed_table),
          "served-capacity": partial(per_variant, capacity), "awq-kernel": partial(kernel_table, AWQ, RUN5),
          "awq-kernel-choice": partial(kernel_choice, AWQ, RUN5),
          "served-acceptance": partial(per_variant, acceptance_totals),
          "served-predicted": partial(per_variant, predicted_table), "served-note": served_note,
          "served-step-time": partial(per_variant, variant_step_table),
          "scheduling": scheduling, "lease-ends": lease_ends, "greedy-determinism": greedy_determinism,
          "training": training, "not-measured": not_measured, "second-quantize": second_quantize,
          "bf16-leases": bf16_leases, "speed-leases": speed_leases, "speed-leases-note": speed_leases_note,
          "bench-time": bench_time, "bench-time-note": bench_time_note,
          "calibrated-predicted": calibrated_predicted, "calibrated-note": calibrated_note}
