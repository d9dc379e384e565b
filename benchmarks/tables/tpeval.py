"""raw/tpeval/ (benchmarks/gpu/tp_eval.sh on 2 GPUs) and raw/scale-host/ (benchmarks/gpu/scale_host.sh on 4): the
pipeline's GPTQ W4A16 of a Llama-3-8B-shape model on 1, 2 and 4 GPUs and of a 2-layer model of Llama-3-70B's widths on
1 and 4, per-layer times and llm-compressor's per-module GPTQ errors from run.log, fidelity through vLLM at TP 1 and 2,
and the entries that failed. Rows for SCALE.md's blocks (benchmarks/tables/scale.py) and docs/scale.md's; nothing here
formats beyond rounding choices in the columns."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

from tables import read

RUN, HOST = "tpeval", "scale-host"
RUNS = (RUN, HOST)
MIXED = read.RAW / "mixed8b"
QUANT_STEPS = {
    RUN: ("quant-8b-1gpu", "quant-8b-2gpu", "quant-8b-1gpu-offload", "quant-demo-1gpu"),
    HOST: ("quant-8b-1gpu", "quant-8b-2gpu", "quant-8b-4gpu", "quant-70b2-1gpu-offload", "quant-70b2-4gpu"),
}
# (run, checkpoint, TP, record under out/, the step that wrote it)
FIDELITY = (
    *(
        (RUN, m, tp, f"fidelity-{m}-tp{tp}.json", f"vllm-{m}-tp{tp}")
        for m, tp in (("8b", 1), ("8b", 2), ("demo", 1), ("demo", 2))
    ),
    (HOST, "8b", 1, "fidelity-8b.json", "fidelity-8b"),
)
CHECKPOINT = {
    "8b": "Llama-3-8B shape, random weights, made in each run (run_gpu.py make8b): the runs' errors and perplexities "
    "differ, so compare rows within a run",
    "70b2": "2 decoder layers of Llama-3-70B's widths (run_gpu.py make70b: hidden 8192, FFN 28672), random weights",
    "demo": "the demo target (artifacts/models/target)",
}
FULL_LAYERS = {"70b2": 80}  # the whole model's decoder layers, for the extrapolation from a cut-down one
GPUS = re.compile(r"-(\d+)gpu")
ERROR_LINE = re.compile(r"GPTQ \| METRIC - error ([0-9.eE+-]+)")
STEP_LINE = re.compile(r"^(?P<t>[0-9.]+) STEP (?P<name>[\w-]+)", re.M)
# llm-compressor's own clock on each module it quantizes (UTC, 0.1 ms): the first of a decoder layer marks its start
LAYER_LINE = re.compile(
    r"(?P<iso>\d{4}-\d\d-\d\dT[\d:.]+) \| compress_module_list \| INFO - Quantizing \d+ "
    r"module\(s\): \['model\.layers\.(?P<layer>\d+)\."
)
STEPS_TXT = re.compile(r"^(?P<name>[\w-]+) rc=(?P<rc>\d+) seconds=(?P<s>[0-9.]+) peak_mib: (?P<peaks>.*)$", re.M)
ROOT_CAUSE = re.compile(r"((?:FileNotFoundError|ValueError|RuntimeError): .*)")
GENERIC = "Engine core initialization failed"  # vLLM's wrapper; the worker's own error says why
MEANING = {  # what each root cause means, by its first words (written by hand, checked against the log by prefix)
    "RuntimeError: Expected all tensors to be on the same device": (
        "the decompressed GPTQ variant stayed in compressed-tensors' CPU offload cache after .to(cuda); fixed: "
        "load_causal_lm removes that dispatch, quality.fidelity compares on the baseline's device"
    ),
    "FileNotFoundError: [Errno 2] No such file or directory: '/work/main/benchmarks/gpu/tp_eval.py'": (
        "vLLM's spawned workers started while the next device call re-synced the tree; fixed: background steps run "
        "from a private copy (session.sh private_tree)"
    ),
    "ValueError: Weight input_size_per_partition=192": (
        "the demo's o_proj (384 inputs) splits into 192 per GPU at TP 2, not a whole number of 128-groups: this "
        "checkpoint cannot be served at TP 2"
    ),
    "no exit line": "not a failure: the run ended during the step",
}


@dataclass(frozen=True)
class Step:
    name: str
    start: float  # epoch seconds (tp_eval.sh's EPOCHREALTIME)
    end: float | None  # None: no steps.txt line (the run ended before the step did)
    rc: int | None
    peaks_mib: dict[str, int]
    log: str  # the step's lines of run.log


def steps(run: str = RUN) -> dict[str, Step]:
    log = (read.RAW / run / "run.log").read_text()
    done = {m["name"]: m for m in STEPS_TXT.finditer((read.RAW / run / "steps.txt").read_text())}
    marks = list(STEP_LINE.finditer(log))
    out = {}
    for i, m in enumerate(marks):
        d, start = done.get(m["name"]), float(m["t"])
        body = log[m.start() : marks[i + 1].start() if i + 1 < len(marks) else len(log)]
        peaks = dict(p.split("=") for p in d["peaks"].split()) if d else {}
        out[m["name"]] = Step(
            m["name"],
            start,
            start + float(d["s"]) if d else None,
            int(d["rc"]) if d else None,
            {k: int(v) for k, v in sorted(peaks.items())},
            body,
        )
    return out


def mixed_window() -> tuple[float, float]:
    """mixed8b's first and last clock line (HH:MM:SS on its run.json's date) on GPU 1, as epoch seconds."""
    date = json.loads((MIXED / "run.json").read_text())["date"]
    clocks = re.findall(r"^(\d\d:\d\d:\d\d) ", (MIXED / "run.log").read_text(), re.M)
    stamp = [datetime.fromisoformat(f"{date}T{c}+00:00").timestamp() for c in (clocks[0], clocks[-1])]
    return stamp[0], stamp[1]


def beside(run: str, step: Step) -> str:
    """What else ran on the host during the step: in tpeval, mixed8b on GPU 1; scale_host.sh runs its steps one by
    one."""
    return beside_mixed(step) if run == RUN else "alone"


def beside_mixed(step: Step) -> str:
    lo, hi = mixed_window()
    end = step.end if step.end is not None else float("inf")
    return "mixed8b on GPU 1" if step.start < hi and end > lo else "alone"


def layer_seconds(step: Step) -> list[float]:
    """Seconds from one decoder layer's first quantized module to the next layer's (both ranks' lines: the earliest
    per layer), so the last layer has none."""
    first: dict[int, float] = {}
    for m in LAYER_LINE.finditer(step.log):
        t = datetime.fromisoformat(m["iso"]).replace(tzinfo=timezone.utc).timestamp()
        first[int(m["layer"])] = min(t, first.get(int(m["layer"]), t))
    layers = sorted(first)
    return [first[b] - first[a] for a, b in zip(layers, layers[1:]) if b == a + 1]


def gptq_errors(step: Step) -> list[float]:
    """llm-compressor's `GPTQ | METRIC - error X` per quantized module (every rank's), in the step's log."""
    return [float(e) for e in ERROR_LINE.findall(step.log)]


def quant_record(name: str, run: str = RUN) -> dict | None:
    path = read.RAW / run / "out" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def quant_rows() -> list[dict]:
    rows = [row for run in RUNS for row in run_quant_rows(run)]
    for r in rows:  # against the same checkpoint quantized on one GPU in the same run, where both did every module
        ref = next((o for o in rows if (o["run"], o["checkpoint"], o["gpus"]) == (r["run"], r["checkpoint"], 1)), None)
        same = ref is not None and ref is not r and ref["done"] == r["done"] == "yes" and ref["modules"] == r["modules"]
        r["error_vs_1gpu"] = (r["error_sum"] / ref["error_sum"] - 1) * 100 if same and ref["error_sum"] else None
    return rows


def run_quant_rows(run: str) -> list[dict]:
    all_steps, rows = steps(run), []
    for name in QUANT_STEPS[run]:
        step, rec = all_steps.get(name), quant_record(name, run)
        if step is None:
            continue
        m = (rec or {}).get("metrics", {})
        per, errors = layer_seconds(step), gptq_errors(step)
        checkpoint = name.split("-")[1]
        gpus = rec["gpus"] if rec else int(GPUS.search(name)[1])
        median = statistics.median(per) if per else None
        rows.append(
            {
                "run": run,
                "step": name,
                "checkpoint": checkpoint,
                "gpus": gpus,
                "offload": rec["offload"] if rec else "offload" in name,
                "step_s": (step.end or 0) - step.start if step.end else None,
                "wall_s": rec and rec["wall_s"],
                "pipeline_s": m.get("wall_time_s"),
                "oneshot_s": m.get("oneshot_time_s"),
                "peak_gpu_mb": m.get("peak_gpu_memory_mb"),
                "smi_mib": " / ".join(
                    f"{k} {v:,}"
                    for k, v in step.peaks_mib.items()  # the GPUs it used
                    if int(k.removeprefix("gpu")) < gpus
                )
                or None,
                "size_mb": m.get("size_after_mb"),
                "layers": len(per),
                "median": median,
                "mean": statistics.mean(per) if per else None,
                "total": sum(per) if per else None,
                "full_layers": FULL_LAYERS.get(checkpoint),
                "extrapolated_s": median * FULL_LAYERS[checkpoint] if median and checkpoint in FULL_LAYERS else None,
                "modules": len(errors),
                "error_sum": sum(errors) if errors else None,
                "beside": beside(run, step),
                "done": "yes" if rec else "no: the run ended during it",
            }
        )
    return rows


def fidelity_rows() -> list[dict]:
    rows = []
    for run, model, tp, record, step in FIDELITY:
        rec = json.loads((read.RAW / run / "out" / record).read_text())
        for variant, v in rec["variants"].items():
            f = v.get("fidelity", {})
            rows.append(
                {
                    "run": run,
                    "step": step,
                    "model": model,
                    "tp": tp,
                    "variant": variant,
                    "error": v.get("error"),
                    **f,
                    "seconds": v.get("seconds"),
                }
            )
    return rows


def root_cause(step: Step) -> str | None:
    """The first error line of the step's log that is not vLLM's generic wrapper, cut at its first sentence."""
    for m in ROOT_CAUSE.finditer(step.log):
        if GENERIC not in m[1]:
            return m[1].split(". ")[0][:160]
    return None


def failures() -> list[dict]:
    """Each entry without a result: a failed step, a variant whose record holds an error, an unfinished step."""
    rows = []
    for run in RUNS:
        for step in steps(run).values():
            if step.rc not in (0, None):
                rows.append({"run": run, "entry": f"`{step.name}`", "cause": root_cause(step)})
            elif step.rc is None and step.name in QUANT_STEPS[run]:
                cause = "no exit line in steps.txt: the run ended first"
                rows.append({"run": run, "entry": f"`{step.name}`", "cause": cause})
    for r in (r for r in fidelity_rows() if r["error"]):
        step = steps(r["run"])[r["step"]]
        entry = f"`fidelity-{r['model']}-tp{r['tp']}` `{r['variant']}`"
        rows.append({"run": r["run"], "entry": entry, "cause": root_cause(step)})
    return rows


def meaning(cause: str | None) -> str | None:
    return next((v for k, v in MEANING.items() if cause and cause.startswith(k)), None)


LINKS = {2: "NVLink between the pair", 4: "NVLink between every pair"}  # as each run's topo.txt shows


def conditions() -> list[tuple[str, str]]:
    out = []
    for run in RUNS:
        gpu = json.loads((read.RAW / run / "run.json").read_text())["gpu"]
        where = f"{LINKS.get(gpu['count'], 'links')}: `raw/{run}/topo.txt`"
        out.append((f"GPU (`{run}`)", f"{gpu['count']}x {gpu['name']} ({where}), driver {gpu['driver']}"))
    software = {
        run: ", ".join(f"{k} {sw[k]}" for k in ("vllm", "torch", "llmcompressor"))
        for run in RUNS
        for sw in [json.loads((read.RAW / run / "run.json").read_text())["software"]]
    }
    if len(set(software.values())) == 1:
        out.append(("software", f"{software[RUN]} (both runs)"))
    else:
        out += [(f"software (`{run}`)", v) for run, v in software.items()]
    out.append(("checkpoints", "; ".join(f"{k}: {v}" for k, v in CHECKPOINT.items())))
    recipes = {
        (rec["metrics"]["group_size"], rec["samples"], rec["max_seq_length"])
        for run in RUNS
        for name in QUANT_STEPS[run]
        if (rec := quant_record(name, run))
    }
    for group, samples, seq in sorted(recipes):
        out.append(
            (
                "quantization",
                f"the pipeline's GPTQ W4A16 g{group} (pipeline/quantize/distributed.py), {samples} calibration "
                f"samples of at most {seq} tokens" + (" (both runs)" if len(recipes) == 1 else ""),
            )
        )
    return out
