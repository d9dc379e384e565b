"""Render benchmarks/gpu/RESULTS.md from the JSON files run_gpu.py wrote (benchmarks/gpu/raw/)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ["fp8-dynamic", "fp8-static", "gptq-w4a16", "awq-w4a16"]


def load(name: str) -> dict:
    return json.loads((HERE / "raw" / f"{name}.json").read_text())


def f(v, d=2):
    return "n/a" if v is None else f"{v:.{d}f}"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def main(header_text: str) -> str:
    bench = {m: load(f"bench8b-{m}") for m in ["bf16", "fp8-dynamic", "gptq-w4a16", "awq-w4a16"]}
    b1, b32 = bench["bf16"]["tokens_per_s_bs1"], bench["bf16"]["tokens_per_s_bs32"]
    speed = table(["model (Llama-3-8B shape)", "tok/s bs1", "x BF16", "tok/s bs32", "x BF16", "engine load s"],
                  [[m, f(r["tokens_per_s_bs1"], 0), f(r["tokens_per_s_bs1"] / b1), f(r["tokens_per_s_bs32"], 0),
                    f(r["tokens_per_s_bs32"] / b32), f(r["load_s"], 0)] for m, r in bench.items()])
    quant = table(["variant", "quantize wall s", "peak GPU MB", "size MB", "x smaller"],
                  [[v, f(q["wall_time_s"], 1), f(q["peak_memory_mb"], 0), f(q["size_after_mb"], 0),
                    f(q["compression_ratio"])] for v in ["fp8-dynamic", "gptq-w4a16", "awq-w4a16"]
                   for q in [load(f"quant8b-{v}")]])
    demo = {v: load(f"demo-{v}") for v in ["bf16", *VARIANTS]}
    spec_rows = []
    for v, r in demo.items():
        spec_rows.append([v, r["num_speculative_tokens"], f(r["baseline_tokens_per_s_bs1"], 0),
                          f(r["speculative_tokens_per_s_bs1"], 0), f(r["measured_speedup_bs1"]),
                          f(r["baseline_tokens_per_s_bs32"], 0), f(r["speculative_tokens_per_s_bs32"], 0),
                          f(r["measured_speedup_bs32"]), "yes" if r["spec_output_matches_baseline"] else "NO"])
    spec = table(["target", "k", "tok/s bs1", "+draft", "speedup", "tok/s bs32", "+draft", "speedup",
                  "greedy output identical"], spec_rows)
    acc_rows = []
    for v in VARIANTS:
        r = demo[v]
        cpu = r["cpu_estimate"]
        k = r["num_speculative_tokens"]
        acc_rows.append([v, k, f(r["acceptance_rate"], 3), f(cpu["expected_accepted_tokens"] / k, 3),
                         f(r["mean_accepted_tokens"]), f(cpu["expected_accepted_tokens"]),
                         " / ".join(f(a) for a in r["accepted_per_position"]),
                         " / ".join(f(a) for a in cpu["accepted_per_position"])])
    acc = table(["target", "k", "vLLM accepted/drafted", "CPU estimate", "vLLM mean accepted", "CPU expected accepted",
                 "vLLM per position", "CPU per position"], acc_rows)
    gq = load("quality-gpu")
    agree = load("greedy-agreement")
    qual = table(["variant", "ppl increase %", "KL (baseline‖variant)", "top-1 agreement", "vLLM greedy token agreement"],
                 [[v, f(gq[v]["perplexity_increase_pct"], 3), f(gq[v]["kl_divergence"], 5), f(gq[v]["top1_agreement"], 4),
                   f(agree[v], 3)] for v in VARIANTS])
    serve = load("serve")
    return f"""{header_text}

## Decode speed at Llama-3-8B shapes (random weights; vLLM, CUDA graphs on)

Quantized on the GPU by the pipeline's own `pipeline.quantize.quantize_model` (64 calibration samples from
the demo traffic), then served by vLLM with 128-token prompts and 128 generated tokens (ignore_eos).

{speed}

Quantization of the 8B-shape checkpoint (wall time of llm-compressor's oneshot; saving excluded):

{quant}

## The demo pipeline's bundles in vLLM: speculative decoding with the fine-tuned draft

64 held-out prompts, greedy, 32 new tokens; `k` is the pipeline's chosen `num_speculative_tokens`
(the BF16 row uses k=4). Engines run with `enforce_eager` (tiny models; ten engine starts per call).

{spec}

Acceptance: vLLM's counters (`vllm:spec_decode_*` from `LLM.get_metrics()`) vs. the pipeline's CPU
estimate (24 held-out prompts, 32-token target continuations) for the same draft and target:

{acc}

## Quality of each variant vs. BF16 on the GPU (the pipeline's own scorer, 64 held-out conversations)

{qual}

## `vllm serve --config serve.yaml` from a bundle

Bundle `gptq-w4a16`; started in {f(serve.get('startup_s'), 0)} s; answered a chat request: ok = {serve['ok']}.

```yaml
{serve['serve_yaml'].rstrip()}
```

Reply to "How do I rotate an API key in Nimbus Storage?": "{serve.get('reply', serve.get('error'))}"
"""


if __name__ == "__main__":
    header = (HERE / "header.md").read_text()
    (HERE / "RESULTS.md").write_text(main(header))
    print((HERE / "RESULTS.md").read_text())
