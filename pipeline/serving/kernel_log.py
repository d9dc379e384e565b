"""The GEMM kernels vLLM chose, read from a server's log, and which of a checkpoint's schemes each one serves.

vLLM 0.26 names a kernel when a layer's scheme first picks it, once per kernel and scheme class in a process:
  `[compressed_tensors_wNa16.py:137] Using MacheteLinearKernel for CompressedTensorsWNA16` (integer weight-only:
  W4A16, W8A16) and `[__init__.py:635] Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8` (FP8),
(benchmarks/gpu/raw/smollm2-gpu-4/logs/, raw/gpu-tp1/logs/). A layer left unquantized (a mixed layout's UNQUANTIZED
rung, in the checkpoint's `ignore`) gets vLLM's unquantized linear method and no such line. Both of a mixed
checkpoint's integer schemes are CompressedTensorsWNA16 to vLLM: the log gives the kernels of that class, not which
bit width took which, so the card lists the class's kernels beside each scheme of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.quantize.presets import PRESETS
from pipeline.quantize.settings import UNQUANTIZED

KERNEL_LINE = re.compile(r"(?:Selected|Using) (?P<kernel>\w+Kernel)\b(?: for (?P<scheme>\w+))?")
WNA16 = "CompressedTensorsWNA16"  # vLLM's scheme class for integer weights with 16-bit activations


@dataclass(frozen=True)
class LoggedKernel:
    """One kernel vLLM's log says it chose, and the vLLM scheme class it chose it for (None: the line named none)."""

    kernel: str
    vllm_scheme: str | None


@dataclass(frozen=True)
class SchemeKernels:
    """One scheme of a per-layer layout: its decoder layers, the vLLM scheme class serving it (None: left
    unquantized) and the kernels the served log named for that class (None: not served)."""

    scheme: str
    layers: tuple[int, ...]
    vllm_scheme: str | None
    kernels: tuple[str, ...] | None

    def served(self) -> str | None:
        """How the card says it was served, or None where nothing was served."""
        if self.kernels is None:
            return None
        if self.vllm_scheme is None:
            return "unquantized, no quantized kernel" if self.scheme == UNQUANTIZED else "vLLM scheme class not known"
        if not self.kernels:
            return f"{self.vllm_scheme}, no kernel named in vLLM's log"
        return f"{self.vllm_scheme} on {', '.join(self.kernels)}"


def read_log(path: Path) -> str:
    """A server log's text ('' when it is missing: a server that never started names no kernel)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def logged_kernels(text: str) -> list[LoggedKernel]:
    """Every distinct (kernel, scheme class) a log names, in the order it names them."""
    return list(dict.fromkeys(LoggedKernel(m["kernel"], m["scheme"]) for m in KERNEL_LINE.finditer(text)))


def kernels_in_log(path: Path) -> list[str]:
    """The GEMM kernels vLLM says it selected ("Using MacheteLinearKernel for ..."), in order, once each."""
    return list(dict.fromkeys(k.kernel for k in logged_kernels(read_log(path))))


def kernel_schemes_in_log(path: Path) -> dict[str, list[str]]:
    """vLLM scheme class -> the kernels the log names for it, in order (the record's `kernel_schemes`)."""
    out: dict[str, list[str]] = {}
    for k in logged_kernels(read_log(path)):
        if k.vllm_scheme is not None:
            out.setdefault(k.vllm_scheme, []).append(k.kernel)
    return out


def vllm_scheme_of(scheme: str) -> str | None:
    """The vLLM scheme class serving a compressed-tensors preset of a mixed layout (whose rungs are integer
    weight-only or UNQUANTIZED: recipes.parse_mixed); None for UNQUANTIZED and anything else."""
    preset = PRESETS.get(scheme)
    w = preset.weights if preset else None
    if w is not None and w.type == "int" and w.strategy in ("group", "channel") and preset.input_activations is None:
        return WNA16
    return None


def layout_kernels(
    layout: Mapping[str, list[int]], kernel_schemes: Mapping[str, list[str]] | None
) -> list[SchemeKernels]:
    """Each scheme of a layout with layers at it, with the kernels a served log named for its vLLM class
    (kernel_schemes: the plain config's record; None where the variant was not served)."""
    rows = []
    for scheme, layers in layout.items():
        if not layers:
            continue
        cls = vllm_scheme_of(scheme)
        kernels = None if kernel_schemes is None else tuple(kernel_schemes.get(cls, ())) if cls else ()
        rows.append(SchemeKernels(scheme, tuple(layers), cls, kernels))
    return rows
