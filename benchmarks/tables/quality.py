"""benchmarks/gpu/QUALITY.md: each variant's fidelity to BF16 on the GPU, against the gate's thresholds."""

from __future__ import annotations

import json
import re

from render import Column as C, Spec, Text
from tables import read

SMOLLM2 = "smollm2-gpu-4"  # the run whose evaluate stages all finished, and the gate over them (gate.txt)
GPU_PROFILE = ("gpu-served", "gpu-served-3")
RUNS = (SMOLLM2, *GPU_PROFILE, "greedy-determinism")
CHECKS = (
    ("max_perplexity_increase_pct", "perplexity_increase_pct", "{:+.2f}%"),
    ("max_kl_divergence", "kl_divergence", "{:.4f}"),
    ("min_top1_agreement", "top1_agreement", "{:.3f}"),
    ("max_heldout_perplexity", "perplexity", "{:.2f}"),
)


def metrics(*runs: str) -> list[dict]:
    rows = []
    for run in runs:
        ev = read.evals(run)
        base = ev[read.BASELINE].get("lm_eval_domain_heldout_byte_perplexity")
        for variant, e in ev.items():
            lm = e.get("lm_eval_domain_heldout_byte_perplexity")
            rows.append(
                {
                    **e,
                    "run": f"`{run}`",
                    "variant": f"`{variant}`",
                    "lm": lm,
                    "lm_vs_base": 100.0 * (lm / base - 1) if lm and base else None,
                }
            )
    return rows


def verdict(e: dict, check: str, key: str, form: str, limits: dict) -> str:
    ok = e[key] <= limits[check] if check.startswith("max_") else e[key] >= limits[check]
    return (
        f"{form.format(e[key])} (needs {'<=' if check.startswith('max_') else '>='} {limits[check]}: "
        f"{'meets' if ok else 'fails'})"
    )


def against_thresholds(run: str = SMOLLM2) -> list[dict]:
    """Each variant's fidelity against the run's thresholds (its override applied) and the gate's verdict line."""
    g, gates = read.params(run)["gates"], read.gate_sections(run)
    rows = []
    for variant, e in read.evals(run).items():
        limits = {**g["thresholds"], **(g.get("overrides") or {}).get(variant, {})}
        line = re.search(rf"^gate {re.escape(variant)}: (.*)$", gates.get(variant, ""), re.M)
        rows.append(
            {
                "variant": f"`{variant}`",
                "gate": line.group(1) if line else "not gated",
                **{check: verdict(e, check, key, form, limits) for check, key, form in CHECKS},
            }
        )
    return rows


def greedy() -> list[dict]:
    text = (read.RAW / "greedy-determinism/greedy-determinism.txt").read_text()
    return [json.loads(line[len("RESULT ") :]) for line in text.splitlines() if line.startswith("RESULT ")]


def code(text: str) -> Text:
    return Text("```\n" + text.rstrip() + "\n```")


QUALITY = (
    C("run", "run"),
    C("variant", "variant"),
    C("held-out ppl", "perplexity", "{:.2f}"),
    C("ppl change", "perplexity_increase_pct", "{:+.2f}%"),
    C("KL", "kl_divergence", "{:.4f}"),
    C("top-1", "top1_agreement", "{:.3f}"),
    C("greedy match", "greedy_match", "{:.3f}"),
    C("scored tokens", "tokens"),
    C("lm-eval byte ppl", "lm", "{:.3f}"),
    C("lm-eval byte ppl vs BF16", "lm_vs_base", "{:+.2f}%"),
)


def verifier_rows(runs: tuple[str, ...] = (SMOLLM2, GPU_PROFILE[1])) -> list[dict]:
    """Each draft (trained against BF16) on each quantized verifier: evaluate's accepted/drafted estimate per method
    against the same method on BF16 in the same run, where both drafted the same k (n-gram's k follows each
    variant's own text, so its rows at another k are left out)."""
    rows = []
    for run in runs:
        evals = read.evals(run)
        base = {m["method"]: m for m in evals["bf16"]["methods"]}
        for variant, e in evals.items():
            for m in e["methods"] if variant != "bf16" else []:
                b = base.get(m["method"])
                if b is None or b["num_speculative_tokens"] != m["num_speculative_tokens"]:
                    continue
                rows.append(
                    {
                        "run": f"`{run}`",
                        "variant": f"`{variant}`",
                        "method": m["method"],
                        "k": m["num_speculative_tokens"],
                        "bf16": b["accepted_per_draft_token"],
                        "own": m["accepted_per_draft_token"],
                        "change": 100 * (m["accepted_per_draft_token"] / b["accepted_per_draft_token"] - 1),
                    }
                )
    return rows


BLOCKS = {
    "verifiers": Spec(
        verifier_rows,
        (
            C("run", "run"),
            C("variant", "variant"),
            C("method", "method"),
            C("k", "k"),
            C("accepted/drafted on BF16", "bf16", "{:.3f}"),
            C("on the variant", "own", "{:.3f}"),
            C("change", "change", "{:+.1f}%"),
        ),
    ),
    "smollm2": Spec(lambda: metrics(SMOLLM2), QUALITY),
    "smollm2-thresholds": Spec(
        against_thresholds,
        (
            C("variant", "variant"),
            *(C(f"{key} (`{check}`)", check) for check, key, _ in CHECKS),
            C("gate (`gate.txt`)", "gate"),
        ),
    ),
    "smollm2-gate": lambda: code((read.RAW / SMOLLM2 / "gate.txt").read_text()),
    "gpu-profile": Spec(lambda: metrics(*GPU_PROFILE), QUALITY),
    "gpu-profile-gate": lambda: code(
        "\n\n".join(
            f"{run}:\n" + read.repro_gate_lines(run, log)
            for run, log in (("gpu-served", "repro-2.log"), ("gpu-served-3", "repro.log"))
        )
    ),
    "greedy-determinism": Spec(
        greedy,
        (
            C("mode", lambda r: f"`{r['mode']}`"),
            C("copy against copy (share of prompts with identical tokens)", "copy_vs_copy", "{:.4f}"),
            C("one model twice", "same_model_twice", "{:.4f}"),
            C("prompts", "prompts"),
            C("tokens each", "tokens"),
            C("torch", "torch"),
        ),
    ),
}
