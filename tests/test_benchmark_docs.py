"""The benchmark markdown is a rendering of committed raw output, and every raw file has a named producer.

Fast (no GPU, vLLM, torch or pipeline import): the renderers read only the JSON/text under benchmarks/**/raw/.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
# Tables "| raw file | producing command | ... |" whose first cell names raw files (globs from the repo root).
PRODUCER_TABLES = [BENCH / "README.md", BENCH / "gpu" / "README.md"]


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_results_is_rendered_from_raw():
    make_results = load_module(BENCH / "gpu" / "make_results.py")
    assert make_results.render() == (BENCH / "gpu" / "RESULTS.md").read_text(), \
        "RESULTS.md differs from its rendering: run python benchmarks/gpu/make_results.py"


def test_quantize_markdown_is_rendered_from_raw():
    bench = load_module(BENCH / "quantize_bench.py")
    for raw_name, (md_name, renderer) in bench.RENDERERS.items():
        raw, md = bench.RAW / raw_name, BENCH / md_name
        if not raw.exists():
            assert not md.exists(), f"{md_name} has numbers but no raw output ({raw_name})"
            continue
        assert renderer(json.loads(raw.read_text())) == md.read_text(), \
            f"{md_name} differs from its rendering: run python benchmarks/quantize_bench.py --render"


def test_calibration_markdown_is_rendered_from_raw():
    sweep = load_module(BENCH / "calibration_sweep.py")
    assert sweep.render_all() == sweep.MARKDOWN.read_text(), \
        "calibration.md differs from its rendering: run python benchmarks/calibration_sweep.py --render"


def test_smollm2_markdown_is_rendered_from_raw():
    report = load_module(BENCH / "cpu" / "smollm2_report.py")
    assert report.render() == report.MARKDOWN.read_text(), \
        "SMOLLM2.md differs from its rendering: run python benchmarks/cpu/smollm2_report.py --write"


def test_smollm2_gpu_markdown_is_rendered_from_raw():
    report = load_module(BENCH / "gpu" / "smollm2_report.py")
    assert report.render() == report.OUT.read_text(), \
        "SMOLLM2-GPU.md differs from its rendering: run python benchmarks/gpu/smollm2_report.py"


def test_bench_worker_markdown_is_rendered_from_raw():
    report = load_module(BENCH / "cpu" / "bench_worker_cost.py")
    assert report.render() == report.MARKDOWN.read_text(), \
        "BENCH-WORKER.md differs from its rendering: run python benchmarks/cpu/bench_worker_cost.py --render"


def test_every_raw_file_has_a_producer():
    patterns = [p for table in PRODUCER_TABLES for line in table.read_text().splitlines()
                if line.startswith("| `benchmarks/") for p in re.findall(r"`([^`]+)`", line.split("|")[1])]
    covered = set()
    for pattern in patterns:
        matched = {p for p in ROOT.glob(pattern) if p.is_file()}
        assert matched, f"producer table names {pattern}, which matches no file"
        covered |= matched
    raw_files = {f for d in BENCH.rglob("raw") if d.is_dir() for f in d.rglob("*") if f.is_file()}
    orphans = sorted(str(f.relative_to(ROOT)) for f in raw_files - covered)
    assert not orphans, f"raw files with no producer in {[str(t.relative_to(ROOT)) for t in PRODUCER_TABLES]}: {orphans}"


def test_summaries_for_the_readme_are_plain_values():
    summary = load_module(BENCH / "summary.py")
    values = {"gpu": summary.gpu_summary(), "quantize": summary.quantize_summary()}
    text = json.dumps(values, allow_nan=False)  # a NaN or an infinity in a README number raises here

    def plain(x):  # a (lo, hi) range is a pair either way
        return [plain(v) for v in x] if isinstance(x, (list, tuple)) else (
            {k: plain(v) for k, v in x.items()} if isinstance(x, dict) else x)

    assert json.loads(text) == plain(values)  # a dataclass, a Path or a numpy scalar would not come back equal
    assert values["gpu"] and values["quantize"]


def test_readme_measured_section_is_rendered_from_raw():
    """The top-level README's numbers: benchmarks/readme_measured.py over committed raw files and metrics/."""
    readme = load_module(BENCH / "readme_measured.py")
    assert readme.current() == readme.render(), "README's Measured section differs: python benchmarks/readme_measured.py --write"
