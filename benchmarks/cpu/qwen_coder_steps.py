"""Issue #45 item 3: single steps of the qwen-coder profile's stages on this CPU, measured once each, so its sizes
can be cut to an expected whole-`dvc repro` time without running it (the machine is shared). Each step runs in its
own child process (its own peak RSS), with 2 torch threads, on the converted checkpoints in $MODELPREP_CACHE
(`python benchmarks/cpu/qwen_coder_sources.py fetch ...` first).

    . .venv/bin/activate && python benchmarks/cpu/qwen_coder_steps.py train      # 0.5B forward+backward+AdamW
    python benchmarks/cpu/qwen_coder_steps.py forward    # 1.5B teacher-forced forward, and greedy decode steps
    python benchmarks/cpu/qwen_coder_steps.py gptq       # GPTQ W4A16 of the 1.5B's first 2 decoder layers

writes (merging) benchmarks/cpu/raw/qwen-coder/steps.json.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/cpu/raw/qwen-coder/steps.json"
SEQ, BATCH = 256, 4  # draft training rows: a prompt and its distilled answer (about 256 tokens), per step
TRAFFIC = "data/python-docs/traffic.jsonl"

COMMON = """
import json, sys, time, torch
torch.set_num_threads(2)
torch.manual_seed(0)
from pipeline.models.gguf_source import converted
def model_dir(source): return converted(source, "target").path
CPU = {}  # per timed call: CPU seconds of this process (both threads), less disturbed than wall by other jobs
def timed(fn, reps, name=None):
    fn()  # warm-up (allocations, kernels)
    out, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append(round(time.perf_counter() - t0, 2)); cpu.append(round(time.process_time() - c0, 2))
    CPU[name or len(CPU)] = cpu
    return out
"""

TRAIN = (
    COMMON
    + """
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(model_dir("qwen2.5-coder-0.5b"), dtype=torch.float32)  # as finetune.py
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, 150000, (int(sys.argv[1]), int(sys.argv[2])))
def step():
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad()
s = timed(step, 2, "step")
print(json.dumps({"what": "qwen2.5-coder-0.5b forward+backward+AdamW, float32", "batch": ids.shape[0],
                  "seq": ids.shape[1], "step_s": s, "step_cpu_s": CPU["step"], \
"parameters": sum(p.numel() for p in model.parameters())}))
"""
)

FORWARD = (
    COMMON
    + """
from transformers import AutoModelForCausalLM
from pipeline.models.loading import eval_dtype
dtype = eval_dtype(torch.device("cpu"))
model = AutoModelForCausalLM.from_pretrained(model_dir("qwen2.5-coder-1.5b"), dtype=dtype).eval()
seq = int(sys.argv[2])
ids = torch.randint(0, 150000, (1, seq))
with torch.no_grad():
    fwd = timed(lambda: model(input_ids=ids), 2, "forward")
    batch = torch.randint(0, 150000, (int(sys.argv[1]), 128))
    new = 16
    gen = timed(lambda: model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False), 1, "generate")
print(json.dumps({"what": "qwen2.5-coder-1.5b", "dtype": str(dtype), "forward_seq": seq, "forward_s": fwd, \
"forward_cpu_s": CPU["forward"],
                  "generate_batch": batch.shape[0], "generate_prompt": 128, "generate_new_tokens": new,
                  "generate_s": gen, "generate_cpu_s": CPU["generate"], \
"parameters": sum(p.numel() for p in model.parameters())}))
"""
)

GPTQ = (
    COMMON
    + """
import json as _j, tempfile
from pathlib import Path
from pipeline.models.layer_draft import build_layer_draft
from pipeline.quantize.oneshot import quantize_model
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import Calibration
from pipeline.params.load import read_yaml_mapping
params = read_yaml_mapping(Path("params.yaml"))
layers, samples, seq = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rows = [_j.loads(l) for l in open(sys.argv[4])][:samples]
texts = ["\\n".join(m["content"] for m in r["messages"]) if "messages" in r else r["prompt"] + "\\n" + r["response"]
         for r in rows]
with tempfile.TemporaryDirectory() as tmp:
    cut = Path(tmp) / "cut"
    build_layer_draft(model_dir("qwen2.5-coder-1.5b"), cut, layers)
    cfg = Calibration.parse({**params["quantize"]["calibration"], "num_samples": samples, "max_seq_length": seq})
    spec = variant_spec(params["quantize"]["variants"], "gptq-w4a16")
    t0, c0 = time.perf_counter(), time.process_time()
    m = quantize_model(cut, Path(tmp) / "out", spec, texts, cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"what": f"gptq-w4a16 (group {spec.group_size}) of qwen2.5-coder-1.5b's first {layers} decoder layers",
                  "layers": layers, "samples": samples, "max_seq_length": seq, "wall_s": round(wall, 1),
                  "cpu_s": round(cpu, 1), "oneshot_s": m["oneshot_time_s"]}))
"""
)

STEPS = {
    "train": (TRAIN, [str(BATCH), str(SEQ)]),
    "forward": (FORWARD, ["8", str(SEQ)]),
    "gptq": (GPTQ, ["2", "16", str(SEQ), TRAFFIC]),
}


def main(argv: list[str]) -> None:
    if len(argv) != 1 or argv[0] not in STEPS:
        sys.exit(__doc__)
    code, args = STEPS[argv[0]]
    load = os.getloadavg()[0]  # other jobs share this machine: wall times are only as good as this
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if r.returncode != 0:
        sys.exit(f"child failed:\n{r.stderr[-4000:]}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    result |= {
        "wall_total_s": round(time.time() - t0, 1),
        "loadavg_start": load,
        "loadavg_end": os.getloadavg()[0],
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2),
    }
    record = json.loads(OUT.read_text()) if OUT.is_file() else {}
    record[argv[0]] = result
    record["cpus"] = os.cpu_count()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
