"""Shared fixtures: a tiny demo model pair and a throwaway copy of the project for `dvc repro`."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

# Under `-n auto` two workers share the 2 cores and each starts stage processes: one math thread per process
# keeps them from oversubscribing the cores (the tiny models gain nothing from a second one). Set before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

import pytest  # noqa: E402
import yaml  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for a hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TQDM_MININTERVAL", "10")

# Small enough that the whole pipeline runs in a couple of minutes on 2 cores, with hidden
# sizes that are multiples of 128 so INT4 group-128 recipes still apply.
TINY_OVERRIDES = {
    "demo": {"domain_rows": 800, "general_sentences": 800, "vocab_size": 1024,
             "target": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,  # 3: an EAGLE-3 head's aux layers
                        "num_attention_heads": 2, "num_key_value_heads": 1, "train_steps": 60, "lr": 0.004},
             "draft": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "num_key_value_heads": 1, "train_steps": 30, "lr": 0.004,
                       "domain_share": 0.02}},
    # The whole-pipeline builds cover the baseline, calibrated FP8 with KV-cache scales and GPTQ INT4 (every
    # variant, AWQ and FP8-dynamic too, is quantized and reloaded in test_quantize.py): CI's time budget.
    "quantize": {"enabled": ["bf16", "fp8-static", "gptq-w4a16"],
                 "calibration": {"num_samples": 16, "max_seq_length": 256}},
    "draft_training": {"epochs": 2, "max_new_tokens": 48},
    "draft": {"eagle3": {"train_steps": 20, "batch_size": 4}},
    "evaluate": {"heldout_limit": 16, "greedy_prompts": 6, "lm_eval": {"limit": 8},
                 "acceptance": {"prompts": 6, "continuation_tokens": 16}},
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


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of a tiny trained demo pair, built once per test session."""
    from pipeline.models.demo.models import build_demo_pair
    from pipeline.models.settings import DemoParams

    root = tmp_path_factory.mktemp("demo")
    build_demo_pair(root / "target", root / "draft", DemoParams.parse(tiny_params()["demo"]))
    return root / "target", root / "draft"


def copy_project(dest: Path, params: dict | None = None) -> Path:
    """A git+DVC checkout of the project's pipeline files in dest, with its own params."""
    for name in ("dvc.yaml", "pyproject.toml", ".dvcignore"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("pipeline", "stages", "evals", "data", ".dvc"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"))
    (dest / "params.yaml").write_text(yaml.safe_dump(params or tiny_params(), sort_keys=False))
    (dest / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=dest, check=True)
    return dest


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kw)


def choose_k(per_position: list[float], cost_ratio: float) -> tuple[int, dict[int, float]]:
    """The pipeline's k choice (acceptance.best_k) when every k sees these per-position rates."""
    from pipeline.evaluate.acceptance import best_k

    return best_k({k: sum(per_position[:k]) for k in range(1, len(per_position) + 1)}, cost_ratio)


class Interrupt(TrainerCallback):
    """Stops the run like a killed process, right after its first checkpoint is on disk."""

    def on_save(self, args, state, control, **kwargs):
        raise KeyboardInterrupt


class RecordStart(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step


def pytest_collection_modifyitems(config, items):
    """Slow tests (whole `dvc repro` builds) first: with `-n auto --dist loadfile` their file starts on one worker
    while the rest of the suite fills the other, instead of starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
