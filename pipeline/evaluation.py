"""The evaluate stage's work (stages/evaluate.py wires it): fidelity to the unquantized target (transformers or vLLM,
pipeline/evaluate/backend.py), lm-eval, the CPU acceptance estimate of each speculative method with its served
prediction, vLLM's offline speculative check, and the files the stage writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths, records
from pipeline.core.io import atomic_dir, write_csv, write_json
from pipeline.core.stage import say
from pipeline.data.formatting import prompt_and_response_ids
from pipeline.data.traffic import read_split
from pipeline.drafts import eagle3, methods, ngram
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate import acceptance, backend, functional, lmeval, quality, serving_costs, vllm_fidelity, vllm_spec
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
from pipeline.params.load import parse_section
from pipeline.quantize.hardware import scoped_env
from pipeline.quantize.recipes import VariantSpec, variant_spec
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
        return cls(
            parse_section(params, EvaluateParams),
            parse_section(params, DraftParams),
            parse_section(params, ServingParams),
            parse_section(params, ServeBenchParams),
        )


def continuations(run: Settings, model, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """The variant's own continuations of the acceptance prompts (acceptance.target_continuations): the same for
    every method, so written once per stage (the stage's largest cost per method before: one greedy generation per
    prompt and method)."""
    cfg = run.evaluate.acceptance
    return acceptance.target_continuations(
        model, prompts[: cfg.prompts], cfg.continuation_tokens, cfg.temperature, cfg.max_k
    )


def method_estimates(
    run: Settings, model, variant_dir: Path, prompts: list[list[int]], written: list[tuple[list[int], int]]
) -> dict[str, acceptance.SpeculativeEstimate]:
    """The CPU estimate of every requested method against this variant as the target (an EAGLE-3 head
    trained on the unquantized target reads the quantized one's hidden states here, as it would served), each
    scored on the same continuations `written`."""
    cfg = run.evaluate.acceptance
    args = (prompts[: cfg.prompts], cfg.continuation_tokens, cfg.temperature, cfg.max_k)
    out = {}
    for method in run.draft.method:
        if method == methods.DRAFT_MODEL:
            out[method] = acceptance.estimate(
                model,
                load_causal_lm(paths.DRAFT_MODEL),
                *args,
                acceptance.resolve_cost_ratio(cfg.cost_ratio, variant_dir, paths.DRAFT_MODEL),
                continuations=written,
            )
        elif method == methods.EAGLE3:
            eagle3.check_compatible(paths.EAGLE3_MODEL, model.config.to_dict())
            head = eagle3.load(paths.EAGLE3_MODEL, model.device)
            features = eagle3.TargetFeatures(model, head.config.eagle_aux_hidden_state_layer_ids)
            out[method] = acceptance.estimate_method(
                model,
                eagle3.scorer(head, features, cfg.temperature),
                *args,
                eagle3.cost_ratio(paths.EAGLE3_MODEL, variant_dir),
                method,
                continuations=written,
            )
        else:  # lookups in the token history cost no GPU weight reads
            lookup = run.draft.ngram
            out[method] = acceptance.estimate_method(
                model,
                ngram.scorer(model, cfg.temperature, lookup.prompt_lookup_min, lookup.prompt_lookup_max),
                *args,
                0.0,
                method,
                continuations=written,
            )
    return out


def served_concurrencies(run: Settings) -> list[int]:
    """Where served speed is predicted: the target concurrency, every tier's and the serving benchmark's sweep."""
    return sorted(
        {run.serving.target_concurrency, *(t.concurrency for t in parse_tiers(run.serving)), *run.bench.concurrency}
    )


def with_predictions(
    run: Settings, estimates: dict[str, acceptance.SpeculativeEstimate], target_params: int
) -> tuple[dict[str, acceptance.SpeculativeEstimate], serving_costs.Choice]:
    """Each method's estimate at the k predicted fastest as served at serving.target_concurrency, from the cost
    profile nearest this target (pipeline/evaluate/serving_costs.py); without one, no expected speedup at all."""
    serving = run.serving
    choice = serving_costs.choose(serving.speculation.cost_profile, serving.gpu, target_params)
    concurrencies = served_concurrencies(run)
    out = {}
    for method, est in estimates.items():
        prediction = serving_costs.predict(
            choice,
            method,
            est.tokens_per_step_by_k,
            est.drafted_per_step_by_k,
            concurrencies,
            est.steps_per_response_by_k,
        )
        out[method] = acceptance.with_served_prediction(est, prediction, serving.target_concurrency)
    return out, choice


def best_method(estimates: dict[str, acceptance.SpeculativeEstimate]) -> str:
    """The method predicted fastest as served (the first requested when none has a prediction)."""
    return max(
        estimates, key=lambda m: -1.0 if estimates[m].expected_speedup is None else estimates[m].expected_speedup
    )


def gpu_measurement(variant_dir: Path, prompts: list[list[int]], k: int, run: Settings) -> VllmMeasurement:
    cfg, serving = run.evaluate.vllm, run.serving
    reason = vllm_spec.skip_reason(cfg.enabled, "evaluate.vllm.enabled", serving.tensor_parallel_size)
    if reason:
        return VllmMeasurement(skipped=reason)
    return VllmMeasurement.from_measure(
        vllm_spec.measure(
            str(variant_dir.resolve()),
            str(paths.DRAFT_MODEL.resolve()),
            prompts[: cfg.prompts],
            k,
            cfg.max_tokens,
            run.evaluate.acceptance.temperature,
            cfg.gpu_memory_utilization,
            serving.max_model_len,
            batch_sizes=cfg.throughput_batch_sizes,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=serving.tensor_parallel_size,
            draft_tensor_parallel_size=serving.speculation.draft_tensor_parallel_size,
        )
    )


def lm_eval_engine(run: Settings) -> dict:
    """lm-eval's vLLM engine settings: evaluate.vllm's memory share, sharded at least as served (run: the engines')."""
    return {
        "gpu_memory_utilization": run.evaluate.vllm.gpu_memory_utilization,
        "max_model_len": run.serving.max_model_len,
        "tensor_parallel_size": run.serving.tensor_parallel_size,
    }


def first_accepted(e: acceptance.SpeculativeEstimate) -> float | None:
    """The share of first drafted tokens accepted, from the estimate at k = 1 (None where k = 1 was not estimated)."""
    first = e.accepted_per_position_by_k.get("1") or []
    return first[0] if first else None


def summarize(
    variant: str,
    fidelity: dict,
    estimates: dict[str, acceptance.SpeculativeEstimate],
    method: str,
    lm_eval: dict,
    gpu: VllmMeasurement,
    works: Functional | None = None,
) -> EvalSummary:
    """The summary the gate, the bundle and `dvc metrics` read: the headline speculative numbers are `method`'s
    (the best by the estimate), then every method's."""
    spec = estimates[method]
    k = spec.num_speculative_tokens
    return EvalSummary(
        variant=variant,
        quality=Quality(**fidelity),
        speculation=SpeculativeSummary(
            method=method,
            token_acceptance=spec.token_acceptance,
            accepted_per_draft_token=spec.accepted_per_draft_token,
            num_speculative_tokens=k,
            # predicted served speedup at serving.target_concurrency (None: no cost profile applies), and at every
            # concurrency the bundle declares, at this k; the weight-bytes bound for reference only
            expected_speedup=spec.expected_speedup,
            cost_profile=spec.served.profile if spec.served else None,
            ideal_speedup=spec.ideal_speedup,
            predicted=(
                [PredictedSpeedup(int(c), by_k[str(k)]) for c, by_k in spec.served.speedup_by_k.items()]
                if spec.served
                else []
            ),
            methods=[
                MethodEstimate(
                    m, e.accepted_per_draft_token, e.num_speculative_tokens, e.expected_speedup, first_accepted(e)
                )
                for m, e in estimates.items()
            ],
            vllm=(
                None
                if gpu.skipped is not None
                # bs1: measured only with evaluate.vllm.throughput_batch_sizes
                else OfflineVllm(gpu.accepted_per_draft_token, gpu.speculative_speedup.get("bs1"))
            ),
        ),
        lm_eval={f"{task}_{metric}": v for task, scores in lm_eval["scores"].items() for metric, v in scores.items()},
        functional=works,
    )


@dataclass(frozen=True)
class Context:
    """One evaluate@<variant> run: its settings as served, the same at its evaluate engines' TP, its recipe, and
    where fidelity and lm-eval run."""

    variant: str
    run: Settings
    engines: Settings
    recipe: VariantSpec
    backends: backend.Backends

    @property
    def variant_dir(self) -> Path:
        return paths.QUANTIZED / self.variant


def configure(variant: str, p: Mapping) -> Context:
    """The run's settings; a backend that can't run here (or too few GPUs for its engines) fails here, before any
    work."""
    # at the variant's own tensor parallelism (pipeline/serving/parallelism.py): its vLLM engines shard as served
    run = dataclasses.replace(Settings.of(p), serving=serving_for(variant, p))
    # its vLLM engines (lm-eval, fidelity through vLLM, the offline check) at evaluate.vllm's own memory share: at
    # least the served TP, wider where that share can't hold the variant there (parallelism.py evaluate_tp)
    engines = dataclasses.replace(run, serving=engine_serving(run.serving, evaluate_tensor_parallel(variant, p)))
    recipe = variant_spec(parse_section(p, QuantizeParams).variants, variant)
    return Context(
        variant, run, engines, recipe, backend.resolve(run.evaluate.backend, engines.serving.tensor_parallel_size)
    )


@dataclass(frozen=True)
class Inputs:
    """The target's tokenizer, the held-out examples (prompt and response ids, tokenized once), their prompts, the
    functional tasks."""

    tokenizer: object
    examples: list[tuple[list[int], list[int]]]
    prompts: list[list[int]]
    tasks: list | None
    baseline_run: functional.PassAtOne | None  # the target's pass@1 on those tasks (stage functional_baseline)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id


def read_inputs(run: Settings) -> Inputs:
    cfg = run.evaluate
    tokenizer = load_tokenizer(paths.TARGET)
    heldout = read_split(paths.HELDOUT)[: cfg.heldout_limit]
    tasks = functional.tasks_of(cfg.functional)  # a bad task file fails here, before any model loads
    # and so does a baseline recorded for other tasks or settings
    base = None if tasks is None else functional.read_baseline(paths.FUNCTIONAL_BASELINE, cfg.functional)
    examples = [prompt_and_response_ids(tokenizer, m) for m in heldout]
    return Inputs(tokenizer, examples, [prompt for prompt, _ in examples], tasks, base)


@dataclass
class Measured:
    """What the stage measured, filled in as it goes."""

    fidelity: dict | None = None  # quality.fidelity's keys plus greedy_match
    estimator: dict | None = None  # how fidelity was computed where it is not transformers' exact pass
    estimates: dict[str, acceptance.SpeculativeEstimate] = dataclasses.field(default_factory=dict)
    profile: serving_costs.Choice | None = None
    best: str = ""
    works: Functional | None = None
    runs: tuple | None = None  # functional.measure's (baseline, variant) runs
    lm_eval: dict | None = None
    gpu: VllmMeasurement | None = None


def measure_loaded(ctx: Context, inputs: Inputs) -> tuple[Measured, object]:
    """Everything measured on the two models loaded in transformers (exact fidelity where the backend is
    transformers, the acceptance estimates, the functional check); returns the variant's model where lm-eval's hf
    model can reuse it on CPU (None on a GPU, freed before vLLM's engines load)."""
    run, cfg, out = ctx.run, ctx.run.evaluate, Measured()
    baseline, model = load_causal_lm(paths.TARGET), load_causal_lm(ctx.variant_dir)
    target_params = baseline.num_parameters()  # the unquantized count: packed INT4 weights would undercount
    if ctx.backends.fidelity == "transformers":
        out.fidelity = quality.fidelity(baseline, model, inputs.examples)
    written = continuations(run, model, inputs.prompts)
    if ctx.backends.fidelity == "transformers":
        out.fidelity["greedy_match"] = quality.greedy_match(
            baseline, model, inputs.prompts[: cfg.greedy_prompts], cfg.greedy_tokens, inputs.eos_token_id
        )
    if inputs.tasks is not None:  # generated code runs only in the sandbox (pipeline/evaluate/sandbox.py)
        works, base_run, own_run = functional.measure(
            inputs.baseline_run,
            model,
            inputs.tokenizer,
            inputs.tasks,
            cfg.functional,
            same_weights=ctx.recipe.algorithm == "none",
        )
        out.works, out.runs = works, (base_run, own_run)
    out.estimates, out.profile = with_predictions(
        run, method_estimates(run, model, ctx.variant_dir, inputs.prompts, written), target_params
    )
    out.best = best_method(out.estimates)
    # free memory before lm-eval and vLLM load their own copies; on CPU lm-eval scores the model loaded here, exactly
    # what a second load_causal_lm would give (float32 on CPU, decompressed), without loading it again
    del baseline
    return out, (model if model.device.type == "cpu" else None)


def fidelity_request(run: Settings, inputs: Inputs) -> vllm_fidelity.Request:
    cfg = run.evaluate
    return vllm_fidelity.Request(
        inputs.examples, inputs.prompts[: cfg.greedy_prompts], cfg.greedy_tokens, inputs.eos_token_id
    )


def measure_engines(ctx: Context, inputs: Inputs, out: Measured, model) -> None:
    """vLLM's engines (and lm-eval's hf model on CPU): fidelity where its backend is vllm, lm-eval, the offline
    speculative check; with the server's environment, so they measure the kernels vLLM ships with."""
    engines, cfg = ctx.engines, ctx.run.evaluate
    with scoped_env(server_env(ctx.recipe, ctx.run.serving)):
        if ctx.backends.fidelity == "vllm":
            engine = vllm_fidelity.Engine(
                engines.serving.tensor_parallel_size, cfg.vllm.gpu_memory_utilization, cfg.vllm.enforce_eager
            )
            out.fidelity, out.estimator = vllm_fidelity.fidelity(
                paths.TARGET, ctx.variant_dir, fidelity_request(ctx.run, inputs), engine
            )
        out.lm_eval = lmeval.run_tasks(
            ctx.variant_dir,
            list(cfg.lm_eval.tasks),
            cfg.lm_eval.limit,
            vllm_args=lm_eval_engine(engines),
            loaded=model,
            name=ctx.backends.lm_eval,
        )
        draft = out.estimates.get(methods.DRAFT_MODEL)  # the offline vLLM check covers the draft model
        out.gpu = (
            gpu_measurement(ctx.variant_dir, inputs.prompts, draft.num_speculative_tokens, engines)
            if draft
            else VllmMeasurement(skipped=methods.not_requested(methods.DRAFT_MODEL))
        )


def write_outputs(ctx: Context, out: Measured) -> EvalSummary:
    """artifacts/eval/<variant>/ (atomically), metrics/eval-<variant>.json and the acceptance plot."""
    variant, cfg, spec = ctx.variant, ctx.run.evaluate, out.estimates[out.best]
    summary = summarize(variant, out.fidelity, out.estimates, out.best, out.lm_eval, out.gpu, out.works)
    with atomic_dir(paths.EVAL / variant) as tmp:
        # where fidelity came through vLLM, how (the KL estimator, its top k and tail mass) beside the numbers
        write_json(
            tmp / "quality.json",
            out.fidelity if out.estimator is None else {**out.fidelity, "estimator": out.estimator},
        )
        records.write(tmp / "speculative.json", spec)  # the best method's
        for method, est in out.estimates.items():
            records.write(tmp / f"speculative-{method}.json", est)
        write_json(tmp / "lm_eval.json", out.lm_eval)
        records.write(tmp / "vllm.json", out.gpu)
        summary.write(tmp / "summary.json")
        if out.works is not None:  # each task's outcome and completion, the baseline's beside the variant's
            base_run, own_run = out.runs
            write_json(
                tmp / "functional.json",
                {
                    "tasks_file": cfg.functional.tasks,
                    "sha256": functional.file_sha256(cfg.functional.tasks),
                    "baseline": dataclasses.asdict(base_run),
                    "variant": dataclasses.asdict(own_run),
                },
            )
    write_json(f"metrics/eval-{variant}.json", summary.to_metrics())  # per-method detail in lists
    estimates = out.estimates
    write_csv(
        f"plots/acceptance-{variant}.csv",  # the best method's curve, then each method's at its own k
        [
            {
                "position": j + 1,
                "accepted": spec.accepted_per_position[j] if j < len(spec.accepted_per_position) else None,
                **{
                    m: e.accepted_per_position[j] if j < len(e.accepted_per_position) else None
                    for m, e in estimates.items()
                },
            }
            for j in range(cfg.acceptance.max_k)
        ],
    )
    return summary


def report(ctx: Context, out: Measured) -> None:
    """The stage's one summary line."""
    fidelity, estimates, profile, gpu, works = out.fidelity, out.estimates, out.profile, out.gpu, out.works
    spec = estimates[out.best]
    concurrency = ctx.run.serving.target_concurrency
    say(
        f"evaluate {ctx.variant}: ppl {fidelity['perplexity_increase_pct']:+.2f}%, KL {fidelity['kl_divergence']:.4f}, "
        f"top-1 {fidelity['top1_agreement']:.3f}"
        + (f" (vLLM, TP {out.estimator['tensor_parallel_size']})" if out.estimator else "")
        + "; speculation, "
        + (
            f"predicted served speedup at concurrency {concurrency} ({profile.profile.name}): "
            + ", ".join(
                f"{m} x{e.expected_speedup:.2f} at k={e.num_speculative_tokens}"
                for m, e in estimates.items()
                if e.expected_speedup is not None
            )
            if profile.profile
            else f"no served prediction ({profile.reason})"
        )
        + f"; best {spec.method} accepted/draft token {spec.accepted_per_draft_token:.3f}; vLLM: "
        + (f"skipped ({gpu.skipped})" if gpu.skipped else f"accepted/draft token {gpu.accepted_per_draft_token:.3f}")
        + (
            f"; pass@1 {works.pass_at_1:.3f} vs {works.pass_at_1_baseline:.3f} unquantized over {works.tasks} tasks"
            if works
            else ""
        )
    )
