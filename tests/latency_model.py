"""A deterministic served-latency model (latency rising with load, as a GPU's does) standing in for `vllm bench
serve`, which only a GPU host runs, and the serving records of its sweeps and capacity searches."""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.serving import capacity
from pipeline.serving.bench_record import PLAIN, Capacity, LoadLevel, ServeBenchRecord, ServeConfigResult
from pipeline.serving.capacity import CONCURRENCY
from pipeline.serving.tiers import Slo

CHAT = Slo(p99_ttft_ms=200, p99_itl_ms=50)
SWEEP = (1, 8, 32, 64)


def lat(p99: float) -> dict[str, float]:
    return {"mean": p99 / 2, "p50": p99 / 2, "p90": p99 * 0.8, "p99": p99}


class Server:
    """p99 ITL rises by itl_slope ms per concurrent request, TTFT by ttft_slope; throughput grows sublinearly. With
    the defaults and CHAT, ITL binds first: 10 + 0.5 c <= 50 up to c = 80 (TTFT would allow 90). Records every load
    it was asked for; fails requests above fail_above and dies (the probe raises) above die_above."""

    def __init__(self, itl_slope=0.5, ttft_slope=2.0, fail_above=None, die_above=None, speed=100.0):
        self.itl_slope, self.ttft_slope, self.speed = itl_slope, ttft_slope, speed
        self.fail_above, self.die_above = fail_above, die_above
        self.asked: list[float] = []

    def closed(self, c: int) -> LoadLevel:
        failed = 2 if self.fail_above is not None and c > self.fail_above else 0
        return LoadLevel(
            c,
            4 * c,
            4 * c - failed,
            failed,
            10.0,
            c / 2.0,
            self.speed * c**0.8,
            lat(20 + self.ttft_slope * c),
            lat(10 + self.itl_slope * c / 2),
            lat(10 + self.itl_slope * c),
            lat(1000 + 10 * c),
            request_goodput=c / 2.0 if c <= 80 else 0.0,
        )

    def open(self, rate: float) -> LoadLevel:
        """Poisson arrivals: ITL 10 + 2 ms per req/s (SLO 50: up to 20 req/s), TTFT 20 + 5 ms per req/s."""
        return LoadLevel(
            256,
            900,
            900,
            0,
            30.0,
            rate,
            120.0 * rate,
            lat(20 + 5 * rate),
            lat(10 + rate),
            lat(10 + 2 * rate),
            lat(1500.0),
            request_rate=rate,
            request_goodput=rate * 0.99,
        )

    def probe(self, load: float, arrival: str = CONCURRENCY) -> LoadLevel:
        self.asked.append(load)
        if self.die_above is not None and load > self.die_above:
            raise PipelineError("`vllm bench serve` failed (exit 1); log: bench.log")
        return self.closed(int(load)) if arrival == CONCURRENCY else self.open(load)

    def sweep(self, levels=SWEEP) -> list[LoadLevel]:
        return [self.closed(c) for c in levels]


def search(server: Server, bound=256, max_probes=6, slo=CHAT, known=None, **kw) -> Capacity:
    return capacity.search(
        server.probe, slo, CONCURRENCY, bound, max_probes, known=server.sweep() if known is None else known, **kw
    )


def swept(server: Server) -> dict[str, LoadLevel]:
    """The sweep's levels keyed as a ServeConfigResult holds them."""
    return {f"c{lvl.concurrency}": lvl for lvl in server.sweep()}


# Where and how the records below were served: one H100, vLLM 0.26.0, greedy 128-token answers.
H100_RUN = dict(
    gpu="NVIDIA H100 80GB HBM3",
    vllm_version="0.26.0",
    date="2026-12-01",
    max_tokens=128,
    temperature=0.0,
    tensor_parallel_size=1,
)


def searched_record(
    variant: str, server: Server, gpu="NVIDIA H100 80GB HBM3", spec_server: Server | None = None, **kw
) -> ServeBenchRecord:
    configs = {PLAIN: ServeConfigResult(0, 90.0, swept(server), capacity=search(server, **kw))}
    if spec_server is not None:
        configs["draft_model"] = ServeConfigResult(4, 95.0, swept(spec_server), capacity=search(spec_server, **kw))
    return ServeBenchRecord(variant, **{**H100_RUN, "gpu": gpu}, configs=configs)
