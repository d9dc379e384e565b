"""What scale_serve.py and mixed_serve.py share: one `vllm serve` process started, waited for and stopped, and the
`vllm bench serve` client run against it. Imports nothing of the pipeline (scale_serve.py runs without it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VLLM = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
INPUT_TOKENS, OUTPUT_TOKENS = 512, 128  # random prompts; every answer runs to OUTPUT_TOKENS (--ignore-eos)
LEVEL_TIMEOUT_S = 300  # a level's client that hangs (seen once: no request sent) fails its level, not the run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextmanager
def server_process(args: list[str], log: Path, env: dict) -> Iterator[subprocess.Popen]:
    """`args` running in its own session, its output in `log`; on exit SIGTERM to the whole group, SIGKILL after 60 s
    (vLLM's workers are children of the server)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield proc
        finally:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def wait_up(proc: subprocess.Popen, port: int, t0: float, timeout_s: float, log_name: str) -> float:
    """Seconds since t0 until the server on `port` answers /health; RuntimeError if it exits or takes over
    timeout_s."""
    while not healthy(port):
        if proc.poll() is not None or time.time() - t0 > timeout_s:
            raise RuntimeError(f"server did not start (exit {proc.poll()}), see {log_name}")
        time.sleep(2)
    return round(time.time() - t0, 1)


def bench_command(port: int, name: str, tokenizer: Path, num_prompts: int, c: int, result: Path) -> list[str]:
    """`vllm bench serve` of random prompts (INPUT_TOKENS in, OUTPUT_TOKENS out, --ignore-eos) at concurrency c, its
    JSON result saved to `result`."""
    return [
        *VLLM,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        name,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_TOKENS),
        "--random-output-len",
        str(OUTPUT_TOKENS),
        "--ignore-eos",
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(c),
        "--request-rate",
        "inf",
        "--seed",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        "--disable-tqdm",
    ]


def run_client(cmd: list[str], log: Path, env: dict) -> int | str:
    """The client's exit status, or "timeout" past LEVEL_TIMEOUT_S (a hung client fails its level, not the run)."""
    with open(log, "w") as out:
        try:
            return subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=LEVEL_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            return "timeout"
