"""Time the quantize stage's recipes, each run in a fresh process so its peak memory is its own.

    python benchmarks/quantize_bench.py            # every enabled variant on the demo target
                                                   #   -> raw/quantize.json -> quantize.md
    python benchmarks/quantize_bench.py --offload  # GPU only: offload off vs on at TinyLlama-1.1B shape
                                                   #   -> raw/quantize-offload.json -> quantize-offload.md
    python benchmarks/quantize_bench.py --model smollm2   # GPTQ and AWQ on SmolLM2-135M (profiles/smollm2.yaml) at
                                                   #   the default and the profile's calibration sizes, with held-out
                                                   #   fidelity -> raw/quantize-smollm2.json -> quantize.md's 2nd part
    python benchmarks/quantize_bench.py --render   # only re-render the markdown from the committed raw JSON

Every run's metrics go to the raw JSON; the markdown (medians, ranges, ratios) is computed from it alone, so
rendering needs neither the pipeline nor torch. quantize_summary() gives the numbers README.md may quote.

Uses the real params.yaml and the stage's own `quantize_model`: the demo target of
`artifacts/models/target` (built with params.yaml's `demo:` settings when absent) and the calibration
split of `artifacts/data/calibration.jsonl` (split from `data.traffic` as the data stage does when absent).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARAMS_FILE = ROOT / "params.yaml"
RAW = ROOT / "benchmarks" / "raw"
# The pipeline is imported inside the functions that measure: rendering from raw JSON must not need it.


def demo_target(params: dict, work: Path, pretrain_steps: int | None = None) -> tuple[Path, str]:
    built = ROOT / "artifacts" / "models" / "target"
    if built.is_dir():
        return built, "artifacts/models/target (built by the `models` stage)"
    from dataclasses import replace

    from pipeline.models.demo.models import build_demo_pair
    from pipeline.models.settings import DemoParams

    cfg, note = DemoParams.parse(params["demo"]), "built by this script from params.yaml `demo:`"
    if pretrain_steps is not None:
        # Quantization work and sizes follow the shapes, not the weights: a shorter pretraining measures the same.
        cfg = replace(
            cfg,
            target=replace(cfg.target, train_steps=pretrain_steps),
            draft=replace(cfg.draft, train_steps=pretrain_steps),
        )
        note += f" with pretraining cut to {pretrain_steps} steps (reduced run: same shapes)"
    build_demo_pair(work / "target", work / "draft", cfg)
    return work / "target", note


def calibration_split(params: dict, target: Path, work: Path) -> Path:
    from pipeline.data.settings import DataParams
    from pipeline.data.traffic import dedup, drop_too_long, load_traffic, split, write_split
    from pipeline.models.loading import load_tokenizer

    built = ROOT / "artifacts" / "data" / "calibration.jsonl"
    if built.is_file():
        return built
    data = DataParams.parse(params["data"])
    kept, _ = drop_too_long(dedup(load_traffic(ROOT / data.traffic)), load_tokenizer(target), data.max_tokens)
    path = work / "calibration.jsonl"
    write_split(split(kept, data.fractions, data.seed)["calibration"], path)
    return path


def run_child(variant: str, target: Path, calibration: Path, result: Path, offload: bool) -> None:
    """Child process: one variant, metrics as JSON."""
    from pipeline.data.formatting import full_text
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer
    from pipeline.params.load import load_params
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import enabled_variant
    from pipeline.quantize.settings import Calibration

    params = load_params(PARAMS_FILE)
    tokenizer = load_tokenizer(target)
    texts = [full_text(tokenizer, m) for m in read_split(calibration)]
    # a run's n_grid is its settings' (None: llm-compressor's 20), never the pipeline's CPU default
    cfg = Calibration.parse({**params["quantize"]["calibration"], "offload": offload, "cpu_awq_n_grid": None})
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        metrics = quantize_model(target, Path(out) / variant, enabled_variant(params, variant), texts, cfg)
    # CPU seconds of all threads: on a shared host they inflate far less than wall time does.
    metrics["cpu_time_s"] = round(time.process_time() - cpu0, 2)
    # ru_maxrss (the stage's peak_memory_mb) carries the parent's peak across exec on Linux, so a parent that
    # built the demo target would show up in every child; VmHWM is this process image's own peak.
    hwm_kb = next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:")
    )
    # MB (10^6 bytes), as the stage's; runs before 2026-11-25 recorded MiB
    metrics["peak_memory_mb"] = round(hwm_kb * 1024 / 1e6, 1)
    result.write_text(json.dumps(metrics))


def run_smollm2_child(job_path: Path, result: Path) -> None:
    """Child process: one SmolLM2 setting, quantized by the stage's own quantize_model, then the held-out
    fidelity evaluate computes (pipeline.evaluate.quality.fidelity) of the result against the unquantized target."""
    import torch

    from pipeline.data.formatting import full_text, prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.evaluate import quality
    from pipeline.models.loading import load_causal_lm, load_tokenizer
    from pipeline.params.load import load_params
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import enabled_variant

    job = json.loads(job_path.read_text())
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    params = load_params(Path(job["params"]))
    variant, target = job["variant"], Path(job["target"])
    own = params["quantize"]["variants"][variant]
    for key, value in job["settings"].items():  # None: the key unset, so llm-compressor's own default applies
        own.pop(key, None) if value is None else own.__setitem__(key, value)
    tokenizer = load_tokenizer(target)
    texts = [full_text(tokenizer, m) for m in read_split(Path(job["calibration"]))]
    load_start = os.getloadavg()
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        metrics = quantize_model(
            target, Path(out) / variant, enabled_variant(params, variant), texts, params["quantize"]["calibration"]
        )
        metrics["cpu_time_s"] = round(time.process_time() - cpu0, 2)
        load_quantized = os.getloadavg()
        t0 = time.perf_counter()
        heldout = read_split(Path(job["heldout"]))[: params["evaluate"]["heldout_limit"]]
        examples = [prompt_and_response_ids(tokenizer, m) for m in heldout]
        metrics["quality"] = quality.fidelity(load_causal_lm(target), load_causal_lm(Path(out) / variant), examples)
        metrics["quality_time_s"] = round(time.perf_counter() - t0, 2)
    metrics["torch_threads"] = torch.get_num_threads()
    metrics["load_average"] = {
        "start": [round(x, 2) for x in load_start],
        "quantized": [round(x, 2) for x in load_quantized],
        "end": [round(x, 2) for x in os.getloadavg()],
    }
    result.write_text(json.dumps(metrics))


def quantize_in_child(variant: str, target: Path, calibration: Path, work: Path, offload: bool = False) -> dict:
    result = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    subprocess.run(
        [sys.executable, __file__, "--child", variant, str(target), str(calibration), str(result), str(int(offload))],
        check=True,
        cwd=ROOT,
        env={**os.environ, "TQDM_MININTERVAL": "10"},
    )
    return json.loads(result.read_text())


def random_llama(tokenizer_dir: Path, dest: Path) -> Path:
    """Random bf16 weights at TinyLlama-1.1B's shape (the demo tokenizer's vocabulary): memory and
    time follow the shapes, not the values."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in model_dir.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def machine() -> dict:
    import torch

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU only ({cpu})",
        "cores": f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}",
        "memory": f"{mem_kb / 2**20:.0f} GiB",
        "load average at start (1 min)": f"{os.getloadavg()[0]:.1f}",
        "versions": ", ".join(
            f"{p} {version(p)}" for p in ("torch", "transformers", "llmcompressor", "compressed-tensors")
        )
        + f", Python {platform.python_version()}",
    }


def code_commit() -> str | None:
    """HEAD of the checkout the pipeline runs from (read-only git call; None outside a checkout)."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


def summarize(runs: list[dict]) -> dict:
    """One row from a variant's repeats: median times (the host is shared), their range, max peak."""
    walls = sorted(r["wall_time_s"] for r in runs)
    return {
        **runs[0],
        "wall_time_s": statistics.median(walls),
        "wall_range": [walls[0], walls[-1]],
        "oneshot_time_s": statistics.median(r["oneshot_time_s"] for r in runs),
        "cpu_time_s": statistics.median(r["cpu_time_s"] for r in runs),
        "peak_memory_mb": max(r["peak_memory_mb"] for r in runs),
        "repeats": len(runs),
    }


# Raw files whose sizes and peak memory are MiB under `*_mb` names: written by code before the commit that made them MB
# (pipeline/core/sizes.py RECORDED_IN_MIB_UNTIL); rendered in MB, as their columns say.
RECORDED_IN_MIB = {"a4e48b6"}


def in_mb(raw: dict, run: dict) -> dict:
    from pipeline.core.sizes import mib_record_as_mb  # a plain function: rendering still needs no torch

    return mib_record_as_mb(run) if raw["commit"] in RECORDED_IN_MIB else run


def quantize_summary(raw: dict | None = None) -> dict:
    """From benchmarks/raw/quantize.json: per variant ("variants") median wall/oneshot/CPU s, wall range, peak MB,
    sizes and compression ratio; and the run's rounds, commit, command and date."""
    raw = raw or json.loads((RAW / "quantize.json").read_text())
    variants = {variant: summarize([in_mb(raw, r) for r in runs]) for variant, runs in raw["runs"].items()}
    return {
        "variants": variants,
        "repeats": min(r["repeats"] for r in variants.values()),
        "commit": raw["commit"],
        "command": raw["command"],
        "date": raw["machine"]["date"],
    }


def render(raw: dict) -> str:
    rows = list(quantize_summary(raw)["variants"].values())
    fastest = min(r["wall_time_s"] for r in rows)
    cal, repeats = raw["calibration"], rows[0]["repeats"]
    rounds = (
        f"{repeats} rounds over all variants, median reported"
        if repeats > 1
        else "a single round over all variants (reduced run: no median, no range)"
    )
    lines = [
        "# Quantization time per variant on the demo target",
        "",
        f"Produced by `{raw['command']}` (each variant in its own fresh process, through the quantize stage's own "
        f"`pipeline.quantize.oneshot.quantize_model`, params.yaml as committed; code at commit {raw['commit']}; "
        f"{rounds}). Raw runs: `benchmarks/raw/quantize.json`; this file "
        "is rendered from it (`python benchmarks/quantize_bench.py --render`).",
        f"Target: {raw['target']}, {raw['parameters'] / 1e6:.1f}M parameters. Calibration: up to "
        f"{cal['num_samples']} conversations of the traffic's calibration split, at most {cal['max_seq_length']} "
        "tokens each.",
        "Wall time covers load, calibration, compression and save; oneshot is llm-compressor's part of it; CPU "
        "time is the process's CPU seconds (all threads) over the same span. Peak memory is the process's peak "
        "resident set (model, calibration activations, the library itself).",
        "",
        "| variant | algorithm | scheme | calibration samples | wall time s | wall time range s | oneshot s "
        "| CPU time s | peak memory MB | size before MB | size after MB | compression ratio | wall time vs fastest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["wall_range"]
        lines.append(
            f"| {r['variant']} | {r['algorithm']} | {r['scheme']} | {r['calibration_samples']} "
            f"| {r['wall_time_s']:.2f} | {lo:.2f}-{hi:.2f} | {r['oneshot_time_s']:.2f} "
            f"| {r['cpu_time_s']:.2f} | {r['peak_memory_mb']:.0f} | {r['size_before_mb']:.2f} "
            f"| {r['size_after_mb']:.2f} | {r['compression_ratio']:.2f} | {r['wall_time_s'] / fastest:.1f}x |"
        )
    info = raw["machine"]
    lines += ["", "Machine:", ""] + [f"- {k}: {v}" for k, v in info.items()]
    if info["device"].startswith("CPU"):
        lines.append(
            "- calibration in float32 on CPU (the stage's CPU setting); the host is shared with other "
            "work, so single runs vary (the range column), hence the median"
        )
    return "\n".join(lines) + "\n"


def render_smollm2(raw: dict) -> str:
    """quantize.md's second part, from raw/quantize-smollm2.json alone."""
    sizes = raw["calibration_sizes"]
    commands = sorted({(r.get("command", raw["command"]), r.get("commit", raw["commit"])) for r in raw["runs"]})
    lines = [
        "",
        "## SmolLM2-135M-Instruct on this CPU: GPTQ and AWQ by calibration size",
        "",
        f"Target: {raw['model']}, {raw['parameters'] / 1e6:.1f}M parameters. Calibration: the `{raw['traffic']}` "
        f"traffic's calibration split as the `data` stage makes it ({raw['calibration_rows']} rows, about 100 tokens "
        f'each); "default" is params.yaml\'s `quantize.calibration` ({sizes["default"]["num_samples"]} samples, at '
        f'most {sizes["default"]["max_seq_length"]} tokens: every row there is), "profile" profiles/smollm2.yaml\'s '
        f"({sizes['profile']['num_samples']} samples, {sizes['profile']['max_seq_length']} tokens). Group size 64 (the "
        "profile's: SmolLM2's widths are not multiples of 128). n_grid: the scale ratios AWQ tries per mapping "
        "(llm-compressor's default 20; the profile sets 4).",
        "Each run in its own fresh process, through the stage's own `quantize_model`, then the held-out fidelity "
        f"the `evaluate` stage computes (`pipeline.evaluate.quality.fidelity`, {raw['heldout_limit']} held-out "
        f"conversations of {raw['heldout_rows']}) of the result against the unquantized target. Produced by "
        + "; ".join(f"`{c}` (code at commit {k})" for c, k in commands)
        + ". Raw runs: `benchmarks/raw/quantize-smollm2.json`; rendered by `python "
        "benchmarks/quantize_bench.py --render`.",
        "",
        "| variant | calibration | samples | max tokens | n_grid | torch threads | wall time s | oneshot s "
        "| CPU time s | peak memory MB | perplexity increase % | KL | top-1 agreement | fidelity s "
        "| load average (1 min) start / after quantizing |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in raw["runs"]:
        q, la = r["quality"], r["load_average"]
        n_grid = (r["settings"]["n_grid"] or 20) if r["algorithm"] == "awq" and "n_grid" in r["settings"] else "-"
        lines.append(
            f"| {r['variant']} | {r['calibration']} | {r['calibration_samples']} "
            f"| {r['settings']['max_seq_length']} | {n_grid} | {r.get('torch_threads', '-')} "
            f"| {r['wall_time_s']:.1f} | {r['oneshot_time_s']:.1f} | {r['cpu_time_s']:.1f} "
            f"| {r['peak_memory_mb']:.0f} | {q['perplexity_increase_pct']:.2f} | {q['kl_divergence']:.4f} "
            f"| {q['top1_agreement']:.3f} | {r['quality_time_s']:.0f} | {la['start'][0]:.1f} / "
            f"{la['quantized'][0]:.1f} |"
        )
    lines += smollm2_comparisons(raw["runs"]) + smollm2_advice(raw["runs"])
    loads = [x for r in raw["runs"] for x in (r["load_average"]["start"][0], r["load_average"]["quantized"][0])]
    if loads and max(loads) > 2:
        lines += [
            "",
            f"Other jobs shared the 2 cores during these runs (1-minute load average {min(loads):.1f} to "
            f"{max(loads):.1f} at the runs' start and end of quantization): every time here is longer than "
            "on an idle machine, by a factor that changed from run to run.",
        ]
    lines += ["", "Machine:", ""] + [f"- {k}: {v}" for k, v in raw["machine"].items()]
    return "\n".join(lines) + "\n"


def smollm2_comparisons(runs: list[dict]) -> list[str]:
    """Pairs of runs that differ in one setting only (threads, calibration size, AWQ's n_grid), side by side."""

    def key(r, drop):
        s = {k: v for k, v in r["settings"].items() if k not in ("num_samples", "max_seq_length")}
        parts = {"variant": r["variant"], "calibration": r["calibration"], "threads": r.get("torch_threads"), **s}
        return tuple(sorted((k, str(v)) for k, v in parts.items() if k != drop))

    def label(r):
        grid = f", n_grid {r['settings']['n_grid'] or 20}" if "n_grid" in r["settings"] else ""
        return f"{r['variant']} ({r['calibration']} calibration{grid}, {r.get('torch_threads')} thread(s))"

    def cell(r):
        q = r["quality"]
        return (
            f"{r['wall_time_s']:.0f} s, KL {q['kl_divergence']:.3f}, top-1 {q['top1_agreement']:.3f}, perplexity "
            f"{q['perplexity_increase_pct']:+.1f}%"
        )

    out = []
    for setting, field, what in (
        ("threads", "torch_threads", "torch threads"),
        ("calibration", "calibration", "calibration size"),
        ("n_grid", "n_grid", "AWQ n_grid"),
    ):
        pairs = [
            (a, b)
            for i, a in enumerate(runs)
            for b in runs[i + 1 :]
            if key(a, setting) == key(b, setting)
            and (a.get(field), a["settings"].get(field)) != (b.get(field), b["settings"].get(field))
        ]
        if pairs:
            out += ["", f"By {what} (everything else equal):", ""]
            out += [f"- {label(a)}: {cell(a)}; {label(b)}: {cell(b)}" for a, b in pairs]
    return out


def smollm2_advice(runs: list[dict]) -> list[str]:
    """What these runs say a CPU host should take; only where the runs it cites are in the raw file."""

    def find(variant, calibration, threads, n_grid="-"):
        return next(
            (
                r
                for r in runs
                if (r["variant"], r["calibration"], r.get("torch_threads"), r["settings"].get("n_grid", "-"))
                == (variant, calibration, threads, n_grid)
            ),
            None,
        )

    two, one = find("gptq-w4a16", "profile", 2), find("gptq-w4a16", "profile", 1)
    gptq, awq20, awq4 = (
        find("gptq-w4a16", "default", 1),
        find("awq-w4a16", "default", 1, None),
        find("awq-w4a16", "default", 1, 4),
    )
    if not all((two, one, gptq, awq20, awq4)):
        return []
    kl = lambda r: f"KL {r['quality']['kl_divergence']:.3f}"  # noqa: E731
    best_top1 = max(r["quality"]["top1_agreement"] for r in runs)
    return [
        "",
        "### What makes it practical on this CPU",
        "",
        f"- **One torch thread per process when other jobs share the cores.** torch starts one thread per core; "
        f"while other processes keep the cores busy, its two threads wait on each other at every operation: the same "
        f"GPTQ run took {two['wall_time_s']:.0f} s with two threads and {one['wall_time_s']:.0f} s with one "
        f"({two['cpu_time_s']:.0f} s against {one['cpu_time_s']:.0f} s of CPU; load averages in the table). Set "
        "`OMP_NUM_THREADS=1` for `dvc repro` on a shared CPU host; an idle host was not measured here (there, two "
        "threads may well be faster). The thread count changes the "
        f"floating-point summation order, so it changes the result a little ({kl(two)} against {kl(one)}): builds "
        "that must agree bit for bit must use the same count.",
        "- **GPTQ at the default calibration size is practical**: every calibration row "
        f"({gptq['calibration_samples']}) took {gptq['wall_time_s']:.0f} s ({gptq['cpu_time_s']:.0f} s of CPU) for "
        f"{kl(gptq)}, against {one['wall_time_s']:.0f} s for {kl(one)} at the profile's "
        f"{one['calibration_samples']} samples.",
        "- **AWQ's cost is calibration rows times grid points**: at the default size, n_grid 20 (llm-compressor's "
        f"default) took {awq20['cpu_time_s']:.0f} s of CPU ({awq20['wall_time_s']:.0f} s wall) for {kl(awq20)}, n_grid "
        f"4 {awq4['cpu_time_s']:.0f} s ({awq4['wall_time_s']:.0f} s wall) for {kl(awq4)}, top-1 agreement "
        f"{awq4['quality']['top1_agreement']:.3f}"
        + (" (the highest of all runs)" if awq4["quality"]["top1_agreement"] == best_top1 else "")
        + f" and a perplexity increase of {awq4['quality']['perplexity_increase_pct']:.1f}%.",
        "- A CPU host should therefore take params.yaml's calibration size (every row the split has), AWQ's "
        "`n_grid: 4` and one thread per process when the host is shared. The grid is the pipeline's default on a "
        "host without a GPU: `quantize.calibration.cpu_awq_n_grid: 4` applies to every AWQ variant that sets no "
        "`n_grid` of its own (a GPU keeps llm-compressor's 20), and `metrics/quantize-<variant>.json` records the "
        "grid that ran (`awq_n_grid`, `awq_n_grid_from`). The thread count stays the caller's environment "
        "(`OMP_NUM_THREADS`), not a param.",
    ]


def render_page(raw: dict, smollm2: dict | None = None) -> str:
    """quantize.md: the demo target's table (raw/quantize.json), then SmolLM2's (raw/quantize-smollm2.json)."""
    path = RAW / "quantize-smollm2.json"
    smollm2 = smollm2 or (json.loads(path.read_text()) if path.exists() else None)
    return render(raw) + (render_smollm2(smollm2) if smollm2 else "")


def render_offload(raw: dict) -> str:
    lines = [
        "# Quantizing with `quantize.calibration.offload` off and on (GPU)",
        "",
        f"Produced by `{raw['command']}` (code at commit {raw['commit']}): `{raw['variant']}` on random bf16 weights "
        f"at TinyLlama-1.1B's shape ({raw['parameters'] / 1e9:.2f}B parameters, the demo tokenizer's vocabulary), "
        "each setting in its own fresh process through the stage's own `quantize_model`, params.yaml's calibration "
        "settings. With offload the weights stay in CPU RAM and llm-compressor's sequential pipeline moves one "
        "decoder layer at a time onto the GPU. Raw runs: `benchmarks/raw/quantize-offload.json`.",
        "",
        "| offload | wall time s | oneshot s | peak GPU memory MB | peak host memory MB | size before MB "
        "| size after MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in raw["runs"]:
        lines.append(
            f"| {str(r['offload']).lower()} | {r['wall_time_s']:.2f} | {r['oneshot_time_s']:.2f} "
            f"| {r['peak_gpu_memory_mb']:.0f} | {r['peak_memory_mb']:.0f} | {r['size_before_mb']:.0f} "
            f"| {r['size_after_mb']:.0f} |"
        )
    lines += ["", "Machine:", ""] + [f"- {k}: {v}" for k, v in raw["machine"].items()]
    return "\n".join(lines) + "\n"


# Each raw file and the markdown rendered from it (tests/project/test_benchmark_docs.py re-renders and compares).
RENDERERS = {
    "quantize.json": ("quantize.md", render_page),
    "quantize-offload.json": ("quantize-offload.md", render_offload),
}


def write(raw: dict, raw_path: Path, out: Path, renderer) -> None:
    raw_path.parent.mkdir(parents=True, exist_ok=True)
    raw_path.write_text(json.dumps(raw, indent=2) + "\n")
    out.write_text(renderer(raw))
    print(f"wrote {raw_path} and {out}")


def offload_comparison(params: dict, args, variant: str = "gptq-w4a16") -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: --offload compares GPU memory and needs CUDA")
    raw = {"command": args.command, "commit": args.commit, "machine": machine(), "variant": variant}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer_dir, _ = demo_target(params, work)
        calibration = calibration_split(params, tokenizer_dir, work)
        target = random_llama(tokenizer_dir, work / "tinyllama-shape")
        raw["runs"] = [
            {**quantize_in_child(variant, target, calibration, work, offload), "offload": offload}
            for offload in (False, True)
        ]
        raw["parameters"] = parameter_count(target)
    write(
        raw,
        args.raw or RAW / "quantize-offload.json",
        args.out or ROOT / "benchmarks" / "quantize-offload.md",
        render_offload,
    )


# SmolLM2 settings, cheapest first (a run cut short keeps what finished): (variant, calibration size, the variant's
# own keys). "default" is params.yaml's quantize.calibration, "profile" profiles/smollm2.yaml's; n_grid None unsets
# the profile's 4, so AWQ searches llm-compressor's default 20 scales per mapping. Group size 64 throughout (the
# profile's: SmolLM2's widths 576 and 1536 are not multiples of 128).
SMOLLM2_SETTINGS = [
    ("gptq-w4a16", "profile", {}),
    ("awq-w4a16", "profile", {"n_grid": 4}),
    ("gptq-w4a16", "default", {}),
    ("awq-w4a16", "default", {"n_grid": None}),
    ("awq-w4a16", "default", {"n_grid": 4}),
    ("awq-w4a16", "profile", {"n_grid": None}),
]


def smollm2_splits(params: dict, target: Path, work: Path) -> dict[str, Path]:
    """The calibration and held-out splits the `data` stage makes from the profile's traffic (grouped by module)."""
    from pipeline.data.traffic import dedup, drop_too_long, max_token_bytes, read_grouped, split, write_split
    from pipeline.models.loading import load_tokenizer

    data, tokenizer = params["data"], load_tokenizer(target)
    rows, groups, _ = read_grouped(ROOT / data["traffic"], data["max_tokens"] * max_token_bytes(tokenizer))
    kept, _ = drop_too_long(dedup(rows), tokenizer, data["max_tokens"])
    splits = split(kept, data["fractions"], data["seed"], groups)
    paths = {}
    for name in ("calibration", "heldout"):
        paths[name] = work / f"{name}.jsonl"
        write_split(splits[name], paths[name])
    return paths


def smollm2_comparison(params: dict, args) -> None:
    import yaml

    from pipeline.data.traffic import read_split
    from pipeline.models.gguf_source import converted
    from pipeline.params.profiles import overlay, profile_path

    profile = yaml.safe_load(profile_path("smollm2").read_text())
    merged, _ = overlay(params, profile)
    source = converted(merged["target"]["source"], "target")
    sizes = {
        "default": {k: params["quantize"]["calibration"][k] for k in ("num_samples", "max_seq_length")},
        "profile": {k: merged["quantize"]["calibration"][k] for k in ("num_samples", "max_seq_length")},
    }
    raw_path = args.raw or RAW / "quantize-smollm2.json"
    # --resume: keep the runs an interrupted invocation wrote and measure only the settings it had not reached
    import torch

    done, default_threads = [], torch.get_num_threads()
    if args.resume and raw_path.exists():
        before = json.loads(raw_path.read_text())
        # Runs from before --threads existed recorded no thread count: they ran at torch's default, this one's.
        done = [
            {
                "command": before["command"],
                "commit": before["commit"],
                "date": before["machine"]["date"],
                "torch_threads": default_threads,
                **r,
            }
            for r in before["runs"]
        ]
    raw = {
        "command": args.command,
        "commit": args.commit,
        "machine": machine(),
        "model": f"SmolLM2-135M-Instruct ({merged['target']['source']}: {source.gguf} converted to bf16 "
        "safetensors by pipeline/models/gguf_source.py)",
        "traffic": merged["data"]["traffic"],
        "calibration_sizes": sizes,
        "heldout_limit": merged["evaluate"]["heldout_limit"],
        "runs": done,
    }
    raw["machine"]["torch threads by default"] = default_threads
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        splits = smollm2_splits(merged, source.path, work)
        raw["calibration_rows"] = len(read_split(splits["calibration"]))
        raw["heldout_rows"] = len(read_split(splits["heldout"]))
        raw["parameters"] = parameter_count(source.path)
        (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
        for variant, size, own in SMOLLM2_SETTINGS:
            settings = {**own, **sizes[size]}
            if any(
                (r["variant"], r["calibration"], r["settings"], r["torch_threads"])
                == (variant, size, settings, args.threads or default_threads)
                for r in done
            ):
                continue
            job = work / "job.json"
            job.write_text(
                json.dumps(
                    {
                        "params": str(work / "params.yaml"),
                        "variant": variant,
                        "target": str(source.path),
                        "settings": settings,
                        "threads": args.threads,
                        **{k: str(v) for k, v in splits.items()},
                    }
                )
            )
            result = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
            subprocess.run(
                [sys.executable, __file__, "--child-smollm2", str(job), str(result)],
                check=True,
                cwd=ROOT,
                env={**os.environ, "TQDM_MININTERVAL": "10"},
            )
            run = {
                "variant": variant,
                "calibration": size,
                "settings": settings,
                "command": args.command,
                "commit": args.commit,
                "date": machine()["date"],
                **json.loads(result.read_text()),
            }
            raw["runs"].append(run)
            print(
                f"{variant} {size} {own}: {run['wall_time_s']} s, KL {run['quality']['kl_divergence']:.4f}, "
                f"load {run['load_average']}",
                flush=True,
            )
            raw["machine"]["load average at end (1 min)"] = f"{os.getloadavg()[0]:.1f}"
            # Written after every run: a long run cut short keeps the ones that finished.
            raw_path.write_text(json.dumps(raw, indent=2) + "\n")
            out = args.out or ROOT / "benchmarks" / "quantize.md"
            out.write_text(render_page(json.loads((RAW / "quantize.json").read_text()), raw))
            print(f"wrote {raw_path} and {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default: benchmarks/quantize.md (quantize-offload.md with --offload)")
    ap.add_argument(
        "--raw", type=Path, help="default: benchmarks/raw/quantize.json (quantize-offload.json with --offload)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="rounds over all variants; the median is reported")
    ap.add_argument("--offload", action="store_true", help="GPU: offload off vs on at TinyLlama-1.1B shape")
    ap.add_argument("--render", action="store_true", help="only re-render the markdown from benchmarks/raw/*.json")
    ap.add_argument(
        "--pretrain-steps",
        type=int,
        help="when this script builds the demo target: pretrain it this many steps (same shapes)",
    )
    ap.add_argument(
        "--commit",
        help="commit of the measured code; default: HEAD of this checkout (give it when "
        "running from an export such as `git archive`)",
    )
    ap.add_argument(
        "--model",
        choices=["demo", "smollm2"],
        default="demo",
        help="smollm2: GPTQ and AWQ on SmolLM2-135M at the default and profile calibration sizes",
    )
    ap.add_argument("--threads", type=int, help="--model smollm2: torch threads per run (default: torch's own)")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="--model smollm2: keep the raw file's runs and measure only the settings it lacks",
    )
    # Child mode, one variant: VARIANT TARGET CALIBRATION RESULT_JSON OFFLOAD(0|1).
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--child-smollm2", nargs=2, help=argparse.SUPPRESS)  # JOB_JSON RESULT_JSON
    args = ap.parse_args()
    if args.child_smollm2:
        return run_smollm2_child(*map(Path, args.child_smollm2))
    if args.child:
        variant, target, calibration, result, offload = args.child
        return run_child(variant, Path(target), Path(calibration), Path(result), offload == "1")
    if args.render:
        for raw_name, (md_name, renderer) in RENDERERS.items():
            if (RAW / raw_name).exists():
                (ROOT / "benchmarks" / md_name).write_text(renderer(json.loads((RAW / raw_name).read_text())))
                print(f"wrote benchmarks/{md_name}")
        return

    from pipeline.params.load import load_params

    args.command = " ".join(["python", "benchmarks/quantize_bench.py", *sys.argv[1:]])
    args.commit = args.commit or code_commit()
    params = load_params(PARAMS_FILE)
    if args.offload:
        return offload_comparison(params, args)
    if args.model == "smollm2":
        return smollm2_comparison(params, args)
    cal = params["quantize"]["calibration"]
    raw = {
        "command": args.command,
        "commit": args.commit,
        "machine": machine(),
        "calibration": {k: cal[k] for k in ("num_samples", "max_seq_length")},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        target, raw["target"] = demo_target(params, work, args.pretrain_steps)
        calibration = calibration_split(params, target, work)
        runs = {variant: [] for variant in params["quantize"]["enabled"]}
        # Round-robin, so a burst of load from other work on the host hits all variants alike.
        for round_ in range(args.repeats):
            for variant, results in runs.items():
                results.append(quantize_in_child(variant, target, calibration, work))
                print(
                    f"round {round_ + 1} {variant}: {results[-1]['wall_time_s']} s, "
                    f"peak {results[-1]['peak_memory_mb']} MB",
                    flush=True,
                )
        raw["parameters"], raw["runs"] = parameter_count(target), runs
    # Other work on a shared host slows single runs: the load at the end shows whether there was any.
    raw["machine"]["load average at end (1 min)"] = f"{os.getloadavg()[0]:.1f}"
    write(raw, args.raw or RAW / "quantize.json", args.out or ROOT / "benchmarks" / "quantize.md", render)


if __name__ == "__main__":
    main()
