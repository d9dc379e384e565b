"""Numbers the top-level README may quote, computed from the committed raw output (no GPU, torch or pipeline).

    python benchmarks/summary.py    # both summaries as JSON

served_summary() reads the GPU demo profile's vLLM 0.26.0 runs (benchmarks/gpu/SERVING.md) through the readers its
tables use (benchmarks/tables/read.py); quantize_summary() is benchmarks/quantize_bench.py's (the
same that renders quantize.md). The vLLM 0.25.0 runs (benchmarks/gpu/history/) are quoted nowhere at the top level.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path):
    # The scripts are not a package (they run as files on the GPU host); load them by path.
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GPU_PROFILE = (
    ("gpu-served", ("bf16", "fp8-dynamic"), "repro-2.log"),
    ("gpu-served-3", ("gptq-w4a16", "bf16"), "repro.log"),
)  # each run's variants, in the order served


def served_summary() -> dict:
    """The GPU demo profile on vLLM 0.26.0 (SERVING.md): per run, its GPU and vLLM (run.json), each quantized
    variant's plain decoding against BF16's in the same run, each served method against its variant's plain decoding,
    and the gate's line per variant (the run's `dvc repro` log)."""
    sys.path.insert(0, str(HERE))
    from tables import read

    out = {}
    for run, variants, log in GPU_PROFILE:
        spec = json.loads((read.RAW / run / "run.json").read_text())
        base = read.record(run, read.BASELINE).configs[read.PLAIN]
        models = json.loads((read.RAW / run / "metrics" / "models.json").read_text())
        entry = {
            "gpu": spec["gpu"]["name"],
            "vllm": spec["software"]["vllm"],
            "variants": {},
            "params": {role: models[role]["params"] for role in ("target", "draft")},
        }
        gates = dict(re.findall(r"^\d+ gate (\S+): (PASS|FAIL)", (read.RAW / run / log).read_text(), re.M))
        for variant in variants:
            rec = read.record(run, variant)
            plain = rec.configs[read.PLAIN]
            conc = read.concurrencies(rec)
            entry["variants"][variant] = {
                "vs_bf16_plain": {f"c{c}": plain.at(c).output_throughput / base.at(c).output_throughput for c in conc},
                "methods": {
                    name: {
                        "k": cfg.num_speculative_tokens,
                        "vs_plain": {
                            f"c{c}": cfg.at(c).output_throughput / plain.at(c).output_throughput for c in conc
                        },
                    }
                    for name, cfg in rec.configs.items()
                    if name != read.PLAIN
                },
                "gate": gates.get(variant),
            }
        out[run] = entry
    return out


def quantize_summary() -> dict:
    return _load(HERE / "quantize_bench.py").quantize_summary()


if __name__ == "__main__":
    print(json.dumps({"gpu": served_summary(), "quantize": quantize_summary()}, indent=2))
