"""The serving benchmark's client path on CPU: the real `vllm bench serve` (vLLM 0.25's client), with the
command line, dataset and result parsing the serve_bench stage uses, against openai_cpu_server.py
(transformers on CPU; not vLLM, so no speed is claimed from it). Writes the client's raw result files to
benchmarks/cpu/raw/vllm-bench-serve/, which tests/test_serve_bench_parse.py parses in CI.

    VLLM_BENCH_PYTHON=/path/to/python-with-vllm python benchmarks/cpu/bench_client.py [OUT_DIR]

Needs a `dvc repro` of the demo first (artifacts/models/target, artifacts/data/heldout.jsonl). vLLM's
client imports on a CPU-only machine with `pip install --no-deps vllm==0.25.0` plus the modules it asks
for (benchmarks/cpu/README.md lists them).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.core.io import write_json  # noqa: E402
from pipeline.data.formatting import prompt_text  # noqa: E402
from pipeline.data.traffic import heldout_prompts  # noqa: E402
from pipeline.models.loading import load_tokenizer  # noqa: E402
from pipeline.serving import load_generator  # noqa: E402
from pipeline.serving.vllm_server import serve  # noqa: E402

RAW = ROOT / "benchmarks/cpu/raw/vllm-bench-serve"
SERVER = [sys.executable, str(ROOT / "benchmarks/cpu/openai_cpu_server.py")]
TARGET = ROOT / "artifacts/models/target"
RUNS = {"ok": 0, "failing": 3}  # fail-every: none, and every 3rd request answered with HTTP 500
LEVELS, PROMPTS, MAX_TOKENS = (1, 4), 8, 16


def main(out: Path) -> None:
    python = os.environ.get("VLLM_BENCH_PYTHON")
    if not python:
        sys.exit("set VLLM_BENCH_PYTHON to a Python that has vLLM 0.25 installed")
    client = [python, "-m", "vllm.entrypoints.cli.main"]
    tokenizer = load_tokenizer(TARGET)
    rendered = [prompt_text(tokenizer, m) for m in heldout_prompts(ROOT / "artifacts/data/heldout.jsonl")]
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dataset = tmp / "prompts.jsonl"
        load_generator.write_dataset(dataset, [text for text, _ in rendered])
        for run, fail_every in RUNS.items():
            config = tmp / f"serve-{run}.yaml"
            config.write_text(
                json.dumps({"model": str(TARGET), "served-model-name": "nimbus-support", "fail-every": fail_every})
            )
            with serve(config, tmp, tmp / f"server-{run}.log", 300, None, command=SERVER) as server:
                for c in LEVELS:
                    result = out / f"{run}-c{c}.json"
                    command = load_generator.bench_command(
                        client,
                        server.base_url,
                        load_generator.LoadSpec(
                            "nimbus-support",
                            TARGET,
                            dataset,
                            c,
                            PROMPTS,
                            MAX_TOKENS,
                            0.0,
                            rendered[0][1],
                            result,
                            warmups=1,
                        ),
                    )
                    level = load_generator.run_level(command, server.base_url, result, tmp / f"bench-{run}.log")
                    summary[f"{run}-c{c}"] = {
                        "completed": level.completed,
                        "failed": level.failed,
                        "errors": level.errors,
                    }
    write_json(out / "summary.json", summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if sys.argv[1:] else RAW)
