#!/usr/bin/env bash
# Create .venv and install the project from its own files (CPU torch from the local wheel first).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# 2.13.0 is the CPU build on local disk; installing it first keeps pip from pulling CUDA wheels.
python -m pip install -q torch==2.13.0
# The rest through uv: the same 239 packages pip resolves, in 31.5 s with an empty uv cache against pip's 114.0 s
# on the 2-core machine (benchmarks/cpu/setup_install.sh). pip keeps torch: only pip reads this machine's pip config
# (the local CPU wheel, the torch cap), and uv leaves the installed torch alone since it satisfies every requirement.
python -m pip install -q uv==0.13.9
uv pip install -q --compile-bytecode -e ".[dev]"
# EAGLE-3 heads (pipeline/drafts/eagle3.py): speculators' model and loss. --no-deps: its metadata pulls torchaudio and
# torchvision, whose resolution replaces the CPU torch above with a CUDA build; pyproject lists what it imports.
uv pip install -q --no-deps speculators==0.9.0
python -c "import speculators.models.eagle3"
# `dvc plots show`'s page with vega inlined (.dvc/plots/page.html, .dvc/config.local): the charts draw offline.
modelprep plots-page >/dev/null
# promtool checks and unit-tests the bundles' Prometheus rules (tests/release/test_handoff.py). Debian's package, where
# this runs as root with apt (CI does); elsewhere those tests skip and say why.
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
