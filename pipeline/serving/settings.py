"""The serving params, typed: `serving` (the engine settings a bundle ships, its latency objective, speculation's bar,
the tiers as written) and `serve_bench` (the load benchmark). Light on purpose (core only): stages that read one
serving knob (the models stage's max_model_len) depend on this file, not on the tiers or the benchmark code.

Each tier is parsed by tiers.py (parse_tiers), which needs the whole section; here it is kept as written."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

from pipeline.core.errors import PipelineError
from pipeline.core.sections import Section, empty_mapping
from pipeline.core.values import is_positive_int, is_positive_number


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
        for name, bound, values in (("TTFT", self.p99_ttft_ms, level.ttft_ms), ("ITL", self.p99_itl_ms, level.itl_ms),
                                    ("TPOT", self.p99_tpot_ms, level.tpot_ms)):
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
        parts += [f"p99 {n} <= {v:g} ms" for n, v in (("ITL", self.p99_itl_ms), ("TPOT", self.p99_tpot_ms))
                  if v is not None]
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
    slo = replace(base, **{k: raw[k] for k in SLO_KEYS if k in raw}) if base is not None else \
        Slo(**{k: raw.get(k) for k in SLO_KEYS})
    if slo.p99_ttft_ms is None:
        raise PipelineError(f"{where}.p99_ttft_ms must be a positive number of milliseconds")
    if slo.p99_itl_ms is None and slo.p99_tpot_ms is None:
        raise PipelineError(f"{where}: set p99_itl_ms or p99_tpot_ms (a latency objective needs a token latency)")
    if base is None and raw.get("arrival", ARRIVALS[0]) not in ARRIVALS:
        raise PipelineError(f"{where}.arrival must be one of {list(ARRIVALS)}, got {raw.get('arrival')!r}")
    return slo


AUTO_TP = "auto"  # serving.tensor_parallel_size: each variant's own, chosen by pipeline/serving/parallelism.py
TP_SIZES = (1, 2, 4, 8)  # what auto chooses from (and max_tensor_parallel_size allows): one host's GPUs


def _tensor_parallel_size(raw: object) -> int | str:
    if raw != AUTO_TP and not is_positive_int(raw):
        raise PipelineError(f"serving.tensor_parallel_size must be auto or a positive integer, got {raw!r}")
    return raw


def _max_tensor_parallel_size(raw: object) -> int:
    if raw not in TP_SIZES or isinstance(raw, bool):
        raise PipelineError(f"serving.max_tensor_parallel_size must be one of {list(TP_SIZES)}, got {raw!r}")
    return raw


def _draft_tensor_parallel_size(raw: object) -> int | None:
    if raw is not None and not is_positive_int(raw):
        raise PipelineError(f"serving.speculation.draft_tensor_parallel_size must be null or a positive integer, "
                            f"got {raw!r}")
    return raw


@dataclass(frozen=True)
class SpeculationBar:
    """serving.speculation: when a bundle ships speculative decoding, and the served speed it predicts from."""
    min_gain: float  # ships only when it beats plain decoding by this factor
    cost_profile: str = "auto"  # auto | a profile name | a path to a profile JSON
    draft_tensor_parallel_size: int | None = None  # None: vLLM's default, the target's


@dataclass(frozen=True)
class ServingParams:
    SECTION: ClassVar[str] = "serving"
    name: str  # the registry name: bundles publish as <name>-<variant>
    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    # auto (each variant's smallest that fits serving.gpu: parallelism.tensor_parallel_for) or a number pinning every
    # variant. Stages hold it resolved for their variant (parallelism.serving_for): an int wherever engines read it.
    tensor_parallel_size: int | str
    target_concurrency: int
    baseline_variant: str
    slo: Slo
    speculation: SpeculationBar
    arrival: str = ARRIVALS[0]  # serving.slo.arrival: concurrency (closed loop) | poisson (open loop)
    gpu: str | None = None  # the fleet's GPU (pipeline/quantize/hardware.py GPUS) or None
    gpu_hour_cost: float | None = None
    max_tensor_parallel_size: int = 8  # the largest auto may choose (GPUs of one host)
    env: Mapping[str, str | int] = field(default_factory=empty_mapping)
    secret_env: Mapping[str, str] = field(default_factory=empty_mapping)  # VAR: <kubernetes-secret>/<key>
    # name -> settings as written: tiers.parse_tiers
    tiers: Mapping[str, Mapping] = field(default_factory=empty_mapping)

    @classmethod
    def parse(cls, section: dict) -> ServingParams:
        s = Section(section, cls.SECTION)
        slo = s.section("slo")
        sp = s.section("speculation")
        gain = sp.value("min_gain")
        if not is_positive_number(gain):
            raise sp.fail("min_gain", "a positive number", gain)
        return cls(
            name=s.str("name"), max_model_len=s.int("max_model_len", minimum=1),
            gpu_memory_utilization=s.number("gpu_memory_utilization"), max_num_seqs=s.int("max_num_seqs", minimum=1),
            tensor_parallel_size=_tensor_parallel_size(s.value("tensor_parallel_size")),
            max_tensor_parallel_size=_max_tensor_parallel_size(s.value("max_tensor_parallel_size", 8)),
            target_concurrency=s.int("target_concurrency", minimum=1), baseline_variant=s.str("baseline_variant"),
            slo=parse_slo(dict(slo.raw), "serving.slo"), arrival=slo.choice("arrival", ARRIVALS, ARRIVALS[0]),
            speculation=SpeculationBar(gain, sp.str("cost_profile", "auto"),
                                       _draft_tensor_parallel_size(sp.value("draft_tensor_parallel_size", None))),
            gpu=s.str_or_none("gpu"), gpu_hour_cost=s.number_or_none("gpu_hour_cost"),
            env=s.mapping("env"), secret_env=s.mapping("secret_env"), tiers=s.mapping("tiers"))


@dataclass(frozen=True)
class Capacity:
    """serve_bench.capacity: the search for the largest load meeting serving.slo, bounded."""
    enabled: bool
    max_concurrency: int
    max_rate: float
    max_probes: int


@dataclass(frozen=True)
class ServeBenchParams:
    SECTION: ClassVar[str] = "serve_bench"
    enabled: bool | str  # auto | true | false
    concurrency: tuple[int, ...]
    prompts_per_concurrency: int
    min_prompts: int
    warmup_requests: int
    max_tokens: int
    num_speculative_tokens: int | str  # auto: the CPU estimate's best k
    k_schedule: str  # auto | off
    kernel_tie: float
    capacity: Capacity
    startup_timeout_s: int
    port: int
    tiers: str | tuple[str, ...] = ()  # all, or serving.tiers names
    parallel: str = "auto"  # auto: independent configs at once on disjoint GPU sets (serving/gpu_sets.py) | off

    @classmethod
    def parse(cls, section: dict) -> ServeBenchParams:
        s = Section(section, cls.SECTION)
        c = s.section("capacity")
        k = s.value("num_speculative_tokens")
        if k != "auto" and not is_positive_int(k):
            raise s.fail("num_speculative_tokens", "auto or a positive integer", k)
        tiers = s.value("tiers", [])
        return cls(
            enabled=s.choice("enabled", (True, False, "auto")), concurrency=s.ints("concurrency"),
            prompts_per_concurrency=s.int("prompts_per_concurrency", minimum=1),
            min_prompts=s.int("min_prompts", minimum=1), warmup_requests=s.int("warmup_requests", minimum=0),
            max_tokens=s.int("max_tokens", minimum=1), num_speculative_tokens=k,
            k_schedule=s.choice("k_schedule", ("auto", "off")), kernel_tie=s.number("kernel_tie"),
            capacity=Capacity(c.bool("enabled"), c.int("max_concurrency", minimum=1), c.number("max_rate"),
                              c.int("max_probes", minimum=0)),
            startup_timeout_s=s.number("startup_timeout_s"), port=s.int("port", minimum=1),
            tiers=tiers if tiers == "all" else s.strs("tiers", []),
            parallel=s.choice("parallel", ("auto", "off"), "auto"))
