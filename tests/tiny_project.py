"""The project at test size: the tiny demo's params and a throwaway git+DVC copy of the project to run stages in."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# Small enough that the whole pipeline runs in a couple of minutes on 2 cores, with hidden
# sizes that are multiples of 128 so INT4 group-128 recipes still apply.
TINY_OVERRIDES = {
    "demo": {
        "domain_rows": 800,
        "general_sentences": 800,
        "vocab_size": 1024,
        "target": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 3,  # 3: an EAGLE-3 head's aux layers
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "train_steps": 60,
            "lr": 0.004,
        },
        "draft": {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "train_steps": 30,
            "lr": 0.004,
            "domain_share": 0.02,
        },
    },
    # The whole-pipeline builds cover the baseline, calibrated FP8 with KV-cache scales and GPTQ INT4 (every
    # variant, AWQ and FP8-dynamic too, is quantized and reloaded in test_quantize.py): CI's time budget.
    "quantize": {
        "enabled": ["bf16", "fp8-static", "gptq-w4a16"],
        "calibration": {"num_samples": 16, "max_seq_length": 256},
    },
    "draft_training": {"epochs": 2, "max_new_tokens": 48},
    "draft": {"eagle3": {"train_steps": 20, "batch_size": 4}},
    "evaluate": {
        "heldout_limit": 16,
        "greedy_prompts": 6,
        "lm_eval": {"limit": 8},
        "acceptance": {"prompts": 6, "continuation_tokens": 16},
    },
    # The tiny pair is barely trained: its held-out perplexity is not what the demo's absolute gate is for.
    "gates": {"thresholds": {"max_heldout_perplexity": 1000.0}},
}


def merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_params(**overrides) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    return merge(merge(params, TINY_OVERRIDES), overrides)


def tiny_serving(**overrides):
    """tiny_params' serving section, typed (ServingParams), with overrides merged into it as written, and resolved as
    the stages hold it (serving_of)."""
    return serving_of(tiny_params(serving=overrides))


def serving_of(params: dict):
    """params' serving section, typed, with `auto` tensor parallelism resolved as a stage resolves it for a variant of
    the tiny demo: 1 (pipeline/serving/parallelism.py; test_parallelism.py checks the demo decides 1)."""
    from pipeline.serving.parallelism import resolved
    from pipeline.serving.settings import AUTO_TP, ServingParams

    serving = ServingParams.parse(params["serving"])
    return resolved(serving, 1) if serving.tensor_parallel_size == AUTO_TP else serving


def publish_settings(**section):
    """A publish section, typed (PublishParams): the local backend, unless section says otherwise."""
    from pipeline.release.settings import PublishParams

    return PublishParams.parse({"backend": "local", "registry_dir": "registry", "version": "auto", **section})


def copy_project(dest: Path, params: dict | None = None) -> Path:
    """A git+DVC checkout of the project's pipeline files in dest, with its own params."""
    for name in ("dvc.yaml", "pyproject.toml", ".dvcignore"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("pipeline", "stages", "evals", "data", ".dvc"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"))
    (dest / "params.yaml").write_text(yaml.safe_dump(params or tiny_params(), sort_keys=False))
    (dest / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"],
    ):
        subprocess.run(cmd, cwd=dest, check=True)
    return dest


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kw)


def demo_prompts(model_dir: Path, n: int) -> list[list[int]]:
    """The first n demo-traffic conversations' prompts, as token ids for model_dir's tokenizer."""
    from pipeline.data.formatting import prompt_ids, row_to_messages, split_prompt_response
    from pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    lines = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:n]
    return [prompt_ids(tokenizer, split_prompt_response(row_to_messages(json.loads(line)))[0]) for line in lines]
