"""Tables of benchmarks/gpu/history/vllm-0.25.md: the pipeline's outputs in real vLLM, from the run folders under
benchmarks/gpu/raw/ (no GPU, no vLLM, no pipeline import).

The summaries compute every measured number from the raw files, the claims' numbers included (ranges, largest
differences, targets met); the block functions at the end lay them out as tables. gpu_summary() returns the
numbers the top-level README may quote (benchmarks/summary.py, benchmarks/readme_measured.py), computed the same way.
"""
from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from render import Table, Text, facts  # noqa: E402
from pipeline.core.sizes import mib_record_as_mb  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
RUNS = ("gpu-methods", "gpu-eagle3-variants", "gpu-schemes", "gpu-schemes-served", "gpu-tp1", "schemes8b", "handoff",
        "gpu-tiers", "gpu-profile", "after-graph-refactor", "evaluate-stage", "before-eos-fix", "llama3-8b",
        "demo-bundles", "gpu-tests")
VARIANTS = ["fp8-dynamic", "fp8-static", "gptq-w4a16", "awq-w4a16"]
BENCH8B = ["bf16", "fp8-dynamic", "gptq-w4a16", "awq-w4a16"]
BYTE_PPL = "lm_eval_domain_heldout_byte_perplexity"
# the loose result files of the first runs, by the run folder that holds them
FOLDER = {"quant8b": "llama3-8b", "bench8b": "llama3-8b", "demo": "demo-bundles", "greedy": "demo-bundles",
          "serve": "demo-bundles", "quality": "demo-bundles", "stage": "evaluate-stage", "cpu": "evaluate-stage"}


def table(header: list[str], rows: list[list]) -> Table:
    return Table(tuple(header), tuple(tuple(str(c) for c in r) for r in rows))


# Runs recorded by code before pipeline/core/sizes.py RECORDED_IN_MIB_UNTIL, whose `*_mb` sizes and peak memory are
# MiB: read back in MB, as every column here labels them (a BF16 Llama-3-8B is 16060 MB, not "15317 MB").
RECORDED_IN_MIB = {"after-graph-refactor", "before-eos-fix", "calibration", "demo-bundles", "demo-serve",
                   "evaluate-stage", "gpu-eagle3-variants", "gpu-methods", "gpu-profile", "gpu-schemes-served",
                   "gpu-schemes", "gpu-tests", "gpu-tiers", "gpu-tp1", "handoff", "llama3-8b", "schemes8b"}


def in_mb(folder: str, data):
    return mib_record_as_mb(data) if folder in RECORDED_IN_MIB and isinstance(data, dict) else data


def load(name: str) -> dict:
    """A result file of the first runs by name (before-eos-fix/... names its folder itself)."""
    path = name if "/" in name else f"{FOLDER[name.split('-')[0]]}/{name}"
    return in_mb(path.split("/")[0], json.loads((RAW / f"{path}.json").read_text()))


def run_json(run: Path, rel: str) -> dict:
    """A JSON file of one GPU run's unpacked directory under raw/ (gpu-profile, gpu-methods, ...). A stage's metrics
    come with its timings/ file (the run's artifacts/timings) where it has one: seconds and peak memory are kept
    there, out of the DVC metrics."""
    data = json.loads((run / rel).read_text())
    timing = run / "timings" / Path(rel).name
    if rel.startswith("metrics/") and timing.is_file():
        data = {**data, **json.loads(timing.read_text())}
    return in_mb(run.name, data)


def f(v, d=2):
    return "n/a" if v is None else f"{v:.{d}f}"


def span(values, d=2) -> str:
    """'lo-hi' of the values as printed (one number when they print alike)."""
    lo, hi = f(min(values), d), f(max(values), d)
    return lo if lo == hi else f"{lo}-{hi}"


def implied_draft_cost(r: dict) -> float:
    """Target steps that one drafted token costs, implied by a measured speedup at batch 1: a step with k
    drafts yields 1 + mean accepted tokens, so time per token = (1 + k*c) / (1 + accepted) target steps."""
    return ((1 + r["mean_accepted_tokens"]) * r["baseline_tokens_per_s_bs1"] / r["speculative_tokens_per_s_bs1"]
            - 1) / r["num_speculative_tokens"]


def gpu_test_line() -> dict:
    """The numbers tests/test_gpu.py printed (raw/test-gpu.txt)."""
    m = re.search(r"vLLM accepted/drafted ([\d.]+) per position \[([^\]]*)\]; CPU estimate ([\d.]+)",
                  (RAW / "gpu-tests" / "test-gpu.txt").read_text())
    per_pos = [float(x) for x in m[2].split(",")]
    return {"vllm_accepted_per_drafted": float(m[1]), "cpu_estimate": float(m[3]), "k": len(per_pos)}


PROFILE = RAW / "gpu-profile"

LEVELS = ("c1", "c8", "c32")

# The GPU demo profile's targets (a benchmark, not a test): name -> threshold, higher is better.
TARGETS = {"int4_c1": 1.8, "fp8_c1": 1.45, "best_speculative_c1": 1.5, "speculative_accepted_per_drafted": 0.6,
           "slowest_vs_bf16_c32": 1.0}

ESTIMATE_TOLERANCE = 0.03

def stage_walls(log: str) -> dict[str, int | None]:
    """Seconds per stage from the timestamped `dvc repro` log: 'Running stage' to the next lock update."""
    walls, current = {}, None
    for line in log.splitlines():
        m = re.match(r"(\d+) (Running stage '([^']+)'|Updating lock file)", line)
        if not m:
            continue
        if m[3]:
            current = (m[3], int(m[1]))
            walls[m[3]] = None
        elif current:
            walls[current[0]] = int(m[1]) - current[1]
            current = None
    return walls


def level(record: dict, config: str, key: str) -> dict:
    return record["configs"][config]["levels"][key]


def implied_served_draft_cost(record: dict, key: str = "c1") -> float:
    """Target steps one drafted token costs as served: a speculative step yields `acceptance length` tokens
    at TPOT each, and verifying k+1 tokens is taken to cost one plain step (TPOT of plain decoding)."""
    spec, plain = level(record, "speculative", key), level(record, "plain", key)
    k = record["configs"]["speculative"]["num_speculative_tokens"]
    step = spec["tpot_ms"]["mean"] * spec["mean_acceptance_length"]
    return (step - plain["tpot_ms"]["mean"]) / (k * plain["tpot_ms"]["mean"])


def profile_summary() -> dict:
    """The GPU-profile `dvc repro` (raw/gpu-profile/): what the README may quote, computed here."""
    params = yaml.safe_load((PROFILE / "params.yaml").read_text())
    variants = params["quantize"]["enabled"]
    serve = {v: run_json(PROFILE, f"serve/{v}/record.json") for v in variants}
    estimate = {v: run_json(PROFILE, f"eval/{v}/speculative.json") for v in variants}
    base = serve["bf16"]
    tok = lambda v, cfg, key: level(serve[v], cfg, key)["output_throughput"]  # noqa: E731
    vs_bf16 = {key: {v: tok(v, "plain", key) / tok("bf16", "plain", key) for v in variants} for key in LEVELS}
    spec_gain = {key: {v: tok(v, "speculative", key) / tok(v, "plain", key) for v in variants} for key in LEVELS}
    vllm_acc = {v: level(serve[v], "speculative", "c1")["accepted_per_draft_token"] for v in variants}
    best = max(variants, key=lambda v: spec_gain["c1"][v])
    int4 = next(v for v in variants if "w4a16" in v)
    fp8 = next(v for v in variants if v.startswith("fp8"))
    measured = {"int4_c1": vs_bf16["c1"][int4], "fp8_c1": vs_bf16["c1"][fp8],
                "best_speculative_c1": spec_gain["c1"][best], "speculative_accepted_per_drafted": vllm_acc[best],
                "slowest_vs_bf16_c32": min(vs_bf16["c32"][v] for v in variants if v != "bf16")}
    diffs = {v: abs(estimate[v]["accepted_per_draft_token"] - vllm_acc[v]) for v in variants}
    models = run_json(PROFILE, "metrics/models.json")
    return {
        "variants": variants, "int4": int4, "fp8": fp8, "best_speculative": best,
        "models": models, "draft": run_json(PROFILE, "metrics/draft.json"),
        "stage_walls": stage_walls((PROFILE / "repro.log").read_text()),
        "vs_bf16": vs_bf16, "speculative_gain": spec_gain,
        "targets": {name: {"target": TARGETS[name], "measured": value, "met": value >= TARGETS[name]}
                    for name, value in measured.items()},
        "estimate_vs_vllm": {v: {"cpu_estimate": estimate[v]["accepted_per_draft_token"], "vllm_c1": vllm_acc[v],
                                 "abs_diff": diffs[v]} for v in variants},
        "estimate_max_abs_diff": max(diffs.values()), "estimate_within_tolerance": max(diffs.values()) <= ESTIMATE_TOLERANCE,
        "k": base["configs"]["speculative"]["num_speculative_tokens"],
        "implied_draft_cost": {v: implied_served_draft_cost(serve[v]) for v in variants},
        "weight_bytes_cost_ratio": {v: estimate[v]["cost_ratio"] for v in variants},
        # Weight bytes read per plain decode step over its time at c=1: how bandwidth-bound decode is.
        "bf16_effective_weight_tb_per_s": run_json(PROFILE, "metrics/quantize-bf16.json")["size_after_mb"] * 1e6
        / (level(base, "plain", "c1")["tpot_ms"]["mean"] * 1e-3) / 1e12,
        "gpu": base["gpu"], "vllm": base["vllm_version"],
    }


METHODS_RUN = RAW / "gpu-methods"

@functools.lru_cache(maxsize=1)  # read by three sections and the summary; the raw files don't change during a render
def methods_summary() -> dict:
    """raw/gpu-methods/: the BF16 target served plain and with each speculative method."""
    serve = run_json(METHODS_RUN, "serve/bf16/record.json")
    plain = serve["configs"]["plain"]["levels"]
    keys = sorted(plain, key=lambda k: int(k[1:]))
    out = {}
    for method, config in serve["configs"].items():
        if method == "plain":
            continue
        est = run_json(METHODS_RUN, f"eval/bf16/speculative-{method}.json")
        out[method] = {
            "k": config["num_speculative_tokens"],
            "speedup": {k: config["levels"][k]["output_throughput"] / plain[k]["output_throughput"] for k in keys},
            "tokens_per_s": {k: config["levels"][k]["output_throughput"] for k in keys},
            "accepted_per_drafted": {k: config["levels"][k]["accepted_per_draft_token"] for k in keys},
            "tokens_per_step": {k: config["levels"][k]["mean_acceptance_length"] for k in keys},
            "cpu_estimate": {"k": est["num_speculative_tokens"], "accepted_per_drafted": est["accepted_per_draft_token"],
                             "expected_speedup": est["expected_speedup"], "cost_ratio": est["cost_ratio"]},
            "startup_s": config["startup_s"],
        }
    verdict = run_json(METHODS_RUN, "verdict.json")["variants"]["bf16"]["speculation"]
    return {"methods": out, "plain_tokens_per_s": {k: plain[k]["output_throughput"] for k in keys}, "levels": keys,
            "shipped": {"method": verdict["method"], "k": verdict["num_speculative_tokens"], "basis": verdict["basis"]},
            "estimate_best": max(out, key=lambda m: out[m]["cpu_estimate"]["expected_speedup"]),
            "measured_best": max(out, key=lambda m: out[m]["speedup"]["c1"]),
            "eagle3": run_json(METHODS_RUN, "eagle3/record.json"), "gpu": serve["gpu"], "vllm": serve["vllm_version"],
            "stage_walls": stage_walls((METHODS_RUN / "repro.log").read_text())}


VARIANTS_RUN = RAW / "gpu-eagle3-variants"

def eagle3_variants_summary(methods: dict) -> dict:
    """raw/gpu-eagle3-variants/: the head served on the BF16 and GPTQ targets, and
    the estimator (drafting after the prefill's token) against vLLM's served acceptance at the served k.
    methods: methods_summary(), the first run's (the head's numbers before the estimator's change)."""
    out = {}
    verdict = run_json(VARIANTS_RUN, "verdict.json")["variants"]
    for v in ("bf16", "gptq-w4a16"):
        serve = run_json(VARIANTS_RUN, f"serve/{v}/record.json")
        plain, head = serve["configs"]["plain"], serve["configs"]["eagle3"]
        k = head["num_speculative_tokens"]
        est = run_json(VARIANTS_RUN, f"eval/{v}/speculative-eagle3.json")
        at_k = est["accepted_per_position_by_k"][str(k)]
        keys = sorted(plain["levels"], key=lambda c: int(c[1:]))
        out[v] = {"k": k, "levels": keys, "estimate_k": est["num_speculative_tokens"],
                  "plain": {c: plain["levels"][c]["output_throughput"] for c in keys},
                  "head": {c: head["levels"][c]["output_throughput"] for c in keys},
                  "speedup": {c: head["levels"][c]["output_throughput"] / plain["levels"][c]["output_throughput"]
                              for c in keys},
                  "served_accepted": {c: head["levels"][c]["accepted_per_draft_token"] for c in keys},
                  "served_per_position": head["levels"]["c1"]["accepted_per_position"],
                  "estimate_accepted": sum(at_k) / k, "estimate_per_position": at_k,
                  "cost_ratio": est["cost_ratio"], "expected_speedup": est["expected_speedup_by_k"][str(k)],
                  "startup_s": {"plain": plain["startup_s"], "eagle3": head["startup_s"]},
                  "shipped": verdict[v]["speculation"]}
    before = methods["methods"]["eagle3"]
    walls = stage_walls((VARIANTS_RUN / "repro.log").read_text())
    return {"variants": out, "gpu": serve["gpu"], "vllm": serve["vllm_version"], "walls": walls,
            "repro_s": max(int(line.split()[0]) for line in (VARIANTS_RUN / "repro.log").read_text().splitlines()
                           if line.split() and line.split()[0].isdigit()),
            "head": run_json(VARIANTS_RUN, "eagle3/record.json"),
            "before": {"estimate": before["cpu_estimate"]["accepted_per_drafted"],
                       "served": before["accepted_per_drafted"]["c1"], "cost_ratio": before["cpu_estimate"]["cost_ratio"]}}


def served_run(name: str, variants: tuple[str, ...]) -> tuple[Path, dict, dict, dict]:
    """One served GPU profile run under raw/: its directory, params, stage walls and serve_bench records per variant."""
    run = RAW / name
    params = yaml.safe_load((run / "params.yaml").read_text())
    walls = stage_walls((run / "repro.log").read_text())
    return run, params, walls, {v: run_json(run, f"serve/{v}/record.json") for v in variants}


def schemes8b_kernels(run: Path) -> dict[str, str]:
    """The linear kernel vLLM logged for each model of the bench8b logs (no line: unquantized)."""
    kernels, model = {}, None
    for log in sorted(run.glob("bench8b-*.log")):
        for line in log.read_text().splitlines():
            found = re.search(r"model='/tmp/m8/([^']+)'", line)
            if found:
                model = found.group(1)
            found = re.search(r"(?:Selected|Using) (\w+Kernel) for", line)
            if found and model:
                kernels[model] = found.group(1)
    return kernels


def gpu_bench8b_ratio(variant: str) -> float:
    return load(f"bench8b-{variant}")["tokens_per_s_bs1"] / load("bench8b-bf16")["tokens_per_s_bs1"]


def gpu_summary() -> dict:
    """Numbers the top-level README may quote, all computed from raw/ (per-variant dicts; ranges as (lo, hi))."""
    bench = {m: load(f"bench8b-{m}") for m in BENCH8B}
    stage = {v: load(f"stage-evaluate-{v}") for v in VARIANTS}
    before = {v: load(f"before-eos-fix/stage-evaluate-{v}") for v in VARIANTS}
    schedule = {v: load(f"cpu-estimate-{v}") for v in VARIANTS}  # the estimator after the schedule fix
    cpu = {v: load(f"cpu-eval-{v}") for v in VARIANTS}
    demo = {v: load(f"demo-{v}") for v in ["bf16", *VARIANTS]}
    serve = load("serve")
    rng = lambda d: (min(d.values()), max(d.values()))  # noqa: E731
    vllm_acc = {v: r["vllm"]["acceptance_rate"] for v, r in stage.items()}
    s = {
        # Llama-3-8B shapes, random weights, CUDA graphs: decode tokens/s relative to BF16 in the same session.
        "bench8b_speedup_bs1": {m: bench[m]["tokens_per_s_bs1"] / bench["bf16"]["tokens_per_s_bs1"]
                                for m in BENCH8B[1:]},
        "bench8b_speedup_bs32": {m: bench[m]["tokens_per_s_bs32"] / bench["bf16"]["tokens_per_s_bs32"]
                                 for m in BENCH8B[1:]},
        "quant8b": {v: {k: q[k] for k in ("wall_time_s", "size_before_mb", "size_after_mb", "compression_ratio")}
                    for v in BENCH8B[1:] for q in [load(f"quant8b-{v}")]},
        # The evaluate stage on the GPU (toy pair, CUDA graphs, stopping at EOS).
        "vllm_accepted_per_drafted": vllm_acc,
        "cpu_estimate_accepted_per_drafted": {v: schedule[v]["accepted_per_draft_token"] for v in VARIANTS},
        "cpu_estimate_max_abs_diff": max(abs(schedule[v]["accepted_per_draft_token"] - vllm_acc[v]) for v in VARIANTS),
        "every_position_estimate_low_by": {v: vllm_acc[v] - stage[v]["speculative"]["accepted_per_draft_token"]
                                           for v in VARIANTS},
        "cpu_estimate_prompts": sorted({schedule[v]["prompts"] for v in VARIANTS}),
        "vllm_prompts": sorted({stage[v]["vllm"]["prompts"] for v in VARIANTS}),
        "stage_speedup_bs1": {v: r["vllm"]["measured_speedup_bs1"] for v, r in stage.items()},
        "stage_speedup_bs32": {v: r["vllm"]["measured_speedup_bs32"] for v, r in stage.items()},
        "implied_draft_cost": {v: implied_draft_cost(r["vllm"]) for v, r in stage.items()},
        "weight_bytes_cost_ratio": {v: schedule[v]["cost_ratio"] for v in VARIANTS},
        "byte_ppl_max_abs_diff_gpu_vs_cpu": max(abs(stage[v]["summary"][BYTE_PPL] - cpu[v][BYTE_PPL]) for v in VARIANTS),
        # The same stage before the EOS fix (generation forced past EOS).
        "before_eos_fix_vllm_accepted_per_drafted": {v: r["vllm"]["acceptance_rate"] for v, r in before.items()},
        "before_eos_fix_vllm_over_cpu_estimate": {v: r["vllm"]["acceptance_rate"]
                                                  / r["speculative"]["accepted_per_draft_token"]
                                                  for v, r in before.items()},
        # Demo bundles in vLLM with enforce_eager (no CUDA graphs), before the EOS fix.
        "demo_speedup_bs1": {v: r["measured_speedup_bs1"] for v, r in demo.items()},
        "demo_speedup_bs32": {v: r["measured_speedup_bs32"] for v, r in demo.items()},
        "speculative_output_identical": all(r["spec_output_matches_baseline"] for r in demo.values())
        and all(r["vllm"]["spec_output_matches_baseline"] for r in stage.values()),
        "serve_ok": serve["ok"],
        "serve_startup_s": serve.get("startup_s"),
        "gpu_test": gpu_test_line(),
    }
    for key in ("bench8b_speedup_bs1", "vllm_accepted_per_drafted", "stage_speedup_bs1", "implied_draft_cost",
                "weight_bytes_cost_ratio", "every_position_estimate_low_by", "before_eos_fix_vllm_over_cpu_estimate"):
        s[key + "_range"] = rng(s[key])
    s["demo_speedup_bs1_quantized_range"] = rng({v: s["demo_speedup_bs1"][v] for v in VARIANTS})
    s["profile"] = profile_summary()
    s["methods"] = methods_summary()
    s["eagle3_variants"] = eagle3_variants_summary(s["methods"])
    return s


REFACTOR_VARIANTS = ["fp8-dynamic", "gptq-w4a16"]

# ---- blocks, in the order of history/vllm-0.25.md


def methods_table() -> Table:
    s = methods_summary()
    rows = [["plain", "-", *(f(s["plain_tokens_per_s"][k], 0) for k in s["levels"]), *("1.00" for _ in s["levels"]),
             "-", "-", "-", "-", "-"]]
    for m, r in s["methods"].items():
        c = r["cpu_estimate"]
        rows.append([m, r["k"], *(f(r["tokens_per_s"][k], 0) for k in s["levels"]), *(f(r["speedup"][k]) for k in s["levels"]),
                     " / ".join(f(r["tokens_per_step"][k]) for k in s["levels"]),
                     " / ".join(f(r["accepted_per_drafted"][k], 3) for k in s["levels"]),
                     f(c["accepted_per_drafted"], 3), f(c["expected_speedup"]), f(c["cost_ratio"], 3)])
    cs = ", ".join(f"c={k[1:]}" for k in s["levels"])
    return table(["method", "k", *(f"tok/s {k}" for k in s["levels"]), *(f"x plain {k}" for k in s["levels"]),
                  f"tokens per step ({cs})", f"vLLM accepted/drafted ({cs})", "CPU-estimate accepted/drafted",
                  "CPU-estimate speedup", "cost ratio used"], rows)


def methods_run() -> Table:
    s = methods_summary()
    e3, walls = s["eagle3"], s["stage_walls"]
    return facts([("GPU, vLLM", f"{s['gpu']}, vLLM {s['vllm']}"),
                  ("stage `eagle3` (s)", walls.get("eagle3")), ("stage `evaluate@bf16` (s)", walls.get("evaluate@bf16")),
                  ("stage `serve_bench@bf16` (s), four `vllm serve` configs", walls.get("serve_bench@bf16")),
                  ("EAGLE-3 head: trainable parameters (M)", f"{e3['trainable_parameters'] / 1e6:.0f}"),
                  ("the target's layers it reads", e3["aux_layers"]),
                  ("training steps on the target's own answers", e3["train_steps"]),
                  ("training time (s)", f"{e3['train_s']:.0f}"), ("final loss", f(e3["final_loss"])),
                  ("training accuracy by TTT step", ", ".join(f(a, 3) for a in e3["accuracy_by_step"]))])


def methods_decision() -> Table:
    s = methods_summary()
    sh, m = s["shipped"], s["methods"]
    return facts([("the gate ships (`raw/gpu-methods/verdict.json`)", f"**{sh['method']} k={sh['k']}** ({sh['basis']})"),
                  ("what the CPU estimate alone would have picked", f"**{s['estimate_best']}**"),
                  ("EAGLE-3 accepted/drafted: CPU estimate / vLLM at c=1",
                   f"{f(m['eagle3']['cpu_estimate']['accepted_per_drafted'], 3)} / {f(m['eagle3']['accepted_per_drafted']['c1'], 3)}"),
                  ("draft model: abs(CPU estimate - vLLM at c=1)",
                   f"{abs(m['draft_model']['cpu_estimate']['accepted_per_drafted'] - m['draft_model']['accepted_per_drafted']['c1']):.3f}"),
                  ("n-gram accepted/drafted: CPU estimate / vLLM at c=1",
                   f"{f(m['ngram']['cpu_estimate']['accepted_per_drafted'], 3)} / {f(m['ngram']['accepted_per_drafted']['c1'], 3)}")])


def eagle3_variants() -> Table:
    s = eagle3_variants_summary(methods_summary())
    rows = []
    for v, r in s["variants"].items():
        rows.append([v, r["k"], *(f(r["plain"][c], 0) for c in r["levels"]), *(f(r["head"][c], 0) for c in r["levels"]),
                     *(f(r["speedup"][c]) for c in r["levels"]), " / ".join(f(r["served_accepted"][c], 3) for c in r["levels"]),
                     f(r["estimate_accepted"], 3), f(r["estimate_accepted"] - r["served_accepted"]["c1"], 3),
                     f(r["cost_ratio"], 3), f(r["expected_speedup"])])
    levels = next(iter(s["variants"].values()))["levels"]
    cs = ", ".join(f"c={c[1:]}" for c in levels)
    return table(["target", "k", *(f"plain tok/s {c}" for c in levels), *(f"EAGLE-3 tok/s {c}" for c in levels),
                  *(f"x plain {c}" for c in levels), f"vLLM accepted/drafted ({cs})", "CPU estimate at k",
                  "estimate - vLLM (c=1)", "cost ratio", "CPU-expected speedup"], rows)


def eagle3_positions() -> Table:
    s = eagle3_variants_summary(methods_summary())
    return table(["target", "vLLM P(at least j accepted), c=1", "CPU estimate"],
                 [[v, " / ".join(f(a) for a in r["served_per_position"]),
                   " / ".join(f(a) for a in r["estimate_per_position"])] for v, r in s["variants"].items()])


def eagle3_variants_run() -> Table:
    s = eagle3_variants_summary(methods_summary())
    w, h = s["walls"], s["head"]
    return facts([("GPU, vLLM", f"{s['gpu']}, vLLM {s['vllm']}"),
                  ("`dvc repro` from scratch through `publish` (s)", s["repro_s"]), ("stage `eagle3` (s)", w.get("eagle3")),
                  ("stage `serve_bench@bf16` (s)", w.get("serve_bench@bf16")),
                  ("stage `serve_bench@gptq-w4a16` (s)", w.get("serve_bench@gptq-w4a16")),
                  ("head training steps on the BF16 target", h["train_steps"]), ("final loss", f(h["final_loss"]))])


def eagle3_variants_findings() -> Table:
    s = eagle3_variants_summary(methods_summary())
    v, b = s["variants"], s["before"]
    diffs = [abs(r["estimate_accepted"] - r["served_accepted"]["c1"]) for r in v.values()]
    return facts([("vLLM accepted/drafted at c=1: gptq-w4a16 / bf16",
                   f"{f(v['gptq-w4a16']['served_accepted']['c1'], 3)} / {f(v['bf16']['served_accepted']['c1'], 3)}"),
                  ("largest abs(CPU estimate - vLLM) at c=1, both targets", f"{max(diffs):.3f}"),
                  ("the run above, before the estimator's change: CPU estimate / served",
                   f"{f(b['estimate'], 3)} / {f(b['served'], 3)}"),
                  ("weight-bytes cost ratio of the BF16-saved head / the fp32 head of the run above",
                   f"{f(v['bf16']['cost_ratio'], 3)} / {f(b['cost_ratio'], 3)}"),
                  *((f"the gate ships for {name}", f"{r['shipped']['method']} k={r['shipped']['num_speculative_tokens']} "
                     f"({r['shipped']['basis']})") for name, r in v.items())])


SCHEMES = ("bf16", "int8-w8a8", "fp8-block")


def schemes() -> Table:
    run = RAW / "gpu-schemes"
    walls = stage_walls((run / "repro.log").read_text())
    rows = []
    for v in SCHEMES:
        e, q = run_json(run, f"metrics/eval-{v}.json"), run_json(run, f"metrics/quantize-{v}.json")
        log = (run / "logs" / f"evaluate@{v}.log").read_text()
        kernel = re.search(r"Selected (\w+) for (\w+)", log)
        init = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", log)
        ll = re.search(r"Running loglikelihood requests: 100%[^\[]*\[([0-9:]+)<", log)
        rows.append([v, q["calibration_samples"], f(q["wall_time_s"], 1), f(q["size_after_mb"], 0), f(q["compression_ratio"]),
                     f(e["perplexity_increase_pct"], 4), f(e["kl_divergence"], 5), f(e["top1_agreement"], 4), f(e["greedy_match"], 3),
                     f(e[BYTE_PPL], 4), f(e["lm_eval_domain_heldout_acc"], 4),
                     f"`{kernel[1]}`" if kernel else "BF16 (unquantized)", f(float(init[1]), 1), ll[1], walls.get(f"evaluate@{v}")])
    return table(["variant", "calibration samples", "quantize s", "size MB", "x smaller", "ppl increase %", "KL", "top-1",
                  "greedy match", "lm-eval byte ppl (vLLM)", "lm-eval acc", "vLLM linear kernel", "vLLM engine init s",
                  "64 lm-eval requests (m:ss)", "evaluate stage s"], rows)


def schemes_findings() -> Table:
    run = RAW / "gpu-schemes"
    walls = stage_walls((run / "repro.log").read_text())
    base = run_json(run, "metrics/eval-bf16.json")
    evals = {v: run_json(run, f"metrics/eval-{v}.json") for v in SCHEMES[1:]}
    acc_gap = max(abs(e["lm_eval_domain_heldout_acc"] - base["lm_eval_domain_heldout_acc"]) for e in evals.values())
    last = [line for line in (run / "repro.log").read_text().splitlines() if line.strip()][-1]
    return facts([("BF16 held-out perplexity", f(base["perplexity_baseline"], 4)),
                  ("largest perplexity increase (%)", f"{max(e['perplexity_increase_pct'] for e in evals.values()):.4f}"),
                  ("largest KL", f"{max(e['kl_divergence'] for e in evals.values()):.1e}"),
                  ("lowest top-1 agreement or greedy match",
                   f"{min(min(e['top1_agreement'], e['greedy_match']) for e in evals.values()):.3f}"),
                  ("largest lm-eval accuracy difference from BF16", f"{acc_gap:.4f}"),
                  ("stage `evaluate@fp8-block` / `evaluate@bf16` (s)",
                   f"{walls.get('evaluate@fp8-block')} / {walls.get('evaluate@bf16')}"),
                  ("the repro log's last line", f"`{last}`")])


SERVED_SCHEMES = ("bf16", "nvfp4a16", "fp8-block")


def served_cells(run: Path, serve: dict, variant: str) -> list:
    """The served kernel (from its `vllm serve` log) and plain tok/s at c1 and c32 with the ratio to bf16's."""
    base = serve["bf16"]["configs"]["plain"]["levels"]
    plain = serve[variant]["configs"]["plain"]["levels"]
    kernel = re.search(r"(?:Selected|Using) (\w+Kernel)", (run / "logs" / f"serve_bench@{variant}.plain-server.log").read_text())
    return [f"`{kernel[1]}`" if kernel else "BF16 (unquantized)",
            *[x for c in ("c1", "c32") for x in (f(plain[c]["output_throughput"], 0),
                                                 f(plain[c]["output_throughput"] / base[c]["output_throughput"]))]]


def schemes_served() -> Table:
    run, params, walls, serve = served_run("gpu-schemes-served", SERVED_SCHEMES)
    rows = []
    for v in SERVED_SCHEMES:
        e, q = run_json(run, f"metrics/eval-{v}.json"), run_json(run, f"metrics/quantize-{v}.json")
        plain = serve[v]["configs"]["plain"]
        ll = re.search(r"Running loglikelihood requests: 100%[^\[]*\[([0-9:]+)<", (run / "logs" / f"evaluate@{v}.log").read_text())
        rows.append([v, f(q["size_after_mb"], 0), f(e["perplexity_increase_pct"], 4), f(e["kl_divergence"], 6),
                     f(e["top1_agreement"], 4), f(e["greedy_match"], 3), f(e["lm_eval_domain_heldout_acc"], 4),
                     *served_cells(run, serve, v),
                     f(plain["levels"]["c32"]["ttft_ms"]["p99"], 1), round(plain["startup_s"]), ll[1], walls.get(f"evaluate@{v}")])
    return table(["variant", "size MB", "ppl increase %", "KL", "top-1", "greedy match", "lm-eval acc (vLLM)",
                  "vLLM linear kernel (served)", "plain tok/s c1", "x BF16", "plain tok/s c32", "x BF16", "p99 TTFT ms c32",
                  "engine start s", "64 lm-eval requests (m:ss)", "evaluate stage s"], rows)


def schemes_served_run() -> Table:
    run, params, walls, serve = served_run("gpu-schemes-served", SERVED_SCHEMES)
    return facts([("GPU, vLLM", f"{serve['bf16']['gpu']}, vLLM {serve['bf16']['vllm_version']}"),
                  ("quantize.enabled", ", ".join(params["quantize"]["enabled"])), ("serving.gpu", params["serving"]["gpu"]),
                  ("serve_bench.concurrency", params["serve_bench"]["concurrency"]), ("draft.method", params["draft"]["method"]),
                  ("max tokens per request", serve["bf16"]["max_tokens"])])


def schemes_served_findings() -> Table:
    run, params, walls, serve = served_run("gpu-schemes-served", SERVED_SCHEMES)
    base = serve["bf16"]["configs"]["plain"]["levels"]
    verdict = run_json(run, "verdict.json")["variants"]
    failed = {v: [(c["metric"], c["value"], c["threshold"]) for c in verdict[v]["checks"]
                  if not c["passed"] and not c.get("skipped")] for v in SERVED_SCHEMES}
    ngram = {v: level(serve[v], "ngram", "c1")["output_throughput"] / level(serve[v], "plain", "c1")["output_throughput"]
             for v in SERVED_SCHEMES}
    return facts([("stage `evaluate@fp8-block` (s), on CUTLASS", walls.get("evaluate@fp8-block")),
                  ("the same stage in the `gpu-schemes` run, on DeepGEMM (s; another run, not a ratio)",
                   stage_walls((RAW / "gpu-schemes" / "repro.log").read_text()).get("evaluate@fp8-block")),
                  ("BF16 mean TPOT at c=1 (ms)", f(base["c1"]["tpot_ms"]["mean"])),
                  ("failed gate checks", ", ".join(f"{v} ({m} {x:.4f} against {th})" for v in SERVED_SCHEMES
                                                   for m, x, th in failed[v])),
                  ("n-gram at c=1, x plain decoding", f"x{f(min(ngram.values()))}-x{f(max(ngram.values()))}"),
                  ("duration of each c=32 level (s, 64 requests)",
                   span([level(serve[v], "plain", "c32")["duration_s"] for v in SERVED_SCHEMES])),
                  ("duration of each c=1 level (s)", span([level(serve[v], "plain", "c1")["duration_s"] for v in SERVED_SCHEMES])),
                  ("largest perplexity increase (%)",
                   f"{max(run_json(run, f'metrics/eval-{v}.json')['perplexity_increase_pct'] for v in SERVED_SCHEMES):.4f}")])


TP1 = ("bf16", "int8-w8a8")


def tp1() -> Table:
    run, params, walls, serve = served_run("gpu-tp1", TP1)
    rows = []
    for v in TP1:
        e = run_json(run, f"metrics/eval-{v}.json")
        rows.append([v, f(e["perplexity_increase_pct"], 4), f(e["kl_divergence"], 6), f(e["top1_agreement"], 4),
                     f(e["lm_eval_domain_heldout_acc"], 4), *served_cells(run, serve, v),
                     round(serve[v]["configs"]["plain"]["startup_s"])])
    return table(["variant", "ppl increase %", "KL", "top-1", "lm-eval acc (vLLM)", "vLLM linear kernel (served)",
                  "plain tok/s c1", "x BF16", "plain tok/s c32", "x BF16", "engine start s"], rows)


def tp1_carry() -> Table:
    run = RAW / "gpu-tp1"
    carried = []
    for v in TP1:
        b = run / "bundle" / v
        engine = run_json(run, f"bundle/{v}/engine_args.json")
        serve_yaml = yaml.safe_load((b / "serve.yaml").read_text())
        gpus = sorted({c["resources"]["limits"]["nvidia.com/gpu"] for m in sorted((b / "deploy").glob("*.yaml"))
                       for doc in yaml.safe_load_all(m.read_text()) if doc and doc.get("kind") == "Deployment"
                       for c in doc["spec"]["template"]["spec"]["containers"]})
        logs = [re.search(r"tensor_parallel_size=(\d+)", (run / "logs" / name).read_text())
                for name in (f"evaluate@{v}.log", f"serve_bench@{v}.plain-server.log")]
        carried.append([v, engine["tensor_parallel_size"], serve_yaml["tensor-parallel-size"], ", ".join(map(str, gpus)),
                        logs[0][1] if logs[0] else "n/a", logs[1][1] if logs[1] else "n/a"])
    return table(["bundle", "engine_args.json", "serve.yaml", "manifests' nvidia.com/gpu", "lm-eval's vLLM engine (log)",
                  "serve_bench's vllm serve (log)"], carried)


def tp1_run() -> Table:
    run, params, walls, serve = served_run("gpu-tp1", TP1)
    verdict = run_json(run, "verdict.json")["variants"]
    speedup = next(c["value"] for c in verdict["int8-w8a8"]["checks"] if c["check"] == "min_speedup_vs_bf16")
    receipt = run_json(run, "receipt.json")
    published = ", ".join(f"`{name}`" for name in sorted(str(r.get("name", r)) for r in receipt.get("published", [])))
    return facts([("GPU, vLLM", f"{serve['bf16']['gpu']}, vLLM {serve['bf16']['vllm_version']}"),
                  ("quantize.enabled", ", ".join(params["quantize"]["enabled"])),
                  ("serving.tensor_parallel_size", params["serving"]["tensor_parallel_size"]),
                  ("serving.gpu", params["serving"]["gpu"]), ("draft.method", params["draft"]["method"]),
                  ("`dvc repro` from scratch through `publish` (s)",
                   [int(line.split()[0]) for line in (run / "repro.log").read_text().splitlines() if line[:1].isdigit()][-1]),
                  ("stage `serve_bench@int8-w8a8` (s)", walls.get("serve_bench@int8-w8a8")),
                  ("int8-w8a8's `min_speedup_vs_bf16` (passed)", f"{speedup:.4f}"),
                  ("published", published or "see receipt.json"),
                  ("duration of each c=32 level (s, 64 requests)", span([level(serve[v], "plain", "c32")["duration_s"] for v in TP1])),
                  ("duration of each c=1 level (s)", span([level(serve[v], "plain", "c1")["duration_s"] for v in TP1]))])


def schemes8b_data() -> tuple[dict, dict, dict]:
    run = RAW / "schemes8b"
    bench = {m: run_json(run, f"bench8b-{m}.json") for m in ("bf16", "int8-w8a8", "fp8-block", "fp8-block-no-deepgemm",
                                                              "nvfp4a16")}
    quant = {v: run_json(run, f"quant8b-{v}.json") for v in ("int8-w8a8", "fp8-block", "nvfp4a16")}
    return bench, quant, schemes8b_kernels(run)


def schemes8b() -> Table:
    bench, quant, kernels = schemes8b_data()
    b = bench["bf16"]
    rows = []
    for m, r in bench.items():
        q = quant.get(m.replace("-no-deepgemm", ""))
        rows.append([m, f"`{kernels[m]}`" if m in kernels else "BF16 GEMMs", f(r["tokens_per_s_bs1"], 0),
                     f(r["tokens_per_s_bs1"] / b["tokens_per_s_bs1"]), f(r["tokens_per_s_bs32"], 0),
                     f(r["tokens_per_s_bs32"] / b["tokens_per_s_bs32"]), f(r["load_s"], 0),
                     f(q["wall_time_s"], 1) if q else "-", f(q["size_after_mb"], 0) if q else "-"])
    return table(["model", "linear kernel (vLLM log)", "tok/s bs1", "x BF16", "tok/s bs32", "x BF16", "engine load s",
                  "quantize wall s", "size MB"], rows)


def schemes8b_run() -> Table:
    bench, quant, kernels = schemes8b_data()
    top = max(bench, key=lambda m: bench[m]["tokens_per_s_bs1"])
    return facts([("GPU (gpu.txt)", (RAW / "schemes8b" / "gpu.txt").read_text().strip()),
                  ("checkpoint size in BF16 (MB)", f"{quant['int8-w8a8']['size_before_mb']:.0f}"),
                  ("calibration rows (INT8 W8A8)", quant["int8-w8a8"]["calibration_samples"]),
                  ("FP8 block-wise: kernel with vLLM's default / with DeepGEMM disabled",
                   f"`{kernels['fp8-block']}` / `{kernels['fp8-block-no-deepgemm']}`"),
                  ("NVFP4A16's kernel", f"`{kernels.get('nvfp4a16', '?')}`"), ("fastest at batch 1", top)])


def handoff_check() -> dict:
    return json.loads((RAW / "handoff" / "check.json").read_text())


def handoff_run() -> Table:
    check = handoff_check()
    rows = check["series"]
    return facts([("GPU (gpu.txt)", (RAW / "handoff" / "gpu.txt").read_text().strip()),
                  ("warm-up", "; ".join(check["warmup"])),
                  ("series the rules and the dashboard read, found in the scrape",
                   f"{len(rows) - len(check['missing'])} of {len(rows)}"),
                  ("missing", ", ".join(check["missing"]) or "none"),
                  ("speculative acceptance over the load (counter deltas)", f(check["acceptance_over_load"], 3))])


def handoff_series() -> Table:
    return table(["series", "label matchers", "samples in the scrape"],
                 [[f"`{r['series']}`", ", ".join(f'{k}="{v}"' for k, v in r["matchers"].items()) or "(none)", r["samples"]]
                  for r in handoff_check()["series"]])


def handoff_alerts() -> Table:
    return table(["alert", "threshold", "would fire on this load"],
                 [[a, f(x["threshold"], 4), "yes" if x["would_fire"] else "no"]
                  for a, x in handoff_check()["acceptance_alerts"].items()])


def tiers_data():
    run = RAW / "gpu-tiers"
    serve = run_json(run, "serve/bf16/record.json")
    params = yaml.safe_load((run / "params.yaml").read_text())
    return run, serve, params


def tiers_rows() -> tuple[list, dict]:
    run, serve, params = tiers_data()
    tiers = params["serving"]["tiers"]
    rows, speedups = [], {}
    sweeps = [("default", serve["configs"], params["serving"].get("max_num_seqs"))]
    sweeps += [(t, serve["tiers"][t], tiers[t].get("max_num_seqs")) for t in serve["tiers"]]
    for name, configs, seqs in sweeps:
        plain = configs["plain"]
        for c in sorted(plain["levels"], key=lambda c: int(c[1:])):
            for m, cfg in configs.items():
                lv = cfg["levels"][c]
                ratio = lv["output_throughput"] / plain["levels"][c]["output_throughput"]
                if m != "plain":
                    speedups[(name, c)] = ratio
                rows.append([name, seqs, lv["concurrency"], m, cfg["num_speculative_tokens"] or "-",
                             f(lv["output_throughput"], 0), f(ratio), f(lv["ttft_ms"]["p99"], 1), f(lv["itl_ms"]["p99"], 1),
                             f(lv["accepted_per_draft_token"], 3) if lv["accepted_per_draft_token"] is not None else "-",
                             round(cfg["startup_s"])])
    return rows, speedups


def tiers() -> Table:
    return table(["tier", "max_num_seqs", "concurrency", "config", "k", "output tok/s", "x plain", "p99 TTFT ms", "p99 ITL ms",
                  "vLLM accepted/drafted", "engine start s"], tiers_rows()[0])


def tiers_run() -> Table:
    run, serve, params = tiers_data()
    walls = stage_walls((run / "repro.log").read_text())
    return facts([("GPU, vLLM", f"{serve['gpu']}, vLLM {serve['vllm_version']}"),
                  ("stage `serve_bench@bf16` (s), four `vllm serve` starts", walls.get("serve_bench@bf16")),
                  ("serving.tiers.throughput", ", ".join(f"{k} {v}" for k, v in params["serving"]["tiers"]["throughput"].items()))])


def tiers_decision() -> Table:
    run, serve, params = tiers_data()
    verdict = run_json(run, "verdict.json")["variants"]["bf16"]["speculation"]
    thr = [v for (t, c), v in tiers_rows()[1].items() if t == "throughput"]
    return facts([("the gate ships for the default tier", f"**{verdict['method']} k={verdict['num_speculative_tokens']}** "
                   f"({verdict['reason']})"),
                  ("the same head at the throughput tier's settings, x plain decoding", f"x{f(min(thr))}"),
                  ("at concurrency", params["serving"]["tiers"]["throughput"]["concurrency"]),
                  ("serving.speculation.min_gain", params["serving"]["speculation"]["min_gain"])])


def tiers_card() -> Text:
    lines = (RAW / "gpu-tiers" / "bundle/bf16/README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| tier | config |"))
    return Text("\n".join(lines[start:lines.index("", start)]))


def profile_data():
    s = profile_summary()
    variants = s["variants"]
    return (s, yaml.safe_load((PROFILE / "params.yaml").read_text()),
            {v: run_json(PROFILE, f"serve/{v}/record.json") for v in variants},
            {v: run_json(PROFILE, f"metrics/eval-{v}.json") for v in variants},
            {v: run_json(PROFILE, f"metrics/quantize-{v}.json") for v in variants})


def profile_run() -> Table:
    s, params, serve, evals, quant = profile_data()
    m = s["models"]
    return facts([("GPU, vLLM", f"{s['gpu']}, vLLM {s['vllm']}"),
                  ("target parameters (B)", f"{m['target']['params'] / 1e9:.2f}"), ("vocabulary", m["vocab_size"]),
                  ("draft parameters (M)", f"{m['draft']['params'] / 1e6:.0f}"),
                  ("target / draft size", f"{m['target']['params'] / m['draft']['params']:.0f}x"),
                  ("pretraining tokens, domain / generic (M)",
                   f"{m['pretraining_tokens']['domain'] / 1e6:.1f} / {m['pretraining_tokens']['general'] / 1e6:.1f}"),
                  ("target: steps, time (s), final loss",
                   f"{m['target']['train_steps']}, {m['target']['train_s']:.0f}, {m['target']['final_loss']:.2f}"),
                  ("draft: steps, time (s)", f"{m['draft']['train_steps']}, {m['draft']['train_s']:.0f}"),
                  ("variants", ", ".join(s["variants"]))])


def profile_walls() -> Table:
    return table(["stage", "wall s"], [[name, "n/a (the log ends at the stage's start)" if w is None else w]
                                       for name, w in profile_summary()["stage_walls"].items()])


def profile_quality() -> Table:
    s, params, serve, evals, quant = profile_data()
    return table(["variant", "size MB", "quantize s", "ppl change %", "KL", "top-1", "greedy match", "lm-eval byte ppl (vLLM)"],
                 [[v, f(quant[v]["size_after_mb"], 0), f(quant[v]["wall_time_s"], 1),
                   f(evals[v]["perplexity_increase_pct"], 4), f(evals[v]["kl_divergence"], 5),
                   f(evals[v]["top1_agreement"], 4), f(evals[v]["greedy_match"]), f(evals[v][BYTE_PPL], 4)]
                  for v in s["variants"]])


def profile_draft() -> Table:
    s, params, serve, evals, quant = profile_data()
    d = s["draft"]
    return facts([("BF16 held-out perplexity", f(evals["bf16"]["perplexity_baseline"], 4)),
                  ("draft token acceptance on held-out prompts, before / after fine-tuning",
                   f"{f(d['token_acceptance_untrained'], 3)} / {f(d['token_acceptance_finetuned'], 3)}"),
                  (f"draft accepted/drafted at k={d['num_speculative_tokens_finetuned']}, before / after",
                   f"{f(d['accepted_per_draft_token_untrained'], 3)} / {f(d['accepted_per_draft_token_finetuned'], 3)}")])


def profile_serving() -> Table:
    s, params, serve, evals, quant = profile_data()
    rows = []
    for v in s["variants"]:
        for cfg in ("plain", "speculative"):
            for key in LEVELS:
                lv = level(serve[v], cfg, key)
                ratio = lv["output_throughput"] / level(serve["bf16"], "plain", key)["output_throughput"]
                rows.append([v, cfg, lv["concurrency"], f(lv["output_throughput"], 0), f(ratio), f(lv["ttft_ms"]["p50"], 1),
                             f(lv["ttft_ms"]["p99"], 1), f(lv["itl_ms"]["p50"]), f(lv["itl_ms"]["p99"]),
                             f(lv["tpot_ms"]["p50"]), f(lv["accepted_per_draft_token"], 3), lv["failed"]])
    return table(["variant", "config", "concurrency", "output tok/s", "x BF16 plain", "TTFT p50 ms", "TTFT p99 ms",
                  "ITL p50 ms", "ITL p99 ms", "TPOT p50 ms", "accepted/drafted", "failed"], rows)


def profile_acceptance() -> Table:
    s, params, serve, evals, quant = profile_data()
    return table(["variant", "CPU estimate accepted/drafted (k=%d)" % s["k"], "vLLM served, c=1", "abs diff",
                  "CPU estimate per position", "vLLM per position (c=1)"],
                 [[v, f(e["cpu_estimate"], 3), f(e["vllm_c1"], 3), f(e["abs_diff"], 3),
                   ", ".join(f(x) for x in run_json(PROFILE, f"eval/{v}/speculative.json")["accepted_per_position"]),
                   ", ".join(f(x) for x in level(serve[v], "speculative", "c1")["accepted_per_position"])]
                  for v, e in s["estimate_vs_vllm"].items()])


def profile_acceptance_conditions() -> Table:
    s, params, serve, evals, quant = profile_data()
    return facts([("CPU estimator: prompts", run_json(PROFILE, "eval/bf16/speculative.json")["prompts"]),
                  ("CPU estimator: continuation tokens at most", params["evaluate"]["acceptance"]["continuation_tokens"]),
                  ("vLLM, speculative server at c=1: prompts", level(serve["bf16"], "speculative", "c1")["num_prompts"])])


def profile_targets() -> Table:
    s = profile_summary()
    names = {"int4_c1": f"INT4 ({s['int4']}) tok/s vs BF16, c=1", "fp8_c1": f"FP8 ({s['fp8']}) tok/s vs BF16, c=1",
             "best_speculative_c1": f"best speculative setting ({s['best_speculative']}, k={s['k']}) vs its plain, c=1",
             "speculative_accepted_per_drafted": "its vLLM accepted/drafted, c=1",
             "slowest_vs_bf16_c32": "slowest variant vs BF16, c=32 (plain)"}
    return table(["target", "needs", "measured", "met"],
                 [[names[k], f">= {t['target']}", f(t["measured"]), "yes" if t["met"] else
                   f"no (short by {t['target'] - t['measured']:.2f})"] for k, t in s["targets"].items()]
                 + [["CPU estimate vs vLLM accepted/drafted (largest abs diff)", f"<= {ESTIMATE_TOLERANCE}",
                     f(s["estimate_max_abs_diff"], 3), "yes" if s["estimate_within_tolerance"] else "no"]])


def profile_why() -> Table:
    s, params, serve, evals, quant = profile_data()
    cost = s["implied_draft_cost"]
    return facts([("BF16 weights read per plain step (MB)", f"{quant['bf16']['size_after_mb']:.0f}"),
                  ("BF16 plain mean TPOT at c=1 (ms)", f(level(serve["bf16"], "plain", "c1")["tpot_ms"]["mean"])),
                  ("effective weight bandwidth (TB/s)", f"{s['bf16_effective_weight_tb_per_s']:.2f}"),
                  ("plain tok/s vs BF16 at c=1", f"{s['fp8']} {f(s['vs_bf16']['c1'][s['fp8']])}x, "
                                                f"{s['int4']} {f(s['vs_bf16']['c1'][s['int4']])}x"),
                  ("plain tok/s vs BF16 at c=32", ", ".join(f"{v} {f(s['vs_bf16']['c32'][v])}x" for v in s["variants"]
                                                           if v != "bf16")),
                  ("at the Llama-3-8B shape, batch 1 (fp8-dynamic, gptq-w4a16)",
                   f"{f(gpu_bench8b_ratio('fp8-dynamic'))}x, {f(gpu_bench8b_ratio('gptq-w4a16'))}x"),
                  ("vLLM accepted/drafted at c=1, draft model", span([e["vllm_c1"] for e in s["estimate_vs_vllm"].values()], 3)),
                  ("target steps one drafted token costs as served (`implied_served_draft_cost`)", span(cost.values())),
                  ("what the weight-bytes model assumes", span(s["weight_bytes_cost_ratio"].values(), 3))])


def code(path: Path) -> Text:
    return Text("```\n" + path.read_text().rstrip() + "\n```")


def refactor() -> Table:
    rows = []
    for v in REFACTOR_VARIANTS:
        r = load(f"after-graph-refactor/stage-evaluate-{v}")
        m, g = r["summary"], r["vllm"]
        rows.append([v, r["stage_wall_s"], f(m["perplexity_increase_pct"], 3), f(m["kl_divergence"], 5),
                     f(m["top1_agreement"], 4), g["num_speculative_tokens"], f(m["accepted_per_draft_token"], 3),
                     f(g["accepted_per_draft_token"], 3), f(abs(m["accepted_per_draft_token"] - g["accepted_per_draft_token"]), 3),
                     f(g["speculative_speedup"]["bs1"]), f(g["speculative_speedup"]["bs32"]),
                     "yes" if g["speculative_output_matches_baseline"] else "NO"])
    return table(["variant", "stage wall s", "ppl change %", "KL", "top-1", "k", "estimate accepted/draft token",
                  "vLLM accepted/draft token", "abs diff", "vLLM speedup bs1", "bs32", "greedy output identical"], rows)


def stage_data():
    stage = {v: load(f"stage-evaluate-{v}") for v in VARIANTS}
    return stage, {v: load(f"cpu-eval-{v}") for v in VARIANTS}, {v: load(f"cpu-estimate-{v}") for v in VARIANTS}


def stage_conditions() -> Table:
    s = gpu_summary()
    stage, _, _ = stage_data()
    return facts([("held-out prompts (vLLM)", span(s["vllm_prompts"], 0)),
                  ("max tokens, stopping at EOS", span([r["vllm"]["max_tokens"] for r in stage.values()], 0)),
                  ("k (the stage's choice)", span([r["vllm"]["num_speculative_tokens"] for r in stage.values()], 0))])


def stage_table() -> Table:
    stage, cpu, schedule = stage_data()
    rows = []
    for v, r in stage.items():
        g, sp = r["vllm"], r["speculative"]
        rows.append([v, r["lm_eval"]["backend"], f(r["summary"][BYTE_PPL], 4), f(cpu[v][BYTE_PPL], 4),
                     g["num_speculative_tokens"],
                     f(g["acceptance_rate"], 3), f(schedule[v]["accepted_per_draft_token"], 3),
                     f(sp["accepted_per_draft_token"], 3),
                     f(g["baseline_tokens_per_s_bs1"], 0), f(g["speculative_tokens_per_s_bs1"], 0),
                     f(g["measured_speedup_bs1"]), f(g["measured_speedup_bs32"]), r["stage_wall_s"]])
    return table(["variant", "lm-eval backend", "byte ppl (GPU, vllm)", "byte ppl (CPU, hf)", "k",
                  "vLLM accepted/drafted", "CPU estimate", "CPU estimate, every-position drafts (before)",
                  "tok/s bs1", "+draft", "speedup bs1", "speedup bs32", "stage wall s"], rows)


def stage_positions() -> Table:
    stage, _, schedule = stage_data()
    return table(["variant", "vLLM accepted per position", "CPU estimate per position"],
                 [[v, " / ".join(f(a) for a in r["vllm"]["accepted_per_position"]),
                   " / ".join(f(a) for a in schedule[v]["accepted_per_position"])] for v, r in stage.items()])


def stage_findings() -> Table:
    s = gpu_summary()
    return facts([("largest abs(CPU estimate - vLLM accepted/drafted)", f(s["cpu_estimate_max_abs_diff"], 3)),
                  ("every-position estimator: low by", span(s["every_position_estimate_low_by"].values(), 3)),
                  ("CPU estimate prompts / vLLM prompts", f"{span(s['cpu_estimate_prompts'], 0)} / {span(s['vllm_prompts'], 0)}"),
                  ("largest abs difference of lm-eval byte perplexity, vLLM against hf", f"{s['byte_ppl_max_abs_diff_gpu_vs_cpu']:.0e}"),
                  ("measured speedup at batch 1", span(s["stage_speedup_bs1"].values())),
                  ("target steps one drafted token costs (implied)", span(s["implied_draft_cost"].values(), 1)),
                  ("what the weight-bytes model assumes", span(s["weight_bytes_cost_ratio"].values()))])


def eos_fix() -> Table:
    stage, _, _ = stage_data()
    before = {v: load(f"before-eos-fix/stage-evaluate-{v}") for v in VARIANTS}
    return table(["variant", "vLLM accepted/drafted, forced past EOS (before)", "CPU estimate in that run",
                  "vLLM, stopping at EOS (after)"],
                 [[v, f(before[v]["vllm"]["acceptance_rate"], 3), f(before[v]["speculative"]["accepted_per_draft_token"], 3),
                   f(stage[v]["vllm"]["acceptance_rate"], 3)] for v in VARIANTS])


def eos_ratio() -> Table:
    return facts([("vLLM accepted/drafted over the CPU estimate, forced past EOS",
                   span(gpu_summary()["before_eos_fix_vllm_over_cpu_estimate"].values()))])


def speed8b() -> Table:
    bench = {m: load(f"bench8b-{m}") for m in BENCH8B}
    b1, b32 = bench["bf16"]["tokens_per_s_bs1"], bench["bf16"]["tokens_per_s_bs32"]
    return table(["model (Llama-3-8B shape)", "tok/s bs1", "x BF16", "tok/s bs32", "x BF16", "engine load s"],
                 [[m, f(r["tokens_per_s_bs1"], 0), f(r["tokens_per_s_bs1"] / b1), f(r["tokens_per_s_bs32"], 0),
                   f(r["tokens_per_s_bs32"] / b32), f(r["load_s"], 0)] for m, r in bench.items()])


def quant8b() -> Table:
    return table(["variant", "calibration samples", "quantize wall s", "peak GPU MB", "size MB", "x smaller"],
                 [[v, q["calibration_samples"], f(q["wall_time_s"], 1), f(q["peak_memory_mb"], 0),
                   f(q["size_after_mb"], 0), f(q["compression_ratio"])]
                  for v in BENCH8B[1:] for q in [load(f"quant8b-{v}")]])


def demo_data() -> dict:
    return {v: load(f"demo-{v}") for v in ["bf16", *VARIANTS]}


def demo_conditions() -> Table:
    demo = demo_data()
    return facts([("held-out prompts", span([r["prompts"] for r in demo.values()], 0)),
                  ("new tokens forced (`ignore_eos`)", span([r["max_tokens"] for r in demo.values()], 0)),
                  ("k of the BF16 row", demo["bf16"]["num_speculative_tokens"]),
                  ("quantized targets' batch-1 speedup", span(gpu_summary()["demo_speedup_bs1_quantized_range"]))])


def demo_speed() -> Table:
    rows = []
    for v, r in demo_data().items():
        rows.append([v, r["num_speculative_tokens"], f(r["baseline_tokens_per_s_bs1"], 0),
                     f(r["speculative_tokens_per_s_bs1"], 0), f(r["measured_speedup_bs1"]),
                     f(r["baseline_tokens_per_s_bs32"], 0), f(r["speculative_tokens_per_s_bs32"], 0),
                     f(r["measured_speedup_bs32"]), "yes" if r["spec_output_matches_baseline"] else "NO"])
    return table(["target", "k", "tok/s bs1", "+draft", "speedup", "tok/s bs32", "+draft", "speedup",
                  "greedy output identical"], rows)


def demo_acceptance() -> Table:
    demo = demo_data()
    rows = []
    for v in VARIANTS:
        r = demo[v]
        cpu, k = r["cpu_estimate"], r["num_speculative_tokens"]
        rows.append([v, k, f(r["acceptance_rate"], 3), f(cpu["expected_accepted_tokens"] / k, 3),
                     f(r["mean_accepted_tokens"]), f(cpu["expected_accepted_tokens"]),
                     " / ".join(f(a) for a in r["accepted_per_position"]),
                     " / ".join(f(a) for a in cpu["accepted_per_position"])])
    return table(["target", "k", "vLLM accepted/drafted", "CPU estimate", "vLLM mean accepted", "CPU expected accepted",
                  "vLLM per position", "CPU per position"], rows)


def quality() -> Table:
    gq, agree = load("quality-gpu"), load("greedy-agreement")
    return table(["variant", "ppl increase %", "KL (baseline‖variant)", "top-1 agreement", "vLLM greedy token agreement"],
                 [[v, f(gq[v]["perplexity_increase_pct"], 3), f(gq[v]["kl_divergence"], 5), f(gq[v]["top1_agreement"], 4),
                   f(agree[v], 3)] for v in VARIANTS])


def quality_tokens() -> Table:
    gq = load("quality-gpu")
    return facts([("response tokens of held-out conversations", span([gq[v]["tokens"] for v in VARIANTS], 0))])


def serve_result() -> Table:
    serve = load("serve")
    return facts([("bundle", "gptq-w4a16"), ("server start (s)", f(serve.get("startup_s"), 0)),
                  ("answered a chat request", serve["ok"]),
                  ('reply to "How do I rotate an API key in Nimbus Storage?"', f'"{serve.get("reply", serve.get("error"))}"')])


def serve_yaml() -> Text:
    return Text("```yaml\n" + load("serve")["serve_yaml"].rstrip() + "\n```")


def gpu_test() -> Table:
    t = gpu_summary()["gpu_test"]
    return facts([("k", t["k"]), ("vLLM accepted/drafted", f(t["vllm_accepted_per_drafted"], 3)),
                  ("CPU estimate", f(t["cpu_estimate"], 3))])


BLOCKS = {
    "methods-run": methods_run, "methods": methods_table, "methods-decision": methods_decision,
    "eagle3-variants-run": eagle3_variants_run, "eagle3-variants": eagle3_variants, "eagle3-positions": eagle3_positions,
    "eagle3-variants-findings": eagle3_variants_findings,
    "schemes": schemes, "schemes-findings": schemes_findings,
    "schemes-served-run": schemes_served_run, "schemes-served": schemes_served, "schemes-served-findings": schemes_served_findings,
    "tp1-run": tp1_run, "tp1-carry": tp1_carry, "tp1": tp1,
    "schemes8b-run": schemes8b_run, "schemes8b": schemes8b,
    "handoff-run": handoff_run, "handoff-series": handoff_series, "handoff-alerts": handoff_alerts,
    "tiers-run": tiers_run, "tiers": tiers, "tiers-decision": tiers_decision, "tiers-card": tiers_card,
    "profile-run": profile_run, "profile-walls": profile_walls, "profile-quality": profile_quality,
    "profile-draft": profile_draft, "profile-serving": profile_serving,
    "profile-acceptance-conditions": profile_acceptance_conditions, "profile-acceptance": profile_acceptance,
    "profile-targets": profile_targets, "profile-why": profile_why,
    "profile-gate": lambda: code(PROFILE / "gate.txt"),
    "refactor": refactor,
    "stage-conditions": stage_conditions, "stage": stage_table, "stage-positions": stage_positions,
    "stage-findings": stage_findings, "stage-gate": lambda: code(RAW / "evaluate-stage" / "gate-on-gpu-metrics.txt"),
    "eos-ratio": eos_ratio, "eos-fix": eos_fix,
    "speed8b": speed8b, "quant8b": quant8b,
    "demo-conditions": demo_conditions, "demo-speed": demo_speed, "demo-acceptance": demo_acceptance,
    "quality-tokens": quality_tokens, "quality": quality,
    "serve": serve_result, "serve-yaml": serve_yaml,
    "gpu-test": gpu_test, "gpu-test-transcript": lambda: code(RAW / "gpu-tests" / "test-gpu.txt"),
}
