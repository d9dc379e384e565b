"""The measured points `modelprep plan` scales from: pipeline/serving/plan_points.json, written from committed raw runs.

    python benchmarks/plan_points.py            # rewrite pipeline/serving/plan_points.json
    python benchmarks/plan_points.py --check    # exit 1 when the committed file differs from the raw runs

Quantization (time and peak GPU memory per variant) from the Llama-3-8B-shape runs on an H100 (raw/llama3-8b and
raw/schemes8b quant8b-*.json: one process per variant, the weights on the GPU); every other stage's wall time from
one whole `dvc repro` of the GPU demo profile on an H100 (raw/gpu-tp1/repro.log, whose lines start with the seconds
since the run began: a stage lasts from its `Running stage` line to the next one), and, for the stages it timed one
by one, the whole `dvc repro` at Llama-3-8B's shape on 4 H100s (raw/repro8b: each stage's end from its outputs'
modification times, benchmarks/tables/repro8b.py). GPTQ per decoder layer (`gptq_layers`) from raw/scale-host: the
Llama-3-8B shape on 1, 2 and 4 H100s and 2 layers of Llama-3-70B's widths on one H100 onloading and on 4 (the
median seconds per layer from llm-compressor's timestamps, benchmarks/tables/tpeval.py; a layer's parameters from
the published shape). Each stage has a list of points; the plan scales from the one nearest the target's size.
Parameters are each run's BF16 checkpoint bytes / 2. Nothing here is estimated: the plan does the scaling, and says
from which point. Those runs' `*_mb` fields are MiB (benchmarks/tables/read.py RECORDED_IN_MIB): read back in MB
through its in_mb.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tables/ beside this file, and this checkout's pipeline/ (not the editable install's)
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from pipeline.serving.parallelism import ModelShape  # noqa: E402
from pipeline.serving.plan import SHAPES, layer_parameters  # noqa: E402
from tables import repro8b, tpeval  # noqa: E402
from tables.read import in_mb  # noqa: E402

OUT = ROOT / "pipeline/serving/plan_points.json"
GPU_RAW = Path("benchmarks/gpu/raw")
QUANTIZE_FILES = [
    "llama3-8b/quant8b-gptq-w4a16.json",
    "llama3-8b/quant8b-awq-w4a16.json",
    "llama3-8b/quant8b-fp8-dynamic.json",
    "schemes8b/quant8b-int8-w8a8.json",
    "schemes8b/quant8b-fp8-block.json",
    "schemes8b/quant8b-nvfp4a16.json",
]
STAGE_RUN = "gpu-tp1"
STAGES = ("quantize@bf16", "distill", "draft_finetune", "eagle3", "evaluate", "serve_bench", "bundle")
LINE = re.compile(r"^(\d+) Running stage '([^']+)':")


def raw_record(rel: str) -> dict:
    """A raw JSON record with its `*_mb` fields in MB (MiB in the folders recorded so)."""
    return in_mb(rel.split("/")[0], json.loads((ROOT / GPU_RAW / rel).read_text()))


def gpu_name(run: str) -> str:
    text = ROOT / GPU_RAW / run / "gpu.txt"
    if text.is_file():
        return text.read_text().split(",")[0].strip()
    return json.loads((ROOT / GPU_RAW / run / "run.json").read_text())["gpu"]["name"]


def quantize_points() -> dict:
    out = {}
    for rel in QUANTIZE_FILES:
        d = raw_record(rel)
        # peak_gpu_memory_mb where recorded; the llama3-8b files' peak_memory_mb is torch.cuda.max_memory_allocated
        # (pipeline/quantize.py at c6ed31c, which wrote them on cuda)
        peak = d["peak_gpu_memory_mb"] * 1e6 if "peak_gpu_memory_mb" in d else d["peak_memory_mb"] * 1e6
        out[d["variant"]] = {
            "run": f"{GPU_RAW / rel}",
            "gpu": gpu_name(rel.split("/")[0]),
            "algorithm": d["algorithm"],
            "scheme": d["scheme"],
            "parameters": round(d["size_before_mb"] * 1e6 / 2),
            "calibration_samples": d["calibration_samples"],
            "wall_time_s": d["wall_time_s"],
            "peak_gpu_memory_bytes": round(peak),
        }
    return out


def stage_points() -> dict:
    log = (ROOT / GPU_RAW / STAGE_RUN / "repro.log").read_text().splitlines()
    starts = [(int(m.group(1)), m.group(2)) for line in log if (m := LINE.match(line))]
    ends = [t for t, _ in starts[1:]] + [None]
    sizes = raw_record(f"{STAGE_RUN}/metrics/quantize-bf16.json")
    times: dict[str, list[float]] = {}
    for (start, stage), end in zip(starts, ends):
        if end is None:
            continue
        name = stage if stage in STAGES else stage.split("@")[0]
        if name in STAGES:
            times.setdefault(name, []).append(end - start)
    large = large_points()
    return {
        name: [
            {
                "run": f"{GPU_RAW / STAGE_RUN}/repro.log",
                "gpu": gpu_name(STAGE_RUN),
                "parameters": round(sizes["size_before_mb"] * 1e6 / 2),
                "wall_time_s": round(sum(times[name]) / len(times[name]), 1),
                "runs": len(times[name]),
            },
            *large.get(name, []),
        ]
        for name in STAGES
    }


# raw/repro8b's rows (tables/repro8b.py STAGE_OUTPUT) that time one pipeline stage each; quantize@bf16's row also
# holds the two mixed@ stages (each a skip of about a second), distill and draft_finetune share one row: left out
LARGE_ROWS = {
    "quantize@bf16": ("mixed@*, quantize@bf16",),
    "eagle3": ("eagle3",),
    "evaluate": ("evaluate@bf16", "evaluate@gptq-w4a16"),
    "serve_bench": ("serve_bench@bf16", "serve_bench@gptq-w4a16"),
}


def large_points() -> dict[str, list[dict]]:
    rows = {r["stage"]: r["seconds"] for r in repro8b.stage_rows()}
    size = raw_record("repro8b/metrics/quantize-bf16.json")["size_before_mb"]
    out = {}
    for name, stages in LARGE_ROWS.items():
        seconds = [rows[s] for s in stages]
        out[name] = [
            {
                "run": f"{GPU_RAW}/repro8b/listing.txt",
                "gpu": gpu_name("repro8b"),
                "parameters": round(size * 1e6 / 2),
                "wall_time_s": round(sum(seconds) / len(seconds), 1),
                "runs": len(seconds),
            }
        ]
    return out


# the checkpoint each scale-host step quantized (tables/tpeval.py CHECKPOINT): its decoder layers' widths
LAYER_SHAPES = {"8b": "llama-3-8b", "70b2": "llama-3-70b"}


def gptq_layer_points() -> list[dict]:
    """Per GPU count and onloading: seconds per decoder layer (median) and the peak GPU memory of one process, the
    unit `modelprep plan` scales a layer-by-layer quantization from (a 70B model on an H100 can only go so)."""
    out = []
    for row in tpeval.run_quant_rows(tpeval.HOST):
        rec = tpeval.quant_record(row["step"], tpeval.HOST)
        if rec is None or row["median"] is None:
            continue
        shape = ModelShape.from_config(SHAPES[LAYER_SHAPES[row["checkpoint"]]])
        out.append(
            {
                "run": f"{GPU_RAW / tpeval.HOST}/run.log",
                "step": row["step"],
                "gpu": gpu_name(tpeval.HOST),
                "algorithm": rec["metrics"]["algorithm"],
                "gpus": row["gpus"],
                "offload": row["offload"],
                "layer_seconds": round(row["median"], 3),
                "layer_parameters": layer_parameters(shape),
                "peak_gpu_memory_bytes": round(in_mb(tpeval.HOST, rec["metrics"])["peak_gpu_memory_mb"] * 1e6),
                "calibration_samples": rec["samples"],
                "max_seq_length": rec["max_seq_length"],
            }
        )
    return out


def points() -> dict:
    return {
        "produced_by": "python benchmarks/plan_points.py",
        "quantize": quantize_points(),
        "gptq_layers": gptq_layer_points(),
        "stages": stage_points(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = json.dumps(points(), indent=1) + "\n"
    if args.check:
        return 0 if OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"{OUT.relative_to(ROOT)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
