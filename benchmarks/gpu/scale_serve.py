"""Serving at the sizes users serve: a model of Llama-3-70B's shape, random weights (vLLM `--load-format dummy`: speed
does not depend on their values), served by `vllm serve` and loaded by `vllm bench serve` per variant and tensor
parallel size, several servers at once on disjoint GPU sets of one host (issue #50, items 2, 3 and 8).

  make OUT TOKENIZER VARIANT=SCHEME...   (CPU, compressed-tensors installed) model folders OUT/<variant>/:
                                         config.json of the shape, the tokenizer, and for SCHEME (a compressed-
                                         tensors preset: W4A16, FP8_DYNAMIC; `none` for BF16) the quantization_config
                                         a llm-compressor checkpoint of that scheme carries (lm_head left BF16)
  run MODELS OUT PLAN.json               (GPU host) the plan's waves in order: each wave's servers start at once,
                                         each on its own GPUs (CUDA_VISIBLE_DEVICES) and port, then each is loaded
                                         at every concurrency; a config that fails writes its error and the rest run

A plan is a list of waves, each a list of {"name", "variant", "tp", "gpus": [ids]}; a config's record
(OUT/<name>/config.json) names its GPUs, its TP and the configs that ran beside it, so the same config measured
alone and beside others can be compared. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, and vLLM's symmetric-
memory all-reduce, which can use it, off: VLLM_ALLREDUCE_USE_SYMM_MEM=0). Runs on the host's Python with vLLM on
PYTHONPATH; it imports nothing of the pipeline. benchmarks/tables/scale.py renders the results (CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the servers' and clients' helpers mixed_serve.py shares
from measure_costs import LLAMA3_70B  # noqa: E402
from vllm_process import VLLM, bench_command, free_port, run_client, server_process, wait_up  # noqa: E402

# Llama-3-70B (meta-llama/Meta-Llama-3-70B's config.json): 80 layers, hidden 8192, 64 heads, 8 KV heads.
SHAPE = {**LLAMA3_70B, "max_position_embeddings": 8192}
CONCURRENCY = (1, 16, 32, 64)
PROMPTS_PER_USER = 2  # at least 4 prompts a level
SERVER = {"max-model-len": 4096, "max-num-seqs": 64, "gpu-memory-utilization": 0.9}
START_TIMEOUT_S = 1200
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def llama_config(quantization: dict | None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **SHAPE,
    }
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if quantization:
        cfg["quantization_config"] = quantization
    return cfg


FORMATS = {
    "W4A16": "pack-quantized",
    "W4A16_ASYM": "pack-quantized",
    "FP8_DYNAMIC": "float-quantized",
    "FP8": "float-quantized",
    "W8A8": "int-quantized",
}  # the checkpoint format llm-compressor saves each in


def quantization_config(scheme: str) -> dict:
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    def plain(x):  # None fields left out: vLLM's compressed-tensors (0.17) reads the 0.19 config without them
        return {k: plain(v) for k, v in x.items() if v is not None} if isinstance(x, dict) else x

    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(scheme, ["Linear"])},
        format=FORMATS[scheme],
        ignore=["lm_head"],
        quantization_status="compressed",
    )
    return plain(config.model_dump())


def make(out: Path, tokenizer: Path, variants: list[str]) -> None:
    for item in variants:
        name, _, scheme = item.partition("=")
        quantization = None if scheme == "none" else quantization_config(scheme)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(llama_config(quantization), indent=1))
        for f in tokenizer.glob("tokenizer*"):
            shutil.copy(f, folder / f.name)
        for f in ("special_tokens_map.json", "chat_template.jinja"):
            if (tokenizer / f).exists():
                shutil.copy(tokenizer / f, folder / f)
        print("model", name, "quantized" if quantization else "bf16", flush=True)


def gpu_memory() -> dict[str, int]:
    """MiB used per GPU index now (nvidia-smi), for the record of what a config held."""
    text = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout
    return {line.split(",")[0].strip(): int(line.split(",")[1]) for line in text.strip().splitlines()}


def serve_one(models: Path, out: Path, config: dict, beside: list[str], barrier: threading.Barrier) -> None:
    """Start one server on its GPUs, wait for the whole wave to be up (so every level of every config runs beside
    the others), load it at each concurrency, stop it."""
    name, folder = config["name"], out / config["name"]
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, **ENV, "CUDA_VISIBLE_DEVICES": ",".join(map(str, config["gpus"]))}
    args = [
        *VLLM,
        "serve",
        str(models / config["variant"]),
        "--load-format",
        "dummy",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--served-model-name",
        name,
        "--tensor-parallel-size",
        str(config["tp"]),
        *(x for k, v in SERVER.items() for x in (f"--{k}", str(v))),
    ]
    record = {**config, "beside": beside, "port": port, "command": args[3:], "levels": {}}
    t0 = time.time()
    try:
        with server_process(args, folder / "server.log", env) as proc:
            try:
                record["start_s"] = wait_up(proc, port, t0, START_TIMEOUT_S, "server.log")
                print(f"{name}: up in {record['start_s']} s", flush=True)
                try:
                    barrier.wait(timeout=START_TIMEOUT_S)
                except threading.BrokenBarrierError:
                    record["beside"] = []  # a neighbour failed to start: this config ran alone
                record["gpu_memory_mib"] = gpu_memory()
                for c in CONCURRENCY:
                    record["levels"][str(c)] = level(port, name, models / config["variant"], folder, c, env)
            except Exception as e:  # noqa: BLE001  (the error is the record; the wave goes on)
                record["error"] = str(e)
                print(f"{name}: ERROR {e}", flush=True)
                try:
                    barrier.abort()
                except threading.BrokenBarrierError:
                    pass
    finally:
        record["wall_s"] = round(time.time() - t0, 1)
        (folder / "config.json").write_text(json.dumps(record, indent=1))


def level(port: int, name: str, tokenizer: Path, folder: Path, c: int, env: dict) -> dict:
    """One concurrency level's client run: its exit status, start time and wall seconds."""
    result = folder / f"c{c}.json"
    cmd = bench_command(port, name, tokenizer, max(4, PROMPTS_PER_USER * c), c, result)
    t = time.time()
    rc = run_client(cmd, folder / f"c{c}.log", env)
    record = {"rc": rc, "start": round(t, 1), "wall_s": round(time.time() - t, 1)}
    print(f"{name}: c={c} rc={rc} in {time.time() - t:.0f} s", flush=True)
    return record


def run(models: Path, out: Path, plan: list[list[dict]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, wave in enumerate(plan):
        names = [c["name"] for c in wave]
        print(f"wave {i}: {names}", flush=True)
        barrier = threading.Barrier(len(wave))
        threads = [
            threading.Thread(target=serve_one, args=(models, out, c, [n for n in names if n != c["name"]], barrier))
            for c in wave
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(5)  # the GPUs' memory released before the next wave's servers size their KV cache
    (out / "DONE").write_text("done\n")


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "make" and len(sys.argv) >= 5:
        make(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    elif verb == "run" and len(sys.argv) == 5:
        run(Path(sys.argv[2]), Path(sys.argv[3]), json.loads(Path(sys.argv[4]).read_text()))
    else:
        sys.exit(__doc__)
