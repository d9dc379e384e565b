"""Which GPUs can serve a variant in vLLM: compute capability needed, and the kernel family it runs on.

From vLLM's quantization support matrix (docs: "Supported Hardware for Quantization Kernels"): BF16 needs
Ampere (8.0); W4A16/W8A16 integer weights run on Marlin from 8.0 (Machete on Hopper); INT8 W8A8 on CUTLASS
from Turing (7.5); FP8 W8A8 natively from Ada/Hopper (8.9), and on 8.0-8.6 through the weight-only FP8 Marlin
path; NVFP4 activations need Blackwell (10.0). NVFP4 weights with 16-bit activations (NVFP4A16) are read from
vLLM 0.26.0's own source instead (see requirements; unchanged from 0.25.0). `serving.gpu` names the fleet's GPU;
a variant that can't run there is refused when params.yaml is loaded, before any stage does work.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from pipeline.core.errors import PipelineError
from pipeline.quantize.recipes import VariantSpec, is_unquantized, scheme_of

# Compute capability of the GPUs `serving.gpu` may name.
GPUS = {
    "t4": 7.5,
    "a10g": 8.6,
    "a100": 8.0,
    "a6000": 8.6,
    "l4": 8.9,
    "l40s": 8.9,
    "h100": 9.0,
    "h200": 9.0,
    "b200": 10.0,
}
# Memory per GPU in GB (10^9 bytes) as the vendors' datasheets state it: H100 SXM 80 GB, H200 141 GB, A100 the 80 GB
# model (a 40 GB A100 exists: name it by pinning serving.tensor_parallel_size), L40S 48, L4 24, A10G 24, T4 16,
# RTX A6000 48, B200 180 (of its 192 GB, what NVIDIA lists as usable). Read as 10^9 bytes these are a little below what
# the device reports (an H100 80GB HBM3 reports 81559 MiB, 85.5e9 bytes, benchmarks/gpu/raw/*/run.json), so a memory
# plan built on them errs towards one more GPU, never one too few.
GPU_MEMORY_GB = {
    "t4": 16,
    "a10g": 24,
    "a100": 80,
    "a6000": 48,
    "l4": 24,
    "l40s": 48,
    "h100": 80,
    "h200": 141,
    "b200": 180,
}
SUPPORT_MATRIX = "vLLM's quantization support matrix (docs)"
VLLM_SOURCE = "vLLM 0.26.0's source (its compressed-tensors scheme and NVFP4 kernel selection)"


@dataclass(frozen=True)
class Hardware:
    min_compute_capability: float  # below this vLLM can't serve the checkpoint
    native_compute_capability: float  # from here its GEMMs run natively (not through a weight-only fallback)
    kernels: str
    source: str = SUPPORT_MATRIX  # where the statement comes from (none of it is a GPU measurement)

    def runs_on(self) -> list[str]:
        return [g for g, cc in GPUS.items() if cc >= self.min_compute_capability]

    def as_record(self) -> dict:
        return {**asdict(self), "runs_on": self.runs_on()}


def requirements(spec: VariantSpec) -> Hardware:
    if is_unquantized(spec):
        return Hardware(8.0, 8.0, "BF16 GEMMs (bfloat16 needs compute capability 8.0)")
    scheme = scheme_of(spec)
    w, a = scheme.weights, scheme.input_activations
    if w.type == "float" and w.num_bits == 4:
        if a is not None:
            return Hardware(10.0, 10.0, "NVFP4 W4A4 (Blackwell FP4 tensor cores)")
        # vLLM 0.26.0 (as 0.25.0), vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py
        # (_get_scheme_from_parts): NVFP4 weights without input quantization -> CompressedTensorsW4A4Fp4(use_a16=True),
        # whose get_min_capability() is 75 (schemes/compressed_tensors_w4a4_nvfp4.py). Its kernel comes from
        # init_nvfp4_linear_kernel (vllm/model_executor/kernels/linear/__init__.py), which under the default
        # linear_backend "auto" forces MarlinNvFp4LinearKernel for use_a16 on every GPU, before any capability-based
        # choice: Hopper (9.0) and Blackwell (10.0) run FP4 Marlin too, never FP4 tensor cores. Marlin FP4 needs
        # capability 7.5 (layers/quantization/utils/marlin_utils_fp4.py, is_fp4_marlin_supported). On 7.5, which
        # has no BF16, vLLM's auto dtype runs a BF16 checkpoint in FP16 (config/model.py, _resolve_auto_dtype).
        return Hardware(
            7.5,
            7.5,
            "NVFP4 weight-only: vLLM's FP4 Marlin kernel (W4A16) on every GPU from 7.5, Hopper "
            "(9.0) and Blackwell included, never FP4 tensor cores; FP16 activations on 7.5",
            source=VLLM_SOURCE,
        )
    if w.type == "float" and w.strategy == "block":
        return Hardware(
            8.0,
            8.9,
            "FP8 block-wise W8A8 from 8.9 (on Hopper vLLM defaults to DeepGEMM, which decoded "
            "slower than BF16 at batch 32 on an H100; the bundle's serve.env selects CUTLASS's "
            "block-scaled kernel instead, see kernel_env); weight-only FP8 Marlin on 8.0-8.6",
            source=f"{SUPPORT_MATRIX}; the DeepGEMM note from this project's H100 benchmark "
            "(benchmarks/gpu/history/vllm-0.25.md)",
        )
    if w.type == "float":
        return Hardware(8.0, 8.9, "FP8 W8A8 (CUTLASS) from 8.9; weight-only FP8 Marlin on 8.0-8.6")
    if a is None:
        return Hardware(8.0, 8.0, f"INT{w.num_bits} weight-only: Marlin from 8.0 (Machete on 9.0)")
    return Hardware(7.5, 7.5, f"INT{w.num_bits} W{w.num_bits}A{a.num_bits} (CUTLASS) from 7.5")


def check_runs_on(spec: VariantSpec, gpu: str | None) -> None:
    """One line when serving.gpu can't serve the variant; nothing when gpu is None (no fleet named)."""
    if gpu is None:
        return
    if gpu not in GPUS:
        raise PipelineError(f"serving.gpu must be one of {sorted(GPUS)} or null, got {gpu!r}")
    need = requirements(spec)
    if GPUS[gpu] < need.min_compute_capability:
        raise PipelineError(
            f"variant {spec.name} can't be served on serving.gpu {gpu} (compute capability "
            f"{GPUS[gpu]}): it needs {need.min_compute_capability}+ ({need.kernels}); remove it from "
            "quantize.enabled or pick another scheme"
        )


# vLLM (0.25 and 0.26) picks DeepGemmFp8BlockScaledMMKernel for FP8 block-wise weights on Hopper; at Llama-3-8B
# shape on an H100 (vLLM 0.25.0) it decoded batch 32 at x0.08 BF16 and CutlassFp8BlockScaledMMKernel, with DeepGEMM
# disabled, at x1.17 (benchmarks/gpu/history/vllm-0.25.md, raw/schemes8b). Unmeasured elsewhere (Blackwell), so only
# for Hopper or no named GPU.
DEEPGEMM_OFF = {"VLLM_DISABLED_KERNELS": "DeepGemmFp8BlockScaledMMKernel"}


# On Hopper vLLM 0.26 picks MacheteLinearKernel first for integer weight-only (W4A16/W8A16) checkpoints, then
# AllSpark (Ampere only), then Marlin (model_executor/kernels/linear/__init__.py, _POSSIBLE_KERNELS); disabling the
# two before Marlin selects Marlin. Which is faster depends on the shape and the batch: serve_bench measures both.
MACHETE_OFF = {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel,AllSparkLinearKernel"}
KERNEL_SWITCH = "VLLM_DISABLED_KERNELS"  # the variable every choice sets; a user's own setting of it wins


@dataclass(frozen=True)
class KernelChoice:
    name: str
    env: dict[str, str]  # what selects it (empty: vLLM's own pick)


def kernel_choices(spec: VariantSpec, compute_capability: float | None) -> list[KernelChoice]:
    """The GEMM kernels vLLM 0.26 can serve this variant with on a GPU of this compute capability, the one shipped
    without a measurement first (kernel_env). Fewer than two: nothing to choose. None: no GPU named (the
    unmeasured default assumes Hopper, the fleet the project's measurements come from)."""
    if is_unquantized(spec) or (compute_capability is not None and compute_capability != 9.0):
        return []
    scheme = scheme_of(spec)
    w, a = scheme.weights, scheme.input_activations
    if w is not None and w.type == "float" and w.strategy == "block":
        return [KernelChoice("cutlass", dict(DEEPGEMM_OFF)), KernelChoice("deepgemm", {})]
    if w is not None and w.type == "int" and a is None:
        return [KernelChoice("machete", {}), KernelChoice("marlin", dict(MACHETE_OFF))]
    return []


def kernel_env(spec: VariantSpec, gpu: str | None) -> dict[str, str]:
    """The environment shipped for this variant's GEMM kernel when serve_bench measured no choice: the first of
    kernel_choices (FP8 block-wise: CUTLASS, DeepGEMM measured slower; integer weight-only: vLLM's Machete)."""
    choices = kernel_choices(spec, GPUS.get(gpu) if gpu is not None else None)
    return dict(choices[0].env) if choices else {}


@contextmanager
def scoped_env(env: dict[str, str]):
    """os.environ with env over it for the block, then restored: the evaluate stage's in-process vLLM
    engines (spawned, so they inherit it) run on the kernels the bundle is served with."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
