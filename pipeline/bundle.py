"""Serving-ready bundle: weights, draft, vLLM configs, model card and a hashed manifest."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path

import yaml

from pipeline.io import atomic_write_text, write_json
from pipeline.manifest import write_manifest

LIBRARIES = ["torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval", "dvc", "vllm"]
# Prometheus metrics vLLM exports for speculative decoding; the card tells on-call to watch them.
SPEC_METRICS = ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"]


def engine_args(variant_spec: dict, serving: dict, k: int | None, has_draft: bool) -> dict:
    """Arguments for vllm.LLM(...) relative to the bundle directory."""
    args = {"model": "./model", "served_model_name": serving["name"], "max_model_len": serving["max_model_len"],
            "gpu_memory_utilization": serving["gpu_memory_utilization"], "max_num_seqs": serving["max_num_seqs"]}
    if variant_spec.get("kv_cache") == "fp8":
        args["kv_cache_dtype"] = "fp8"  # per-tensor KV scales were calibrated into the checkpoint
    if has_draft and k:
        args["speculative_config"] = {"method": "draft_model", "model": "./draft", "num_speculative_tokens": k}
    return args


def serve_config(args: dict) -> dict:
    """`vllm serve --config serve.yaml`: CLI option names; JSON-valued options as JSON strings."""
    return {key.replace("_", "-"): json.dumps(v) if isinstance(v, dict) else v for key, v in args.items()}


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


def model_card(variant: str, spec: dict, summary: dict, speculative: dict, gates: dict, quant: dict,
               serving: dict, gpu: dict) -> str:
    checks = "\n".join(f"| {c['check']} | {_fmt(c['value'])} | {c.get('op', '')} {c['threshold']} | "
                       f"{'pass' if c['passed'] else 'FAIL'} |" for c in gates["checks"])
    per_pos = " / ".join(f"{a:.2f}" for a in speculative["accepted_per_position"])
    warning = ""
    if gates.get("allowed_failure"):
        warning = ("\n> **WARNING: this variant failed its release gates and was published with "
                   "`allow_fail`.** Do not deploy without a sign-off.\n")
    lm_rows = "\n".join(f"| {k.removeprefix('lm_eval_')} | {_fmt(v)} |" for k, v in summary.items()
                        if k.startswith("lm_eval_"))
    if "skipped" in gpu:
        gpu_text = f"Not measured in this build ({gpu['skipped']})."
    else:
        gpu_text = "\n".join(f"- {k}: {_fmt(v, 3)}" for k, v in gpu.items() if not isinstance(v, (dict, list)))
    return f"""# {serving['name']} — {variant}
{warning}
Quantized with llm-compressor ({spec['algorithm']}, scheme `{spec['scheme']}`), saved in compressed-tensors
format that vLLM loads natively. Size {quant['size_before_mb']} MB -> {quant['size_after_mb']} MB
(x{quant['compression_ratio']}).

## Serve

```bash
cd <this bundle>
vllm serve --config serve.yaml          # OpenAI-compatible server, speculative decoding on
```

Python: `vllm.LLM(**json.load(open("engine_args.json")))` from this directory.

## Quality on held-out domain traffic (vs. the unquantized target)

| metric | value |
| --- | --- |
| perplexity (baseline) | {_fmt(summary['perplexity_baseline'])} |
| perplexity (this variant) | {_fmt(summary['perplexity'])} |
| perplexity increase % | {_fmt(summary['perplexity_increase_pct'], 3)} |
| KL divergence (baseline ‖ variant) | {_fmt(summary['kl_divergence'], 5)} |
| top-1 agreement | {_fmt(summary['top1_agreement'])} |
| greedy match (first tokens) | {_fmt(summary['greedy_match'])} |
{lm_rows}

## Speculative decoding

- Draft: `draft/`, fine-tuned on domain traffic distilled from the target.
- CPU-estimated acceptance rate (temperature {speculative['temperature']}): {_fmt(speculative['acceptance_rate'], 3)}
- Acceptance per position (P(at least j accepted)): {per_pos}
- Chosen `num_speculative_tokens`: {speculative['num_speculative_tokens']}, expected speedup
  x{_fmt(speculative['expected_speedup'], 2)} (draft/target cost ratio {_fmt(speculative['cost_ratio'], 3)})

Measured on GPU with vLLM: {gpu_text}

## Release gates

| check | value | threshold | verdict |
| --- | --- | --- | --- |
{checks}

## Pre-deployment checklist

- [ ] Domain benchmark: re-run the held-out evaluation on this week's traffic; quality within the gates above.
- [ ] Latency thresholds: p50/p99 time-to-first-token and inter-token latency at the expected concurrency.
- [ ] Cold start: warm up (a few requests) before taking traffic; CUDA graphs and caches are built lazily.
- [ ] Acceptance monitoring: alert when `accepted / draft tokens` drops below 0.6, where speculation stops paying.
  Prometheus metrics: {', '.join(f'`{m}`' for m in SPEC_METRICS)}.
- [ ] Rollback: keep the previous registry version deployable.

`MANIFEST.json` lists the sha256 of every file and the provenance (git commit, dvc.lock, params, library
versions); check it with `modelprep verify <bundle>`.
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
