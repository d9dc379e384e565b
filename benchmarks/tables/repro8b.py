"""raw/repro8b/ (benchmarks/gpu/session.sh repro8b on 4 H100s): the whole `dvc repro` at Llama-3-8B's shape. Each
stage's end is the modification time of the last output it wrote, read from listing.txt (`tar tvzf --full-time` of
the packed results): run.log's own stamps came from a pipe that buffered its lines (benchmarks/gpu/steps.sh now
line-buffers it). A stage's GPU memory peak is read from out/mem-repro.csv (nvidia-smi every 0.5 s) between the
previous stage's end and its own. Rows for SCALE.md's repro8b blocks; served numbers from each variant's
serve_bench record and the gate's metrics."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from tables import read

RUN = read.RAW / "repro8b"
# Each stage by the output it writes last (dvc.yaml's outs and metrics), in the order the run wrote them; stages
# with no output of their own in the pack share the next one's row.
STAGE_OUTPUT = (
    ("sources", "artifacts/sources.json"),
    ("models", "metrics/models.json"),
    ("data", "metrics/data.json"),
    ("mixed@*, quantize@bf16", "metrics/quantize-bf16.json"),
    ("quantize@gptq-w4a16 (4 GPUs)", "metrics/quantize-gptq-w4a16.json"),
    ("distill, draft_finetune", "metrics/draft_training.json"),
    ("eagle3", "metrics/eagle3.json"),
    ("draft_quantize, evaluate_draft", "metrics/draft.json"),
    ("evaluate@bf16", "metrics/eval-bf16.json"),
    ("evaluate@gptq-w4a16", "metrics/eval-gptq-w4a16.json"),
    ("serve_bench@bf16", "metrics/serve-bf16.json"),
    ("serve_bench@gptq-w4a16", "metrics/serve-gptq-w4a16.json"),
    ("gate", "metrics/gates.json"),
)
START = "./run.json"  # written as the repro started (session.sh repro8b, after make8b and the profile)
VARIANTS = ("bf16", "gptq-w4a16")


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def listing() -> dict[str, float]:
    """Path -> modification time (the listing's clock is the GPU host's UTC)."""
    out = {}
    for line in (RUN / "listing.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6:
            out[parts[5]] = stamp(f"{parts[3]}T{parts[4]}")
    return out


def memory() -> list[tuple[float, int, int]]:
    """(time, GPU index, MiB used) samples."""
    rows = []
    for line in (RUN / "out/mem-repro.csv").read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            rows.append((stamp(parts[0].replace("/", "-").replace(" ", "T")), int(parts[1]), int(parts[2])))
    return rows


def stage_rows() -> list[dict]:
    times, samples = listing(), memory()
    start = prev = times[START]
    rows = []
    for name, path in STAGE_OUTPUT:
        end = times[path]
        peaks = {}
        for t, gpu, mib in samples:
            if prev <= t <= end:
                peaks[gpu] = max(peaks.get(gpu, 0), mib)
        rows.append(
            {
                "stage": name,
                "ended": datetime.fromtimestamp(end, timezone.utc).strftime("%H:%M:%S"),
                "seconds": end - prev,
                "since_start": (end - start) / 60,
                "peak": " / ".join(f"{peaks.get(g, 0) / 1024:.1f}" for g in range(4)),
            }
        )
        prev = end
    return rows


def serve_record(variant: str) -> dict:
    return json.loads((RUN / "artifacts/serve" / variant / "record.json").read_text())


def gate_variant(variant: str) -> dict:
    gates = json.loads((RUN / "metrics/gates.json").read_text())
    return next(v for v in gates["variants"] if v["variant"] == variant)


def served_rows() -> list[dict]:
    rows = []
    for variant in VARIANTS:
        rec = serve_record(variant)
        for name, cfg in rec["configs"].items():
            levels, cap = cfg["levels"], cfg.get("capacity") or {}
            kernel = (rec.get("kernel") if name == "plain" else None) or ""
            rows.append(
                {
                    "variant": variant,
                    "config": name + (f" ({kernel})" if kernel else ""),
                    "gpu": ", ".join(cfg["gpus"]),
                    "beside": ", ".join(cfg["beside"]) or "alone",
                    "startup": cfg["startup_s"],
                    "c1": levels.get("c1", {}).get("output_throughput"),
                    "c16": levels.get("c16", {}).get("output_throughput"),
                    "users": cap.get("users"),
                    "at_bound": cap.get("status") == "at_bound",
                }
            )
    return rows


LEVELS = ("c1", "c16", "capacity-c32", "capacity-c64")  # the sweep's and the capacity search's levels


def plain_results(tar, variant: str, kernel: str) -> dict[int, dict]:
    """Concurrency -> the raw `vllm bench serve` result of plain decoding (on `kernel`, "" for the only one)."""
    out = {}
    for level in LEVELS:
        try:
            data = json.load(
                tar.extractfile(f"artifacts/serve/{variant}/raw/plain{kernel and '-' + kernel}-{level}.json")
            )
        except KeyError:  # a level the search did not reach
            continue
        out[data["max_concurrency"]] = data
    return out


def kernel_rows() -> list[dict]:
    """The W4A16 kernels served plain against BF16 plain, from the raw results packed in serve-raw.tgz."""
    import tarfile

    with tarfile.open(RUN / "serve-raw.tgz") as tar:
        base = plain_results(tar, "bf16", "")
        kernels = {k: plain_results(tar, "gptq-w4a16", k) for k in ("machete", "marlin")}
    return [
        {
            "kernel": kernel,
            "concurrency": c,
            "tok_s": data["output_throughput"],
            "ttft": data["p99_ttft_ms"],
            "itl": data["p99_itl_ms"],
            "bf16": base[c]["output_throughput"] if c in base else None,
            "bf16_ttft": base[c]["p99_ttft_ms"] if c in base else None,
        }
        for kernel, results in kernels.items()
        for c, data in results.items()
    ]


def gate_rows() -> list[dict]:
    rows = []
    for variant in VARIANTS:
        g = gate_variant(variant)
        cap = g["capacity"]
        rows.append(
            {
                "variant": variant,
                "verdict": g["verdict"],
                "failed": ", ".join(g["failed_checks"]) or "-",
                "speculation": g["speculation"]["reason"],
                "users": cap["users_per_gpu"],
                "at_least": cap["at_least"],
                "per_gpu": cap["output_tokens_per_s_per_gpu"],
                "vs_bf16": cap["vs_bf16"],
            }
        )
    return rows


def facts() -> list[tuple[str, str]]:
    times, steps = listing(), (RUN / "steps.txt").read_text().split()
    gates = json.loads((RUN / "metrics/gates.json").read_text())
    quant = json.loads((RUN / "artifacts/timings/quantize-gptq-w4a16.json").read_text())
    models = json.loads((RUN / "metrics/models.json").read_text())
    end = times[STAGE_OUTPUT[-1][1]]
    return [
        ("model", "Llama-3-8B's shape: 32 layers, hidden 4096, FFN 14336, 32 heads, 8 KV heads, vocab 128256"),
        ("weights", "random (run_gpu.py make8b), SmolLM2-135M-Instruct's tokenizer and chat template"),
        ("make8b before the repro", next(s.split("=")[1] for s in steps if s.startswith("seconds=")) + " s"),
        ("repro: sources to gate", f"{(end - times[START]) / 60:.1f} min"),
        (
            "not reached",
            "bundle@bf16, bundle@gptq-w4a16, publish, and the GPTQ 1/2/4-GPU steps after it: the GPU time ran out",
        ),
        (
            "GPTQ W4A16 over 4 GPUs (the stage's timings)",
            f"{quant['wall_time_s']} s, of which oneshot {quant['oneshot_time_s']} s; peak GPU memory "
            f"{quant['peak_gpu_memory_mb']:,.0f} MB per process, host memory {quant['peak_memory_mb']:,.0f} MB",
        ),
        ("target perplexity on its traffic (random weights)", f"{models['proof']['target_perplexity']:,.0f}"),
        ("recommended by the gate", json.dumps(gates["recommended"])),
    ]
