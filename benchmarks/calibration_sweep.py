"""Quality against calibration sample count: is quantize.calibration.num_samples big enough?

    python benchmarks/calibration_sweep.py           # after `dvc repro` of the demo: -> raw/calibration-sweep.json
                                                     #   -> calibration.md
    python benchmarks/calibration_sweep.py --render  # only re-render calibration.md from the committed raw JSON

Each calibrated variant (params.yaml's recipe, the stage's own `quantize_model` and the evaluate stage's
`fidelity`) is quantized from the demo build's `artifacts/models/target` with the first N rows of
`artifacts/data/calibration.jsonl`, for each N in SAMPLES (the split's size is the largest), then scored
against the target on the held-out split (evaluate.heldout_limit conversations). llm-compressor's guidance is
128-512 samples; the demo's calibration split is smaller, so this measures the range it has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RAW = ROOT / "benchmarks" / "raw" / "calibration-sweep.json"
MARKDOWN = ROOT / "benchmarks" / "calibration.md"
GPU_RAW = ROOT / "benchmarks" / "gpu" / "raw" / "calibration" / "calibration-sweep-gpu.json"
VARIANTS = ["gptq-w4a16", "awq-w4a16", "fp8-static"]
SAMPLES = [8, 16, 32, 64]


def measure(
    artifacts: Path, params_path: Path, device: str, variants: list[str], samples: list[int], raw_path: Path
) -> dict:
    """Every (variant, N) run, the raw file rewritten after each one (a cut-off run keeps what it measured)."""
    import torch

    from pipeline.data.formatting import full_text, prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.evaluate.quality import fidelity
    from pipeline.models.loading import load_causal_lm, load_tokenizer
    from pipeline.params.load import load_params
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration

    target = artifacts / "models/target"
    if not (target / "model.safetensors").is_file():
        sys.exit(f"no demo build: run `dvc repro` first ({target})")
    p = load_params(params_path)
    tokenizer = load_tokenizer(target)
    texts = [full_text(tokenizer, m) for m in read_split(artifacts / "data/calibration.jsonl")]
    heldout = read_split(artifacts / "data/heldout.jsonl")[: p["evaluate"]["heldout_limit"]]
    examples = [prompt_and_response_ids(tokenizer, m) for m in heldout]
    dev = torch.device(device)
    baseline = load_causal_lm(target, dev)
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    raw = {
        "commit": git.stdout.strip() if git.returncode == 0 else None,
        "target_md5": hashlib.md5((target / "model.safetensors").read_bytes()).hexdigest(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "calibration_rows": len(texts),
        "heldout": len(examples),
        "default_num_samples": p["quantize"]["calibration"]["num_samples"],
        "runs": [],
    }
    for variant in variants:
        for n in sorted({*(n for n in samples if n < len(texts)), len(texts)}):
            spec = parse_variant(variant, {**p["quantize"]["variants"][variant], "num_samples": n})
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                quantize_model(target, Path(tmp) / "q", spec, texts, Calibration.parse(p["quantize"]["calibration"]))
                wall = time.perf_counter() - t0
                quality = fidelity(baseline, load_causal_lm(Path(tmp) / "q", dev), examples)
            raw["runs"].append(
                {
                    "variant": variant,
                    "num_samples": n,
                    "wall_time_s": round(wall, 2),
                    **{k: quality[k] for k in ("perplexity_increase_pct", "kl_divergence", "top1_agreement")},
                }
            )
            print(json.dumps(raw["runs"][-1]), flush=True)
            raw_path.write_text(json.dumps(raw, indent=2) + "\n")
    return raw


def sweep_table(raw: dict) -> tuple[list[str], dict[str, dict[int, float]]]:
    """The markdown rows of a sweep, and KL by variant and sample count."""
    rows = ["| variant | samples | KL vs target | ppl change % | top-1 | quantize s |", "|---|---|---|---|---|---|"]
    rows += [
        f"| {r['variant']} | {r['num_samples']} | {r['kl_divergence']:.2e} | "
        f"{r['perplexity_increase_pct']:+.3f} | {r['top1_agreement']:.4f} | {r['wall_time_s']:.1f} |"
        for r in raw["runs"]
    ]
    variants = list(dict.fromkeys(r["variant"] for r in raw["runs"]))
    return rows, {v: {r["num_samples"]: r["kl_divergence"] for r in raw["runs"] if r["variant"] == v} for v in variants}


def render_all() -> str:
    """calibration.md: the CPU sweep, then the GPU profile's when its raw file is committed."""
    text = render(json.loads(RAW.read_text()))
    if GPU_RAW.exists():
        text += "\n" + render_gpu(json.loads(GPU_RAW.read_text()))
    return text


def render_gpu(raw: dict) -> str:
    rows, by = sweep_table(raw)
    default, largest = raw["default_num_samples"], raw["calibration_rows"]
    best = {v: min(kl, key=kl.get) for v, kl in by.items()}
    spread = {v: max(kl.values()) / min(kl.values()) - 1 for v, kl in by.items()}
    at_default = {v: kl[default] / kl[best[v]] - 1 for v, kl in by.items() if default in kl}
    fall = {v: kl[min(kl)] / kl[default] for v, kl in by.items() if default in kl}
    top1 = min(r["top1_agreement"] for r in raw["runs"])
    return f"""# Calibration sample count vs. quality (GPU profile target, H100)

`bash benchmarks/gpu/session.sh gpu-calib OUT S` on the lent {raw["device"]}: the GPU demo profile's 1.08B target
trained from scratch (`dvc repro data`, target md5 {raw["target_md5"][:12]}) with `profiles/gpu-calibration.yaml`'s \
larger
calibration share ({largest} rows), each variant quantized on the GPU with the first N rows and scored against the
target on {raw["heldout"]} held-out conversations by the evaluate stage's scorer. Raw:
`benchmarks/gpu/raw/calibration/calibration-sweep-gpu.json`.

{chr(10).join(rows)}

Lowest KL at: {", ".join(f"{v} N={n}" for v, n in best.items())}. From the smallest count to the default
(`num_samples: {default}`) KL changed by {", ".join(f"{v} x{1 / x:.2f}" for v, x in fall.items())}; across all counts it
varied by {", ".join(f"{v} {x:+.0%}" for v, x in spread.items())} (largest over smallest, one seed each). At the \
default each
variant was within {max(at_default.values()):+.1%} of its lowest KL, so the default stays {default}. Top-1 agreement \
was at least
{top1:.4f} everywhere: this target is easy to quantize, so the differences show in KL only.
"""


def render(raw: dict) -> str:
    rows, by = sweep_table(raw)
    largest, default = raw["calibration_rows"], raw["default_num_samples"]
    best = {v: min(kl, key=kl.get) for v, kl in by.items()}
    over = {v: kl[default] / kl[largest] - 1 for v, kl in by.items()}
    # KL rising with more samples can only be noise: its largest step is this sweep's noise floor.
    rises = {(v, a, b): kl[b] / kl[a] - 1 for v, kl in by.items() for a, b in zip(sorted(kl), sorted(kl)[1:])}
    (nv, na, nb), noise = max(rises.items(), key=lambda item: item[1])
    return f"""# Calibration sample count vs. quality (demo target, CPU)

`python benchmarks/calibration_sweep.py` at commit {raw["commit"][:7]} (target md5 {raw["target_md5"][:12]}): each
calibrated variant quantized with the first N of the {raw["calibration_rows"]} calibration rows, scored against the \
target
on {raw["heldout"]} held-out conversations by the evaluate stage's scorer. Raw: `benchmarks/raw/calibration-sweep.json`.

{chr(10).join(rows)}

Lowest KL at: {", ".join(f"{v} N={n}" for v, n in best.items())}. With the default of the time
(`num_samples: {default}`) KL was {", ".join(f"{v} {x:+.0%}" for v, x in over.items())} against all {largest} rows. \
The smallest
counts are not monotonic: KL rose by up to {noise:+.0%} with more samples ({nv}, {na} -> {nb}), the noise of this
single-seed sweep, so each step alone means little; the largest count is best for every variant. The default is now \
256 (params.yaml): every row of a split this small, and
inside llm-compressor's 128-512 guidance for real traffic (not measured here beyond {largest} rows; the GPU profile's \
sweep below goes to 296).
"""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only re-render calibration.md from the raw JSON")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts", help="a demo build's artifacts/")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU profile's target")
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument(
        "--samples",
        nargs="+",
        type=int,
        default=SAMPLES,
        help="N below the split's size; the whole split is always the last",
    )
    parser.add_argument("--raw", type=Path, default=RAW, help="where the measured JSON goes")
    args = parser.parse_args()
    if not args.render:
        measure(args.artifacts, args.params, args.device, args.variants, args.samples, args.raw)
        if args.raw != RAW:  # a GPU run: its raw file is committed under benchmarks/gpu/raw/ first
            sys.exit(0)
    MARKDOWN.write_text(render_all())
    print(f"wrote {MARKDOWN}")
