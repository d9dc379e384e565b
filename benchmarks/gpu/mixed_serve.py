"""Issue 46 items 3-4 on the GPU: one mixed-precision compressed-tensors checkpoint (several config groups) of a
Llama-3-8B shape, built by the pipeline's own quantize code and served by vLLM beside uniform INT4 and BF16.

  build ROOT OUT   (llm-compressor's site first) ROOT/bf16: random Llama-3-8B-shape weights (run_gpu.py make8b; reused
                   when another step made it), then two checkpoints by pipeline.quantize.oneshot.quantize_model, RTN
                   (speed does not depend on the weights' values; RTN takes seconds where GPTQ takes minutes):
                   ROOT/rtn-w4a16 (uniform W4A16, group 128) and ROOT/mixed-w4a16 (LAYOUT below: W4A16 + W8A16 config
                   groups from mixed.targets_of, BF16 blocks in `ignore`, as quantize@<variant> writes a searched
                   layout); OUT/build.json: layout, config groups, checkpoint bytes (predicted and on disk), walls.
  serve ROOT OUT   (vLLM's site) each model served by `vllm serve` (as serve_bench and scale_serve.py serve), one at a
                   time: greedy outputs of PROMPTS (token ids back from the server), then `vllm bench serve` at
                   concurrency 1 and 32 (random prompts of 512 tokens, 128 out, --ignore-eos), the server's log kept.
                   OUT/<model>/record.json (start, kernels vLLM's log named per scheme class, levels),
                   OUT/summary.json: tokens/s and ratios within this run, greedy agreement between the models.

LAYOUT (the mixed checkpoint): the first and last decoder blocks BF16 (the issue names them as the usual sensitive
ones; the SmolLM2 search measured its last layer the most sensitive and its first the third, benchmarks/cpu/MIXED.md),
and of the 30 between them 40% W4A16 (12, every layer i with (i - 1) % 5 in {0, 1}: spread over the depth) and 60%
W8A16: the proportions of the layout the SmolLM2 search shipped (12 W4A16, 18 W8A16 of 30 layers). All three rungs
of the search's ladder in one checkpoint, so vLLM's per-layer scheme matching, both integer widths' kernels and the
unquantized path are all exercised. Random weights: greedy agreement only shows each checkpoint loads and decodes;
quality is the CPU proof's (MIXED.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the same servers' and clients' helpers and sizes as scale_serve.py
from vllm_process import VLLM, bench_command, free_port, run_client, server_process, wait_up  # noqa: E402

ROOT_DIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT_DIR))

UNIFORM = {"algorithm": "rtn", "scheme": "W4A16", "group_size": 128}
MIXED = {**UNIFORM, "mixed": {"schemes": ["W8A16", "UNQUANTIZED"]}}
MODELS = ("mixed-w4a16", "rtn-w4a16", "bf16")  # served in this order: the new checkpoint first if the lease runs short
CONCURRENCY = (1, 32)
PROMPTS = [[(i * 37 + j * 11) % 400 + 3 for j in range(64)] for i in range(8)]  # ids every tokenizer here has
GREEDY_TOKENS = 32
SERVER = {"max-model-len": 2048, "max-num-seqs": 32, "gpu-memory-utilization": 0.85, "seed": 0}
START_TIMEOUT_S = 900
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def say(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions as this process's path finds them (each step runs with its own site first)."""
    from importlib import metadata

    def one(p: str) -> str | None:
        try:
            return metadata.version(p)
        except metadata.PackageNotFoundError:
            return None

    return {p: one(p) for p in packages}


# ---- build (llm-compressor's site) ----


def layout_rungs(n: int) -> tuple[int, ...]:
    """LAYOUT as rung indices of the ladder (0 W4A16, 1 W8A16, 2 UNQUANTIZED) for n decoder layers."""
    return tuple(2 if i in (0, n - 1) else 0 if (i - 1) % 5 < 2 else 1 for i in range(n))


def complete(model: Path) -> bool:
    """A saved checkpoint with every safetensors file its index names (a half-written one is not reused)."""
    index = model / "model.safetensors.index.json"
    if not (model / "config.json").is_file():
        return False
    if index.is_file():
        return all((model / f).is_file() for f in set(json.loads(index.read_text())["weight_map"].values()))
    return (model / "model.safetensors").is_file()


def tokenizer_dir(root: Path) -> Path:
    """A tokenizer for the random model: the carried demo target's when there is one, else a small BPE trained here
    (pipeline/models/demo: the benchmarks feed token ids, any tokenizer does)."""
    carried = ROOT_DIR / "artifacts" / "models" / "target"
    if (carried / "tokenizer.json").is_file():
        return carried
    from pipeline.models.demo.models import train_tokenizer

    out = root / "tokenizer"
    texts = [p.read_text() for p in sorted((ROOT_DIR / "pipeline").rglob("*.py"))]
    train_tokenizer(texts, 1024).save_pretrained(out)
    return out


def ensure_bf16(root: Path) -> dict:
    bf16 = root / "bf16"
    if complete(bf16):
        return {"bf16": "reused", "bf16_dir": str(bf16)}
    if bf16.exists():
        raise SystemExit(
            f"ERR {bf16} exists but is incomplete (another step still writing it, or a killed run: "
            f"remove it and start again)"
        )
    t0 = time.time()
    subprocess.run(
        [
            sys.executable,
            str(ROOT_DIR / "benchmarks" / "gpu" / "run_gpu.py"),
            "make8b",
            str(root),
            str(tokenizer_dir(root)),
        ],
        check=True,
    )
    return {"bf16": "made (run_gpu.py make8b)", "bf16_dir": str(bf16), "make8b_s": round(time.time() - t0, 1)}


def quantize(root: Path, name: str, spec, cfg, targets) -> dict:
    """One checkpoint by the pipeline's quantize_model into ROOT/<name> (written aside, then renamed: a killed run
    leaves nothing that looks finished); reused when complete."""
    import shutil

    from pipeline.quantize.oneshot import quantize_model

    dest = root / name
    if complete(dest) and (dest / "quantize.json").is_file():
        return {**json.loads((dest / "quantize.json").read_text()), "reused": True}
    tmp = root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    metrics = quantize_model(root / "bf16", tmp, spec, [], cfg, targets)
    (tmp / "quantize.json").write_text(json.dumps(metrics, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return metrics


def build(root: Path, out: Path) -> None:
    import torch
    import yaml
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.core.sizes import dir_size
    from pipeline.quantize import mixed
    from pipeline.quantize.recipes import choose_group_size, input_widths, parse_variant, with_group_size
    from pipeline.quantize.settings import Calibration

    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    record = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "versions": versions(("torch", "transformers", "llmcompressor", "compressed-tensors")),
        **ensure_bf16(root),
    }
    cfg = Calibration.parse(yaml.safe_load((ROOT_DIR / "params.yaml").read_text())["quantize"]["calibration"])
    uniform, spec = parse_variant("rtn-w4a16", UNIFORM), parse_variant("mixed-w4a16", MIXED)
    with torch.device("meta"):  # the layer shapes only (recipes.config_input_widths' way)
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(root / "bf16"))
    ignore = sorted(set(cfg.ignore) | set(spec.ignore))
    spec = with_group_size(spec, choose_group_size(spec, input_widths(meta, ignore)))
    units, ladder = mixed.decoder_units(meta, ignore), mixed.ladder_of(spec)
    rungs = layout_rungs(len(units))
    targets = mixed.targets_of(units, ladder, rungs)
    record |= {
        "layout": mixed.layout_of(units, ladder, rungs),
        "targets": targets,
        "predicted_bytes": {
            "rtn-w4a16": sum(mixed.unit_bytes(u, ladder[0], 2) for u in units),
            "mixed-w4a16": sum(mixed.unit_bytes(u, ladder[r], 2) for u, r in zip(units, rungs)),
            "bf16": sum(mixed.unit_bytes(u, ladder[-1], 2) for u in units),
        },
        "predicted_bytes_note": "the decoder layers' Linear weights only (mixed.unit_bytes), not embeddings, "
        "lm_head or norms",
    }
    say("layout", json.dumps(record["layout"]))
    record["quantize"] = {}
    for name, variant, layout in (("rtn-w4a16", uniform, None), ("mixed-w4a16", spec, targets)):
        say("quantize", name)
        record["quantize"][name] = quantize(root, name, variant, cfg, layout)
        say("quantized", name, record["quantize"][name].get("size_after_mb"), "MB")
    qc = json.loads((root / "mixed-w4a16" / "config.json").read_text())["quantization_config"]
    record["mixed_quantization_config"] = {
        "format": qc.get("format"),
        "ignore": qc.get("ignore"),
        "config_groups": {
            k: {"targets": g["targets"], "weights": g["weights"]} for k, g in qc["config_groups"].items()
        },
    }
    record["checkpoint_bytes"] = {m: dir_size(root / m, suffix=".safetensors") for m in MODELS}
    (out / "build.json").write_text(json.dumps(record, indent=1))
    say("RESULT build", json.dumps(record["checkpoint_bytes"]))


# ---- serve (vLLM's site) ----


def greedy(port: int, name: str) -> list[list]:
    """Each prompt's greedy continuation as token ids: random weights' tokens mostly fall outside a small tokenizer,
    so text would not compare. vLLM's `return_token_ids`, else the logprobs' "token_id:N" tokens, else the text."""
    outs = []
    for prompt in PROMPTS:
        body = json.dumps(
            {
                "model": name,
                "prompt": prompt,
                "max_tokens": GREEDY_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
                "return_token_ids": True,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            outs.append(token_ids(json.loads(r.read())["choices"][0]))
    return outs


def token_ids(choice: dict) -> list:
    if choice.get("token_ids"):
        return list(choice["token_ids"])
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if tokens and all(str(t).startswith("token_id:") for t in tokens):
        return [int(str(t).split(":", 1)[1]) for t in tokens]
    return list(choice.get("text", ""))  # characters: still comparable position by position


def bench(port: int, name: str, tokenizer: Path, folder: Path, c: int, env: dict) -> dict:
    result = folder / f"c{c}.json"
    cmd = bench_command(port, name, tokenizer, max(8, 3 * c), c, result)
    t = time.time()
    rc = run_client(cmd, folder / f"c{c}.log", env)
    level = {"rc": rc, "wall_s": round(time.time() - t, 1)}
    if result.is_file():
        r = json.loads(result.read_text())
        level |= {
            k: r.get(k)
            for k in (
                "completed",
                "failed",
                "output_throughput",
                "request_throughput",
                "median_tpot_ms",
                "median_itl_ms",
                "median_ttft_ms",
                "p99_itl_ms",
            )
        }
    return level


def serve_one(root: Path, out: Path, name: str) -> dict:
    from pipeline.serving.kernel_log import kernel_schemes_in_log, kernels_in_log

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, **ENV}
    args = [
        *VLLM,
        "serve",
        str(root / name),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--served-model-name",
        name,
        *(x for k, v in SERVER.items() for x in (f"--{k}", str(v))),
    ]
    record = {"model": name, "command": args[3:], "levels": {}}
    t0 = time.time()
    with server_process(args, folder / "server.log", env) as proc:
        try:
            record["start_s"] = wait_up(proc, port, t0, START_TIMEOUT_S, f"{name}/server.log")
            say(name, "up in", record["start_s"], "s")
            record["greedy"] = greedy(port, name)
            for c in CONCURRENCY:
                record["levels"][f"c{c}"] = level = bench(port, name, root / name, folder, c, env)
                say(name, f"c={c}", json.dumps(level))
        except Exception as e:  # noqa: BLE001  (the error is the record; the next model still runs)
            record["error"] = f"{type(e).__name__}: {e}"
            say(name, "ERROR", record["error"])
    record["kernels_used"] = kernels_in_log(folder / "server.log")
    record["kernel_schemes"] = kernel_schemes_in_log(folder / "server.log")
    record["wall_s"] = round(time.time() - t0, 1)
    (folder / "record.json").write_text(json.dumps(record, indent=1))
    say("RESULT", name, json.dumps({k: record.get(k) for k in ("start_s", "kernel_schemes", "error")}))
    return record


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Greedy token agreement of two models on the same prompts: share of positions equal, prompts equal whole,
    and the mean first position where they differ (GREEDY_TOKENS where they never do)."""
    first = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q))) for p, q in zip(a, b)]
    same = sum(x == y for p, q in zip(a, b) for x, y in zip(p, q))
    return {
        "token_agreement": round(same / max(1, sum(len(p) for p in a)), 4),
        "identical_prompts": sum(p == q for p, q in zip(a, b)),
        "prompts": len(a),
        "mean_first_difference": round(sum(first) / max(1, len(first)), 2),
    }


def summarize(records: dict[str, dict], build_record: dict | None) -> dict:
    def tps(name: str, c: int) -> float | None:
        return records.get(name, {}).get("levels", {}).get(f"c{c}", {}).get("output_throughput")

    summary = {
        "output_tokens_per_s": {n: {f"c{c}": tps(n, c) for c in CONCURRENCY} for n in records},
        "ratios": {},
        "greedy_agreement": {},
        "kernel_schemes": {n: r.get("kernel_schemes") for n, r in records.items()},
        "checkpoint_bytes": (build_record or {}).get("checkpoint_bytes"),
    }
    for a, b in (("mixed-w4a16", "bf16"), ("mixed-w4a16", "rtn-w4a16"), ("rtn-w4a16", "bf16")):
        summary["ratios"][f"{a}/{b}"] = {
            f"c{c}": round(tps(a, c) / tps(b, c), 3) if tps(a, c) and tps(b, c) else None for c in CONCURRENCY
        }
        if records.get(a, {}).get("greedy") and records.get(b, {}).get("greedy"):
            summary["greedy_agreement"][f"{a} vs {b}"] = agreement(records[a]["greedy"], records[b]["greedy"])
    return summary


def serve(root: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "versions-serve.json").write_text(
        json.dumps(versions(("vllm", "torch", "transformers", "compressed-tensors")), indent=1)
    )
    records = {}
    for name in MODELS:
        if not complete(root / name):
            say("ERR", name, "has no complete checkpoint under", root)
            continue
        records[name] = serve_one(root, out, name)
        time.sleep(5)  # the GPU's memory released before the next server sizes its KV cache
    build_file = out / "build.json"
    summary = summarize(records, json.loads(build_file.read_text()) if build_file.is_file() else None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    say("RESULT summary", json.dumps({k: summary[k] for k in ("output_tokens_per_s", "ratios", "greedy_agreement")}))


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb in ("build", "serve") and len(sys.argv) == 4:
        (build if verb == "build" else serve)(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
