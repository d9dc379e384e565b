"""Time the quantize stage's recipes, each run in a fresh process so its peak memory is its own.

    python benchmarks/quantize_bench.py            # every enabled variant on the demo target -> quantize.md
    python benchmarks/quantize_bench.py --offload  # GPU only: offload off vs on at TinyLlama-1.1B shape
                                                   #   -> quantize-offload.md

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
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import enabled_variant, load_params  # noqa: E402
from pipeline.data import dedup, drop_too_long, load_traffic, read_split, split, write_split  # noqa: E402
from pipeline.formatting import full_text  # noqa: E402
from pipeline.loading import load_tokenizer  # noqa: E402

PARAMS_FILE = ROOT / "params.yaml"


def demo_target(params: dict, work: Path) -> tuple[Path, str]:
    built = ROOT / "artifacts" / "models" / "target"
    if built.is_dir():
        return built, "artifacts/models/target (built by the `models` stage)"
    from pipeline.demo.models import build_demo_pair

    build_demo_pair(work / "target", work / "draft", params["demo"])
    return work / "target", "built by this script from params.yaml `demo:`"


def calibration_split(params: dict, target: Path, work: Path) -> Path:
    built = ROOT / "artifacts" / "data" / "calibration.jsonl"
    if built.is_file():
        return built
    data = params["data"]
    kept, _ = drop_too_long(dedup(load_traffic(ROOT / data["traffic"])), load_tokenizer(target), data["max_tokens"])
    path = work / "calibration.jsonl"
    write_split(split(kept, data["fractions"], data["seed"])["calibration"], path)
    return path


def run_child(variant: str, target: Path, calibration: Path, result: Path, offload: bool) -> None:
    """Child process: one variant, metrics as JSON."""
    from pipeline.quantize import quantize_model

    params = load_params(PARAMS_FILE)
    tokenizer = load_tokenizer(target)
    texts = [full_text(tokenizer, m) for m in read_split(calibration)]
    cfg = {**params["quantize"]["calibration"], "offload": offload}
    with tempfile.TemporaryDirectory() as out:
        metrics = quantize_model(target, Path(out) / variant, variant, enabled_variant(params, variant), texts, cfg)
    result.write_text(json.dumps(metrics))


def quantize_in_child(variant: str, target: Path, calibration: Path, work: Path, offload: bool = False) -> dict:
    result = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    subprocess.run([sys.executable, __file__, "--child", variant, str(target), str(calibration), str(result),
                    str(int(offload))], check=True, cwd=ROOT, env={**os.environ, "TQDM_MININTERVAL": "10"})
    return json.loads(result.read_text())


def random_llama(tokenizer_dir: Path, dest: Path) -> Path:
    """Random bf16 weights at TinyLlama-1.1B's shape (the demo tokenizer's vocabulary): memory and
    time follow the shapes, not the values."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                         num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
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

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU only ({cpu})",
        "cores": f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}",
        "memory": f"{mem_kb / 2**20:.0f} GiB",
        "load average at start (1 min)": f"{os.getloadavg()[0]:.1f}",
        "versions": ", ".join(f"{p} {version(p)}" for p in ("torch", "transformers", "llmcompressor",
                                                            "compressed-tensors")) + f", Python {platform.python_version()}",
    }


def summarize(runs: list[dict]) -> dict:
    """One row from a variant's repeats: median times (the host is shared), their range, max peak."""
    walls = sorted(r["wall_time_s"] for r in runs)
    return {**runs[0], "wall_time_s": statistics.median(walls), "wall_range": (walls[0], walls[-1]),
            "oneshot_time_s": statistics.median(r["oneshot_time_s"] for r in runs),
            "peak_memory_mb": max(r["peak_memory_mb"] for r in runs), "repeats": len(runs)}


def render(rows: list[dict], info: dict, target_note: str, params: dict, n_params: int) -> str:
    fastest = min(r["wall_time_s"] for r in rows)
    cal, repeats = params["quantize"]["calibration"], rows[0]["repeats"]
    lines = [
        "# Quantization time per variant on the demo target",
        "",
        "Produced by `python benchmarks/quantize_bench.py` (each variant in its own fresh process, through the "
        "quantize stage's own `pipeline.quantize.quantize_model`, params.yaml as committed; "
        f"{repeats} rounds over all variants, median reported).",
        f"Target: {target_note}, {n_params / 1e6:.1f}M parameters. Calibration: up to {cal['num_samples']} "
        f"conversations of the traffic's calibration split, at most {cal['max_seq_length']} tokens each.",
        "Wall time covers load, calibration, compression and save; oneshot is llm-compressor's part of it. "
        "Peak memory is the process's peak resident set (model, calibration activations, the library itself).",
        "",
        "| variant | algorithm | scheme | calibration samples | wall time s | wall time range s | oneshot s "
        "| peak memory MB | size before MB | size after MB | compression ratio | wall time vs fastest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["wall_range"]
        lines.append(f"| {r['variant']} | {r['algorithm']} | {r['scheme']} | {r['calibration_samples']} "
                     f"| {r['wall_time_s']:.2f} | {lo:.2f}-{hi:.2f} | {r['oneshot_time_s']:.2f} "
                     f"| {r['peak_memory_mb']:.0f} | {r['size_before_mb']:.2f} | {r['size_after_mb']:.2f} "
                     f"| {r['compression_ratio']:.2f} | {r['wall_time_s'] / fastest:.1f}x |")
    lines += ["", "Machine:", ""] + [f"- {k}: {v}" for k, v in info.items()]
    if info["device"].startswith("CPU"):
        lines.append("- calibration in float32 on CPU (the stage's CPU setting); the host is shared with other "
                     "work, so single runs vary (the range column), hence the median")
    return "\n".join(lines) + "\n"


def render_offload(rows: list[dict], info: dict, variant: str, n_params: int) -> str:
    lines = [
        "# Quantizing with `quantize.calibration.offload` off and on (GPU)",
        "",
        f"Produced by `python benchmarks/quantize_bench.py --offload`: `{variant}` on random bf16 weights at "
        f"TinyLlama-1.1B's shape ({n_params / 1e9:.2f}B parameters, the demo tokenizer's vocabulary), each "
        "setting in its own fresh process through the stage's own `quantize_model`, params.yaml's calibration "
        "settings. With offload the weights stay in CPU RAM and llm-compressor's sequential pipeline moves one "
        "decoder layer at a time onto the GPU.",
        "",
        "| offload | wall time s | oneshot s | peak GPU memory MB | peak host memory MB | size before MB "
        "| size after MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {str(r['offload']).lower()} | {r['wall_time_s']:.2f} | {r['oneshot_time_s']:.2f} "
                     f"| {r['peak_gpu_memory_mb']:.0f} | {r['peak_memory_mb']:.0f} | {r['size_before_mb']:.0f} "
                     f"| {r['size_after_mb']:.0f} |")
    lines += ["", "Machine:", ""] + [f"- {k}: {v}" for k, v in info.items()]
    return "\n".join(lines) + "\n"


def offload_comparison(params: dict, out: Path, variant: str = "gptq-w4a16") -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: --offload compares GPU memory and needs CUDA")
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer_dir, _ = demo_target(params, work)
        calibration = calibration_split(params, tokenizer_dir, work)
        target = random_llama(tokenizer_dir, work / "tinyllama-shape")
        rows = [{**quantize_in_child(variant, target, calibration, work, offload), "offload": offload}
                for offload in (False, True)]
        n_params = parameter_count(target)
    out.write_text(render_offload(rows, info, variant, n_params))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default: benchmarks/quantize.md (quantize-offload.md with --offload)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over all variants; the median is reported")
    ap.add_argument("--offload", action="store_true", help="GPU: offload off vs on at TinyLlama-1.1B shape")
    # Child mode, one variant: VARIANT TARGET CALIBRATION RESULT_JSON OFFLOAD(0|1).
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        variant, target, calibration, result, offload = args.child
        return run_child(variant, Path(target), Path(calibration), Path(result), offload == "1")

    params = load_params(PARAMS_FILE)
    if args.offload:
        return offload_comparison(params, args.out or ROOT / "benchmarks" / "quantize-offload.md")
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        target, target_note = demo_target(params, work)
        calibration = calibration_split(params, target, work)
        runs = {variant: [] for variant in params["quantize"]["enabled"]}
        # Round-robin, so a burst of load from other work on the host hits all variants alike.
        for round_ in range(args.repeats):
            for variant, results in runs.items():
                results.append(quantize_in_child(variant, target, calibration, work))
                print(f"round {round_ + 1} {variant}: {results[-1]['wall_time_s']} s, "
                      f"peak {results[-1]['peak_memory_mb']} MB", flush=True)
        n_params = parameter_count(target)
    out = args.out or ROOT / "benchmarks" / "quantize.md"
    out.write_text(render([summarize(results) for results in runs.values()], info, target_note, params, n_params))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
