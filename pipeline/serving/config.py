"""The serving configuration a bundle ships, rendered from one source for the bundle and for the
serving benchmark, so that what was measured is byte for byte what ships."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from pipeline.core.io import read_json
from pipeline.core.names import registry_name
from pipeline.drafts.methods import Speculation, speculative_config
from pipeline.drafts.settings import DraftParams
from pipeline.quantize.hardware import kernel_env
from pipeline.quantize.recipes import VariantSpec
from pipeline.serving.settings import ServingParams


def checkpoint_quantization(model_dir: Path) -> str | None:
    """The quant_method llm-compressor wrote into config.json (`compressed-tensors`), if any."""
    config = read_json(Path(model_dir) / "config.json")
    return (config.get("quantization_config") or {}).get("quant_method")


def served_model_name(serving: ServingParams, variant: str) -> str:
    """The name a variant is served as (vLLM's --served-model-name, the `model_name` label of its metrics, the
    `model` of a request): its registry name, `<serving.name>-<variant>`, so two variants deployed side by side
    answer, and are measured and alerted on, apart."""
    return registry_name(serving.name, variant)


def engine_args(
    variant_spec: VariantSpec,
    serving: ServingParams,
    speculative_config: dict | None,
    quantization: str | None = None,
    tier_engine: dict | None = None,
) -> dict:
    """Arguments for vllm.LLM(...) relative to the bundle directory; speculative_config from
    speculative_config_for (None: no speculative decoding). tier_engine: a serving tier's engine
    overrides (pipeline/serving/tiers.py ENGINE_KEYS)."""
    args = {
        "model": "./model",
        "served_model_name": served_model_name(serving, variant_spec.name),
        "max_model_len": serving.max_model_len,
        "gpu_memory_utilization": serving.gpu_memory_utilization,
        "max_num_seqs": serving.max_num_seqs,
        # always written, 1 too: the file says how many GPUs it needs, as the manifest requests them
        "tensor_parallel_size": serving.tensor_parallel_size,
    }
    args.update(tier_engine or {})
    if quantization:
        args["quantization"] = quantization  # vLLM would detect it too; explicit fails fast on a wrong checkpoint
    if variant_spec.kv_cache == "fp8":
        args["kv_cache_dtype"] = "fp8"  # per-tensor KV scales were calibrated into the checkpoint
    if speculative_config:
        args["speculative_config"] = speculative_config
    return args


def speculative_config_for(spec: Speculation, draft: DraftParams, serving: ServingParams) -> dict | None:
    """methods.speculative_config with params.yaml's settings (draft.ngram,
    serving.speculation.draft_tensor_parallel_size): the one call the bundle and serve_bench render through, so both
    write the same file."""
    ngram = dataclasses.asdict(draft.ngram) if draft.ngram is not None else None
    return speculative_config(spec, ngram, serving.speculation.draft_tensor_parallel_size)


def serve_config(args: dict) -> dict:
    """`vllm serve --config serve.yaml` from the bundle directory.

    How vLLM 0.26 reads it (FlexibleArgumentParser.load_config_file in vllm/utils/argparse_utils.py):
    every top-level key becomes `--key value`; a nested mapping is json.dumps'ed into the option's
    JSON value, so `speculative-config` is written as a plain YAML mapping; `true` becomes a bare
    flag and `false` is dropped (so false/None are left out here rather than silently ignored there).
    `model` belongs in the file: with no positional model on the command line, `--model` from the
    config is used, so `vllm serve --config serve.yaml` needs nothing else; flags given on the
    command line after it win. (A JSON string value is accepted too, but older vLLMs are the only
    reason to prefer it.) tests/release/test_bundle.py::test_vllm_parses_serve_yaml checks, with vLLM
    installed, that the file parses into the same EngineArgs as engine_args.json.
    """
    return {key.replace("_", "-"): v for key, v in args.items() if v is not None and v is not False}


def serve_yaml(args: dict) -> str:
    return yaml.safe_dump(serve_config(args), sort_keys=False)


def server_env(
    spec: VariantSpec, serving: ServingParams, measured_kernel_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The server's environment for this variant, as serve_bench measures it and the bundle ships it
    (serve.env, the manifests): the kernel choice serve_bench measured faster (measured_kernel_env; None: not
    measured, kernel_env's default), with serving.env over it (the user's setting wins)."""
    kernel = kernel_env(spec, serving.gpu) if measured_kernel_env is None else measured_kernel_env
    return {**kernel, **user_env(serving)}


def user_env(serving: ServingParams) -> dict[str, str]:
    return {k: str(v) for k, v in serving.env.items()}


def serve_env(env: dict) -> str:
    """serve.env: `KEY=value` lines for the server's environment (`env $(cat serve.env) vllm serve ...`)."""
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
