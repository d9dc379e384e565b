"""What a `vllm bench serve` level costs beyond its load: a fresh client process per level vs the kept worker.

    VLLM_BENCH_PYTHON=/path/to/python-with-vllm python benchmarks/cpu/bench_worker_cost.py   # measure (CPU)
    python benchmarks/cpu/bench_worker_cost.py --render                                      # markdown only

Measure: a tiny ChatML Llama (tests/tiny_chatml.py, random weights) served by benchmarks/cpu/openai_cpu_server.py
(transformers on CPU; not vLLM, so no serving speed is claimed), then LEVELS sweep levels of the serve_bench
stage's own command line (load_generator.bench_command: PROMPTS prompts, MAX_TOKENS tokens, one warm-up request)
run twice: each level as its own `vllm bench serve` process (how the stage ran them until this script's commit)
and each level sent to one kept bench worker (pipeline/serving/bench_worker.py, how run_level runs them now).
Each level's wall time from the call to its parsed result, and the load's own duration as the client measured
it, go to raw/bench-worker/cpu.json.

The H100 side needs no new run: every `vllm bench serve` result records when it was saved (`date`) and how long
its load ran (`duration`), so the seconds between two consecutive levels of one served config, less the later
level's duration, are what a level cost beyond its load there; read from the SmolLM2 run's raw results
(benchmarks/gpu/raw/smollm2-gpu/, before this change).

Render: BENCH-WORKER.md from those raw files alone (tests/project/test_benchmark_docs.py checks it).
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks/cpu/raw/bench-worker/cpu.json"
GPU_RAW = ROOT / "benchmarks/gpu/raw/smollm2-gpu/serve/bf16/raw"
MARKDOWN = ROOT / "benchmarks/cpu/BENCH-WORKER.md"
LEVELS, PROMPTS, MAX_TOKENS = 6, 4, 8
PROMPT_TEXTS = ["how do I reset my password", "the quick brown fox", "a draft model predicts tokens", "hello world"]


def measure(python: str) -> dict:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from pipeline.serving import load_generator
    from pipeline.serving.vllm_server import serve
    from tiny_chatml import chatml_tokenizer, save_checkpoint, tiny_llama

    client = [python, "-m", load_generator.VLLM_MODULE]
    server = [sys.executable, str(ROOT / "benchmarks/cpu/openai_cpu_server.py")]
    runs: dict[str, list[dict]] = {"process": [], "worker": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer = chatml_tokenizer()
        model_dir = save_checkpoint(tmp / "model", tiny_llama(tokenizer, layers=2, tied=True), tokenizer)
        dataset = tmp / "prompts.jsonl"
        load_generator.write_dataset(
            dataset,
            [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
                )
                for t in PROMPT_TEXTS
            ],
        )
        config = tmp / "serve.yaml"
        config.write_text(json.dumps({"model": str(model_dir), "served-model-name": "tiny", "fail-every": 0}))
        with serve(config, tmp, tmp / "server.log", 300, None, command=server) as handle:
            for mode in runs:
                for i in range(LEVELS):
                    result = tmp / f"{mode}-{i}.json"
                    command = load_generator.bench_command(
                        client,
                        handle.base_url,
                        load_generator.LoadSpec(
                            "tiny", model_dir, dataset, 1, PROMPTS, MAX_TOKENS, 0.0, False, result, warmups=1
                        ),
                    )
                    log = tmp / f"bench-{mode}.log"
                    start = time.perf_counter()
                    if mode == "process":  # the stage's earlier path: one client process per level
                        with open(log, "a") as out:
                            subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
                        level = load_generator.parse_result(json.loads(result.read_text()), str(result))
                    else:
                        level = load_generator.run_level(command, handle.base_url, result, log)
                    wall = time.perf_counter() - start
                    runs[mode].append(
                        {
                            "wall_s": round(wall, 3),
                            "load_s": round(level.duration_s, 3),
                            "completed": level.completed,
                            "failed": level.failed,
                        }
                    )
                    print(f"{mode} level {i}: {wall:.2f} s (load {level.duration_s:.2f} s)", flush=True)
            load_generator.close_workers()
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "vllm_client": version,
        "levels": LEVELS,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": runs,
    }


def gpu_gaps() -> list[dict]:
    """Per served config of the H100 run: consecutive levels' save times and durations (see the module doc)."""
    levels: dict[str, list[tuple[datetime.datetime, float, str]]] = {}
    for path in sorted(GPU_RAW.glob("*.json.gz")):
        raw = json.loads(gzip.decompress(path.read_bytes()))
        config, tag = path.name.removesuffix(".json.gz").split("-", 1)
        saved = datetime.datetime.strptime(raw["date"], "%Y%m%d-%H%M%S")
        levels.setdefault(config, []).append((saved, float(raw["duration"]), tag))
    rows = []
    for config, found in sorted(levels.items()):
        found.sort()
        for (before, _, _), (after, duration, tag) in zip(found, found[1:]):
            gap = (after - before).total_seconds()
            rows.append(
                {"config": config, "level": tag, "gap_s": gap, "load_s": duration, "beyond_load_s": gap - duration}
            )
    return rows


def render() -> str:
    cpu = json.loads(RAW.read_text())
    gpu = gpu_gaps()
    lines = [
        "# A serving benchmark level's fixed cost: a client process per level vs the kept worker",
        "",
        "Rendered by `benchmarks/cpu/bench_worker_cost.py --render` from `benchmarks/cpu/raw/bench-worker/cpu.json`"
        " and the `vllm bench serve` results in `benchmarks/gpu/raw/smollm2-gpu/serve/bf16/raw/`.",
        "",
        "## On the H100 host, before the change (one client process per level)",
        "",
        "Seconds between two consecutive levels of one served config (each result's save time), the later level's "
        "load as the client timed it, and the rest: what starting `vllm bench serve` for that level cost (import, "
        "tokenizer, the single-prompt check, warm-up requests). The save times have one-second resolution.",
        "",
        "| config | level | between saves s | load s | beyond the load s |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{r['config']}` | {r['level']} | {r['gap_s']:.0f} | {r['load_s']:.2f} | {r['beyond_load_s']:.1f} |"
        for r in gpu
    ]
    beyond = [r["beyond_load_s"] for r in gpu]
    lines += [
        "",
        f"Median beyond the load: {statistics.median(beyond):.1f} s per level over {len(beyond)} level "
        f"pairs (range {min(beyond):.1f}-{max(beyond):.1f} s), where the load itself ran "
        f"{min(r['load_s'] for r in gpu):.2f}-{max(r['load_s'] for r in gpu):.2f} s.",
        "",
    ]
    runs = cpu["runs"]
    lines += [
        "## On the CPU machine, both paths in one run",
        "",
        f"{cpu['machine']}, Python {cpu['python']}, vLLM {cpu['vllm_client']}'s client, {cpu['date']}, load average "
        f"{cpu['loadavg_1m_after']} after the run (other jobs shared the cores). The server is "
        "`openai_cpu_server.py` with a tiny random-weight model: no serving speed is claimed, only each level's "
        f"wall time around the same load ({cpu['prompts']} prompts, {cpu['max_tokens']} tokens, concurrency 1, "
        "one warm-up request).",
        "",
        "| level | process per level: wall s | load s | kept worker: wall s | load s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for i, (a, b) in enumerate(zip(runs["process"], runs["worker"])):
        lines.append(f"| {i} | {a['wall_s']:.2f} | {a['load_s']:.2f} | {b['wall_s']:.2f} | {b['load_s']:.2f} |")
    proc = [r["wall_s"] - r["load_s"] for r in runs["process"]]
    kept = [r["wall_s"] - r["load_s"] for r in runs["worker"]]
    lines += [
        "",
        f"Beyond the load, median per level: {statistics.median(proc):.2f} s with a process per level, "
        f"{statistics.median(kept[1:]):.2f} s with the kept worker after its first level (the first, "
        f"{kept[0]:.2f} s, includes the worker's one import of vLLM).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--render" not in argv:
        python = os.environ.get("VLLM_BENCH_PYTHON")
        if not python:
            sys.exit("set VLLM_BENCH_PYTHON to a Python that has vLLM's client installed")
        RAW.parent.mkdir(parents=True, exist_ok=True)
        RAW.write_text(json.dumps(measure(python), indent=2) + "\n")
    MARKDOWN.write_text(render())
    print(f"wrote {MARKDOWN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
