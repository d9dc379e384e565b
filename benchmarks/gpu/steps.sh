# Sourced by the GPU step scripts (tp_eval.sh, repro8b.sh, scale_host.sh), which set W first: their environment
# (NVLink multicast off, offline hubs, one progress line per layer), the sites Q (llm-compressor's first:
# compressed-tensors 0.19, as the quantize stages) and V (vLLM's), `quant`, and `step NAME SITE CMD...`, which runs CMD
# with PYTHONPATH=SITE,
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

export NCCL_NVLS_ENABLE=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 MODELPREP_PROGRESS_INTERVAL=0
Q=/tmp/qsite:/tmp/vllm/site:.:/tmp/dvcsite
V=/tmp/vllm/site:.:/tmp/dvcsite

# python3, not python: under repro8b.sh, PATH's python is gp_setup's wrapper, which puts vLLM's compressed-tensors first
# quant NAME MODEL GPUS [--offload]: tp_eval.py's GPTQ W4A16 into $W/ckpt/NAME, its record $W/out/quant-NAME.json
quant() {
  rm -rf "$W/ckpt/$1"
  step "quant-$1" "$Q" python3 benchmarks/gpu/tp_eval.py quant "$2" "$W/ckpt/$1" "$3" "$W/out/quant-$1.json" "${@:4}"
}
