"""quantize.distributed: a variant quantized by N processes, one per GPU, with llm-compressor's distributed oneshot.

What llm-compressor 0.14 does once torch.distributed is initialized (its "distributed oneshot" guide; every path keys
on compressed_tensors' is_distributed()); paths below are in site-packages:
- loading: inside load_offloaded_model, rank 0 reads the weights and the other ranks build on the meta device
  (compressed_tensors/offload/load.py:55-56); from_accelerate (:90) puts them in CPU shared memory that every rank
  maps (offload/cache/dist_cpu.py), and the sequential pipeline onloads one layer at a time to cuda:<rank>
  (llmcompressor/utils/dev.py, get_main_device; CPU when there is no accelerator).
- data: each rank calibrates on the dataset it is given; only identical datasets on every rank are split by
  llm-compressor itself (datasets/utils.py:226-272), so each rank here gets its contiguous slice, as the guide's
  get_rank_partition (datasets/utils.py:399) cuts one.
- GPTQ: each layer's Hessian sums (and sample counts) are reduced onto the rank that bin-packing assigns it, that rank
  solves it and broadcasts the quantized weights (modifiers/gptq/base.py:280-306, 365-389); the sums are the
  one-process sums, in another float order (CPU ranks need a barrier after it: cpu_ranks_wait_for_quantized_weights).
  RTN observes its share of the weights and broadcasts the qparams (modifiers/quantization/quantization/base.py:
  91-112), activation observers are synced (.../mixin.py:274-296), AWQ and SmoothQuant all-reduce their statistics
  (modifiers/transform/awq/base.py:638, 797; smoothquant/base.py:300, 337). So data-free schemes distribute too
  (their weight observation is split).
- saving: every rank calls save_pretrained; compression is split across ranks (compressed_tensors
  model_compressor.py:166-170) and only rank 0 writes (transformers/compression/compressed_tensors_utils.py:158).

`python -m torch.distributed.run` (torchrun, as the guide launches its examples) starts the ranks running this module's
worker; rank 0 writes the checkpoint into the stage's temp directory, so the artifact stays all-or-nothing.
A rank that fails makes torchrun stop the others; one that hangs trips the process group's timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json, write_json
from pipeline.quantize.oneshot import calibration_settings, quantize_model
from pipeline.quantize.recipes import VariantSpec, build_recipe, is_unquantized
from pipeline.quantize.settings import Calibration, Distributed

ROOT = Path(__file__).resolve().parents[2]


def quantize(
    model_dir: Path,
    out_dir: Path,
    spec: VariantSpec,
    calibration_texts: list[str],
    cfg: Calibration,
    distributed: Distributed,
) -> dict:
    """quantize_model in this process for gpus: 1 (and the unquantized baseline, a file copy); N ranks otherwise."""
    gpus = distributed.gpus
    if gpus == 1 or is_unquantized(spec):
        return quantize_model(model_dir, out_dir, spec, calibration_texts, cfg)
    return launch(model_dir, out_dir, spec, calibration_texts, cfg, gpus, distributed.timeout_s)


def _raise_first_failure(job: Path, gpus: int, timeout_s: float) -> None:
    """The earliest rank's error as one PipelineError line, if any rank wrote one."""
    failures = sorted((read_json(p) for p in job.glob("error-*.json")), key=lambda f: f["time"])
    if failures:
        first = failures[0]
        # gloo: "Application timeout caused pair closure", "Timed out waiting ..."; NCCL's watchdog: "... timeout".
        hint = (
            (
                f"; it waited on the others past timeout_s ({timeout_s} s): one is stuck, or a step needs a larger "
                "timeout_s"
            )
            if re.search(r"time(d)? ?out", first["error"], re.IGNORECASE)
            else ""
        )
        raise PipelineError(f"{first['error']} (quantize.distributed: rank {first['rank']} of {gpus}{hint})")


def launch(
    model_dir: Path,
    out_dir: Path,
    spec: VariantSpec,
    calibration_texts: list[str],
    cfg: Calibration,
    gpus: int,
    timeout_s: float,
) -> dict:
    """torchrun with `gpus` ranks; the metrics of rank 0, or one PipelineError line: the first rank's failure."""
    check_devices(gpus, spec)
    # The refusals that need no model, here rather than once per rank.
    settings = calibration_settings(cfg, spec)
    if any(m.requires_calibration_data for m in build_recipe(spec, [])):
        rows = len(calibration_texts[: settings.num_samples])
        if rows < gpus:  # llm-compressor asserts every rank has a sample (datasets/utils.py, _is_dist_and_same_ds)
            raise PipelineError(
                f"quantize.distributed.gpus is {gpus} but variant {spec.name!r} has {rows} calibration "
                "rows: each process needs at least one"
            )
    with tempfile.TemporaryDirectory(prefix="quantize-dist-") as tmp:
        job = Path(tmp)
        write_json(
            job / "job.json",
            {
                "model_dir": str(Path(model_dir).resolve()),
                "out_dir": str(Path(out_dir).resolve()),
                "spec": dataclasses.asdict(spec),
                "texts": calibration_texts,
                "cfg": dataclasses.asdict(cfg),
                "timeout_s": timeout_s,
            },
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            "-m",
            "pipeline.quantize.distributed",
            str(job),
        ]
        returncode = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode  # output: the stage's log
        # The earliest error is the cause; later ones are ranks that lost their peer.
        _raise_first_failure(job, gpus, timeout_s)
        if returncode != 0 or not (job / "metrics.json").is_file():
            raise PipelineError(
                f"quantize.distributed: torchrun exited with {returncode} and no rank reported an "
                "error (a rank killed, e.g. out of memory?); the ranks' output is in the stage log"
            )
        return read_json(job / "metrics.json")


def check_devices(gpus: int, spec: VariantSpec) -> None:
    """One rank per accelerator. A host without one runs CPU ranks (gloo), as the tests do, for GPTQ and RTN only:
    - AWQ's all-reduce moves its statistics to the accelerator first and fails without one (llm-compressor 0.14
      modifiers/transform/awq/base.py:1043, _allreduce_data_sum: current_accelerator().type on None);
    - SmoothQuant has every rank apply the same smoothing (smoothquant/base.py:358-378, weight * scales). GPU ranks
      each scale their own onloaded copy; CPU ranks' "onloaded" weights are the one shared copy (compressed_tensors
      offload/cache/cpu.py:27, copy=False), so it is applied once per rank (measured: INT8 W8A8 KL x3)."""
    import torch  # here, not at the top: the unquantized baseline, a file copy, needs no torch

    if torch.accelerator.is_available():
        count, kind = torch.accelerator.device_count(), torch.accelerator.current_accelerator().type
        if count < gpus:
            raise PipelineError(f"quantize.distributed.gpus is {gpus} but this host has {count} {kind} devices")
        return
    gpu_only = "AWQ" if spec.algorithm == "awq" else "SmoothQuant" if spec.smoothing_strength else None
    if gpu_only:
        raise PipelineError(
            f"variant {spec.name!r}: llm-compressor's distributed {gpu_only} runs on GPU ranks only; "
            "on this host without one set quantize.distributed.gpus: 1"
        )


def init_process_group(timeout_s: float) -> None:
    """compressed-tensors' init_dist (distributed/utils.py), which the guide calls, plus a timeout, so a rank stuck
    in a collective fails instead of waiting forever; and CPU ranks, where init_dist raises AttributeError:
    it reads torch.accelerator.current_accelerator().type, and current_accelerator() is None without one."""
    import torch
    import torch.distributed as dist

    kwargs: dict = dict(backend="gloo")
    if torch.accelerator.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        kind = torch.accelerator.current_accelerator().type
        torch.accelerator.set_device_index(local_rank)
        kwargs = dict(
            backend={"cuda": "nccl", "xpu": "xccl"}.get(kind, "gloo"), device_id=torch.device(kind, local_rank)
        )
    dist.init_process_group(init_method="env://", timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    dist.barrier()


@contextlib.contextmanager
def cpu_ranks_wait_for_quantized_weights():
    """On CPU ranks llm-compressor 0.14 skips broadcasting the weights a rank has just quantized (llmcompressor/utils/
    dist.py, broadcast_qparams_and_cleanup, skip_cpu=True: the ranks share them in CPU memory) and then nothing waits
    for the owning rank to finish writing them: a faster rank runs the layer again, to feed the next one, through
    weights another rank is still quantizing. Checkpoints then differed run to run (GPTQ KL 0.00120-0.00138 on the
    tiny target). A barrier after that step (GPTQ's compress_modules, RTN's weight observation) closes the race.
    GPU ranks broadcast, which makes each rank wait for the owners; they run unpatched."""
    import torch

    if torch.accelerator.is_available():
        yield
        return
    import torch.distributed as dist
    from llmcompressor.modifiers.gptq import base as gptq
    from llmcompressor.modifiers.quantization.quantization import base as rtn

    original = gptq.broadcast_qparams_and_cleanup
    assert rtn.broadcast_qparams_and_cleanup is original

    def and_wait(*args, **kwargs) -> None:
        original(*args, **kwargs)
        dist.barrier()

    gptq.broadcast_qparams_and_cleanup = rtn.broadcast_qparams_and_cleanup = and_wait
    try:
        yield
    finally:
        gptq.broadcast_qparams_and_cleanup = rtn.broadcast_qparams_and_cleanup = original


def calibration_from_json(raw: dict) -> Calibration:
    """The launcher's Calibration as job.json carries it (JSON turned its tuples into lists)."""
    targets = raw["sequential_targets"]
    return Calibration(
        **{
            **raw,
            "ignore": tuple(raw["ignore"]),
            "sequential_targets": tuple(targets) if isinstance(targets, list) else targets,
        }
    )


def worker(job: Path) -> int:
    """One rank: quantize_model under the process group; rank 0 leaves the metrics, a failing rank its error."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    args = read_json(job / "job.json")
    try:
        init_process_group(args["timeout_s"])
        with cpu_ranks_wait_for_quantized_weights():
            metrics = quantize_model(
                Path(args["model_dir"]),
                Path(args["out_dir"]),
                VariantSpec(**args["spec"]),
                args["texts"],
                calibration_from_json(args["cfg"]),
            )
        if rank == 0:
            write_json(job / "metrics.json", metrics)
        dist.destroy_process_group()
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the launcher as one line, traceback to the log
        traceback.print_exc()
        line = (
            str(e)
            if isinstance(e, PipelineError)
            else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        )
        write_json(job / f"error-{rank}.json", {"rank": rank, "time": time.time(), "error": line})
        return 1


if __name__ == "__main__":
    sys.exit(worker(Path(sys.argv[1])))
