"""Issue 50 items 4 and 5 on a 2-GPU host, one step of benchmarks/gpu/tp_eval.sh at a time (session.sh tpeval):

  quant MODEL OUT GPUS RECORD [--offload]   the pipeline's GPTQ W4A16 (params.yaml's recipe) of MODEL through
                                             pipeline/quantize/distributed.py on GPUS GPUs; calibration TPE_SAMPLES x
                                             TPE_SEQ tokens of artifacts/data/calibration.jsonl; wall time and the
                                             pipeline's metrics (rank 0's peak GPU memory) into RECORD
  vllm BASE RECORD TP NAME=DIR...            fidelity of each DIR against BASE through vLLM at tensor parallel TP
                                             (pipeline/evaluate/vllm_fidelity.py: BASE's logprobs read once) on
                                             TPE_HELDOUT held-out conversations; RECORD gets one entry per NAME
  exact BASE RECORD NAME=DIR...              the same, exact, in transformers on one GPU (pipeline/evaluate/quality.py)

Each record is JSON written whole at the end of its step; the shell script around it times the steps and samples
nvidia-smi for every GPU's peak memory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HELDOUT = Path("artifacts/data/heldout.jsonl")
CALIBRATION = Path("artifacts/data/calibration.jsonl")
VARIANT = "gptq-w4a16"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def write(record: Path, value: dict) -> None:
    record.write_text(json.dumps(value, indent=2) + "\n")
    print("RESULT", record.name, json.dumps(value)[:600], flush=True)


def quant(model: Path, out: Path, gpus: int, record: Path, offload: bool) -> None:
    import yaml

    from pipeline.data.formatting import full_text
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer
    from pipeline.quantize import distributed
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration, Distributed

    params = yaml.safe_load(Path("params.yaml").read_text())["quantize"]
    spec = parse_variant(VARIANT, params["variants"][VARIANT])
    cfg = Calibration.parse(
        {
            **params["calibration"],
            "num_samples": env_int("TPE_SAMPLES", 64),
            "max_seq_length": env_int("TPE_SEQ", 512),
            "offload": offload,
        }
    )
    tokenizer = load_tokenizer(model)
    texts = [full_text(tokenizer, m) for m in read_split(CALIBRATION)]
    t0 = time.perf_counter()
    metrics = distributed.quantize(model, out, spec, texts, cfg, Distributed(gpus=gpus, timeout_s=900))
    write(
        record,
        {
            "gpus": gpus,
            "offload": offload or gpus > 1,
            "samples": cfg.num_samples,
            "max_seq_length": cfg.max_seq_length,
            "wall_s": round(time.perf_counter() - t0, 2),
            "metrics": metrics,
        },
    )


def request(tokenizer_dir: Path):
    from pipeline.data.formatting import prompt_and_response_ids
    from pipeline.data.traffic import read_split
    from pipeline.evaluate.vllm_fidelity import Request
    from pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    examples = [prompt_and_response_ids(tokenizer, m) for m in read_split(HELDOUT)[: env_int("TPE_HELDOUT", 32)]]
    return Request(examples, [p for p, _ in examples][: env_int("TPE_GREEDY", 16)], 16, tokenizer.eos_token_id)


def named(pairs: list[str]) -> dict[str, Path]:
    return {name: Path(path) for name, path in (p.split("=", 1) for p in pairs)}


def vllm(base: Path, record: Path, tp: int, variants: dict[str, Path]) -> None:
    from pipeline.evaluate import vllm_fidelity

    req = request(base)
    engine = vllm_fidelity.Engine(
        tp, float(os.environ.get("TPE_MEM", 0.6)), enforce_eager=True, dtype=os.environ.get("TPE_DTYPE", "auto")
    )  # bfloat16 beside transformers' CUDA dtype
    out: dict = {
        "tensor_parallel_size": tp,
        "top_k": vllm_fidelity.TOP_K,
        "examples": len(req.examples),
        "baseline": str(base),
        "variants": {},
    }
    t0 = time.perf_counter()
    scored = vllm_fidelity.score(base, req, engine)
    out["baseline_s"] = round(time.perf_counter() - t0, 1)
    for name, path in variants.items():
        t0 = time.perf_counter()
        try:  # one checkpoint's failure is its own result
            own = vllm_fidelity.score(path, req, engine, scored.paths)
            fidelity, estimator = vllm_fidelity.compare(req, scored, own)
            out["variants"][name] = {
                "path": str(path),
                "fidelity": fidelity,
                "estimator": estimator,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        except Exception as e:  # noqa: BLE001
            out["variants"][name] = {"path": str(path), "error": f"{type(e).__name__}: {e}"[:500]}
        write(record, out)


def exact(base: Path, record: Path, variants: dict[str, Path]) -> None:
    import torch

    from pipeline.evaluate import quality
    from pipeline.models.loading import load_causal_lm

    req = request(base)
    device = torch.device("cuda")
    baseline = load_causal_lm(base, device)
    out: dict = {
        "backend": "transformers",
        "dtype": str(baseline.dtype),
        "examples": len(req.examples),
        "baseline": str(base),
        "variants": {},
    }
    for name, path in variants.items():
        model = load_causal_lm(path, device)
        fidelity = quality.fidelity(baseline, model, req.examples)
        fidelity["greedy_match"] = quality.greedy_match(
            baseline, model, req.greedy_prompts, req.greedy_tokens, req.eos_token_id
        )
        out["variants"][name] = {"path": str(path), "fidelity": fidelity}
        del model
    write(record, out)


def main(argv: list[str]) -> None:
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    step, args = argv[0], argv[1:]
    if step == "quant":
        quant(Path(args[0]), Path(args[1]), int(args[2]), Path(args[3]), "--offload" in args[4:])
    elif step == "vllm":
        vllm(Path(args[0]), Path(args[1]), int(args[2]), named(args[3:]))
    elif step == "exact":
        exact(Path(args[0]), Path(args[1]), named(args[2:]))
    else:
        sys.exit(f"unknown step {step}")


if __name__ == "__main__":
    main(sys.argv[1:])
