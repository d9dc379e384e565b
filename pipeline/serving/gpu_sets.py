"""serve_bench over the host's GPUs: the independent configurations of a variant (plain decoding on each kernel, each
speculative method, each tier's configs) served at the same time, each `vllm serve` on its own disjoint set of GPUs
at its tensor-parallel size (serve_bench.parallel: auto), or one after another (off).

pack() is the plan, a pure function of the configs' TP sizes and the host's GPU ids: waves of configs whose GPU sets
are disjoint, each set an aligned block of consecutive visible GPUs (positions 0-1, 2-3 for TP 2; 0-3 for TP 4), which
on hosts with NVLink pairs or quads are the linked ones. run_waves() runs each wave's configs on threads (each config
has its own server, port, `vllm bench serve` worker process, /metrics sampler and logs) and waits for the whole wave
before the next, so a config that depends on another's result (the kernel every method runs on, the k schedule the
sweep suggests) is simply placed in a later call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from pipeline.core.errors import PipelineError
from pipeline.core.multigpu import MULTICAST_OFF
from pipeline.serving.vllm_server import allow_starts, stop_all, stop_on_termination

PARALLEL = ("auto", "off")  # serve_bench.parallel
VISIBLE = "CUDA_VISIBLE_DEVICES"
# vLLM picks its distributed-init and internal ports with bind(0) unless VLLM_PORT is set; then it counts up from it,
# and two servers started together could both take the same one. Each concurrent server gets its own range.
VLLM_PORT, PORT_SPAN = "VLLM_PORT", 100

T = TypeVar("T")


@dataclass(frozen=True)
class ConfigRun:
    """One configuration to serve: its label (raw files, logs) and the GPUs one replica needs."""

    label: str
    tensor_parallel_size: int


@dataclass(frozen=True)
class Placement:
    """Where a config runs: the GPU ids its server sees (CUDA_VISIBLE_DEVICES), the other configs of its wave (empty:
    it ran alone) and its slot in the wave (port offsets)."""

    label: str
    gpus: tuple[str, ...]
    beside: tuple[str, ...] = ()
    slot: int = 0


def visible_gpus(environ: Mapping[str, str] | None = None, count: Callable[[], int] | None = None) -> list[str]:
    """The host's GPU ids as this process sees them: CUDA_VISIBLE_DEVICES's entries (indices, UUIDs or MIG ids,
    passed on as written), or 0..n-1 for the n devices torch counts where it is unset."""
    environ = os.environ if environ is None else environ
    raw = environ.get(VISIBLE)
    if raw is not None:
        return [part.strip() for part in raw.split(",") if part.strip()]
    if count is None:
        import torch

        count = torch.cuda.device_count
    return [str(i) for i in range(count())]


def pack(runs: Sequence[ConfigRun], gpus: Sequence[str], parallel: bool = True) -> list[list[Placement]]:
    """Waves of placements: within a wave the GPU sets are disjoint; every run appears once. parallel False: one
    run per wave, on the first GPUs (as a lone `vllm serve` takes them). Larger TP sizes are placed first (first fit
    decreasing over aligned blocks, which for sizes 1, 2, 4, 8 uses as few waves as the GPUs allow); a wave lists its
    runs in the order given."""
    for run in runs:
        if run.tensor_parallel_size < 1:
            raise PipelineError(
                f"serve_bench {run.label}: tensor_parallel_size must be at least 1, got {run.tensor_parallel_size}"
            )
        if run.tensor_parallel_size > len(gpus):
            raise PipelineError(
                f"serve_bench {run.label}: tensor_parallel_size {run.tensor_parallel_size} needs more "
                f"GPUs than the {len(gpus)} here ({VISIBLE}={','.join(gpus) or 'none'})"
            )
    if not parallel:
        return [[Placement(r.label, tuple(gpus[: r.tensor_parallel_size]))] for r in runs]
    waves: list[dict[int, ConfigRun]] = []  # first position of its block -> run
    for run in sorted(runs, key=lambda r: -r.tensor_parallel_size):
        for wave in waves:
            start = _free_block(wave, run.tensor_parallel_size, len(gpus))
            if start is not None:
                wave[start] = run
                break
        else:
            waves.append({0: run})
    order = {r.label: i for i, r in enumerate(runs)}
    out = []
    for wave in waves:
        placed = sorted(wave.items(), key=lambda item: order[item[1].label])
        labels = [r.label for _, r in placed]
        out.append(
            [
                Placement(
                    r.label,
                    tuple(gpus[start : start + r.tensor_parallel_size]),
                    tuple(x for x in labels if x != r.label),
                    slot,
                )
                for slot, (start, r) in enumerate(placed)
            ]
        )
    return out


def _free_block(wave: dict[int, ConfigRun], size: int, n: int) -> int | None:
    """The first aligned block of `size` positions no run of the wave holds, or None."""
    taken = {start + i for start, r in wave.items() for i in range(r.tensor_parallel_size)}
    return next((s for s in range(0, n - size + 1, size) if taken.isdisjoint(range(s, s + size))), None)


def port_offset(placement: Placement) -> int:
    """How far past serve_bench.port a config's server first tries to listen: its first GPU's index where the ids are
    indices, else its slot in the wave. Two serve_bench stages on disjoint GPUs of one host (stage groups) then try
    different ports; by slot both tried 8000, and the loser's stop and second start cost ~2.5 min of a 4x H100 lease."""
    first = placement.gpus[0] if placement.gpus else ""
    return int(first) if first.isdigit() else placement.slot


def server_env(placement: Placement, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a config's `vllm serve` gets on top of its own environment: its GPU set, multicast off where it runs
    over several GPUs, and its own VLLM_PORT range where the host sets one."""
    environ = os.environ if environ is None else environ
    env = {VISIBLE: ",".join(placement.gpus)}
    if len(placement.gpus) > 1:
        env |= MULTICAST_OFF  # only where a server spans several GPUs
    if environ.get(VLLM_PORT, "").isdigit() and placement.slot:
        env[VLLM_PORT] = str(int(environ[VLLM_PORT]) + PORT_SPAN * placement.slot)
    return env


def run_waves(
    waves: Sequence[Sequence[Placement]], run_one: Callable[[Placement], T], on_interrupt: Callable[[], None] = stop_all
) -> dict[str, T]:
    """run_one(placement) for every placement, a wave's at the same time (threads; a wave of one runs on this
    thread), each wave after the last has finished. The first exception of a wave (in its order) is raised once
    the whole wave has ended, so no server outlives the call. on_interrupt: called when this thread is interrupted
    (a SIGTERM from `dvc repro`'s cancel, Ctrl-C) while a wave runs on threads: it must stop their servers, which
    signal handlers (main thread only) cannot reach; by default every server vllm_server started."""
    results: dict[str, T] = {}
    allow_starts()
    for wave in waves:
        if len(wave) == 1:
            results[wave[0].label] = run_one(wave[0])
            continue
        with stop_on_termination(), ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix="serve_bench") as pool:
            futures = [(p.label, pool.submit(run_one, p)) for p in wave]
            try:
                for _, future in futures:
                    future.exception()  # waits, interruptibly
            except BaseException:
                on_interrupt()
                raise
        errors = [f.exception() for _, f in futures if f.exception() is not None]
        if errors:
            raise errors[0]
        results |= {label: f.result() for label, f in futures}
    return results


class Counter:
    """A progress bar's update() from several threads (tqdm's own counter is not locked)."""

    def __init__(self, bar):
        self.bar, self._lock = bar, threading.Lock()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
