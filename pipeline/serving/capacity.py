"""Capacity at the SLO: the most users one replica carries with its p99 latencies within serving.slo.

serve_bench finds it for each config on the config's own running server, after its concurrency sweep: a bounded
bisection whose probes are `vllm bench serve` runs at one load each (`--max-concurrency N`, or `--request-rate R`
for Poisson arrival), with `--goodput` at the SLO. Why not vLLM 0.26's own sweep tools: `vllm bench sweep
serve_workload` starts its own `vllm serve` per serve-parameter combination (a bundle-shaped directory, our log and
kernel checks, 1.5-2.5 min per start on an H100) and spaces its loads linearly between one user and the whole
dataset at once (workload_iters fixed in advance), with no notion of an SLO: it maps the curve, it does not stop at
the boundary. A bisection reuses the running server, starts from the bracket the sweep already measured, and spends
its probes where the answer is. vLLM's goodput is kept: it counts the requests that met the SLO at each probe.

The search itself (search, bracket) takes the probe as a function, so it runs here on synthetic measurements; the
driver that calls `vllm bench serve` stays in pipeline/serving/sweep.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from pipeline.core.errors import PipelineError
from pipeline.serving.bench_record import (
    AT_BOUND,
    BRACKET,
    CONFIG,
    FOUND,
    NEVER,
    PLAIN,
    Capacity,
    LoadLevel,
    ServeBenchRecord,
    ServeConfigResult,
)
from pipeline.serving.settings import ServeBenchParams, Slo

CONCURRENCY, POISSON = "concurrency", "poisson"
# Two loads closer than this (relative) are one answer: runs of one config differ by ~4% (serve_bench.kernel_tie).
RESOLUTION = 0.05
RATE_WINDOW_S = 30  # an open-loop probe sends about this many seconds of arrivals (at least serve_bench.min_prompts)


def load_of(level: LoadLevel, arrival: str) -> float | None:
    """The load a measurement was taken at: its concurrency (closed loop), or its request rate (open loop)."""
    if arrival == CONCURRENCY:
        return level.concurrency if level.request_rate is None else None
    return level.request_rate


def bracket(levels: dict[float, LoadLevel], slo: Slo) -> tuple[float | None, float | None]:
    """(lo, hi): the smallest load measured to miss the SLO, and the largest one below it measured to meet it
    (None: none). Latency rises with load; where noise says otherwise, the first miss stands."""
    misses = [x for x, lvl in levels.items() if not slo.meets(lvl)]
    hi = min(misses) if misses else None
    meets = [x for x, lvl in levels.items() if slo.meets(lvl) and (hi is None or x < hi)]
    return (max(meets) if meets else None), hi


def _close(lo: float, hi: float, integer: bool) -> bool:
    return hi - lo <= (max(1, math.floor(lo * RESOLUTION)) if integer else lo * RESOLUTION)


def _next_load(lo: float | None, hi: float | None, bound: float, integer: bool, seed: float | None) -> float | None:
    """The next load to probe, or None when the bracket is answer enough."""
    if lo is None:
        if integer:
            return 1 if hi is None or hi > 1 else None  # one user at a time is the floor
        return min(seed or bound / 16, bound) if hi is None else hi / 2  # open loop: halve until a rate meets it
    if hi is None:
        return None if lo >= bound else min(lo * 2, bound)
    if _close(lo, hi, integer):
        return None
    return (lo + hi) // 2 if integer else (lo + hi) / 2


def search(
    probe: Callable[[float], LoadLevel],
    slo: Slo,
    arrival: str,
    bound: float,
    max_probes: int,
    known: Iterable[LoadLevel] = (),
    gpus: int = 1,
    seed: float | None = None,
    floor_meets: bool | None = None,
) -> Capacity:
    """The largest load within `bound` whose measurement meets the SLO, probing at most max_probes new loads.

    known: measurements already taken (the concurrency sweep: probes too, for closed-loop arrival); probe(load)
    takes a new one (a PipelineError stops the search where it is, with the reason in the note). seed: the first
    open-loop rate to try (serve_bench: the request rate the sweep sustained within the SLO). floor_meets: whether
    one request at a time meets the SLO, for open-loop arrival, where no rate is low enough to prove it."""
    integer = arrival == CONCURRENCY
    levels = {x: lvl for lvl in known if (x := load_of(lvl, arrival)) is not None and x <= bound}
    probes: list[LoadLevel] = []
    note = None
    if floor_meets is False:
        return _result(levels, slo, arrival, bound, gpus, probes, NEVER, None)
    while len(probes) < max_probes:
        lo, hi = bracket(levels, slo)
        x = _next_load(lo, hi, bound, integer, seed)
        if x is None:
            break
        try:
            level = probe(x)
        except PipelineError as e:
            note = f"the search stopped at load {x:g}: {str(e)[:300]}"
            break
        probes.append(level)
        levels[x] = level
    lo, hi = bracket(levels, slo)
    if lo is None:
        status = NEVER if (integer and hi == 1) else BRACKET
    elif hi is None:
        status = AT_BOUND if lo >= bound else BRACKET
    else:
        status = FOUND if _close(lo, hi, integer) else BRACKET
    return _result(levels, slo, arrival, bound, gpus, probes, status, note)


def _result(
    levels: dict[float, LoadLevel],
    slo: Slo,
    arrival: str,
    bound: float,
    gpus: int,
    probes: list[LoadLevel],
    status: str,
    note: str | None,
) -> Capacity:
    lo, hi = bracket(levels, slo)
    if status == NEVER:
        lo = None
    level = levels[lo] if lo is not None else None
    users = users_at(level, arrival) if level is not None else 0.0
    return Capacity(
        arrival=arrival,
        slo=slo,
        status=status,
        load=lo or 0,
        users=users,
        gpus=gpus,
        users_per_gpu=users / gpus,
        output_tokens_per_s_per_gpu=level.output_throughput / gpus if level is not None else None,
        request_goodput=level.request_goodput if level is not None else None,
        level=level,
        ceiling=hi,
        bound=bound,
        probes=probes,
        note=note,
    )


def users_at(level: LoadLevel, arrival: str) -> float:
    """Concurrent requests at a measurement: its concurrency, or (open loop) arrival rate x mean request latency."""
    if arrival == CONCURRENCY:
        return float(level.concurrency)
    return level.request_rate * level.e2el_ms["mean"] / 1000


def measured_levels(config: ServeConfigResult, arrival: str) -> list[LoadLevel]:
    """Every measurement of a config at one arrival: the sweep's levels (closed loop) and the search's probes."""
    known = [*config.levels.values(), *(config.capacity.probes if config.capacity else [])]
    return [lvl for lvl in known if load_of(lvl, arrival) is not None]


def users_meeting(config: ServeConfigResult, slo: Slo) -> tuple[float, bool] | None:
    """(users, at least) that a config carries within another objective (a tier's own slo), from what was measured
    for serving.slo: the largest load measured to meet it below the first one measured to miss it; at least: no
    load measured missed it. None when the config's capacity was not searched."""
    if config.capacity is None:
        return None
    arrival = config.capacity.arrival
    levels = {load_of(lvl, arrival): lvl for lvl in measured_levels(config, arrival)}
    lo, hi = bracket(levels, slo)
    if lo is None:
        return 0.0, False
    return users_at(levels[lo], arrival), hi is None


def probe_prompts(cfg: ServeBenchParams, arrival: str, load: float) -> int:
    """Requests a probe sends: as the sweep at that concurrency, or RATE_WINDOW_S seconds of arrivals."""
    if arrival == CONCURRENCY:
        return max(cfg.min_prompts, cfg.prompts_per_concurrency * int(load))
    return max(cfg.min_prompts, math.ceil(load * RATE_WINDOW_S))


def open_loop_seed(sweep: Iterable[LoadLevel], slo: Slo) -> tuple[float | None, bool | None]:
    """(first rate to try, whether one request at a time meets the SLO) from a config's closed-loop sweep: the
    request rate its largest concurrency within the SLO sustained, and its concurrency-1 level's verdict."""
    closed = [lvl for lvl in sweep if lvl.request_rate is None]
    within = [lvl for lvl in closed if slo.meets(lvl)]
    one = next((lvl for lvl in closed if lvl.concurrency == 1), None)
    seed = max(within, key=lambda lvl: lvl.concurrency).request_throughput if within else None
    return seed or None, (slo.meets(one) if one is not None else None)


# dvc plots (plots/serve_pareto/<variant>/) and the gate's PNG: output tokens/s per GPU against p99 token latency,
# every measurement of every config (the sweep's levels and the search's probes), with the SLO as a vertical line.
PARETO_X = "p99_token_latency_ms"
PARETO_Y = "output_tokens_per_s_per_gpu"


def pareto_points(record: ServeBenchRecord, slo: Slo) -> dict[str, list[tuple[float, float]]]:
    """config label -> [(p99 token latency, output tokens/s per GPU)] sorted by latency; plain decoding and each
    method (each k schedule as <method>-schedule). Failed levels are left out: their numbers cover a part only."""
    if record.skipped:
        return {}
    configs = {
        PLAIN: record.configs.get(PLAIN),
        **record.speculative(),
        **{f"{m}-schedule": c for m, c in record.schedules.items()},
    }
    out = {}
    for name, config in configs.items():
        if config is None:
            continue
        levels = [*config.levels.values(), *(config.capacity.probes if config.capacity else [])]
        gpus = replica_gpus(record, config)
        points = sorted(((_token_p99(lvl, slo), lvl.output_throughput / gpus) for lvl in levels if not lvl.failed))
        if points:
            out[name] = points
    return out


def replica_gpus(record: ServeBenchRecord, config: ServeConfigResult) -> int:
    """GPUs one replica of a config used: its capacity's (what the search divided by), else the GPU set its server
    ran on, else the record's tensor parallelism (records from before configs were placed)."""
    if config.capacity is not None:
        return config.capacity.gpus
    return len(config.gpus) if config.gpus else record.tensor_parallel_size or 1


def _token_p99(level: LoadLevel, slo: Slo) -> float:
    return (level.itl_ms if slo.token_metric == "itl" else level.tpot_ms)["p99"]


def pareto_rows(record: ServeBenchRecord, slo: Slo) -> tuple[list[dict], list[str]]:
    """(rows, header) of plots/serve_pareto/<variant>/: a row per measurement of each config (long form, the config
    in CONFIG), and two rows drawing the SLO's token latency as a vertical line from 0 to the highest throughput;
    none when nothing was measured."""
    rows = [
        {PARETO_X: x, CONFIG: _config_named(record, name).label(name), PARETO_Y: y}
        for name, pts in pareto_points(record, slo).items()
        for x, y in pts
    ]
    if rows:
        top = max(r[PARETO_Y] for r in rows)
        rows += [{PARETO_X: slo.token_ms, CONFIG: slo_line(slo), PARETO_Y: y} for y in (0.0, top)]
    return rows, [PARETO_X, CONFIG, PARETO_Y]


def slo_line(slo: Slo) -> str:
    return f"SLO p99 {slo.token_metric.upper()} {slo.token_ms:g} ms"


def pareto_png(path, records: dict[str, ServeBenchRecord], slo: Slo) -> str | None:
    """Every variant's configs on one chart, the SLO's token latency as a line, each config's capacity marked. None
    when it was drawn; else why not (nothing measured, matplotlib missing)."""
    measured = {v: r for v, r in records.items() if not r.skipped and pareto_points(r, slo)}
    if not measured:
        return "no serving benchmark measured"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    fig, ax = plt.subplots(figsize=(9, 6))
    for variant, record in measured.items():
        for name, pts in pareto_points(record, slo).items():
            (line,) = ax.plot(
                [x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=f"{variant} {name}"
            )
            config = _config_named(record, name)
            level = config.capacity.level if config is not None and config.capacity else None
            if level is not None:
                ax.plot(
                    [_token_p99(level, slo)],
                    [level.output_throughput / replica_gpus(record, config)],
                    marker="*",
                    markersize=12,
                    color=line.get_color(),
                )
    ax.axvline(slo.token_ms, color="black", linestyle="--", label=slo_line(slo))
    gpus_named = sorted({r.gpu or "?" for r in measured.values()})
    ax.set_xlabel(f"p99 {slo.token_metric.upper()} (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(
        f"Throughput per GPU vs p99 {slo.token_metric.upper()} ({', '.join(gpus_named)}; * capacity at {slo.label()})",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})  # no version stamp: same numbers, same bytes
    plt.close(fig)
    return None


def _config_named(record: ServeBenchRecord, name: str) -> ServeConfigResult | None:
    if name.endswith("-schedule"):
        return record.schedules.get(name.removesuffix("-schedule"))
    return record.configs.get(PLAIN) if name == PLAIN else record.speculative().get(name)
