"""One-off: write run.json (benchmarks/run_spec.py) into the raw run folders measured before runs wrote their own.

The commands and commits are the producer table's in benchmarks/gpu/README.md and the profiles the ones those
commands applied, transcribed below; the GPU, the versions and the date are read from what each run recorded
(gpu.txt, versions*.txt, the serve_bench records, shipped.json, the header of the earlier RESULTS.md, now
history/vllm-0.25.md), and a value no file records is left null. `sources` in each spec says where each value came from.

    python benchmarks/gpu/backfill_run_specs.py           # (re)writes the specs
    python benchmarks/gpu/backfill_run_specs.py --check   # exit 1 if a committed spec differs
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_spec import NAME, Gpu, RunSpec  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
TABLE = "benchmarks/gpu/README.md producer table"
# The first runs (through gpu-schemes and handoff) were on vLLM 0.25.0 and torch 2.11.0+cu130 on one H100 (driver
# 580.159.04): the header RESULTS.md carried before the run specs, for the runs whose own files do not record them.
SESSION_HEADER = (
    "benchmarks/gpu/header.md at 128d962 (H100 80GB HBM3, driver 580.159.04, vLLM 0.25.0, torch 2.11.0+cu130)"
)
GP = "bash benchmarks/gpu/session.sh gpu-profile OUT"

# folder -> (commands, commit, profile); transcribed from the producer table
RUNS: dict[str, tuple[list[str], str | None, str | None]] = {
    "llama3-8b": (
        [
            "python benchmarks/gpu/run_gpu.py make8b DIR TOKENIZER",
            "python benchmarks/gpu/run_gpu.py quant8b DIR OUT CALIB V...",
            "python benchmarks/gpu/run_gpu.py bench8b DIR OUT M...",
        ],
        "c6ed31c (run_gpu.py of 221c5bd)",
        None,
    ),
    "demo-bundles": (["bash benchmarks/gpu/session.sh demo OUT"], "37012b3", None),
    "evaluate-stage": (
        [
            "bash benchmarks/gpu/session.sh evaluate OUT V...",
            "bash benchmarks/gpu/session.sh cpu-raw (CPU, after dvc repro: cpu-eval-*, cpu-estimate-*, at 9e7fb74)",
            "bash benchmarks/gpu/session.sh gate-raw (CPU: gate-on-gpu-metrics.txt, at a4e48b6)",
        ],
        "b0ed85a",
        None,
    ),
    "gpu-tests": (
        [
            "bash benchmarks/gpu/session.sh test",
            "PYTHONPATH=/tmp/lsite:/tmp/vllm/site:/tmp/qsite VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 "
            "python -m pytest -q -s -p no:cacheprovider tests/project/test_gpu.py",
        ],
        "d95a76d",
        None,
    ),
    "before-eos-fix": (["bash benchmarks/gpu/session.sh evaluate OUT V..."], "37012b3", None),
    "after-graph-refactor": (
        ["bash benchmarks/gpu/session.sh evaluate OUT V... (one call per variant)"],
        "ff4d3ac",
        None,
    ),
    "gpu-profile": (
        [
            f"{GP} 560",
            "bash benchmarks/gpu/session.sh gpu-watch OUT S",
            "bash benchmarks/gpu/session.sh gate-profile (CPU: gate.txt, at 92538c7)",
        ],
        "9db6617",
        "profiles/gpu.yaml",
    ),
    "gpu-methods": (
        [f"{GP} 570 gpu-methods", "bash benchmarks/gpu/session.sh gpu-watch OUT S"],
        "d8ac234",
        "profiles/gpu.yaml + profiles/gpu-methods.yaml",
    ),
    "gpu-eagle3-variants": (
        [f"{GP} 480 gpu-eagle3-variants", "bash benchmarks/gpu/session.sh gpu-watch OUT S"],
        "6c813e2",
        "profiles/gpu.yaml + profiles/gpu-eagle3-variants.yaml",
    ),
    "gpu-schemes": (
        [f"{GP} 480 gpu-schemes", "bash benchmarks/gpu/session.sh gpu-watch OUT S"],
        "7a2c9cb",
        "profiles/gpu.yaml + profiles/gpu-schemes.yaml",
    ),
    "gpu-schemes-served": (
        [
            f"{GP} 540 gpu-schemes-served",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 570",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 530",
        ],
        "4672aef",
        "profiles/gpu.yaml + profiles/gpu-schemes-served.yaml",
    ),
    "gpu-tp1": (
        [
            f"{GP} 560 gpu-tp1",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 570",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 440",
        ],
        "f7bbd8c",
        "profiles/gpu.yaml + profiles/gpu-tp1.yaml",
    ),
    "gpu-tiers": (
        [f"{GP} 500 gpu-tiers", "bash benchmarks/gpu/session.sh gpu-watch OUT S"],
        "df26827",
        "profiles/gpu.yaml + profiles/gpu-tiers.yaml",
    ),
    "calibration": (
        ["bash benchmarks/gpu/session.sh gpu-calib OUT 540", "bash benchmarks/gpu/session.sh gpu-watch OUT 420"],
        "30b2f3e",
        "profiles/gpu.yaml + profiles/gpu-calibration.yaml",
    ),
    "schemes8b": (
        [
            "bash benchmarks/gpu/session.sh schemes8b OUT int8-w8a8 fp8-block nvfp4a16",
            "bash benchmarks/gpu/session.sh bench8b OUT bf16 int8-w8a8",
            "bash benchmarks/gpu/session.sh bench8b OUT fp8-block nvfp4a16",
            "VLLM_DISABLED_KERNELS=DeepGemmFp8BlockScaledMMKernel bash benchmarks/gpu/session.sh bench8b OUT "
            "fp8-block-no-deepgemm",
        ],
        "92e0a1f",
        None,
    ),
    "handoff": (
        [
            "bash benchmarks/gpu/session.sh handoff OUT artifacts/bundles/bf16",
            "python benchmarks/gpu/handoff_check.py benchmarks/gpu/raw/handoff (CPU)",
        ],
        "f2d3c54",
        None,
    ),
    "demo-serve": (
        [
            "bash benchmarks/gpu/session.sh demo-serve OUT gptq-w4a16 bf16 awq-w4a16 fp8-dynamic",
            "bash benchmarks/gpu/session.sh demo-serve-watch OUT S",
        ],
        "0bb4490",
        "profiles/gpu-demo-serve.yaml",
    ),
    "demo-serve-bf16": (
        [
            'SB_CONCURRENCY="1 8 32" SB_PARAMS=\'{serve_bench: {k_schedule: "off", capacity: '
            "{max_probes: 3}}}' bash benchmarks/gpu/session.sh demo-serve OUT bf16",
            "bash benchmarks/gpu/session.sh demo-serve-watch OUT S",
            "modelprep gate --metrics-dir benchmarks/gpu/raw/demo-serve-bf16/metrics --params "
            "benchmarks/gpu/raw/demo-serve-bf16/params.yaml --variant bf16 (CPU: gate.txt, at 4c536fc)",
        ],
        "b4ba3cf",
        "profiles/gpu-demo-serve.yaml + SB_CONCURRENCY and SB_PARAMS",
    ),
    "shipped": (
        [
            "bash benchmarks/gpu/session.sh shipped OUT S artifacts/bundles/{bf16,gptq-w4a16,awq-w4a16,"
            "fp8-dynamic,fp8-static}",
            "bash benchmarks/gpu/session.sh shipped-watch OUT S",
        ],
        "c799f4e",
        None,
    ),
    "costs/lease-1": (
        ["bash benchmarks/gpu/session.sh costs OUT 300", "bash benchmarks/gpu/session.sh costs-watch OUT S"],
        "c40a95e, modified (see the producer table)",
        None,
    ),
    "costs/lease-2": (
        [
            "bash benchmarks/gpu/session.sh costs OUT 60 demo:eagle3 served:eagle3 llama3-8b:draft_model",
            "bash benchmarks/gpu/session.sh costs-watch OUT S",
        ],
        "80ded45",
        None,
    ),
    "costs/lease-3": (
        [
            "bash benchmarks/gpu/session.sh costs OUT 420 smollm2-135m:eagle3 smollm2-135m:draft_model "
            "smollm2-135m:ngram",
            "bash benchmarks/gpu/session.sh costs-watch OUT 420",
        ],
        "b046465",
        None,
    ),
    "costs/versions": (
        [
            "DCV_ITEMS=gpu-profile-1b:draft_model bash benchmarks/gpu/session.sh draft-cost-versions OUT 500",
            "bash benchmarks/gpu/session.sh costs-watch OUT 540",
        ],
        "b046465",
        None,
    ),
    "smollm2-gpu": (
        [
            *(f"CHUNK_DIR=s bash benchmarks/gpu/session.sh chunk {n}" for n in range(7)),
            "bash benchmarks/gpu/session.sh unload",
            "bash benchmarks/gpu/session.sh install",
            f"GP_BASE=smollm2 GP_REPRO='...' {GP} 420 gpu-smollm2 (its dvc repro failed at once: "
            "serve_bench.k_schedule read as false)",
            'GP_BASE=smollm2 GP_REPRO=\'sed -i "s/^  k_schedule: off/  k_schedule: \\"off\\"/" '
            "params.yaml; ...; python3 -m dvc repro serve_bench@bf16; python3 -m dvc repro "
            "evaluate@gptq-w4a16 evaluate@fp8-dynamic evaluate@fp8-static evaluate@awq-w4a16; python3 "
            f"-m dvc repro serve_bench@gptq-w4a16; python3 -m dvc repro' {GP} 500 gpu-smollm2",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 530",
            "bash benchmarks/gpu/session.sh gpu-watch OUT 430",
            "modelprep gate --metrics-dir benchmarks/gpu/raw/smollm2-gpu/metrics --params "
            "benchmarks/gpu/raw/smollm2-gpu/params.yaml --variant bf16 (CPU: gate.txt, at dfe0a7f)",
        ],
        "dfe0a7f",
        "profiles/smollm2.yaml + profiles/gpu-smollm2.yaml",
    ),
}
SESSION_RUNS = {
    "llama3-8b",
    "demo-bundles",
    "evaluate-stage",
    "gpu-tests",
    "before-eos-fix",
    "after-graph-refactor",
    "gpu-profile",
    "gpu-methods",
    "gpu-eagle3-variants",
    "gpu-schemes",
    "handoff",
}


def first(folder: Path, pattern: str) -> Path | None:
    return next(iter(sorted(folder.glob(pattern))), None)


def gpu_of(folder: Path) -> tuple[Gpu, str | None]:
    path = first(folder, "gpu.txt") or first(folder, "*/gpu.txt")
    return (Gpu.parse_smi(path.read_text()), str(path.relative_to(folder))) if path else (Gpu(), None)


def software_of(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Versions a file in the run records: versions*.txt ("vllm X torch Y"), shipped.json, serve_bench records."""
    found, sources = {}, {}
    for path in sorted(folder.glob("**/versions*.txt")):
        pairs = dict(zip(*[iter(path.read_text().split())] * 2))
        for pkg in ("vllm", "torch"):
            if pkg in pairs:
                prev = found.get(pkg)
                found[pkg] = pairs[pkg] if prev in (None, pairs[pkg]) else f"{prev}, {pairs[pkg]}"
                sources[f"software.{pkg}"] = ", ".join(
                    sorted({*sources.get(f"software.{pkg}", "").split(", "), str(path.relative_to(folder))} - {""})
                )
    for path in sorted(folder.glob("**/*.json")):
        if "vllm" in found:
            break
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(doc, dict):
            continue
        version = doc.get("vllm_version") or (doc.get("vllm") if isinstance(doc.get("vllm"), str) else None)
        if isinstance(version, str) and re.fullmatch(r"\d+\.\d+\.\d+\S*", version):
            found["vllm"], sources["software.vllm"] = version, str(path.relative_to(folder))
            if isinstance(doc.get("torch"), str):
                found["torch"], sources["software.torch"] = doc["torch"], str(path.relative_to(folder))
    if "vllm" not in found:  # a run whose stage record was never written: the vLLM servers' start banner
        for path in sorted(folder.glob("logs/*-server.log")):
            m = re.search(r"version (\d+\.\d+\.\d+\S*)", path.read_text())
            if m:
                found["vllm"], sources["software.vllm"] = m.group(1), str(path.relative_to(folder))
                break
    return found, sources


def date_of(folder: Path) -> tuple[str | None, str]:
    for path in sorted(folder.glob("**/*.json")):
        if path.name == NAME:  # the spec this writes is not a record of the run
            continue
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("date"), str) and re.fullmatch(r"\d{4}-\d\d-\d\d", doc["date"]):
            return doc["date"], str(path.relative_to(folder))
    # `vllm bench serve`'s results stamp their date as YYYYMMDD-HHMMSS: the first run's day
    stamps = sorted(
        (doc["date"], path)
        for path in folder.glob("**/raw/*.json.gz")
        for doc in [json.loads(gzip.decompress(path.read_bytes()))]
        if isinstance(doc, dict) and re.fullmatch(r"\d{8}-\d{6}", str(doc.get("date")))
    )
    if stamps:
        day, path = stamps[0]
        return f"{day[:4]}-{day[4:6]}-{day[6:8]}", str(path.relative_to(folder))
    # no file records it: the day the raw files were first committed (runs were committed the day they ran),
    # followed through renames
    first_file = next(p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != NAME)
    day = subprocess.run(
        ["git", "log", "--follow", "--diff-filter=A", "--format=%cs", "--", str(first_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split()
    return (day[-1], "git: the day the folder's first files were committed") if day else (None, "not recorded")


def spec_for(name: str) -> RunSpec:
    folder = RAW / name
    commands, commit, profile = RUNS[name]
    gpu, gpu_source = gpu_of(folder)
    if gpu.name is None and name in SESSION_RUNS:
        gpu, gpu_source = Gpu(name="NVIDIA H100 80GB HBM3", count=1, driver="580.159.04"), SESSION_HEADER
    software, sources = software_of(folder)
    if "vllm" not in software and name in SESSION_RUNS:
        software = {"vllm": "0.25.0", "torch": "2.11.0+cu130"}
        sources = {"software.vllm": SESSION_HEADER, "software.torch": SESSION_HEADER}
    date, date_source = date_of(folder)
    sources = {
        "commands": TABLE,
        "commit": TABLE,
        "gpu": gpu_source or "not recorded",
        **sources,
        "date": date_source,
        **({"profile": TABLE} if profile else {}),
    }
    return RunSpec(
        run=name,
        commands=tuple(commands),
        date=date,
        commit=commit,
        gpu=gpu,
        software=software,
        profile=profile,
        sources=sources,
    )


def main() -> int:
    check = "--check" in sys.argv[1:]
    differ = []
    for name in RUNS:
        text, path = spec_for(name).to_json(), RAW / name / NAME
        if check:
            if not path.is_file() or path.read_text() != text:
                differ.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if differ:
        print("run specs differ from backfill_run_specs.py: " + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
