"""compressed-tensors' preset schemes (compressed_tensors.quantization.quant_scheme.PRESET_SCHEMES, 0.19.0) as this
project reads them: each preset's weights and input activations, by number type, bits and strategy.

What a stage needs to know of a variant's scheme (is the name a preset, which GPUs serve it, which GEMM kernels vLLM
offers it) without importing compressed-tensors, which loads torch and transformers: seconds of every bundle@<variant>
stage, which otherwise imports nothing heavy. tests/quantize/test_hardware.py checks this table against the installed
compressed-tensors (the same names; each preset, with a group size and channel-wise, as recipes.scheme_for builds it).
"""

from __future__ import annotations

from dataclasses import dataclass

INT, FLOAT = "int", "float"


@dataclass(frozen=True)
class Quant:
    """A compressed-tensors QuantizationArgs, as far as this project reads it."""

    type: str  # int | float
    num_bits: int
    strategy: str  # tensor | channel | group | block | token | tensor_group


@dataclass(frozen=True)
class Scheme:
    """A compressed-tensors QuantizationScheme, as far as this project reads it (None: left unquantized)."""

    weights: Quant | None
    input_activations: Quant | None


PRESETS: dict[str, Scheme] = {
    "UNQUANTIZED": Scheme(None, None),
    "W4A16_ASYM": Scheme(Quant(INT, 4, "group"), None),
    "W8A8": Scheme(Quant(INT, 8, "channel"), Quant(INT, 8, "token")),
    "INT8": Scheme(Quant(INT, 8, "channel"), Quant(INT, 8, "token")),
    "W4AFP8": Scheme(Quant(INT, 4, "group"), Quant(FLOAT, 8, "token")),
    "FP8": Scheme(Quant(FLOAT, 8, "tensor"), Quant(FLOAT, 8, "tensor")),
    "FP8_DYNAMIC": Scheme(Quant(FLOAT, 8, "channel"), Quant(FLOAT, 8, "token")),
    "FP8_BLOCK": Scheme(Quant(FLOAT, 8, "block"), Quant(FLOAT, 8, "group")),
    "NVFP4A16": Scheme(Quant(FLOAT, 4, "tensor_group"), None),
    "NVFP4": Scheme(Quant(FLOAT, 4, "tensor_group"), Quant(FLOAT, 4, "tensor_group")),
    "MXFP4A16": Scheme(Quant(FLOAT, 4, "group"), None),
    "MXFP4": Scheme(Quant(FLOAT, 4, "group"), Quant(FLOAT, 4, "group")),
    "MXFP8A16": Scheme(Quant(FLOAT, 8, "group"), None),
    "MXFP8": Scheme(Quant(FLOAT, 8, "group"), Quant(FLOAT, 8, "group")),
    # W<w>A<a>: integer weights in groups, integer activations per token (A16: activations left in 16 bits)
    **{
        f"W{w}A{a}": Scheme(Quant(INT, w, "group"), Quant(INT, a, "token") if a < 16 else None)
        for w, activations in (
            (2, (4, 8, 16)),
            (3, (4, 8, 16)),
            (4, (4, 8, 16)),
            (5, (8, 16)),
            (6, (8, 16)),
            (7, (8, 16)),
            (8, (16,)),
        )
        for a in activations
    },
}
