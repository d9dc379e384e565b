#!/usr/bin/env bash
# Issue 50 item 8: the 8B speculative cost profile's EAGLE-3 entry timed with its drafts accepted (known_accept.py's
# head, its lm_head rows permuted for vLLM's pairing of position i's hidden state with token i+1), with plain decoding
# of the same target and the served check, engines side by side on the GPUs EK_GPUS (default 1,2,3), so another step
# can hold GPU 0 (session.sh eagle3-known starts it from a private tree; eagle3-known-watch packs $W, default /tmp/ek):
#   run.log / steps.txt / out/mem-<step>.csv   as scale_host.sh (benchmarks/gpu/steps.sh)
#   costs/llama3-8b/        measure_costs.py pool's engines (plain, EAGLE-3 at k = 2 and 8, drafts accepted)
#   costs/llama3-8b-served/ the served check: plain and EAGLE-3 at k = 4 over random prompts, acceptance counted
set -uo pipefail
cd "$(dirname "$0")/../.."
W=${EK_DIR:-/tmp/ek}
mkdir -p "$W/out" "$W/costs"
KA=/tmp/ka
. benchmarks/gpu/steps.sh  # the environment, sites Q and V, step

# without the models every engine would fail on a missing path: stop here, the watch reports the exit status
step known8b "$Q" python3 benchmarks/gpu/known_accept.py build llama3-8b "$KA/llama3-8b" || exit 1
python3 benchmarks/gpu/measure_costs.py random-prompts 128256 "$W/costs/llama3-8b-served/prompts.json"
# the longest engine first: the pool gives each GPU the next item as it frees
MC_SPEC_BATCHES=1,8,32,64 step costs8b "$V" python3 benchmarks/gpu/measure_costs.py pool "$KA" "$W/costs" \
  "${EK_GPUS:-1,2,3}" llama3-8b:eagle3:8:real llama3-8b:eagle3:2:real llama3-8b:plain:0:real \
  llama3-8b:served:4:eagle3 llama3-8b:served:0:plain
rm -rf "$KA"
echo done > "$W/rc"
