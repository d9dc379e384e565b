"""Plot data a stage may have nothing for: a directory that holds the data, or only a note saying why not.

`dvc plots show` draws every plot file it is given, an empty one as an empty chart (`var spec = {};`), but of a
directory plot only the files in it. So a chart a stage can lack data for (serve_bench on a host without a CUDA
device) is a directory output: DATA when there is something to draw, else only SKIPPED, which .dvcignore hides from
DVC. Git keeps the directory (a fresh clone has the output), DVC sees it empty and draws no chart for it."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import version
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, atomic_write_text, write_csv

DATA = "data.csv"
SKIPPED = "skipped.txt"  # listed in .dvcignore


def write_plot(directory: str | os.PathLike, rows: list[dict], header: list[str], why_empty: str) -> None:
    """directory/DATA with rows, or, with none, only directory/SKIPPED holding why_empty (one line)."""
    with atomic_dir(directory) as tmp:
        if rows:
            write_csv(tmp / DATA, rows, header)
        else:
            (tmp / SKIPPED).write_text(why_empty.strip() + "\n")


# `dvc plots show`'s page. DVC's own (dvc_render.html.PAGE_HTML) loads vega, vega-lite and vega-embed from a CDN, so
# offline it draws nothing. This one inlines them from vl-convert-python (its javascript_bundle: the three libraries
# in one script that sets window.vegaEmbed) and has no {scripts} placeholder, so DVC adds no <script src>. Made by
# setup.sh (`modelprep plots-page`), not committed: 0.9 MB of minified JavaScript, pinned by pyproject.toml instead.
PAGE = "plots/page.html"  # relative to .dvc/, as DVC reads plots.html_template
VEGA_LITE = "5.21"  # DVC's templates are Vega-Lite v5 specs
PAGE_HEAD = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>modelprep: dvc plots show</title>
<style>
  body { font-family: sans-serif; margin: 16px; }
  .note { color: #444; max-width: 75em; }
  .plots { display: flex; flex-wrap: wrap; gap: 28px; }
</style>
"""
PAGE_BODY = """</head>
<body>
<h2>modelprep plots</h2>
<p class="note">A chart whose stage had nothing to draw on this host (the serving benchmark, serve_bench, without a CUDA
device) is left out, not drawn empty: its plots/&lt;chart&gt;/&lt;variant&gt;/skipped.txt says why.</p>
<div class="plots">
{plot_divs}
</div>
</body>
</html>
"""
DVC_PLACEHOLDERS = ("{scripts}", "{plot_divs}", "{refresh_tag}")  # dvc_render.html.HTML.embed replaces them anywhere


def page_html() -> str:
    """The page template, with the libraries inlined (vl-convert-python renders nothing here: it only bundles)."""
    import vl_convert

    bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE)
    # Either would break the page: DVC would fill a placeholder inside the script, or the script would end early.
    if "</script" in bundle.lower() or any(p in bundle for p in DVC_PLACEHOLDERS):
        raise PipelineError(f"vl-convert-python {version('vl-convert-python')}'s bundle cannot be inlined as it is")
    versions = (
        f"vega {vl_convert.get_vega_version()}, vega-lite {VEGA_LITE}, vega-embed "
        f"{vl_convert.get_vega_embed_version()}, from vl-convert-python {version('vl-convert-python')}"
    )
    return f"{PAGE_HEAD}<script>/* {versions} */\n{bundle}\n</script>\n{PAGE_BODY}"


def install_page(root: Path) -> Path:
    """Write root/.dvc/PAGE and point this workspace's DVC at it (.dvc/config.local: a clone without it gets DVC's
    own page, which needs the network, rather than an error)."""
    if not (root / ".dvc").is_dir():
        raise PipelineError(f"{root}: not a DVC project (no .dvc/): the plots page belongs in one")
    try:
        html = page_html()
    except ImportError as e:
        raise PipelineError(f"the plots page needs vl-convert-python (pyproject's dependencies): {e}") from None
    path = root / ".dvc" / PAGE
    atomic_write_text(path, html)
    try:
        subprocess.run(
            ["dvc", "config", "--local", "plots.html_template", PAGE],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        detail = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
        raise PipelineError(
            f"dvc config --local plots.html_template {PAGE} in {root} failed: {detail[-1] if detail else e}"
        ) from None
    return path
