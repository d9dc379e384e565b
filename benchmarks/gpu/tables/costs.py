"""Tables of benchmarks/gpu/COSTS.md: the serving-cost profiles (data/serving-cost-profiles/*.json, assembled
from raw/costs/ by benchmarks/gpu/costs.sh) and the prediction against the demo's trained models as served.

Reads raw/costs/ (measure_costs.py's output: one folder per run with gpu.txt and versions.txt, one folder per
shape, served-demo/ for the served check, cpu-estimate/ for the CPU acceptance estimates of the same demo models)
and the profiles. Predictions are the pipeline's own (pipeline/evaluate/serving_costs.py).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline.evaluate import serving_costs  # noqa: E402
from render import Table, facts, num, times  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw/costs"
RUNS = tuple(f"costs/{p.name}" for p in sorted(RAW.glob("lease-*")))
METHODS = ("draft_model", "eagle3", "ngram")


def profiles() -> list[serving_costs.CostProfile]:
    return serving_costs.available()


def target(prof: serving_costs.CostProfile) -> Table:
    t = prof.target
    return facts([("target parameters (M)", f"{t['params'] / 1e6:.1f}"), ("layers", t["num_hidden_layers"]),
                  ("hidden size", t["hidden_size"]), ("vocabulary", t["vocab_size"]),
                  ("runs", ", ".join(f"`{r}`" for r in prof.runs))])


def plain(prof: serving_costs.CostProfile) -> Table:
    return Table(("plain decoding, batch", *prof.plain_step_ms),
                 (("step as measured (ms)", *(num(v) for v in prof.plain_step_ms_measured.values())),
                  ("monotone fit (ms)", *(num(v) for v in prof.plain_step_ms.values()))))


def methods(prof: serving_costs.CostProfile) -> Table:
    rows = []
    for name, m in prof.methods.items():
        err = list(m.interpolation_error.values())
        rows.append((name, f"`{m.run}`", f"{m.drafter['params'] / 1e6:.1f}" if m.drafter else "-",
                     str(m.drafter["num_hidden_layers"]) if m.drafter else "-",
                     f"{100 * max(err):.0f}% (median {100 * statistics.median(err):.0f}%)" if err else "-"))
    return Table(("method", "run", "draft parameters (M)", "draft layers",
                  "an inner k interpolated from its neighbours: largest error over the batch sizes"), tuple(rows))


def steps(prof: serving_costs.CostProfile, name: str) -> Table:
    m = prof.methods[name]
    batches = list(next(iter(m.step_ms_measured.values())))
    rows = tuple((k, *(f"{num(ms)} (x{num(ms / serving_costs.interpolate(m.plain_step_ms, int(b)), 1)})"
                       for b, ms in by_batch.items())) for k, by_batch in m.step_ms_measured.items())
    return Table(("k", *(f"batch {b}" for b in batches)), rows)


def prompts() -> list:
    """The held-out prompts the served check ran (measure_costs.py served-prompts, carried as .gpu/served)."""
    return json.loads((RAW / "cpu-estimate" / "prompts.json").read_text())


def served_rows(by_shape: dict[str, serving_costs.CostProfile]) -> list[dict]:
    """The demo's trained models as served (measure_costs.py served, each run's served-demo/) against the
    prediction from the CPU estimate of the same models and the demo-shape profile."""
    prof = by_shape.get("demo")
    rows = []
    for served in sorted(RAW.glob("lease-*/served-demo")):
        plain_file = served / "plain-k0.json"
        if prof is None or not plain_file.is_file():
            continue
        plain_runs = {r["batch"]: r["served"] for r in json.loads(plain_file.read_text())["runs"]}
        for method in METHODS:
            est_file = RAW / "cpu-estimate" / f"speculative-{method}.json"
            if not est_file.is_file():
                continue
            est = json.loads(est_file.read_text())
            for f in sorted(served.glob(f"{method}-k*.json"), key=lambda p: int(p.stem.split("-k")[1])):
                rec = json.loads(f.read_text())
                k = rec["k"]
                for r in rec["runs"]:
                    b, s, p = r["batch"], r["served"], plain_runs[r["batch"]]
                    measured = (s["tokens"] / s["wall_s"]) / (p["tokens"] / p["wall_s"])
                    predicted = (prof.speedup(method, b, est["tokens_per_step_by_k"][str(k)],
                                              est["drafted_per_step_by_k"][str(k)], est["steps_per_response_by_k"][str(k)])
                                 if method in prof.methods else None)
                    # batch 1: one request at a time, so a request's wall time over its steps (the prefill's and the
                    # estimate's verification steps) is the speculative step as served with these models
                    implied = (1000.0 * s["wall_s"] / len(prompts()) / (est["steps_per_response_by_k"][str(k)] + 1)
                               if b == 1 else None)
                    cost = prof.methods.get(method)
                    profile_step = (serving_costs.interpolate(cost.step_ms[str(k)], 1)
                                    if cost is not None and str(k) in cost.step_ms and b == 1 else None)
                    rows.append({"run": served.parent.name, "method": method, "k": k, "batch": b,
                                 "implied_step": implied, "profile_step": profile_step,
                                 "plain": p["tokens"] / p["wall_s"], "spec": s["tokens"] / s["wall_s"],
                                 "measured": measured, "predicted": predicted,
                                 "vllm_acc": (s["num_accepted_tokens"] / s["num_draft_tokens"]
                                              if s.get("num_draft_tokens") else None),
                                 "cpu_acc": est["accepted_per_step_by_k"][str(k)] / est["drafted_per_step_by_k"][str(k)]})
    return rows


def demo_profile() -> serving_costs.CostProfile:
    return next(p for p in profiles() if p.name.endswith("-demo"))


def calibrated_rows() -> list[dict]:
    return served_rows({"demo": demo_profile()})


def served() -> Table:
    rows = []
    for r in calibrated_rows():
        ratio = r["predicted"] / r["measured"] if r["predicted"] is not None else None
        rows.append((r["run"], r["method"], str(r["k"]), str(r["batch"]), f"{r['plain']:.0f}", f"{r['spec']:.0f}",
                     times(r["measured"]), times(r["predicted"]), num(ratio), num(r["vllm_acc"], 3),
                     num(r["cpu_acc"], 3)))
    return Table(("run", "method", "k", "batch", "plain tok/s", "speculative tok/s", "served speedup", "predicted",
                  "predicted / served", "vLLM accepted/drafted", "CPU estimate"), tuple(rows))


def served_steps() -> Table:
    rows = [(r["run"], r["method"], str(r["k"]), f"{r['implied_step']:.2f}", f"{r['profile_step']:.2f}",
             f"{r['implied_step'] / r['profile_step']:.2f}") for r in calibrated_rows()
            if r["implied_step"] is not None and r["profile_step"] is not None]
    return Table(("run", "method", "k", "served step (ms)", "profile step (ms)", "served / profile"), tuple(rows))


def spread(rows: list[dict]) -> tuple[int, str]:
    errors = [abs(r["predicted"] / r["measured"] - 1) for r in rows if r["predicted"] is not None]
    return len(errors), f"{100 * max(errors):.0f}% (median {100 * sorted(errors)[len(errors) // 2]:.0f}%)"


def calibration() -> Table:
    return Table(("profile", "method", "served runs it is calibrated by (pooled)", "tokens per step from (n-gram)",
                  "scale at concurrency"),
                 tuple((prof.name, name, ", ".join(f"`{r}`" for r in m.served_runs),
                        ", ".join(f"`{e}`" for e in m.served_estimates.values()) or "-",
                        ", ".join(f"c={c} x{v:.2f}" for c, v in m.served_scale.items()))
                       for prof in profiles() for name, m in prof.methods.items() if m.served_scale))


def served_summary() -> Table:
    rows = calibrated_rows()
    n, calibrated = spread(rows)
    decided = [r for r in rows if r["predicted"] is not None and (r["predicted"] >= 1) != (r["measured"] >= 1)]
    demo = demo_profile()
    bare = demo.uncalibrated()
    _, uncalibrated = spread(served_rows({"demo": bare}))
    return facts([("predicted cells", n), ("largest abs(predicted / served - 1), calibrated profile", calibrated),
                  ("the same without the profile's served calibration", uncalibrated),
                  ("cells where prediction and measurement disagree on whether speculation beats plain decoding",
                   f"{len(decided)}" + (" (" + ", ".join(f"{r['method']} k={r['k']} batch {r['batch']}"
                                                          for r in decided) + ")" if decided else ""))])


def run_machines() -> Table:
    return Table(("run", "gpu.txt", "versions.txt"),
                 tuple((f"`costs/{d.name}`", (d / "gpu.txt").read_text().strip(), (d / "versions.txt").read_text().strip())
                       for d in sorted(RAW.glob("lease-*"))))


def blocks() -> dict:
    out = {"machines": run_machines, "calibration": calibration, "served": served, "served-steps": served_steps,
           "served-summary": served_summary}
    for prof in profiles():
        out[f"target-{prof.name}"] = lambda prof=prof: target(prof)
        out[f"plain-{prof.name}"] = lambda prof=prof: plain(prof)
        if prof.methods:
            out[f"methods-{prof.name}"] = lambda prof=prof: methods(prof)
        for name in prof.methods:
            out[f"steps-{name}-{prof.name}"] = lambda prof=prof, name=name: steps(prof, name)
    return out


BLOCKS = blocks()
