"""benchmarks/gpu/COSTS.md: the serving-cost profiles (data/serving-cost-profiles/, assembled from raw/costs/ by
benchmarks/gpu/costs.sh) and the served speedup they predict against the one served."""

from __future__ import annotations

import json
import statistics

from render import Column as C, Facts, Spec, Table, num, times
from tables import read, served as s

COSTS = read.RAW / "costs"
VERSIONS = COSTS / "versions/out"
PREDICTED = (
    ("demo-serve-bf16", "bf16", "cpu-estimate", "demo"),
    ("gpu-served", "bf16", "eval/bf16", "gpu-profile-1b"),
    ("gpu-served", "fp8-dynamic", "eval/fp8-dynamic", "gpu-profile-1b"),
    ("gpu-served-3", "bf16", "eval/bf16", "gpu-profile-1b"),
    ("gpu-served-3", "gptq-w4a16", "eval/gptq-w4a16", "gpu-profile-1b"),
    ("smollm2-gpu-3", "bf16", "eval/bf16", "smollm2-135m"),
)
RUNS = (
    *(f"costs/{p.name}" for p in sorted(COSTS.glob("lease-*"))),
    "costs/versions",
    *dict.fromkeys(run for run, *_ in PREDICTED),
)
BATCHES = (1, 4, 8, 16, 32, 64)


def step_cell(ms: float, m, batch: str) -> str:
    """A speculative step (ms) and in brackets its ratio to the plain step at that batch size."""
    return f"{num(ms)} (x{num(ms / read.serving_costs.interpolate(m.plain_step_ms, int(batch)), 1)})"


def error_spread(err: list[float]) -> str | None:
    return f"{100 * max(err):.0f}% (median {100 * statistics.median(err):.0f}%)" if err else None


def profile_blocks(prof) -> dict:
    t = prof.target
    out = {
        f"target-{prof.name}": Facts(
            lambda: [
                ("target parameters (M)", f"{t['params'] / 1e6:.1f}"),
                ("layers", t["num_hidden_layers"]),
                ("hidden size", t["hidden_size"]),
                ("vocabulary", t["vocab_size"]),
                ("runs", ", ".join(f"`{r}`" for r in prof.runs)),
            ]
        ),
        f"plain-{prof.name}": lambda: Table(
            ("plain decoding, batch", *prof.plain_step_ms),
            (
                ("step as measured (ms)", *(num(v) for v in prof.plain_step_ms_measured.values())),
                ("monotone fit (ms)", *(num(v) for v in prof.plain_step_ms.values())),
            ),
        ),
    }
    if prof.methods:
        out[f"methods-{prof.name}"] = Spec(
            lambda: prof.methods.items(),
            (
                C("method", lambda m: m[0]),
                C("run", lambda m: f"`{m[1].run}`"),
                C("draft parameters (M)", lambda m: f"{m[1].drafter['params'] / 1e6:.1f}" if m[1].drafter else None),
                C("draft layers", lambda m: m[1].drafter["num_hidden_layers"] if m[1].drafter else None),
                C(
                    "an inner k interpolated from its neighbours: largest error over the batch sizes",
                    lambda m: error_spread(list(m[1].interpolation_error.values())),
                ),
            ),
        )
    for name, m in prof.methods.items():
        batches = list(next(iter(m.step_ms_measured.values())))
        out[f"steps-{name}-{prof.name}"] = Spec(
            lambda m=m: m.step_ms_measured.items(),
            (C("k", lambda r: r[0]), *(C(f"batch {b}", lambda r, b=b, m=m: step_cell(r[1][b], m, b)) for b in batches)),
        )
    return out


def offline_rows(prof) -> list[dict]:
    """The demo's trained models in vLLM's offline engine (measure_costs.py served, each run's served-demo/) against
    the prediction from the CPU estimate of the same models and the demo-shape profile."""
    rows = []
    for served in sorted(COSTS.glob("lease-*/served-demo")):
        plain = {b: r["served"] for b, r in _record(served / "plain-k0.json").items()}
        for f in sorted(served.glob("*-k*.json"), key=lambda p: (p.stem.split("-k")[0], int(p.stem.split("-k")[1]))):
            method, k = f.stem.split("-k")[0], json.loads(f.read_text())["k"]
            if method == "plain":
                continue
            est = {
                key: v[str(k)]
                for key, v in json.loads((COSTS / "cpu-estimate" / f"speculative-{method}.json").read_text()).items()
                if key.endswith("_by_k")
            }
            for r in json.loads(f.read_text())["runs"]:
                sv, p = r["served"], plain[r["batch"]]
                measured = (sv["tokens"] / sv["wall_s"]) / (p["tokens"] / p["wall_s"])
                pred = prof.speedup(
                    method,
                    r["batch"],
                    est["tokens_per_step_by_k"],
                    est["drafted_per_step_by_k"],
                    est["steps_per_response_by_k"],
                )
                rows.append(
                    {
                        "run": served.parent.name,
                        "method": method,
                        "k": k,
                        "batch": r["batch"],
                        "plain": p["tokens"] / p["wall_s"],
                        "spec": sv["tokens"] / sv["wall_s"],
                        "measured": measured,
                        "predicted": pred,
                        "ratio": pred / measured,
                        "vllm": sv["num_accepted_tokens"] / sv["num_draft_tokens"]
                        if sv.get("num_draft_tokens")
                        else None,
                        "cpu": est["accepted_per_step_by_k"] / est["drafted_per_step_by_k"],
                    }
                )
    return rows


def spread(rows: list[dict]) -> str:
    errors = sorted(abs(r["ratio"] - 1) for r in rows)
    return f"{100 * errors[-1]:.0f}% (median {100 * errors[len(errors) // 2]:.0f}%)"


def offline_summary():
    demo = read.profile("-demo")
    rows = offline_rows(demo)
    wrong = [r for r in rows if (r["predicted"] >= 1) != (r["measured"] >= 1)]
    return [
        ("predicted cells", len(rows)),
        ("largest abs(predicted / served - 1), calibrated profile", spread(rows)),
        ("the same without the profile's served calibration", spread(offline_rows(demo.uncalibrated()))),
        (
            "cells where prediction and measurement disagree on whether speculation beats plain decoding",
            f"{len(wrong)}"
            + (" (" + ", ".join(f"{r['method']} k={r['k']} batch {r['batch']}" for r in wrong) + ")" if wrong else ""),
        ),
    ]


def step_costs() -> list[dict]:
    """ms per engine step per vLLM version and config (measure_costs.py's logs), with per drafted token beside."""
    rows = []
    for version in sorted(p for p in VERSIONS.iterdir() if p.is_dir() and p.name.startswith("vllm-")):
        for shape in sorted(p for p in version.iterdir() if p.is_dir()):
            logs = {f.stem: read.step_logs(f) for f in sorted(shape.glob("*.log"))}
            for name in sorted(logs, key=lambda n: (n != "plain-k0", n)):
                k, plain = int(name.rsplit("-k", 1)[1]), logs.get("plain-k0", {})
                rows.append(
                    {
                        "vllm": version.name.removeprefix("vllm-"),
                        "shape": shape.name,
                        "config": name,
                        **{
                            b: f"{v:.2f}" + (f" ({(v - plain[b]) / k:.2f})" if k and b in plain else "")
                            for b, v in logs[name].items()
                        },
                    }
                )
    return rows


def predictions() -> list[dict]:
    return [
        r
        for run, variant, estimates, shape in PREDICTED
        for r in s.predicted(run, variant, estimates, read.profile(shape))
    ]


def within(rows: list[dict], key: str) -> str:
    return f"{sum(abs(r[key] / r['served'] - 1) <= s.TOLERANCE for r in rows)} of {len(rows)}"


def tally() -> list[dict]:
    """Per served variant: how many of its cells each prediction put within the tolerance of the served speedup."""
    rows = predictions()
    groups = {(r["run"], r["variant"], r["sample"]): [] for r in rows}
    for r in rows:
        groups[(r["run"], r["variant"], r["sample"])].append(r)
    return [
        {
            "run": f"`{run}`",
            "variant": f"`{variant}`",
            "sample": sample,
            "before": within(cells, "before"),
            "after": within(cells, "after"),
        }
        for (run, variant, sample), cells in groups.items()
    ]


ACCEPTED = COSTS / "lease-4"  # known_accept.py's 8B models (benchmarks/gpu/scale_host.sh): drafts accepted
# the EAGLE-3 head rebuilt with its lm_head rows permuted (benchmarks/gpu/eagle3_known.sh): its first draft accepted
EAGLE3_ACCEPTED = COSTS / "lease-5"


def _record(path) -> dict:
    return {r["batch"]: r for r in json.loads(path.read_text())["runs"]}


def _ms(run: dict, batch: int) -> float:
    """An engine record's step time at this batch size, as the profile reads it (serving_costs._step)."""
    return read.serving_costs._step(run, batch)[0]


def _within(served: list[dict]) -> tuple[str, str]:
    """The fact line counting the served cells whose prediction is within the tolerance."""
    hits = sum(r["within"] == "yes" for r in served)
    return f"served cells whose prediction is within {s.TOLERANCE:.0%}", f"{hits} of {len(served)}"


def _accepted(run: dict) -> float | None:
    """vLLM's accepted / drafted tokens over an engine record's timed long generations (or its served totals)."""
    parts = [run["served"]] if "served" in run else run["long"]
    drafted = sum(p.get("num_draft_tokens") or 0 for p in parts)
    return sum(p.get("num_accepted_tokens") or 0 for p in parts) / drafted if drafted else None


def accepted_rows() -> list[dict]:
    """Each speculative engine of the 8B known-acceptance models beside its random-weight twin (where one ran):
    acceptance and step time (serving_costs._step, the profile's own reading) per batch size."""
    rows = []
    for f in sorted((ACCEPTED / "llama3-8b").glob("*-k*.json")):
        if f.stem == "plain-k0" or f.name.endswith(".failed.json"):
            continue
        real, dummy_path = _record(f), ACCEPTED / "llama3-8b-dummy" / f.name
        dummy = _record(dummy_path) if dummy_path.exists() else {}
        for b, run in real.items():
            twin = dummy.get(b)
            rows.append(
                {
                    "config": f.stem,
                    "batch": b,
                    "accepted": _accepted(run),
                    "ms": _ms(run, b),
                    "dummy_accepted": _accepted(twin) if twin else None,
                    "dummy_ms": _ms(twin, b) if twin else None,
                }
            )
    return rows


def accepted_served_rows(run=ACCEPTED) -> list[dict]:
    """The served check (measure_costs.py served: 32 random prompts, 96 tokens each, batches of 1, 16, 32) of the
    8B known-acceptance models of one run against the 8B profile's prediction at the tokens per step vLLM counted."""
    prof, folder = read.profile("-llama3-8b"), run / "llama3-8b-served"
    plain, n = _record(folder / "plain-k0.json"), len(json.loads((folder / "prompts.json").read_text()))
    rows = []
    for f in sorted(folder.glob("*-k*.json")):
        rec = json.loads(f.read_text())
        if rec["method"] == "plain":
            continue
        for r in rec["runs"]:
            sv, p = r["served"], plain[r["batch"]]["served"]
            tokens_per_step, drafted = sv["tokens"] / sv["num_drafts"], sv["num_draft_tokens"] / sv["num_drafts"]
            measured = (sv["tokens"] / sv["wall_s"]) / (p["tokens"] / p["wall_s"])
            pred = prof.speedup(rec["method"], r["batch"], tokens_per_step, drafted, sv["num_drafts"] / n)
            rows.append(
                {
                    "method": rec["method"],
                    "k": rec["k"],
                    "batch": r["batch"],
                    "accepted": _accepted(r),
                    "tokens_per_step": tokens_per_step,
                    "wall": sv["wall_s"],
                    "measured": measured,
                    "predicted": pred,
                    "ratio": pred / measured,
                    "within": "yes" if abs(pred / measured - 1) <= s.TOLERANCE else "no",
                }
            )
    return rows


def accepted_summary():
    """The two comparisons the accepted-8b table allows, computed: the draft model's step with drafts accepted over
    the same engine with none accepted (random weights), and the same ratio between two engines that both accept
    none (EAGLE-3, the spread of two engines)."""
    rows = [r for r in accepted_rows() if r["dummy_ms"]]

    def ratios(config: str) -> str:
        vals = [r["ms"] / r["dummy_ms"] for r in rows if r["config"] == config]
        return f"x{min(vals):.2f} to x{max(vals):.2f} over batches " + ", ".join(
            str(r["batch"]) for r in rows if r["config"] == config
        )

    return [
        ("draft model k=8: step with drafts accepted / step with none accepted", ratios("draft_model-k8")),
        ("EAGLE-3 k=8, both engines with none accepted: step / step", ratios("eagle3-k8")),
        _within(accepted_served_rows()),
    ]


def eagle3_accepted_rows() -> list[dict]:
    """The EAGLE-3 engines of the rebuilt head (lease-5) per batch size: vLLM's acceptance, accepted tokens per
    step, the step time and its ratio to plain decoding's step timed beside it (same run, same target), and the same
    ratio in the run whose head had no draft accepted (lease-4, against its own plain step)."""
    rows = []
    plain = _record(EAGLE3_ACCEPTED / "llama3-8b" / "plain-k0.json")
    old_plain = _record(ACCEPTED / "llama3-8b" / "plain-k0.json")
    for k in (2, 8):
        new, old = (_record(run / "llama3-8b" / f"eagle3-k{k}.json") for run in (EAGLE3_ACCEPTED, ACCEPTED))
        for b, run in new.items():
            ms, long = _ms(run, b), run["long"]
            old_ratio = _ms(old[b], b) / _ms(old_plain[b], b) if b in old and b in old_plain else None
            rows.append(
                {
                    "config": f"eagle3-k{k}",
                    "batch": b,
                    "accepted": _accepted(run),
                    "per_step": sum(p["num_accepted_tokens"] for p in long) / sum(p["num_drafts"] for p in long),
                    "ms": ms,
                    "ratio": ms / _ms(plain[b], b),
                    "old_ratio": old_ratio,
                }
            )
    return rows


def eagle3_accepted_summary():
    rows = [r for r in eagle3_accepted_rows() if r["old_ratio"]]
    vals = [r["ratio"] / r["old_ratio"] for r in rows]
    return [
        (
            "EAGLE-3 step / plain step, one draft accepted per step, over the same ratio with none accepted",
            f"x{min(vals):.2f} to x{max(vals):.2f} over {len(vals)} (k, batch) cells",
        ),
        _within(accepted_served_rows(EAGLE3_ACCEPTED)),
    ]


SERVED_COLUMNS = (
    C("method", "method"),
    C("k", "k"),
    C("batch", "batch"),
    C("vLLM accepted/drafted", "accepted", "{:.3f}"),
    C("tokens per step", "tokens_per_step", num),
    C("speculative run s", "wall", num),
    C("served speedup", "measured", times),
    C("predicted from the 8B profile", "predicted", times),
    C("predicted / served", "ratio", num),
    C(f"within {s.TOLERANCE:.0%}", "within"),
)

BLOCKS = {
    "eagle3-accepted-8b-summary": Facts(eagle3_accepted_summary),
    "eagle3-accepted-8b": Spec(
        eagle3_accepted_rows,
        (
            C("config", lambda r: f"`{r['config']}`"),
            C("batch", "batch"),
            C("vLLM accepted/drafted", "accepted", "{:.3f}"),
            C("accepted per step", "per_step", num),
            C("step ms", "ms", num),
            C("step / plain step", "ratio", num),
            C("step / plain step, none accepted (lease-4)", "old_ratio", num),
        ),
    ),
    "eagle3-accepted-8b-served": Spec(lambda: accepted_served_rows(EAGLE3_ACCEPTED), SERVED_COLUMNS),
    "accepted-8b-summary": Facts(accepted_summary),
    "accepted-8b": Spec(
        accepted_rows,
        (
            C("config", lambda r: f"`{r['config']}`"),
            C("batch", "batch"),
            C("accepted/drafted, known-acceptance weights", "accepted", "{:.3f}"),
            C("step ms", "ms", num),
            C("accepted/drafted, random weights", "dummy_accepted", "{:.3f}"),
            C("step ms, random weights", "dummy_ms", num),
        ),
    ),
    "accepted-8b-served": Spec(accepted_served_rows, SERVED_COLUMNS),
    "calibration": Spec(
        lambda: [(p.name, n, m) for p in read.profiles() for n, m in p.methods.items() if m.served_scale],
        (
            C("profile", lambda r: r[0]),
            C("method", lambda r: r[1]),
            C("served runs it is calibrated by (pooled)", lambda r: ", ".join(f"`{x}`" for x in r[2].served_runs)),
            C(
                "tokens per step from (n-gram)",
                lambda r: ", ".join(f"`{e}`" for e in r[2].served_estimates.values()) or None,
            ),
            C("scale at concurrency", lambda r: ", ".join(f"c={c} x{v:.2f}" for c, v in r[2].served_scale.items())),
        ),
    ),
    "predicted": Spec(
        predictions,
        (
            C("run", lambda r: f"`{r['run']}`"),
            C("variant", lambda r: f"`{r['variant']}`"),
            C("method", "method"),
            C("k", "k"),
            C("concurrency", "c"),
            C("served", "served", times),
            C("predicted, random-weight costs", "before", times),
            C("predicted, calibrated", "after", times),
            C("calibration", "sample"),
            C("calibrated / served", "ratio", num),
            C(f"within {s.TOLERANCE:.0%}", "within"),
            C("CPU accepted/drafted", "cpu", "{:.3f}"),
            C("vLLM accepted/drafted", "vllm", "{:.3f}"),
        ),
    ),
    "predicted-tally": Spec(
        tally,
        (
            C("run", "run"),
            C("variant", "variant"),
            C("calibration", "sample"),
            C(f"random-weight costs within {s.TOLERANCE:.0%}", "before"),
            C(f"calibrated within {s.TOLERANCE:.0%}", "after"),
        ),
    ),
    "offline": Spec(
        lambda: offline_rows(read.profile("-demo")),
        (
            C("run", "run"),
            C("method", "method"),
            C("k", "k"),
            C("batch", "batch"),
            C("plain tok/s", "plain", "{:.0f}"),
            C("speculative tok/s", "spec", "{:.0f}"),
            C("served speedup", "measured", times),
            C("predicted", "predicted", times),
            C("predicted / served", "ratio", num),
            C("vLLM accepted/drafted", "vllm", "{:.3f}"),
            C("CPU estimate", "cpu", "{:.3f}"),
        ),
    ),
    "offline-summary": Facts(offline_summary),
    "versions": Spec(
        step_costs,
        (
            C("vLLM", "vllm"),
            C("shape", "shape"),
            C("config", "config"),
            *(C(f"batch {b}", lambda r, b=b: r.get(b)) for b in BATCHES),
        ),
    ),
}
for _prof in read.profiles():
    BLOCKS.update(profile_blocks(_prof))
