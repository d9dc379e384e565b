#!/usr/bin/env bash
# Issue 50 item 8 on a host of 4 GPUs, started by `session.sh repro8b` from /tmp/gp (this tree with profiles/smollm2.yaml
# then profiles/gpu-8b.yaml applied), in its own session; repro8b-watch packs what it wrote to $W (/tmp/r8):
#   run.log / steps.txt / out/mem-<step>.csv   as tp_eval.sh (benchmarks/gpu/steps.sh): each line stamped with the
#                  wall clock, so each DVC stage runs from its "Running stage" line to the next; GPU memory samples
#   out/quant-8b-<n>gpu.json   tp_eval.py's records
# Steps (session.sh repro8b made the target: Llama-3-8B's shape, random weights, SmolLM2's tokenizer): the whole
# `dvc repro` (every stage, GPTQ over 4 GPUs, serve_bench's
# configurations spread over the 4 GPUs), then the pipeline's GPTQ W4A16 of the same checkpoint on 1, 2 and 4 GPUs
# over the repro's calibration split (item 4: times of one run on one host).
set -uo pipefail
W=${R8_DIR:-/tmp/r8}
mkdir -p "$W/out" "$W/ckpt"
M8=/tmp/m8/bf16
. benchmarks/gpu/steps.sh

# PATH's python (session.sh gp_setup: /tmp/gpbin) puts each stage's site first; DVC itself runs from DVC_PATH
step repro "$DVC_PATH" python3 -m dvc repro
for n in 1 2 4; do quant "8b-${n}gpu" $M8 "$n"; rm -rf "$W/ckpt/8b-${n}gpu"; done
echo done > "$W/rc"
