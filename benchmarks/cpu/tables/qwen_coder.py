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


def repro_quality() -> Table:
    b = repro_raw("build.json")
    enabled = next(c["profile"] for k, c in b["profile_changes"].items() if k == "quantize.enabled")
    rows = [{"variant": v, **repro_raw(f"metrics/eval-{v}.json")} for v in enabled]
    verdict = repro_raw("verdict.json")["variants"]
    return table(
        rows,
        [
            Column("variant", lambda r: f"`{r['variant']}`"),
            Column("held-out perplexity", lambda r: num(r["perplexity"], 3)),
            Column("increase %", lambda r: num(r["perplexity_increase_pct"], 2)),
            Column("KL", lambda r: num(r["kl_divergence"], 4)),
            Column("top-1", lambda r: num(r["top1_agreement"], 3)),
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


def gpu_stages() -> Table:
    """Each stage's wall time from the run's log (every line prefixed with the seconds since the background
    command started): from its `Running stage` line to the next one; the last stage had not finished."""
    starts = []
    for line in (GPU / "repro.log").read_text().splitlines():
        t, _, text = line.partition(" ")
        if text.startswith("Running stage '"):
            starts.append((text.split("'")[1].removeprefix("stages/dvc.yaml:"), int(t)))
    rows = [
        {"stage": name, "s": (starts[i + 1][1] - t) if i + 1 < len(starts) else None}
        for i, (name, t) in enumerate(starts)
    ]
    first = starts[0][1]
    rows = [{"stage": "(the target's GGUF converted before `sources`; the run waited for it)", "s": first}, *rows]
    return table(
        rows,
        [
            Column("stage", lambda r: r["stage"]),
            Column("wall s", lambda r: num(r["s"], 0) if r["s"] is not None else "not finished"),
        ],
    )


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


def gpu_acceptance() -> Table:
    """Per method: the estimate's acceptance on held-out code (24 prompts, 128 tokens), tokens per verify step at k =
    4 and 8 (1 + accepted), and the served speedup the nearest cost profile predicts at the k the estimate chose."""
    m = gpu("metrics/eval-bf16.json")
    rows = []
    for entry in m["methods"]:
        spec = gpu(f"eval/bf16/speculative-{entry['method']}.json")
        per_step = spec["accepted_per_step_by_k"]
        rows.append(
            {
                **entry,
                "k4": 1 + per_step["4"],
                "k8": 1 + per_step["8"],
                "first": spec["accepted_per_position_by_k"]["1"][0],
            }
        )
    return table(
        rows,
        [
            Column("method", lambda r: r["method"]),
            Column("first drafted token accepted", lambda r: num(r["first"], 3)),
            Column("tokens per step, k = 4", lambda r: num(r["k4"], 2)),
            Column("tokens per step, k = 8", lambda r: num(r["k8"], 2)),
            Column("k chosen", lambda r: r["num_speculative_tokens"]),
            Column(
                f"predicted served speedup at c = 1 ({m['cost_profile']})",
                lambda r: f"x{num(r['estimated_speedup'], 2)}",
            ),
        ],
    )


def gpu_training() -> Table:
    d, e = gpu("metrics/draft_training.json"), gpu("metrics/eagle3.json")
    return facts(
        [
            ("distillation: training / eval examples", f"{d['train_examples']} / {d['eval_examples']}"),
            (
                "draft fine-tune: steps, loss first -> last",
                f"{d['train_steps']}, {num(d['train_loss_first'], 3)} -> {num(d['train_loss_last'], 3)}",
            ),
            (
                "draft held-out loss: base -> fine-tuned (shipped)",
                f"{num(d['eval_loss_untrained'], 3)} -> {num(d['eval_loss_finetuned'], 3)} ({d['shipped']})",
            ),
            (
                "EAGLE-3 head: steps, vocabulary, trainable parameters (M)",
                f"{e['train_steps']}, {e['draft_vocab_size']}, {num(e['trainable_parameters'] / 1e6, 1)}",
            ),
            (
                "EAGLE-3 head: final loss, accuracy at steps 1-3",
                f"{num(e['final_loss'], 2)}, " + " / ".join(num(a, 3) for a in e["accuracy_by_step"]),
            ),
        ]
    )


BLOCKS = {
    "gpu-stages": gpu_stages,
    "gpu-quality": gpu_quality,
    "gpu-acceptance": gpu_acceptance,
    "gpu-training": gpu_training,
    "machine": machine,
    "conversion": conversion,
    "pair": pair,
    "completions": completions,
    "steps": steps,
    "repro-machine": repro_machine,
    "repro-stages": repro_stages,
    "repro-quality": repro_quality,
}
