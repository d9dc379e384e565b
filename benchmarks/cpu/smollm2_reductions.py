"""What the smollm2 profile's cut sizes cost (issue #29 item 5), measured in a workspace built by
benchmarks/cpu/smollm2_build.sh: each reduction is set back to params.yaml's default alone, the stages it feeds
re-run directly (python -m stages.<stage>, in the workspace, with its own pipeline/), and the metric it moves read
beside the profile's value from the build (benchmarks/cpu/raw/smollm2/metrics/). params.yaml is restored after
each; later runs see the earlier runs' artifacts only where they do not read them.

    python benchmarks/cpu/smollm2_reductions.py WORKSPACE [--only gptq_calibration,draft_epochs,eagle3_steps]
        writes benchmarks/cpu/raw/smollm2/reductions.json (runs already in it are kept unless re-run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

RAW = Path(__file__).resolve().parent / "raw" / "smollm2"


def _gptq(p: dict) -> None:
    p["quantize"]["variants"]["gptq-w4a16"]["num_samples"] = 256  # the default: every calibration row there is


def _epochs(p: dict) -> None:
    p["draft_training"]["epochs"] = 3


def _eagle3(p: dict) -> None:
    p["draft"]["eagle3"]["train_steps"] = 100  # toward the default 150: at about 7 s a step on the shared CPU


RUNS = {
    "gptq_calibration": {
        "reduction": "GPTQ calibration: 16 samples -> 256 (all the calibration split's rows)",
        "edit": _gptq,
        "stages": [("quantize", "gptq-w4a16"), ("evaluate", "gptq-w4a16")],
        "metrics": [
            ("eval-gptq-w4a16.json", "perplexity_increase_pct"),
            ("eval-gptq-w4a16.json", "kl_divergence"),
            ("eval-gptq-w4a16.json", "top1_agreement"),
            ("quantize-gptq-w4a16.json", "calibration_samples"),
        ],
    },
    "draft_epochs": {
        "reduction": "draft fine-tune: 1 epoch -> 3 (the default)",
        "edit": _epochs,
        "stages": [("draft_finetune",), ("draft_quantize",), ("evaluate_draft",)],
        "metrics": [
            ("draft.json", "accepted_per_draft_token_finetuned"),
            ("draft_training.json", "eval_loss_finetuned"),
            ("draft_training.json", "train_steps"),
        ],
    },
    "eagle3_steps": {
        "reduction": "EAGLE-3 head: 40 steps -> 100 (default 150)",
        "edit": _eagle3,
        "stages": [("eagle3",), ("evaluate", "bf16")],
        "metrics": [("eval-bf16.json", "methods.eagle3.accepted_per_draft_token"), ("eagle3.json", "final_loss")],
    },
}


def metric(path: Path, key: str):
    """A metrics file's value: a top-level key, or methods.<method>.<key> (evaluate's per-method list)."""
    data = json.loads(path.read_text())
    if key.startswith("methods."):
        _, method, name = key.split(".", 2)
        return next((m.get(name) for m in data.get("methods", []) if m["method"] == method), None)
    return data.get(key)


def stage_times() -> dict[str, float]:
    return {s["stage"]: s["s"] for s in json.loads((RAW / "build.json").read_text())["stages"]}


def run_one(workspace: Path, name: str) -> dict:
    spec = RUNS[name]
    params_path = workspace / "params.yaml"
    saved = params_path.read_text()
    params = yaml.safe_load(saved)
    spec["edit"](params)
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(workspace)}
    t0 = time.time()
    try:
        for stage in spec["stages"]:
            r = subprocess.run(
                [sys.executable, "-m", f"stages.{stage[0]}", *stage[1:]],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise SystemExit(f"{name}: stages.{stage[0]} failed: {r.stderr.strip().splitlines()[-1:]}")
    finally:
        params_path.write_text(saved)
    built = stage_times()
    keys = ["@".join(s) for s in spec["stages"]]
    return {
        "name": name,
        "reduction": spec["reduction"],
        "default_s": round(time.time() - t0, 1),
        "reduced_s": round(sum(built.get(k, 0.0) for k in keys), 1),
        "stages": keys,
        "values": [
            {
                "metric": f"{file.removesuffix('.json')}: {key}",
                "reduced": metric(RAW / "metrics" / file, key),
                "default": metric(workspace / "metrics" / file, key),
            }
            for file, key in spec["metrics"]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--only", default=",".join(RUNS))
    args = parser.parse_args()
    out = RAW / "reductions.json"
    record = json.loads(out.read_text()) if out.exists() else {"runs": []}
    for name in args.only.split(","):
        load_start = list(os.getloadavg())
        result = run_one(args.workspace.resolve(), name)
        result["load_start"], result["load_end"] = (
            [round(x, 2) for x in load_start],
            [round(x, 2) for x in os.getloadavg()],
        )
        record["runs"] = [r for r in record["runs"] if r["name"] != name] + [result]
        record["date"] = time.strftime("%Y-%m-%d %H:%M")
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(result))


if __name__ == "__main__":
    main()
