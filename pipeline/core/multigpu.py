"""NVLink multicast stays off wherever a vLLM engine spans several GPUs: on the shared hosts the project runs on, a
program that uses it can put every GPU of the host out of service. NCCL's NVLS algorithms, vLLM's symmetric-memory
all-reduce (which can use multicast), PyTorch's symmetric memory multicast and NVSHMEM's NVLS: the four settings the
4x H100 run of benchmarks/gpu/scale_serve.py served TP 2 and 4 with."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def multicast_off(tensor_parallel_size: int, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the four in environ (this process's by default, before an in-process engine starts its workers, which
    inherit it) when the engine spans several GPUs; returns what it set."""
    if tensor_parallel_size <= 1:
        return {}
    (os.environ if environ is None else environ).update(MULTICAST_OFF)
    return dict(MULTICAST_OFF)
