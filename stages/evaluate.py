"""Stage `evaluate@<variant>`: quality vs. the unquantized target, lm-eval, speculative acceptance."""
import sys
from pathlib import Path

from pipeline import acceptance, lmeval, quality, vllm_spec
from pipeline.config import enabled_variant, load_params, one_line_errors, variant_argument
from pipeline.errors import PipelineError
from pipeline.data import read_split
from pipeline.draft import served_draft
from pipeline.formatting import prompt_and_response_ids, prompt_ids, split_prompt_response
from pipeline.io import atomic_dir, write_csv, write_json
from pipeline.loading import load_causal_lm, load_tokenizer

TARGET, DRAFT = Path("artifacts/models/target"), served_draft("artifacts/draft")


def gpu_measurement(variant_dir: Path, prompts: list[list[int]], k: int, p: dict) -> dict:
    cfg = p["evaluate"]["vllm"]
    if cfg["enabled"] not in (True, False, "auto"):
        raise PipelineError(f"evaluate.vllm.enabled must be auto, true or false, got {cfg['enabled']!r}")
    reason = "disabled in params (evaluate.vllm.enabled)" if cfg["enabled"] is False else vllm_spec.unavailable_reason()
    if reason and cfg["enabled"] is True:
        raise PipelineError(f"evaluate.vllm.enabled is true but the GPU path cannot run: {reason}")
    if reason:
        print(f"evaluate: vLLM measurement skipped: {reason}")
        return {"skipped": reason}
    return vllm_spec.measure(str(variant_dir.resolve()), str(DRAFT.resolve()), prompts[: cfg["prompts"]], k,
                             cfg["max_tokens"], p["evaluate"]["acceptance"]["temperature"],
                             cfg["gpu_memory_utilization"], p["serving"]["max_model_len"])


@one_line_errors
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
    metrics = quality.fidelity(baseline, model, examples)
    metrics["greedy_match"] = quality.greedy_match(baseline, model, prompts[: cfg["greedy_prompts"]],
                                                   cfg["greedy_tokens"], tokenizer.eos_token_id)
    acc_cfg = cfg["acceptance"]
    spec = acceptance.estimate(model, draft, prompts[: acc_cfg["prompts"]], acc_cfg["continuation_tokens"],
                               acc_cfg["temperature"], acc_cfg["max_k"],
                               acceptance.resolve_cost_ratio(acc_cfg["cost_ratio"], variant_dir, DRAFT))
    del baseline, model, draft  # free memory before lm-eval and vLLM load their own copies
    lm_eval = lmeval.run_tasks(variant_dir, cfg["lm_eval"]["tasks"], cfg["lm_eval"]["limit"],
                               vllm_args={"gpu_memory_utilization": cfg["vllm"]["gpu_memory_utilization"],
                                          "max_model_len": p["serving"]["max_model_len"]})
    gpu = gpu_measurement(variant_dir, prompts, spec["num_speculative_tokens"], p)

    summary = {"variant": variant, **metrics,
               "acceptance_rate": spec["acceptance_rate"],
               "num_speculative_tokens": spec["num_speculative_tokens"],
               "expected_speedup": spec["expected_speedup"],
               **{f"lm_eval_{t}_{k}": v for t, s in lm_eval["scores"].items() for k, v in s.items()}}
    if "acceptance_rate" in gpu:
        summary["vllm_acceptance_rate"] = gpu["acceptance_rate"]
        summary["measured_speedup"] = gpu.get("measured_speedup_bs1")
    with atomic_dir(Path("artifacts/eval") / variant) as tmp:
        write_json(tmp / "quality.json", metrics)
        write_json(tmp / "speculative.json", spec)
        write_json(tmp / "lm_eval.json", lm_eval)
        write_json(tmp / "vllm.json", gpu)
        write_json(tmp / "summary.json", summary)
    write_json(f"metrics/eval-{variant}.json", summary)
    write_csv(f"plots/acceptance-{variant}.csv",
              [{"position": i + 1, "acceptance": a} for i, a in enumerate(spec["accepted_per_position"])])
    print(f"evaluate {variant}: ppl +{metrics['perplexity_increase_pct']:.2f}%, KL {metrics['kl_divergence']:.4f}, "
          f"top-1 {metrics['top1_agreement']:.3f}, acceptance {spec['acceptance_rate']:.3f}, "
          f"k={spec['num_speculative_tokens']}")


if __name__ == "__main__":
    main(sys.argv[1:])
