"""docs/scale.md's measured blocks: per-layer GPTQ seconds of the Llama-3-8B shape on 1, 2 and 4 GPUs and of a
2-layer model of Llama-3-70B's widths on 1 and 4 (raw/tpeval/, raw/scale-host/), with their conditions: the same rows
and columns as benchmarks/gpu/SCALE.md's tpeval-conditions and gptq-layers blocks."""

from __future__ import annotations

from render import Facts, Spec
from tables import scale, tpeval

BLOCKS = {
    "tpeval-conditions": Facts(tpeval.conditions, ("condition", "value")),
    "gptq-layers": Spec(tpeval.quant_rows, scale.LAYERS),
}
