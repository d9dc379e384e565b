"""Load checkpoints for evaluation: float32 on CPU, bf16 on GPU, never remote code."""
from __future__ import annotations

import warnings
from pathlib import Path

import torch


def eval_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def eval_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def is_compressed_tensors(config) -> bool:
    """Whether the checkpoint's config (config.json's quantization_config) is one llm-compressor saved."""
    qc = getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method)) == "compressed-tensors"


def load_causal_lm(path: str | Path, device: torch.device | None = None):
    """A model ready for inference; compressed-tensors checkpoints are decompressed on load, into the
    evaluation dtype.

    compressed-tensors 0.19 dequantizes most formats into their scale's dtype, which transformers has
    already cast to the load dtype, but its NVFP4 decompressor does not: NVFP4PackedCompressor.decompress
    unpacks the FP4 values with unpack_fp4_from_uint8's default dtype (bfloat16) and dequantizes into
    that dtype (the group scales are FP8 and the global scale float32, so neither carries the load
    dtype). Loaded in float32 on CPU, an NVFP4 model would then hold bfloat16 weights beside float32
    activations and fail in F.linear ("expected m1 and m2 to have the same dtype"). So the weights are
    decompressed at load time (transformers' `dequantize=True`, instead of lazily on the first forward)
    and every decompressed layer is cast to the evaluation dtype. bfloat16 -> float32 is exact: the
    weights keep the bfloat16 rounding vLLM's FP4 Marlin kernel also dequantizes to.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, CompressedTensorsConfig

    device = device or eval_device()
    dtype = eval_dtype(device)
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)  # read once, passed on to from_pretrained
    kwargs = {}
    if is_compressed_tensors(config):
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    with warnings.catch_warnings():
        # Passing loading attributes for a quantized checkpoint always warns that its own config is used.
        warnings.filterwarnings("ignore", message="You passed `quantization_config`")
        # safetensors only: a pickled .bin beside the weights is never unpickled.
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=False,
                                                     use_safetensors=True, **kwargs)
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:  # a layer compressed-tensors decompressed
            module.to(dtype)
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
