"""Tables of benchmarks/cpu/QWEN-CODER.md: the two Qwen2.5-Coder chunked-GGUF sources fetched and converted on the
2-core dev machine (benchmarks/cpu/qwen_coder_sources.py -> raw/qwen-coder/sources.json), and single steps of the
qwen-coder profile's stages (benchmarks/cpu/qwen_coder_steps.py -> raw/qwen-coder/steps.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from render import Column, Table, Text, facts, num, table  # noqa: E402

RAW = ROOT / "benchmarks/cpu/raw/qwen-coder"


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


BLOCKS = {
    "machine": machine,
    "conversion": conversion,
    "pair": pair,
    "completions": completions,
    "steps": steps,
    "repro-machine": repro_machine,
    "repro-stages": repro_stages,
    "repro-quality": repro_quality,
}
