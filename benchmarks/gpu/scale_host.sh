#!/usr/bin/env bash
# Issue 50 items 4 and 8 on a host of 4 GPUs, what the 8B repro (repro8b.sh) left, in one script (session.sh scale-host
# starts it in its own session from a private copy of the tree; scale-host-watch packs $W, default /tmp/sh4):
#   run.log / steps.txt / out/mem-<step>.csv   as tp_eval.sh (benchmarks/gpu/steps.sh)
#   out/quant-*.json     tp_eval.py quant's records; out/fidelity-8b.json the three checkpoints through vLLM
#   costs/               measure_costs.py pool's engines (costs/llama3-8b: known_accept.py's models, drafts accepted;
#                        costs/llama3-8b-dummy: random weights, drafts rejected; costs/llama3-8b-served: the check)
#   scale/               scale_serve.py's records of FP8 at TP 4 (plans/scale-70b-fp8-tp4.json)
# Steps, most wanted first (a lease can end before the last):
#   1. the pipeline's GPTQ W4A16 of one Llama-3-8B-shape checkpoint on 1, 2 and 4 GPUs (item 4: one run, one host)
#   2. the 8B speculative cost profile timed with drafts accepted (known_accept.py's models), engines side by side on
#      the 4 GPUs, with the served check and two random-weight engines to compare
#   3. a 2-layer model of Llama-3-70B's widths quantized on one GPU with sequential onloading, then over 4 GPUs
#      (item 4: per-layer times of a 70B model on one H100 and on four)
#   4. the Llama-3-70B shape served in FP8 at TP 4 (the alternative to the TP the pipeline chose)
#   5. the three GPTQ checkpoints' fidelity against BF16 through vLLM (item 4: equal quality)
set -uo pipefail
cd "$(dirname "$0")/../.."
W=${SH4_DIR:-/tmp/sh4}
mkdir -p "$W/out" "$W/ckpt" "$W/costs"
M8=/tmp/m8/bf16 M70=/tmp/m70x2/bf16 KA=/tmp/ka
# the demo target's tokenizer for the random checkpoints (its calibration rows are tokenized with it); its files alone
# travel as .gpu/demotok where a call has no room for the whole model
DEMO=artifacts/models/target; [ -d .gpu/demotok ] && DEMO=.gpu/demotok
. benchmarks/gpu/steps.sh  # the environment, sites Q and V, quant (its checkpoint kept for step 5), step

[ -f $M8/config.json ] || step make8b "$Q" python benchmarks/gpu/run_gpu.py make8b /tmp/m8 "$DEMO"
for n in 1 2 4; do quant "8b-${n}gpu" $M8 "$n"; done

step known8b "$Q" python benchmarks/gpu/known_accept.py build llama3-8b "$KA/llama3-8b"
python benchmarks/gpu/measure_costs.py random-prompts 128256 "$W/costs/llama3-8b-served/prompts.json"
r=real
MC_SPEC_BATCHES=1,8,32,64 step costs8b "$V" python benchmarks/gpu/measure_costs.py pool "$KA" "$W/costs" 0,1,2,3 \
  llama3-8b:plain:0:$r llama3-8b:draft_model:2:$r llama3-8b:draft_model:8:$r llama3-8b:eagle3:2:$r \
  llama3-8b:eagle3:8:$r llama3-8b:ngram:2:$r llama3-8b:ngram:8:$r \
  llama3-8b:served:0:plain llama3-8b:served:4:draft_model llama3-8b:served:4:eagle3 \
  llama3-8b:draft_model:8 llama3-8b:eagle3:8
rm -rf "$KA"

step make70b "$Q" python benchmarks/gpu/run_gpu.py make70b /tmp/m70x2 "$DEMO" 2
quant 70b2-1gpu-offload $M70 1 --offload
quant 70b2-4gpu $M70 4
rm -rf "$W/ckpt/70b2-1gpu-offload" "$W/ckpt/70b2-4gpu"

mkdir -p "$W/scale"
PYTHONPATH=$Q python benchmarks/gpu/scale_serve.py make /tmp/s70 .gpu/tok8b fp8-dynamic=FP8_DYNAMIC >> "$W/run.log" 2>&1
step fp8-tp4 "$V" python benchmarks/gpu/scale_serve.py run /tmp/s70 "$W/scale" benchmarks/gpu/plans/scale-70b-fp8-tp4.json

step fidelity-8b "$V" python benchmarks/gpu/tp_eval.py vllm $M8 "$W/out/fidelity-8b.json" 1 \
  bf16=$M8 gptq-1gpu="$W/ckpt/8b-1gpu" gptq-2gpu="$W/ckpt/8b-2gpu" gptq-4gpu="$W/ckpt/8b-4gpu"
echo done > "$W/rc"
