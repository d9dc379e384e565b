"""Tables of benchmarks/gpu/GPU-SERVED.md: the GPU demo profile (1.07B target) through the whole pipeline on the H100,
each variant served plain and with every method beside BF16 in the same lease (issues #28 and #33, item 6).

Reads raw/gpu-served/ (one lease, two `dvc repro` in one workspace: BF16 through publish, then FP8 dynamic added),
raw/gpu-served-2/ (the second lease, BF16 and GPTQ W4A16: its archive ended at the start of `serve_bench`) and
raw/gpu-served-3/ (the third lease, GPTQ W4A16 served first, then BF16, to the gate). Predictions are the pipeline's
own (pipeline/evaluate/serving_costs.py): over the committed gpu-profile-1b profile, which benchmarks/gpu/costs.sh
calibrates by the BF16 records of the first and third leases pooled (out of sample for FP8 and GPTQ), over its
random-weight costs alone, and, for the third lease, what its own `evaluate` stage predicted (the profile then
calibrated by the first lease's BF16 alone).
"""
from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.evaluate import serving_costs  # noqa: E402
from pipeline.evaluate.summary import current_names  # noqa: E402  (the runs' older metric names)
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from render import Table, Text, facts, num, times  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from capacity import concurrencies, predicted_against_served, served_table  # noqa: E402
from smollm2 import kernel_choice, kernel_table, repro_lines, stage_times as timed_stages  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
RUN = RAW / "gpu-served"
RUN2 = RAW / "gpu-served-2"
RUN3 = RAW / "gpu-served-3"
RUNS = ("gpu-served", "gpu-served-2", "gpu-served-3")
PROFILE = ROOT / "data/serving-cost-profiles/h100-vllm0.26.0-gpu-profile-1b.json"
BASELINE = "bf16"
VARIANTS = ("bf16", "fp8-dynamic")  # served in RUN, in the order `dvc repro` served them
VARIANTS3 = ("gptq-w4a16", "bf16")  # served in RUN3, in that order (GP_REPRO: serve_bench@gptq-w4a16 first)
TOLERANCE = 0.20  # #28's target: predicted within 20% of served
REPROS = (("1", "repro-1.log", "params-1.yaml"), ("2", "repro-2.log", "params.yaml"))


def record(variant: str, run: Path = RUN) -> ServeBenchRecord:
    return records.read(ServeBenchRecord, run / "serve" / variant / "record.json")


def repro_stages(run: Path, log: str) -> list[tuple[str, int, str]]:
    """(stage, seconds, how it ended) for each stage the `dvc repro` log shows running: ran (DVC locked it), failed
    (DVC's 'failed to reproduce' line names it) or cut off (the log ends in it)."""
    lines = repro_lines(run, log)
    failed = {m.group(1).removeprefix("stages/dvc.yaml:") for _, text in lines
              if (m := re.match(r"ERROR: failed to reproduce '([^']+)'", text))}
    return [(name, end - start, "ran" if done else "failed" if name in failed else "cut off")
            for name, start, end, done in timed_stages(lines)]


def conditions(run: Path = RUN, variants: tuple[str, ...] = VARIANTS) -> Table:
    rec, params = record(BASELINE, run), yaml.safe_load((run / "params.yaml").read_text())
    plain, bench, demo = rec.configs[PLAIN], params["serve_bench"], params["demo"]["target"]
    return facts([("GPU", rec.gpu), ("vLLM", rec.vllm_version),
                  ("target", f"{demo['num_hidden_layers']} layers, hidden {demo['hidden_size']} "
                             f"({models_params(run)}, `metrics/models.json`)"),
                  ("variants, in the order served", ", ".join(f"`{v}`" for v in variants)),
                  ("concurrency", ", ".join(map(str, concurrencies(rec)))),
                  ("prompts per level (at least)", f"{bench['prompts_per_concurrency']} per user ({bench['min_prompts']})"),
                  ("capacity search: probes at most, ceiling", f"{bench['capacity']['max_probes']}, "
                                                               f"{bench['capacity']['max_concurrency']} users"),
                  ("SLO", plain.capacity.slo.label()), ("k schedule", bench["k_schedule"])], ("condition", "value"))


def models_params(run: Path = RUN) -> str:
    m = json.loads((run / "metrics" / "models.json").read_text())
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


def against_bf16(run: Path = RUN, variants: tuple[str, ...] = VARIANTS) -> Table:
    base = record(BASELINE, run)
    rows = []
    for variant in (v for v in variants if v != BASELINE):
        rec = record(variant, run)
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


CALIBRATED_BY = ("gpu-served/serve/bf16/record.json", "gpu-served-3/serve/bf16/record.json")


def committed_profile():
    calibrated = serving_costs.load(PROFILE)
    for m, cost in calibrated.methods.items():
        if not all(any(r.endswith(want) for r in cost.served_runs) for want in CALIBRATED_BY):
            raise SystemExit(f"{PROFILE.name}: {m} is not calibrated by {', '.join(CALIBRATED_BY)} pooled: "
                             "run benchmarks/gpu/costs.sh")
    return calibrated


def in_sample(run: Path, variant: str) -> bool:
    return variant == BASELINE and any(f"{run.name}/serve/{variant}/" in c for c in CALIBRATED_BY)


def prediction_rows(run: Path = RUN, variants: tuple[str, ...] = VARIANTS) -> list[dict]:
    """capacity.predicted_against_served for each variant of the run (before: the profile's random-weight costs,
    after: the committed profile, calibrated by both BF16 records pooled), with what the run's own `evaluate`
    predicted at the served k (at_run: the profile as it was committed when the run was sent)."""
    profile, rows = committed_profile(), []
    for variant in variants:
        for row in predicted_against_served(record(variant, run), run / "eval" / variant, profile):
            est = json.loads((run / "eval" / variant / f"speculative-{row['method']}.json").read_text())
            at_run = est["served"]["speedup_by_k"][str(row["c"])][str(row["k"])]
            rows.append({"variant": variant, **row, "at_run": at_run})
    return rows


def within(pred: float, served: float) -> str:
    return "yes" if abs(pred / served - 1) <= TOLERANCE else "no"


def prediction(run: Path = RUN, variants: tuple[str, ...] = VARIANTS, first: str = "before",
               first_header: str = "predicted, random-weight costs") -> Table:
    """Predicted against served per variant, method and concurrency: `first` (before: random-weight costs; at_run:
    what the run's `evaluate` predicted), then the committed profile's prediction."""
    rows = []
    for r in prediction_rows(run, variants):
        sample = "in sample" if in_sample(run, r["variant"]) else "out of sample"
        rows.append((f"`{r['variant']}`", r["method"], str(r["k"]), str(r["c"]), times(r["served"]),
                     times(r[first]), within(r[first], r["served"]),
                     f"{times(r['after'])} ({sample})", within(r["after"], r["served"]),
                     num(r["cpu"], 3), num(r["vllm"], 3)))
    return Table(("variant", "method", "k", "concurrency", "served", first_header, f"within {TOLERANCE:.0%}",
                  "predicted, calibrated by both leases' BF16 (committed)", f"within {TOLERANCE:.0%}",
                  "CPU accepted/drafted", "vLLM accepted/drafted"), tuple(rows))


def bf16_calibration(run: Path):
    """The committed profile's step timings calibrated by one lease's BF16 record alone (costs.sh's call with that
    record only)."""
    served = serving_costs.ServedRun(json.loads((run / "serve/bf16/record.json").read_text()),
                                     f"{run.name}/serve/bf16/record.json",
                                     json.loads((run / "eval/bf16/speculative-ngram.json").read_text()))
    return serving_costs.calibrate(committed_profile().uncalibrated(), [served])


def cross_lease() -> Table:
    """Each quantized variant predicted with the step costs calibrated by the other lease's BF16 alone: no number
    of the variant's own lease in the calibration."""
    rows = []
    for run, variant, other in ((RUN, "fp8-dynamic", RUN3), (RUN3, "gptq-w4a16", RUN)):
        for r in predicted_against_served(record(variant, run), run / "eval" / variant, bf16_calibration(other)):
            rows.append((f"`{variant}` ({run.name})", f"`{other.name}`", r["method"], str(r["c"]), times(r["served"]),
                         times(r["after"]), f"{r['after'] / r['served'] - 1:+.0%}", within(r["after"], r["served"])))
    return Table(("variant (lease)", "calibrated by BF16 of", "method", "concurrency", "served", "predicted",
                  "predicted / served - 1", f"within {TOLERANCE:.0%}"), tuple(rows))


def tally(cells: list[dict], label: str) -> str:
    ok = sum(abs(r[label] / r["served"] - 1) <= TOLERANCE for r in cells)
    side = sum((r[label] >= 1) == (r["served"] >= 1) for r in cells)
    by_c = ", ".join(f"c={c} {sum(abs(r[label] / r['served'] - 1) <= TOLERANCE for r in cells if r['c'] == c)}"
                     f"/{sum(r['c'] == c for r in cells)}" for c in sorted({r["c"] for r in cells}))
    return f"{ok} of {len(cells)} cells within {TOLERANCE:.0%} ({by_c}), {side} on the served side of 1.0"


def prediction_note() -> Text:
    rows = prediction_rows()
    out = [f"random-weight costs (every variant): {tally(rows, 'before')}",
           "calibrated by both leases' BF16, out of sample (FP8 dynamic): "
           + tally([r for r in rows if not in_sample(RUN, r["variant"])], "after")]
    return Text("; ".join(out) + ".")


def prediction_note3() -> Text:
    rows = prediction_rows(RUN3, VARIANTS3)
    gptq = [r for r in rows if r["variant"] == "gptq-w4a16"]
    bf16 = [r for r in rows if r["variant"] == BASELINE]
    worst = max(gptq, key=lambda r: abs(r["at_run"] / r["served"] - 1))
    return Text(f"As the run predicted (calibrated by the first lease's BF16): GPTQ W4A16 {tally(gptq, 'at_run')}; "
                f"this run's BF16 {tally(bf16, 'at_run')}. The farthest cell: GPTQ's {worst['method']} at "
                f"c={worst['c']}, predicted {times(worst['at_run'])} against {times(worst['served'])} served "
                f"({worst['at_run'] / worst['served'] - 1:+.0%}). Calibrated by both leases' BF16 (committed): "
                f"GPTQ W4A16, out of sample, {tally(gptq, 'after')}.")


def gate_lines(log: Path) -> str:
    return "\n".join(re.sub(r"^\d+ ", "", line) for line in log.read_text().splitlines()
                     if re.match(r"\d+ (gate |error: gate|bundle |publish )", line))


def gate() -> Text:
    out = [f"dvc repro {label}:\n" + gate_lines(RUN / log) for label, log, _ in REPROS]
    return Text("```\n" + "\n\n".join(out) + "\n```")


def gate3() -> Text:
    return Text("```\n" + gate_lines(RUN3 / "repro.log") + "\n```")


def second_lease() -> Table:
    rows = []
    for variant in ("bf16", "gptq-w4a16"):
        e = current_names(json.loads((RUN2 / "metrics" / f"eval-{variant}.json").read_text()))
        rows.append((f"`{variant}`", f"{e['perplexity_increase_pct']:+.4f}%", f"{e['kl_divergence']:.2e}",
                     num(e["top1_agreement"], 3), num(e["greedy_match"], 3), e["estimated_method"],
                     num(e["accepted_per_draft_token"], 3)))
    return Table(("variant", "perplexity vs BF16", "KL", "top-1 agreement", "greedy match", "CPU-estimate method",
                  "accepted/drafted"), tuple(rows))


def lease_stages(run: Path) -> Table:
    """Each stage of a lease's one `dvc repro` log (repro.log) with its seconds and how it ended."""
    return Table(("stage", "seconds", "end"), tuple((f"`{n}`", str(s), how)
                                                     for n, s, how in repro_stages(run, "repro.log")))


BLOCKS = {"conditions": conditions, "repros": repros, "stage-times": stage_times,
          "served-bf16": lambda: served_table(record("bf16")),
          "served-fp8-dynamic": lambda: served_table(record("fp8-dynamic")),
          "against-bf16": against_bf16, "prediction": prediction, "prediction-note": prediction_note, "gate": gate,
          "second-lease": second_lease, "second-lease-stages": partial(lease_stages, RUN2),
          "conditions-3": lambda: conditions(RUN3, VARIANTS3), "stage-times-3": partial(lease_stages, RUN3),
          "served-gptq-w4a16-3": lambda: served_table(record("gptq-w4a16", RUN3)),
          "served-bf16-3": lambda: served_table(record("bf16", RUN3)),
          "kernels-3": partial(kernel_table, "gptq-w4a16", RUN3), "kernel-choice-3": partial(kernel_choice, "gptq-w4a16", RUN3),
          "against-bf16-3": lambda: against_bf16(RUN3, VARIANTS3), "prediction-3": partial(prediction, RUN3, VARIANTS3, "at_run",
                                   "predicted by the run's `evaluate` (calibrated by the first lease's BF16)"),
          "prediction-note-3": prediction_note3, "gate-3": gate3, "cross-lease": cross_lease}
