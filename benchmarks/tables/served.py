"""Rows computed from serve_bench records and CPU estimates: one row type per question, shared by every page.

Decisions and predictions are the pipeline's own functions (decision.speculation_for, decision.choose_kernel,
serving_costs.predict) over the committed records; pages only pick columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from render import Column, times
from tables.read import BASELINE, PLAIN, RAW, ROOT, ServeBenchRecord, concurrencies, record, record_path, serving_costs

TOLERANCE = 0.20  # the target for a predicted served speedup: within 20% of the served one


@dataclass(frozen=True)
class Config:
    """One served config of one variant in one run."""

    run: str
    variant: str
    config: str
    k: int | None
    tok: dict[int, float]  # concurrency -> output tokens/s
    vs_plain: dict[int, float]  # x the variant's own plain decoding, same run
    vs_base: dict[int, float]  # x BF16's plain decoding, same run (empty where BF16 was not served there)
    accepted: float | None  # vLLM's accepted per drafted token at the lowest concurrency
    mean_len: float | None
    kernels: str
    capacity: object | None  # pipeline Capacity at the SLO, where searched
    users_vs_plain: str | None = None
    extra: dict = field(default_factory=dict)


def capacity_cell(users: float, status: str, ceiling: float | None) -> str:
    """Users per GPU at the SLO and how the search ended."""
    if status == "found":
        return f"{users:g} (next up, {ceiling:g}, missed)"
    if status == "bracket":
        return f"{users:g} (probes ran out; {ceiling:g} missed)" if ceiling else f">= {users:g}"
    return f">= {users:g}" if status == "at_bound" else f"{users:g} ({status})"


def users_ratio(cap, base) -> str | None:
    """Users at the SLO over a reference's; a search that ended at its bound makes the ratio a bound too."""
    if cap is None or base is None:
        return None
    bound = (
        "undecided (both at the search's bound)"
        if cap.lower_bound and base.lower_bound
        else "at least"
        if cap.lower_bound
        else "at most"
        if base.lower_bound
        else ""
    )
    return f"x{cap.users_per_gpu / base.users_per_gpu:.2f} {bound}".strip()


def named_configs(rec: ServeBenchRecord) -> list[tuple[str, object]]:
    """Plain decoding on each kernel compared, plain, each method, each k schedule: the stage's order."""
    out = [(f"plain on {name}", c) for name, c in rec.kernels.items() if name != rec.kernel]
    out.append((f"plain on {rec.kernel}" if rec.kernel else PLAIN, rec.configs[PLAIN]))
    out += [(name, c) for name, c in rec.speculative().items()]
    return out + [(f"{m} k per batch {c.schedule}", c) for m, c in rec.schedules.items()]


def configs(run: str, variants: tuple[str, ...]) -> list[Config]:
    base = record(run, BASELINE).configs[PLAIN] if BASELINE in variants else None
    rows = []
    for variant in variants:
        rec = record(run, variant)
        plain, conc = rec.configs[PLAIN], concurrencies(rec)
        for name, c in named_configs(rec):
            tok = {n: c.at(n).output_throughput for n in conc if c.at(n)}
            first = c.at(conc[0])
            rows.append(
                Config(
                    run,
                    variant,
                    name,
                    c.num_speculative_tokens or None,
                    tok,
                    {n: t / plain.at(n).output_throughput for n, t in tok.items()},
                    {n: t / base.at(n).output_throughput for n, t in tok.items()} if base else {},
                    first.accepted_per_draft_token if first else None,
                    first.mean_acceptance_length if first else None,
                    ", ".join(c.kernels_used),
                    c.capacity,
                    "x1.00" if c is plain else users_ratio(c.capacity, plain.capacity),
                )
            )
    return rows


def many(*runs: tuple[str, tuple[str, ...]]) -> list[Config]:
    return [row for run, variants in runs for row in configs(run, variants)]


def misses(run: str, variant: str = BASELINE) -> list[dict]:
    """Each config's first load over its capacity and which objective it missed (Slo.misses, the search's own)."""
    rows = []
    for name, c in record(run, variant).configs.items():
        cap = c.capacity
        level = next(
            (
                lvl
                for lvl in [*c.levels.values(), *cap.probes]
                if cap.ceiling is not None and lvl.concurrency == cap.ceiling
            ),
            None,
        )
        if level is not None:
            rows.append({"config": name, "users": cap.ceiling, "missed": ", ".join(cap.slo.misses(level))})
    return rows


def predicted(run: str, variant: str, estimates: str, calibrated) -> list[dict]:
    """Each served method and concurrency: served speedup over plain and the pipeline's prediction from the CPU
    estimate at the served k, with the profile's random-weight costs (before) and calibrated (after)."""
    rec = record(run, variant)
    plain, conc, rows = rec.configs[PLAIN], concurrencies(rec), []
    for name, config in rec.speculative().items():
        est = json.loads((RAW / run / estimates / f"speculative-{name}.json").read_text())
        k = config.num_speculative_tokens
        pred = {
            label: serving_costs.predict(
                serving_costs.Choice(prof, label, 1.0),
                name,
                est["tokens_per_step_by_k"],
                est["drafted_per_step_by_k"],
                conc,
                est.get("steps_per_response_by_k"),
            )
            for label, prof in (("before", calibrated.uncalibrated()), ("after", calibrated))
        }
        for c in conc:
            served = config.at(c).output_throughput / plain.at(c).output_throughput
            after = pred["after"].speedup(c, k)
            rows.append(
                {
                    "run": run,
                    "variant": variant,
                    "method": name,
                    "k": k,
                    "c": c,
                    "served": served,
                    "before": pred["before"].speedup(c, k),
                    "after": after,
                    "ratio": after / served,
                    "within": "yes" if abs(after / served - 1) <= TOLERANCE else "no",
                    "cpu": est["accepted_per_draft_token"],
                    "vllm": config.at(c).accepted_per_draft_token,
                    "sample": "in sample"
                    if str(record_path(run, variant).relative_to(ROOT)) in calibrated.methods[name].served_runs
                    else "out of sample",
                }
            )
    return rows


def thousands(x: float | None) -> str | None:
    return None if x is None else f"{x:,.0f}"


def per_c(conc: tuple[int, ...], header: str, value, fmt="{}") -> tuple[Column, ...]:
    """One column per concurrency: header.format(c=c) and value(row, c)."""
    return tuple(Column(header.format(c=c), lambda r, c=c: value(r, c), fmt) for c in conc)


def tok_x_plain(r: Config, c: int) -> str | None:
    return f"{thousands(r.tok[c])} ({times(r.vs_plain[c])})" if c in r.tok else None


def tok_x_base(r: Config, c: int) -> str | None:
    return f"{thousands(r.tok[c])} ({times(r.vs_base[c])})" if c in r.vs_base else tok_x_plain(r, c)


CONFIG = (
    Column("run", lambda r: f"`{r.run}`"),
    Column("variant", lambda r: f"`{r.variant}`"),
    Column("config", "config"),
    Column("k", "k"),
)
CAPACITY = (
    Column(
        "users per GPU at the SLO",
        lambda r: r.capacity and capacity_cell(r.capacity.users_per_gpu, r.capacity.status, r.capacity.ceiling),
    ),
    Column("x its plain", "users_vs_plain"),
    Column("output tok/s per GPU there", lambda r: thousands(r.capacity and r.capacity.output_tokens_per_s_per_gpu)),
)
