#!/usr/bin/env bash
# The README's first command, timed on a fresh clone of HEAD on this machine, then a second `dvc repro`
# (which should find nothing stale but the always-run `sources` fingerprint), then
# benchmarks/cpu/repro_nochange.py in the same clone.
#
#   bash benchmarks/cpu/demo_build.sh          # writes benchmarks/cpu/raw/demo-build.json
#   bash benchmarks/cpu/demo_build.sh --lock   # also copies the clone's locks, metrics/ and plots/
#                                              # back: the lock of a `dvc repro` of the committed code,
#                                              # and metrics/ into benchmarks/cpu/raw/demo-metrics/ (README's source)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] || { echo "commit first: the clone builds HEAD" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/clone"
cd "$work/clone"
first=$(sed -n '/^```bash$/{n;p;q}' README.md)   # the README's first command, as a user copies it
# --lock: the locks DVC writes (dvc.lock, stages/dvc.lock) hold only the stages their dvc.yaml has (a lock carried
# over keeps a removed stage's entry for ever); with no DVC cache in a fresh clone every stage runs either way, so the
# timing is the same.
[ "${1:-}" = "--lock" ] && rm -f dvc.lock stages/dvc.lock
t0=$(date +%s.%N)
# each output line prefixed with the seconds since the start: where the time goes, stage by stage
set +e
bash -c "$first" 2>&1 | python3 -u -c 'import sys, time
t0 = float(sys.argv[1])
for line in sys.stdin:
    print(f"{time.time() - t0:.1f} {line}", end="", flush=True)' "$t0" > "$work/first.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || { tail -40 "$work/first.log"; exit 1; }
t1=$(date +%s.%N)
. .venv/bin/activate
dvc repro > "$work/second.log" 2>&1
t2=$(date +%s.%N)
mkdir -p "$root/benchmarks/cpu/raw"
python - "$root/benchmarks/cpu/raw/demo-build.json" "$t0" "$t1" "$t2" "$first" "$work/second.log" "$work/first.log" <<'PY'
import json, os, re, subprocess, sys, time
out, t0, t1, t2, first, second_log, first_log = sys.argv[1], *map(float, sys.argv[2:5]), *sys.argv[5:8]
record = {
    "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    "first_command": first, "first_command_s": round(t1 - t0, 1), "second_repro_s": round(t2 - t1, 1),
    "second_repro_ran": re.findall(r"^Running stage '(?:[^':]+:)?([^']+)'", open(second_log).read(), re.M),
}
# Seconds from each stage's start to the next one's (the last: to the end of the command); setup before the first.
starts = [(float(m[1]), m[2]) for m in re.finditer(r"^([0-9.]+) Running stage '(?:[^':]+:)?([^']+)'", open(first_log).read(), re.M)]
if starts:
    record["setup_s"] = round(starts[0][0], 1)
    ends = [t for t, _ in starts[1:]] + [t1 - t0]
    record["stage_s"] = {name: round(end - t, 1) for (t, name), end in zip(starts, ends)}
json.dump(record, open(out, "w"), indent=2)
print(json.dumps(record))
PY
# the no-change `dvc repro` and its `sources` stage, cold and warm, in the same fresh build (issue #32, item 2)
python benchmarks/cpu/repro_nochange.py --out "$root/benchmarks/cpu/raw/repro-nochange.json" > "$work/nochange.log" 2>&1 \
  || { tail -20 "$work/nochange.log"; echo "benchmarks/cpu/repro_nochange.py failed (the build's record stands)" >&2; }
if [ "${1:-}" = "--lock" ]; then
  cp dvc.lock "$root/dvc.lock"
  cp stages/dvc.lock "$root/stages/dvc.lock"
  rm -rf "$root/metrics" "$root/plots" "$root/benchmarks/cpu/raw/demo-metrics"
  cp -r metrics plots "$root/"
  cp -r metrics "$root/benchmarks/cpu/raw/demo-metrics"
fi
