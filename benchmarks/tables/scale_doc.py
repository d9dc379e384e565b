"""docs/scale.md's measured blocks: per-layer GPTQ seconds of the Llama-3-8B shape on 1, 2 and 4 GPUs and of a
2-layer model of Llama-3-70B's widths on 1 and 4 (raw/tpeval/, raw/scale-host/), with their conditions: the same rows
and columns as benchmarks/gpu/SCALE.md's tpeval-conditions and gptq-layers blocks; and `modelprep plan`'s GPTQ row for
Llama-3-70B and Llama-3.1-405B quantized layer by layer (pipeline/serving/plan.py, from those per-layer points)."""

from __future__ import annotations

from render import Facts, Spec, Table
from tables import read, scale, tpeval

# (shape, GPUs per host, quantize settings): one H100 onloading, and every GPU of a host of 4 (70B) or 8 (405B)
PLANNED = (
    ("llama-3-70b", 4, {"calibration": {"offload": True}}),
    ("llama-3-70b", 4, {"distributed": {"gpus": 4}}),
    ("llama-3.1-405b", 8, {"calibration": {"offload": True}}),
    ("llama-3.1-405b", 8, {"distributed": {"gpus": 8}}),
)
VARIANT = "gptq-w4a16"


def planned_gptq() -> Table:
    """`modelprep plan --model-shape S --gpus-per-host N --gpu h100`'s quantize@gptq-w4a16 row under this checkout's
    params.yaml with each quantize setting."""
    from pipeline.serving.plan import SHAPES, Host, plan  # this checkout's: tables.read put it first on sys.path

    rows = []
    for shape, per_host, quantize in PLANNED:
        params = read.project_params()
        for key, value in quantize.items():
            params["quantize"][key] = {**params["quantize"][key], **value}
        row = next(r for r in plan(params, SHAPES[shape], Host("h100", per_host)) if r.stage == f"quantize@{VARIANT}")
        setting = ", ".join(f"quantize.{k}.{n}: {str(v).lower()}" for k, d in quantize.items() for n, v in d.items())
        rows.append((shape, setting, row.gpus, row.gpu_memory, row.time, row.source))
    samples = read.project_params()["quantize"]["calibration"]["num_samples"]
    columns = ("model", "setting", "GPUs", "GPU memory per GPU", f"time ({samples} samples)", "scaled from")
    return Table(columns, tuple(rows))


BLOCKS = {
    "tpeval-conditions": Facts(tpeval.conditions, ("condition", "value")),
    "gptq-layers": Spec(tpeval.quant_rows, scale.LAYERS),
    "plan-gptq-layers": planned_gptq,
}
