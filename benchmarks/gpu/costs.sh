#!/usr/bin/env bash
# CPU, after `costs` GPU sessions (benchmarks/gpu/README.md): from the raw files under benchmarks/gpu/raw/costs/
# (one folder per lease, lease-N/: the last costs-watch call's costs.tgz unpacked), write the shapes' configs,
# assemble the cost profiles the pipeline ships (data/serving-cost-profiles/: each method from the newest lease that
# measured it, against that lease's plain decoding; then calibrated by served runs) and render benchmarks/gpu/COSTS.md. Deterministic: the same
# raw files give the same profiles and tables (tests/evaluate/test_serving_costs.py re-assembles the profiles).
set -euo pipefail
cd "$(dirname "$0")/../.."
raw=benchmarks/gpu/raw/costs
python benchmarks/gpu/measure_costs.py shapes "$raw/shapes" > /dev/null  # needs compressed-tensors (the 70B W4A16 shape)
gpu=h100
mkdir -p data/serving-cost-profiles
rm -f data/serving-cost-profiles/*.json
for shape in demo smollm2-135m gpu-profile-1b llama3-8b llama3-70b-w4a16; do
  runs=()
  for lease in $(ls -d "$raw"/lease-* 2>/dev/null | sort -V); do
    [ -f "$lease/$shape/plain-k0.json" ] || continue
    grep -q "H100" "$lease/gpu.txt" || { echo "costs.sh: $lease/gpu.txt names no H100" >&2; exit 1; }
    runs+=("$lease/$shape")
  done
  [ ${#runs[@]} -gt 0 ] || { echo "no plain decoding measured for $shape: no profile"; continue; }
  vllm=$(awk '{print $2}' "$(dirname "${runs[-1]}")/versions.txt")
  python -m pipeline.evaluate.serving_costs assemble "$gpu-vllm$vllm-$shape" "$gpu" "$raw/shapes/$shape" \
    "data/serving-cost-profiles/$gpu-vllm$vllm-$shape.json" "${runs[@]}"
done
# Served calibration: each method's step costs scaled to what `vllm serve` served with trained drafters
# (serve_bench's record on the same shape, and for n-gram the CPU estimate of the same variant, whose tokens per
# step the record lacks; pipeline/evaluate/serving_costs.py calibrate; several records pool).
python -m pipeline.evaluate.serving_costs calibrate "data/serving-cost-profiles/$gpu-vllm0.26.0-demo.json" \
  benchmarks/gpu/raw/demo-serve-bf16/record.json benchmarks/gpu/raw/demo-serve-bf16/cpu-estimate/speculative-ngram.json
python -m pipeline.evaluate.serving_costs calibrate "data/serving-cost-profiles/$gpu-vllm0.26.0-smollm2-135m.json" \
  benchmarks/gpu/raw/smollm2-gpu-3/serve/bf16/record.json benchmarks/gpu/raw/smollm2-gpu-3/eval/bf16/speculative-ngram.json
# the GPU profile's target: both leases' BF16 (each record followed by its n-gram estimate; the runs pool)
python -m pipeline.evaluate.serving_costs calibrate "data/serving-cost-profiles/$gpu-vllm0.26.0-gpu-profile-1b.json" \
  benchmarks/gpu/raw/gpu-served/serve/bf16/record.json benchmarks/gpu/raw/gpu-served/eval/bf16/speculative-ngram.json \
  benchmarks/gpu/raw/gpu-served-3/serve/bf16/record.json benchmarks/gpu/raw/gpu-served-3/eval/bf16/speculative-ngram.json
python benchmarks/render.py benchmarks/gpu/COSTS.md

