"""Check a bundle's monitoring against a real vLLM /metrics scrape (issue #17's GPU validation).

    python benchmarks/gpu/handoff_check.py benchmarks/gpu/raw/handoff

Reads what `bash benchmarks/gpu/session.sh handoff OUT BUNDLE` brought back (metrics-before.txt and
metrics-after.txt: /metrics of the bundle served by vLLM, before and after load; warmup.txt) and the bundle's
monitoring/rules.yaml and dashboard.json (copied beside them under bundle/), and writes check.json: every
series the rules and the dashboard read, whether the scrape has it with the labels they match on, and the
spec-decode acceptance the rules' recording rule would compute from the two scrapes against the alert's
threshold. Exit status 1 when a series is missing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

SERIES = re.compile(r"(vllm:[a-z_:]+?)(_bucket|_total|_sum|_count)?(\{[^}]*\})?(?=[\s\[\)\},]|$)")
MATCHER = re.compile(r'(\w+)="([^"]*)"')


def samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def referenced(exprs: list[str]) -> dict[str, list[dict]]:
    """name (as exposed) -> the distinct label matchers it is read with, for every vllm series the expressions read."""
    out: dict[str, list[dict]] = {}
    for expr in exprs:
        for m in SERIES.finditer(expr):
            matchers = dict(MATCHER.findall(m[3] or ""))
            seen = out.setdefault(m[1] + (m[2] or ""), [])
            if matchers not in seen:
                seen.append(matchers)
    return out


def total(scrape: list, name: str, labels: dict) -> float:
    return sum(s.value for s in scrape if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def main(raw: Path) -> int:
    rules = yaml.safe_load((raw / "bundle/rules.yaml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = (raw / "bundle/dashboard.json").read_text()
    exprs += re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', dashboard)
    exprs = [e.encode().decode("unicode_escape") for e in exprs]
    before, after = (samples((raw / f"metrics-{w}.txt").read_text()) for w in ("before", "after"))
    series = []
    for name, matcher_sets in sorted(referenced(exprs).items()):
        for labels in matcher_sets:
            present = [s for s in after if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
            series.append({"series": name, "matchers": labels, "samples": len(present)})
    missing = [f"{r['series']}{r['matchers'] or ''}" for r in series if not r["samples"]]
    served = next(iter({r["matchers"]["model_name"] for r in series if "model_name" in r["matchers"]}), None)
    labels = {"model_name": served} if served else {}
    delta = {
        n: total(after, n, labels) - total(before, n, labels)
        for n in ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total")
    }
    ratio = (
        delta["vllm:spec_decode_num_accepted_tokens_total"] / delta["vllm:spec_decode_num_draft_tokens_total"]
        if delta["vllm:spec_decode_num_draft_tokens_total"]
        else None
    )
    thresholds = {
        r["alert"]: float(re.search(r"<\s*([0-9.]+)", r["expr"])[1])
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r and "spec_decode_acceptance" in r["expr"]
    }
    result = {
        "served_model_name": served,
        "series": series,
        "missing": missing,
        "load_deltas": delta,
        "acceptance_over_load": ratio,
        "acceptance_alerts": {
            a: {"threshold": t, "would_fire": ratio is not None and ratio < t} for a, t in thresholds.items()
        },
        "warmup": (raw / "warmup.txt").read_text().strip().splitlines(),
    }
    (raw / "check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("missing", "acceptance_over_load", "acceptance_alerts")}, indent=2))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/gpu/raw/handoff")))
