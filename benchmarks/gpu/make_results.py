"""Render benchmarks/gpu/RESULTS.md from the committed raw files in benchmarks/gpu/raw/ (no GPU, no vLLM).

README.md's table names the command that wrote each raw file. Every measured number in RESULTS.md is
computed here from those files, claims included ("within X", ranges); header.md is prose only (machines,
dates, commits). gpu_summary() returns the numbers the top-level README may quote, computed the same way.

    python benchmarks/gpu/make_results.py    # rewrites RESULTS.md
"""
from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
VARIANTS = ["fp8-dynamic", "fp8-static", "gptq-w4a16", "awq-w4a16"]
BENCH8B = ["bf16", "fp8-dynamic", "gptq-w4a16", "awq-w4a16"]
BYTE_PPL = "lm_eval_domain_heldout_byte_perplexity"


def load(name: str) -> dict:
    return json.loads((RAW / f"{name}.json").read_text())


def f(v, d=2):
    return "n/a" if v is None else f"{v:.{d}f}"


def span(values, d=2) -> str:
    """'lo-hi' of the values as printed (one number when they print alike)."""
    lo, hi = f(min(values), d), f(max(values), d)
    return lo if lo == hi else f"{lo}-{hi}"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def implied_draft_cost(r: dict) -> float:
    """Target steps that one drafted token costs, implied by a measured speedup at batch 1: a step with k
    drafts yields 1 + mean accepted tokens, so time per token = (1 + k*c) / (1 + accepted) target steps."""
    return ((1 + r["mean_accepted_tokens"]) * r["baseline_tokens_per_s_bs1"] / r["speculative_tokens_per_s_bs1"]
            - 1) / r["num_speculative_tokens"]


def gpu_test_line() -> dict:
    """The numbers tests/test_gpu.py printed (raw/test-gpu.txt)."""
    m = re.search(r"vLLM accepted/drafted ([\d.]+) per position \[([^\]]*)\]; CPU estimate ([\d.]+)",
                  (RAW / "test-gpu.txt").read_text())
    per_pos = [float(x) for x in m[2].split(",")]
    return {"vllm_accepted_per_drafted": float(m[1]), "cpu_estimate": float(m[3]), "k": len(per_pos)}


def gpu_summary() -> dict:
    """Numbers the top-level README may quote, all computed from raw/ (per-variant dicts; ranges as (lo, hi))."""
    bench = {m: load(f"bench8b-{m}") for m in BENCH8B}
    stage = {v: load(f"stage-evaluate-{v}") for v in VARIANTS}
    before = {v: load(f"before-eos-fix/stage-evaluate-{v}") for v in VARIANTS}
    schedule = {v: load(f"cpu-estimate-{v}") for v in VARIANTS}  # the estimator after the schedule fix
    cpu = {v: load(f"cpu-eval-{v}") for v in VARIANTS}
    demo = {v: load(f"demo-{v}") for v in ["bf16", *VARIANTS]}
    serve = load("serve")
    rng = lambda d: (min(d.values()), max(d.values()))  # noqa: E731
    vllm_acc = {v: r["vllm"]["acceptance_rate"] for v, r in stage.items()}
    s = {
        # Llama-3-8B shapes, random weights, CUDA graphs: decode tokens/s relative to BF16 in the same session.
        "bench8b_speedup_bs1": {m: bench[m]["tokens_per_s_bs1"] / bench["bf16"]["tokens_per_s_bs1"]
                                for m in BENCH8B[1:]},
        "bench8b_speedup_bs32": {m: bench[m]["tokens_per_s_bs32"] / bench["bf16"]["tokens_per_s_bs32"]
                                 for m in BENCH8B[1:]},
        "quant8b": {v: {k: q[k] for k in ("wall_time_s", "size_before_mb", "size_after_mb", "compression_ratio")}
                    for v in BENCH8B[1:] for q in [load(f"quant8b-{v}")]},
        # The evaluate stage on the GPU (toy pair, CUDA graphs, stopping at EOS).
        "vllm_accepted_per_drafted": vllm_acc,
        "cpu_estimate_accepted_per_drafted": {v: schedule[v]["accepted_per_draft_token"] for v in VARIANTS},
        "cpu_estimate_max_abs_diff": max(abs(schedule[v]["accepted_per_draft_token"] - vllm_acc[v]) for v in VARIANTS),
        "every_position_estimate_low_by": {v: vllm_acc[v] - stage[v]["speculative"]["accepted_per_draft_token"]
                                           for v in VARIANTS},
        "cpu_estimate_prompts": sorted({schedule[v]["prompts"] for v in VARIANTS}),
        "vllm_prompts": sorted({stage[v]["vllm"]["prompts"] for v in VARIANTS}),
        "stage_speedup_bs1": {v: r["vllm"]["measured_speedup_bs1"] for v, r in stage.items()},
        "stage_speedup_bs32": {v: r["vllm"]["measured_speedup_bs32"] for v, r in stage.items()},
        "implied_draft_cost": {v: implied_draft_cost(r["vllm"]) for v, r in stage.items()},
        "weight_bytes_cost_ratio": {v: schedule[v]["cost_ratio"] for v in VARIANTS},
        "byte_ppl_max_abs_diff_gpu_vs_cpu": max(abs(stage[v]["summary"][BYTE_PPL] - cpu[v][BYTE_PPL]) for v in VARIANTS),
        # The same stage before the EOS fix (generation forced past EOS).
        "before_eos_fix_vllm_accepted_per_drafted": {v: r["vllm"]["acceptance_rate"] for v, r in before.items()},
        "before_eos_fix_vllm_over_cpu_estimate": {v: r["vllm"]["acceptance_rate"]
                                                  / r["speculative"]["accepted_per_draft_token"]
                                                  for v, r in before.items()},
        # Demo bundles in vLLM with enforce_eager (no CUDA graphs), before the EOS fix.
        "demo_speedup_bs1": {v: r["measured_speedup_bs1"] for v, r in demo.items()},
        "demo_speedup_bs32": {v: r["measured_speedup_bs32"] for v, r in demo.items()},
        "speculative_output_identical": all(r["spec_output_matches_baseline"] for r in demo.values())
        and all(r["vllm"]["spec_output_matches_baseline"] for r in stage.values()),
        "serve_ok": serve["ok"],
        "serve_startup_s": serve.get("startup_s"),
        "gpu_test": gpu_test_line(),
    }
    for key in ("bench8b_speedup_bs1", "vllm_accepted_per_drafted", "stage_speedup_bs1", "implied_draft_cost",
                "weight_bytes_cost_ratio", "every_position_estimate_low_by", "before_eos_fix_vllm_over_cpu_estimate"):
        s[key + "_range"] = rng(s[key])
    s["demo_speedup_bs1_quantized_range"] = rng({v: s["demo_speedup_bs1"][v] for v in VARIANTS})
    return s


REFACTOR_VARIANTS = ["fp8-dynamic", "gptq-w4a16"]


def refactor_table() -> str:
    """The evaluate stage after the DVC-graph refactor (typed records, new metric names), on the GPU."""
    rows = []
    for v in REFACTOR_VARIANTS:
        r = load(f"after-graph-refactor/stage-evaluate-{v}")
        m, g = r["summary"], r["vllm"]
        rows.append([v, r["stage_wall_s"], f(m["perplexity_increase_pct"], 3), f(m["kl_divergence"], 5),
                     f(m["top1_agreement"], 4), g["num_speculative_tokens"], f(m["accepted_per_draft_token"], 3),
                     f(g["accepted_per_draft_token"], 3), f(abs(m["accepted_per_draft_token"] - g["accepted_per_draft_token"]), 3),
                     f(g["speculative_speedup"]["bs1"]), f(g["speculative_speedup"]["bs32"]),
                     "yes" if g["speculative_output_matches_baseline"] else "NO"])
    return table(["variant", "stage wall s", "ppl change %", "KL", "top-1", "k", "estimate accepted/draft token",
                  "vLLM accepted/draft token", "abs diff", "vLLM speedup bs1", "bs32", "greedy output identical"], rows)


def render() -> str:
    header_text = (HERE / "header.md").read_text()
    s = gpu_summary()
    bench = {m: load(f"bench8b-{m}") for m in BENCH8B}
    b1, b32 = bench["bf16"]["tokens_per_s_bs1"], bench["bf16"]["tokens_per_s_bs32"]
    speed = table(["model (Llama-3-8B shape)", "tok/s bs1", "x BF16", "tok/s bs32", "x BF16", "engine load s"],
                  [[m, f(r["tokens_per_s_bs1"], 0), f(r["tokens_per_s_bs1"] / b1), f(r["tokens_per_s_bs32"], 0),
                    f(r["tokens_per_s_bs32"] / b32), f(r["load_s"], 0)] for m, r in bench.items()])
    quant8b = {v: load(f"quant8b-{v}") for v in BENCH8B[1:]}
    quant = table(["variant", "calibration samples", "quantize wall s", "peak GPU MB", "size MB", "x smaller"],
                  [[v, q["calibration_samples"], f(q["wall_time_s"], 1), f(q["peak_memory_mb"], 0),
                    f(q["size_after_mb"], 0), f(q["compression_ratio"])] for v, q in quant8b.items()])
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
    demo_prompts = span([r["prompts"] for r in demo.values()], 0)
    demo_tokens = span([r["max_tokens"] for r in demo.values()], 0)
    gq = load("quality-gpu")
    agree = load("greedy-agreement")
    qual = table(["variant", "ppl increase %", "KL (baseline‖variant)", "top-1 agreement", "vLLM greedy token agreement"],
                 [[v, f(gq[v]["perplexity_increase_pct"], 3), f(gq[v]["kl_divergence"], 5), f(gq[v]["top1_agreement"], 4),
                   f(agree[v], 3)] for v in VARIANTS])
    quality_tokens = span([gq[v]["tokens"] for v in VARIANTS], 0)
    serve = load("serve")
    stage = {v: load(f"stage-evaluate-{v}") for v in VARIANTS}
    cpu = {v: load(f"cpu-eval-{v}") for v in VARIANTS}
    schedule = {v: load(f"cpu-estimate-{v}") for v in VARIANTS}
    stage_rows = []
    for v, r in stage.items():
        g, sp = r["vllm"], r["speculative"]
        stage_rows.append([v, r["lm_eval"]["backend"], f(r["summary"][BYTE_PPL], 4), f(cpu[v][BYTE_PPL], 4),
                           g["num_speculative_tokens"],
                           f(g["acceptance_rate"], 3), f(schedule[v]["accepted_per_draft_token"], 3),
                           f(sp["accepted_per_draft_token"], 3),
                           f(g["baseline_tokens_per_s_bs1"], 0), f(g["speculative_tokens_per_s_bs1"], 0),
                           f(g["measured_speedup_bs1"]), f(g["measured_speedup_bs32"]), r["stage_wall_s"]])
    stage_table = table(["variant", "lm-eval backend", "byte ppl (GPU, vllm)", "byte ppl (CPU, hf)", "k",
                         "vLLM accepted/drafted", "CPU estimate", "CPU estimate, every-position drafts (before)",
                         "tok/s bs1", "+draft", "speedup bs1",
                         "speedup bs32", "stage wall s"], stage_rows)
    per_pos = table(["variant", "vLLM accepted per position", "CPU estimate per position"],
                    [[v, " / ".join(f(a) for a in r["vllm"]["accepted_per_position"]),
                      " / ".join(f(a) for a in schedule[v]["accepted_per_position"])] for v, r in stage.items()])
    stage_k = span([r["vllm"]["num_speculative_tokens"] for r in stage.values()], 0)
    stage_prompts = span(s["vllm_prompts"], 0)
    stage_tokens = span([r["vllm"]["max_tokens"] for r in stage.values()], 0)
    before = {v: load(f"before-eos-fix/stage-evaluate-{v}") for v in VARIANTS}
    fix_table = table(["variant", "vLLM accepted/drafted, forced past EOS (before)", "CPU estimate in that run",
                       "vLLM, stopping at EOS (after)"],
                      [[v, f(before[v]["vllm"]["acceptance_rate"], 3),
                        f(before[v]["speculative"]["accepted_per_draft_token"], 3),
                        f(stage[v]["vllm"]["acceptance_rate"], 3)] for v in VARIANTS])
    gate_text = (RAW / "gate-on-gpu-metrics.txt").read_text().rstrip()
    test_text = (RAW / "test-gpu.txt").read_text().rstrip()
    return f"""{header_text}

## The `evaluate` stage after the DVC-graph refactor (commit ff4d3ac)

The same stage after the truthful-graph work (typed records, `accepted_per_draft_token` / `token_acceptance`,
library output to `artifacts/logs/`), on a fresh `dvc repro` of the demo carried to the H100 and run by
`session.sh evaluate`, one call per variant. The stage's acceptance estimator ran on the GPU here (in bf16), and
k is the one the stage chose from it.

{refactor_table()}

## The pipeline's `evaluate` stage on the GPU

`python -m stages.evaluate <variant>` unchanged, on the carried demo artifacts: quality on the GPU, lm-eval through
its `vllm` backend, the CPU-style acceptance estimate, and the vLLM path (`pipeline.vllm_spec.measure`: {stage_prompts}
held-out prompts, greedy, up to {stage_tokens} tokens stopping at EOS, CUDA graphs on, the chosen `k` = {stage_k}).

{stage_table}

{per_pos}

The CPU estimate of vLLM's accepted/drafted ratio is within {f(s['cpu_estimate_max_abs_diff'], 3)} of the measurement for every
variant (largest absolute difference). It follows vLLM's drafting schedule (the next draft starts after the
accepted tokens and the target's own); the estimator the run started with put a draft at every position and read
{span(s['every_position_estimate_low_by'].values(), 3)} low (the "before" column; `tests/test_acceptance.py` checks the schedule-aware estimate
against a real speculative-decoding loop). The CPU estimates are from the same carried artifacts re-scored after
the fix on the CPU machine (commit in the header), {span(s['cpu_estimate_prompts'], 0)} prompts against vLLM's {stage_prompts}. lm-eval's byte
perplexity through vLLM and through the CPU `hf` backend differ by at most {s['byte_ppl_max_abs_diff_gpu_vs_cpu']:.0e}.

Speed is another matter: with CUDA graphs a decode step of this tiny target is launch-bound. The measured batch-1
speedups ({span(s['stage_speedup_bs1'].values())}) imply that each drafted token costs {span(s['implied_draft_cost'].values(), 1)} target steps, all speculation
overhead included, not the {span(s['weight_bytes_cost_ratio'].values())} that the weight-bytes cost model assumes
(`evaluate.acceptance.cost_ratio`). Speculation at the chosen k is then slower than plain decoding, and the gate
says so: the same `eval-<variant>.json` files, gated with `modelprep gate --metrics-dir`:

```
{gate_text}
```

That is the gate doing its job on a toy pair. At real sizes decode is bandwidth-bound (the 8B-shape table below:
tokens/s at batch 1 track weight bytes), which is what the weight-bytes model assumes; speculation itself was not
measured at that size here. For a serving fleet, set `cost_ratio` to the ratio measured on its hardware.

### Fixed by this run: stop at EOS

The first GPU run of the stage forced generation past EOS (`ignore_eos=True`, as the earlier benchmarks did) and
vLLM's accepted/drafted ratio came out at {span(s['before_eos_fix_vllm_over_cpu_estimate'].values())} times the CPU estimate of the same run; the likely
reason is that past EOS the target writes text it was never trained on, which the draft cannot predict. Both the
vLLM path and the CPU estimator now stop at EOS as a server does (the estimator scores k-1 tokens past it for
drafts that start near the end, as vLLM does):

{fix_table}

## Decode speed at Llama-3-8B shapes (random weights; vLLM, CUDA graphs on)

Quantized on the GPU by the pipeline's own `pipeline.quantize.quantize_model` (calibration samples from the demo
traffic), then served by vLLM with the fixed synthetic prompts of `run_gpu.py bench8b` (greedy, `ignore_eos`).

{speed}

Quantization of the 8B-shape checkpoint (wall time of llm-compressor's oneshot; saving excluded):

{quant}

## The demo pipeline's bundles in vLLM: speculative decoding with the fine-tuned draft

{demo_prompts} held-out prompts, greedy, {demo_tokens} new tokens forced (`ignore_eos`, before the EOS fix); `k` is the pipeline's
chosen `num_speculative_tokens` (the BF16 row uses k={demo['bf16']['num_speculative_tokens']}). Engines run with `enforce_eager`: without CUDA
graphs each step pays Python and launch overhead per layer, which makes the deeper target's step far dearer than
the draft's; the quantized targets' batch-1 speedup is {span(s['demo_speedup_bs1_quantized_range'])} here, unlike with CUDA graphs above.

{spec}

Acceptance: vLLM's counters (`vllm:spec_decode_*` from `LLM.get_metrics()`) vs. the pipeline's CPU
estimate for the same draft and target (`artifacts/eval/<variant>/speculative.json` of the carried build):

{acc}

## Quality of each variant vs. BF16 on the GPU (the pipeline's own scorer, {quality_tokens} response tokens of held-out conversations)

{qual}

## `vllm serve --config serve.yaml` from a bundle

Bundle `gptq-w4a16`; started in {f(serve.get('startup_s'), 0)} s; answered a chat request: ok = {serve['ok']}.

```yaml
{serve['serve_yaml'].rstrip()}
```

Reply to "How do I rotate an API key in Nimbus Storage?": "{serve.get('reply', serve.get('error'))}"

## `tests/test_gpu.py` on the GPU

The GPU test (skipped in CI) on a freshly trained tiny demo pair (settings in the test): greedy speculative output
equals plain decoding, and vLLM's accepted/drafted ratio agrees with the CPU estimator at the same k
(k = {s['gpu_test']['k']}: {f(s['gpu_test']['vllm_accepted_per_drafted'], 3)} vs {f(s['gpu_test']['cpu_estimate'], 3)}).

```
{test_text}
```
"""


if __name__ == "__main__":
    (HERE / "RESULTS.md").write_text(render())
    print(f"wrote {HERE / 'RESULTS.md'}")
