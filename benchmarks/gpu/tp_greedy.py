"""A bundle built for tensor parallel 2 served exactly as shipped, against the same model at TP 1: are the greedy
outputs on held-out prompts identical? (issue #50, item 8)

    python benchmarks/gpu/tp_greedy.py OUT BUNDLE [--tokens N] [--gpus-shipped 1,2] [--gpus-tp1 0] [--heldout F]

`modelprep verify BUNDLE`, then two servers at once on disjoint GPUs: `vllm serve --config serve.yaml` from the bundle
directory with its serve.env (as its manifest starts it), and the same serve.yaml with tensor-parallel-size 1. Each
held-out prompt (--heldout, default artifacts/data/heldout.jsonl, rendered with the bundle's chat template) is completed
by both at temperature 0 with the two most likely tokens per position. OUT/tp_greedy.json: per prompt, whether the texts
match, the first differing position and each server's margin there (top-1 minus top-2 logprob: a tie that the summation
order of TP's all-reduce can flip); OUT/<config>-server.log. GPU + vLLM only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.gpu.serve_shipped import serve_env, verify  # noqa: E402
from pipeline.core.multigpu import MULTICAST_OFF  # noqa: E402
from pipeline.data.formatting import prompt_text  # noqa: E402
from pipeline.data.traffic import heldout_prompts  # noqa: E402
from pipeline.models.loading import load_tokenizer  # noqa: E402
from pipeline.serving.vllm_server import serve  # noqa: E402

TP_KEY = "tensor-parallel-size"


def complete(base_url: str, model: str, prompt: str, tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "logprobs": 2, "seed": 0}
    request = urllib.request.Request(
        f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    lp = choice["logprobs"]
    margins = [sorted(top.values(), reverse=True) for top in lp["top_logprobs"]]
    return {
        "text": choice["text"],
        "tokens": lp["tokens"],
        "margins": [round(m[0] - m[1], 4) if len(m) > 1 else None for m in margins],
    }


def run_config(
    name: str,
    config: Path,
    work: Path,
    gpus: str,
    env: dict,
    out: Path,
    model: str,
    prompts: list[str],
    tokens: int,
    results: dict,
) -> None:
    try:
        with serve(
            config, work, out / f"{name}-server.log", 900, None, {**env, **MULTICAST_OFF, "CUDA_VISIBLE_DEVICES": gpus}
        ) as server:
            outputs = [complete(server.base_url, model, p, tokens) for p in prompts]
            results[name] = {
                "gpus": gpus,
                "startup_s": round(server.startup_s, 1),
                "outputs": outputs,
                "serve_yaml_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
            }
    except Exception as e:  # noqa: BLE001  (recorded; the comparison then says which side is missing)
        results[name] = {"gpus": gpus, "error": str(e)[-500:]}


def compare(a: list[dict], b: list[dict]) -> list[dict]:
    rows = []
    for i, (x, y) in enumerate(zip(a, b)):
        first = next((j for j, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t), None)
        if first is None and len(x["tokens"]) != len(y["tokens"]):
            first = min(len(x["tokens"]), len(y["tokens"]))
        row = {"prompt": i, "identical": x["text"] == y["text"] and first is None, "tokens": len(x["tokens"])}
        if first is not None:
            row.update(
                first_difference=first,
                margin_shipped=x["margins"][first] if first < len(x["margins"]) else None,
                margin_tp1=y["margins"][first] if first < len(y["margins"]) else None,
            )
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gpus-shipped", default="1,2")
    ap.add_argument("--gpus-tp1", default="0")
    ap.add_argument("--heldout", type=Path, default=ROOT / "artifacts/data/heldout.jsonl")
    args = ap.parse_args()
    out, bundle = args.out, args.bundle.resolve()
    out.mkdir(parents=True, exist_ok=True)
    verify(bundle)
    shipped = yaml.safe_load((bundle / "serve.yaml").read_text())
    if int(shipped.get(TP_KEY, 1)) < 2:
        raise SystemExit(f"{bundle}/serve.yaml: {TP_KEY} is {shipped.get(TP_KEY, 1)}; this compares a TP >= 2 bundle")
    model = json.loads((bundle / "engine_args.json").read_text())["served_model_name"]
    tokenizer = load_tokenizer(bundle / "model")
    prompts = [prompt_text(tokenizer, m)[0] for m in heldout_prompts(args.heldout)]
    with tempfile.TemporaryDirectory(prefix="tp-greedy-") as tmp:
        work = Path(tmp)
        for entry in bundle.iterdir():
            (work / entry.name).symlink_to(entry.resolve())
        (work / "serve-tp1.yaml").write_text(yaml.safe_dump({**shipped, TP_KEY: 1}, sort_keys=False))
        env, results = serve_env(bundle), {}
        threads = [
            threading.Thread(
                target=run_config, args=(name, work / cfg, work, gpus, env, out, model, prompts, args.tokens, results)
            )
            for name, cfg, gpus in (
                ("shipped", "serve.yaml", args.gpus_shipped),
                ("tp1", "serve-tp1.yaml", args.gpus_tp1),
            )
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    record = {
        "bundle": bundle.name,
        "tensor_parallel_size_shipped": int(shipped[TP_KEY]),
        "tokens": args.tokens,
        "prompts": len(prompts),
        "command": "python benchmarks/gpu/tp_greedy.py " + " ".join(sys.argv[1:]),
        "configs": {k: {f: v for f, v in r.items() if f != "outputs"} for k, r in results.items()},
    }
    if all("outputs" in results.get(k, {}) for k in ("shipped", "tp1")):
        rows = compare(results["shipped"]["outputs"], results["tp1"]["outputs"])
        record.update(
            identical=sum(r["identical"] for r in rows),
            rows=rows,
            outputs={k: [o["text"] for o in results[k]["outputs"]] for k in ("shipped", "tp1")},
        )
        print(
            f"RESULT {record['identical']}/{len(rows)} greedy outputs identical at TP {shipped[TP_KEY]} (shipped) "
            f"and TP 1",
            flush=True,
        )
    else:
        print("RESULT missing: " + json.dumps(record["configs"])[:600], flush=True)
    (out / "tp_greedy.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
