"""Serving-ready bundle: weights, draft, vLLM configs, model card and a hashed manifest."""
from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import yaml

from pipeline.io import atomic_write_text, read_json, write_json
from pipeline.manifest import write_manifest

LIBRARIES = ["torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval", "dvc", "vllm"]
# Prometheus counters vLLM 0.25 exports for speculative decoding (vllm/v1/spec_decode/metrics.py);
# the card tells on-call to watch them.
SPEC_METRICS = ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"]


def checkpoint_quantization(model_dir: Path) -> str | None:
    """The quant_method llm-compressor wrote into config.json (`compressed-tensors`), if any."""
    config = read_json(Path(model_dir) / "config.json")
    return (config.get("quantization_config") or {}).get("quant_method")


def engine_args(variant_spec: dict, serving: dict, k: int | None, has_draft: bool,
                quantization: str | None = None) -> dict:
    """Arguments for vllm.LLM(...) relative to the bundle directory."""
    args = {"model": "./model", "served_model_name": serving["name"], "max_model_len": serving["max_model_len"],
            "gpu_memory_utilization": serving["gpu_memory_utilization"], "max_num_seqs": serving["max_num_seqs"]}
    if quantization:
        args["quantization"] = quantization  # vLLM would detect it too; explicit fails fast on a wrong checkpoint
    if variant_spec.get("kv_cache") == "fp8":
        args["kv_cache_dtype"] = "fp8"  # per-tensor KV scales were calibrated into the checkpoint
    if has_draft and k:
        args["speculative_config"] = {"method": "draft_model", "model": "./draft", "num_speculative_tokens": k}
    return args


def serve_config(args: dict) -> dict:
    """`vllm serve --config serve.yaml` from the bundle directory.

    How vLLM 0.25 reads it (FlexibleArgumentParser.load_config_file in vllm/utils/argparse_utils.py):
    every top-level key becomes `--key value`; a nested mapping is json.dumps'ed into the option's
    JSON value, so `speculative-config` is written as a plain YAML mapping; `true` becomes a bare
    flag and `false` is dropped (so false/None are left out here rather than silently ignored there).
    `model` belongs in the file: with no positional model on the command line, `--model` from the
    config is used, so `vllm serve --config serve.yaml` needs nothing else; flags given on the
    command line after it win. (A JSON string value is accepted too, but older vLLMs are the only
    reason to prefer it.) tests/test_bundle.py::test_vllm_parses_serve_yaml checks, with vLLM
    installed, that the file parses into the same EngineArgs as engine_args.json.
    """
    return {key.replace("_", "-"): v for key, v in args.items() if v is not None and v is not False}


def provenance(params: dict) -> dict:
    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    lock = Path("dvc.lock")
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")),
            "dvc_lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else None,
            "params": params, "libraries": versions}


def _fmt(v, digits=4):
    return "n/a" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _fmt_measured(v) -> str:
    """A measured number, or a per-position list such as vLLM's acceptance by draft position."""
    return " / ".join(f"{a:.2f}" for a in v) if isinstance(v, list) else _fmt(v, 3)


def _counter(name: str) -> str:
    """Name on /metrics: prometheus_client exposes a counter with a `_total` suffix."""
    return f"{name}_total"


def model_card(variant: str, spec: dict, summary: dict, speculative: dict, gates: dict, quant: dict,
               serving: dict, gpu: dict) -> str:
    checks = "\n".join(f"| {c['check']} | {_fmt(c['value'])} | {c.get('op', '')} {c['threshold']} | "
                       f"{'pass' if c['passed'] else 'FAIL'} |" for c in gates["checks"])
    per_pos = " / ".join(f"{a:.2f}" for a in speculative["accepted_per_position"])
    k = speculative["num_speculative_tokens"]
    # vLLM's accepted/draft token ratio is E[accepted]/k; speculation beats plain decoding while
    # (1 + k*ratio) > (1 + k*cost), i.e. while the ratio stays above the draft/target cost ratio.
    expected_ratio = speculative["expected_accepted_tokens"] / k
    warning = ""
    if gates.get("allowed_failure"):
        warning = ("\n> **WARNING: this variant failed its release gates and was published with "
                   "`allow_fail`.** Do not deploy without a sign-off.\n")
    lm_rows = "\n".join(f"| {key.removeprefix('lm_eval_')} | {_fmt(v)} |" for key, v in summary.items()
                        if key.startswith("lm_eval_"))
    if "skipped" in gpu:
        gpu_text = f"not measured in this build ({gpu['skipped']})."
    else:
        gpu_text = "\n\n" + "\n".join(f"- {key}: {_fmt_measured(v)}" for key, v in gpu.items()
                                      if not isinstance(v, dict))
    return f"""# {serving['name']} — {variant}
{warning}
Quantized with llm-compressor ({spec['algorithm']}, scheme `{spec['scheme']}`), saved in compressed-tensors
format that vLLM loads natively. Size {quant['size_before_mb']} MB -> {quant['size_after_mb']} MB
(x{quant['compression_ratio']}). Served with a domain-tuned draft model for speculative decoding.

| path | what |
| --- | --- |
| `model/` | quantized target: safetensors, config, tokenizer, chat template |
| `draft/` | draft model (same tokenizer), fine-tuned on domain traffic |
| `serve.yaml` | `vllm serve --config` file: model, quantization, context, memory, KV cache, speculative decoding |
| `engine_args.json` | the same settings as keyword arguments of `vllm.LLM` |
| `MANIFEST.json` | sha256 and size of every file, plus provenance (git commit, dvc.lock, params, library versions) |

## 1. Verify the files

```bash
modelprep verify .        # or, without modelprep installed:
jq -r '.files | to_entries[] | "\\(.value.sha256)  \\(.key)"' MANIFEST.json | sha256sum --check --quiet
```

## 2. Serve

Paths in `serve.yaml` are relative (`./model`, `./draft`): start vLLM from this directory.

```bash
cd <this bundle>
vllm serve --config serve.yaml --host 0.0.0.0 --port 8000   # command-line flags override the file
curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{{"model": "{serving['name']}", "messages": [{{"role": "user", "content": "Hello"}}]}}'
```

`serve.yaml` writes `speculative-config` as a YAML mapping, which `vllm serve --config` turns into its
JSON value (vLLM 0.25). An older vLLM that rejects it takes the same settings on the command line:
`vllm serve ./model --speculative-config "$(jq -c .speculative_config engine_args.json)" ...`.

Python, from this directory:

```python
import json, vllm
llm = vllm.LLM(**json.load(open("engine_args.json")))
```

## 3. Quality on held-out domain traffic (vs. the unquantized target)

| metric | value |
| --- | --- |
| perplexity (baseline) | {_fmt(summary['perplexity_baseline'])} |
| perplexity (this variant) | {_fmt(summary['perplexity'])} |
| perplexity increase % | {_fmt(summary['perplexity_increase_pct'], 3)} |
| KL divergence (baseline ‖ variant) | {_fmt(summary['kl_divergence'], 5)} |
| top-1 agreement | {_fmt(summary['top1_agreement'])} |
| greedy match (first tokens) | {_fmt(summary['greedy_match'])} |
{lm_rows}

## 4. Speculative decoding

- Draft: `draft/`, fine-tuned on domain traffic distilled from the target.
- CPU-estimated acceptance rate (temperature {speculative['temperature']}): {_fmt(speculative['acceptance_rate'], 3)}
- Acceptance per draft position (P(at least j accepted), j = 1..{len(speculative['accepted_per_position'])}): {per_pos}
- Chosen `num_speculative_tokens`: {k}; expected accepted tokens per step {_fmt(speculative['expected_accepted_tokens'], 2)},
  expected speedup x{_fmt(speculative['expected_speedup'], 2)} (draft/target cost ratio {_fmt(speculative['cost_ratio'], 3)})

Measured on GPU with vLLM: {gpu_text}

## 5. Release gates

| check | value | threshold | verdict |
| --- | --- | --- | --- |
{checks}

## 6. Pre-deployment checklist

- [ ] Domain benchmark: re-run the held-out evaluation on this week's traffic; quality within the gates above.
- [ ] Latency thresholds: p50/p99 time-to-first-token and inter-token latency at the expected concurrency
  (`vllm bench serve` against the running server), and the same run without `speculative-config` to confirm the gain.
- [ ] Cold start: send a few warm-up requests before taking traffic (CUDA graphs, compilation and caches are built
  on first use); the readiness probe is `GET /health`.
- [ ] Acceptance-rate monitoring: vLLM exports on `/metrics` {', '.join(f'`{_counter(m)}`' for m in SPEC_METRICS)}
  (Prometheus metric families {', '.join(f'`{m}`' for m in SPEC_METRICS)}). Track
  `rate(vllm:spec_decode_num_accepted_tokens_total[5m]) / rate(vllm:spec_decode_num_draft_tokens_total[5m])`:
  expected {expected_ratio:.2f} from the held-out estimate; investigate below {0.8 * expected_ratio:.2f};
  below {_fmt(speculative['cost_ratio'], 2)} (the draft/target cost ratio) speculation is slower than plain decoding:
  lower `num_speculative_tokens` or remove `speculative-config`.
- [ ] Rollback: keep the previous registry version deployable.
"""


def build_bundle(out: Path, variant: str, model_dir: Path, draft_dir: Path | None, args: dict, card: str,
                 params: dict) -> dict:
    # Real copies, not hard links: a bundle must not change when its sources do.
    shutil.copytree(model_dir, out / "model")
    if draft_dir is not None:
        shutil.copytree(draft_dir, out / "draft")
    atomic_write_text(out / "serve.yaml", yaml.safe_dump(serve_config(args), sort_keys=False))
    write_json(out / "engine_args.json", args)
    atomic_write_text(out / "README.md", card)
    return write_manifest(out, {"variant": variant, **provenance(params)})
