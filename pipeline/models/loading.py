"""Load checkpoints for evaluation: float32 on CPU, bf16 on GPU, never remote code."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model is (seconds): a stage that only tokenizes may not need it
    import torch


def eval_device() -> torch.device:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def eval_dtype(device: torch.device) -> torch.dtype:
    import torch

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
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=dtype, trust_remote_code=False, use_safetensors=True, **kwargs
        )
    if kwargs:
        undo_offload(model)
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:  # a layer compressed-tensors decompressed
            module.to(dtype)
    return model.to(device).eval()


def undo_offload(model) -> None:
    """compressed-tensors loads a checkpoint it decompresses with every module's tensors in its OffloadCache, onloaded
    to the load device (CPU); `model.to(cuda)` then leaves them on CPU (benchmarks/gpu/raw/tpeval exact-demo: the
    variant scored on CPU beside a CUDA baseline). Plain parameters again, so `.to(device)` moves all of them."""
    try:
        from compressed_tensors.offload import remove_dispatch
    except ImportError:  # a compressed-tensors without its offload framework dispatches nothing
        return
    remove_dispatch(model)


# Upper bounds on a config's shape, well above any published model's (Llama 3.1 405B: 126 layers, hidden 16384,
# intermediate 53248; Gemma 3: vocab 262144; Llama 4 Scout: 10M positions): a config beyond them is refused before
# anything is built from it (issue #47: num_hidden_layers 200000 made a meta-device model of 4.3 GB, still being
# built after 150 s).
SHAPE_LIMITS = {
    "num_hidden_layers": 1024,
    "hidden_size": 65536,
    "intermediate_size": 1 << 19,
    "moe_intermediate_size": 1 << 19,
    "vocab_size": 1 << 22,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "num_local_experts": 4096,
    "n_routed_experts": 4096,
    "num_experts": 4096,
    "max_position_embeddings": 1 << 26,
}
MAX_PARAMETERS = 10**13  # a dense estimate (layers x (4 h^2 + 3 h x intermediate) + 2 vocab x h): 10T


def check_shape(config: dict, where: str) -> None:
    """One line naming the first absurd dimension (not a positive integer, or over SHAPE_LIMITS), or a shape whose
    parameter count is beyond any model's; multimodal configs' text_config is checked too."""
    from pipeline.core.errors import PipelineError

    text = config.get("text_config")
    for part in (config, text) if isinstance(text, dict) else (config,):
        for key, limit in SHAPE_LIMITS.items():
            value = part.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipelineError(f"{where}: {key} is {value!r}, not a positive integer")
            if value > limit:
                raise PipelineError(
                    f"{where}: {key} {value} is beyond any real model's (at most {limit} accepted); "
                    "refused before a model is built from it"
                )
        layers, hidden = part.get("num_hidden_layers") or 0, part.get("hidden_size") or 0
        estimate = (
            layers * (4 * hidden**2 + 3 * hidden * (part.get("intermediate_size") or 0))
            + 2 * (part.get("vocab_size") or 0) * hidden
        )
        if estimate > MAX_PARAMETERS:
            raise PipelineError(
                f"{where}: its shape describes about {estimate:.2g} parameters, beyond any real "
                f"model's (at most {MAX_PARAMETERS:.0g} accepted)"
            )


def check_checkpoint_tensors(path: str | Path, role: str) -> None:
    """The safetensors weights hold exactly the tensors, of exactly the shapes, that the model config.json describes
    needs. transformers initialises a missing tensor at random and only logs it, so a config with more layers
    than the weights (or a decoy model.safetensors beside the real weights) would be quantized and shipped as a
    random model; checked from the file headers and a meta-device model, without reading any weights."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.core.errors import PipelineError

    path = Path(path)
    check_shape(json.loads((path / "config.json").read_bytes()), f"{role} model file {path}/config.json")
    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    # A quantized checkpoint is checked too (issue #47: skipping it let a 12-layer config over 6-layer weights load
    # with the missing layers at random): its packed weights and scales are mapped back to the parameters they hold.
    quantized = getattr(config, "quantization_config", None) is not None
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    stored: dict[str, tuple] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as f:
            for key in f.keys():
                stored[key] = tuple(f.get_slice(key).get_shape())
    if quantized:
        stored = parameters_of_compressed(stored)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = {
        k
        for k in expected
        if k not in stored and getattr(config, "tie_word_embeddings", False) and k.endswith("lm_head.weight")
    }
    missing = sorted(set(expected) - set(stored) - tied)
    unexpected = sorted(set(stored) - set(expected))
    wrong = sorted(k for k in set(expected) & set(stored) if stored[k] != ANY_SHAPE and expected[k] != stored[k])
    for what, keys in (
        ("has no tensor for", missing),
        ("holds tensors the config has no place for", unexpected),
        ("holds tensors of another shape than the config's", wrong),
    ):
        if keys:
            raise PipelineError(
                f"{role} model {path}: {', '.join(files)} {what} {len(keys)} parameter(s) "
                f"({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}); config.json and the "
                "weights describe different models"
            )


# compressed-tensors' tensor names (0.19): a packed weight stands for the module's weight; the rest are the quantized
# module's scales, zero points, shapes and indices, which belong to a module that has a weight.
PACKED = {"weight_packed": "weight"}
QUANTIZATION_TENSORS = frozenset(
    {
        "weight_scale",
        "weight_zero_point",
        "weight_shape",
        "weight_g_idx",
        "weight_global_scale",
        "input_scale",
        "input_zero_point",
        "input_global_scale",
        "output_scale",
        "output_zero_point",
        "k_scale",
        "v_scale",
        "q_scale",
    }
)
ANY_SHAPE = ()  # a packed weight's shape is the packing's, not the parameter's: not compared


def parameters_of_compressed(stored: dict[str, tuple]) -> dict[str, tuple]:
    """A compressed-tensors checkpoint's tensors as the parameters they hold: `X.weight_packed` -> `X.weight` (its
    shape not compared), `X.weight_scale` and the like dropped when `X.weight` is there, kept (and so reported as
    unexpected) when no weight of X is."""
    params: dict[str, tuple] = {}
    for key, shape in stored.items():
        module, _, leaf = key.rpartition(".")
        if leaf in PACKED:
            params[f"{module}.{PACKED[leaf]}"] = ANY_SHAPE
        elif leaf not in QUANTIZATION_TENSORS:
            params.setdefault(key, shape)
    weights = {k.rpartition(".")[0] for k in params if k.endswith(".weight")}
    extra = {
        k: v
        for k, v in stored.items()
        if k.rpartition(".")[2] in QUANTIZATION_TENSORS and k.rpartition(".")[0] not in weights
    }
    return {**params, **extra}


# The classes AutoTokenizer resolves to tokenizers' generic backend (PreTrainedTokenizerFast is its alias in
# transformers 5). For them the backend is loaded directly: AutoTokenizer's module imports the model registry and
# generation code (5.1 s against 2.4 s on the 2-core CPU), a cost every tokenizer-only stage paid.
GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def tokenizer_class(path: str | Path) -> str | None:
    """The tokenizer_class a checkpoint's tokenizer_config.json names (None: none named, or no readable file)."""
    import json

    try:
        named = json.loads((Path(path) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return named if isinstance(named, str) else None


def load_tokenizer(path: str | Path):
    if tokenizer_class(path) in GENERIC_TOKENIZER_CLASSES and (Path(path) / "tokenizer.json").is_file():
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path, trust_remote_code=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
