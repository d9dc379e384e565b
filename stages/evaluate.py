"""Stage `evaluate@<variant>`: quality vs. the unquantized target, lm-eval, speculative acceptance."""
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths, records
from pipeline.core.io import atomic_dir, write_csv, write_json
from pipeline.core.stage import say, stage_main
from pipeline.data.formatting import prompt_and_response_ids
from pipeline.data.traffic import read_split
from pipeline.drafts import eagle3, methods, ngram
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate import acceptance, functional, lmeval, quality, serving_costs, vllm_spec
from pipeline.evaluate.settings import EvaluateParams
from pipeline.evaluate.summary import (
    EvalSummary,
    Functional,
    MethodEstimate,
    OfflineVllm,
    PredictedSpeedup,
    Quality,
    SpeculativeSummary,
)
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.hardware import scoped_env
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.serving.config import server_env
from pipeline.serving.parallelism import engine_serving, evaluate_tensor_parallel, serving_for
from pipeline.serving.settings import ServeBenchParams, ServingParams
from pipeline.serving.tiers import parse_tiers


@dataclass(frozen=True)
class Settings:
    """What evaluate reads of params.yaml, typed."""
    evaluate: EvaluateParams
    draft: DraftParams
    serving: ServingParams
    bench: ServeBenchParams  # its sweep's concurrencies are predicted too

    @classmethod
    def of(cls, params: Mapping) -> "Settings":
        return cls(parse_section(params, EvaluateParams), parse_section(params, DraftParams),
                   parse_section(params, ServingParams), parse_section(params, ServeBenchParams))


def continuations(run: Settings, model, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """The variant's own continuations of the acceptance prompts (acceptance.target_continuations): the same for
    every method, so written once per stage (the stage's largest cost per method before: one greedy generation per
    prompt and method)."""
    cfg = run.evaluate.acceptance
    return acceptance.target_continuations(model, prompts[: cfg.prompts], cfg.continuation_tokens, cfg.temperature,
                                           cfg.max_k)


def method_estimates(run: Settings, model, variant_dir: Path, prompts: list[list[int]],
                     written: list[tuple[list[int], int]]) -> dict[str, acceptance.SpeculativeEstimate]:
    """The CPU estimate of every requested method against this variant as the target (an EAGLE-3 head
    trained on the unquantized target reads the quantized one's hidden states here, as it would served), each
    scored on the same continuations `written`."""
    cfg = run.evaluate.acceptance
    args = (prompts[: cfg.prompts], cfg.continuation_tokens, cfg.temperature, cfg.max_k)
    out = {}
    for method in run.draft.method:
        if method == methods.DRAFT_MODEL:
            out[method] = acceptance.estimate(model, load_causal_lm(paths.DRAFT_MODEL), *args,
                                              acceptance.resolve_cost_ratio(cfg.cost_ratio, variant_dir,
                                                                            paths.DRAFT_MODEL),
                                              continuations=written)
        elif method == methods.EAGLE3:
            eagle3.check_compatible(paths.EAGLE3_MODEL, model.config.to_dict())
            head = eagle3.load(paths.EAGLE3_MODEL, model.device)
            features = eagle3.TargetFeatures(model, head.config.eagle_aux_hidden_state_layer_ids)
            out[method] = acceptance.estimate_method(model, eagle3.scorer(head, features, cfg.temperature), *args,
                                                     eagle3.cost_ratio(paths.EAGLE3_MODEL, variant_dir), method,
                                                     continuations=written)
        else:  # lookups in the token history cost no GPU weight reads
            lookup = run.draft.ngram
            out[method] = acceptance.estimate_method(
                model, ngram.scorer(model, cfg.temperature, lookup.prompt_lookup_min, lookup.prompt_lookup_max),
                *args, 0.0, method, continuations=written)
    return out


def served_concurrencies(run: Settings) -> list[int]:
    """Where served speed is predicted: the target concurrency, every tier's and the serving benchmark's sweep."""
    return sorted({run.serving.target_concurrency, *(t.concurrency for t in parse_tiers(run.serving)),
                   *run.bench.concurrency})


def with_predictions(run: Settings, estimates: dict[str, acceptance.SpeculativeEstimate], target_params: int
                     ) -> tuple[dict[str, acceptance.SpeculativeEstimate], serving_costs.Choice]:
    """Each method's estimate at the k predicted fastest as served at serving.target_concurrency, from the cost
    profile nearest this target (pipeline/evaluate/serving_costs.py); without one, no expected speedup at all."""
    serving = run.serving
    choice = serving_costs.choose(serving.speculation.cost_profile, serving.gpu, target_params)
    concurrencies = served_concurrencies(run)
    out = {}
    for method, est in estimates.items():
        prediction = serving_costs.predict(choice, method, est.tokens_per_step_by_k, est.drafted_per_step_by_k,
                                           concurrencies, est.steps_per_response_by_k)
        out[method] = acceptance.with_served_prediction(est, prediction, serving.target_concurrency)
    return out, choice


def best_method(estimates: dict[str, acceptance.SpeculativeEstimate]) -> str:
    """The method predicted fastest as served (the first requested when none has a prediction)."""
    return max(estimates,
               key=lambda m: -1.0 if estimates[m].expected_speedup is None else estimates[m].expected_speedup)


def gpu_measurement(variant_dir: Path, prompts: list[list[int]], k: int, run: Settings) -> VllmMeasurement:
    cfg, serving = run.evaluate.vllm, run.serving
    reason = vllm_spec.skip_reason(cfg.enabled, "evaluate.vllm.enabled", serving.tensor_parallel_size)
    if reason:
        return VllmMeasurement(skipped=reason)
    return VllmMeasurement.from_measure(vllm_spec.measure(
        str(variant_dir.resolve()), str(paths.DRAFT_MODEL.resolve()), prompts[: cfg.prompts], k, cfg.max_tokens,
        run.evaluate.acceptance.temperature, cfg.gpu_memory_utilization, serving.max_model_len,
        batch_sizes=cfg.throughput_batch_sizes, enforce_eager=cfg.enforce_eager,
        tensor_parallel_size=serving.tensor_parallel_size,
        draft_tensor_parallel_size=serving.speculation.draft_tensor_parallel_size))


def lm_eval_engine(run: Settings) -> dict:
    """lm-eval's vLLM engine settings: evaluate.vllm's memory share, sharded at least as served (run: the engines')."""
    return {"gpu_memory_utilization": run.evaluate.vllm.gpu_memory_utilization,
            "max_model_len": run.serving.max_model_len, "tensor_parallel_size": run.serving.tensor_parallel_size}


def summarize(variant: str, fidelity: dict, estimates: dict[str, acceptance.SpeculativeEstimate], method: str,
              lm_eval: dict, gpu: VllmMeasurement, works: Functional | None = None) -> EvalSummary:
    """The summary the gate, the bundle and `dvc metrics` read: the headline speculative numbers are `method`'s
    (the best by the estimate), then every method's."""
    spec = estimates[method]
    k = spec.num_speculative_tokens
    return EvalSummary(
        variant=variant, quality=Quality(**fidelity),
        speculation=SpeculativeSummary(
            method=method, token_acceptance=spec.token_acceptance,
            accepted_per_draft_token=spec.accepted_per_draft_token, num_speculative_tokens=k,
            # predicted served speedup at serving.target_concurrency (None: no cost profile applies), and at every
            # concurrency the bundle declares, at this k; the weight-bytes bound for reference only
            expected_speedup=spec.expected_speedup,
            cost_profile=spec.served.profile if spec.served else None, ideal_speedup=spec.ideal_speedup,
            predicted=([PredictedSpeedup(int(c), by_k[str(k)]) for c, by_k in spec.served.speedup_by_k.items()]
                       if spec.served else []),
            methods=[MethodEstimate(m, e.accepted_per_draft_token, e.num_speculative_tokens, e.expected_speedup)
                     for m, e in estimates.items()],
            vllm=(None if gpu.skipped is not None else  # bs1: measured only with evaluate.vllm.throughput_batch_sizes
                  OfflineVllm(gpu.accepted_per_draft_token, gpu.speculative_speedup.get("bs1")))),
        lm_eval={f"{task}_{metric}": v for task, scores in lm_eval["scores"].items() for metric, v in scores.items()},
        functional=works)


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "evaluate")
    p = load_params()
    # at the variant's own tensor parallelism (pipeline/serving/parallelism.py): its vLLM engines shard as served
    run = dataclasses.replace(Settings.of(p), serving=serving_for(variant, p))
    # its vLLM engines (lm-eval, the offline check) at evaluate.vllm's own memory share: at least the served TP, wider
    # where that share can't hold the variant there (pipeline/serving/parallelism.py evaluate_tp)
    engines = dataclasses.replace(run, serving=engine_serving(run.serving, evaluate_tensor_parallel(variant, p)))
    recipe = variant_spec(parse_section(p, QuantizeParams).variants, variant)
    cfg = run.evaluate
    lmeval.backend(engines.serving.tensor_parallel_size)  # too few GPUs for the engines: fail before any work
    variant_dir = paths.QUANTIZED / variant
    tokenizer = load_tokenizer(paths.TARGET)
    heldout = read_split(paths.HELDOUT)[: cfg.heldout_limit]
    tasks = functional.tasks_of(cfg.functional)  # a bad task file fails here, before any model loads
    baseline, model = load_causal_lm(paths.TARGET), load_causal_lm(variant_dir)
    target_params = baseline.num_parameters()  # the unquantized count: packed INT4 weights would undercount

    examples = [prompt_and_response_ids(tokenizer, m) for m in heldout]
    prompts = [prompt for prompt, _ in examples]  # prompt_and_response_ids tokenized them already
    fidelity = quality.fidelity(baseline, model, examples)
    written = continuations(run, model, prompts)
    fidelity["greedy_match"] = quality.greedy_match(
        baseline, model, prompts[: cfg.greedy_prompts], cfg.greedy_tokens, tokenizer.eos_token_id)
    works = None
    if tasks is not None:  # generated code runs only in the sandbox (pipeline/evaluate/sandbox.py)
        works, base_run, own_run = functional.measure(baseline, model, tokenizer, tasks, cfg.functional,
                                                      same_weights=recipe.algorithm == "none")
    estimates, profile = with_predictions(run, method_estimates(run, model, variant_dir, prompts, written),
                                          target_params)
    best = best_method(estimates)
    spec = estimates[best]
    # free memory before lm-eval and vLLM load their own copies; on CPU lm-eval scores the model loaded here, exactly
    # what a second load_causal_lm would give (float32 on CPU, decompressed), without loading it again
    del baseline
    if model.device.type != "cpu":
        model = None
    with scoped_env(server_env(recipe, run.serving)):  # vLLM's engines measure the kernels it ships with
        lm_eval = lmeval.run_tasks(variant_dir, list(cfg.lm_eval.tasks), cfg.lm_eval.limit,
                                   vllm_args=lm_eval_engine(engines), loaded=model)
        model = None
        draft = estimates.get(methods.DRAFT_MODEL)  # the offline vLLM check covers the draft model
        gpu = (gpu_measurement(variant_dir, prompts, draft.num_speculative_tokens, engines) if draft
               else VllmMeasurement(skipped=methods.not_requested(methods.DRAFT_MODEL)))

    summary = summarize(variant, fidelity, estimates, best, lm_eval, gpu, works)
    with atomic_dir(paths.EVAL / variant) as tmp:
        write_json(tmp / "quality.json", fidelity)
        records.write(tmp / "speculative.json", spec)  # the best method's
        for method, est in estimates.items():
            records.write(tmp / f"speculative-{method}.json", est)
        write_json(tmp / "lm_eval.json", lm_eval)
        records.write(tmp / "vllm.json", gpu)
        summary.write(tmp / "summary.json")
        if works is not None:  # each task's outcome and completion, the baseline's beside the variant's
            write_json(tmp / "functional.json", {"tasks_file": cfg.functional.tasks,
                                                 "sha256": functional.file_sha256(cfg.functional.tasks),
                                                 "baseline": dataclasses.asdict(base_run),
                                                 "variant": dataclasses.asdict(own_run)})
    write_json(f"metrics/eval-{variant}.json", summary.to_metrics())  # per-method detail in lists
    max_k = cfg.acceptance.max_k
    write_csv(f"plots/acceptance-{variant}.csv",  # the best method's curve, then each method's at its own k
              [{"position": j + 1,
                "accepted": spec.accepted_per_position[j] if j < len(spec.accepted_per_position) else None,
                **{m: e.accepted_per_position[j] if j < len(e.accepted_per_position) else None
                   for m, e in estimates.items()}} for j in range(max_k)])
    concurrency = run.serving.target_concurrency
    say(f"evaluate {variant}: ppl {fidelity['perplexity_increase_pct']:+.2f}%, KL {fidelity['kl_divergence']:.4f}, "
        f"top-1 {fidelity['top1_agreement']:.3f}; speculation, "
        + (f"predicted served speedup at concurrency {concurrency} ({profile.profile.name}): "
           + ", ".join(f"{m} x{e.expected_speedup:.2f} at k={e.num_speculative_tokens}" for m, e in estimates.items()
                       if e.expected_speedup is not None)
           if profile.profile else f"no served prediction ({profile.reason})")
        + f"; best {spec.method} accepted/draft token {spec.accepted_per_draft_token:.3f}; vLLM: "
        + (f"skipped ({gpu.skipped})" if gpu.skipped else f"accepted/draft token {gpu.accepted_per_draft_token:.3f}")
        + (f"; pass@1 {works.pass_at_1:.3f} vs {works.pass_at_1_baseline:.3f} unquantized over {works.tasks} tasks"
           if works else ""))


if __name__ == "__main__":
    main()
