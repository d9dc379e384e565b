"""Serving costs of speculative decoding as vLLM serves it: raw step times, per shape, on the GPU host.

What a speculative step costs does not follow from weight bytes: vLLM's draft-model path pays a fixed
per-forward overhead for every drafted token whatever the draft's size (issue #28). So the CPU estimator
predicts served speed from costs measured here, not assumed:

  shapes OUTDIR                    write config.json files of the shapes below (target, draft, eagle3 head)
  run SHAPES OUT NAME [NAME...]    for each shape: one engine per config (plain, then draft_model, eagle3,
                                   ngram at k = 2 and 8), each in its own process, batches of random
                                   prompts with random weights (load_format=dummy): decode step time per batch
  pool MODELS OUT GPUS ITEM...     engines side by side, one per GPU of GPUS (0,1,2,3): items SHAPE:METHOD:K
                                   [:real] (real: MODELS/SHAPE's own weights, e.g. known_accept.py's models,
                                   whose drafts are accepted) and SHAPE:served:K:METHOD (the served check)
  random-prompts VOCAB FILE        the served check's prompts for a model without a tokenizer
  served-prompts ARTIFACTS FILE    (CPU) the demo's held-out prompts as token ids
  queue SHAPES OUT SERVED_IN ITEM...  shapes and `served` in that order (what session.sh costs runs)
  served MODELS PROMPTS OUT        the demo's trained target, draft and EAGLE-3 head over those prompts:
                                   output tokens/s plain and per method at each k and batch size (the check
                                   of the CPU prediction), with vLLM's acceptance counters

A step's time is measured as the difference between two generations of different length over the same
batch (prefill, scheduling and start-up cancel), divided by the difference in engine steps; a request's
steps are its tokens less its accepted draft tokens (vLLM's counters), so a drafter's acceptance does not
bias the cost. Results are one JSON file per engine under OUT/<shape>/; a failed engine writes its error and
the next one runs. `python -m pipeline.evaluate.serving_costs assemble OUT/<shape> ...` (CPU) turns them into the cost
profile the pipeline ships (data/serving-cost-profiles/).
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

PROMPT_TOKENS = 128
SHORT, LONG = 32, 288  # generated tokens of the two runs whose difference is timed
REPEATS = 2  # short/long pairs per batch size; the profile takes the median step (single pairs read +-30%)
SERVED_TOKENS = 96  # the served check's cap per answer (evaluate.acceptance.continuation_tokens)
SERVED_BATCHES = [1, 16, 32]
PLAIN_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SPEC_BATCHES = [1, 4, 8, 16, 32, 64]
KS = [2, 8]
CHECK_K = 4  # measured for EAGLE-3 too: the check of interpolating a step's cost between k = 2 and 8

# meta-llama/Meta-Llama-3-8B's and -70B's config.json (scale_serve.py serves the 70B one)
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    rope_theta=500000.0,
)
LLAMA3_70B = {
    **LLAMA3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}

# Llama-family shapes the project ships evidence for. draft: a smaller sibling with the target's vocabulary
# (for smollm2-135m the target's own first 4 layers, issue #29's draft-from-target).
SHAPES = {
    "demo": {
        "target": dict(
            hidden_size=384,
            intermediate_size=1024,
            num_hidden_layers=6,
            num_attention_heads=6,
            num_key_value_heads=2,
            vocab_size=1231,
        ),
        "draft": dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=1231,
        ),
    },
    "smollm2-135m": {
        "target": dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
        "draft": dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=4,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
    },
    "gpu-profile-1b": {
        "target": dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=20,
            num_attention_heads=16,
            num_key_value_heads=8,
            vocab_size=32000,
        ),
        "draft": dict(
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            vocab_size=32000,
        ),
    },
    "llama3-8b": {
        "target": LLAMA3_8B,
        "draft": dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rope_theta=500000.0,
            tie_word_embeddings=True,
        ),
    },
    # Qwen2.5-Coder-1.5B-Instruct and its 0.5B sibling (issue #45) as Llama shapes of their widths (Qwen2's q/k/v
    # biases left out: a step's cost is its GEMMs and launches); the converted 1.5B has untied embeddings, the 0.5B
    # ties them. The nearest measured profile (gpu-profile-1b) has another draft: 8 layers, not this one's 24.
    "qwen2.5-coder-1.5b": {
        "target": dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=151936,
            rope_theta=1000000.0,
        ),
        "draft": dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
        ),
    },
    # Llama-3-70B in W4A16 on one GPU (its BF16 weights need 2-4 GPUs; an engine a GPU lets a 4-GPU host time four
    # configs at once), Llama-3.1-8B's shape as its draft; batches capped where its KV cache runs out (~30 GB free)
    "llama3-70b-w4a16": {
        "target": {**LLAMA3_70B, "scheme": "W4A16"},
        "draft": LLAMA3_8B,
        "plain_batches": [1, 2, 4, 8, 16, 32, 64],
        "spec_batches": [1, 8, 32],
    },
}


def quantization_config(scheme: str) -> dict:
    """The quantization_config llm-compressor writes for a compressed-tensors preset (scale_serve.py's), so vLLM
    serves random weights in that format (load_format=dummy). Needs compressed-tensors (the quantize site)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scale_serve import quantization_config as of_scheme

    return of_scheme(scheme)


def llama_config(shape: dict) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "rope_theta": 10000.0,
    }
    cfg.update(shape)
    scheme = cfg.pop("scheme", None)
    if scheme:
        cfg["quantization_config"] = quantization_config(scheme)
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def aux_layers(n: int) -> list[int]:
    """pipeline/drafts/eagle3.py's aux_layer_ids('auto', n): vLLM's Llama default (2, n//2, n-3), spread evenly where
    that repeats a layer (the demo's 6 layers); the GPU host runs this file without the pipeline package."""
    ids = [2, n // 2, n - 3]
    if len(set(ids)) < 3 or min(ids) < 0:
        ids = sorted({max(0, round(i * (n - 1) / 3)) for i in (1, 2, 3)} | {0})[-3:]
    return sorted(ids)


def eagle3_config(target: dict) -> dict:
    """A one-layer EAGLE-3 head in the speculators format the pipeline's eagle3 stage writes (vLLM loads it
    for method eagle3), sized from its target; aux layers as the pipeline's eagle3 stage picks them."""
    n = target["num_hidden_layers"]
    layer = llama_config(
        {
            **{
                k: target[k]
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "vocab_size",
                )
            },
            "num_hidden_layers": 1,
        }
    )
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "draft_vocab_size": target["vocab_size"],
        "eagle_aux_hidden_state_layer_ids": aux_layers(n),
        "norm_before_residual": True,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0, "verifier_accept_k": 1}
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "./target"},
        },
        "torch_dtype": "bfloat16",
    }


def write_shapes(out: Path) -> None:
    for name, shape in SHAPES.items():
        for role, cfg in (
            ("target", llama_config(shape["target"])),
            ("draft", llama_config(shape["draft"])),
            ("eagle3", eagle3_config(shape["target"])),
        ):
            (out / name / role).mkdir(parents=True, exist_ok=True)
            (out / name / role / "config.json").write_text(json.dumps(cfg, indent=1))
        print("shape", name, flush=True)


def spec_config(method: str, k: int, models: Path) -> dict | None:
    if method == "plain":
        return None
    cfg: dict = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        cfg |= {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
    else:
        cfg["model"] = str(models / ("draft" if method == "draft_model" else "eagle3"))
    return cfg


def counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_") and not m.name.endswith("per_pos"):
            out[m.name.removeprefix("vllm:spec_decode_")] = getattr(m, "value", None)
    return out


def timed(llm, prompts: list, max_tokens: int, ignore_eos: bool = True) -> dict:
    from vllm import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos, detokenize=False)
    before = counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sampling, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = counters(llm)
    delta = {k: (after.get(k) or 0) - (before.get(k) or 0) for k in after}
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"wall_s": wall, "tokens": tokens, **delta}


def engine(
    models: Path,
    method: str,
    k: int,
    batches: list[int],
    out: Path,
    weights: str = "dummy",
    prompt_sets: list[list[int]] | None = None,
) -> None:
    """One engine. Random weights: for each batch size a warm-up, then the short and the long run, both timed.
    Real weights (prompt_sets): as served, each batch size runs every prompt once in batches of that size,
    stopping at EOS (at most SERVED_TOKENS), after a warm-up batch: output tokens/s and vLLM's counters."""
    from vllm import LLM

    kw = dict(
        model=str(models / "target"),
        skip_tokenizer_init=True,
        max_model_len=2048,
        gpu_memory_utilization=0.85,
        max_num_seqs=max(batches),
        seed=0,
        disable_log_stats=False,
    )
    if weights == "dummy":
        kw["load_format"] = "dummy"
    spec = spec_config(method, k, models)
    if spec:
        kw["speculative_config"] = spec
    record: dict = {
        "method": method,
        "k": k if spec else 0,
        "weights": weights,
        "engine_args": {key: v for key, v in kw.items() if key != "model"},
        "runs": [],
    }
    t0 = time.perf_counter()
    # a copy: vLLM 0.25 writes its ModelConfig into the speculative_config dict it is given, which then can't be
    # saved as JSON (what failed 0.25.0's draft_model engines in raw/costs/versions before their record was written)
    llm = LLM(**copy.deepcopy(kw))
    record["load_s"] = time.perf_counter() - t0
    vocab = json.loads((models / "target" / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    for b in batches:
        if prompt_sets is not None:
            sets = [[{"prompt_token_ids": p} for p in prompt_sets[i : i + b]] for i in range(0, len(prompt_sets), b)]
            timed(llm, sets[0], SERVED_TOKENS, ignore_eos=False)  # warm-up
            runs = [timed(llm, s, SERVED_TOKENS, ignore_eos=False) for s in sets]
            total = {key: sum(r.get(key) or 0 for r in runs) for key in runs[0]}
            record["runs"].append({"batch": b, "served": total})
            print("SERVED", method, k, b, json.dumps(total), flush=True)
            continue
        prompts = [
            {"prompt_token_ids": [rng.randrange(10, vocab - 10) for _ in range(PROMPT_TOKENS)]} for _ in range(b)
        ]
        # n-gram lookups on random weights' repetitive output are all accepted, and so are known_accept.py's
        # drafts: up to k + 1 tokens a step, so the long run is k + 1 times longer to time as many steps
        accepting = method == "ngram" or (spec and weights != "dummy")
        long_tokens = min(2048 - PROMPT_TOKENS - 8, LONG * (k + 1)) if accepting else LONG
        timed(llm, prompts, 8)  # warm-up: this batch's graphs and caches
        pairs = [(timed(llm, prompts, SHORT), timed(llm, prompts, long_tokens)) for _ in range(REPEATS)]
        record["runs"].append({"batch": b, "short": [p[0] for p in pairs], "long": [p[1] for p in pairs]})
        print("RUN", method, k, b, json.dumps(pairs[-1][1]), flush=True)
    out.write_text(json.dumps(record, indent=1))


def run_one(argv: list[str]) -> None:
    models, out, method, k = Path(argv[0]), Path(argv[1]), argv[2], int(argv[3])
    batches = [int(b) for b in argv[4].split(",")]
    weights = argv[5] if len(argv) > 5 else "dummy"
    prompts = json.loads(Path(argv[6]).read_text()) if len(argv) > 6 else None
    engine(models, method, k, batches, out, weights, prompts)


def batches_for(name: str, method: str) -> list[int]:
    """The batch sizes an engine times: the shape's own where its KV cache caps them."""
    shape = SHAPES.get(name, {})
    if method == "plain":
        return shape.get("plain_batches", PLAIN_BATCHES)
    return shape.get("spec_batches", SPEC_BATCHES)


def configs_for(name: str) -> list[tuple[str, int]]:
    methods = ["eagle3", "draft_model"] + ([] if name == "llama3-8b" else ["ngram"])
    return [("plain", 0)] + [(m, k) for m in methods for k in (sorted(KS + [CHECK_K]) if m == "eagle3" else KS)]


def subprocess_engine(
    models: Path, out_file: Path, method: str, k: int, batches: list[int], *extra: str, gpu: str | None = None
) -> None:
    """Each engine in its own process: vLLM frees GPU memory reliably only at exit; a failure is recorded. `gpu`:
    the one GPU it sees (CUDA_VISIBLE_DEVICES), for engines side by side on one host's GPUs (`pool`)."""
    if out_file.exists():
        return
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else None
    log = out_file.with_suffix(".log")
    t0 = time.time()
    with log.open("w") as fh:
        r = subprocess.run(
            [
                sys.executable,
                __file__,
                "one",
                str(models),
                str(out_file),
                method,
                str(k),
                ",".join(map(str, batches)),
                *extra,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    where = f" gpu {gpu}" if gpu is not None else ""
    print(f"ENGINE {out_file.parent.name}/{out_file.stem} rc={r.returncode} {time.time() - t0:.0f}s{where}", flush=True)
    if r.returncode:
        lines = log.read_text(errors="replace").splitlines()
        err = next((x for x in reversed(lines) if "Error" in x), lines[-1] if lines else "")
        out_file.with_suffix(".failed.json").write_text(
            json.dumps({"method": method, "k": k, "rc": r.returncode, "error": err[-400:]})
        )


def run(shapes: Path, out: Path, names: list[str]) -> None:
    """names: shapes, each optionally `shape:method` (plain decoding and that method only)."""
    for item in names:
        name, _, only = item.partition(":")
        (out / name).mkdir(parents=True, exist_ok=True)
        for method, k in configs_for(name):
            if only and method not in ("plain", only):
                continue
            if only and method == only and k == CHECK_K:
                continue  # a one-method run: the ends of the k range
            batches = batches_for(name, method)
            subprocess_engine(shapes / name, out / name / f"{method}-k{k}.json", method, k, batches)


def pool(models_root: Path, out: Path, gpus: list[str], items: list[str]) -> None:
    """Engines side by side, one per GPU: each item SHAPE:METHOD:K[:WEIGHTS] (WEIGHTS dummy, the default, or real:
    MODELS_ROOT/SHAPE's own files, e.g. known_accept.py's) runs on the next free GPU, in the order given. Each
    engine's process sees one GPU; the host's CPUs are shared (64 cores on a 4-GPU host: a few each). Engines of
    real weights write OUT/SHAPE; random-weight ones OUT/SHAPE too, or OUT/SHAPE-dummy where real ones run beside.
    SHAPE:served:K:METHOD runs the served check (`served`'s prompts, stopping at max tokens) of one method at K
    on MODELS_ROOT/SHAPE over OUT/SHAPE-served/prompts.json."""
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for item in items:  # a bare shape name: every config `run` times for it
        for one in [item] if ":" in item else [f"{item}:{m}:{k}" for m, k in configs_for(item)]:
            todo.put(one)
    real = any(item.split(":")[3:4] == ["real"] for item in items)
    # MC_SPEC_BATCHES: fewer batch sizes for speculative engines where a lease is short (the profile interpolates)
    spec_batches = [int(b) for b in os.environ.get("MC_SPEC_BATCHES", "").split(",") if b]

    def worker(gpu: str) -> None:
        while True:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            shape, method, k, *rest = item.split(":")
            weights = rest[0] if rest else "dummy"
            if method == "served":  # SHAPE:served:K:METHOD
                served_method, folder = rest[0], out / f"{shape}-served"
                folder.mkdir(parents=True, exist_ok=True)
                subprocess_engine(
                    models_root / shape,
                    folder / f"{served_method}-k{k}.json",
                    served_method,
                    int(k),
                    SERVED_BATCHES,
                    "real",
                    str(folder / "prompts.json"),
                    gpu=gpu,
                )
                continue
            batches = spec_batches if spec_batches and method != "plain" else batches_for(shape, method)
            # the profile's folder holds one kind of weights: random ones beside real ones go to SHAPE-dummy
            folder = out / (f"{shape}-dummy" if weights == "dummy" and real else shape)
            folder.mkdir(parents=True, exist_ok=True)
            subprocess_engine(
                models_root / shape, folder / f"{method}-k{k}.json", method, int(k), batches, weights, gpu=gpu
            )

    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def random_prompts(vocab: int, out: Path, n: int = 32) -> None:
    """The served check's prompts on a model without a tokenizer: n random prompts of PROMPT_TOKENS ids."""
    rng = random.Random(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([[rng.randrange(10, vocab - 10) for _ in range(PROMPT_TOKENS)] for _ in range(n)]))


def served_prompts(art: Path, out: Path, n: int = 64) -> None:
    """(CPU) The demo's held-out prompts as token ids, as evaluate builds them: the GPU host needs no pipeline."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from pipeline.data.formatting import prompt_ids, split_prompt_response
    from pipeline.data.traffic import read_split
    from pipeline.models.loading import load_tokenizer

    tok = load_tokenizer(art / "models" / "target")
    rows = read_split(art / "data" / "heldout.jsonl")[:n]
    out.write_text(json.dumps([prompt_ids(tok, split_prompt_response(m)[0]) for m in rows]))


def served(models: Path, prompts: Path, out: Path, only: str = "") -> None:
    """Trained models (MODELS/target, draft, eagle3) over held-out prompts: plain and each method at k = 2 and 8
    (EAGLE-3 at 4 too) at batch 1, 16, 32, stopping at EOS as served."""
    out.mkdir(parents=True, exist_ok=True)
    configs = [
        ("plain", 0),
        ("eagle3", 2),
        ("eagle3", 4),
        ("eagle3", 8),
        ("ngram", 2),
        ("ngram", 8),
        ("draft_model", 2),
        ("draft_model", 8),
    ]
    for method, k in configs:
        if only and method not in ("plain", only):
            continue
        subprocess_engine(models, out / f"{method}-k{k}.json", method, k, SERVED_BATCHES, "real", str(prompts))


def queue(shapes: Path, out: Path, served_input: Path, items: list[str]) -> None:
    """The whole lease's work in the order given: shape names, and `served` for the served check of the demo's
    trained models (waiting up to 5 minutes for their files, SERVED_INPUT/prompts.json, to be carried in)."""
    for item in items:
        if item.partition(":")[0] != "served":
            run(shapes, out, [item])
            continue
        for _ in range(60):
            if (served_input / "prompts.json").exists():
                break
            time.sleep(5)
        if (served_input / "prompts.json").exists():
            served(served_input, served_input / "prompts.json", out / "served-demo", item.partition(":")[2])


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if cmd == "shapes":
        write_shapes(Path(args[0]))
    elif cmd == "run":
        run(Path(args[0]), Path(args[1]), args[2:])
    elif cmd == "pool":
        pool(Path(args[0]), Path(args[1]), args[2].split(","), args[3:])
    elif cmd == "random-prompts":
        random_prompts(int(args[0]), Path(args[1]))
    elif cmd == "queue":
        queue(Path(args[0]), Path(args[1]), Path(args[2]), args[3:])
    elif cmd == "served-prompts":
        served_prompts(Path(args[0]), Path(args[1]))
    elif cmd == "served":
        served(Path(args[0]), Path(args[1]), Path(args[2]))
    elif cmd == "one":
        try:
            run_one(args)
        except Exception:
            traceback.print_exc()
            raise
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
