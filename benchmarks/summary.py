"""Numbers the top-level README may quote, computed from the committed raw output (no GPU, torch or pipeline).

    python benchmarks/summary.py    # both summaries as JSON

served_summary() reads the vLLM 0.26.0 runs behind benchmarks/gpu/GPU-SERVED.md through the records and functions
its tables use (benchmarks/gpu/tables/gpu_served.py); quantize_summary() is benchmarks/quantize_bench.py's (the
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


def served_summary() -> dict:
    """The GPU demo profile on vLLM 0.26.0 (GPU-SERVED.md): per run, its GPU and vLLM (run.json), each quantized
    variant's plain decoding against BF16's in the same run, each served method against its variant's plain decoding,
    and the gate's line per variant (the run's `dvc repro` log)."""
    gs = _load(HERE / "gpu" / "tables" / "gpu_served.py")
    out = {}
    for run, variants, log in ((gs.RUN, gs.VARIANTS, "repro-2.log"), (gs.RUN3, gs.VARIANTS3, "repro.log")):
        spec = json.loads((run / "run.json").read_text())
        base = gs.record(gs.BASELINE, run).configs[gs.PLAIN]
        models = json.loads((run / "metrics" / "models.json").read_text())
        entry = {"gpu": spec["gpu"]["name"], "vllm": spec["software"]["vllm"], "variants": {},
                 "params": {role: models[role]["params"] for role in ("target", "draft")}}
        gates = dict(re.findall(r"^\d+ gate (\S+): (PASS|FAIL)", (run / log).read_text(), re.M))
        for variant in variants:
            rec = gs.record(variant, run)
            plain = rec.configs[gs.PLAIN]
            conc = gs.concurrencies(rec)
            entry["variants"][variant] = {
                "vs_bf16_plain": {f"c{c}": plain.at(c).output_throughput / base.at(c).output_throughput for c in conc},
                "methods": {name: {"k": cfg.num_speculative_tokens,
                                   "vs_plain": {f"c{c}": cfg.at(c).output_throughput / plain.at(c).output_throughput
                                                for c in conc}}
                            for name, cfg in rec.configs.items() if name != gs.PLAIN},
                "gate": gates.get(variant)}
        out[run.name] = entry
    return out


def quantize_summary() -> dict:
    return _load(HERE / "quantize_bench.py").quantize_summary()


if __name__ == "__main__":
    print(json.dumps({"gpu": served_summary(), "quantize": quantize_summary()}, indent=2))
