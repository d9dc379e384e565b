"""Stage `evaluate@<variant>`: quality vs. the unquantized target, lm-eval, speculative acceptance."""
from pathlib import Path

from pipeline import acceptance, lmeval, quality, records, vllm_spec
from pipeline.config import enabled_variant, load_params, variant_argument
from pipeline.data import read_split
from pipeline.formatting import prompt_and_response_ids, prompt_ids, split_prompt_response
from pipeline.io import atomic_dir, write_csv, write_json
from pipeline.loading import load_causal_lm, load_tokenizer
from pipeline.served_draft import MODEL
from pipeline.stage import say, stage_main
from pipeline.vllm_spec import VllmMeasurement

TARGET, DRAFT = Path("artifacts/models/target"), MODEL


def gpu_measurement(variant_dir: Path, prompts: list[list[int]], k: int, p: dict) -> VllmMeasurement:
    cfg = p["evaluate"]["vllm"]
    reason = vllm_spec.skip_reason(cfg["enabled"], "evaluate.vllm.enabled")
    if reason:
        return VllmMeasurement(skipped=reason)
    return VllmMeasurement.from_measure(vllm_spec.measure(
        str(variant_dir.resolve()), str(DRAFT.resolve()), prompts[: cfg["prompts"]], k, cfg["max_tokens"],
        p["evaluate"]["acceptance"]["temperature"], cfg["gpu_memory_utilization"], p["serving"]["max_model_len"],
        batch_sizes=tuple(cfg["throughput_batch_sizes"]), enforce_eager=cfg["enforce_eager"]))


def summarize(variant: str, fidelity: dict, spec: acceptance.SpeculativeEstimate, lm_eval: dict,
              gpu: VllmMeasurement) -> dict:
    """The flat metrics file `dvc metrics` and the gates read: one name per quantity."""
    summary = {"variant": variant, **fidelity,
               "token_acceptance": spec.token_acceptance,
               "accepted_per_draft_token": spec.accepted_per_draft_token,
               "num_speculative_tokens": spec.num_speculative_tokens,
               "expected_speedup": spec.expected_speedup,
               **{f"lm_eval_{t}_{k}": v for t, s in lm_eval["scores"].items() for k, v in s.items()}}
    if gpu.skipped is None:
        summary["vllm_accepted_per_draft_token"] = gpu.accepted_per_draft_token
        if "bs1" in gpu.speculative_speedup:  # measured only with evaluate.vllm.throughput_batch_sizes
            summary["vllm_speculative_speedup"] = gpu.speculative_speedup["bs1"]
    return summary


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "evaluate")
    p = load_params()
    enabled_variant(p, variant)
    cfg = p["evaluate"]
    variant_dir = Path("artifacts/quantized") / variant
    tokenizer = load_tokenizer(TARGET)
    heldout = read_split("artifacts/data/heldout.jsonl")[: cfg["heldout_limit"]]
    baseline, model, draft = load_causal_lm(TARGET), load_causal_lm(variant_dir), load_causal_lm(DRAFT)

    examples = [prompt_and_response_ids(tokenizer, m) for m in heldout]
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in heldout]
    fidelity = quality.fidelity(baseline, model, examples)
    fidelity["greedy_match"] = quality.greedy_match(baseline, model, prompts[: cfg["greedy_prompts"]],
                                                    cfg["greedy_tokens"], tokenizer.eos_token_id)
    acc_cfg = cfg["acceptance"]
    spec = acceptance.estimate(model, draft, prompts[: acc_cfg["prompts"]], acc_cfg["continuation_tokens"],
                               acc_cfg["temperature"], acc_cfg["max_k"],
                               acceptance.resolve_cost_ratio(acc_cfg["cost_ratio"], variant_dir, DRAFT))
    del baseline, model, draft  # free memory before lm-eval and vLLM load their own copies
    lm_eval = lmeval.run_tasks(variant_dir, cfg["lm_eval"]["tasks"], cfg["lm_eval"]["limit"],
                               vllm_args={"gpu_memory_utilization": cfg["vllm"]["gpu_memory_utilization"],
                                          "max_model_len": p["serving"]["max_model_len"]})
    gpu = gpu_measurement(variant_dir, prompts, spec.num_speculative_tokens, p)

    summary = summarize(variant, fidelity, spec, lm_eval, gpu)
    with atomic_dir(Path("artifacts/eval") / variant) as tmp:
        write_json(tmp / "quality.json", fidelity)
        records.write(tmp / "speculative.json", spec)
        write_json(tmp / "lm_eval.json", lm_eval)
        records.write(tmp / "vllm.json", gpu)
        write_json(tmp / "summary.json", summary)
    write_json(f"metrics/eval-{variant}.json", summary)
    write_csv(f"plots/acceptance-{variant}.csv",
              [{"position": i + 1, "accepted": a} for i, a in enumerate(spec.accepted_per_position)])
    say(f"evaluate {variant}: ppl {fidelity['perplexity_increase_pct']:+.2f}%, KL {fidelity['kl_divergence']:.4f}, "
        f"top-1 {fidelity['top1_agreement']:.3f}, accepted/draft token {spec.accepted_per_draft_token:.3f} at "
        f"k={spec.num_speculative_tokens} (token acceptance {spec.token_acceptance:.3f}); vLLM: "
        + (f"skipped ({gpu.skipped})" if gpu.skipped else f"accepted/draft token {gpu.accepted_per_draft_token:.3f}"))


if __name__ == "__main__":
    main()
