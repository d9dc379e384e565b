"""Is batched greedy generation (pipeline/evaluate/generation.py) repeatable on a GPU in bf16?

The evaluate stage's greedy-match check compared the baseline's greedy tokens with the variant's, both generated
in one batch of the same prompts (until 7b0df47); on the H100 BF16 matched itself at 0.9375 with identical weights
and identical logits over the held-out text (benchmarks/gpu/raw/smollm2-gpu-5). This runs the same generation on a
model of SmolLM2-135M's shape (random weights: a weak test, as random tied embeddings give argmaxes with wide
margins, not near-ties), as two identical copies and the same copy twice, under torch's default kernels and under
MODE=deterministic (torch.use_deterministic_algorithms with CUBLAS_WORKSPACE_CONFIG) and MODE=eager-attention.
Prints one RESULT line of JSON per mode.
"""

from __future__ import annotations

import copy
import json
import os
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "default"
if MODE == "deterministic":
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # before CUDA starts

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from benchmarks.gpu.measure_costs import SHAPES  # noqa: E402  (SmolLM2-135M's shape, as the cost profiles use it)
from pipeline.evaluate.generation import greedy_continuations  # noqa: E402

if MODE == "deterministic":
    torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
config = LlamaConfig(
    **SHAPES["smollm2-135m"]["target"],
    max_position_embeddings=2048,
    attn_implementation="eager" if MODE == "eager-attention" else "sdpa",
)
a = LlamaForCausalLM(config).to(torch.bfloat16).cuda().eval()
b = copy.deepcopy(a)
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(0, 49152, (int(n),), generator=g).tolist() for n in torch.randint(20, 160, (16,), generator=g)]
runs = {
    "a1": greedy_continuations(a, prompts, 64),
    "b": greedy_continuations(b, prompts, 64),
    "a2": greedy_continuations(a, prompts, 64),
}


def same(x, y):
    return sum(tx == ty for (tx, _), (ty, _) in zip(runs[x], runs[y])) / len(prompts)


print(
    "RESULT "
    + json.dumps(
        {
            "mode": MODE,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
            "copy_vs_copy": same("a1", "b"),
            "same_model_twice": same("a1", "a2"),
            "prompts": len(prompts),
            "tokens": 64,
        }
    )
)
