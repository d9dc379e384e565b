"""Render the README's "Measured" section from committed raw output, so it quotes nothing by hand.

    python benchmarks/readme_measured.py           # print the section
    python benchmarks/readme_measured.py --write   # replace it in README.md (between the markers)

Sources: benchmarks/cpu/raw/demo-build.json (benchmarks/cpu/demo_build.sh: the README's first command on a
fresh clone), benchmarks/cpu/raw/demo-metrics/*.json (the same build's metrics/, copied there by `demo_build.sh
--lock` beside the dvc.lock it commits), and the GPU and quantize summaries of benchmarks/summary.py. It never reads
the workspace's metrics/: a user's own `dvc repro` rewrites those (on another CPU with other last digits), and the
README quotes the committed build. tests/project/test_benchmark_docs.py checks the README matches this render.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from summary import quantize_summary, served_summary  # noqa: E402

sys.path.insert(0, str(ROOT))
from pipeline.evaluate.summary import load_metrics  # noqa: E402  (metrics/eval-<v>.json as the typed summary)

METRICS = ROOT / "benchmarks/cpu/raw/demo-metrics"  # the committed build's metrics/, not the workspace's
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
    return f"gates: {len(passed)} of {len(variants)} variants pass" + (
        f", {', '.join(flagged)} failed and published flagged by gates.allow_fail" if flagged else ""
    )


def gate_speculation(gates: dict) -> list[tuple[str, dict]]:
    return [(g["variant"], g["speculation"]) for g in gate_variants(gates)]


def _x(ratios: dict, concurrencies=(1, 32)) -> str:
    return ", ".join(f"c={c} x{ratios[f'c{c}']:.2f}" for c in concurrencies)


def gpu_paragraph(g: dict) -> str:
    """The GPU demo profile's vLLM 0.26.0 runs (SERVING.md): quantized plain decoding against BF16 in the same
    run, each method against its variant's plain decoding, the gate's verdict."""
    runs = list(g.values())
    gpus, vllms = {r["gpu"] for r in runs}, {r["vllm"] for r in runs}
    variants = {v: (run_name, e) for run_name, r in g.items() for v, e in r["variants"].items()}
    quantized = [(v, run_name, e) for v, (run_name, e) in variants.items() if v != "bf16"]
    first = g[next(iter(g))]
    bf16, params = first["variants"]["bf16"], first["params"]
    return (
        f"GPU ({', '.join(sorted(gpus))}, vLLM {', '.join(sorted(vllms))}; `benchmarks/gpu/SERVING.md`): the GPU "
        f"demo profile (a {params['target'] / 1e9:.2f}B target, a {params['draft'] / 1e6:.0f}M draft) through `dvc "
        "repro` to the gate, each quantized variant served beside BF16 in the same run (`vllm serve`, `vllm bench "
        "serve`). Plain decoding, output tokens/s against BF16's: "
        + "; ".join(f"{v} {_x(e['vs_bf16_plain'])} (`raw/{run_name}`)" for v, run_name, e in quantized)
        + ". Speculative methods against plain decoding of the same variant, BF16: "
        + "; ".join(f"{m} (k={r['k']}) {_x(r['vs_plain'])}" for m, r in bf16["methods"].items())
        + ". The gate: "
        + ", ".join(f"{v} {e['gate']}" for v, (_, e) in variants.items())
        + " (a quantized variant must not be slower than BF16 at c=1, `gates.min_speedup_vs_bf16`); every passing "
        "variant ships plain decoding (no method beat it by `serving.speculation.min_gain`). At 1B on one GPU neither "
        "quantization nor speculation pays."
    )


def render() -> str:
    build = _json(ROOT / "benchmarks/cpu/raw/demo-build.json")
    params_enabled = sorted(p.stem.removeprefix("eval-") for p in METRICS.glob("eval-*.json"))
    evals = {v: load_metrics(METRICS / f"eval-{v}.json") for v in params_enabled}
    draft = _json(METRICS / "draft.json")
    gates = _json(METRICS / "gates.json")
    q = quantize_summary()
    g = served_summary()
    second = ", ".join(f"`{s}`" for s in build["second_repro_ran"]) or "no stage"
    lines = [
        f"CPU: on the {build['cpus']}-core, {build['memory_gib']:.0f} GiB dev machine (no GPU), the first "
        f"command above on a fresh clone of {build['commit'][:7]} took {build['first_command_s'] / 60:.1f} min "
        f"(install plus the whole `dvc repro`); a second `dvc repro` took {build['second_repro_s']:.1f} s and ran "
        f"only {second} (`benchmarks/cpu/raw/demo-build.json`). The demo build (its `metrics/`, kept in "
        "`benchmarks/cpu/raw/demo-metrics/`; the `dvc repro` recorded in `dvc.lock`):",
        "",
        "- quantize (`benchmarks/quantize.md`): "
        + ", ".join(f"{v} {r['wall_time_s']:.1f} s" for v, r in q["variants"].items())
        + "; "
        + ", ".join(f"{v} {r['size_before_mb']:.1f} -> {r['size_after_mb']:.1f} MB" for v, r in q["variants"].items())
        + ";",
        (
            f"- draft: skipped ({draft['skipped']});"
            if "skipped" in draft
            else "- draft: token acceptance on held-out prompts "
            f"{draft['token_acceptance_untrained']:.3f} untrained -> "
            f"{draft['token_acceptance_finetuned']:.3f} after distillation fine-tuning; accepted per draft token "
            f"{draft['accepted_per_draft_token_untrained']:.3f} -> {draft['accepted_per_draft_token_finetuned']:.3f};"
        ),
        "- variants: perplexity change "
        f"{_range([e.quality.perplexity_increase_pct for e in evals.values()], signed=True)} %, KL <= "
        f"{max(e.quality.kl_divergence for e in evals.values()):.1e}, top-1 agreement >= "
        f"{min(e.quality.top1_agreement for e in evals.values()):.3f}, accepted per draft token "
        f"{_range([e.speculation.accepted_per_draft_token for e in evals.values()], 3)} at k = "
        f"{', '.join(sorted({str(e.speculation.num_speculative_tokens) for e in evals.values()}))}; "
        f"{gate_text(gates)};",
        "- speculative methods, served speedup at concurrency 1 predicted from the CPU acceptance estimate and the "
        f"H100 cost profile `{next(iter(evals.values())).speculation.cost_profile}` (`draft.method`, each at its "
        "predicted best k): "
        + "; ".join(
            f"{v} "
            + ", ".join(
                f"{m.method} "
                + (
                    f"x{m.expected_speedup:.2f} (k={m.num_speculative_tokens})"
                    if m.expected_speedup is not None
                    else "not predicted"
                )
                for m in e.speculation.methods
            )
            for v, e in evals.items()
        )
        + " (steps timed with random weights, the model drafters' scaled to what `vllm serve` served with the demo's "
        "trained drafters: `benchmarks/gpu/COSTS.md`, `benchmarks/gpu/CAPACITY.md`);",
        "- shipped speculative setting (predicted, no GPU here): "
        + ", ".join(
            f"{v} "
            + (
                f"{d.get('method') or 'draft_model'} k={d['num_speculative_tokens']}"
                if d["num_speculative_tokens"]
                else "none"
            )
            for v, d in gate_speculation(gates)
        )
        + " (each card says why); the "
        "serving benchmark (`serve_bench`) was skipped (no CUDA device), so every latency gate reports skipped.",
        "",
        gpu_paragraph(g),
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
