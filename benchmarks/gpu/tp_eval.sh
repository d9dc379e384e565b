#!/usr/bin/env bash
# Issue 50 items 4 and 5 on a host of 2 GPUs, every step in this one script (session.sh tpeval starts it in its own
# session, tpeval-watch packs what it wrote). In $TPE_DIR (default /tmp/tpe):
#   run.log        every line of every step, each prefixed with the wall clock (bash's EPOCHREALTIME: per-layer times
#                  come from the pipeline's progress lines, one per decoder layer with MODELPREP_PROGRESS_INTERVAL=0)
#   steps.txt      per step: exit status, seconds, peak memory.used of each GPU (nvidia-smi sampled every 0.5 s, MiB)
#   out/*.json     tp_eval.py's records; out/mem-<step>.csv the samples
#   rc             written last
# Steps (the one-GPU ones first, so that TPE_MIXED=1 can use GPU 1 meanwhile): a Llama-3-8B-shape checkpoint with random weights (run_gpu.py
# make8b; /tmp/m8/bf16 reused), the pipeline's GPTQ W4A16 of it on 1 GPU then on 2 (pipeline/quantize/distributed.py),
# the fidelity of both against BF16 through vLLM at TP 1 and TP 2, the demo target (artifacts/models/target) quantized
# the same way and scored through vLLM at TP 1 and 2 and exactly in transformers, and last one GPU with sequential
# onloading (quantize.calibration.offload: true).
set -uo pipefail
cd "$(dirname "$0")/../.."
W=${TPE_DIR:-/tmp/tpe}
mkdir -p "$W/out" "$W/ckpt"
M8=/tmp/m8/bf16 DEMO=artifacts/models/target

. benchmarks/gpu/steps.sh  # the environment, sites Q and V, quant, step NAME SITE CMD... (timed, logged, GPU memory)

[ -f $M8/config.json ] || step make8b "$Q" python benchmarks/gpu/run_gpu.py make8b /tmp/m8 "$DEMO"
# TPE_MIXED=1: issue 46's mixed8b (benchmarks/gpu/mixed_serve.py) on GPU 1 over the same checkpoint while the one-GPU
# steps below use GPU 0; every two-GPU step waits for it (run.log's timestamps show what ran beside what).
if [ "${TPE_MIXED:-0}" = 1 ]; then
  echo "$EPOCHREALTIME STEP mixed8b on GPU 1 beside the one-GPU steps" >> "$W/run.log"
  bash benchmarks/gpu/session.sh mixed8b /tmp/mx-first 0 1 > "$W/mixed8b-start.log" 2>&1
fi
both_gpus() {  # the two-GPU steps wait for mixed8b to give GPU 1 back
  while [ -f /tmp/mx/run.log ] && [ ! -f /tmp/mx/rc ]; do sleep 5; done
  echo "$EPOCHREALTIME GPU 1 free" >> "$W/run.log"
}
quant 8b-1gpu $M8 1
# A small real model, where transformers runs too: vLLM's numbers against the exact ones, both in bfloat16.
quant demo-1gpu $DEMO 1
step exact-demo "$Q" python benchmarks/gpu/tp_eval.py exact $DEMO "$W/out/fidelity-demo-exact.json" \
  bf16=$DEMO gptq="$W/ckpt/demo-1gpu"
TPE_DTYPE=bfloat16 step "vllm-demo-tp1" "$V" python benchmarks/gpu/tp_eval.py vllm $DEMO \
  "$W/out/fidelity-demo-tp1.json" 1 bf16=$DEMO gptq="$W/ckpt/demo-1gpu"
both_gpus
quant 8b-2gpu $M8 2
for tp in 1 2; do
  step "vllm-8b-tp$tp" "$V" python benchmarks/gpu/tp_eval.py vllm $M8 "$W/out/fidelity-8b-tp$tp.json" $tp \
    bf16=$M8 gptq-1gpu="$W/ckpt/8b-1gpu" gptq-2gpu="$W/ckpt/8b-2gpu"
done
TPE_DTYPE=bfloat16 step "vllm-demo-tp2" "$V" python benchmarks/gpu/tp_eval.py vllm $DEMO \
  "$W/out/fidelity-demo-tp2.json" 2 bf16=$DEMO gptq="$W/ckpt/demo-1gpu"
# Item 4: one GPU, the weights in CPU RAM and one layer at a time on the GPU (how a 70B model quantizes on one H100).
quant 8b-1gpu-offload $M8 1 --offload
step vllm-8b-offload-tp1 "$V" python benchmarks/gpu/tp_eval.py vllm $M8 "$W/out/fidelity-8b-offload-tp1.json" 1 \
  gptq-1gpu-offload="$W/ckpt/8b-1gpu-offload"
echo done > "$W/rc"
