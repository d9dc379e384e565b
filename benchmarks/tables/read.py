"""Readers of the committed run folders under benchmarks/gpu/raw/ (and the cost profiles), shared by every page.

Each returns the raw file's content as written or as the pipeline's own typed record; nothing here formats.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from pipeline.core import records  # noqa: E402
from pipeline.core.sizes import mib_record_as_mb  # noqa: E402
from pipeline.evaluate import serving_costs  # noqa: E402
from pipeline.evaluate.summary import current_names  # noqa: E402  (the runs' older metric names)
from pipeline.serving.bench_record import PLAIN, ServeBenchRecord  # noqa: E402
from pipeline.serving.load_generator import parse_result  # noqa: E402

RAW = ROOT / "benchmarks/gpu/raw"
BASELINE = "bf16"
__all__ = ["PLAIN", "ServeBenchRecord", "serving_costs"]
# Runs recorded by code before pipeline/core/sizes.py RECORDED_IN_MIB_UNTIL, whose `*_mb` sizes and peak memory are
# MiB: read back in MB (a BF16 Llama-3-8B is 16060 MB, not "15317 MB").
RECORDED_IN_MIB = {
    "after-graph-refactor",
    "before-eos-fix",
    "calibration",
    "demo-bundles",
    "demo-serve",
    "evaluate-stage",
    "gpu-eagle3-variants",
    "gpu-methods",
    "gpu-profile",
    "gpu-schemes-served",
    "gpu-schemes",
    "gpu-tests",
    "gpu-tiers",
    "gpu-tp1",
    "handoff",
    "llama3-8b",
    "schemes8b",
}


def load(path: Path):
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def in_mb(folder: str, data):
    return mib_record_as_mb(data) if folder in RECORDED_IN_MIB and isinstance(data, dict) else data


def params(run: str, name: str = "params.yaml") -> dict:
    return yaml.safe_load((RAW / run / name).read_text())


def project_params() -> dict:
    """params.yaml of this checkout (serving.slo: the objective the scale run is judged against)."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def record_path(run: str, variant: str) -> Path:
    """A serve_bench record: serve/<variant>/record.json of a pipeline run, serve-<variant>.json or record.json of a
    stage run."""
    folder = RAW / run
    for path in (folder / "serve" / variant / "record.json", folder / f"serve-{variant}.json", folder / "record.json"):
        if path.is_file():
            return path
    raise SystemExit(f"{folder}: no serve_bench record of {variant}")


def record(run: str, variant: str) -> ServeBenchRecord:
    return records.read(ServeBenchRecord, record_path(run, variant))


def concurrencies(rec: ServeBenchRecord) -> list[int]:
    return sorted(lvl.concurrency for lvl in rec.configs[PLAIN].levels.values())


def evals(run: str) -> dict[str, dict]:
    """variant -> its evaluate metrics (current names), in quantize.enabled order, for the variants evaluated."""
    metrics = RAW / run / "metrics"
    return {
        v: current_names(load(metrics / f"eval-{v}.json"))
        for v in params(run)["quantize"]["enabled"]
        if (metrics / f"eval-{v}.json").is_file()
    }


def gate_sections(run: str) -> dict[str, str]:
    """gate.txt per variant: the command and its output (`modelprep gate --variant V`)."""
    out = {}
    for section in re.split(r"^(?=\$ )", (RAW / run / "gate.txt").read_text(), flags=re.M):
        m = re.search(r"--variant (\S+)", section)
        if m:
            out[m.group(1)] = section.rstrip()
    return out


def repro_gate_lines(run: str, log: str) -> str:
    """The gate, bundle and publish lines of a pipeline run's timestamped `dvc repro` log."""
    return "\n".join(
        re.sub(r"^\d+ ", "", line)
        for line in (RAW / run / log).read_text().splitlines()
        if re.match(r"\d+ (gate |error: gate|bundle |publish )", line)
    )


def shipped() -> dict:
    return load(RAW / "shipped" / "shipped.json")


def shipped_levels() -> dict[tuple[str, str], object]:
    """(variant, tag) -> LoadLevel of serve_shipped.py's `vllm bench serve` files (tag: c1, c16, capacity-cN)."""
    out = {}
    with tarfile.open(RAW / "shipped" / "raw.tgz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "raw" and member.name.endswith(".json"):
                tag = Path(parts[2]).stem.removeprefix("shipped-")
                out[(parts[0], tag)] = parse_result(json.load(io.TextIOWrapper(tar.extractfile(member))), member.name)
    return out


def profiles() -> list[serving_costs.CostProfile]:
    return serving_costs.available()


def profile(suffix: str) -> serving_costs.CostProfile:
    return next(p for p in profiles() if p.name.endswith(suffix))


def step_logs(folder: Path) -> dict[int, float]:
    """batch -> ms per engine step from the `RUN method k batch {json}` lines measure_costs.py prints: each batch's
    last long generation, wall time over engine steps (num_drafts; plain decoding: tokens)."""
    out = {}
    for line in folder.read_text(errors="replace").splitlines():
        if line.startswith("RUN "):
            _, _method, _k, batch, body = line.split(" ", 4)
            r, b = json.loads(body), int(batch)
            out[b] = 1000.0 * r["wall_s"] / ((r.get("num_drafts") or r["tokens"]) / b)
    return out
