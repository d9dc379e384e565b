"""Render benchmarks/gpu/COSTS.md from the serving-cost raw files and the profiles assembled from them.

Reads only committed files: benchmarks/gpu/raw/costs/ (measure_costs.py's output: gpu.txt, versions.txt, one
folder per shape, served-demo/ for the served check, cpu-estimate/ for the CPU acceptance estimates of the same
demo models) and pipeline/cost_profiles/*.json. Every number below is computed here from those files.
Usage: python benchmarks/gpu/costs_report.py > benchmarks/gpu/COSTS.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline import serving_costs  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw/costs"
METHODS = ("draft_model", "eagle3", "ngram")


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def profile_section(prof: serving_costs.CostProfile) -> list[str]:
    t = prof.target
    out = [f"### {prof.name}", "",
           f"Target: {t['params'] / 1e6:.1f}M parameters ({t['num_hidden_layers']} layers, hidden {t['hidden_size']}, "
           f"vocabulary {t['vocab_size']}); raw: `{prof.source.split(' ')[0]}`.", "",
           "| batch | " + " | ".join(prof.plain_step_ms) + " |",
           "| --- | " + " | ".join("---" for _ in prof.plain_step_ms) + " |",
           "| plain step as measured (ms) | " + " | ".join(fmt(v) for v in prof.plain_step_ms_measured.values()) + " |",
           "| monotone fit the prediction uses (ms) | " + " | ".join(fmt(v) for v in prof.plain_step_ms.values()) + " |",
           ""]
    if prof.methods:
        batches = sorted({b for m in prof.methods.values() for b in m.draft_ms_per_token}, key=int)
        out += ["Drafter cost per drafted token (ms), fitted from speculative steps at k = "
                + ", ".join(sorted({str(k) for m in prof.methods.values() for k in m.measured_k})) + "; in plain "
                "steps at that batch in brackets; last column: the largest error of predicting one k's step time "
                "from a fit on the other k:", "",
                "| method | " + " | ".join(f"batch {b}" for b in batches) + " | fit-on-one-k error |",
                "| --- | " + " | ".join("---" for _ in batches) + " | --- |"]
        for name, m in prof.methods.items():
            cells = [f"{fmt(m.draft_ms_per_token[b])} ({fmt(m.draft_ms_per_token[b] / prof.plain_ms(int(b)))})"
                     if b in m.draft_ms_per_token else "-" for b in batches]
            err = max(m.holdout_error.values()) if m.holdout_error else None
            drafted = min(m.drafted_per_step.values()) if m.drafted_per_step else None
            note = f" (drafted {fmt(drafted)}+ tokens per step)" if name == "ngram" else ""
            out.append(f"| {name}{note} | " + " | ".join(cells) + f" | {fmt(100 * err, 1) + '%' if err is not None else '-'} |")
        out.append("")
    return out


def served_rows(prof: serving_costs.CostProfile) -> list[dict]:
    """The demo's trained models as served (measure_costs.py served) against the prediction from the CPU
    estimate of the same models and the demo-shape profile."""
    served = RAW / "served-demo"
    plain_file = served / "plain-k0.json"
    if not plain_file.is_file():
        return []
    plain = {r["batch"]: r["served"] for r in json.loads(plain_file.read_text())["runs"]}
    rows = []
    for method in METHODS:
        est_file = RAW / "cpu-estimate" / f"speculative-{method}.json"
        if not est_file.is_file():
            continue
        est = json.loads(est_file.read_text())
        for f in sorted(served.glob(f"{method}-k*.json"), key=lambda p: int(p.stem.split("-k")[1])):
            if f.name.endswith(".failed.json"):
                continue
            rec = json.loads(f.read_text())
            k = rec["k"]
            for r in rec["runs"]:
                b, s = r["batch"], r["served"]
                p = plain[b]
                measured = (s["tokens"] / s["wall_s"]) / (p["tokens"] / p["wall_s"])
                predicted = (prof.speedup(method, b, est["accepted_per_step_by_k"][str(k)],
                                          est["drafted_per_step_by_k"][str(k)]) if method in prof.methods else None)
                rows.append({"method": method, "k": k, "batch": b, "plain": p["tokens"] / p["wall_s"],
                             "spec": s["tokens"] / s["wall_s"], "measured": measured, "predicted": predicted,
                             "vllm_acc": s["num_accepted_tokens"] / s["num_draft_tokens"] if s.get("num_draft_tokens") else None,
                             "cpu_acc": est["accepted_per_step_by_k"][str(k)] / est["drafted_per_step_by_k"][str(k)]})
    return rows


def main() -> None:
    gpu = (RAW / "gpu.txt").read_text().strip()
    versions = (RAW / "versions.txt").read_text().strip()
    profiles = serving_costs.available()
    out = ["# Serving costs of speculative decoding (vLLM 0.26.0, H100)", "",
           "<!-- rendered by benchmarks/gpu/costs.sh (python benchmarks/gpu/costs_report.py); do not edit -->", "",
           f"Measured on {gpu} with {versions}, by `bash benchmarks/gpu/session.sh costs` and `costs-watch` "
           "(`benchmarks/gpu/measure_costs.py queue`): for each shape, random weights of that shape "
           "(`load_format=dummy`), one engine per configuration with vLLM's default CUDA graphs, batches of 128-token "
           "random prompts; a step's time is the difference between a 288-token and a 32-token generation over the "
           "difference in engine steps (a request's tokens less its accepted draft tokens). These are the profiles "
           "the pipeline predicts served speed from (`pipeline/cost_profiles/`, assembled by `benchmarks/gpu/costs.sh`).",
           "", "## Profiles", ""]
    for prof in profiles:
        out += profile_section(prof)
    demo = next((p for p in profiles if p.name.endswith("-demo")), None)
    rows = served_rows(demo) if demo else []
    if rows:
        out += ["## The prediction against the demo's trained models as served", "",
                "The CPU demo's trained BF16 target with its fine-tuned draft model, EAGLE-3 head and n-gram lookup, "
                "in vLLM's offline engine over 64 held-out prompts in batches of 1, 16 and 32, stopping at EOS (at most "
                "96 tokens): output tokens/s plain and with each method at k = 2, 4, 8, in one lease "
                "(`raw/costs/served-demo/`). Predicted: the pipeline's own prediction from the CPU acceptance estimate "
                "of the same models (`raw/costs/cpu-estimate/`, from `evaluate@bf16` of the CPU `dvc repro` whose "
                "models were carried) and the demo-shape profile. The prediction is of decode steps; the measured "
                "tokens/s include prefill.", "",
                "| method | k | batch | plain tok/s | speculative tok/s | served speedup | predicted | predicted / served "
                "| vLLM accepted/drafted | CPU estimate |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            ratio = r["predicted"] / r["measured"] if r["predicted"] is not None else None
            out.append(f"| {r['method']} | {r['k']} | {r['batch']} | {r['plain']:.0f} | {r['spec']:.0f} | "
                       f"x{r['measured']:.2f} | {'x' + fmt(r['predicted']) if r['predicted'] is not None else '-'} | "
                       f"{fmt(ratio)} | {fmt(r['vllm_acc'], 3)} | {fmt(r['cpu_acc'], 3)} |")
        within = [abs(r["predicted"] / r["measured"] - 1) for r in rows if r["predicted"] is not None]
        decided = [r for r in rows if r["predicted"] is not None and (r["predicted"] >= 1) != (r["measured"] >= 1)]
        out += ["", f"Largest |predicted / served - 1| over the {len(within)} predicted cells: "
                    f"{100 * max(within):.0f}% (median {100 * sorted(within)[len(within) // 2]:.0f}%); cells where the "
                    f"prediction and the measurement disagree on whether speculation beats plain decoding: "
                    f"{len(decided)}" + (" (" + ", ".join(f"{r['method']} k={r['k']} batch {r['batch']}" for r in decided)
                                          + ")" if decided else "") + ".", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
