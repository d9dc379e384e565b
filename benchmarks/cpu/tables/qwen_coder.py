"""Tables of benchmarks/cpu/QWEN-CODER.md: the two Qwen2.5-Coder chunked-GGUF sources fetched and converted on the
2-core dev machine (benchmarks/cpu/qwen_coder_sources.py -> raw/qwen-coder/sources.json), and single steps of the
qwen-coder profile's stages (benchmarks/cpu/qwen_coder_steps.py -> raw/qwen-coder/steps.json)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from render import Column, Table, Text, facts, num, table  # noqa: E402

RAW = ROOT / "benchmarks/cpu/raw/qwen-coder"
GPU = ROOT / "benchmarks/gpu/raw/qwen-coder-gpu"  # the GPU profile's run on an H100, through evaluate@bf16
HOST = ROOT / "benchmarks/gpu/raw/qwen-coder-gpu-2"  # on a 4x H100 host: every variant evaluated, BF16 served
HOST_B = ROOT / "benchmarks/gpu/raw/qwen-coder-gpu-3"  # the same host kind: BF16 and W4A16 served in one run
HOST_C = ROOT / "benchmarks/gpu/raw/qwen-coder-gpu-4"  # every variant served with every method, the gate on the host
VARIANTS = ("bf16", "fp8-dynamic", "gptq-w4a16")
CONCURRENCY = (1, 8, 32)
CONFIGS = ("plain", "draft_model", "eagle3", "ngram")  # serve_bench's configs: plain decoding, then each method


def read(run: Path, name: str) -> dict:
    """A JSON file of a raw run folder."""
    return json.loads((run / name).read_text())


def raw(name: str) -> dict:
    return read(RAW, name)


def load(row: dict) -> str:
    return f"{row['loadavg_start']:.1f} / {row['loadavg_end']:.1f}"


def conversion() -> Table:
    rows = [{"source": s, **r} for s, r in raw("sources.json")["fetch"].items()]
    return table(
        rows,
        [
            Column("source", lambda r: f"`{r['source']}`"),
            Column("GGUF bytes", lambda r: f"{r['gguf_bytes']:,}"),
            Column("fetch + assemble s", lambda r: num(r["fetch_s"], 0)),
            Column("hash + convert s", lambda r: num(r["verify_and_convert_s"], 0)),
            Column("peak RSS GiB", lambda r: num(r["peak_rss_gib"], 1)),
            Column("checkpoint GB", lambda r: num(r["converted_bytes"] / 1e9, 2)),
            Column("load avg start / end", load),
        ],
    )


def pair() -> Table:
    check = raw("sources.json")["check"]
    rows = [{"source": s, **m} for s, m in check["models"].items()]
    return table(
        rows,
        [
            Column("source", lambda r: f"`{r['source']}`"),
            Column("parameters", lambda r: f"{r['parameters'] / 1e9:.2f}B"),
            Column("layers", lambda r: str(r["num_hidden_layers"])),
            Column("hidden / MLP", lambda r: f"{r['hidden_size']} / {r['intermediate_size']}"),
            Column("tied embeddings", lambda r: str(r["tie_word_embeddings"]).lower()),
            Column("vocab (config / tokenizer)", lambda r: f"{r['vocab_size']:,} / {r['tokenizer_tokens']:,}"),
            Column("eos", lambda r: f"`{r['eos_token']}` ({r['eos_token_id']})"),
            Column("greedy tokens, s", lambda r: f"{r['greedy_tokens']}, {num(r['greedy_s'], 0)}"),
            Column("stopped at eos", lambda r: str(r["stopped_at_eos"]).lower()),
        ],
    )


def completions() -> Text:
    check = raw("sources.json")["check"]
    compat = raw("sources.json").get("compat", {})
    parts = [
        f"Prompt (chat template, greedy, at most 96 new tokens): {check['prompt']}\n\n"
        f"draft_compat.check_compatible(1.5B, 0.5B) in the `check` run: {check['compatible']}\n\n"
        f"The same check alone (`compat`), at {compat.get('commit', '-')}: "
        f"{compat.get('compatible', 'not run')}\n"
    ]
    for source, m in check["models"].items():
        parts.append(f"`{source}`:\n\n````\n{m['greedy'].strip()}\n````\n")  # the answers hold ``` fences
    return Text("\n".join(parts).rstrip())


def steps() -> Table:
    s = raw("steps.json")
    rows = []
    if "train" in s:
        t = s["train"]
        rows.append(
            (
                f"draft fine-tune step: 0.5B forward+backward+AdamW, float32, batch {t['batch']} x {t['seq']} tokens",
                t["step_s"],
                t["step_cpu_s"],
                t,
            )
        )
    if "forward" in s:
        f = s["forward"]
        rows.append(
            (
                f"teacher-forced forward: 1.5B, {f['dtype']}, 1 x {f['forward_seq']} tokens",
                f["forward_s"],
                f["forward_cpu_s"],
                f,
            )
        )
        rows.append(
            (
                f"greedy decode: 1.5B, batch {f['generate_batch']}, {f['generate_prompt']}-token prompts, "
                f"{f['generate_new_tokens']} new tokens",
                f["generate_s"],
                f["generate_cpu_s"],
                f,
            )
        )
    if "gptq" in s:
        g = s["gptq"]
        rows.append(
            (
                f"GPTQ W4A16: the 1.5B's first {g['layers']} layers, {g['samples']} samples x "
                f"{g['max_seq_length']} tokens (whole oneshot: load, calibrate, save)",
                [g["wall_s"]],
                [g["cpu_s"]],
                g,
            )
        )
    return Table(
        ("step", "wall s (each timed run)", "CPU s (both threads)", "peak RSS GiB", "load avg start / end"),
        tuple(
            (
                what,
                ", ".join(num(x, 2) for x in wall),
                ", ".join(num(x, 2) for x in cpu),
                num(r["peak_rss_gib"], 1),
                load(r),
            )
            for what, wall, cpu, r in rows
        ),
    )


def machine() -> Table:
    m = raw("sources.json")
    return facts(
        [
            ("CPUs", m["machine"]["cpus"]),
            ("memory GiB", m["machine"]["memory_gib"]),
            ("Python", m["machine"]["python"]),
            ("transformers", m["software"]["transformers"]),
        ]
    )


def repro_raw(name: str) -> dict:
    return raw(f"repro/{name}")


def repro_stages() -> Table:
    b = repro_raw("build.json")
    rows = [*b["stages"], {"stage": "**total** (`dvc repro`)", "s": b["total_s"]}]
    return table(
        rows,
        [
            Column("stage", lambda r: r["stage"]),
            Column("wall s", lambda r: num(r["s"], 0)),
            Column("min", lambda r: num(r["s"] / 60, 1)),
        ],
    )


FIDELITY = (  # a variant's metrics/eval-<v>.json against the unquantized target
    Column("held-out perplexity", lambda r: num(r["perplexity"], 3)),
    Column("increase %", lambda r: num(r["perplexity_increase_pct"], 2)),
    Column("KL", lambda r: num(r["kl_divergence"], 4)),
    Column("top-1", lambda r: num(r["top1_agreement"], 3)),
)


def repro_quality() -> Table:
    b = repro_raw("build.json")
    enabled = next(c["profile"] for k, c in b["profile_changes"].items() if k == "quantize.enabled")
    rows = [{"variant": v, **repro_raw(f"metrics/eval-{v}.json")} for v in enabled]
    verdict = repro_raw("verdict.json")["variants"]
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            *FIDELITY,
            Column("pass@1 (tasks)", lambda r: f"{num(r['pass_at_1'], 2)} ({r['functional_tasks']})"),
            Column(
                "acceptance per drafted token: draft / EAGLE-3 / n-gram",
                lambda r: " / ".join(num(m["accepted_per_draft_token"], 3) for m in r["methods"]),
            ),
            Column("gate", lambda r: "PASS" if verdict[r["variant"]]["passed"] else "FAIL"),
        ],
    )


def repro_machine() -> Table:
    b = repro_raw("build.json")
    return facts(
        [
            ("commit", b["commit"][:7]),
            ("date", b["date"]),
            ("CPUs", b["cpus"]),
            ("torch threads", b["torch_threads"]),
            ("dvc repro exit", b["dvc_repro_rc"]),
            ("load avg (1 min) start / end", f"{b['load_start'][0]} / {b['load_end'][0]}"),
        ]
    )


def gpu_quality() -> Table:
    m, f = read(GPU, "metrics/eval-bf16.json"), read(GPU, "eval/bf16/functional.json")["baseline"]
    lm = read(GPU, "eval/bf16/lm_eval.json")
    return facts(
        [
            ("held-out rows scored (tokens)", f"{lm['samples']['domain_heldout']} ({m['tokens']})"),
            ("held-out answer perplexity", num(m["perplexity"], 3)),
            (
                "lm-eval domain_heldout byte perplexity (vLLM)",
                num(lm["scores"]["domain_heldout"]["byte_perplexity"], 4),
            ),
            ("HumanEval tasks", f["tasks"]),
            ("pass@1, greedy", num(f["pass_at_1"], 3)),
            ("outcomes", ", ".join(f"{k} {v}" for k, v in f["outcomes"].items() if v)),
            (
                "failed completions holding a `<|...|>` control token",
                sum(
                    r["outcome"] != "passed" and re.search(r"<\|[a-z_]+\|>", r["completion"]) is not None
                    for r in f["results"]
                ),
            ),
        ]
    )


FINISHED = re.compile(r"Stage '(?P<stage>[^']+)' finished in (?P<s>\d+) s on GPUs (?P<gpus>[\d,]+)")
FAILED = re.compile(r"ERROR: failed to reproduce '(?P<stage>[^']+)'")
HOST_RUNS = {"A": HOST, "B": HOST_B, "C": HOST_C}


def stages_of(run: Path) -> Table:
    """Each stage's wall time on the 4x H100 host, from the run's log (lines prefixed with the seconds since the
    background command started): a `dvc repro` stage from its `Running stage` line to the next stage's start (or the
    log's end), the stage groups' from their own `finished in` lines (benchmarks/gpu/stage_groups.py), with the GPUs
    each ran on. A stage the last `dvc repro` ran again says so; one that failed, too."""
    lines = [line.partition(" ") for line in (run / "repro.log").read_text().splitlines()]
    rows, repro, starts, failed = [], [], [], set()
    for t, _, text in lines:
        if text.startswith("Running stage '"):
            starts.append(int(t))
            if " on GPUs " not in text:
                repro.append((text.split("'")[1].removeprefix("stages/dvc.yaml:"), int(t)))
        elif m := FINISHED.search(text):
            rows.append({"stage": m["stage"], "gpus": m["gpus"], "s": int(m["s"]), "end": int(t)})
        elif m := FAILED.search(text):
            failed.add(m["stage"])
    last = int(lines[-1][0])
    seen: set[str] = set()
    repro_rows = []
    for name, start in repro:
        end = min((t for t in starts if t > start), default=last)
        label = (
            name + (" (again: the last `dvc repro`)" if name in seen else "") + (" (failed)" if name in failed else "")
        )
        seen.add(name)
        repro_rows.append({"stage": label, "gpus": "all", "s": end - start, "end": end})
    waited = {"stage": "(the two GGUFs converted after their last pieces; the run waited for them)", "gpus": "-"}
    out = [{**waited, "s": repro[0][1], "end": repro[0][1]}, *repro_rows, *rows]
    return table(
        sorted(out, key=lambda r: r["end"]),
        [
            Column("stage", lambda r: r["stage"]),
            Column("GPUs", lambda r: r["gpus"]),
            Column("wall s", lambda r: num(r["s"], 0)),
            Column("ended, s from the start", lambda r: num(r["end"], 0)),
        ],
    )


def host_c_stages() -> Table:
    return stages_of(HOST_C)


def variant_metrics(run: Path) -> list[dict]:
    """Each variant's metrics/eval-<v>.json in a run, with its name."""
    return [{"variant": v, **read(run, f"metrics/eval-{v}.json")} for v in VARIANTS]


VARIANT_FIDELITY = (Column("variant", lambda r: f"`{r['variant']}`"), *FIDELITY)


def host_quality() -> Table:
    """Each variant against the unquantized target on the GPU: held-out code traffic (teacher-forced), lm-eval
    through vLLM, HumanEval pass@1 (the variant's and the BF16 target's, measured in the same evaluate process)."""
    return table(
        variant_metrics(HOST),
        [
            *VARIANT_FIDELITY,
            Column("greedy match (16 prompts)", lambda r: num(r["greedy_match"], 3)),
            Column("lm-eval byte perplexity (vLLM)", lambda r: num(r["lm_eval_domain_heldout_byte_perplexity"], 4)),
            Column(
                "pass@1 of 164: variant / BF16 in the same run (drop)",
                lambda r: (
                    f"{num(r['pass_at_1'], 3)} / {num(r['pass_at_1_baseline'], 3)} ({num(r['pass_at_1_drop'], 3)})"
                ),
            ),
        ],
    )


def host_c_quality() -> Table:
    """pass@1 of each variant over 64 HumanEval tasks against the BF16 target's, recorded once by stage
    functional_baseline (the same for every variant); run B's pass@1 and perplexity beside run C's."""
    b = {r["variant"]: r for r in variant_metrics(HOST_B)}
    return table(
        variant_metrics(HOST_C),
        [
            *VARIANT_FIDELITY,
            Column("pass@1 of 64: variant", lambda r: num(r["pass_at_1"], 3)),
            Column("BF16 target (recorded once)", lambda r: num(r["pass_at_1_baseline"], 3)),
            Column("drop", lambda r: num(r["pass_at_1_drop"], 3)),
            Column("tasks passed", lambda r: f"{round(r['pass_at_1'] * 64)} of 64"),
            Column(
                "run B: perplexity, pass@1",
                lambda r: f"{num(b[r['variant']]['perplexity'], 3)}, {num(b[r['variant']]['pass_at_1'], 3)}",
            ),
        ],
    )


BENCH_KEYS = {
    "output": "Output token throughput (tok/s)",
    "tpot": "Mean TPOT (ms)",
    "itl_p99": "P99 ITL (ms)",
    "ok": "Successful requests",
    "failed": "Failed requests",
    "accept": "Acceptance rate (%)",
    "length": "Acceptance length",
    "duration": "Benchmark duration (s)",
}


def bench_runs(path: Path) -> list[dict]:
    """`vllm bench serve`'s own report, one per run in a serve_bench log (each begins with its Namespace line, which
    names the result file `<config>-c<concurrency>.json`)."""
    runs = []
    for block in path.read_text().split("Namespace(")[1:]:
        config, c = re.search(r"result_filename='([^']+)-c(\d+)\.json'", block).groups()
        row = {"config": config, "c": int(c)}
        for key, label in BENCH_KEYS.items():
            m = re.search(re.escape(label) + r":\s+([0-9.]+)", block)
            row[key] = float(m.group(1)) if m else None
        runs.append(row)
    return runs


def served_runs(run: Path, variant: str) -> dict[tuple[str, int], dict]:
    """A variant's serve_bench runs in a run folder by (config, concurrency), in CONFIGS order."""
    runs = {}
    for config in CONFIGS:
        for r in bench_runs(run / f"logs/serve_bench@{variant}.{config}-bench.log"):
            runs[r["config"], r["c"]] = r
    return runs


def host_c_served() -> Table:
    """Every variant served with every method in one run (serve_bench: `vllm serve` + `vllm bench serve`, 16 requests
    at c = 1, 32 at 8, 128 at 32, 128 output tokens at most), each method at the k evaluate chose (1): output
    tokens/s, the ratio to the same variant's plain decoding and to BF16's same config, the longest of the three
    benchmarks."""
    served = {v: served_runs(HOST_C, v) for v in VARIANTS}
    rows = [{"config": config, "c": c, **{v: served[v][config, c] for v in VARIANTS}} for config, c in served["bf16"]]

    def tok(v: str) -> Column:
        return Column(f"{v} tok/s", lambda r: num(r[v]["output"], 0, thousands=True))

    def vs_plain(r: dict) -> str:
        if r["config"] == "plain":
            return "-"
        return " / ".join(f"x{num(r[v]['output'] / served[v]['plain', r['c']]['output'], 2)}" for v in VARIANTS)

    return table(
        rows,
        [
            Column("config", "config"),
            Column("c", "c"),
            *(tok(v) for v in VARIANTS),
            Column("x plain: BF16 / FP8 / W4A16", vs_plain),
            Column("FP8 x BF16", lambda r: f"x{num(r['fp8-dynamic']['output'] / r['bf16']['output'], 2)}"),
            Column("W4A16 x BF16", lambda r: f"x{num(r['gptq-w4a16']['output'] / r['bf16']['output'], 2)}"),
            Column("benchmark s (longest)", lambda r: num(max(r[v]["duration"] for v in VARIANTS), 1)),
        ],
    )


def host_c_acceptance() -> Table:
    """Each method on each variant: evaluate's estimate (24 held-out prompts, 128 tokens, transformers: the share of
    first drafted tokens accepted, its drop from BF16's, which the gate bounds; the speedup it predicts at c = 1)
    beside what vLLM counted when serving (at k = 1 the share of drafted tokens accepted; tokens per verify step)
    and the measured speedup over the variant's plain decoding at c = 1."""
    base = {e["method"]: e for e in read(HOST_C, "metrics/eval-bf16.json")["methods"]}
    rows = []
    for v in VARIANTS:
        served = served_runs(HOST_C, v)
        for e in read(HOST_C, f"metrics/eval-{v}.json")["methods"]:
            m = e["method"]
            rows.append(
                {
                    "variant": v,
                    **e,
                    "drop": base[m]["first_token_acceptance"] - e["first_token_acceptance"],
                    "served": {c: served[m, c] for c in CONCURRENCY},
                    "measured": served[m, 1]["output"] / served["plain", 1]["output"],
                }
            )
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("method", lambda r: r["method"]),
            Column("estimate: first drafted token accepted %", lambda r: num(100 * r["first_token_acceptance"], 1)),
            Column("drop from BF16", lambda r: num(r["drop"], 3) if r["variant"] != "bf16" else "-"),
            Column(
                "vLLM: accepted % at c = 1 / 8 / 32",
                lambda r: " / ".join(num(r["served"][c]["accept"], 1) for c in CONCURRENCY),
            ),
            Column("vLLM: tokens per step, c = 1", lambda r: num(r["served"][1]["length"], 2)),
            Column("predicted x plain, c = 1", lambda r: f"x{num(r['estimated_speedup'], 2)}"),
            Column("measured x plain, c = 1", lambda r: f"x{num(r['measured'], 2)}"),
            Column("measured / predicted", lambda r: num(r["measured"] / r["estimated_speedup"], 2)),
        ],
    )


def host_c_steps() -> Table:
    """What one decoding step costs at one user, per variant and config: vLLM bench's mean time per output token
    times the tokens each step emits (1 for plain decoding)."""
    rows = [{"variant": v, **r} for v in VARIANTS for (config, c), r in served_runs(HOST_C, v).items() if c == 1]
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("config", "config"),
            Column("mean TPOT ms", lambda r: num(r["tpot"], 2)),
            Column("tokens per step", lambda r: num(r["length"] or 1.0, 2)),
            Column("ms per step", lambda r: num(r["tpot"] * (r["length"] or 1.0), 2)),
            Column("p99 ITL ms", lambda r: num(r["itl_p99"], 1)),
        ],
    )


def host_runs() -> Table:
    """BF16 served in three runs of the same profile on the same host kind: plain decoding's tokens/s and each
    method's ratio to it, per run (A: alone on the host's GPUs two configs at a time; B and C: beside other stages)."""
    served = {k: served_runs(run, "bf16") for k, run in HOST_RUNS.items()}

    def cell(r: dict) -> str:
        parts = []
        for k in HOST_RUNS:
            x, plain = served[k][r["config"], r["c"]]["output"], served[k]["plain", r["c"]]["output"]
            parts.append(num(x, 0, thousands=True) if r["config"] == "plain" else f"x{num(x / plain, 2)}")
        return " / ".join(parts)

    rows = [{"config": config, "c": c} for config, c in served["C"]]
    return table(
        rows,
        [
            Column("config", "config"),
            Column("c", "c"),
            Column("BF16: plain tok/s, or x plain, in runs A / B / C", cell),
        ],
    )


GATE_LINE = re.compile(r"^gate (?P<variant>\S+): (?P<verdict>PASS|FAIL[^:]*): (?P<checks>[^;]+); (?P<ships>.+)$")


def host_c_gate() -> Table:
    """The gate stage's own line per variant on the host (run C's repro.log), and each failed check's value against
    its threshold from the gate's verdict (gate/verdict.json)."""
    lines = [line.partition(" ")[2] for line in (HOST_C / "repro.log").read_text().splitlines()]
    rows = [m.groupdict() for line in lines if (m := GATE_LINE.match(line))]
    verdict = read(HOST_C, "gate/verdict.json")["variants"]

    def failed(r: dict) -> str:
        checks = [c for c in verdict[r["variant"]]["checks"] if c["passed"] is False]
        return "; ".join(f"{c['metric']} {num(c['value'], 3)} ({c['op']} {c['threshold']})" for c in checks) or "-"

    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("verdict", "verdict"),
            Column("checks", "checks"),
            Column("failed: value (bound)", failed),
            Column("decoding it would ship", lambda r: r["ships"].removeprefix("ships ")),
        ],
    )


def host_training() -> Table:
    """The drafts as each run trained them: the sibling's fine-tune and which draft shipped (runs A and B by held-out
    loss, C by agreement with the target's held-out answers), evaluate_draft's token acceptance, the EAGLE-3 head."""
    m = {
        k: {n: read(run, f"metrics/{n}.json") for n in ("draft_training", "eagle3", "draft")}
        for k, run in HOST_RUNS.items()
    }

    def agreement(d: dict) -> str:
        if "target_agreement_untrained" not in d:
            return "- (not measured)"
        return f"{num(d['target_agreement_untrained'], 3)} -> {num(d['target_agreement_finetuned'], 3)}"

    rows = [
        (
            "distillation: training / eval examples",
            lambda x: f"{x['draft_training']['train_examples']} / {x['draft_training']['eval_examples']}",
        ),
        ("fine-tune steps", lambda x: x["draft_training"]["train_steps"]),
        (
            "held-out loss, base -> fine-tuned",
            lambda x: (
                f"{num(x['draft_training']['eval_loss_untrained'], 3)} -> "
                f"{num(x['draft_training']['eval_loss_finetuned'], 3)}"
            ),
        ),
        ("agreement with the target's held-out answers, base -> fine-tuned", lambda x: agreement(x["draft_training"])),
        (
            "shipped (by)",
            lambda x: f"{x['draft_training']['shipped']} ({x['draft_training'].get('ship_criterion', 'eval_loss')})",
        ),
        (
            "evaluate_draft: token acceptance, base -> fine-tuned",
            lambda x: (
                f"{num(x['draft']['token_acceptance_untrained'], 3)}"
                f" -> {num(x['draft']['token_acceptance_finetuned'], 3)}"
            ),
        ),
        (
            "EAGLE-3 head: steps, final loss, accuracy at step 1",
            lambda x: (
                f"{x['eagle3']['train_steps']}, "
                f"{num(x['eagle3']['final_loss'], 2)}, {num(x['eagle3']['accuracy_by_step'][0], 3)}"
            ),
        ),
    ]
    return Table(
        ("quantity", *(f"run {k}" for k in HOST_RUNS)), tuple((q, *(str(f(m[k])) for k in HOST_RUNS)) for q, f in rows)
    )


BLOCKS = {
    "host-c-stages": host_c_stages,
    "host-quality": host_quality,
    "host-c-quality": host_c_quality,
    "host-c-served": host_c_served,
    "host-c-acceptance": host_c_acceptance,
    "host-c-steps": host_c_steps,
    "host-runs": host_runs,
    "host-c-gate": host_c_gate,
    "host-training": host_training,
    "gpu-quality": gpu_quality,
    "machine": machine,
    "conversion": conversion,
    "pair": pair,
    "completions": completions,
    "steps": steps,
    "repro-machine": repro_machine,
    "repro-stages": repro_stages,
    "repro-quality": repro_quality,
}
