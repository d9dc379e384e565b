"""docs/scale.md's measured block: per-layer GPTQ seconds of the Llama-3-8B shape on 1 and 2 GPUs (raw/tpeval/),
the same rows and columns as benchmarks/gpu/SCALE.md's gptq-layers block."""

from __future__ import annotations

from render import Spec
from tables import scale, tpeval

BLOCKS = {"gptq-layers": Spec(tpeval.quant_rows, scale.LAYERS)}
