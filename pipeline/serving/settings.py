"""The serving params, typed: `serving` (the engine settings a bundle ships, its latency objective, speculation's bar,
the tiers as written) and `serve_bench` (the load benchmark). Light on purpose (core only): stages that read one
serving knob (the models stage's max_model_len) depend on this file, not on the tiers or the benchmark code.

Each tier is parsed by tiers.py (parse_tiers), which needs the whole section; here it is kept as written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pipeline.core.errors import PipelineError
from pipeline.core.values import is_positive_number
from pipeline.params.declare import DERIVED, Knob, knob, parse_declared, parse_key, section


@dataclass(frozen=True)
class Slo:
    """A latency objective at the 99th percentile, in ms (serving.slo, a tier's slo overriding it): what a load
    must meet to count towards capacity. The token latency is ITL (every gap between streamed tokens) or TPOT
    (a request's mean gap), or both; None leaves one out."""

    p99_ttft_ms: float
    p99_itl_ms: float | None = None
    p99_tpot_ms: float | None = None

    @property
    def token_metric(self) -> str:
        """The token latency a plot puts on its axis: ITL where it is bounded, else TPOT."""
        return "itl" if self.p99_itl_ms is not None else "tpot"

    @property
    def token_ms(self) -> float:
        return self.p99_itl_ms if self.p99_itl_ms is not None else self.p99_tpot_ms

    def misses(self, level) -> list[str]:
        """Why a LoadLevel (serving/bench_record.py) misses the objective; [] when it meets it. A failed request
        misses it whatever its latencies: they cover the successful requests only."""
        out = [f"{level.failed} failed requests"] if level.failed else []
        for name, bound, values in (
            ("TTFT", self.p99_ttft_ms, level.ttft_ms),
            ("ITL", self.p99_itl_ms, level.itl_ms),
            ("TPOT", self.p99_tpot_ms, level.tpot_ms),
        ):
            if bound is not None and values["p99"] > bound:
                out.append(f"p99 {name} {values['p99']:.1f} ms > {bound:g}")
        return out

    def meets(self, level) -> bool:
        return not self.misses(level)

    def goodput(self) -> dict[str, float]:
        """`vllm bench serve --goodput` objectives: vLLM counts a request good when its own TTFT and TPOT meet them
        (vllm/benchmarks/serve.py calculate_metrics; it has no per-request ITL), so an ITL objective bounds TPOT
        there: a request whose every gap is within it has its mean within it too."""
        return {"ttft": self.p99_ttft_ms, "tpot": self.p99_tpot_ms if self.p99_tpot_ms is not None else self.p99_itl_ms}

    def label(self) -> str:
        parts = [f"p99 TTFT <= {self.p99_ttft_ms:g} ms"]
        parts += [
            f"p99 {n} <= {v:g} ms" for n, v in (("ITL", self.p99_itl_ms), ("TPOT", self.p99_tpot_ms)) if v is not None
        ]
        return ", ".join(parts)


SLO_KEYS = ("p99_ttft_ms", "p99_itl_ms", "p99_tpot_ms")
ARRIVALS = ("concurrency", "poisson")  # serving.slo.arrival


def parse_slo(raw, where: str, base: Slo | None = None) -> Slo:
    """serving.slo (base None: the arrival key may be there too) or a tier's slo overriding base; one error line
    naming the key. TTFT is required, and at least one token latency."""
    if not isinstance(raw, Mapping):
        raise PipelineError(f"{where} must be a mapping of latency objectives ({', '.join(SLO_KEYS)})")
    allowed = set(SLO_KEYS) | ({"arrival"} if base is None else set())
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise PipelineError(f"{where}: unknown keys {unknown}; known: {sorted(allowed)}")
    for key in SLO_KEYS:
        value = raw.get(key)
        if value is not None and not is_positive_number(value):
            raise PipelineError(f"{where}.{key} must be a positive number of milliseconds or null, got {value!r}")
    slo = (
        replace(base, **{k: raw[k] for k in SLO_KEYS if k in raw})
        if base is not None
        else Slo(**{k: raw.get(k) for k in SLO_KEYS})
    )
    if slo.p99_ttft_ms is None:
        raise PipelineError(f"{where}.p99_ttft_ms must be a positive number of milliseconds")
    if slo.p99_itl_ms is None and slo.p99_tpot_ms is None:
        raise PipelineError(f"{where}: set p99_itl_ms or p99_tpot_ms (a latency objective needs a token latency)")
    if base is None and raw.get("arrival", ARRIVALS[0]) not in ARRIVALS:
        raise PipelineError(f"{where}.arrival must be one of {list(ARRIVALS)}, got {raw.get('arrival')!r}")
    return slo


AUTO_TP = "auto"  # serving.tensor_parallel_size: each variant's own, chosen by pipeline/serving/parallelism.py
TP_SIZES = (1, 2, 4, 8)  # what auto chooses from (and max_tensor_parallel_size allows): one host's GPUs
SLO_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {**{k: {} for k in SLO_KEYS}, "arrival": {"enum": list(ARRIVALS)}},
}


def parse_serving_slo(raw: object, where: str) -> Slo:
    return parse_slo(raw, where)


@dataclass(frozen=True)
class SpeculationBar:
    """serving.speculation: when a bundle ships speculative decoding, and the served speed it predicts from."""

    min_gain: float = knob(
        1.1,
        required=True,
        help="ships speculative decoding only when it beats plain decoding by this factor",
        exclusive_minimum=0,
    )
    cost_profile: str = knob(
        "auto", help="serving costs the prediction uses: auto, a profile name or a path to a profile JSON", min_length=1
    )
    draft_tensor_parallel_size: int | None = knob(
        None, help="the draft model's tensor parallelism; null: the target's", minimum=1
    )


@section("serving")
@dataclass(frozen=True)
class ServingParams:
    """params.yaml `serving`: the engine settings a bundle ships, its SLO, speculation's bar, the tiers."""

    name: str = knob("nimbus-support", required=True, help="the registry name: bundles publish as <name>-<variant>")
    max_model_len: int = knob(2048, required=True, help="vLLM's context length", minimum=1)
    gpu_memory_utilization: float = knob(0.9, required=True, help="vLLM's share of the GPU's memory")
    max_num_seqs: int = knob(64, required=True, help="vLLM's concurrent sequences", minimum=1)
    # auto (each variant's smallest that fits serving.gpu: parallelism.tensor_parallel_for) or a number pinning every
    # variant. Stages hold it resolved for their variant (parallelism.serving_for): an int wherever engines read it.
    tensor_parallel_size: int | Literal["auto"] = knob(
        "auto",
        required=True,
        minimum=1,
        help="GPUs one replica shards over; auto: per variant, the smallest that fits serving.gpu",
    )
    target_concurrency: int = knob(
        1,
        required=True,
        minimum=1,
        help="the concurrency the speculative setting is chosen for (one of serve_bench.concurrency)",
    )
    baseline_variant: str = knob("bf16", required=True, help="the variant whose plain decoding speedups divide by")
    slo: Slo = knob(
        Slo(200, 50),
        required=True,
        parse=parse_serving_slo,
        schema=SLO_SCHEMA,
        help="p99 latency objectives (ms) capacity is measured against, and the arrival: concurrency or poisson",
    )
    speculation: SpeculationBar = knob(SpeculationBar(), required=True, help="when a bundle ships speculation")
    gpu: str | None = knob(
        None, help="the fleet's GPU (t4, a10g, a100, a6000, l4, l40s, h100, h200, b200); null: unknown"
    )
    gpu_hour_cost: float | None = knob(
        None, help="price of one GPU-hour: the card's cost per million output tokens", exclusive_minimum=0
    )
    max_tensor_parallel_size: Literal[1, 2, 4, 8] = knob(8, help="the most GPUs auto may shard one replica over")
    env: Mapping[str, str | int] = knob({}, help="environment for `vllm serve`; shipped in serve.env")
    secret_env: Mapping[str, str] = knob({}, help="VAR: <kubernetes-secret>/<key>")
    # name -> settings as written: tiers.parse_tiers
    tiers: Mapping[str, Mapping] = knob({}, help="serving tiers besides the default (pipeline/serving/tiers.py)")
    arrival: str = field(default=ARRIVALS[0], metadata={DERIVED: True})  # serving.slo.arrival

    @classmethod
    def parse(cls, section: Mapping) -> ServingParams:
        out = parse_declared(cls, section)
        return replace(
            out,
            arrival=parse_key(
                section["slo"].get("arrival", ARRIVALS[0]), Literal[ARRIVALS], Knob(""), "serving.slo.arrival"
            ),
        )


@dataclass(frozen=True)
class Capacity:
    """serve_bench.capacity: the search for the largest load meeting serving.slo, bounded."""

    enabled: bool = knob(True, required=True, help="search each config's capacity at serving.slo")
    max_concurrency: int = knob(256, required=True, help="never above this many users", minimum=1)
    max_rate: float = knob(
        64.0, required=True, help="never above this many req/s (poisson arrival)", exclusive_minimum=0
    )
    max_probes: int = knob(
        6, required=True, help="at most this many more `vllm bench serve` runs per config", minimum=0
    )


@section("serve_bench")
@dataclass(frozen=True)
class ServeBenchParams:
    """params.yaml `serve_bench`: `vllm serve --config serve.yaml` under load (GPU + vLLM only)."""

    enabled: Literal[True, False, "auto"] = knob(
        "auto", required=True, help="auto, true (fail without the GPUs) or false"
    )
    concurrency: tuple[int, ...] = knob(
        (1, 8, 32, 64), required=True, minimum=1, help="`vllm bench serve --max-concurrency` sweep"
    )
    prompts_per_concurrency: int = knob(
        4, required=True, help="requests per level: max(min_prompts, this x concurrency)", minimum=1
    )
    min_prompts: int = knob(32, required=True, help="requests per level, at least", minimum=1)
    warmup_requests: int = knob(8, required=True, help="sent after /health answers, before any timing", minimum=0)
    max_tokens: int = knob(128, required=True, help="per request", minimum=1)
    num_speculative_tokens: int | Literal["auto"] = knob(
        "auto", required=True, minimum=1, help="auto: the k the CPU estimate found best"
    )
    k_schedule: Literal["auto", "off"] = knob("auto", required=True, help="auto: also serve a k per batch-size range")
    kernel_tie: float = knob(
        0.04,
        required=True,
        help="of the kernels carrying the most users within serving.slo, those within this fraction at "
        "target_concurrency: the faster over the sweep ships",
        minimum=0,
        exclusive_maximum=1,
    )
    capacity: Capacity = knob(Capacity(), required=True, help="capacity at serving.slo")
    startup_timeout_s: int = knob(900, required=True, help="vllm serve until /health answers", minimum=1)
    port: int = knob(
        8000,
        required=True,
        help="preferred loopback port; a server on GPU i tries port + i, another where taken",
        minimum=1,
        maximum=65535,
    )
    tiers: Literal["all"] | tuple[str, ...] = knob((), help="serving tiers also served: [], all or a list of names")
    parallel: Literal["auto", "off"] = knob("auto", help="auto: independent configs at once on disjoint GPU sets")

    def __post_init__(self) -> None:
        if not self.concurrency or len(set(self.concurrency)) != len(self.concurrency):
            raise PipelineError(
                f"serve_bench.concurrency must be a non-empty list of distinct positive integers, "
                f"got {list(self.concurrency)!r}"
            )
