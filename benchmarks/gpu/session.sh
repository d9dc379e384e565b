#!/usr/bin/env bash
# GPU runs, step by step (see README.md). On any CUDA host with pip, `pip-install` first; on a host without network,
# the offline kit (collect/chunk, install) instead. Each step that measures writes run.json (benchmarks/run_spec.py:
# the command, commit, GPU, versions, profile) beside its outputs; RUN_COMMIT names the commit where the tree is a copy.
#   session.sh pip-install        from PyPI: vLLM, llm-compressor, lm-eval and dvc into the sites the steps use
#   session.sh collect N          offline kit: copy carried vLLM bundle part .gpu/pN into /tmp/stage
#   session.sh chunk N / unload   when the tree plus a kit part exceed a call's carry: .gpu/cN/chunkNN are pieces of
#                                 one tar (the kit's parts as kit.tar.xz, plus artifacts the steps need), checked
#                                 against .gpu/c0/LOAD.sha256; unload unpacks the kit to /tmp/vllm, the rest here
#                                 (CHUNK_DIR=s: pieces in .gpu/sN instead; a .gguf under .gpu/smollm2/ goes to /tmp/smollm2)
#   session.sh install            verify + unpack vLLM, install llm-compressor and lm-eval wheels
#   session.sh gguf-piece DIR DEST ROLE  one piece of a GGUF split by size (.gpu/DIR, DIR = <key>N: gguf-<key>.NN;
#                                 .gpu/<key>0/MANIFEST names the file, its sha256 and the piece count) into
#                                 /tmp/gguf-pieces; after the last:
#                                 the file assembled into DEST, its sha256 checked, and converted in the background into
#                                 the cache the `sources` stage reads (keyed by that sha256; ROLE target or draft), so
#                                 the conversion runs while later pieces travel (/tmp/convert-ROLE/script.log, .rc)
#   session.sh eagle3-known OUT S  issue 50: EAGLE-3 at the 8B shape timed with drafts accepted on GPUs EK_GPUS
#                                 (default 1,2,3; benchmarks/gpu/eagle3_known.sh) in the background; then
#                                 eagle3-known-watch OUT S (packs /tmp/ek into OUT/eagle3-known.tgz either way)
#   session.sh demo OUT           demo artifacts in vLLM: speed/acceptance, serve.yaml, GPU quality
#   session.sh evaluate OUT V...  the pipeline's own `evaluate` stage, GPU path, per variant
#   session.sh test               the GPU tests (tests/project/test_gpu.py; skipped in CI)
#   session.sh serve-bench OUT V...  the pipeline's own `serve_bench` stage per variant (vllm serve + vllm bench
#                                 serve), its records and raw load-generator output packed into OUT
#   session.sh schemes8b OUT V...   a Llama-3-8B-shape checkpoint (random weights) quantized to each variant V
#   session.sh bench8b OUT M...     vLLM decode tokens/s at batch 1 and 32 of those checkpoints (M: bf16 or a V)
#   session.sh gpu-profile OUT S [P]  the whole `dvc repro` with the GPU demo profile (profiles/gpu.yaml, or GP_BASE's,
#                                 then the overlay profiles/P.yaml if given, e.g. gpu-methods) in /tmp/gp, started in
#                                 the background (it outlives this call; GP_REPRO: another command; GP_PARAMS: YAML
#                                 over both), then gpu-watch
#   session.sh gpu-calib OUT S [V]  calibration sample count vs quality on the GPU profile's target (V: variants,
#                                 quoted, default "gptq-w4a16 int8-w8a8"), in the background, then gpu-watch
#   session.sh gpu-watch OUT S    wait up to S seconds for that repro; pack its results into OUT either way
#   session.sh scale-host OUT S   issue 50 on 4 GPUs (scale_host.sh) in the background, then scale-host-watch OUT S
#   session.sh costs OUT S [ITEM...]  serving-cost profiles (measure_costs.py queue ITEM...: shapes and `served`) in
#                                 the background; S seconds later the first costs-watch
#   session.sh collect25 N / install25  vLLM 0.25.0's kit (.gpu/qN) into /tmp/vllm25 beside 0.26's
#   session.sh draft-cost-versions OUT S  the draft model's step cost on vLLM 0.25.0 then 0.26.0 (measure_costs.py run
#                                 gpu-profile-1b:draft_model demo:draft_model per vLLM), in the background
#   session.sh costs-watch OUT S  wait up to S seconds for them; pack /tmp/costs/out into OUT/costs.tgz either way
#   session.sh scale OUT S [PLAN] a Llama-3-70B-shape model (random weights) served per variant and TP on disjoint GPU
#                                 sets (benchmarks/gpu/scale_serve.py run over .gpu/scale/models and PLAN, default
#                                 benchmarks/gpu/plans/scale-70b.json) in the background; then scale-watch
#   session.sh scale-watch OUT S  wait up to S seconds for it; pack /tmp/scale into OUT/scale.tgz either way
#   session.sh mixed8b OUT S [GPU]  issue 46 on the GPU: a Llama-3-8B-shape model (random; /tmp/m8/bf16 reused)
#                                 quantized by the pipeline to uniform RTN W4A16 and a W4A16 + W8A16 + BF16 layout in
#                                 one checkpoint, each served with BF16 by `vllm serve` (greedy outputs, `vllm bench
#                                 serve` at c=1 and 32, kernel lines) (benchmarks/gpu/mixed_serve.py) in the
#                                 background on GPU (CUDA_VISIBLE_DEVICES; default: as set); then mixed8b-watch
#   session.sh mixed8b-watch OUT S  wait up to S seconds for it; pack /tmp/mx into OUT/mixed8b.tgz either way
#   session.sh tpeval OUT S       2 GPUs: distributed GPTQ of an 8B shape on 1 and 2 GPUs, fidelity through vLLM at TP 1
#                                 and 2 (benchmarks/gpu/tp_eval.sh) in the background; then tpeval-watch
#   session.sh repro8b OUT S      4 GPUs: the whole `dvc repro` at Llama-3-8B's shape (random weights, SmolLM2's tokenizer
#                                 carried in .gpu/tok8b; profiles/gpu-8b.yaml over smollm2.yaml), then distributed GPTQ
#                                 on 1, 2 and 4 GPUs (benchmarks/gpu/repro8b.sh) in the background; then repro8b-watch
#   session.sh repro8b-watch OUT S  wait up to S seconds for it; pack /tmp/r8 and the repro's small outputs into OUT
#   session.sh tpeval-watch OUT S  wait up to S seconds for it; pack /tmp/tpe (less the checkpoints) into OUT/tpeval.tgz
#   session.sh demo-serve OUT V...  the serve_bench stage on the CPU demo's artifacts (profiles/gpu-demo-serve.yaml:
#                                 concurrency 1, 8, 16, 32, or SB_CONCURRENCY's; then SB_PARAMS, YAML) in /tmp/sb in the background, then demo-serve-watch
#   session.sh demo-serve-watch OUT S  wait up to S seconds for it; pack its records, raw results and logs into OUT
#   session.sh shipped OUT S B...  the CPU-built bundles B served exactly as shipped (benchmarks/gpu/serve_shipped.py:
#                                 c=1 and 16, then capacity at serving.slo) in /tmp/sh in the background; then
#                                 shipped-watch (carry artifacts/bundles and artifacts/data)
#   session.sh shipped-watch OUT S  wait up to S seconds for it; pack its raw results and logs into OUT either way
#   session.sh tp-greedy OUT B [H]  bundle B (built at tensor parallel >= 2) served as shipped on GPUs 1-2 beside the same
#                                 serve.yaml at TP 1 on GPU 0: greedy outputs on held-out prompts compared
#                                 (benchmarks/gpu/tp_greedy.py; H: held-out JSONL, default artifacts/data's)
#   session.sh handoff OUT B      the handoff kit against real vLLM: bundle B served as its manifest starts it
#                                 (`vllm serve --config serve.yaml` in B), deploy/warmup.py to its marker, load,
#                                 then /metrics scraped before and after the load (checked on the CPU machine by
#                                 benchmarks/gpu/handoff_check.py)
# and on the CPU machine (no GPU needed), writing benchmarks/gpu/raw/ directly:
#   session.sh cpu-raw            after `dvc repro`: copy the evaluate stage's CPU outputs
#   session.sh gate-raw           `modelprep gate` over the GPU run's eval summaries (raw/evaluate-stage/stage-evaluate-*.json)
#   session.sh gate-profile [RAW] `modelprep gate` over a GPU profile run's metrics (raw/RAW/, default gpu-profile), with its params
set -euo pipefail
cd "$(dirname "$0")/../.."
VARIANTS=(fp8-dynamic fp8-static gptq-w4a16 awq-w4a16)
SERVE_VARIANTS=(bf16 fp8-dynamic fp8-static gptq-w4a16 awq-w4a16)
# vLLM 0.25 pins compressed-tensors 0.17; llm-compressor 0.14 needs 0.19 (its checkpoints load in both).
gpu_line() { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; }  # the GPU a raw file was measured on
SESSION_ARGS="$*"
# run_spec DIR [PROFILE] [RUN]: run.json in DIR for this step, named RUN (default: the step); a missing spec must not
# cost the measurement. Run from the checkout's root.
run_spec() {
  PYTHONPATH=/tmp/vllm/site:/tmp/qsite:/tmp/lsite python3 benchmarks/run_spec.py write "$1" \
    --command "bash benchmarks/gpu/session.sh $SESSION_ARGS" ${2:+--profile "$2"} --run "${3:-${SESSION_ARGS%% *}}" \
    > /dev/null || echo "run.json: not written in $1" >&2
}
VLLM_PATH=/tmp/lsite:/tmp/vllm/site:/tmp/qsite
export NCCL_NVLS_ENABLE=0 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TQDM_MININTERVAL=10

rebuild_bundles() {
  # Bundles are copies of artifacts/quantized/<v> and artifacts/draft/model plus four small files;
  # only the small files are carried, and `modelprep verify` proves the rebuilt ones byte-identical.
  for v in "${VARIANTS[@]}"; do
    b=artifacts/bundles/$v
    rm -rf "$b" && mkdir -p "$b" && cp .gpu/bmeta/"$v"/* "$b"/
    cp -r artifacts/quantized/"$v" "$b"/model && cp -r artifacts/draft/model "$b"/draft
    PYTHONPATH=/tmp/qsite:. python -c "import sys; from pipeline.cli import main; sys.exit(main())" verify "$b"
  done
}

gp_setup() {
  # /tmp/gp: this tree with dvc and the project's other pure-Python deps (.gpu/dvcwheels) beside the vLLM /
  # llm-compressor / lm-eval sites, params.yaml with the GPU demo profile and the overlay $1 (if given) applied.
  # offline kit only: dvc's wheels (pip-install put dvc in /tmp/dvcsite already)
  # (once: a second install into the same --target takes ~40 s of held time to replace nothing)
  if [ -d .gpu/dvcwheels ] && [ ! -d /tmp/dvcsite/dvc ]; then
    pip install -q --no-index --no-deps --target /tmp/dvcsite .gpu/dvcwheels/*.whl
  fi
  rm -rf /tmp/gp && mkdir -p /tmp/gp /tmp/gpbin
  tar --exclude=./artifacts --exclude=./.gpu --exclude=./metrics --exclude=./plots --exclude=./registry -cf - . \
    | tar -C /tmp/gp -xf -
  # One interpreter, two pins: llm-compressor 0.14 needs compressed-tensors 0.19 (and vLLM's pydantic behind it),
  # vLLM 0.25 its own 0.17. DVC runs `python -m stages.<name>`; this `python` puts the right site first.
  cat > /tmp/gpbin/python <<'SH'
#!/bin/bash
case " $* " in
  *" stages.quantize "*|*" stages.draft_quantize"*|*" stages.draft_finetune"*|*"calibration_sweep.py"*)
    export PYTHONPATH=/tmp/dvcsite:/tmp/qsite:/tmp/vllm/site ;;
  *) export PYTHONPATH=/tmp/dvcsite:/tmp/lsite:/tmp/vllm/site:/tmp/qsite ;;
esac
exec python3 "$@"
SH
  chmod +x /tmp/gpbin/python
  export PATH=/tmp/gpbin:$PATH DVC_NO_ANALYTICS=1
  # dvc's pydantic (through gto) is vLLM's, as llm-compressor's is.
  export DVC_PATH=/tmp/dvcsite:/tmp/vllm/site
  (cd /tmp/gp
   PYTHONPATH=$DVC_PATH python3 -m dvc config core.no_scm true && PYTHONPATH=$DVC_PATH python3 -m dvc config cache.type hardlink,copy
   # GP_BASE: the base profile (default gpu, the GPU demo profile; smollm2 for SmolLM2 on real text)
   PYTHONPATH=$DVC_PATH python3 -c "import sys; from pipeline.cli import main; sys.exit(main())" profile "${GP_BASE:-gpu}"
   if [ -n "${1:-}" ]; then
     PYTHONPATH=$DVC_PATH python3 -c "import sys; from pipeline.cli import main; sys.exit(main())" profile "$1"
   fi
   # GP_PARAMS: YAML written over both (e.g. '{quantize: {enabled: [bf16, gptq-w4a16]}}': one lease's variants)
   if [ -n "${GP_PARAMS:-}" ]; then
     printf '%s\n' "$GP_PARAMS" > /tmp/gp-params.yaml
     PYTHONPATH=$DVC_PATH python3 -c "import sys; from pipeline.cli import main; sys.exit(main())" profile /tmp/gp-params.yaml
   fi)
  gpu_line > /tmp/gp-gpu.txt
  run_spec /tmp/gp "profiles/${GP_BASE:-gpu}.yaml${1:+ + profiles/$1.yaml}" "${1:-${GP_BASE:-gpu}-profile}"
}

private_tree() {  # private_tree STEP [PATH...]: a copy of this tree in /tmp/STEP-tree for a background step to run
  # from, since the device tool re-syncs the working tree at every call and a process the step spawns later would
  # find its files missing (raw/tpeval: FileNotFoundError for tp_eval.py in vLLM's workers). Large ignored folders
  # are left out; the PATHs the step reads from them (e.g. artifacts/models/target) are copied in.
  local dst=/tmp/$1-tree p; shift; rm -rf "$dst" && mkdir -p "$dst"
  tar -C "$PWD" --exclude=./.git --exclude=./.gpu --exclude=./artifacts --exclude=./.venv --exclude=./.dvc/cache \
      -cf - . | tar -C "$dst" -xf -
  for p in "$@"; do [ -e "$p" ] && mkdir -p "$dst/$(dirname "$p")" && cp -a "$p" "$dst/$p"; done
  echo "$dst"
}

brief_server_logs() {  # brief_server_logs DIR: each server.log under DIR cut to its lines about memory, kernels and
  # errors, beside it as server.brief.log (a call brings back 16 MiB a file; the packs leave the whole logs out)
  [ -d "$1" ] || return 0
  find "$1" -name server.log | while read -r f; do
    grep -E "memory|KV cache|Kernel|kernel|Error|error|CUDA graph|took" "$f" | cut -c1-400 > "${f%.log}.brief.log" || true
  done
}

# step_script DIR CMD [ARG...]: CMD, from the current directory, in its own session in the background (it outlives
# the call; nothing of it holds the call's output open): its output in DIR/script.log, its exit status in
# DIR/script.rc, its process group in DIR/pgid (a step that needs the GPUs back stops it: kill -- -PGID)
step_script() {
  local dir=$1; shift
  setsid bash -c 'echo $$ > "$0/pgid"; "$@" > "$0/script.log" 2>&1; echo $? > "$0/script.rc"' "$dir" "$@" \
    < /dev/null > /dev/null 2>&1 &
}

# step_dir DIR RUN OUT: a fresh DIR (and DIR/out) for a background step named RUN: the GPU line, run.json, vLLM's version
step_dir() {
  rm -rf "$1" && mkdir -p "$3" "$1/out"
  gpu_line > "$1/gpu.txt"; run_spec "$1" "" "$2"
  PYTHONPATH=/tmp/vllm/site python3 -c "import vllm; print('vllm', vllm.__version__)" > "$1/versions.txt" 2>&1
}

# wait_script DIR S: until the script's own end marker DIR/rc or its exit status DIR/script.rc, at most S seconds
wait_script() {
  local deadline=$(( $(date +%s) + $2 ))
  while [ ! -f "$1/rc" ] && [ ! -f "$1/script.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
}

# step_report DIR NAME PATTERN N: a background step's progress: its steps so far, the last N lines of its run.log
# matching PATTERN, whether it finished, ended short of its end marker (its script.rc: wait_script stops there too,
# so no more waiting helps) or is still running
step_report() {
  cat "$1/steps.txt" 2>/dev/null || true
  grep -E "$3" "$1/run.log" 2>/dev/null | tail -n "$4" | cut -c1-300 || true
  if [ -f "$1/rc" ]; then echo "$2 finished"
  elif [ -f "$1/script.rc" ]; then echo "$2 ended without finishing (exit status $(cat "$1/script.rc"); script.log)"
  else echo "$2 still running"; fi
}

gp_background() {
  # setsid: the command outlives this call (the host stays ours while calls follow within its idle window); its
  # output, each line prefixed with the seconds since it started, goes to /tmp/gp-repro.log, its status to .rc.
  rm -f /tmp/gp-repro.rc  # a finished earlier run's status would end the next gpu-watch at once
  (cd /tmp/gp && GP_CMD="$1" setsid bash -c 'start=$(date +%s); bash -c "PYTHONPATH=$DVC_PATH $GP_CMD" 2>&1 \
      | while IFS= read -r line; do printf "%s %s\n" "$(( $(date +%s) - start ))" "$line"; done > /tmp/gp-repro.log;
      echo "${PIPESTATUS[0]}" > /tmp/gp-repro.rc' < /dev/null > /dev/null 2>&1 &)
}

case "$1" in
  pip-install)
    # Any CUDA host with pip and Python 3.12: the sites the offline kit fills, from PyPI. vLLM with its dependencies
    # (torch included) in its own site; llm-compressor with compressed-tensors 0.19 in /tmp/qsite, which the
    # quantize stages put first (vLLM pins 0.17; 0.19's checkpoints load in it); lm-eval in /tmp/lsite; dvc and the
    # project's dependencies in /tmp/dvcsite. The later sites are constrained to the vLLM site's versions, so what
    # they repeat of it (torch, transformers) is the same version and costs disk only. Versions:
    # benchmarks/gpu/requirements/*.txt (VLLM_VERSION overrides vLLM's, e.g. 0.25.0).
    req=benchmarks/gpu/requirements
    python3 -m pip install -q --target /tmp/vllm/site "vllm==${VLLM_VERSION:-0.26.0}"
    # not constrained: compressed-tensors (the quantize site needs 0.19) and cachetools (mlflow-skinny 3.17 asks <8,
    # vLLM 0.26 brings 8.0.1; either works for both at run time)
    python3 -m pip freeze --path /tmp/vllm/site | grep -v -i -E "^(compressed[-_]tensors|cachetools)==" > /tmp/vllm-site.txt
    python3 -m pip install -q --target /tmp/qsite -c /tmp/vllm-site.txt -r "$req/quantize.txt"
    python3 -m pip install -q --target /tmp/lsite -c /tmp/vllm-site.txt -r "$req/lmeval.txt"
    python3 -m pip install -q --target /tmp/dvcsite -c /tmp/vllm-site.txt -r "$req/dvc.txt"
    # EAGLE-3 training: speculators without its declared deps (they would swap torch; its model code needs none)
    python3 -m pip install -q --no-deps --target /tmp/dvcsite speculators==0.9.0
    gpu_line
    PYTHONPATH=/tmp/lsite:/tmp/vllm/site:/tmp/qsite python3 -c "import vllm, torch, compressed_tensors as c, lm_eval; print('vllm', vllm.__version__, 'torch', torch.__version__, 'ct', c.__version__)"
    PYTHONPATH=/tmp/dvcsite:/tmp/vllm/site python3 -m dvc --version ;;
  collect) mkdir -p /tmp/stage && cp .gpu/p"$2"/* /tmp/stage/ && ls /tmp/stage ;;
  chunk) mkdir -p /tmp/chunks && cp .gpu/"${CHUNK_DIR:-c}$2"/* /tmp/chunks/ && ls /tmp/chunks ;;
  unload)
    cat /tmp/chunks/chunk* > /tmp/load.tar
    [ "$(sha256sum /tmp/load.tar | cut -d' ' -f1)" = "$(cat /tmp/chunks/LOAD.sha256)" ] || { echo "load.tar: checksum mismatch"; exit 1; }
    tar xf /tmp/load.tar && mkdir -p /tmp/vllm && xz -d < kit.tar.xz | tar -C /tmp/vllm -xf - && rm -f kit.tar.xz /tmp/load.tar
    # a GGUF target (profiles/gpu-smollm2.yaml's target.source) outside the tree that gp_setup copies
    if ls .gpu/smollm2/*.gguf > /dev/null 2>&1; then mkdir -p /tmp/smollm2 && mv .gpu/smollm2/*.gguf /tmp/smollm2/ && ls -la /tmp/smollm2; fi
    # build_load.sh GGUFS=NAME:PATH: each NAME's files to /tmp/NAME (a GPU profile's path sources)
    for d in .gpu/gguf/*/; do [ -d "$d" ] || continue; n=$(basename "$d"); mkdir -p "/tmp/$n" && mv "$d"* "/tmp/$n/" && ls -la "/tmp/$n"; done
    gpu_line; PYTHONPATH=/tmp/vllm/site python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    ls artifacts/bundles 2>/dev/null || true ;;
  gguf-piece)
    # the key is DIR less its trailing digits (the piece's number): a key may hold digits (l8b0 -> l8b), not end in one
    dir=$2 dest=$3 role=$4 key=${2%"${2##*[!0-9]}"}
    mkdir -p /tmp/gguf-pieces "$dest" && cp .gpu/"$dir"/* /tmp/gguf-pieces/
    [ -f /tmp/gguf-pieces/MANIFEST ] && [ "$dir" = "${key}0" ] && mv /tmp/gguf-pieces/MANIFEST "/tmp/gguf-pieces/$key.manifest"
    read -r name sha pieces < "/tmp/gguf-pieces/$key.manifest"
    have=$(ls /tmp/gguf-pieces/gguf-"$key".* | wc -l); echo "$name: piece $have of $pieces"
    [ "$have" -lt "$pieces" ] && exit 0
    cat /tmp/gguf-pieces/gguf-"$key".* > "$dest/$name.part"
    # a mismatch keeps the pieces (one re-sent piece, not all of them, mends it) and drops the assembled file
    [ "$(sha256sum "$dest/$name.part" | cut -d' ' -f1)" = "$sha" ] \
      || { rm -f "$dest/$name.part"; echo "$name: sha256 mismatch; the pieces stay in /tmp/gguf-pieces"; exit 1; }
    mv "$dest/$name.part" "$dest/$name" && rm -f /tmp/gguf-pieces/gguf-"$key".*
    tree=$(private_tree "convert-$role"); rm -rf "/tmp/convert-$role" && mkdir -p "/tmp/convert-$role"
    (cd "$tree" && step_script "/tmp/convert-$role" env PYTHONPATH=/tmp/dvcsite:/tmp/lsite:/tmp/vllm/site:/tmp/qsite:. \
      python3 -c "import sys; from pipeline.models.gguf_source import converted; print(converted(*sys.argv[1:]))" \
      "$dest/$name" "$role")
    echo "$name: assembled, converting in the background" ;;
  eagle3-known)
    step_dir /tmp/ek eagle3-known "$2"
    tree=$(private_tree eagle3-known)
    (cd "$tree" && step_script /tmp/ek bash benchmarks/gpu/eagle3_known.sh)
    exec bash "$0" eagle3-known-watch "$2" "$3" ;;
  eagle3-known-watch)
    out=$2; mkdir -p "$out"; wait_script /tmp/ek "$3"
    step_report /tmp/ek eagle3-known "ENGINE|RESULT|Error" 8
    tar czf "$out/eagle3-known.tgz" -C /tmp/ek --exclude=server.log . ;;
  install)
    # the kit from collect's parts (/tmp/stage); after chunk/unload it is already in /tmp/vllm
    if [ -d /tmp/stage ]; then
      (cd /tmp/stage && sha256sum -c --quiet SHA256SUMS)
      mkdir -p /tmp/vllm && cat /tmp/stage/part* | xz -d | tar -C /tmp/vllm -xf -
    fi
    # llm-compressor and lm-eval wheels: only `demo`, `evaluate` and `test` need them (serve-bench does not).
    if [ -d .gpu/qwheels ]; then pip install -q --no-index --no-deps --target /tmp/qsite .gpu/qwheels/*.whl; fi
    if [ -d .gpu/lmwheels ]; then pip install -q --no-index --no-deps --target /tmp/lsite .gpu/lmwheels/*.whl; fi
    gpu_line
    # lm-eval is only needed by `demo`/`evaluate`; `test` runs without it.
    PYTHONPATH=$VLLM_PATH python -c "import importlib.util as u, vllm, compressed_tensors as c; print('vllm', vllm.__version__, 'ct', c.__version__, 'lm_eval', bool(u.find_spec('lm_eval')))" ;;
  demo)
    out=$2; mkdir -p "$out"; run_spec "$out"
    rebuild_bundles
    PYTHONPATH=/tmp/vllm/site python benchmarks/gpu/run_gpu.py demo artifacts "$out"
    PYTHONPATH=/tmp/vllm/site python benchmarks/gpu/run_gpu.py serve artifacts/bundles/gptq-w4a16 "$out"
    PYTHONPATH=/tmp/qsite:/tmp/vllm/site python benchmarks/gpu/run_gpu.py quality artifacts "$out" ;;
  evaluate)
    out=$2; shift 2; mkdir -p "$out"; run_spec "$out"
    for v in "$@"; do
      start=$(date +%s)
      PYTHONPATH=$VLLM_PATH python -m stages.evaluate "$v" > "$out/stage-evaluate-$v.log" 2>&1 \
        || { echo "ERR evaluate $v"; tail -40 "$out/stage-evaluate-$v.log" "artifacts/logs/evaluate@$v.log"; continue; }
      python - "$v" "$out" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
from pathlib import Path
v, out, wall = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
ev = Path("artifacts/eval") / v
res = {name: json.loads((ev / f"{name}.json").read_text()) for name in ("summary", "vllm", "lm_eval", "speculative")}
res["stage_wall_s"] = wall
(out / f"stage-evaluate-{v}.json").write_text(json.dumps(res, indent=2))
print("RESULT", v, json.dumps(res["summary"]))
PY
    done ;;
  test) PYTHONPATH=$VLLM_PATH python -m pytest -q -s -rs -p no:cacheprovider tests/project/test_gpu.py ;;
  serve-bench)
    # The stage exactly as `dvc repro` runs it (vLLM from the offline install; nothing else is needed:
    # serve_bench imports no llm-compressor or lm-eval). One tarball per call: OUT takes 8 files at most.
    out=$2; shift 2; mkdir -p "$out"
    gpu_line | tee "$out/gpu.txt"; run_spec "$out"
    for v in "$@"; do
      start=$(date +%s)
      PYTHONPATH=/tmp/vllm/site:. python -m stages.serve_bench "$v" 2>&1 | tee "$out/serve-bench-$v.log" \
        || echo "ERR serve_bench $v"
      echo "stage_wall_s $v $(( $(date +%s) - start ))" | tee -a "$out/walls.txt"
    done
    tar czf "$out/serve-bench-$(echo "$@" | tr ' ' '_').tgz" metrics/serve-*.json artifacts/serve artifacts/logs/serve_bench@* ;;
  demo-serve)
    # Issue #28: the serve_bench stage (kernel choice, each method, the k schedule) on the CPU demo's artifacts
    # (carried: artifacts/quantized/<V>, artifacts/draft/model, artifacts/eagle3/model, artifacts/eval,
    # artifacts/data), with profiles/gpu-demo-serve.yaml over params.yaml, in /tmp/sb (a copy: later calls re-sync
    # this tree) in the background; then demo-serve-watch. Variants V in order.
    out=$2; shift 2; mkdir -p "$out"
    rm -rf /tmp/sb && mkdir -p /tmp/sb && tar --exclude=./.gpu --exclude=./.venv -cf - . | tar -C /tmp/sb -xf -
    gpu_line | tee /tmp/sb/gpu.txt; run_spec /tmp/sb profiles/gpu-demo-serve.yaml
    (cd /tmp/sb && PYTHONPATH=/tmp/vllm/site python - <<'PY'
import yaml
from pathlib import Path
params, overlay = (yaml.safe_load(Path(f).read_text()) for f in ("params.yaml", "profiles/gpu-demo-serve.yaml"))
def merge(a, b):
    return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()}}
import os
if os.environ.get("SB_CONCURRENCY"):  # e.g. "1 8 32": a shorter sweep than the profile's
    overlay["serve_bench"]["concurrency"] = [int(c) for c in os.environ["SB_CONCURRENCY"].split()]
params = merge(params, overlay)
overlay = yaml.safe_load(os.environ.get("SB_PARAMS") or "{}")  # e.g. '{serve_bench: {k_schedule: "off"}}'
Path("params.yaml").write_text(yaml.safe_dump(merge(params, overlay), sort_keys=False))
PY
     export SB_VARIANTS="$*"
     setsid bash -c 'start=$(date +%s); for v in $SB_VARIANTS; do t=$(date +%s);
         PYTHONPATH=/tmp/vllm/site:. python -m stages.serve_bench "$v" > "serve-bench-$v.log" 2>&1; rc=$?;
         echo "$v exit $rc after $(( $(date +%s) - t )) s" >> walls.txt; done; echo done > sb.rc' \
       < /dev/null > /dev/null 2>&1 &)
    sleep "${SB_WAIT:-30}"; bash "$0" demo-serve-watch "$out" 1 ;;
  demo-serve-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    while [ ! -f /tmp/sb/sb.rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    cd /tmp/sb
    cat walls.txt 2>/dev/null || true
    for f in serve-bench-*.log artifacts/logs/serve_bench@*.log; do
      [ -f "$f" ] && { echo "== $f"; { grep -v -E "it/s|s/it" "$f" || true; } | tail -n 3 | cut -c1-300; }; done
    [ -f sb.rc ] && echo "demo-serve finished" || echo "demo-serve still running"
    tar czf "$out/demo-serve.tgz" --ignore-failed-read gpu.txt params.yaml $(ls run.json walls.txt serve-bench-*.log \
      metrics/serve-*.json 2>/dev/null) $(ls -d artifacts/serve plots/serve_* 2>/dev/null) \
      $(ls artifacts/logs/serve_bench@* 2>/dev/null) 2>/dev/null || true
    ls -la "$out" ;;
  schemes8b)
    # Issue #18's speed at a realistic size: a random Llama-3-8B-shape checkpoint quantized by the pipeline's own
    # quantize_model (llm-compressor site first) to each variant V, then decode speed in vLLM (its own site), BF16
    # in the same call. The vLLM log (kernel selection lines) is kept beside the results.
    out=$2; shift 2; mkdir -p "$out"
    gpu_line | tee "$out/gpu.txt"; run_spec "$out"
    [ -f /tmp/m8/bf16/config.json ] || PYTHONPATH=/tmp/qsite:/tmp/vllm/site:. python benchmarks/gpu/run_gpu.py make8b /tmp/m8 artifacts/models/target
    PYTHONPATH=/tmp/qsite:/tmp/vllm/site:. python benchmarks/gpu/run_gpu.py quant8b /tmp/m8 "$out" artifacts/data/calibration.jsonl "$@" 2>&1 \
      | grep -v -E "it/s|s/it" > "$out/quant8b.log" || true
    grep -E "^RESULT|^ERR|Error" "$out/quant8b.log" | cut -c1-300 || true ;;
  bench8b)
    out=$2; shift 2; mkdir -p "$out"
    PYTHONPATH=/tmp/vllm/site:. python benchmarks/gpu/run_gpu.py bench8b /tmp/m8 "$out" "$@" 2>&1 \
      | grep -v -E "it/s|s/it" > "$out/bench8b.log" || true
    grep -E "^RESULT|^ERR|Selected|Error" "$out/bench8b.log" | cut -c1-300 || true ;;
  gpu-profile)
    # The GPU demo profile (then the overlay P) in /tmp/gp, its whole `dvc repro` in the background.
    # GP_BASE: base profile (gp_setup); GP_REPRO: the background command instead of a plain `dvc repro` (e.g. some
    # targets first: 'python3 -m dvc repro serve_bench@bf16; PYTHONPATH=$DVC_PATH python3 -m dvc repro')
    gp_setup "${4:-}"
    gp_background "${GP_REPRO:-python3 -m dvc repro}"
    exec bash "$0" gpu-watch "$2" "$3" ;;
  gpu-calib)
    # Issue #18's calibration sweep on the GPU profile's target: `dvc repro data` (the target trained on the GPU and
    # the traffic split, with profiles/gpu-calibration.yaml's larger calibration share), then
    # benchmarks/calibration_sweep.py on CUDA, its raw JSON rewritten after each run (/tmp/gp-calib.json).
    gp_setup gpu-calibration
    gp_background "python3 -m dvc repro data && python benchmarks/calibration_sweep.py --device cuda \
      --variants ${4:-gptq-w4a16 int8-w8a8} --samples 16 32 64 128 256 --raw /tmp/gp-calib.json"
    exec bash "$0" gpu-watch "$2" "$3" ;;
  costs)
    # Serving-cost profiles (benchmarks/gpu/measure_costs.py): vLLM alone, in the background (it outlives this
    # call), results under /tmp/costs/out; then costs-watch. The demo's trained models for the served check
    # arrive in a later call (costs-watch copies .gpu/served when carried).
    # ITEMS (after S): shapes and `served`, in order (measure_costs.py queue); default the first lease's order.
    # COSTS_GPUS=0,1,2,3: the items' engines side by side, one a GPU (measure_costs.py pool; no `served` item).
    export COSTS_ITEMS="${*:4}"; COSTS_ITEMS=${COSTS_ITEMS:-demo gpu-profile-1b served llama3-8b smollm2-135m}
    rm -rf /tmp/costs && mkdir -p /tmp/costs/out
    cp benchmarks/gpu/measure_costs.py benchmarks/gpu/scale_serve.py benchmarks/gpu/vllm_process.py /tmp/costs/
    gpu_line | tee /tmp/costs/out/gpu.txt; run_spec /tmp/costs/out
    PYTHONPATH=/tmp/vllm/site python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
      | tee /tmp/costs/out/versions.txt
    # the shapes' configs: a quantized shape's quantization_config comes from compressed-tensors (the quantize site)
    export COSTS_RUN="queue shapes out /tmp/served-input"; [ -n "${COSTS_GPUS:-}" ] && COSTS_RUN="pool shapes out $COSTS_GPUS"
    (cd /tmp/costs && PYTHONPATH=/tmp/qsite:/tmp/vllm/site python measure_costs.py shapes shapes && setsid bash -c \
      'PYTHONPATH=/tmp/vllm/site python measure_costs.py $COSTS_RUN $COSTS_ITEMS > run.log 2>&1; \
      echo $? > rc' < /dev/null > /dev/null 2>&1 &)
    sleep "${3:-60}"; bash "$0" costs-watch "$2" 1 ;;
  collect25) mkdir -p /tmp/stage25 && cp .gpu/q"$2"/* /tmp/stage25/ && ls /tmp/stage25 ;;
  install25)
    # vLLM 0.25.0's offline kit (REQ=.../requirements-vllm-0.25.0.txt build_bundle.sh, parts in .gpu/q0-q2) beside 0.26's
    (cd /tmp/stage25 && sha256sum -c --quiet SHA256SUMS)
    mkdir -p /tmp/vllm25 && cat /tmp/stage25/part* | xz -d | tar -C /tmp/vllm25 -xf -
    PYTHONPATH=/tmp/vllm25/site python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" ;;
  draft-cost-versions)
    # The draft model's serving cost on vLLM 0.25.0 and 0.26.0 in one lease (after install and install25):
    # measure_costs.py over the GPU profile's 1B shape and the demo's, plain decoding and draft_model at k = 2 and 8,
    # once per vLLM, in the background; then costs-watch (its run.log is the 0.26 run's).
    rm -rf /tmp/costs && mkdir -p /tmp/costs/out && cp benchmarks/gpu/measure_costs.py /tmp/costs/
    gpu_line | tee /tmp/costs/out/gpu.txt; run_spec /tmp/costs/out
    (cd /tmp/costs && python measure_costs.py shapes shapes && setsid bash -c 'for v in ${DCV_VERSIONS:-0.25.0 0.26.0}; do
        site=/tmp/vllm/site; [ $v = 0.25.0 ] && site=/tmp/vllm25/site
        PYTHONPATH=$site python -c "import vllm, torch; print(\"vllm\", vllm.__version__, \"torch\", torch.__version__)" \
          > out/versions-$v.txt 2>&1
        PYTHONPATH=$site python measure_costs.py run shapes out/vllm-$v ${DCV_ITEMS:-gpu-profile-1b:draft_model demo:draft_model} \
          > run-$v.log 2>&1; cp run-$v.log run.log; done; echo 0 > rc' < /dev/null > /dev/null 2>&1 &)
    sleep "${3:-60}"; bash "$0" costs-watch "$2" 1 ;;
  scale)
    out=$2; mkdir -p "$out" /tmp/scale; gpu_line > /tmp/scale/gpu.txt; nvidia-smi topo -m > /tmp/scale/topo.txt 2>&1 || true
    run_spec /tmp/scale "" scale
    rm -f /tmp/scale/rc; export SC_PLAN="${4:-benchmarks/gpu/plans/scale-70b.json}"
    # its own session: the call's process group is killed when the call returns, the run must outlive it
    tree=$(private_tree scale .gpu/scale/models)
    (cd "$tree" && setsid bash -c 'PYTHONPATH=/tmp/vllm/site python benchmarks/gpu/scale_serve.py run .gpu/scale/models \
       /tmp/scale/out "$SC_PLAN" >> /tmp/scale/run.log 2>&1; echo $? > /tmp/scale/rc' < /dev/null > /dev/null 2>&1 &)
    exec bash "$0" scale-watch "$2" "$3" ;;
  scale-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    while [ ! -f /tmp/scale/rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    tail -n 30 /tmp/scale/run.log | cut -c1-300 || true
    [ -f /tmp/scale/rc ] && echo "scale exit status: $(cat /tmp/scale/rc)" || echo "scale still running"
    brief_server_logs /tmp/scale/out
    tar czf "$out/scale.tgz" -C /tmp/scale --exclude='server.log' . ;;
  mixed8b)
    out=$2; mkdir -p "$out"
    if [ -f /tmp/mx/run.log ] && [ ! -f /tmp/mx/rc ]; then echo "mixed8b is running: session.sh mixed8b-watch OUT S"; exit 1; fi
    rm -rf /tmp/mx && mkdir -p /tmp/mx/out
    if [ -n "${4:-}" ]; then export CUDA_VISIBLE_DEVICES=$4; fi
    { gpu_line; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"; } > /tmp/mx/gpu.txt; run_spec /tmp/mx "" mixed8b
    # its own session: the call's process group is killed when the call returns, the run must outlive it
    tree=$(private_tree mixed8b artifacts/models/target)  # its tokenizer (mixed_serve.tokenizer_dir)
    (cd "$tree" && setsid bash -c 'PYTHONPATH=/tmp/qsite:/tmp/vllm/site:.:/tmp/dvcsite python benchmarks/gpu/mixed_serve.py \
        build /tmp/m8 /tmp/mx/out >> /tmp/mx/run.log 2>&1 && PYTHONPATH=/tmp/vllm/site:.:/tmp/dvcsite python \
        benchmarks/gpu/mixed_serve.py serve /tmp/m8 /tmp/mx/out >> /tmp/mx/run.log 2>&1; echo $? > /tmp/mx/rc' \
        < /dev/null > /dev/null 2>&1 &)
    exec bash "$0" mixed8b-watch "$2" "$3" ;;
  mixed8b-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    while [ ! -f /tmp/mx/rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    grep -E "RESULT|ERR|Error|layout|quantized|up in|c=" /tmp/mx/run.log | tail -n 30 | cut -c1-400 || true
    (cd /tmp/mx/out && grep -E "(Selected|Using) \w+Kernel" */server.log 2>/dev/null | cut -c1-250) || true
    [ -f /tmp/mx/rc ] && echo "mixed8b exit status: $(cat /tmp/mx/rc)" || echo "mixed8b still running"
    tar czf "$out/mixed8b.tgz" -C /tmp/mx . ;;
  tpeval)
    # Issue 50 items 4 and 5 on 2 GPUs (benchmarks/gpu/tp_eval.sh: distributed GPTQ of an 8B shape on 1 and 2 GPUs, its
    # fidelity through vLLM at TP 1 and 2, the demo target's against transformers) in its own session; then tpeval-watch
    out=$2; rm -rf /tmp/tpe && mkdir -p "$out" /tmp/tpe; gpu_line > /tmp/tpe/gpu.txt
    nvidia-smi topo -m > /tmp/tpe/topo.txt 2>&1 || true; run_spec /tmp/tpe "" tpeval
    tree=$(private_tree tpeval artifacts/models/target)
    (cd "$tree" && step_script /tmp/tpe bash benchmarks/gpu/tp_eval.sh)
    exec bash "$0" tpeval-watch "$2" "$3" ;;
  repro8b)
    # Issue 50 item 8 on 4 GPUs (benchmarks/gpu/repro8b.sh): the whole `dvc repro` at Llama-3-8B's shape (profiles/
    # gpu-8b.yaml over smollm2.yaml), then distributed GPTQ on 1, 2, 4 GPUs, in its own session; then repro8b-watch.
    # Carry .gpu/tok8b: SmolLM2's tokenizer.json, tokenizer_config.json and chat_template.jinja.
    out=$2; rm -rf /tmp/r8 && mkdir -p "$out" /tmp/r8/out; mkdir -p /tmp/r8tok && cp .gpu/tok8b/* /tmp/r8tok/
    # the target first: the profile's params are checked against it (/tmp/m8/bf16 reused where it exists)
    if [ ! -f /tmp/m8/bf16/config.json ]; then
      (W=/tmp/r8; . benchmarks/gpu/steps.sh; step make8b /tmp/qsite:/tmp/vllm/site:. \
        python benchmarks/gpu/run_gpu.py make8b /tmp/m8 /tmp/r8tok) || { tail -n 5 /tmp/r8/run.log; exit 1; }
    fi
    GP_BASE=smollm2 gp_setup gpu-8b
    gpu_line > /tmp/r8/gpu.txt; nvidia-smi topo -m > /tmp/r8/topo.txt 2>&1 || true; cp /tmp/gp/run.json /tmp/r8/
    (cd /tmp/gp && step_script /tmp/r8 bash benchmarks/gpu/repro8b.sh)
    exec bash "$0" repro8b-watch "$2" "$3" ;;
  scale-host)
    # Issue 50 items 4 and 8 on 4 GPUs beyond the 8B repro (benchmarks/gpu/scale_host.sh: distributed GPTQ on 1, 2, 4
    # GPUs; the 8B cost profile with drafts accepted; 70B-wide per-layer quantization times; FP8 at TP 4), in its own
    # session from a private tree; then scale-host-watch. Carry artifacts/data, .gpu/tok8b and artifacts/models/target
    # or only its tokenizer files as .gpu/demotok.
    step_dir /tmp/sh4 scale-host "$2"; nvidia-smi topo -m > /tmp/sh4/topo.txt 2>&1 || true
    tree=$(private_tree scale-host artifacts/models/target artifacts/data .gpu/tok8b .gpu/demotok)
    (cd "$tree" && step_script /tmp/sh4 bash benchmarks/gpu/scale_host.sh)
    exec bash "$0" scale-host-watch "$2" "$3" ;;
  scale-host-watch)
    out=$2; mkdir -p "$out"; wait_script /tmp/sh4 "$3"
    step_report /tmp/sh4 scale-host "ENGINE|BUILT|RESULT|Error" 12
    brief_server_logs /tmp/sh4/scale
    tar czf "$out/scale-host.tgz" -C /tmp/sh4 --exclude=ckpt --exclude=server.log . ;;
  repro8b-watch)
    out=$2; mkdir -p "$out"; wait_script /tmp/r8 "$3"
    tail -n 4 /tmp/r8/run.log 2>/dev/null | cut -c1-300
    step_report /tmp/r8 repro8b "Running stage|ERROR|Error|error:" 6
    cd /tmp/gp
    packed=$(ls -d params.yaml dvc.lock metrics plots artifacts/timings artifacts/eval artifacts/serve artifacts/gate \
        artifacts/publish artifacts/sources.json artifacts/eagle3/record.json 2>/dev/null || true)
    small=$(find artifacts/bundles -type f -size -1M 2>/dev/null || true)
    tar czf "$out/repro8b.tgz" --ignore-failed-read -C /tmp/r8 --exclude=ckpt . \
      -C /tmp/gp $( [ -n "$packed$small" ] && find $packed $small -type f -size -4096k 2>/dev/null ) 2>/dev/null || true
    ls -la "$out" ;;
  tpeval-watch)
    out=$2; mkdir -p "$out"; wait_script /tmp/tpe "$3"
    step_report /tmp/tpe tpeval " (RESULT|STEP|ERR)|Error" 12
    tar czf "$out/tpeval.tgz" -C /tmp/tpe --exclude=ckpt . ;;
  costs-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    if [ -f .gpu/served/prompts.json ] && [ ! -e /tmp/served-input ]; then
      mkdir -p /tmp/served-in.tmp && cp -r .gpu/served/target .gpu/served/draft .gpu/served/eagle3 /tmp/served-in.tmp/ \
        && cp .gpu/served/prompts.json /tmp/served-in.tmp/ && mv /tmp/served-in.tmp /tmp/served-input && echo "served input in"
    fi
    while [ ! -f /tmp/costs/rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    grep -E "^ENGINE|Error" /tmp/costs/run.log | tail -n 40 | cut -c1-300 || true
    [ -f /tmp/costs/rc ] && echo "costs exit status: $(cat /tmp/costs/rc)" || echo "costs still running"
    tar czf "$out/costs.tgz" -C /tmp/costs out $(cd /tmp/costs && ls run*.log) ;;
  gpu-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    while [ ! -f /tmp/gp-repro.rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    grep -v -E "it/s|s/it" /tmp/gp-repro.log | tail -n 30 | cut -c1-400 || true
    [ -f /tmp/gp-repro.rc ] && echo "repro exit status: $(cat /tmp/gp-repro.rc)" || echo "repro still running"
    cd /tmp/gp
    small=$(find artifacts/bundles -maxdepth 2 -type f -size -2M 2>/dev/null; find artifacts/bundles -path '*/deploy/*' -o -path '*/monitoring/*' 2>/dev/null || true)
    # Files of 4 MiB or more stay behind, listed with their sizes in gp-left-out.txt: a call returns files of at
    # most 16 MiB, and a lease's last pack once came back empty, over that size.
    packed=$(ls -d run.json dvc.lock metrics plots artifacts/timings artifacts/logs artifacts/eval artifacts/serve artifacts/gate \
        artifacts/publish artifacts/sources.json artifacts/distill artifacts/eagle3/record.json \
        artifacts/eagle3/model/config.json 2>/dev/null || true)
    : > /tmp/gp-left-out.txt; : > /tmp/gp-pack.list
    # find with no path would walk the whole workspace (early in a run none of them exists yet)
    if [ -n "$packed$small" ]; then
      find $packed -type f -size +4095k -printf '%s %p\n' > /tmp/gp-left-out.txt 2>/dev/null || true
      { find $packed $small -type f -size -4096k 2>/dev/null || true; } > /tmp/gp-pack.list
    fi
    [ -s /tmp/gp-left-out.txt ] && { echo "left out (bytes, path):"; cat /tmp/gp-left-out.txt; }
    tar czf "$out/gpu-profile.tgz" --ignore-failed-read -C /tmp gp-repro.log gp-gpu.txt gp-left-out.txt \
      $(cd /tmp && ls gp-repro.rc gp-calib.json 2>/dev/null) -C /tmp/gp params.yaml -T /tmp/gp-pack.list 2>/dev/null || true
    ls -la "$out" ;;
  shipped)
    out=$2 wait_s=$3; shift 3; mkdir -p "$out"
    rm -rf /tmp/sh && mkdir -p /tmp/sh/out && gpu_line | tee /tmp/sh/out/gpu.txt; run_spec /tmp/sh/out
    export SH_BUNDLES="$*" SH_ROOT; SH_ROOT=$(private_tree shipped artifacts/data/heldout.jsonl "$@")
    setsid bash -c 'cd "$SH_ROOT" && PYTHONPATH=/tmp/vllm/site:. python benchmarks/gpu/serve_shipped.py /tmp/sh/out \
        $SH_BUNDLES > /tmp/sh/run.log 2>&1; echo $? > /tmp/sh/rc' < /dev/null > /dev/null 2>&1 &
    sleep 20; bash "$0" shipped-watch "$out" "$wait_s" ;;
  shipped-watch)
    out=$2; deadline=$(( $(date +%s) + $3 )); mkdir -p "$out"
    while [ ! -f /tmp/sh/rc ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    grep -E "^RESULT|^CAPACITY|^ERR|Error" /tmp/sh/run.log | tail -n 40 | cut -c1-300 || true
    [ -f /tmp/sh/rc ] && echo "shipped exit status: $(cat /tmp/sh/rc)" || echo "shipped still running"
    tar czf "$out/shipped.tgz" -C /tmp/sh out run.log ;;
  tp-greedy)
    # written in /tmp/tp, packed into OUT/tp.tgz: a call brings back at most 8 files
    out=$2; w=/tmp/tp; rm -rf "$w"; mkdir -p "$out" "$w"; gpu_line > "$w/gpu.txt"; run_spec "$w"
    PYTHONPATH=/tmp/vllm/site:. timeout 480 python benchmarks/gpu/tp_greedy.py "$w" "$3" ${4:+--heldout "$4"} > "$w/run.log" 2>&1 || true
    grep -E "^RESULT|Error|error" "$w/run.log" | tail -n 5 | cut -c1-300 || true
    tar czf "$out/tp.tgz" -C "$w" . ;;
  handoff)
    out=$2 bundle=$3; mkdir -p "$out"
    out=$(cd "$out" && pwd)
    run_spec "$out"
    cd "$bundle"
    name=$(python3 -c "import json; print(json.load(open('engine_args.json'))['served_model_name'])")
    gpu_line > "$out/gpu.txt"
    # As the manifest runs it: from the bundle directory, its serve.env in the environment.
    env $(cat serve.env 2>/dev/null) PYTHONPATH=/tmp/vllm/site setsid python3 -m vllm.entrypoints.cli.main serve \
      --config serve.yaml --port 8000 > "$out/server.log" 2>&1 < /dev/null &
    start=$(date +%s)
    rc=0; python3 deploy/warmup.py --prompts deploy/warmup_prompts.jsonl --model "$name" --port 8000 \
      --marker "$out/warm-marker.json" --health-timeout 600 > "$out/warmup.txt" 2>&1 || rc=$?
    echo "exit status $rc, $(( $(date +%s) - start )) s after the server started" >> "$out/warmup.txt"
    scrape() { python3 -c "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())" > "$1"; }
    scrape "$out/metrics-before.txt"
    # Load: the warm-up prompts again, three rounds (the same client; 32 tokens each).
    for i in 1 2 3; do python3 deploy/warmup.py --prompts deploy/warmup_prompts.jsonl --model "$name" --port 8000 \
      --marker /tmp/load-$i.json --health-timeout 60 >> "$out/load.txt" 2>&1; done
    scrape "$out/metrics-after.txt"
    pkill -f "vllm.entrypoints.cli.main serve" || true
    cat "$out/warmup.txt"; wc -l "$out"/metrics-*.txt ;;
  cpu-raw)
    # Byte copies of what the stage wrote: metrics/eval-<v>.json and the acceptance estimate.
    for v in "${VARIANTS[@]}"; do
      cp metrics/eval-"$v".json benchmarks/gpu/raw/evaluate-stage/cpu-eval-"$v".json
      cp artifacts/eval/"$v"/speculative.json benchmarks/gpu/raw/evaluate-stage/cpu-estimate-"$v".json
    done ;;
  gate-raw)
    # The gate as the pipeline runs it, on the metrics the GPU run of the evaluate stage wrote.
    raw=benchmarks/gpu/raw/evaluate-stage dir=$(mktemp -d)
    for v in "${VARIANTS[@]}"; do
      python -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"], indent=2))' \
        "$raw/stage-evaluate-$v.json" > "$dir/eval-$v.json"
    done
    { echo '$ modelprep gate --metrics-dir <eval-*.json from the GPU run of the evaluate stage>'
      rc=0; PYTHONPATH=. python -c "import sys; from pipeline.cli import main; sys.exit(main())" \
        gate --metrics-dir "$dir" 2>&1 || rc=$?
      echo "exit status: $rc"; } > "$raw/gate-on-gpu-metrics.txt"
    cat "$raw/gate-on-gpu-metrics.txt" ;;
  gate-profile)
    # What the gate ships from a GPU-profile run's own eval and serve metrics, under that run's params.yaml (a CPU
    # step: the same gate code as the stage). RAW: the run's folder under benchmarks/gpu/raw (default gpu-profile).
    name=${2:-gpu-profile}; raw=benchmarks/gpu/raw/$name
    { echo "\$ modelprep gate --metrics-dir raw/$name/metrics --params raw/$name/params.yaml"
      rc=0; PYTHONPATH=. python -c "import sys; from pipeline.cli import main; sys.exit(main())" \
        gate --metrics-dir "$raw/metrics" --params "$raw/params.yaml" 2>&1 || rc=$?
      echo "exit status: $rc"; } > "$raw/gate.txt"
    cat "$raw/gate.txt" ;;
  *) echo "usage: session.sh pip-install | collect N | install | demo OUT | evaluate OUT VARIANT... | test | serve-bench OUT VARIANT... | gpu-profile OUT SECONDS | gpu-watch OUT SECONDS | cpu-raw | gate-raw | gate-profile [RAW]" >&2
     exit 2 ;;
esac
