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
    stage = {v: load(f"stage-evaluate-{v}") for v in VARIANTS}
    cpu = {v: load(f"cpu-eval-{v}") for v in VARIANTS}
    schedule = {v: load(f"cpu-estimate-{v}") for v in VARIANTS}  # the estimator after the schedule fix
    stage_rows = []
    for v, r in stage.items():
        g, sp = r["vllm"], r["speculative"]
        stage_rows.append([v, r["lm_eval"]["backend"], f(r["summary"]["lm_eval_domain_heldout_byte_perplexity"], 4),
                           f(cpu[v]["lm_eval_domain_heldout_byte_perplexity"], 4), g["num_speculative_tokens"],
                           f(g["acceptance_rate"], 3), f(schedule[v]["accepted_per_draft_token"], 3),
                           f(sp["accepted_per_draft_token"], 3),
                           f(g["baseline_tokens_per_s_bs1"], 0), f(g["speculative_tokens_per_s_bs1"], 0),
                           f(g["measured_speedup_bs1"]), f(g["measured_speedup_bs32"]), r["stage_wall_s"]])
    stage_table = table(["variant", "lm-eval backend", "byte ppl (GPU, vllm)", "byte ppl (CPU, hf)", "k",
                         "vLLM accepted/drafted", "CPU estimate", "CPU estimate, every-position drafts (before)",
                         "tok/s bs1", "+draft", "speedup bs1",
                         "speedup bs32", "stage wall s"], stage_rows)
    per_pos = table(["variant", "vLLM accepted per position (k=8)", "CPU estimate per position"],
                    [[v, " / ".join(f(a) for a in r["vllm"]["accepted_per_position"]),
                      " / ".join(f(a) for a in schedule[v]["accepted_per_position"])] for v, r in stage.items()])
    eos = load("before-eos-fix/eos-diagnosis")
    before = {v: load(f"before-eos-fix/stage-evaluate-{v}") for v in VARIANTS}
    eos_table = table(["generation (gptq-w4a16 + draft, k=8, 64 prompts)", "mean tokens", "ended at EOS",
                       "vLLM accepted/drafted"],
                      [[label.replace("_", " "), f(r["mean_len"], 1), f"{r['finished_eos']}/64", f(r["acceptance_rate"], 3)]
                       for label, r in eos.items()])
    fix_table = table(["variant", "vLLM accepted/drafted, forced past EOS (before)", "stopping at EOS (after)"],
                      [[v, f(before[v]["vllm"]["acceptance_rate"], 3), f(stage[v]["vllm"]["acceptance_rate"], 3)]
                       for v in VARIANTS])
    sweep = {int(k): r for k, r in load("ksweep-gptq-w4a16").items()}
    base = sweep[0]
    sweep_table = table(["k", "vLLM accepted/drafted", "mean accepted", "tok/s bs1", "x no draft", "tok/s bs32",
                         "x no draft", "implied draft/target cost"],
                        [[k or "no draft", f(r.get("acceptance_rate"), 3), f(r.get("mean_accepted_tokens")),
                          f(r["tokens_per_s_bs1"], 0), f(r["tokens_per_s_bs1"] / base["tokens_per_s_bs1"]),
                          f(r["tokens_per_s_bs32"], 0), f(r["tokens_per_s_bs32"] / base["tokens_per_s_bs32"]),
                          f(((1 + r["mean_accepted_tokens"]) * base["tokens_per_s_bs1"] / r["tokens_per_s_bs1"] - 1) / k)
                          if k else ""]
                         for k, r in sweep.items()])
    gate_text = (HERE / "raw" / "gate-on-gpu-metrics.txt").read_text().rstrip()
    test_text = (HERE / "raw" / "test-gpu.txt").read_text().rstrip()
    return f"""{header_text}

## The pipeline's `evaluate` stage on the GPU

`python -m stages.evaluate <variant>` unchanged, on the carried demo artifacts: quality on the GPU, lm-eval through
its `vllm` backend, the CPU-style acceptance estimate, and the vLLM path (`pipeline.vllm_spec.measure`: 64 held-out
prompts, greedy, up to 96 tokens stopping at EOS, CUDA graphs on, the chosen `k`).

{stage_table}

{per_pos}

The CPU estimate of vLLM's accepted/drafted ratio is within 0.007 of the measurement for every variant. It
follows vLLM's drafting schedule (the next draft starts after the accepted tokens and the target's own); the
estimator the run started with put a draft at every position and read 0.01-0.03 low (the "before" column; on the
toy test pair 0.28 against 0.32 for a real speculative-decoding loop, which the schedule-aware estimate matches
exactly: `tests/test_acceptance.py`). The CPU estimates are from the same carried artifacts re-scored after the
fix on the CPU machine (commit in the header), 24 prompts against vLLM's 64. Speed
is another matter: with CUDA graphs a decode step of this 10M-parameter target is launch-bound, so a draft
step costs about as much as a target step, not the 0.21 that the weight-bytes cost model assumes
(`evaluate.acceptance.cost_ratio`). Speculation at k=8 is then slower than plain decoding, and the gate says so:
the same `eval-<variant>.json` files, gated with `modelprep gate --metrics-dir`:

```
{gate_text}
```

That is the gate doing its job on a toy pair. At real sizes decode is bandwidth-bound (the 8B-shape table below:
tokens/s at batch 1 track weight bytes), which is what the weight-bytes model assumes; speculation itself was not
measured at that size here. For a serving fleet, set `cost_ratio` to the ratio measured on its hardware. A k sweep
with the same engine settings (gptq-w4a16, one engine per k) shows how overhead-bound the toy pair is; the
no-draft rate of equal engines varied between 449 and 659 tokens/s across this session's starts, so read
ratios between rows as rough:

{sweep_table}

### Fixed by this run: stop at EOS

The first GPU run of the stage forced generation past EOS (`ignore_eos=True`, as the earlier benchmarks did) and
vLLM's acceptance came out at half the CPU estimate. Past EOS the target writes text it was never trained on,
which the draft cannot predict:

{eos_table}

Both the vLLM path and the CPU estimator now stop at EOS as a server does (the estimator scores k-1 tokens past it
for drafts that start near the end, as vLLM does):

{fix_table}

## Decode speed at Llama-3-8B shapes (random weights; vLLM, CUDA graphs on)

Quantized on the GPU by the pipeline's own `pipeline.quantize.quantize_model` (64 calibration samples from
the demo traffic), then served by vLLM with 128-token prompts and 128 generated tokens (ignore_eos).

{speed}

Quantization of the 8B-shape checkpoint (wall time of llm-compressor's oneshot; saving excluded):

{quant}

## The demo pipeline's bundles in vLLM: speculative decoding with the fine-tuned draft

64 held-out prompts, greedy, 32 new tokens forced (`ignore_eos`, before the EOS fix; most demo responses are
longer than 32 tokens, so this stays within them); `k` is the pipeline's chosen `num_speculative_tokens` (the BF16
row uses k=4). Engines run with `enforce_eager`: without CUDA graphs each step pays Python and launch overhead
per layer, which makes the 6-layer target's step far dearer than the 2-layer draft's, so speculation pays here,
unlike with CUDA graphs above.

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

## `tests/test_gpu.py` on the GPU

The GPU test (skipped in CI) on a freshly trained tiny demo pair, float32, eager, k = 3, 16 prompts: greedy
speculative output equals plain decoding, and vLLM's accepted/drafted ratio agrees with the CPU estimator at the same k.

```
{test_text}
```
"""


if __name__ == "__main__":
    header = (HERE / "header.md").read_text()
    (HERE / "RESULTS.md").write_text(main(header))
    print((HERE / "RESULTS.md").read_text())
