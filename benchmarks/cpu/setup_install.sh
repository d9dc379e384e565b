#!/usr/bin/env bash
# setup.sh's project install, timed two ways in fresh clones of HEAD on this machine (issue #32): pip (what
# setup.sh did before) and uv (what it does now), uv with an empty cache of its own (a fresh machine's case; pip
# keeps this machine's cache, which can only favour pip). Both install torch with pip first, then the project with
# its dev extras and speculators; the two environments' `pip freeze` must list the same packages.
#
#   bash benchmarks/cpu/setup_install.sh      # writes benchmarks/cpu/raw/setup-install.json
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export UV_CACHE_DIR="$work/uv-cache"
step() { local t0; t0=$(date +%s.%N); "${@:2}" > /dev/null 2>&1 || { echo "$1 failed: ${*:2}" >&2; exit 1; }
         python3 -c "import sys; print(round($(date +%s.%N) - $t0, 1))" > "$dir/$1.s"; }
for how in pip uv; do
  dir="$work/$how"; git clone -q "$root" "$dir"; cd "$dir"
  step venv python3 -m venv .venv
  step torch .venv/bin/python -m pip install -q torch==2.13.0
  if [ "$how" = pip ]; then
    step project .venv/bin/python -m pip install -q -e ".[dev]"
    step speculators .venv/bin/python -m pip install -q --no-deps speculators==0.9.0
  else
    step uv .venv/bin/python -m pip install -q uv==0.13.9
    step project env VIRTUAL_ENV="$dir/.venv" .venv/bin/uv pip install -q --compile-bytecode -e ".[dev]"
    step speculators env VIRTUAL_ENV="$dir/.venv" .venv/bin/uv pip install -q --no-deps speculators==0.9.0
  fi
  step first_import .venv/bin/python -c "import speculators.models.eagle3"
  .venv/bin/python -m pip freeze 2>/dev/null | sed 's/ @ .*//' | grep -v '^uv==' | sort > "$work/$how.freeze"
done
mkdir -p "$root/benchmarks/cpu/raw"
python3 - "$work" "$root/benchmarks/cpu/raw/setup-install.json" <<'PY'
import json, os, pathlib, subprocess, sys, time
work, out = pathlib.Path(sys.argv[1]), sys.argv[2]
record = {"commit": subprocess.run(["git", "-C", os.path.dirname(out), "rev-parse", "HEAD"], capture_output=True,
                                   text=True).stdout.strip(),
          "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "uv_cache": "empty (a fresh one)",
          "pip_cache": "this machine's"}
for how in ("pip", "uv"):
    steps = {p.stem: float(p.read_text()) for p in sorted((work / how).glob("*.s"))}
    record[how] = {"steps_s": steps, "total_s": round(sum(steps.values()), 1)}
pip_pkgs, uv_pkgs = ((work / f"{h}.freeze").read_text().split() for h in ("pip", "uv"))
record["same_packages"] = pip_pkgs == uv_pkgs
record["packages"] = len(pip_pkgs)
record["only_pip"], record["only_uv"] = sorted(set(pip_pkgs) - set(uv_pkgs)), sorted(set(uv_pkgs) - set(pip_pkgs))
pathlib.Path(out).write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record))
sys.exit(0 if record["same_packages"] else 1)
PY
