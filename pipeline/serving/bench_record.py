"""What the serving benchmark records (metrics/serve-<variant>.json), as typed values: written by the
serve_bench stage, read by the gate, the bundle and `modelprep gate --metrics-dir`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pipeline.serving.tiers import Slo

if TYPE_CHECKING:
    from pipeline.drafts.methods import Speculation

PLAIN = "plain"  # no speculative-config; every other config is named after its method (pipeline/drafts/methods.py)
SPECULATIVE = "speculative"  # records written before draft.method: the draft model's config
PERCENTILES = (50, 90, 99)
CONFIG = "config"  # the column of a serving plot (plots/serve_*/<variant>/) naming its row's config


@dataclass
class LoadLevel:
    """One `vllm bench serve` run at a fixed concurrency. Latencies in ms, keyed p50/p90/p99/mean."""

    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float  # requests/s
    output_throughput: float  # output tokens/s
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    accepted_per_draft_token: float | None = None  # from the vllm:spec_decode_* deltas; None without a draft
    mean_acceptance_length: float | None = None  # tokens per target step (1 + accepted per draft)
    accepted_per_position: list[float] | None = None
    kv_cache_usage_max: float | None = None  # fraction of the KV cache in use, scraped during the run
    kv_cache_usage_mean: float | None = None
    requests_waiting_max: float | None = None
    errors: list[str] = field(default_factory=list)  # distinct error messages of failed requests (first 5)
    request_rate: float | None = None  # the open-loop arrival rate (req/s, Poisson); None: closed loop (concurrency)
    request_goodput: float | None = None  # req/s whose own TTFT and TPOT met serving.slo (`vllm bench serve --goodput`)


# Capacity.status: how the search ended (pipeline/serving/capacity.py).
FOUND, BRACKET, AT_BOUND, NEVER = "found", "bracket", "at_bound", "never"


@dataclass
class Capacity:
    """A config's capacity at the SLO: the largest load measured to meet it (serve_bench's search on the config's
    running server). load: users (concurrency arrival) or req/s (poisson); users: concurrent requests there (the
    concurrency, or rate x mean request latency). status: found (the next load up missed it, within the search's
    resolution), bracket (the probes ran out between load and ceiling; ceiling None: still rising), at_bound (met at
    the search's bound: at least this), never (one user at a time already misses it: load 0)."""

    arrival: str
    slo: Slo
    status: str
    load: float
    users: float
    gpus: int  # GPUs of one replica (tensor parallelism): the per-GPU numbers divide by it
    users_per_gpu: float
    output_tokens_per_s_per_gpu: float | None  # at that load; None when no load met the SLO
    request_goodput: float | None  # req/s meeting the SLO at that load, as vLLM counts them
    level: LoadLevel | None  # the measurement at that load
    ceiling: float | None  # the smallest load measured to miss it
    bound: float  # the search's max load (serve_bench.capacity.max_concurrency or max_rate)
    probes: list[LoadLevel] = field(default_factory=list)  # the search's own runs, in order (beyond the sweep)
    note: str | None = None  # why the search stopped early (a probe vLLM failed to run)

    @property
    def lower_bound(self) -> bool:
        """The SLO still held at the highest load measured: capacity is at least this, not this."""
        return self.status == AT_BOUND or (self.status == BRACKET and self.ceiling is None)


@dataclass
class ServeConfigResult:
    """One serve.yaml (plain or with the draft) measured over the concurrency sweep."""

    num_speculative_tokens: int  # 0: no speculative-config; with a schedule, its largest k
    startup_s: float  # vllm serve start until /health answered
    levels: dict[str, LoadLevel]  # "c1", "c8", ...
    schedule: list[list[int]] | None = None  # num_speculative_tokens_per_batch_size, where the config has one
    kernels_used: list[str] = field(default_factory=list)  # GEMM kernels the server's log says vLLM selected
    # the same by the vLLM scheme class each was selected for (serving/kernel_log.py): a mixed layout's per scheme
    kernel_schemes: dict[str, list[str]] = field(default_factory=dict)
    capacity: Capacity | None = None  # at serving.slo, where serve_bench.capacity searched it
    # The GPU ids its server saw (CUDA_VISIBLE_DEVICES; None: records from before serve_bench placed configs) and the
    # configs served at the same time on other GPUs (serve_bench.parallel; empty: it ran alone).
    gpus: list[str] | None = None
    beside: list[str] = field(default_factory=list)

    def at(self, concurrency: int) -> LoadLevel | None:
        return self.levels.get(level_key(concurrency))

    @property
    def failed_requests(self) -> int:
        return sum(level.failed for level in self.levels.values())

    def label(self, name: str) -> str:
        """How a plot's legend names this config: plain, or the method with its k (a k schedule by its name)."""
        return name if name == PLAIN or self.schedule else f"{name} k={self.num_speculative_tokens}"


@dataclass
class ServeBenchRecord:
    """metrics/serve-<variant>.json: what the serving benchmark measured, or why it did not run."""

    variant: str
    skipped: str | None = None
    gpu: str | None = None
    vllm_version: str | None = None
    date: str | None = None
    load_generator: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    configs: dict[str, ServeConfigResult] = field(default_factory=dict)
    failed_configs: dict[str, str] = field(default_factory=dict)  # speculative configs vLLM could not serve: why
    # serve_bench.tiers: each tier's configs (plain, each method) at the tier's own engine settings, measured at
    # its concurrency only; tiers not run (more GPUs than the host has) and tier configs that failed, with why.
    tiers: dict[str, dict[str, ServeConfigResult]] = field(default_factory=dict)
    tier_skipped: dict[str, str] = field(default_factory=dict)
    tier_failed_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # A k per batch-size range for one method (speculation.k_schedule: k where its fixed config paid, none where
    # it lost), served over the same sweep: method -> its config (serve-<method>-schedule.yaml).
    schedules: dict[str, ServeConfigResult] = field(default_factory=dict)
    # Plain decoding under each kernel choice vLLM offers this variant on this GPU (hardware.kernel_choices): the
    # faster at target_concurrency is `kernel`, its environment `kernel_env`; every other config ran on it.
    kernels: dict[str, ServeConfigResult] = field(default_factory=dict)
    kernel: str | None = None
    kernel_env: dict[str, str] = field(default_factory=dict)
    kernel_note: str | None = None  # why kernels were not compared, or which choice failed to serve
    tensor_parallel_size: int | None = None  # GPUs one replica served on in the default sweep (per-GPU numbers)

    def tier(self, name: str) -> ServeBenchRecord | None:
        """A benchmarked tier's own measurement, as a record of its configs (None: the tier was not run)."""
        if self.skipped or name not in self.tiers:
            return None
        return replace(
            self,
            configs=self.tiers[name],
            failed_configs=self.tier_failed_configs.get(name, {}),
            tiers={},
            tier_skipped={},
            tier_failed_configs={},
            schedules={},
        )

    def speculative(self) -> dict[str, ServeConfigResult]:
        """The measured speculative configs by method (a legacy `speculative` config is the draft model's)."""
        return {
            ("draft_model" if name == SPECULATIVE else name): c for name, c in self.configs.items() if name != PLAIN
        }


def level_key(concurrency: int) -> str:
    return f"c{concurrency}"


SCHEDULE = "schedule"


def config_name(speculation: Speculation) -> str:
    """The serve_bench config (serve-<name>.yaml, record key) a speculative setting is measured as."""
    if not speculation.enabled:
        return PLAIN
    return f"{speculation.method}-{SCHEDULE}" if speculation.schedule else speculation.method
