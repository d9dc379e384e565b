"""What the config that ships carries at serving.slo (serve_bench's capacity search), per GPU, against the
baseline variant's plain decoding: the claim the gate checks (min_capacity_vs_bf16) and the card prints."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.drafts.methods import Speculation
from pipeline.release.shipped_config import comparable, config_name, config_of
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord
from pipeline.serving.tiers import Slo

AT_LEAST, AT_MOST = "at least", "at most"


@dataclass
class CapacityClaim:
    """What the config that ships carries at serving.slo (serve_bench's capacity search), per GPU, against the
    baseline variant's plain decoding measured on the same GPU model with the same vLLM."""

    config: str  # the shipped config as serve_bench named it (plain, a method, <method>-schedule)
    slo: Slo
    arrival: str  # concurrency | poisson
    status: str  # bench_record.Capacity.status
    lower_bound: bool  # it still met the SLO at the highest load measured: at least this many users
    users: float  # per replica
    gpus: int
    users_per_gpu: float
    output_tokens_per_s_per_gpu: float | None
    request_goodput: float | None
    baseline_users_per_gpu: float | None = None
    vs_bf16: float | None = None  # users per GPU over the baseline's plain decoding
    vs_bf16_bound: str | None = None  # at least / at most: one of the two capacities is a lower bound
    vs_bf16_note: str | None = None  # why there is no ratio
    gpu_hour_cost: float | None = None  # serving.gpu_hour_cost
    cost_per_million_output_tokens: float | None = None  # at the SLO's capacity
    baseline_gpus: int | None = None  # GPUs of one replica of the baseline (its own tensor parallelism)
    baseline_output_tokens_per_s_per_gpu: float | None = None
    baseline_cost_per_million_output_tokens: float | None = None
    cost_vs_bf16: float | None = None  # cost per output token over the baseline's, each at its own GPU count


def cost_per_million_tokens(gpu_hour_cost: float | None, gpus: int, tokens_per_s: float | None) -> float | None:
    """What a million output tokens cost on one replica at that throughput: gpu_hour_cost x its GPUs per hour of
    tokens (None without a price or a throughput)."""
    if not gpu_hour_cost or not tokens_per_s:
        return None
    return gpu_hour_cost * gpus / (tokens_per_s * 3600) * 1e6


def capacity_claim(
    serve: ServeBenchRecord | None,
    baseline: ServeBenchRecord | None,
    shipped: Speculation,
    gpu_hour_cost: float | None,
    baseline_variant: str,
) -> tuple[CapacityClaim | None, str | None]:
    """(claim, why it has no ratio) for the config that ships; (None, why) when its capacity was not searched.
    gpu_hour_cost: serving.gpu_hour_cost; baseline_variant: serving.baseline_variant, as the notes name it."""
    if serve is None or serve.skipped:
        return None, None  # the serving checks' own reason says why
    config = config_of(serve, shipped)
    cap = config.capacity if config is not None else None
    if cap is None:
        return None, f"no capacity search of the {config_name(shipped)} config that ships (serve_bench.capacity)"
    cost = cost_per_million_tokens(gpu_hour_cost, cap.gpus, cap.level.output_throughput if cap.level else None)
    claim = CapacityClaim(
        config=config_name(shipped),
        slo=cap.slo,
        arrival=cap.arrival,
        status=cap.status,
        lower_bound=cap.lower_bound,
        users=cap.users,
        gpus=cap.gpus,
        users_per_gpu=cap.users_per_gpu,
        output_tokens_per_s_per_gpu=cap.output_tokens_per_s_per_gpu,
        request_goodput=cap.request_goodput,
        gpu_hour_cost=gpu_hour_cost,
        cost_per_million_output_tokens=cost,
    )
    plain = baseline.configs.get(PLAIN) if comparable(serve, baseline) else None
    _against_baseline(
        claim, cap, plain.capacity if plain is not None else None, gpu_hour_cost, f"{baseline_variant} plain decoding"
    )
    return claim, claim.vs_bf16_note


def _against_baseline(claim: CapacityClaim, cap, base, gpu_hour_cost: float | None, name: str) -> None:
    """Fill the claim's ratios against the baseline's capacity (base), or the note saying why there are none."""
    if base is None:
        claim.vs_bf16_note = f"no capacity of {name} on the same GPU and vLLM"
        return
    if (base.slo, base.arrival) != (cap.slo, cap.arrival):
        claim.vs_bf16_note = f"{name} was searched at another SLO or arrival"
        return
    tokens = cap.output_tokens_per_s_per_gpu
    claim.baseline_users_per_gpu, claim.baseline_gpus = base.users_per_gpu, base.gpus
    claim.baseline_output_tokens_per_s_per_gpu = base.output_tokens_per_s_per_gpu
    claim.baseline_cost_per_million_output_tokens = cost_per_million_tokens(
        gpu_hour_cost, base.gpus, base.level.output_throughput if base.level else None
    )
    if tokens and base.output_tokens_per_s_per_gpu:
        # per GPU: a variant on 2 GPUs against the baseline on 4 pays for 2 against 4
        claim.cost_vs_bf16 = base.output_tokens_per_s_per_gpu / tokens
    if not base.users_per_gpu:
        claim.vs_bf16_note = f"{name} met the SLO at no load ({base.slo.label()})"
    elif cap.lower_bound and base.lower_bound:
        claim.vs_bf16_note = (
            f"both still met the SLO at the highest load measured ({cap.users:g} and "
            f"{base.users:g} users): raise serve_bench.capacity.max_concurrency or max_probes"
        )
    else:
        claim.vs_bf16 = cap.users_per_gpu / base.users_per_gpu
        claim.vs_bf16_bound = AT_LEAST if cap.lower_bound else AT_MOST if base.lower_bound else None


def capacity_metrics(claim: CapacityClaim | None, threshold: float | None) -> tuple[dict, str | None]:
    """capacity_vs_bf16 for the gate, unless a bound leaves the check undecided (at least x0.9 against 1.0: the
    true ratio may pass): then (nothing, why)."""
    if claim is None or claim.vs_bf16 is None:
        return {}, None
    ratio = claim.vs_bf16
    if threshold is not None and (
        (claim.vs_bf16_bound == AT_LEAST and ratio < threshold)
        or (claim.vs_bf16_bound == AT_MOST and ratio >= threshold)
    ):
        return {}, (
            f"undecided: the ratio is {claim.vs_bf16_bound} x{ratio:.2f} (a search stopped below its "
            "boundary); raise serve_bench.capacity.max_probes"
        )
    return {"capacity_vs_bf16": ratio}, None
