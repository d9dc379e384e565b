"""Render benchmarks/gpu/COSTS.md from the serving-cost raw files and the profiles assembled from them.

Reads only committed files: benchmarks/gpu/raw/costs/ (measure_costs.py's output: gpu.txt, versions.txt, one
folder per shape, served-demo/ for the served check, cpu-estimate/ for the CPU acceptance estimates of the same
demo models) and pipeline/evaluate/cost_profiles/*.json. Every number below is computed here from those files.
Usage: python benchmarks/gpu/costs_report.py > benchmarks/gpu/COSTS.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.evaluate import serving_costs  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw/costs"
METHODS = ("draft_model", "eagle3", "ngram")


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def profile_section(prof: serving_costs.CostProfile) -> list[str]:
    t = prof.target
    batches = list(prof.plain_step_ms)
    out = [f"### {prof.name}", "",
           f"Target: {t['params'] / 1e6:.1f}M parameters ({t['num_hidden_layers']} layers, hidden {t['hidden_size']}, "
           f"vocabulary {t['vocab_size']}); runs: " + ", ".join(f"`{r}`" for r in prof.runs) + ".", "",
           "| plain decoding, batch | " + " | ".join(batches) + " |",
           "| --- | " + " | ".join("---" for _ in batches) + " |",
           "| step as measured (ms) | " + " | ".join(fmt(v) for v in prof.plain_step_ms_measured.values()) + " |",
           "| monotone fit (ms) | " + " | ".join(fmt(v) for v in prof.plain_step_ms.values()) + " |", ""]
    for name, m in prof.methods.items():
        spec_batches = list(next(iter(m.step_ms_measured.values())))
        out += [f"{name} (`{m.run}`" + (f"; draft {m.drafter['params'] / 1e6:.1f}M parameters, "
                                        f"{m.drafter['num_hidden_layers']} layers" if m.drafter else "") + "): "
                "speculative step as measured (ms), and in brackets x its run's plain step at that batch:", "",
                "| k | " + " | ".join(f"batch {b}" for b in spec_batches) + " |",
                "| --- | " + " | ".join("---" for _ in spec_batches) + " |"]
        for k, by_batch in m.step_ms_measured.items():
            cells = [f"{fmt(ms)} (x{fmt(ms / serving_costs.interpolate(m.plain_step_ms, int(b)), 1)})"
                     for b, ms in by_batch.items()]
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        if m.interpolation_error:
            worst = max(m.interpolation_error.values())
            out += ["", f"An inner k predicted by interpolating its neighbours' steps: largest error "
                        f"{100 * worst:.0f}% over the batch sizes (median "
                        f"{100 * statistics.median(m.interpolation_error.values()):.0f}%)."]
        out.append("")
    return out


def prompts(served: Path) -> list:
    """The held-out prompts the served check ran (measure_costs.py served-prompts, carried as .gpu/served)."""
    return json.loads((RAW / "cpu-estimate" / "prompts.json").read_text())


def served_rows(profiles: dict[str, serving_costs.CostProfile]) -> list[dict]:
    """The demo's trained models as served (measure_costs.py served, each lease's served-demo/) against the
    prediction from the CPU estimate of the same models and the demo-shape profile."""
    prof = profiles.get("demo")
    rows = []
    for served in sorted(RAW.glob("lease-*/served-demo")):
        plain_file = served / "plain-k0.json"
        if prof is None or not plain_file.is_file():
            continue
        plain = {r["batch"]: r["served"] for r in json.loads(plain_file.read_text())["runs"]}
        for method in METHODS:
            est_file = RAW / "cpu-estimate" / f"speculative-{method}.json"
            if not est_file.is_file():
                continue
            est = json.loads(est_file.read_text())
            for f in sorted(served.glob(f"{method}-k*.json"), key=lambda p: int(p.stem.split("-k")[1])):
                rec = json.loads(f.read_text())
                k = rec["k"]
                for r in rec["runs"]:
                    b, s, p = r["batch"], r["served"], plain[r["batch"]]
                    measured = (s["tokens"] / s["wall_s"]) / (p["tokens"] / p["wall_s"])
                    predicted = (prof.speedup(method, b, est["tokens_per_step_by_k"][str(k)],
                                              est["drafted_per_step_by_k"][str(k)], est["steps_per_response_by_k"][str(k)])
                                 if method in prof.methods else None)
                    # batch 1: one request at a time, so a request's wall time over its steps (the prefill's and the
                    # estimate's verification steps) is the speculative step as served with these models
                    implied = (1000.0 * s["wall_s"] / len(prompts(served)) / (est["steps_per_response_by_k"][str(k)] + 1)
                               if b == 1 else None)
                    cost = prof.methods.get(method)
                    measured_step = (serving_costs.interpolate(cost.step_ms[str(k)], 1)
                                     if cost is not None and str(k) in cost.step_ms and b == 1 else None)
                    rows.append({"lease": served.parent.name, "method": method, "k": k, "batch": b,
                                 "implied_step": implied, "profile_step": measured_step,
                                 "plain": p["tokens"] / p["wall_s"], "spec": s["tokens"] / s["wall_s"],
                                 "measured": measured, "predicted": predicted,
                                 "vllm_acc": (s["num_accepted_tokens"] / s["num_draft_tokens"]
                                              if s.get("num_draft_tokens") else None),
                                 "cpu_acc": est["accepted_per_step_by_k"][str(k)] / est["drafted_per_step_by_k"][str(k)]})
    return rows


def calibration_note(profiles) -> str:
    demo = next((p for p in profiles if p.name.endswith("-demo")), None)
    runs = sorted({m.served_run for m in demo.methods.values() if m.served_run}) if demo else []
    if not runs:
        return "none"
    scales = "; ".join(f"{name} x" + "/".join(f"{v:.2f}" for v in m.served_scale.values()) + " at concurrency "
                       + "/".join(m.served_scale) for name, m in demo.methods.items() if m.served_scale)
    return f"`{', '.join(runs)}`: {scales}"


def main() -> None:
    leases = sorted(RAW.glob("lease-*"))
    machines = "; ".join(f"{d.name}: {(d / 'gpu.txt').read_text().strip()}, {(d / 'versions.txt').read_text().strip()}"
                         for d in leases)
    profiles = serving_costs.available()
    out = ["# Serving costs of speculative decoding (vLLM 0.26.0, H100)", "",
           "<!-- rendered by benchmarks/gpu/costs.sh (python benchmarks/gpu/costs_report.py); do not edit -->", "",
           f"Measured ({machines}) by `bash benchmarks/gpu/session.sh costs` and `costs-watch` "
           "(`benchmarks/gpu/measure_costs.py queue`): for each shape, random weights of that shape "
           "(`load_format=dummy`), one engine per configuration with vLLM's default CUDA graphs, batches of 128-token "
           "random prompts; a step's time is the difference between a long and a 32-token generation over the "
           "difference in engine steps (vLLM's num_drafts per request for speculative runs; the median of the timed "
           "pairs where a run repeated them). These are the profiles the pipeline predicts served speed from "
           "(`pipeline/evaluate/cost_profiles/`, assembled by `benchmarks/gpu/costs.sh`): a speculative step's time is "
           "interpolated between the measured k (from the plain step at k = 0) and batch sizes.",
           "", "## Profiles", ""]
    for prof in profiles:
        out += profile_section(prof)
    rows = served_rows({p.name.rsplit("-", 1)[-1] if p.name.endswith("-demo") else p.name: p for p in profiles})
    if rows:
        out += ["## The prediction against the demo's trained models as served", "",
                "The CPU demo's trained BF16 target with its fine-tuned draft model, EAGLE-3 head and n-gram lookup, "
                "in vLLM's offline engine over 64 held-out prompts in batches of 1, 16 and 32, stopping at EOS (at most "
                "96 tokens): output tokens/s plain and with each method at k = 2, 4, 8, in one lease "
                "(`raw/costs/lease-N/served-demo/`). Predicted: the pipeline's own prediction from the CPU acceptance estimate "
                "of the same models (`raw/costs/cpu-estimate/`, from `evaluate@bf16` of the CPU `dvc repro` whose "
                "models were carried) and the demo-shape profile, whose model drafters' step costs are calibrated by "
                "a later `vllm serve` run of the stage (" + calibration_note(profiles) + "): for these rows, other "
                "leases, other prompts and the offline engine, the check is out of sample. The prediction is of decode "
                "steps; the measured tokens/s include prefill.", "",
                "| lease | method | k | batch | plain tok/s | speculative tok/s | served speedup | predicted | "
                "predicted / served | vLLM accepted/drafted | CPU estimate |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            ratio = r["predicted"] / r["measured"] if r["predicted"] is not None else None
            out.append(f"| {r['lease']} | {r['method']} | {r['k']} | {r['batch']} | {r['plain']:.0f} | {r['spec']:.0f} | "
                       f"x{r['measured']:.2f} | {'x' + fmt(r['predicted']) if r['predicted'] is not None else '-'} | "
                       f"{fmt(ratio)} | {fmt(r['vllm_acc'], 3)} | {fmt(r['cpu_acc'], 3)} |")
        within = [abs(r["predicted"] / r["measured"] - 1) for r in rows if r["predicted"] is not None]
        decided = [r for r in rows if r["predicted"] is not None and (r["predicted"] >= 1) != (r["measured"] >= 1)]
        steps = [r for r in rows if r["implied_step"] is not None and r["profile_step"] is not None]
        if steps:
            out += ["", "At batch 1 a request's wall time over its steps (the prefill step and the CPU estimate's "
                        "verification steps) is the speculative step as served with the trained models, against the "
                        "profile's step timed with random weights (where no draft is accepted):", "",
                    "| lease | method | k | served step (ms) | profile step (ms) | served / profile |",
                    "| --- | --- | --- | --- | --- | --- |"]
            out += [f"| {r['lease']} | {r['method']} | {r['k']} | {r['implied_step']:.2f} | {r['profile_step']:.2f} | "
                    f"{r['implied_step'] / r['profile_step']:.2f} |" for r in steps]
        out += ["", f"Largest |predicted / served - 1| over the {len(within)} predicted cells: "
                    f"{100 * max(within):.0f}% (median {100 * sorted(within)[len(within) // 2]:.0f}%); cells where the "
                    f"prediction and the measurement disagree on whether speculation beats plain decoding: "
                    f"{len(decided)}" + (" (" + ", ".join(f"{r['method']} k={r['k']} batch {r['batch']}" for r in decided)
                                          + ")" if decided else "") + ".", ""]
        demo = next((p for p in profiles if p.name.endswith("-demo")), None)
        if demo is not None and any(m.served_scale for m in demo.methods.values()):
            raw_rows = served_rows({"demo": demo.uncalibrated()})
            before = [abs(r["predicted"] / r["measured"] - 1) for r in raw_rows if r["predicted"] is not None]
            out += [f"The same cells predicted from the profile without its served calibration: largest "
                    f"{100 * max(before):.0f}% (median {100 * sorted(before)[len(before) // 2]:.0f}%).", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
