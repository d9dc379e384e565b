"""The benchmark markdown is a rendering of committed raw output, and every raw file has a named producer.

Fast (no GPU, vLLM, torch or pipeline import): the renderers read only the JSON/text under benchmarks/**/raw/.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# Tables "| raw file | producing command | ... |" whose first cell names raw files (globs from the repo root).
PRODUCER_TABLES = [BENCH / "README.md", BENCH / "gpu" / "README.md"]


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_report_is_its_rendering():
    """Each markdown that names table definitions (benchmarks/render.py) has exactly the blocks they render from the
    raw run folders; a missing or an extra block fails the rendering itself."""
    render = load_module(BENCH / "render.py")
    found = render.reports()
    # the GPU pages, one per topic, are found by their header line
    assert {p.name for p in found} >= set(GPU_PAGES)
    for md in found:
        assert render.render(md) == md.read_text(), (
            f"{md.relative_to(ROOT)} differs from its rendering: run python benchmarks/render.py"
        )


GPU_PAGES = ("QUALITY.md", "SERVING.md", "CAPACITY.md", "COSTS.md", "SCALE.md")


def test_the_render_check_command_passes_on_the_committed_pages():
    """`python benchmarks/render.py --check`, the committed command that regenerates every page from committed raw
    and diffs: it exits 0, so no page has drifted from its raw files."""
    r = subprocess.run(
        [sys.executable, "benchmarks/render.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr


def test_gpu_pages_are_by_topic_and_their_prose_tells_no_lease_history():
    """benchmarks/gpu/ holds one page per topic, each rendered from a page spec; the prose around the blocks does not
    narrate GPU leases or sessions (that history is in the run specs and the producer table)."""
    render = load_module(BENCH / "render.py")
    pages = sorted(p.name for p in (BENCH / "gpu").glob("*.md") if p.name != "README.md")
    assert pages == sorted(GPU_PAGES)
    for name in pages:
        text = (BENCH / "gpu" / name).read_text()
        assert render.HEADER.search(text), f"{name} names no page spec"
        prose = render.BLOCK.sub("", text)
        told = re.findall(r"[^.]*\b(?:lease|session)s?\b(?![-/.])[^.]*", prose, re.I)
        assert not told, f"{name} tells lease or session history: {told}"


def test_a_declarative_spec_renders_fields_named_functions_and_an_empty_row(tmp_path):
    """A page spec's Spec: columns by field name (dict key or attribute) or small function, None as "-", formats,
    the `empty` row when the raw files hold none; Facts: quantity/value pairs."""
    render = load_module(BENCH / "render.py")
    C = render.Column
    rows = [{"config": "plain", "tok": 402.04, "k": None}, {"config": "eagle3", "tok": 671.5, "k": 2}]
    spec = render.Spec(
        lambda: rows,
        (
            C("config", "config"),
            C("k", "k"),
            C("tok/s", "tok", "{:,.0f}"),
            C("x plain", lambda r: r["tok"] / rows[0]["tok"], "x{:.2f}"),
        ),
    )
    assert spec().markdown() == (
        "| config | k | tok/s | x plain |\n| --- | --- | --- | --- |\n"
        "| plain | - | 402 | x1.00 |\n| eagle3 | 2 | 672 | x1.67 |"
    )
    empty = render.Spec(lambda: [], (C("method", "method"), C("miss", "miss")), empty=("none", "-"))
    assert empty().rows == (("none", "-"),)
    assert render.Spec(lambda: [], (C("method", "method"),))().rows == ()
    assert render.Facts(lambda: [("GPU", "H100"), ("probes", None)])().rows == (("GPU", "H100"), ("probes", "-"))


def test_render_fills_blocks_between_markers_and_keeps_the_prose(tmp_path):
    render = load_module(BENCH / "render.py")
    (tmp_path / "defs.py").write_text(
        "import json, pathlib\n"
        "from render import Table, Column, table\n"
        f"RAW = pathlib.Path({str(tmp_path)!r})\n"
        "rows = json.loads((RAW / 'raw.json').read_text())\n"
        "BLOCKS = {'speed': lambda: table(rows, [Column('config', lambda r: r['name']),\n"
        "                                       Column('tok/s', lambda r: r.get('tps'), '{:.1f}')])}\n"
    )
    (tmp_path / "raw.json").write_text(json.dumps([{"name": "plain", "tps": 402.04}, {"name": "k|v"}]))
    md = tmp_path / "R.md"
    md.write_text(
        f"# R\n\n<!-- tables: {tmp_path / 'defs.py'} -->\n\nHand-written.\n\n"
        "<!-- begin speed -->\nstale\n<!-- end speed -->\n\nAfter.\n"
    )
    assert render.render(md) == (
        f"# R\n\n<!-- tables: {tmp_path / 'defs.py'} -->\n\nHand-written.\n\n"
        "<!-- begin speed -->\n| config | tok/s |\n| --- | --- |\n| plain | 402.0 |\n"
        "| k\\|v | - |\n<!-- end speed -->\n\nAfter.\n"
    )
    assert render.as_data(md) == {"speed": {"columns": ["config", "tok/s"], "rows": [["plain", "402.0"], ["k|v", "-"]]}}
    assert render.main(["--check", str(md)]) == 1 and md.read_text().count("stale") == 1  # --check writes nothing
    assert render.main([str(md)]) == 0 and render.main(["--check", str(md)]) == 0

    md.write_text(
        f"<!-- tables: {tmp_path / 'defs.py'} -->\n<!-- begin speed -->\n<!-- end speed -->\n"
        "<!-- begin latency -->\n<!-- end latency -->\n"
    )
    with pytest.raises(SystemExit, match=r"blocks \['latency'\] have no definition"):
        render.render(md)
    md.write_text(f"<!-- tables: {tmp_path / 'defs.py'} -->\nno blocks\n")
    with pytest.raises(SystemExit, match=r"definitions \['speed'\] .* have no block"):
        render.render(md)
    md.write_text(f"<!-- tables: {tmp_path / 'defs.py'} -->\n<!-- begin speed -->\nno end\n")
    with pytest.raises(SystemExit, match="unmatched markers"):
        render.render(md)


def test_scale_tables_take_the_4_gpu_host_run():
    """raw/scale-host (scale_host.sh): its GPTQ steps on 1, 2 and 4 GPUs sit beside tpeval's with llm-compressor's
    per-module errors counted from run.log (224 modules per 8B run, every rank's), the 70B-wide 2-layer model's
    median per layer times 80 as an extrapolation, and FP8 at TP 4 served with levels, so no longer listed as unrun
    without saying where it ran."""
    load_module(BENCH / "render.py")  # puts benchmarks/ on the path for the page specs
    tpeval = load_module(BENCH / "tables" / "tpeval.py")
    scale = load_module(BENCH / "tables" / "scale.py")
    rows = {(r["run"], r["step"]): r for r in tpeval.quant_rows()}
    assert {r["gpus"] for (run, step), r in rows.items() if run == "scale-host" and "-8b-" in step} == {1, 2, 4}
    for key in (("scale-host", f"quant-8b-{n}gpu") for n in (1, 2, 4)):
        assert rows[key]["modules"] == 224 and rows[key]["done"] == "yes"
    assert rows[("scale-host", "quant-8b-1gpu")]["error_vs_1gpu"] is None  # the reference itself
    assert abs(rows[("scale-host", "quant-8b-4gpu")]["error_vs_1gpu"]) < 0.1
    for n in ("1gpu-offload", "4gpu"):
        r = rows[("scale-host", f"quant-70b2-{n}")]
        assert r["layers"] == 1 and r["extrapolated_s"] == r["median"] * 80
    assert rows[("scale-host", "quant-8b-1gpu")]["extrapolated_s"] is None
    fp8 = next(r for r in scale.configs() if r["run"] == "scale-host")
    assert fp8["name"] == "fp8-dynamic-tp4" and all(fp8["levels"].values()) and fp8["beside"] == ""
    assert {r["vs"] for r in scale.per_gpu() if r["run"] == "scale-host"} == {None}  # no BF16 in that run
    unrun = next(r for r in scale.unrun() if r["name"] == "fp8-dynamic-tp4")
    assert unrun["run"] == "scale-70b" and "measured in `scale-host`" in unrun["why"]
    page = (BENCH / "gpu" / "SCALE.md").read_text() + (ROOT / "docs" / "scale.md").read_text()
    assert "has not run" not in page and "nothing on four GPUs" not in page


def test_run_specs_read_back_and_carry_what_the_run_recorded(tmp_path):
    spec = load_module(BENCH / "run_spec.py")
    written = spec.write(tmp_path / "my-run", ["bash benchmarks/gpu/session.sh demo-serve OUT bf16"], "profiles/x.yaml")
    assert spec.load(tmp_path / "my-run") == written and written.run == "my-run"
    assert written.software["python"] and written.date
    (tmp_path / "my-run" / "run.json").write_text(json.dumps({"run": "x", "commands": ["c"], "gpus": 1}))
    with pytest.raises(SystemExit, match=r"unknown: \['gpus'\]"):
        spec.load(tmp_path / "my-run")
    # a backfilled spec's GPU is the one the run's own gpu.txt recorded
    for folder in ("demo-serve", "costs/lease-1", "shipped"):
        run = spec.load(BENCH / "gpu" / "raw" / folder)
        assert run.gpu == spec.Gpu.parse_smi((BENCH / "gpu" / "raw" / folder / "gpu.txt").read_text())
        assert run.commands and run.sources["gpu"] == "gpu.txt"


def test_every_gpu_run_folder_has_a_run_spec():
    """Each run folder under benchmarks/gpu/raw/ says how it was made (run.json); costs/ groups runs (lease-*,
    versions) and the CPU inputs they share."""
    spec = load_module(BENCH / "run_spec.py")
    raw = BENCH / "gpu" / "raw"
    folders = [p for p in raw.iterdir() if p.is_dir() and p.name != "costs"]
    folders += [p for p in (raw / "costs").iterdir() if p.is_dir() and p.name not in ("cpu-estimate", "shapes")]
    for gpu_txt in raw.rglob("gpu.txt"):  # every GPU measurement lies in one of them
        assert any(f in gpu_txt.parents for f in folders), gpu_txt
    for folder in folders:
        run = spec.load(folder)  # exits naming the file if it is missing or malformed
        assert run.commands and run.gpu.name, folder


def test_quantize_markdown_is_rendered_from_raw():
    bench = load_module(BENCH / "quantize_bench.py")
    for raw_name, (md_name, renderer) in bench.RENDERERS.items():
        raw, md = bench.RAW / raw_name, BENCH / md_name
        if not raw.exists():
            assert not md.exists(), f"{md_name} has numbers but no raw output ({raw_name})"
            continue
        assert renderer(json.loads(raw.read_text())) == md.read_text(), (
            f"{md_name} differs from its rendering: run python benchmarks/quantize_bench.py --render"
        )


def test_quantize_sizes_are_megabytes_as_labelled():
    """Issue #49: sizes said MB for MiB (quantize.md and the README: a 10.4M-parameter BF16 target at "19.8 MB", which
    is 20.8 MB). A BF16 checkpoint holds 2 bytes a parameter and a small header: its MB are just above 2 x parameters
    / 10^6, whatever code version recorded the raw file."""
    bench = load_module(BENCH / "quantize_bench.py")
    raw = json.loads((BENCH / "raw/quantize.json").read_text())
    bf16 = 2 * raw["parameters"] / 1e6
    for variant, row in bench.quantize_summary(raw)["variants"].items():
        assert bf16 <= row["size_before_mb"] <= bf16 * 1.005, (variant, row["size_before_mb"], bf16)
    smollm2 = json.loads((BENCH / "raw/quantize-smollm2.json").read_text())
    for run in smollm2["runs"]:
        assert 2 * smollm2["parameters"] / 1e6 <= run["size_before_mb"] <= 2 * smollm2["parameters"] / 1e6 * 1.005


def test_calibration_markdown_is_rendered_from_raw():
    sweep = load_module(BENCH / "calibration_sweep.py")
    assert sweep.render_all() == sweep.MARKDOWN.read_text(), (
        "calibration.md differs from its rendering: run python benchmarks/calibration_sweep.py --render"
    )


def test_smollm2_markdown_is_rendered_from_raw():
    report = load_module(BENCH / "cpu" / "smollm2_report.py")
    assert report.render() == report.MARKDOWN.read_text(), (
        "SMOLLM2.md differs from its rendering: run python benchmarks/cpu/smollm2_report.py --write"
    )


def test_bench_worker_markdown_is_rendered_from_raw():
    report = load_module(BENCH / "cpu" / "bench_worker_cost.py")
    assert report.render() == report.MARKDOWN.read_text(), (
        "BENCH-WORKER.md differs from its rendering: run python benchmarks/cpu/bench_worker_cost.py --render"
    )


def test_every_raw_file_has_a_producer():
    patterns = [
        p
        for table in PRODUCER_TABLES
        for line in table.read_text().splitlines()
        if line.startswith("| `benchmarks/")
        for p in re.findall(r"`([^`]+)`", line.split("|")[1])
    ]
    covered = set()
    for pattern in patterns:
        matched = {p for p in ROOT.glob(pattern) if p.is_file()}
        assert matched, f"producer table names {pattern}, which matches no file"
        covered |= matched
    raw_files = {f for d in BENCH.rglob("raw") if d.is_dir() for f in d.rglob("*") if f.is_file()}
    orphans = sorted(str(f.relative_to(ROOT)) for f in raw_files - covered)
    assert not orphans, (
        f"raw files with no producer in {[str(t.relative_to(ROOT)) for t in PRODUCER_TABLES]}: {orphans}"
    )


def test_summaries_for_the_readme_are_plain_values():
    summary = load_module(BENCH / "summary.py")
    values = {"gpu": summary.served_summary(), "quantize": summary.quantize_summary()}
    text = json.dumps(values, allow_nan=False)  # a NaN or an infinity in a README number raises here

    def plain(x):  # a (lo, hi) range is a pair either way
        return (
            [plain(v) for v in x]
            if isinstance(x, (list, tuple))
            else ({k: plain(v) for k, v in x.items()} if isinstance(x, dict) else x)
        )

    assert json.loads(text) == plain(values)  # a dataclass, a Path or a numpy scalar would not come back equal
    assert values["gpu"] and values["quantize"]


def test_readme_measured_section_is_rendered_from_raw():
    """The top-level README's numbers: benchmarks/readme_measured.py over committed raw files, the committed build's
    metrics among them (benchmarks/cpu/raw/demo-metrics/), never the workspace's metrics/, which the user's own
    `dvc repro` rewrites."""
    readme = load_module(BENCH / "readme_measured.py")
    assert readme.current() == readme.render(), (
        "README's Measured section differs: python benchmarks/readme_measured.py --write"
    )


def test_the_readmes_metrics_are_those_of_the_committed_lock():
    """benchmarks/cpu/raw/demo-metrics/ (what the README quotes) is the build dvc.lock records: each file's md5 and size
    as the lock has them for metrics/<file>, and every metric the lock records is there."""
    import hashlib
    import subprocess

    import yaml

    def committed(path: str) -> bytes:  # the lock's build as committed (README command 1 rewrites the workspace's)
        return subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, check=True).stdout

    lock = yaml.safe_load(committed("dvc.lock"))
    outs = [
        out for stage in lock["stages"].values() for out in stage.get("outs", []) if out["path"].startswith("metrics/")
    ]
    recorded = {
        out["path"].removeprefix("metrics/"): (out["md5"], out["size"])
        for out in outs
        if not out["md5"].endswith(".dir")
    }
    folders = [out["path"].removeprefix("metrics/") for out in outs if out["md5"].endswith(".dir")]
    kept_root = BENCH / "cpu/raw/demo-metrics"
    kept = {p.name: (hashlib.md5(p.read_bytes()).hexdigest(), p.stat().st_size) for p in kept_root.glob("*.json")}
    for folder in folders:  # a folder output (the headline metrics): each file as the committed build wrote it
        names = subprocess.run(
            ["git", "ls-tree", "--name-only", f"HEAD:metrics/{folder}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(p.name for p in (kept_root / folder).iterdir()) == sorted(names), folder
        for name in names:
            assert (kept_root / folder / name).read_bytes() == committed(f"metrics/{folder}/{name}"), name
    assert kept == recorded, (
        "benchmarks/cpu/raw/demo-metrics differs from dvc.lock: benchmarks/cpu/demo_build.sh --lock"
    )
