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
VARIANTS = ("bf16", "fp8-dynamic", "gptq-w4a16")
CONCURRENCY = (1, 8, 32)
CONFIGS = ("plain", "draft_model", "eagle3", "ngram")  # serve_bench's configs: plain decoding, then each method


def raw(name: str) -> dict:
    return json.loads((RAW / name).read_text())


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


def gpu(name: str) -> dict:
    return json.loads((GPU / name).read_text())


def gpu_quality() -> Table:
    m, f = gpu("metrics/eval-bf16.json"), gpu("eval/bf16/functional.json")["baseline"]
    lm = gpu("eval/bf16/lm_eval.json")
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


def host(name: str) -> dict:
    return json.loads((HOST / name).read_text())


FINISHED = re.compile(r"Stage '(?P<stage>[^']+)' finished in (?P<s>\d+) s on GPUs (?P<gpus>[\d,]+)")


def stages_of(run: Path) -> Table:
    """Each stage's wall time on the 4x H100 host, from the run's log (lines prefixed with the seconds since the
    background command started): `dvc repro`'s stages from one `Running stage` line to the next, the stage groups'
    from their own `finished in` lines (benchmarks/gpu/stage_groups.py); the GPUs each ran on. A group's stage that
    started and never finished (the device time ended) is the last row."""
    lines = [line.partition(" ") for line in (run / "repro.log").read_text().splitlines()]
    rows, repro, started = [], [], {}
    for t, _, text in lines:
        if text.startswith("Running stage '") and " on GPUs " not in text:
            repro.append((text.split("'")[1].removeprefix("stages/dvc.yaml:"), int(t)))
        elif text.startswith("Running stage '"):
            started[text.split("'")[1]] = (text.rsplit(" on GPUs ", 1)[1].rstrip(":"), int(t))
        elif m := FINISHED.search(text):
            rows.append({"stage": m["stage"], "gpus": m["gpus"], "s": int(m["s"]), "end": int(t)})
    first_group = min(r["end"] - r["s"] for r in rows)
    ends = [t for _, t in repro[1:]] + [first_group]
    repro_rows = [
        {"stage": name, "gpus": "all", "s": end - start, "end": end} for (name, start), end in zip(repro, ends)
    ]
    waited = {"stage": "(the two GGUFs converted after their last pieces; the run waited for them)", "gpus": "-"}
    done = {r["stage"] for r in rows}
    unfinished = [
        {"stage": name, "gpus": gpus, "s": None, "end": None, "from": t}
        for name, (gpus, t) in started.items()
        if name not in done
    ]
    out = [{**waited, "s": repro[0][1], "end": repro[0][1]}, *repro_rows, *sorted(rows, key=lambda r: r["end"])]
    return table(
        out + unfinished,
        [
            Column("stage", lambda r: r["stage"]),
            Column("GPUs", lambda r: r["gpus"]),
            Column("wall s", lambda r: num(r["s"], 0) if r["s"] is not None else f"from {r['from']} s, not finished"),
            Column("ended, s from the start", lambda r: num(r["end"], 0) if r["end"] is not None else "-"),
        ],
    )


def host_b_stages() -> Table:
    return stages_of(HOST_B)


def variant_metrics(run: Path) -> list[dict]:
    """Each variant's metrics/eval-<v>.json in a run, with its name."""
    return [{"variant": v, **json.loads((run / f"metrics/eval-{v}.json").read_text())} for v in VARIANTS]


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


def host_acceptance() -> Table:
    """Each method's estimate on each variant (24 held-out prompts, 128 tokens, transformers): the share of first
    drafted tokens accepted, its drop from BF16's (the gate gates.thresholds.max_acceptance_drop_vs_bf16, default
    0.1; n-gram exempt), tokens per verify step at k = 4, the k evaluate chose and the speedup it predicts at c = 1."""
    base = {e["method"]: e for e in host("metrics/eval-bf16.json")["methods"]}
    rows = []
    for v in VARIANTS:
        for e in host(f"metrics/eval-{v}.json")["methods"]:
            spec = host(f"eval/{v}/speculative-{e['method']}.json")
            rows.append(
                {
                    "variant": v,
                    **e,
                    "drop": base[e["method"]]["first_token_acceptance"] - e["first_token_acceptance"],
                    "k4": 1 + spec["accepted_per_step_by_k"]["4"],
                }
            )
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("method", lambda r: r["method"]),
            Column("first drafted token accepted", lambda r: num(r["first_token_acceptance"], 3)),
            Column("drop from BF16", lambda r: num(r["drop"], 3) if r["variant"] != "bf16" else "-"),
            Column("tokens per step, k = 4", lambda r: num(r["k4"], 2)),
            Column("k chosen", lambda r: r["num_speculative_tokens"]),
            Column("predicted speedup at c = 1", lambda r: f"x{num(r['estimated_speedup'], 2)}"),
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


def host_served() -> Table:
    """BF16 served by serve_bench (`vllm serve` + `vllm bench serve`, 16 requests at c = 1 and 8, 64 at 32, 128
    output tokens at most), each method at the k evaluate chose (1), vLLM's acceptance counters beside evaluate's
    estimate; the ratio to plain decoding is within this run."""
    bf16 = host("metrics/eval-bf16.json")
    estimate = {e["method"]: e for e in bf16["methods"]}
    runs = list(served_runs(HOST, "bf16").values())
    plain = {r["c"]: r["output"] for r in runs if r["config"] == "plain"}
    return table(
        runs,
        [
            Column("config", lambda r: r["config"]),
            Column("c", lambda r: r["c"]),
            Column("output tok/s", lambda r: num(r["output"], 0, thousands=True)),
            Column("x plain", lambda r: f"x{num(r['output'] / plain[r['c']], 2)}" if r["config"] != "plain" else "-"),
            Column("mean TPOT ms", lambda r: num(r["tpot"], 2)),
            Column("ms per step (TPOT x tokens per step)", lambda r: num(r["tpot"] * (r["length"] or 1.0), 2)),
            Column("p99 ITL ms", lambda r: num(r["itl_p99"], 1)),
            Column("vLLM: drafted tokens accepted %", lambda r: num(r["accept"], 1)),
            Column("vLLM: tokens per step", lambda r: num(r["length"], 2)),
            Column(
                "estimate: first token accepted %",
                lambda r: (
                    num(100 * estimate[r["config"]]["first_token_acceptance"], 1) if r["config"] in estimate else "-"
                ),
            ),
        ],
    )


def host_fp8_served() -> Table:
    """What serve_bench@fp8-dynamic measured before the device time ended: its runs with requests answered."""
    rows = []
    for config in CONFIGS:
        path = HOST / f"logs/serve_bench@fp8-dynamic.{config}-bench.log"
        runs = bench_runs(path) if path.exists() else []
        done = {r["c"]: r for r in runs}
        for c in CONCURRENCY:
            r = done.get(c)
            if r is None:
                what = "not run (the device time ended)"
            elif r["ok"] is None:
                what = "started, cut short (the device time ended)"
            elif not r["ok"]:
                what = (
                    f"0 of {int(r['failed'])} requests answered, in {num(r['duration'], 2)} s "
                    "(HTTP 404: bf16's server on the same port)"
                )
            else:
                what = (
                    f"{num(r['output'], 0, thousands=True)} tok/s; vLLM {num(r['accept'], 1)}% accepted, "
                    f"{num(r['length'], 2)} tokens per step"
                )
            rows.append({"config": config, "c": c, "what": what})
    return table(rows, [Column("config", "config"), Column("c", "c"), Column("measured", "what")])


def training_of(run: Path) -> Table:
    d, e, draft = (json.loads((run / f"metrics/{n}.json").read_text()) for n in ("draft_training", "eagle3", "draft"))
    return facts(
        [
            ("distillation: training / eval examples", f"{d['train_examples']} / {d['eval_examples']}"),
            (
                "draft fine-tune: steps, held-out loss base -> fine-tuned (shipped)",
                f"{d['train_steps']}, {num(d['eval_loss_untrained'], 3)} -> {num(d['eval_loss_finetuned'], 3)}"
                f" ({d['shipped']})",
            ),
            (
                "evaluate_draft: token acceptance base -> fine-tuned",
                f"{num(draft['token_acceptance_untrained'], 3)} -> {num(draft['token_acceptance_finetuned'], 3)}",
            ),
            (
                "EAGLE-3 head: steps, final loss, accuracy at step 1",
                f"{e['train_steps']}, {num(e['final_loss'], 2)}, {num(e['accuracy_by_step'][0], 3)}",
            ),
        ]
    )


def host_training() -> Table:
    return training_of(HOST)


def host_b_quality() -> Table:
    """pass@1 of each variant over 64 HumanEval tasks against the BF16 target's, recorded once by stage
    functional_baseline (the run's artifacts/functional/baseline.json, the same for every variant)."""
    return table(
        variant_metrics(HOST_B),
        [
            *VARIANT_FIDELITY,
            Column("pass@1 of 64: variant", lambda r: num(r["pass_at_1"], 3)),
            Column("BF16 target (recorded once)", lambda r: num(r["pass_at_1_baseline"], 3)),
            Column("drop", lambda r: num(r["pass_at_1_drop"], 3)),
            Column("tasks passed", lambda r: f"{round(r['pass_at_1'] * 64)} of 64"),
        ],
    )


def host_b_served() -> Table:
    """BF16 and GPTQ W4A16 served in one run (serve_bench: 16 requests at c = 1 and 8, 64 at 32, 128 output tokens at
    most), each method at the k evaluate chose (1): each config's output tokens/s, its ratio to the same variant's
    plain decoding, W4A16's to BF16's same config, vLLM's share of drafted tokens accepted."""
    bf16, w4 = served_runs(HOST_B, "bf16"), served_runs(HOST_B, "gptq-w4a16")
    rows = [{"config": config, "c": c, "b": bf16[config, c], "w": w4[config, c]} for config, c in bf16]

    def vs_plain(runs: dict, r: dict) -> str:
        return f"x{num(r['output'] / runs['plain', r['c']]['output'], 2)}" if r["config"] != "plain" else "-"

    return table(
        rows,
        [
            Column("config", "config"),
            Column("c", "c"),
            Column("BF16 tok/s", lambda r: num(r["b"]["output"], 0, thousands=True)),
            Column("BF16 x plain", lambda r: vs_plain(bf16, r["b"])),
            Column("W4A16 tok/s", lambda r: num(r["w"]["output"], 0, thousands=True)),
            Column("W4A16 x plain", lambda r: vs_plain(w4, r["w"])),
            Column("W4A16 x BF16", lambda r: f"x{num(r['w']['output'] / r['b']['output'], 2)}"),
            Column("p99 ITL ms BF16 / W4A16", lambda r: f"{num(r['b']['itl_p99'], 1)} / {num(r['w']['itl_p99'], 1)}"),
            Column(
                "vLLM accepted % BF16 / W4A16",
                lambda r: f"{num(r['b']['accept'], 1)} / {num(r['w']['accept'], 1)}" if r["b"]["accept"] else "-",
            ),
        ],
    )


GATE_LINE = re.compile(r"^gate (?P<variant>\S+): (?P<verdict>PASS|FAIL[^:]*): (?P<checks>[^;]+); (?P<ships>.+)$")


def host_b_gate() -> Table:
    """What the gate ships from run B's own eval and serve metrics (raw gate.txt: `session.sh gate-profile
    qwen-coder-gpu-3`, the gate's code on the CPU over the run's metrics/ and params.yaml)."""
    text = (HOST_B / "gate.txt").read_text()
    rows = [m.groupdict() for line in text.splitlines() if (m := GATE_LINE.match(line))]
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("verdict", "verdict"),
            Column("checks", "checks"),
            Column("ships", "ships"),
        ],
    )


def host_b_training() -> Table:
    return training_of(HOST_B)


BLOCKS = {
    "host-b-stages": host_b_stages,
    "host-b-quality": host_b_quality,
    "host-b-served": host_b_served,
    "host-b-gate": host_b_gate,
    "host-b-training": host_b_training,
    "host-quality": host_quality,
    "host-acceptance": host_acceptance,
    "host-served": host_served,
    "host-fp8-served": host_fp8_served,
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
