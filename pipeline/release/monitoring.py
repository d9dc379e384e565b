"""Prometheus rules and a Grafana dashboard for a bundle, with the bundle's own numbers (monitoring/).

Metric names are those vLLM 0.26 exports (vllm/v1/metrics/loggers.py, label `model_name` = the served
name); counters carry prometheus_client's `_total` suffix and histograms `_bucket`. Thresholds come from
this build: the acceptance it was evaluated at (served under load when measured), the draft/target cost
ratio below which speculation is slower than plain decoding, and the serving benchmark's p99 TTFT and ITL
at the target concurrency times `monitoring.latency_margin` (the latency gates' thresholds where nothing
was measured): the latency alert, which each latency alert's description sets beside the SLO and the latency gate
(pipeline/release/latency.py names the three). The queue-time alert uses the TTFT bound, since time in the queue is
part of TTFT.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import yaml

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
KV_CACHE = "vllm:kv_cache_usage_perc"
TTFT, ITL, QUEUE = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds",
)
GENERATED = "vllm:generation_tokens_total"
# Histogram bucket bounds vLLM 0.26 uses (loggers.py). histogram_quantile interpolates inside a bucket, so a
# threshold inside one compares against an estimate, not a measurement: thresholds are raised to the next bound
# (and queue time, whose first bucket ends at 0.3 s, is never alerted on below it).
BUCKETS = {
    TTFT: [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    ],
    ITL: [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    QUEUE: [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0],
}
# Recording rules (level:metric:operations).
ACCEPTANCE_RATIO = "model_name:vllm_spec_decode_acceptance:ratio_rate5m"
P99 = {
    TTFT: "model_name:vllm_time_to_first_token_seconds:p99_5m",
    ITL: "model_name:vllm_inter_token_latency_seconds:p99_5m",
    QUEUE: "model_name:vllm_request_queue_time_seconds:p99_5m",
}


@dataclass
class AlertLevels:
    """The numbers the alerts compare against, and where each came from."""

    served_name: str
    acceptance: float | None  # accepted per draft token the bundle was evaluated at; None: no speculation
    acceptance_source: str
    cost_ratio: float | None  # below this accepted/drafted ratio speculation is slower than plain decoding
    ttft_p99_s: float | None
    itl_p99_s: float | None
    latency_source: str
    kv_cache_usage_max: float
    warning_fraction: float
    # The SLO's and the latency gate's p99 TTFT and ITL in ms ("ttft", "itl"), which the latency alerts' descriptions
    # set their own threshold beside (the three targets of pipeline/release/latency.py).
    slo_ms: dict[str, float] = field(default_factory=dict)
    gate_ms: dict[str, float] = field(default_factory=dict)

    def alert_ms(self) -> dict[str, float]:
        """The latency alert's thresholds in ms as the rules compare them (raised to a histogram bucket bound)."""
        return {
            key: bucket_bound(metric, seconds) * 1000
            for key, metric, seconds in (("ttft", TTFT, self.ttft_p99_s), ("itl", ITL, self.itl_p99_s))
            if seconds is not None
        }


def bucket_bound(metric: str, seconds: float) -> float:
    """The smallest bucket bound of the metric's histogram at or above `seconds` (the largest past the last)."""
    return next((b for b in BUCKETS[metric] if b >= seconds - 1e-12), BUCKETS[metric][-1])


def _selector(name: str) -> str:
    return '{model_name="%s"}' % name.replace("\\", "\\\\").replace('"', '\\"')


def rules(levels: AlertLevels, group: str) -> dict:
    """A Prometheus rule file (`promtool check rules` format): recording rules, then alerts."""
    sel = _selector(levels.served_name)
    recording = [
        {"record": P99[m], "expr": f"histogram_quantile(0.99, sum by (model_name, le) (rate({m}_bucket{sel}[5m])))"}
        for m in (TTFT, ITL, QUEUE)
    ]
    alerts = [
        {
            "alert": "VllmKvCacheNearlyFull",
            "expr": f"max by (model_name) ({KV_CACHE}{sel}) > {levels.kv_cache_usage_max}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"KV cache above {levels.kv_cache_usage_max:.0%} on {{{{ $labels.model_name }}}}",
                "description": "Requests will queue or be preempted; add replicas or lower max_num_seqs.",
            },
        }
    ]
    if levels.acceptance is not None:
        recording.insert(0, _acceptance_recording(sel))
        alerts += _acceptance_alerts(levels, sel)
    alerts += _latency_alerts(levels, sel)
    return {
        "groups": [
            {"name": f"{group}.recording", "interval": "30s", "rules": recording},
            {"name": f"{group}.alerts", "rules": alerts},
        ]
    }


def _acceptance_recording(sel: str) -> dict:
    return {
        "record": ACCEPTANCE_RATIO,
        "expr": f"sum by (model_name) (rate({ACCEPTED}{sel}[5m])) / sum by (model_name) (rate({DRAFTED}{sel}[5m]))",
    }


def _acceptance_alerts(levels: AlertLevels, sel: str) -> list[dict]:
    """Acceptance below the warning level; below break-even too where the evaluated acceptance is above it."""
    alerts = []
    warn_at = levels.acceptance * levels.warning_fraction
    alerts.append(
        {
            "alert": "SpeculativeAcceptanceLow",
            "expr": f"{ACCEPTANCE_RATIO}{sel} < {warn_at:.4g}",
            "for": "15m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"Accepted/drafted tokens below {warn_at:.3f} "
                f"({levels.warning_fraction:.0%} of the evaluated "
                f"{levels.acceptance:.3f})",
                "description": f"Evaluated at {levels.acceptance:.3f} "
                f"({levels.acceptance_source}); traffic may have drifted from "
                "the draft's training domain.",
            },
        }
    )
    # Only where the evaluated acceptance is above the break-even ratio: otherwise the alert would fire on a
    # deployment behaving exactly as evaluated (speculation then shipped because it was measured to pay).
    if levels.cost_ratio is not None and levels.acceptance > levels.cost_ratio:
        alerts.append(
            {
                "alert": "SpeculationSlowerThanPlainDecoding",
                "expr": f"{ACCEPTANCE_RATIO}{sel} < {levels.cost_ratio:.4g}",
                "for": "15m",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "Speculative decoding is slower than plain decoding",
                    "description": f"Accepted/drafted below the draft/target cost ratio "
                    f"{levels.cost_ratio:.3f}: lower num_speculative_tokens or "
                    "remove speculative-config (roll back to a plain bundle).",
                },
            }
        )
    return alerts


def _latency_alerts(levels: AlertLevels, sel: str) -> list[dict]:
    """p99 TTFT, ITL and queue time above the histogram bucket bound at or above the measured value."""
    alerts = []
    for metric, measured, what, key in (
        (TTFT, levels.ttft_p99_s, "time to first token", "ttft"),
        (ITL, levels.itl_p99_s, "inter-token latency", "itl"),
        (QUEUE, levels.ttft_p99_s, "queue time", "ttft"),
    ):
        if measured is None:
            continue
        bound = bucket_bound(metric, measured)
        alerts.append(
            {
                "alert": f"Vllm{''.join(w.title() for w in what.split()).replace('-', '')}P99High",
                "expr": f"{P99[metric]}{sel} > {bound:.4g}",
                "for": "10m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": f"p99 {what} above {bound * 1000:.1f} ms (latency alert)",
                    "description": f"Latency alert: {measured * 1000:.1f} ms from "
                    f"{levels.latency_source}, raised to the histogram's next bucket "
                    "bound." + _targets_beside(levels, key, what),
                },
            }
        )
    return alerts


def _targets_beside(levels: AlertLevels, key: str, what: str) -> str:
    """' Beside it: the SLO (serving.slo) p99 TTFT 200 ms; the latency gate (gates.thresholds.max_p99_ttft_ms)
    2000 ms.': the other two latency targets of the same measure (pipeline/release/latency.py)."""
    from pipeline.release.latency import GATE_KEYS

    name = "TTFT" if key == "ttft" else "ITL"
    parts = [
        f"the SLO (serving.slo) p99 {name} {levels.slo_ms[key]:g} ms" if levels.slo_ms.get(key) is not None else None,
        f"the latency gate (gates.thresholds.{GATE_KEYS[key]}) {levels.gate_ms[key]:g} ms"
        if levels.gate_ms.get(key) is not None
        else None,
    ]
    parts = [p for p in parts if p]
    if not parts:
        return ""
    part_of = " (queue time is part of TTFT)" if what == "queue time" else ""
    return f" Beside it{part_of}: {'; '.join(parts)}."


def rules_yaml(levels: AlertLevels, group: str) -> str:
    return yaml.safe_dump(rules(levels, group), sort_keys=False, width=200)


def rules_unit_test(levels: AlertLevels, rule_file: str) -> str:
    """A `promtool test rules` file feeding every alert synthetic series: the KV cache and the latency alerts fire
    above their thresholds and stay quiet at them; where speculation ships, the acceptance alerts fire at 50% of the
    warning level and stay quiet at the evaluated acceptance."""
    sel = _selector(levels.served_name)
    annotations = {
        r["alert"]: {
            k: v.replace("{{ $labels.model_name }}", levels.served_name) for k, v in r["annotations"].items()
        }  # as promtool expands the template
        for g in rules(levels, "")["groups"]
        for r in g["rules"]
        if "alert" in r
    }

    def fired(alert: str, severity: str) -> list[dict]:
        return [
            {
                "exp_labels": {"severity": severity, "model_name": levels.served_name},
                "exp_annotations": annotations[alert],
            }
        ]

    def case(series: list[dict], expected: dict[str, list[dict]]) -> dict:
        return {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": "30m", "alertname": a, "exp_alerts": e} for a, e in expected.items()],
        }

    tests = [
        case(
            [{"series": f"{KV_CACHE}{sel}", "values": f"{levels.kv_cache_usage_max:g}x40"}],
            {"VllmKvCacheNearlyFull": []},
        )
    ]
    if levels.kv_cache_usage_max < 1.0:  # at 1.0 the alert (usage above it) can never fire: nothing to fire on
        full = min(1.0, levels.kv_cache_usage_max + 0.05)
        tests.insert(
            0,
            case(
                [{"series": f"{KV_CACHE}{sel}", "values": f"{full:g}x40"}],
                {"VllmKvCacheNearlyFull": fired("VllmKvCacheNearlyFull", "warning")},
            ),
        )
    tests += _latency_cases(levels, sel, annotations, case, fired)
    if levels.acceptance is not None:
        tests += _acceptance_cases(levels, sel, annotations, case, fired)
    return yaml.safe_dump({"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}, sort_keys=False)


def _histogram(metric: str, sel: str, le: float, per_min: int = 600) -> list[dict]:
    """Bucket counters of `metric` with every observation at or below `le` (a bucket bound) and above the bound
    before it."""
    label = sel[:-1] + ',le="%s"}'
    bounds = [*BUCKETS[metric], "+Inf"]
    return [
        {
            "series": f"{metric}_bucket" + label % (b if b == "+Inf" else f"{b:g}"),
            "values": f"0+{per_min if b == '+Inf' or b >= le else 0}x40",
        }
        for b in bounds
    ]


def _latency_cases(levels: AlertLevels, sel: str, annotations: dict, case, fired) -> list[dict]:
    """Each latency alert fires with every observation in the bucket above its threshold, not with them in the
    threshold's own bucket (histogram_quantile interpolates inside it: at most the threshold)."""
    out = []
    for metric, seconds, what in (
        (TTFT, levels.ttft_p99_s, "time to first token"),
        (ITL, levels.itl_p99_s, "inter-token latency"),
        (QUEUE, levels.ttft_p99_s, "queue time"),
    ):
        if seconds is None:
            continue
        alert = f"Vllm{''.join(w.title() for w in what.split()).replace('-', '')}P99High"
        bound = bucket_bound(metric, seconds)
        above = [b for b in BUCKETS[metric] if b > bound]
        if above:  # past the last bucket histogram_quantile answers the last bound itself: nothing above it to test
            out.append(case(_histogram(metric, sel, above[0]), {alert: fired(alert, "warning")}))
        out.append(case(_histogram(metric, sel, bound), {alert: []}))
    return out


def _acceptance_cases(levels: AlertLevels, sel: str, annotations: dict, case, fired) -> list[dict]:
    drafted_per_min = 1000

    def series(ratio: float) -> list[dict]:
        accepted = int(round(drafted_per_min * ratio))
        return [
            {"series": f"{DRAFTED}{sel}", "values": f"0+{drafted_per_min}x40"},
            {"series": f"{ACCEPTED}{sel}", "values": f"0+{accepted}x40"},
        ]

    low = levels.acceptance * levels.warning_fraction * 0.5
    critical = "SpeculationSlowerThanPlainDecoding" in annotations and low < levels.cost_ratio
    return [
        case(
            series(low),
            {
                "SpeculativeAcceptanceLow": fired("SpeculativeAcceptanceLow", "warning"),
                "SpeculationSlowerThanPlainDecoding": fired("SpeculationSlowerThanPlainDecoding", "critical")
                if critical
                else [],
            },
        ),
        case(series(levels.acceptance), {"SpeculativeAcceptanceLow": [], "SpeculationSlowerThanPlainDecoding": []}),
    ]


def dashboard_json(levels: AlertLevels, title: str, uid: str) -> str:
    """A Grafana dashboard built with grafana-foundation-sdk (models generated from Grafana's schema)."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    sel = _selector(levels.served_name)
    source = DataSourceRef(type_val="prometheus", uid="${datasource}")

    def panel(name: str, expr: str, unit: str, legend: str = "{{model_name}}"):
        return (
            timeseries.Panel()
            .title(name)
            .unit(unit)
            .datasource(source)
            .height(8)
            .span(12)
            .with_target(prometheus.Dataquery().expr(expr).legend_format(legend))
        )

    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .tags(["vllm", "modelprep"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").type("prometheus").label("Prometheus"))
    )
    if levels.acceptance is not None:
        board = board.with_panel(
            panel(
                f"Accepted / drafted tokens (evaluated {levels.acceptance:.3f})",
                f"{ACCEPTANCE_RATIO}{sel}",
                "percentunit",
            )
        )
    board = (
        board.with_panel(panel("KV cache usage", f"max by (model_name) ({KV_CACHE}{sel})", "percentunit"))
        .with_panel(panel("p99 time to first token", f"{P99[TTFT]}{sel}", "s"))
        .with_panel(panel("p99 inter-token latency", f"{P99[ITL]}{sel}", "s"))
        .with_panel(panel("p99 queue time", f"{P99[QUEUE]}{sel}", "s"))
        .with_panel(panel("Generated tokens/s", f"sum by (model_name) (rate({GENERATED}{sel}[5m]))", "short"))
    )
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
