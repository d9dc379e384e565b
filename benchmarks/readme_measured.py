"""Render the README's "Measured" section from committed raw output, so it quotes nothing by hand.

    python benchmarks/readme_measured.py           # print the section
    python benchmarks/readme_measured.py --write   # replace it in README.md (between the markers)

Sources: benchmarks/cpu/raw/demo-build.json (benchmarks/cpu/demo_build.sh: the README's first command on a
fresh clone), metrics/*.json (the committed `dvc repro` of the demo, see dvc.lock), and the GPU and quantize
summaries of benchmarks/summary.py. tests/test_benchmark_docs.py checks the README matches this render.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from summary import gpu_summary, quantize_summary  # noqa: E402

sys.path.insert(0, str(ROOT))
from pipeline.evaluate.summary import load_metrics  # noqa: E402  (metrics/eval-<v>.json as the typed summary)

BEGIN, END = "<!-- measured:begin (benchmarks/readme_measured.py) -->", "<!-- measured:end -->"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _range(values, digits: int = 2, signed: bool = False) -> str:
    lo, hi = min(values), max(values)
    fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
    if round(lo, digits) == round(hi, digits):
        return fmt.format(lo)
    return f"from {fmt.format(lo)} to {fmt.format(hi)}" if signed else f"{fmt.format(lo)}-{fmt.format(hi)}"


def gate_variants(gates: dict) -> list[dict]:
    """metrics/gates.json's per-variant entries: a list since issue #29's summary (gates.summary); before it the file
    was the whole report, variants a mapping (the committed metrics/ until the demo build is re-run)."""
    if isinstance(gates["variants"], dict):
        return [{"variant": v, **g} for v, g in gates["variants"].items()]
    return gates["variants"]


def gate_text(gates: dict) -> str:
    variants = gate_variants(gates)
    passed = [g["variant"] for g in variants if g["passed"]]
    if len(passed) == len(variants):
        return f"gates pass for {len(variants)} variants"
    flagged = [g["variant"] for g in variants if g.get("allowed_failure")]
    return (f"gates: {len(passed)} of {len(variants)} variants pass"
            + (f", {', '.join(flagged)} failed and published flagged by gates.allow_fail" if flagged else ""))


def gate_speculation(gates: dict) -> list[tuple[str, dict]]:
    return [(g["variant"], g["speculation"]) for g in gate_variants(gates)]


def render() -> str:
    build = _json(ROOT / "benchmarks/cpu/raw/demo-build.json")
    params_enabled = sorted(p.stem.removeprefix("eval-") for p in (ROOT / "metrics").glob("eval-*.json"))
    evals = {v: load_metrics(ROOT / f"metrics/eval-{v}.json") for v in params_enabled}
    draft = _json(ROOT / "metrics/draft.json")
    gates = _json(ROOT / "metrics/gates.json")
    q = quantize_summary()
    g = gpu_summary()
    pr = g["profile"]
    second = ", ".join(f"`{s}`" for s in build["second_repro_ran"]) or "no stage"
    lines = [
        f"CPU: on the {build['cpus']}-core, {build['memory_gib']:.0f} GiB dev machine (no GPU), the first command above on a "
        f"fresh clone of {build['commit'][:7]} took {build['first_command_s'] / 60:.1f} min (install plus the whole "
        f"`dvc repro`); a second `dvc repro` took {build['second_repro_s']:.1f} s and ran only {second} "
        "(`benchmarks/cpu/raw/demo-build.json`). The demo build (`metrics/`, from the `dvc repro` recorded in `dvc.lock`):",
        "",
        "- quantize (`benchmarks/quantize.md`): " + ", ".join(
            f"{v} {r['wall_time_s']:.1f} s" for v, r in q["variants"].items()) + "; " + ", ".join(
            f"{v} {r['size_before_mb']:.1f} -> {r['size_after_mb']:.1f} MB" for v, r in q["variants"].items()) + ";",
        (f"- draft: skipped ({draft['skipped']});" if "skipped" in draft else
         f"- draft: token acceptance on held-out prompts {draft['token_acceptance_untrained']:.3f} untrained -> "
         f"{draft['token_acceptance_finetuned']:.3f} after distillation fine-tuning; accepted per draft token "
         f"{draft['accepted_per_draft_token_untrained']:.3f} -> {draft['accepted_per_draft_token_finetuned']:.3f};"),
        f"- variants: perplexity change {_range([e.quality.perplexity_increase_pct for e in evals.values()], signed=True)}"
        f" %, KL <= {max(e.quality.kl_divergence for e in evals.values()):.1e}, top-1 agreement >= "
        f"{min(e.quality.top1_agreement for e in evals.values()):.3f}, accepted per draft token "
        f"{_range([e.speculation.accepted_per_draft_token for e in evals.values()], 3)} at k = "
        f"{', '.join(sorted({str(e.speculation.num_speculative_tokens) for e in evals.values()}))}; {gate_text(gates)};",
        "- speculative methods, served speedup at concurrency 1 predicted from the CPU acceptance estimate and the "
        f"H100 cost profile `{next(iter(evals.values())).speculation.cost_profile}` (`draft.method`, each at its "
        "predicted best k): " + "; ".join(
            f"{v} " + ", ".join(f"{m.method} " + (f"x{m.expected_speedup:.2f} (k={m.num_speculative_tokens})"
                                                  if m.expected_speedup is not None else "not predicted")
                                for m in e.speculation.methods) for v, e in evals.items())
        + " (steps timed with random weights, the model drafters' scaled to what `vllm serve` served with the demo's "
        "trained drafters: `benchmarks/gpu/COSTS.md`, `benchmarks/gpu/CAPACITY.md`);",
        "- shipped speculative setting (predicted, no GPU here): " + ", ".join(
            f"{v} " + (f"{d.get('method') or 'draft_model'} k={d['num_speculative_tokens']}" if d["num_speculative_tokens"]
                       else "none") for v, d in
            gate_speculation(gates)) + " (each card says why); the "
        "serving benchmark (`serve_bench`) was skipped (no CUDA device), so every latency gate reports skipped.",
        "",
        "GPU, the GPU demo profile (`benchmarks/gpu/RESULTS.md`; `bash benchmarks/gpu/session.sh gpu-profile` on an "
        f"H100 with vLLM {pr['vllm']}): `dvc repro` with a {pr['models']['target']['params'] / 1e9:.2f}B target and a "
        f"{pr['models']['draft']['params'] / 1e6:.0f}M draft trained from scratch on the GPU ran through `serve_bench` for "
        f"{', '.join(pr['variants'])} (`gate` and the stages after it were not run). As served (`vllm serve`, `vllm bench serve`), output "
        "tokens/s against BF16: " + "; ".join(
            f"c={c[1:]} " + ", ".join(f"{v} {x:.2f}x" for v, x in pr["vs_bf16"][c].items() if v != "bf16")
            for c in ("c1", "c32")) + ". The draft model at "
        f"k={pr['k']} is accepted at {pr['estimate_vs_vllm']['bf16']['vllm_c1']:.3f} (the CPU estimate is within "
        f"{pr['estimate_max_abs_diff']:.3f}) yet slows decoding to {_range(pr['speculative_gain']['c1'].values(), 2)}x at "
        f"c=1: each drafted token costs {_range(pr['implied_draft_cost'].values(), 1)} target steps as served. The gate on "
        "those metrics ships no speculation and fails FP8 (slower than BF16 at c=1). Targets (`benchmarks/gpu/RESULTS.md`) met: "
        + ", ".join(k for k, t in pr["targets"].items() if t["met"]) + "; missed: "
        + ", ".join(f"{k} ({t['measured']:.2f} vs {t['target']})" for k, t in pr["targets"].items() if not t["met"])
        + ". At Llama-3-8B shapes, batch 1 (random weights): " + ", ".join(
            f"{m} {x:.2f}x" for m, x in g["bench8b_speedup_bs1"].items()) + " of BF16 decode speed.",
        "",
        "GPU, speculative methods (`benchmarks/gpu/RESULTS.md`, `gpu-profile ... gpu-methods`): the same 1B "
        "profile, BF16 only, one `dvc repro` through `publish`. Output tokens/s against plain decoding as "
        "served: " + "; ".join(f"{m} (k={r['k']}) " + ", ".join(f"c={c[1:]} {x:.2f}x" for c, x in r["speedup"].items())
                               for m, r in g["methods"]["methods"].items())
        + f". The gate shipped {g['methods']['shipped']['method']} k={g['methods']['shipped']['k']} "
        f"({g['methods']['shipped']['basis']}); the CPU estimate alone would have picked {g['methods']['estimate_best']}.",
        "",
        "GPU, EAGLE-3 on a quantized target (`gpu-profile ... gpu-eagle3-variants`): the head "
        "trained on the BF16 target, served on " + "; ".join(
            f"{v} (k={r['k']}) " + ", ".join(f"c={c[1:]} {x:.2f}x" for c, x in r["speedup"].items())
            + f", vLLM accepted/drafted {r['served_accepted']['c1']:.3f} at c=1 vs CPU estimate {r['estimate_accepted']:.3f}"
            for v, r in g["eagle3_variants"]["variants"].items()) + " (output tokens/s against plain decoding, same run).",
    ]
    return "\n".join(lines)


def write(readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    readme.write_text(f"{head}{BEGIN}\n{render()}\n{END}{tail}")


def current(readme: Path = ROOT / "README.md") -> str:
    return readme.read_text().split(BEGIN)[1].split(END)[0].strip("\n")


if __name__ == "__main__":
    write() if sys.argv[1:] == ["--write"] else print(render())
