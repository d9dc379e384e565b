"""Tables of benchmarks/gpu/GPU-SERVED.md: the GPU demo profile (1.07B target) through the whole pipeline on the H100,
each variant served plain and with every method beside BF16 in the same lease (issues #28 and #33, item 6).

Reads raw/gpu-served/ (one lease, two `dvc repro` in one workspace: BF16 through publish, then FP8 dynamic added)
and raw/gpu-served-2/ (the second lease, BF16 and GPTQ W4A16: its archive ended at the start of `serve_bench`).
Predictions are the pipeline's own (pipeline/evaluate/serving_costs.py) over the committed gpu-profile-1b profile,
which benchmarks/gpu/costs.sh calibrates by this run's BF16 record (out of sample for FP8), and over its random-weight
costs alone (the profile before that calibration).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.evaluate import serving_costs  # noqa: E402
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from render import Table, Text, facts, num, times  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from capacity import concurrencies, predicted_against_served, served_table  # noqa: E402
from smollm2 import repro_lines, stage_times as timed_stages  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
RUN = RAW / "gpu-served"
RUN2 = RAW / "gpu-served-2"
RUNS = ("gpu-served", "gpu-served-2")
PROFILE = ROOT / "pipeline/evaluate/cost_profiles/h100-vllm0.26.0-gpu-profile-1b.json"
BASELINE = "bf16"
VARIANTS = ("bf16", "fp8-dynamic")  # served in RUN, in the order `dvc repro` served them
TOLERANCE = 0.20  # #28's target: predicted within 20% of served
REPROS = (("1", "repro-1.log", "params-1.yaml"), ("2", "repro-2.log", "params.yaml"))


def record(variant: str) -> ServeBenchRecord:
    return records.read(ServeBenchRecord, RUN / "serve" / variant / "record.json")


def repro_stages(run: Path, log: str) -> list[tuple[str, int, str]]:
    """(stage, seconds, how it ended) for each stage the `dvc repro` log shows running: ran (DVC locked it), failed
    (DVC's 'failed to reproduce' line names it) or cut off (the log ends in it)."""
    lines = repro_lines(run, log)
    failed = {m.group(1).removeprefix("stages/dvc.yaml:") for _, text in lines
              if (m := re.match(r"ERROR: failed to reproduce '([^']+)'", text))}
    return [(name, end - start, "ran" if done else "failed" if name in failed else "cut off")
            for name, start, end, done in timed_stages(lines)]


def conditions() -> Table:
    rec, params = record(BASELINE), yaml.safe_load((RUN / "params.yaml").read_text())
    plain, bench, demo = rec.configs[PLAIN], params["serve_bench"], params["demo"]["target"]
    return facts([("GPU", rec.gpu), ("vLLM", rec.vllm_version),
                  ("target", f"{demo['num_hidden_layers']} layers, hidden {demo['hidden_size']} "
                             f"({models_params()}, `metrics/models.json`)"),
                  ("variants, in the order served", ", ".join(f"`{v}`" for v in VARIANTS)),
                  ("concurrency", ", ".join(map(str, concurrencies(rec)))),
                  ("prompts per level (at least)", f"{bench['prompts_per_concurrency']} per user ({bench['min_prompts']})"),
                  ("capacity search: probes at most, ceiling", f"{bench['capacity']['max_probes']}, "
                                                               f"{bench['capacity']['max_concurrency']} users"),
                  ("SLO", plain.capacity.slo.label()), ("k schedule", bench["k_schedule"])], ("condition", "value"))


def models_params() -> str:
    m = json.loads((RUN / "metrics" / "models.json").read_text())
    return f"{m['target']['params'] / 1e9:.2f}B parameters; draft {m['draft']['params'] / 1e6:.1f}M"


def repros() -> Table:
    rows = []
    for label, log, params in REPROS:
        stages = repro_stages(RUN, log)
        enabled = yaml.safe_load((RUN / params).read_text())["quantize"]["enabled"]
        total = sum(s for _, s, _ in stages)
        failed = [name for name, _, how in stages if how == "failed"]
        rows.append((label, ", ".join(f"`{v}`" for v in enabled), str(len(stages)), str(total),
                     f"`{failed[0]}` failed" if failed else "all ran"))
    return Table(("dvc repro", "quantize.enabled", "stages run", "seconds (its log)", "end"), tuple(rows))


def stage_times() -> Table:
    rows = []
    for label, log, _ in REPROS:
        rows += [(label, f"`{name}`", str(secs), how) for name, secs, how in repro_stages(RUN, log)]
    return Table(("dvc repro", "stage", "seconds", "end"), tuple(rows))


def against_bf16() -> Table:
    base = record(BASELINE)
    rows = []
    for variant in VARIANTS[1:]:
        rec = record(variant)
        for name, config in rec.configs.items():
            ref = base.configs[PLAIN]
            cells = [times(config.at(c).output_throughput / ref.at(c).output_throughput) for c in concurrencies(rec)]
            cap, bcap = config.capacity, ref.capacity
            bound = ("undecided (both at the search's ceiling)" if cap.lower_bound and bcap.lower_bound
                     else "at least" if cap.lower_bound else "at most" if bcap.lower_bound else "")
            rows.append((f"`{variant}` {name}", *cells,
                         f"{times(cap.users_per_gpu / bcap.users_per_gpu)} {bound}".strip()))
    return Table(("served", *(f"c={c} tok/s x BF16 plain" for c in concurrencies(base)),
                  "users at the SLO x BF16 plain"), tuple(rows))


def prediction_rows() -> list[dict]:
    """capacity.predicted_against_served for each variant of the run (before: the profile's random-weight costs,
    after: the committed profile, calibrated by this run's BF16 record)."""
    calibrated = serving_costs.load(PROFILE)
    if not any(m.served_run and "gpu-served/serve/bf16" in m.served_run for m in calibrated.methods.values()):
        raise SystemExit(f"{PROFILE.name} is not calibrated by raw/gpu-served's BF16 record: run benchmarks/gpu/costs.sh")
    return [{"variant": variant, **row} for variant in VARIANTS
            for row in predicted_against_served(record(variant), RUN / "eval" / variant, calibrated)]


def within(pred: float, served: float) -> str:
    return "yes" if abs(pred / served - 1) <= TOLERANCE else "no"


def prediction() -> Table:
    rows = []
    for r in prediction_rows():
        sample = "in sample" if r["variant"] == BASELINE else "out of sample"
        rows.append((f"`{r['variant']}`", r["method"], str(r["k"]), str(r["c"]), times(r["served"]),
                     times(r["before"]), within(r["before"], r["served"]),
                     f"{times(r['after'])} ({sample})", within(r["after"], r["served"]),
                     num(r["cpu"], 3), num(r["vllm"], 3)))
    return Table(("variant", "method", "k", "concurrency", "served", "predicted, random-weight costs",
                  f"within {TOLERANCE:.0%}", "predicted, calibrated by this run's BF16 (committed)",
                  f"within {TOLERANCE:.0%}",
                  "CPU accepted/drafted", "vLLM accepted/drafted"), tuple(rows))


def prediction_note() -> Text:
    rows = prediction_rows()
    parts = []
    for label in ("before", "after"):
        cells = [r for r in rows if label == "before" or r["variant"] != BASELINE]
        ok = sum(abs(r[label] / r["served"] - 1) <= TOLERANCE for r in cells)
        side = sum((r[label] >= 1) == (r["served"] >= 1) for r in cells)
        by_c = ", ".join(f"c={c} {sum(abs(r[label] / r['served'] - 1) <= TOLERANCE for r in cells if r['c'] == c)}"
                         f"/{sum(r['c'] == c for r in cells)}" for c in sorted({r["c"] for r in cells}))
        what = ("random-weight costs (every variant)" if label == "before"
                else "calibrated by BF16, out of sample (FP8 dynamic)")
        parts.append(f"{what}: {ok} of {len(cells)} cells within {TOLERANCE:.0%} ({by_c}), {side} on the served "
                     "side of 1.0")
    return Text("; ".join(parts) + ".")


def gate() -> Text:
    out = []
    for label, log, _ in REPROS:
        lines = [re.sub(r"^\d+ ", "", line) for line in (RUN / log).read_text().splitlines()
                 if re.match(r"\d+ (gate |error: gate|bundle |publish )", line)]
        out.append(f"dvc repro {label}:\n" + "\n".join(lines))
    return Text("```\n" + "\n\n".join(out) + "\n```")


def second_lease() -> Table:
    rows = []
    for variant in ("bf16", "gptq-w4a16"):
        e = json.loads((RUN2 / "metrics" / f"eval-{variant}.json").read_text())
        rows.append((f"`{variant}`", f"{e['perplexity_increase_pct']:+.4f}%", f"{e['kl_divergence']:.2e}",
                     num(e["top1_agreement"], 3), num(e["greedy_match"], 3), e["speculative_method"],
                     num(e["accepted_per_draft_token"], 3)))
    return Table(("variant", "perplexity vs BF16", "KL", "top-1 agreement", "greedy match", "CPU-estimate method",
                  "accepted/drafted"), tuple(rows))


def second_lease_stages() -> Table:
    return Table(("stage", "seconds", "end"), tuple((f"`{n}`", str(s), how)
                                                     for n, s, how in repro_stages(RUN2, "repro.log")))


BLOCKS = {"conditions": conditions, "repros": repros, "stage-times": stage_times,
          "served-bf16": lambda: served_table(record("bf16")),
          "served-fp8-dynamic": lambda: served_table(record("fp8-dynamic")),
          "against-bf16": against_bf16, "prediction": prediction, "prediction-note": prediction_note, "gate": gate,
          "second-lease": second_lease, "second-lease-stages": second_lease_stages}
