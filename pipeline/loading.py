"""Load checkpoints for evaluation: float32 on CPU, bf16 on GPU, never remote code."""
from __future__ import annotations

from pathlib import Path

import torch


def eval_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_causal_lm(path: str | Path, device: torch.device | None = None):
    """A model ready for inference; compressed-tensors checkpoints are decompressed on load."""
    from transformers import AutoModelForCausalLM

    device = device or eval_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # safetensors only: a pickled .bin beside the weights is never unpickled.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False, use_safetensors=True)
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
