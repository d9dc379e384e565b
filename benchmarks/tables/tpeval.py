"""raw/tpeval/ (benchmarks/gpu/tp_eval.sh on 2 GPUs): the pipeline's GPTQ W4A16 of a Llama-3-8B-shape model on 1
and 2 GPUs, per-layer times from run.log, fidelity through vLLM at TP 1 and 2, and the entries that failed. Rows
for SCALE.md's blocks (benchmarks/tables/scale.py); nothing here formats beyond rounding choices in the columns."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

from tables import read

RUN = read.RAW / "tpeval"
MIXED = read.RAW / "mixed8b"
QUANT_STEPS = ("quant-8b-1gpu", "quant-8b-2gpu", "quant-8b-1gpu-offload", "quant-demo-1gpu")
FIDELITY = (("8b", 1), ("8b", 2), ("demo", 1), ("demo", 2))
CHECKPOINT = {"8b": "Llama-3-8B shape, random weights", "demo": "the demo target (artifacts/models/target)"}
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


def steps() -> dict[str, Step]:
    log = (RUN / "run.log").read_text()
    done = {m["name"]: m for m in STEPS_TXT.finditer((RUN / "steps.txt").read_text())}
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


def quant_record(name: str) -> dict | None:
    path = RUN / "out" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def quant_rows() -> list[dict]:
    all_steps, rows = steps(), []
    for name in QUANT_STEPS:
        step, rec = all_steps.get(name), quant_record(name)
        if step is None:
            continue
        m = (rec or {}).get("metrics", {})
        per = layer_seconds(step)
        rows.append(
            {
                "step": name,
                "gpus": rec["gpus"] if rec else (2 if "2gpu" in name else 1),
                "offload": rec["offload"] if rec else "offload" in name,
                "step_s": (step.end or 0) - step.start if step.end else None,
                "wall_s": rec and rec["wall_s"],
                "pipeline_s": m.get("wall_time_s"),
                "oneshot_s": m.get("oneshot_time_s"),
                "peak_gpu_mb": m.get("peak_gpu_memory_mb"),
                "smi_mib": " / ".join(
                    f"{k} {v:,}"
                    for k, v in step.peaks_mib.items()  # the GPUs it used
                    if int(k.removeprefix("gpu")) < (rec["gpus"] if rec else 1)
                )
                or None,
                "size_mb": m.get("size_after_mb"),
                "layers": len(per),
                "median": statistics.median(per) if per else None,
                "mean": statistics.mean(per) if per else None,
                "total": sum(per) if per else None,
                "beside": beside_mixed(step),
                "done": "yes" if rec else "no: the run ended during it",
            }
        )
    return rows


def fidelity_rows() -> list[dict]:
    rows = []
    for model, tp in FIDELITY:
        rec = json.loads((RUN / "out" / f"fidelity-{model}-tp{tp}.json").read_text())
        for variant, v in rec["variants"].items():
            f = v.get("fidelity", {})
            rows.append(
                {
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
    all_steps, rows = steps(), []
    for step in all_steps.values():
        if step.rc not in (0, None):
            rows.append({"entry": f"`{step.name}`", "cause": root_cause(step)})
        elif step.rc is None and step.name in QUANT_STEPS:
            rows.append({"entry": f"`{step.name}`", "cause": "no exit line in steps.txt: the run ended first"})
    for r in (r for r in fidelity_rows() if r["error"]):
        step = all_steps[f"vllm-{r['model']}-tp{r['tp']}"]
        rows.append({"entry": f"`fidelity-{r['model']}-tp{r['tp']}` `{r['variant']}`", "cause": root_cause(step)})
    return rows


def meaning(cause: str | None) -> str | None:
    return next((v for k, v in MEANING.items() if cause and cause.startswith(k)), None)


def conditions() -> list[tuple[str, str]]:
    spec, rec = json.loads((RUN / "run.json").read_text()), quant_record("quant-8b-1gpu")
    gpu, sw = spec["gpu"], spec["software"]
    return [
        (
            "GPU",
            f"{gpu['count']}x {gpu['name']} (NVLink between the pair: `raw/tpeval/topo.txt`), driver {gpu['driver']}",
        ),
        ("software", ", ".join(f"{k} {sw[k]}" for k in ("vllm", "torch", "llmcompressor"))),
        ("checkpoints", f"8b: {CHECKPOINT['8b']}; demo: {CHECKPOINT['demo']}"),
        (
            "quantization",
            f"the pipeline's GPTQ W4A16 g{rec['metrics']['group_size']} "
            f"(pipeline/quantize/distributed.py), {rec['samples']} calibration samples of at most "
            f"{rec['max_seq_length']} tokens",
        ),
    ]
