"""The three latency numbers a bundle carries, each under one name used the same way in params.yaml, the card, the
gate's checks (GATE.json) and the alert annotations (monitoring/rules.yaml):

- the SLO (`serving.slo`): the p99 TTFT and ITL/TPOT a replica must meet for a load to count towards its capacity
  (serve_bench's search, the card's users per GPU): what to promise users and size the fleet by.
- the latency gate (`gates.thresholds.max_p99_ttft_ms`, `max_p99_itl_ms`): the most the shipped config's p99 may be
  at serving.target_concurrency, or the build fails. A regression guard against a broken build (a slow kernel, a
  draft that stalls), set looser than the SLO: the SLO's own question, how many users meet it, is capacity's.
- the latency alert (`monitoring/rules.yaml`): production's p99 over 10 minutes above the measured p99 at
  serving.target_concurrency times `monitoring.latency_margin` (the latency gate where nothing was measured),
  raised to the next bucket bound of vLLM's histogram. It tells on-call this replica serves slower than it was
  measured to, whatever the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

SLO, GATE, ALERT = "SLO", "latency gate", "latency alert"
GATE_KEYS = {"ttft": "max_p99_ttft_ms", "itl": "max_p99_itl_ms"}


@dataclass(frozen=True)
class LatencyTarget:
    name: str  # SLO | latency gate | latency alert
    setting: str  # where it is set
    ttft_ms: float | None
    itl_ms: float | None  # ITL, or TPOT for an SLO without an ITL objective
    role: str


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms"


def targets(
    slo, gate_ms: dict[str, float], alert_ms: dict[str, float] | None, alert_source: str | None
) -> list[LatencyTarget]:
    """slo: serving.slo (a Slo); gate_ms: the latency gate's thresholds as the verdict applied them ("ttft", "itl");
    alert_ms: the alert rules' thresholds (None: no alert rules in this bundle)."""
    token = "TPOT" if slo.p99_itl_ms is None else "ITL"
    rows = [
        LatencyTarget(
            SLO,
            "`serving.slo`",
            slo.p99_ttft_ms,
            slo.token_ms,
            f"capacity: a load counts only where every p99 meets it (p99 {token} on the second column)",
        ),
        LatencyTarget(
            GATE,
            f"`gates.thresholds.{GATE_KEYS['ttft']}`, `{GATE_KEYS['itl']}`",
            gate_ms.get("ttft"),
            gate_ms.get("itl"),
            "the build fails if the shipped config's p99 at `serving.target_concurrency` is above it: "
            "a regression guard",
        ),
    ]
    if alert_ms is not None:
        rows.append(
            LatencyTarget(
                ALERT,
                "`monitoring/rules.yaml` (`monitoring.latency_margin`)",
                alert_ms.get("ttft"),
                alert_ms.get("itl"),
                f"fires when production's p99 over 10 minutes is above it: {alert_source}",
            )
        )
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def relation(rows: list[LatencyTarget]) -> str:
    """How the three compare, in words: which is looser than which, and what that means for on-call."""
    by = {r.name: r for r in rows}
    slo, gate, alert = by[SLO], by[GATE], by.get(ALERT)
    out = []
    ttft, itl = _ratio(gate.ttft_ms, slo.ttft_ms), _ratio(gate.itl_ms, slo.itl_ms)
    if ttft is not None or itl is not None:
        looser = [f"x{r:.3g} the SLO's {n}" for n, r in (("TTFT", ttft), ("token latency", itl)) if r is not None]
        if all(r >= 1 for r in (ttft, itl) if r is not None):
            out.append(
                f"The latency gate is {' and '.join(looser)}: it catches a broken build, not a missed SLO "
                "(capacity answers how many users meet the SLO)"
            )
        else:
            out.append(
                f"The latency gate is {' and '.join(looser)}: tighter than the SLO somewhere, so a build "
                "can fail its gate at a load that meets the SLO"
            )
    if alert is not None:
        above = [
            n
            for n, a, s in (("TTFT", alert.ttft_ms, slo.ttft_ms), ("token latency", alert.itl_ms, slo.itl_ms))
            if a is not None and s is not None and a > s
        ]
        out.append(
            f"the latency alert fires above the SLO's {' and '.join(above)}, so a p99 between the two misses "
            "the SLO without alerting: watch the SLO with its own rule where it is promised to users"
            if above
            else "the latency alert fires at or below the SLO"
        )
    return "; ".join(out) + "." if out else ""


def gate_ms(checks) -> dict[str, float]:
    """The latency gate's thresholds as a verdict's checks applied them (skipped ones too: the value still stands)."""
    keys = {v: k for k, v in GATE_KEYS.items()}
    return {keys[c.check]: c.threshold for c in checks if c.check in keys}


def describe(rows: list[LatencyTarget]) -> str:
    """'SLO p99 TTFT 200 ms / ITL 50 ms; latency gate 2000 ms / 100 ms': for an alert's description."""
    return "; ".join(f"{r.name} {_ms(r.ttft_ms)} / {_ms(r.itl_ms)}" for r in rows)
