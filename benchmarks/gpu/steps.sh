# Sourced by the GPU step scripts (tp_eval.sh, repro8b.sh): `step NAME SITE CMD...` runs CMD with PYTHONPATH=SITE,
# every output line into $W/run.log prefixed with the wall clock (bash's EPOCHREALTIME), while nvidia-smi samples
# every GPU's memory.used every 0.5 s into $W/out/mem-NAME.csv (timestamp, index, MiB: a stage's peak is read from
# the samples between its log lines); one line per step into $W/steps.txt: exit status, seconds, each GPU's peak.
step() {
  local name=$1 site=$2; shift 2
  nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500 \
    > "$W/out/mem-$name.csv" 2>/dev/null &
  local smi=$! start=$EPOCHREALTIME
  echo "$EPOCHREALTIME STEP $name: $*" >> "$W/run.log"
  PYTHONPATH=$site "$@" < /dev/null 2>&1 | stdbuf -oL tr '\r' '\n' | while IFS= read -r line; do
    printf '%s %s\n' "$EPOCHREALTIME" "${line:0:600}"; done >> "$W/run.log"
  local rc=${PIPESTATUS[0]}
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  local peak
  peak=$(awk -F', *' '$3 > m[$2] {m[$2] = $3} END {for (g in m) printf "gpu%s=%s ", g, m[g]}' "$W/out/mem-$name.csv")
  printf '%s rc=%s seconds=%s peak_mib: %s\n' "$name" "$rc" \
    "$(awk -v a="$EPOCHREALTIME" -v b="$start" 'BEGIN {printf "%.1f", a - b}')" "$peak" \
    | tee -a "$W/steps.txt" >> "$W/run.log"
  return "$rc"
}
