"""GPU proof: the pipeline's demo outputs in real vLLM, and decode speed at Llama-3-8B shapes.

Runs on the lent GPU host (vLLM 0.25 installed offline; see benchmarks/gpu/README.md). One phase
per call so each fits a 10-minute command:

  demo   ARTIFACTS OUT  vLLM per variant: tokens/s at batch 1 and 32 with/without the draft,
                        acceptance per position from LLM.get_metrics(), greedy agreement with BF16
  serve  BUNDLE OUT     `vllm serve --config serve.yaml` from a bundle answers one chat request
  quality ARTIFACTS OUT the pipeline's own scorer (perplexity, KL, top-1) on GPU, per variant
  make8b DIR TOK        a randomly initialised Llama-3-8B-shaped checkpoint (speed only) in DIR/bf16, TOK's tokenizer
  make70b DIR TOK N     the same at Llama-3-70B's widths with N decoder layers (per-layer quantization times)
  quant8b DIR OUT V..   the pipeline's quantize code on that checkpoint, wall time per variant
  bench8b DIR OUT M..   vLLM decode tokens/s at batch 1 and 32 for each model dir name

ARTIFACTS is the `artifacts/` directory of a demo `dvc repro` (models/target, quantized/<v>, draft/,
data/heldout.jsonl, eval/<v>/speculative.json), carried to the GPU host as built.
Every number comes from a run; results are JSON files under OUT and `RESULT` lines on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(1, str(Path(__file__).resolve().parent))
import measure_costs  # noqa: E402  (the Llama-3 shapes)

VARIANTS = ["fp8-dynamic", "fp8-static", "gptq-w4a16", "awq-w4a16"]


def emit(out: Path, name: str, obj: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(obj, indent=2))
    print("RESULT", name, json.dumps(obj), flush=True)


def heldout_prompts(art: Path, n: int) -> list[list[int]]:
    from pipeline.data.formatting import prompt_ids, split_prompt_response
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer

    tok = load_tokenizer(art / "models" / "target")
    return [prompt_ids(tok, split_prompt_response(m)[0]) for m in read_split(art / "data" / "heldout.jsonl")[:n]]


def model_dirs(art: Path) -> dict[str, Path]:
    return {"bf16": art / "models" / "target", **{v: art / "quantized" / v for v in VARIANTS}}


def run_each(phase: str, root: Path, out: Path, names: list[str]) -> None:
    """One subprocess per model: vLLM keeps GPU state per process; a failure is reported, not fatal."""
    for name in names:
        r = subprocess.run([sys.executable, __file__, phase, str(root), str(out), name], text=True)
        if r.returncode:
            print(f"ERR {phase} {name} exited {r.returncode}", flush=True)


def phase_demo_one(art: Path, out: Path, name: str) -> None:
    from pipeline.evaluate.vllm_spec import measure

    prompts = heldout_prompts(art, 64)
    spec = json.loads((art / "eval" / name / "speculative.json").read_text()) if name != "bf16" else None
    k = spec["num_speculative_tokens"] if spec else 4
    t0 = time.time()
    # enforce_eager: the demo models are tiny and launch-bound either way; skipping torch.compile and
    # CUDA-graph capture keeps ten engine starts inside one call. The 8B benchmark uses graphs.
    res = measure(
        str(model_dirs(art)[name]),
        str(art / "draft" / "model"),
        prompts,
        k,
        max_tokens=96,
        temperature=0.0,
        gpu_memory_utilization=0.25,
        max_model_len=1024,
        batch_sizes=(1, 32),
        enforce_eager=True,
        return_tokens=True,
    )
    res["variant"], res["wall_s"] = name, round(time.time() - t0, 1)
    if spec:
        res["cpu_estimate"] = {
            "accepted_per_position": spec["accepted_per_position"][:k],
            "token_acceptance": spec["token_acceptance"],
            "accepted_per_draft_token": spec["accepted_per_draft_token"],
            "expected_accepted_tokens": spec["expected_accepted_tokens"],
        }
    tokens = res.pop("tokens", None)
    (out / f"tokens-{name}.json").write_text(json.dumps(tokens))
    emit(out, f"demo-{name}", res)


def phase_agreement(out: Path) -> None:
    base = json.loads((out / "tokens-bf16.json").read_text())
    agree = {}
    for v in VARIANTS:
        f = out / f"tokens-{v}.json"
        if f.exists():
            q = json.loads(f.read_text())
            agree[v] = sum(a == b for x, y in zip(base, q) for a, b in zip(x, y)) / sum(len(x) for x in base)
    emit(out, "greedy-agreement", agree)


def phase_quality(art: Path, out: Path) -> None:
    import torch

    from pipeline.data.formatting import prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.evaluate.quality import fidelity
    from pipeline.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(art / "models" / "target")
    examples = [prompt_and_response_ids(tok, m) for m in read_split(art / "data" / "heldout.jsonl")[:64]]
    dirs = model_dirs(art)
    base = load_causal_lm(dirs["bf16"])
    res = {"device": torch.cuda.get_device_name()}
    for v in VARIANTS:
        res[v] = fidelity(base, load_causal_lm(dirs[v]), examples)
    emit(out, "quality-gpu", res)


def phase_serve(bundle: Path, out: Path, port: int = 8471) -> None:
    import urllib.request

    cmd = [
        sys.executable,
        "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())",
        "serve",
        "--config",
        "serve.yaml",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--gpu-memory-utilization",
        "0.3",
        "--enforce-eager",
    ]
    log = open(out / "serve.log", "w")
    proc = subprocess.Popen(cmd, cwd=bundle, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    result = {
        "command": "vllm serve --config serve.yaml (+ --port/--host/--gpu-memory-utilization/--enforce-eager)",
        "serve_yaml": (bundle / "serve.yaml").read_text(),
    }
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        else:
            raise RuntimeError("server not healthy within 300 s")
        result["startup_s"] = round(300 - (deadline - time.time()), 1)
        served = yaml_name(bundle)
        body = json.dumps(
            {
                "model": served,
                "messages": [{"role": "user", "content": "How do I rotate an API key in Nimbus Storage?"}],
                "max_tokens": 64,
                "temperature": 0,
            }
        ).encode()
        req = urllib.request.Request(
            base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        reply = json.loads(urllib.request.urlopen(req, timeout=60).read())
        result["reply"] = reply["choices"][0]["message"]["content"]
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        result["spec_metrics"] = [m for m in metrics.splitlines() if m.startswith("vllm:spec_decode")][:12]
        result["ok"] = True
    except Exception as e:  # report, don't hide: the log comes back too
        result["ok"], result["error"] = False, f"{type(e).__name__}: {e}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    emit(out, "serve", result)


def yaml_name(bundle: Path) -> str:
    import yaml

    return yaml.safe_load((bundle / "serve.yaml").read_text())["served-model-name"]


# the shapes measure_costs.py declares, with what a transformers checkpoint of them needs beside
_CHECKPOINT = dict(
    max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2
)
LLAMA3_8B = {**measure_costs.LLAMA3_8B, **_CHECKPOINT}
# `make70b DIR TOK N` keeps N of Llama-3-70B's 80 decoder layers, to time quantizing one layer of that width
# (sequential onloading's unit)
LLAMA3_70B = {**measure_costs.LLAMA3_70B, **_CHECKPOINT}


def phase_make8b(root: Path, tokenizer_dir: Path, shape: dict = LLAMA3_8B, name: str = "make8b") -> None:
    """Random weights: decode speed does not depend on values (quality numbers come from the demo)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(LlamaConfig(**shape))
    model.save_pretrained(root / "bf16")
    # any tokenizer for the speed benchmarks (they feed token ids); a real one with its chat template for the whole
    # pipeline at this shape (profiles/gpu-8b.yaml: SmolLM2's, whose <|im_start|>/<|im_end|> are ids 1 and 2)
    for pattern in ("tokenizer*", "chat_template.jinja", "special_tokens_map.json"):
        for f in tokenizer_dir.glob(pattern):
            shutil.copy(f, root / "bf16" / f.name)
    print(
        f"RESULT {name}",
        json.dumps({"params": sum(p.numel() for p in model.parameters()), "wall_s": round(time.time() - t0, 1)}),
        flush=True,
    )


def phase_quant8b(root: Path, out: Path, variants: list[str], calib_file: Path) -> None:
    import yaml

    from pipeline.data.formatting import full_text
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration

    params = yaml.safe_load(Path("params.yaml").read_text())
    tok = load_tokenizer(root / "bf16")
    texts = [full_text(tok, m) for m in read_split(calib_file)]
    cfg = Calibration.parse({**params["quantize"]["calibration"], "num_samples": 64, "max_seq_length": 512})
    for v in variants:
        try:  # one variant's failure is its own result, not the end of the others'
            metrics = quantize_model(
                root / "bf16", root / v, parse_variant(v, params["quantize"]["variants"][v]), texts, cfg
            )
        except Exception as e:  # noqa: BLE001
            print(f"ERR quant8b {v}: {type(e).__name__}: {e}", flush=True)
            continue
        emit(out, f"quant8b-{v}", metrics)


def phase_bench8b_one(root: Path, out: Path, name: str) -> None:
    from vllm import LLM, SamplingParams

    from pipeline.evaluate.vllm_spec import _tokens_per_s

    t0 = time.time()
    llm = LLM(model=str(root / name), max_model_len=2048, gpu_memory_utilization=0.85, seed=0, skip_tokenizer_init=True)
    load = time.time() - t0
    prompts = [{"prompt_token_ids": [1] + [(i * 37 + j * 11) % 30000 + 3 for j in range(128)]} for i in range(64)]
    sampling = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True, detokenize=False)
    res = {"model": name, "load_s": round(load, 1)}
    for bs, rounds in ((1, 3), (32, 2)):
        res[f"tokens_per_s_bs{bs}"] = _tokens_per_s(llm, prompts, sampling, bs, rounds)
    emit(out, f"bench8b-{name}", res)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    phase, args = sys.argv[1], sys.argv[2:]
    if phase == "demo":
        run_each("demo-one", Path(args[0]), Path(args[1]), args[2:] or ["bf16", *VARIANTS])
        phase_agreement(Path(args[1]))
    elif phase == "demo-one":
        phase_demo_one(Path(args[0]), Path(args[1]), args[2])
    elif phase == "quality":
        phase_quality(Path(args[0]), Path(args[1]))
    elif phase == "serve":
        phase_serve(Path(args[0]), Path(args[1]))
    elif phase == "make8b":
        phase_make8b(Path(args[0]), Path(args[1]))
    elif phase == "make70b":
        layers = int(args[2])
        phase_make8b(Path(args[0]), Path(args[1]), {**LLAMA3_70B, "num_hidden_layers": layers}, "make70b")
    elif phase == "quant8b":
        phase_quant8b(Path(args[0]), Path(args[1]), args[3:], Path(args[2]))
    elif phase == "bench8b":
        run_each("bench8b-one", Path(args[0]), Path(args[1]), args[2:])
    elif phase == "bench8b-one":
        phase_bench8b_one(Path(args[0]), Path(args[1]), args[2])
    else:
        sys.exit(f"unknown phase {phase}")
