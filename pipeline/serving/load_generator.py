"""The serving benchmark's load generator: `vllm bench serve` against a running server, one load level at a time.

The load generator is `vllm bench serve` (it ships with vLLM): held-out traffic prompts through the
OpenAI completions API at each concurrency of `serve_bench.concurrency`, TTFT/TPOT/ITL percentiles,
throughput, failed requests, and the `vllm:spec_decode_*` counter deltas it reads from `/metrics`.
While it runs, `/metrics` is scraped for `vllm:kv_cache_usage_perc` and the waiting queue, which
only exist as gauges under load. Nothing here is simulated: without CUDA and vLLM the stage records
why it was skipped.
"""

from __future__ import annotations

import atexit
import json
import queue
import subprocess
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.serving import bench_worker
from pipeline.serving.bench_record import PERCENTILES, LoadLevel
from pipeline.serving.settings import ServeBenchParams
from pipeline.serving.vllm_server import VLLM_MODULE, failure, vllm_command

LATENCIES = ("ttft", "tpot", "itl", "e2el")
# Counters and gauges read from /metrics (names as vLLM 0.26 exports them, vllm/v1/metrics/loggers.py).
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_WAITING = "vllm:num_requests_waiting"
BENCH_TIMEOUT_S = 1800


def timed_out(log: Path) -> PipelineError:
    """A `vllm bench serve` run past BENCH_TIMEOUT_S, in the worker or as its own process."""
    return PipelineError(f"`vllm bench serve` did not finish within {BENCH_TIMEOUT_S} s; log: {log}")


def num_prompts(cfg: ServeBenchParams, concurrency: int) -> int:
    """Enough requests that every concurrency level keeps its slots busy for several rounds."""
    return max(cfg.min_prompts, cfg.prompts_per_concurrency * concurrency)


def write_dataset(path: Path, prompts: list[str]) -> None:
    """`vllm bench serve --dataset-name custom` input: one {"prompt": ...} per line."""
    if not prompts:
        raise PipelineError("the serving benchmark needs held-out prompts; artifacts/data/heldout.jsonl is empty")
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")


@dataclass(frozen=True)
class LoadSpec:
    """One `vllm bench serve` run over the OpenAI completions API: the served model's name, the tokenizer that counts
    the prompts, the dataset (write_dataset's), at most `concurrency` requests open, `prompts` requests of at most
    `max_tokens` tokens at `temperature`, whether the server adds special tokens, where the result goes, warm-up
    requests first. request_rate: Poisson arrivals at that rate (burstiness 1); None: a closed loop of `concurrency`
    users. goodput: the SLO as vLLM's per-request objectives (tiers.Slo.goodput), counted into request_goodput."""

    served_name: str
    tokenizer_dir: Path
    dataset: Path
    concurrency: int
    prompts: int
    max_tokens: int
    temperature: float
    add_special_tokens: bool
    result: Path
    warmups: int = 0
    request_rate: float | None = None
    goodput: dict[str, float] | None = None


def bench_command(command: list[str], base_url: str, load: LoadSpec) -> list[str]:
    """`vllm bench serve` (command: how vLLM's CLI is run) against base_url. The prompts are already rendered with
    the chat template, so the client must not apply it again, nor the server add a second BOS."""
    rate = (
        ["--request-rate", "inf"]
        if load.request_rate is None
        else ["--request-rate", f"{load.request_rate:.6g}", "--burstiness", "1.0"]
    )
    good = ["--goodput", *(f"{k}:{v:g}" for k, v in load.goodput.items() if v is not None)] if load.goodput else []
    return [
        *command,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        base_url,
        "--model",
        load.served_name,
        "--served-model-name",
        load.served_name,
        "--tokenizer",
        str(load.tokenizer_dir),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(load.dataset),
        "--skip-chat-template",
        "--custom-output-len",
        str(load.max_tokens),
        "--num-prompts",
        str(load.prompts),
        "--max-concurrency",
        str(load.concurrency),
        *rate,
        *good,
        "--temperature",
        str(load.temperature),
        "--extra-body",
        json.dumps({"add_special_tokens": load.add_special_tokens}),
        "--seed",
        "0",
        "--num-warmups",
        str(load.warmups),
        "--percentile-metrics",
        ",".join(LATENCIES),
        "--metric-percentiles",
        ",".join(map(str, PERCENTILES)),
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(load.result.parent),
        "--result-filename",
        load.result.name,
        "--disable-tqdm",
    ]


def parse_result(raw: dict, where: str) -> LoadLevel:
    """A `vllm bench serve --save-result` JSON as a LoadLevel; one error line naming the missing key.

    Failed requests are counted and their errors kept: the latency and throughput numbers of such a
    run cover the successful requests only, so a failure must never be averaged away."""

    def need(key):
        if key not in raw or raw[key] is None:
            raise PipelineError(f"{where}: `vllm bench serve` result has no {key!r}")
        return raw[key]

    def latency(name: str) -> dict[str, float]:
        out = {"mean": float(need(f"mean_{name}_ms"))}
        out |= {f"p{p}": float(need(f"p{p}_{name}_ms")) for p in PERCENTILES}
        return out

    completed = int(need("completed"))
    failed = int(raw.get("failed") or 0)
    errors = sorted({e.strip().splitlines()[-1][:300] for e in raw.get("errors") or [] if e and e.strip()})[:5]
    rate = raw.get("spec_decode_acceptance_rate")
    arrivals = raw.get("request_rate")  # "inf" for a closed loop (vllm/benchmarks/serve.py)
    goodput = raw.get("request_goodput")
    return LoadLevel(
        concurrency=int(need("max_concurrency")),
        num_prompts=int(need("num_prompts")),
        completed=completed,
        failed=failed,
        duration_s=float(need("duration")),
        request_throughput=float(need("request_throughput")),
        output_throughput=float(need("output_throughput")),
        ttft_ms=latency("ttft"),
        tpot_ms=latency("tpot"),
        itl_ms=latency("itl"),
        e2el_ms=latency("e2el"),
        accepted_per_draft_token=None if rate is None else float(rate) / 100.0,
        mean_acceptance_length=raw.get("spec_decode_acceptance_length"),
        accepted_per_position=raw.get("spec_decode_per_position_acceptance_rates"),
        errors=errors,
        request_rate=None if arrivals in (None, "inf") else float(arrivals),
        request_goodput=None if goodput is None else float(goodput),
    )


def gauge_values(metrics_text: str, name: str) -> list[float]:
    """Every sample of a gauge in a Prometheus text exposition (one per engine/label set)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        s.value for family in text_string_to_metric_families(metrics_text) for s in family.samples if s.name == name
    ]


class MetricsSampler:
    """Scrapes /metrics every `interval_s` seconds on a thread while a benchmark runs: the KV-cache
    use and queue length are gauges, so reading them once after the run would see an idle server."""

    def __init__(self, base_url: str, interval_s: float = 0.5):
        self.url, self.interval_s = f"{base_url}/metrics", interval_s
        self.kv: list[float] = []
        self.waiting: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    text = r.read().decode("utf-8", errors="replace")
                self.kv.append(max(gauge_values(text, KV_CACHE_USAGE), default=0.0))
                self.waiting.append(sum(gauge_values(text, REQUESTS_WAITING)))
            except (OSError, ValueError):
                pass  # a missed scrape leaves a gap, not a made-up value
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "MetricsSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def apply(self, level: LoadLevel) -> LoadLevel:
        if self.kv:
            level.kv_cache_usage_max = max(self.kv)
            level.kv_cache_usage_mean = sum(self.kv) / len(self.kv)
        if self.waiting:
            level.requests_waiting_max = max(self.waiting)
        return level


WORKER = Path(bench_worker.__file__)  # run by path with the Python that has vLLM


class BenchWorker:
    """bench_worker.py under one Python: vLLM's load generator imported once, a benchmark per request (a fresh
    `vllm bench serve` spent ~25 s of a 1-3 s sweep level importing vLLM on the H100 host; see that module)."""

    def __init__(self, python: str, log: Path):
        with open(log, "a") as startup_log:  # what vLLM prints while importing, before the first request
            self.proc = subprocess.Popen(
                [python, str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=startup_log,
                text=True,
                bufsize=1,
            )
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        if self._answer(BENCH_TIMEOUT_S) != "ready":
            self.close()
            raise failure("the `vllm bench serve` worker did not start", log)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line.strip())
        self.answers.put(None)  # the worker exited

    def _answer(self, timeout: float) -> str | None:
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], log: Path) -> int:
        """One benchmark (argv: what follows `vllm bench serve`), its output appended to log; its exit status."""
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(BENCH_TIMEOUT_S)
        if answer == "":
            self.close()
            raise timed_out(log)
        if answer is None:
            raise failure(f"the `vllm bench serve` worker exited (status {self.proc.wait()})", log)
        return int(json.loads(answer)["rc"])

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# Idle workers by Python: a level takes one (a new one when none is idle) and gives it back, so configs benchmarked at
# the same time on threads (pipeline/serving/gpu_sets.py) each drive their own process, and later ones reuse them.
_idle: dict[str, list[BenchWorker]] = {}
_started: list[BenchWorker] = []
_pool_lock = threading.Lock()


def _take_worker(python: str, log: Path) -> BenchWorker:
    with _pool_lock:
        idle = _idle.setdefault(python, [])
        while idle:
            worker = idle.pop()
            if worker.alive():  # a level that killed it gets a fresh one
                return worker
    worker = BenchWorker(python, log)  # outside the lock: importing vLLM takes seconds
    with _pool_lock:
        _started.append(worker)
    return worker


def _give_back(python: str, worker: BenchWorker) -> None:
    with _pool_lock:
        _idle.setdefault(python, []).append(worker)


@atexit.register
def close_workers() -> None:
    with _pool_lock:
        workers = list(_started)
        _started.clear()
        _idle.clear()
    for worker in workers:
        worker.close()


def _run_client(command: list[str], log: Path) -> int:
    """`python -m vllm.entrypoints.cli.main bench serve ARGS` goes to a worker of that Python; any other command
    (a `vllm` console script) runs as its own process."""
    if command[1:5] == ["-m", VLLM_MODULE, "bench", "serve"]:
        worker = _take_worker(command[0], log)
        try:
            return worker.run(command[5:], log)
        finally:
            _give_back(command[0], worker)
    with open(log, "a") as out:
        try:
            return subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=BENCH_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            raise timed_out(log) from None


def run_level(command: list[str], base_url: str, result: Path, log: Path) -> LoadLevel:
    """Run one `vllm bench serve` (the command from bench_command) while sampling /metrics."""
    with MetricsSampler(base_url) as sampler:
        returncode = _run_client(command, log)
    if returncode != 0 or not result.is_file():
        raise failure(f"`vllm bench serve` failed (exit {returncode})", log)
    return sampler.apply(parse_result(json.loads(result.read_text()), str(result)))


@dataclass(frozen=True)
class Traffic:
    """What `vllm bench serve` sends a server: the dataset file of prompts rendered with the chat template
    (write_dataset), the tokenizer that counts them, and whether the server must add special tokens."""

    dataset: Path
    tokenizer_dir: Path
    add_special_tokens: bool


@dataclass(frozen=True)
class Client:
    """What every load level against one server shares: the model's served name, the traffic, serve_bench's params,
    the serving temperature and the SLO's goodput objectives (tiers.Slo.goodput)."""

    served_name: str
    traffic: Traffic
    cfg: ServeBenchParams
    temperature: float
    goodput: dict[str, float] | None


def level_command(
    base_url: str, client: Client, result: Path, load: float, prompts: int, warmups: int = 0, poisson: bool = False
) -> list[str]:
    """The `vllm bench serve` of one load level: `load` users in a closed loop, or (poisson) Poisson arrivals at
    `load` requests/s with at most serve_bench.capacity.max_concurrency open."""
    cfg, traffic = client.cfg, client.traffic
    return bench_command(
        vllm_command(),
        base_url,
        LoadSpec(
            client.served_name,
            traffic.tokenizer_dir,
            traffic.dataset,
            cfg.capacity.max_concurrency if poisson else int(load),
            prompts,
            cfg.max_tokens,
            client.temperature,
            traffic.add_special_tokens,
            result,
            warmups=warmups,
            request_rate=load if poisson else None,
            goodput=client.goodput,
        ),
    )


def bench_level(
    server, client: Client, result: Path, log: Path, load: float, prompts: int, warmups: int = 0, poisson: bool = False
) -> LoadLevel:
    """One load level against a running server (vllm_server.serve's): level_command run while /metrics is sampled,
    its --save-result file at result, the client's output appended to log."""
    result.parent.mkdir(parents=True, exist_ok=True)
    command = level_command(server.base_url, client, result, load, prompts, warmups, poisson)
    return run_level(command, server.base_url, result, log)
