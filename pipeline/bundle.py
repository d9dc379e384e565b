"""Serving-ready bundle: weights, draft, vLLM configs, model card and a hashed manifest."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import jinja2
import yaml

from pipeline.acceptance import SpeculativeEstimate
from pipeline.gates import VariantVerdict
from pipeline.io import atomic_write_text, read_json, write_json
from pipeline.manifest import write_manifest
from pipeline.publish import EVAL, GATE
from pipeline.recipes import VariantSpec
from pipeline.vllm_spec import VllmMeasurement

CARD_TEMPLATE = "model_card.md.j2"  # pipeline/templates/
PROVENANCE = "PROVENANCE.json"

LIBRARIES = ["torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval", "dvc", "vllm"]
# Prometheus counters vLLM 0.25 exports for speculative decoding (vllm/v1/spec_decode/metrics.py);
# the card tells on-call to watch them.
SPEC_METRICS = ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"]


def checkpoint_quantization(model_dir: Path) -> str | None:
    """The quant_method llm-compressor wrote into config.json (`compressed-tensors`), if any."""
    config = read_json(Path(model_dir) / "config.json")
    return (config.get("quantization_config") or {}).get("quant_method")


def engine_args(variant_spec: VariantSpec, serving: dict, k: int | None, has_draft: bool,
                quantization: str | None = None) -> dict:
    """Arguments for vllm.LLM(...) relative to the bundle directory."""
    args = {"model": "./model", "served_model_name": serving["name"], "max_model_len": serving["max_model_len"],
            "gpu_memory_utilization": serving["gpu_memory_utilization"], "max_num_seqs": serving["max_num_seqs"]}
    if quantization:
        args["quantization"] = quantization  # vLLM would detect it too; explicit fails fast on a wrong checkpoint
    if variant_spec.kv_cache == "fp8":
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


def provenance(spec: VariantSpec, serving: dict, sources: dict) -> dict:
    """How the bundle was built, from what the bundle stage declares to DVC (so it is never stale):
    the recipe, the serving params (credentials removed) and the model sources' content hashes.
    No absolute paths of the machine that built it."""
    from pipeline.redact import redact_params

    def git(*cmd):
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")),
            "variant": spec.name, "recipe": dataclasses.asdict(spec), "serving": redact_params(serving),
            "sources": redact_params(sources), "libraries": versions}


def _num(v, digits: int = 4, signed: bool = False) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    return str(v)


def _counter(name: str) -> str:
    """Name on /metrics: prometheus_client exposes a counter with a `_total` suffix."""
    return f"{name}_total"


def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.PackageLoader("pipeline", "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["num"] = _num
    env.filters["per_position"] = lambda values: " / ".join(f"{a:.2f}" for a in values or []) or "n/a"
    return env.get_template(CARD_TEMPLATE)


def model_card(variant: str, spec: VariantSpec, summary: dict, est: SpeculativeEstimate, verdict: VariantVerdict,
               quant: dict, serving: dict, gpu: VllmMeasurement) -> str:
    """The bundle's README.md, rendered from pipeline/templates/model_card.md.j2."""
    return _template().render(
        variant=variant, spec=spec, summary=summary, est=est, verdict=verdict, quant=quant, serving=serving, gpu=gpu,
        failed_checks=[f"{c.check} ({c.describe()})" for c in verdict.checks if not c.passed],
        lm_eval=[(k.removeprefix("lm_eval_"), v) for k, v in summary.items() if k.startswith("lm_eval_")],
        spec_counters=[f"`{_counter(m)}`" for m in SPEC_METRICS])


def build_bundle(out: Path, variant: str, model_dir: Path, draft_dir: Path, args: dict, card: str,
                 provenance_record: dict, verdict: VariantVerdict, summary: dict) -> dict:
    # Real copies, not hard links: a bundle must not change when its sources do.
    shutil.copytree(model_dir, out / "model")
    shutil.copytree(draft_dir, out / "draft")
    atomic_write_text(out / "serve.yaml", yaml.safe_dump(serve_config(args), sort_keys=False))
    write_json(out / "engine_args.json", args)
    atomic_write_text(out / "README.md", card)
    write_json(out / PROVENANCE, provenance_record)
    write_json(out / GATE, dataclasses.asdict(verdict))  # publish re-checks it against the current gate run
    write_json(out / EVAL, summary)
    return write_manifest(out, {"variant": variant})
