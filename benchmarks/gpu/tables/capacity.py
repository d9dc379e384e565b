"""Tables of benchmarks/gpu/CAPACITY.md: the CPU demo's bundles served as shipped with their capacity at the SLO, the
demo's BF16 through the serve_bench stage (each method, its capacity, what the gate says), and the CPU-predicted
served speedup against the served one.

Reads raw/shipped/ (serve_shipped.py's shipped.json and `vllm bench serve` results) and raw/demo-serve-bf16/ (the
stage's record, its params, the gate's output, the CPU acceptance estimate the run's candidates came from).
Predictions are the pipeline's own (pipeline/evaluate/serving_costs.py) over the committed demo profile.
"""
from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.evaluate import serving_costs  # noqa: E402
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from pipeline.serving.serve_bench import parse_result  # noqa: E402
from pipeline.serving.tiers import Slo  # noqa: E402
from render import Table, Text, facts, num, times  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
SHIPPED = RAW / "shipped"
STAGE = RAW / "demo-serve-bf16"
RUNS = ("shipped", "demo-serve-bf16")
PROFILE = ROOT / "data/serving-cost-profiles/h100-vllm0.26.0-demo.json"
TOLERANCE = 0.20  # the target: predicted within 20% of served


def thousands(x: float | None) -> str:
    return num(x, 0, thousands=True)


def stage_record() -> ServeBenchRecord:
    return records.read(ServeBenchRecord, STAGE / "record.json")


def slo() -> Slo:
    """The objective both runs searched at: the stage record's, checked against the label shipped.json records."""
    objective = stage_record().configs[PLAIN].capacity.slo
    labels = {r["slo"] for r in json.loads((SHIPPED / "shipped.json").read_text())["results"] if "error" not in r}
    if labels != {objective.label()}:
        raise SystemExit(f"raw/shipped/shipped.json searched at {sorted(labels)}, not at {objective.label()}")
    return objective


def shipped_levels() -> dict[tuple[str, str], object]:
    """(variant, tag) -> LoadLevel of serve_shipped.py's raw `vllm bench serve` files (tag: c1, c16, capacity-cN)."""
    out = {}
    with tarfile.open(SHIPPED / "raw.tgz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "raw" and member.name.endswith(".json"):
                raw = json.load(io.TextIOWrapper(tar.extractfile(member)))
                tag = Path(parts[2]).stem.removeprefix("shipped-")
                out[(parts[0], tag)] = parse_result(raw, member.name)
    return out


def capacity_cell(users: float, status: str, ceiling: float | None) -> str:
    if status == "found":
        return f"{users:g} (next up, {ceiling:g}, missed)"
    if status == "bracket":
        return f"{users:g} (probes ran out; {ceiling:g} missed)" if ceiling else f">= {users:g}"
    return f">= {users:g}" if status == "at_bound" else f"{users:g} ({status})"


def shipped_results() -> list[dict]:
    return [r for r in json.loads((SHIPPED / "shipped.json").read_text())["results"] if "error" not in r]


def shipped_conditions() -> Table:
    doc = json.loads((SHIPPED / "shipped.json").read_text())
    # serve_shipped.py serves a bundle a second time without its speculative-config (config "plain") if it has one
    speculating = [r["variant"] for r in doc["results"] if r.get("config") == "plain"]
    return facts([("GPU", doc["gpu"]), ("vLLM", doc["vllm"]), ("torch", doc["torch"]), ("command", f"`{doc['command']}`"),
                  ("concurrency", ", ".join(map(str, doc["concurrency"]))), ("SLO", slo().label()),
                  ("bundles with a speculative-config (also served without it)", ", ".join(speculating) or "none")],
                 ("condition", "value"))


def shipped() -> Table:
    levels, results = shipped_levels(), shipped_results()
    base = next(r for r in results if r["variant"] == "bf16")
    rows = []
    for r in results:
        c1, c16, cap = levels[(r["variant"], "c1")], levels[(r["variant"], "c16")], r["capacity"]
        rows.append((r["variant"], ", ".join(r["kernels_used"]) or "default (unquantized)", f"{r['startup_s']:.0f}",
                     thousands(c1.output_throughput), thousands(c16.output_throughput),
                     f"{c16.ttft_ms['p99']:.0f} / {c16.itl_ms['p99']:.1f}",
                     capacity_cell(cap["users_per_gpu"], cap["status"], cap["ceiling"]),
                     thousands(cap["output_tokens_per_s_per_gpu"]),
                     times(cap["users_per_gpu"] / base["capacity"]["users_per_gpu"])))
    return Table(("bundle", "kernel (vLLM's log)", "start (s)", "c=1 tok/s", "c=16 tok/s", "c=16 p99 TTFT / ITL (ms)",
                  "users per GPU at the SLO", "output tok/s per GPU there", "users vs bf16"), tuple(rows))


def misses_table(rows: list[tuple[str, float, object, Slo]]) -> Table:
    """The first load over each capacity, as the search judged it (Slo.misses over the run's own objective)."""
    return Table(("config", "first load over capacity (users)", "what it missed"),
                 tuple((name, f"{users:g}", ", ".join(objective.misses(level)) or "met the objective")
                       for name, users, level, objective in rows))


def shipped_misses() -> Table:
    levels, objective = shipped_levels(), slo()
    rows = []
    for r in shipped_results():
        ceiling = r["capacity"]["ceiling"]
        miss = levels.get((r["variant"], f"capacity-c{ceiling:g}")) if ceiling else None
        if miss is not None:
            rows.append((r["variant"], ceiling, miss, objective))
    return misses_table(rows)


def concurrencies(rec: ServeBenchRecord) -> list[int]:
    return sorted(lvl.concurrency for lvl in rec.configs[PLAIN].levels.values())


def stage_conditions() -> Table:
    rec = stage_record()
    bench = yaml.safe_load((STAGE / "params.yaml").read_text())["serve_bench"]
    return facts([("GPU", rec.gpu), ("vLLM", rec.vllm_version), ("concurrency", ", ".join(map(str, concurrencies(rec)))),
                  ("capacity searched for every config, probes at most", bench["capacity"]["max_probes"]),
                  ("k schedule (serve_bench.k_schedule)", bench["k_schedule"])], ("condition", "value"))


def stage() -> Table:
    return served_table(stage_record())


def served_table(rec: ServeBenchRecord) -> Table:
    """Each config of a serve_bench record: tok/s per concurrency (x plain), acceptance, capacity at the SLO."""
    plain, conc = rec.configs[PLAIN], concurrencies(rec)
    rows = []
    for name, config in rec.configs.items():
        cells = [f"{thousands(config.at(c).output_throughput)} "
                 f"({times(config.at(c).output_throughput / plain.at(c).output_throughput)})" for c in conc]
        first, cap = config.at(conc[0]), config.capacity
        rows.append((name, str(config.num_speculative_tokens or "-"), *cells, num(first.accepted_per_draft_token, 3),
                     num(first.mean_acceptance_length, 2), capacity_cell(cap.users_per_gpu, cap.status, cap.ceiling),
                     thousands(cap.output_tokens_per_s_per_gpu)))
    return Table(("config", "k", *(f"c={c} tok/s (x plain)" for c in conc), "vLLM accepted/drafted",
                  "mean accepted length", "users per GPU at the SLO", "output tok/s per GPU there"), tuple(rows))


def gate() -> Text:
    return Text("```\n" + (STAGE / "gate.txt").read_text().strip() + "\n```")


def stage_misses() -> Table:
    rows = []
    for name, config in stage_record().configs.items():
        cap = config.capacity
        levels = [*config.levels.values(), *cap.probes]
        miss = next((lvl for lvl in levels if cap.ceiling is not None and lvl.concurrency == cap.ceiling), None)
        if miss is not None:
            rows.append((name, cap.ceiling, miss, cap.slo))
    return misses_table(rows)


def capacity_vs_plain() -> Table:
    rec = stage_record()
    base = rec.configs[PLAIN].capacity.users_per_gpu
    return Table(("config", "users per GPU at the SLO, x plain decoding's"),
                 tuple((name, times(config.capacity.users_per_gpu / base, 3))
                       for name, config in rec.speculative().items()))


def prediction_rows() -> list[dict]:
    return predicted_against_served(stage_record(), STAGE / "cpu-estimate", serving_costs.load(PROFILE))


def predicted_against_served(rec: ServeBenchRecord, estimates: Path, calibrated) -> list[dict]:
    """Each served method and concurrency of a serve_bench record: served speedup over plain, and the pipeline's
    prediction from the CPU estimate (estimates/speculative-<method>.json) at the served k with the profile's
    random-weight costs (before) and calibrated (after)."""
    assembled = calibrated.uncalibrated()
    plain, conc = rec.configs[PLAIN], concurrencies(rec)
    rows = []
    for name, config in rec.speculative().items():
        est = json.loads((estimates / f"speculative-{name}.json").read_text())
        k = config.num_speculative_tokens
        preds = {label: serving_costs.predict(serving_costs.Choice(prof, label, 1.0), name, est["tokens_per_step_by_k"],
                                              est["drafted_per_step_by_k"], conc, est.get("steps_per_response_by_k"))
                 for label, prof in (("assembled", assembled), ("calibrated", calibrated))}
        for c in conc:
            rows.append({"method": name, "k": k, "c": c,
                         "served": config.at(c).output_throughput / plain.at(c).output_throughput,
                         "before": preds["assembled"].speedup(c, k), "after": preds["calibrated"].speedup(c, k),
                         "cpu": est["accepted_per_draft_token"], "vllm": config.at(c).accepted_per_draft_token})
    return rows


def prediction() -> Table:
    rows = []
    for r in prediction_rows():
        ratio = r["after"] / r["served"]
        rows.append((r["method"], str(r["k"]), str(r["c"]), times(r["served"]), times(r["before"]), times(r["after"]),
                     num(ratio), "yes" if abs(ratio - 1) <= TOLERANCE else "no", num(r["cpu"], 3), num(r["vllm"], 3)))
    return Table(("method", "k", "concurrency", "served", "predicted, random-weight costs", "predicted, calibrated",
                  "calibrated / served", f"within {TOLERANCE:.0%}", "CPU accepted/drafted", "vLLM accepted/drafted"),
                 tuple(rows))


def prediction_misses() -> Table:
    rows = [(r["method"], str(r["c"]), f"{r['after'] / r['served'] - 1:+.0%}") for r in prediction_rows()
            if abs(r["after"] / r["served"] - 1) > TOLERANCE]
    return Table(("method", "concurrency", f"calibrated / served - 1 (outside {TOLERANCE:.0%})"),
                 tuple(rows) or (("none", "-", "-"),))


BLOCKS = {"shipped-conditions": shipped_conditions, "shipped": shipped, "shipped-misses": shipped_misses,
          "stage-conditions": stage_conditions, "stage": stage, "gate": gate, "stage-misses": stage_misses,
          "capacity-vs-plain": capacity_vs_plain, "prediction": prediction, "prediction-misses": prediction_misses}
