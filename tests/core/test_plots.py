"""`dvc plots show` (real DVC): no chart drawn empty, every chart titled with labelled axes, and a page that needs no
network (vega inlined: pipeline/core/plots.py), checked by rendering each chart with vl-convert's own Vega."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.core import records
from pipeline.core.plots import VEGA_LITE, install_page, write_plot
from pipeline.params.load import parse_section
from pipeline.serving import capacity, sweep
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.settings import ServingParams
from tiny_project import ROOT, copy_project, run, tiny_params

# A real serve_bench record: BF16 on an H100 with vLLM 0.26.0, plain and three methods (benchmarks/gpu/SERVING.md).
SERVED = ROOT / "benchmarks/gpu/raw/gpu-served-3/metrics/serve-bf16.json"
SPEC = re.compile(r"var spec = (.*);\n\s*vegaEmbed")


def write_serve_plots(project, record: ServeBenchRecord) -> None:
    """What the serve_bench stage writes for a record (pipeline/serving/sweep.py write_plots)."""
    slo = parse_section(tiny_params(), ServingParams).slo
    why = f"serve_bench {record.variant}: {record.skipped or 'nothing measured'}"
    for directory, curve in sweep.PLOTS.items():
        write_plot(project / directory / record.variant, *sweep.plot_rows(record, *curve), why)
    write_plot(project / "plots/serve_pareto" / record.variant, *capacity.pareto_rows(record, slo), why)


SEARCHED = "gptq-w4a16"  # the variant drawn with a per-layer search's charts; the others hold the note


def write_search_plots(project, variant: str, searched: bool) -> None:
    """What stages/mixed.py writes: a search's sensitivity bars and frontier (three layers, the middle one fragile,
    one layout tried), or the uniform variant's notes."""
    from pipeline.quantize import mixed
    from pipeline.quantize.recipes import parse_variant

    spec = parse_variant(
        variant,
        {"algorithm": "rtn", "scheme": "W4A16", "group_size": 128, "mixed": {"schemes": ["W8A16", "UNQUANTIZED"]}},
    )
    units = tuple(mixed.Unit("model.layers", i, ("mlp.down_proj",), ((128, 256),)) for i in range(3))
    ladder = mixed.ladder_of(spec)
    sensitivity = {
        0: {"W4A16": 2e-3, "W8A16": 1e-5},
        1: {"W4A16": 9e-3, "W8A16": 3e-5},
        2: {"W4A16": 1e-3, "W8A16": 1e-5},
    }
    points = mixed.frontier(units, ladder, sensitivity, itemsize=2)
    tried = mixed.Attempt(1, points[1].bytes, {"kl_divergence": 3.5e-3}, ())
    found = mixed.Search(units, ladder, sensitivity, points, (tried,), 1, True)
    for directory, rows in (
        (mixed.SENSITIVITY_PLOT, mixed.sensitivity_rows(found)),
        (mixed.FRONTIER_PLOT, mixed.frontier_rows(found)),
    ):
        write_plot(
            project / directory / variant,
            rows if searched else [],
            list(rows[0]) if searched else [],
            f"{variant}: no per-layer search",
        )


def axis_titles(spec, channel: str) -> list:
    """The titles of every `channel` encoding in a spec (DVC's linear template has them in layers)."""
    if isinstance(spec, list):
        return [t for item in spec for t in axis_titles(item, channel)]
    if not isinstance(spec, dict):
        return []
    own = [spec["encoding"][channel].get("title")] if channel in spec.get("encoding", {}) else []
    return own + [t for key, value in spec.items() if key != "encoding" for t in axis_titles(value, channel)]


def git_commit(project) -> None:
    for cmd in (["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "build"]):
        assert run(cmd, project).returncode == 0


def test_a_chart_with_nothing_to_draw_is_a_valid_output_and_no_chart(tmp_path):
    """The mechanism on its own, in a two-stage DVC project: the skipped stage's plot directory holds only the note,
    DVC hashes it as an empty directory, a fresh clone is up to date, and only the measured chart is shown."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy2(ROOT / ".dvcignore", project / ".dvcignore")
    (project / "write.py").write_text(
        "import sys\nfrom pipeline.core.plots import write_plot\n"
        "rows = [{'x': 1, 'y': 2.0}, {'x': 2, 'y': 3.0}] if sys.argv[1] == 'measured' else []\n"
        "write_plot(f'plots/curve/{sys.argv[1]}', rows, ['x', 'y'], 'no CUDA device')\n"
    )
    (project / "dvc.yaml").write_text(
        "stages:\n  bench:\n    foreach: [measured, skipped]\n    do:\n      cmd: python write.py ${item}\n"
        "      deps: [write.py]\n      plots:\n      - plots/curve/${item}: {cache: false, x: x, y: y, title: "
        "'curve (${item})', x_label: load, y_label: latency}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (
        ["git", "init", "-q"],
        ["dvc", "init", "-q"],
        ["dvc", "config", "core.analytics", "false"],
        ["dvc", "repro"],
    ):
        r = run(cmd, project, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in (project / "plots/curve/skipped").iterdir()] == ["skipped.txt"]
    git_commit(project)
    clone = tmp_path / "clone"
    assert subprocess.run(["git", "clone", "-q", str(project), str(clone)]).returncode == 0
    r = run(["dvc", "status", "--json"], clone)
    assert r.returncode == 0 and json.loads(r.stdout) == {}, r.stdout + r.stderr  # the note-only output is there
    r = run(["dvc", "plots", "show", "--json"], clone)
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)["data"]) == ["plots/curve/measured/data.csv"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """`dvc plots show`'s page for the project's committed plots (the CPU demo build, serve_bench skipped) with a
    real GPU measurement of bf16 in place of its skipped serving charts."""
    project = copy_project(tmp_path_factory.mktemp("plots"))
    shutil.copytree(ROOT / "plots", project / "plots", ignore=shutil.ignore_patterns("serve_*"))
    served = records.read(ServeBenchRecord, SERVED)
    write_serve_plots(project, served)
    for variant in tiny_params()["quantize"]["enabled"]:
        if variant != served.variant:
            write_serve_plots(project, ServeBenchRecord(variant, skipped="no CUDA device"))
        write_search_plots(project, variant, searched=variant == SEARCHED)
    install_page(project)
    r = run(["dvc", "plots", "show"], project)
    assert r.returncode == 0, r.stderr
    return (project / "dvc_plots" / "index.html").read_text()


def test_the_page_loads_nothing_from_the_network(page):
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    assert "window.vegaEmbed" in page  # the libraries are in the page itself


def test_every_chart_has_data_a_title_and_axis_labels_and_renders(page):
    import vl_convert

    specs = [json.loads(s) for s in SPEC.findall(page)]
    assert page.count("vegaEmbed(") == len(specs)  # every chart's spec was read
    variants = tiny_params()["quantize"]["enabled"]
    # two loss curves, acceptance per variant, KL per variant, bf16's three serving charts (the others skipped), and
    # one variant's per-layer sensitivity and search frontier (the others have no search)
    assert len(specs) == 2 + len(variants) + 1 + 3 + 2
    titles = []
    for spec in specs:
        assert spec.get("data", {}).get("values"), "a chart drawn empty"
        title = spec["title"]["text"]
        assert title and not title.startswith("plots/"), title  # a title, not the file's path
        assert axis_titles(spec, "x") and axis_titles(spec, "y"), title
        assert all(axis_titles(spec, "x") + axis_titles(spec, "y")), title
        svg = vl_convert.vegalite_to_svg(spec, vl_version=VEGA_LITE)  # Vega itself: the spec draws
        assert "<path" in svg, title
        titles.append(title)
    served = [t for t in titles if "serve_bench" in t]
    assert len(served) == 3 and all("(bf16, serve_bench)" in t for t in served), titles
    assert "p99 inter-token latency by concurrency (bf16, serve_bench)" in titles
    searched = [t for t in titles if f"({SEARCHED})" in t and "Per-layer" in t]
    assert len(searched) == 2, titles


def test_plots_page_outside_a_dvc_project_is_one_error_line(tmp_path):
    """setup.sh runs `modelprep plots-page`: where it can't do its job (no .dvc/ here, DVC refusing the config) it
    says so in one line and exits non-zero, writing nothing, instead of a CalledProcessError traceback."""
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pipeline.cli import main; sys.exit(main())",
            "plots-page",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "not a DVC project" in r.stderr
    assert not any(tmp_path.iterdir())
