#!/usr/bin/env bash
# CPU, after a `costs` GPU session (benchmarks/gpu/README.md): from the raw files under benchmarks/gpu/raw/costs/
# (the last costs-watch call's costs.tgz, unpacked), write the shapes' configs, assemble the cost profiles the
# pipeline ships (pipeline/cost_profiles/) and render benchmarks/gpu/COSTS.md. Deterministic: the same raw files
# give the same profiles and tables (tests/test_serving_costs.py checks the profiles).
set -euo pipefail
cd "$(dirname "$0")/../.."
raw=benchmarks/gpu/raw/costs
python benchmarks/gpu/measure_costs.py shapes "$raw/shapes" > /dev/null
gpu=h100
grep -q "H100" "$raw/gpu.txt" || { echo "costs.sh: $raw/gpu.txt names no H100; set the profile's GPU key here" >&2; exit 1; }
vllm=$(awk '{print $2}' "$raw/versions.txt")
mkdir -p pipeline/cost_profiles
for shape in demo smollm2-135m gpu-profile-1b llama3-8b; do
  [ -f "$raw/$shape/plain-k0.json" ] || { echo "no plain decoding measured for $shape: no profile"; continue; }
  python -m pipeline.serving_costs assemble "$raw/$shape" "$raw/shapes/$shape" "$gpu-vllm$vllm-$shape" "$gpu" \
    "pipeline/cost_profiles/$gpu-vllm$vllm-$shape.json"
done
python benchmarks/gpu/costs_report.py > benchmarks/gpu/COSTS.md
echo "wrote benchmarks/gpu/COSTS.md"
