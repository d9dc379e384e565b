"""serve_bench's measurement of one variant: the variant served as it would ship, under load, plain and with each
speculative method of draft.method (each at the k its CPU estimate found best on this variant).

On a CUDA host with vLLM: `vllm serve --config serve-<config>.yaml` (the file the bundle would ship,
rendered by the same code) from a directory laid out like the bundle, then `vllm bench serve`
(pipeline/serving/load_generator.py) over held-out traffic at every concurrency of serve_bench.concurrency, in
this order:
1. plain decoding under each GEMM kernel vLLM offers the variant on this GPU (hardware.kernel_choices: W4A16
   Machete or Marlin, FP8 block-wise CUTLASS or DeepGEMM); the faster (pipeline/release/decision.py
   choose_kernel) is the kernel every later config runs on and the bundle ships (serve.env);
2. each method at its k;
3. a k per batch-size range (serve_bench.k_schedule): the schedule decision.schedule_to_measure suggests;
4. the tiers of serve_bench.tiers, each at its own engine settings (tiers/<tier>/serve-<config>.yaml) and its
   own concurrency.
After each config's sweep, on its still-running server, serve_bench.capacity searches the largest load whose p99
latencies meet serving.slo (pipeline/serving/capacity.py; this module only runs its probes). Configs that do not
depend on each other are served at once on disjoint GPU sets (pipeline/serving/gpu_sets.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pipeline.core import paths, records
from pipeline.core.errors import PipelineError
from pipeline.core.plots import write_plot
from pipeline.core.stage import progress_bar, say
from pipeline.data.formatting import prompt_text
from pipeline.data.traffic import heldout_prompts
from pipeline.drafts import methods
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate import vllm_spec
from pipeline.quantize.hardware import KERNEL_SWITCH, kernel_choices
from pipeline.quantize.recipes import VariantSpec
from pipeline.serving import capacity, gpu_sets, load_generator
from pipeline.serving.bench_record import CONFIG, PLAIN, ServeBenchRecord, ServeConfigResult, config_name, level_key
from pipeline.serving.config import (
    checkpoint_quantization,
    engine_args,
    serve_yaml,
    served_model_name,
    server_env,
    speculative_config_for,
    user_env,
)
from pipeline.serving.kernel_log import kernel_schemes_in_log, kernels_in_log
from pipeline.serving.settings import ServeBenchParams, ServingParams, Slo
from pipeline.serving.tiers import Tier, benchmarked
from pipeline.serving.vllm_server import serve


@dataclasses.dataclass(frozen=True)
class Settings:
    """What serve_bench reads of params.yaml, typed."""

    bench: ServeBenchParams
    serving: ServingParams
    draft: DraftParams
    temperature: float  # evaluate.acceptance.temperature: the serving temperature
    spec: VariantSpec

    def speculative_config(self, speculation: methods.Speculation) -> dict | None:
        """The file the bundle renders too."""
        return speculative_config_for(speculation, self.draft, self.serving)


@dataclasses.dataclass(frozen=True)
class Choices:
    """What serve_bench decides while it measures, as pipeline/release/decision.py decides it (choose_kernel,
    schedule_to_measure): passed in by the stage, since serving sits below release."""

    kernel: Callable[[dict[str, ServeConfigResult], int, float], str]
    schedule: Callable[[dict[str, ServeConfigResult], dict[str, int], float, int], tuple | None]


@dataclasses.dataclass
class Measured:
    """What a variant's sweep has measured so far (filled step by step; the record is written from it): configs
    by name, failed configs and why, plain decoding by kernel and the chosen one, k schedules by method, and by
    tier its configs, failures and why it was skipped."""

    configs: dict[str, ServeConfigResult] = dataclasses.field(default_factory=dict)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    by_kernel: dict[str, ServeConfigResult] = dataclasses.field(default_factory=dict)
    kernel: str | None = None
    kernel_failed: dict[str, str] = dataclasses.field(default_factory=dict)
    schedules: dict[str, ServeConfigResult] = dataclasses.field(default_factory=dict)
    tier_configs: dict[str, dict[str, ServeConfigResult]] = dataclasses.field(default_factory=dict)
    tier_failed: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    tier_skipped: dict[str, str] = dataclasses.field(default_factory=dict)


def measure(out: Path, variant: str, candidates: dict[str, int], run: Settings, choose: Choices) -> ServeBenchRecord:
    """candidates: method -> k; plain decoding is always measured first."""
    import torch

    from pipeline.models.loading import load_tokenizer

    model_dir = paths.QUANTIZED / variant
    tokenizer = load_tokenizer(model_dir)  # once: a 151k-token vocabulary (Qwen) takes ~1 s a load
    rendered = [prompt_text(tokenizer, m) for m in heldout_prompts(paths.HELDOUT)]
    tiers = benchmarked(run.serving, run.bench.tiers)
    major, minor = torch.cuda.get_device_capability(0)
    kernels, kernel_note = kernels_to_compare(run.spec, major + minor / 10, run.serving)
    runs = [(PLAIN, methods.NONE)] + [(m, methods.Speculation(m, k)) for m, k in candidates.items()]
    found = Measured()
    # The bundle's layout (./model, ./draft) with links to the artifacts: nothing is copied, and the
    # serve.yaml files are exactly what the bundle stage renders.
    with tempfile.TemporaryDirectory(prefix="modelprep-serve-") as tmp:
        serving_dir = bundle_layout(Path(tmp), model_dir, candidates, [text for text, _ in rendered])
        traffic = load_generator.Traffic(
            serving_dir / "prompts.jsonl", serving_dir / "model", rendered[0][1] if rendered else False
        )
        bar = gpu_sets.Counter(
            progress_bar(
                f"serve_bench {variant}",
                total=steps(run.bench, runs, kernels, scheduling(run.bench, candidates), tiers),
            )
        )
        batch = Batch(
            out,
            serving_dir,
            variant,
            checkpoint_quantization(model_dir),
            traffic,
            run,
            bar,
            gpu_sets.visible_gpus(),
            run.bench.parallel == "auto",
        )
        # 1. Plain decoding on each kernel at once; the faster at target_concurrency serves everything after it.
        env = serve_kernels(batch, kernels, found, choose) if kernels else server_env(run.spec, run.serving)
        # 2. Each method at its k, at once (with plain decoding where no kernel was compared).
        served = batch.serve(
            [Job(name, speculation, env, found.failed) for name, speculation in runs[1 if kernels else 0 :]]
        )
        found.configs |= {name: result for name, result in served.items() if result is not None}
        # 3. The k schedule the sweep suggests.
        if scheduling(run.bench, candidates) and PLAIN in found.configs:
            serve_schedule(batch, candidates, env, found, choose)
        # 4. The tiers: every tier's plain decoding at once, then the methods of those it served.
        serve_tiers(batch, tiers, runs, env, found)
        bar.close()
    return record_of(
        variant,
        run,
        found,
        batch.tensor_parallel_size(Job(PLAIN, methods.NONE, env, found.failed)),
        next((c.env for c in kernels if c.name == found.kernel), {}),
        kernel_note,
    )


def bundle_layout(serving_dir: Path, model_dir: Path, candidates: dict[str, int], prompts: list[str]) -> Path:
    """serving_dir laid out as the bundle is (./model, each drafter's directory) with links to the artifacts, and the
    held-out prompts `vllm bench serve` sends."""
    (serving_dir / "model").symlink_to(model_dir.resolve())
    for method in candidates:
        if method in methods.ARTIFACT_DIRS:
            (serving_dir / methods.BUNDLE_DIRS[method]).symlink_to(methods.ARTIFACT_DIRS[method].resolve())
    load_generator.write_dataset(serving_dir / "prompts.jsonl", prompts)
    return serving_dir


def scheduling(cfg: ServeBenchParams, candidates: dict[str, int]) -> bool:
    """Whether a k schedule is measured: serve_bench.k_schedule auto, a sweep of several concurrencies, a method."""
    return bool(cfg.k_schedule == "auto" and len(cfg.concurrency) > 1 and candidates)


def steps(cfg: ServeBenchParams, runs: list, kernels: list, scheduled: bool, tiers: list[Tier]) -> int:
    """The progress bar's levels: every config's sweep, each extra kernel's and the schedule's, each tier's runs."""
    return len(cfg.concurrency) * (len(runs) + max(len(kernels) - 1, 0) + scheduled) + len(tiers) * len(runs)


def serve_kernels(batch: Batch, kernels: list, found: Measured, choose: Choices) -> dict[str, str]:
    """Plain decoding on each kernel at once; the chosen one (decision.choose_kernel) becomes plain decoding's
    config and its environment, returned, that of every later config."""
    serving, cfg, user = batch.run.serving, batch.run.bench, user_env(batch.run.serving)
    served = batch.serve(
        [
            Job(
                PLAIN,
                methods.NONE,
                {**c.env, **user},
                found.kernel_failed,
                label=f"{PLAIN}-{c.name}",
                must=len(kernels) == 1,
            )
            for c in kernels
        ]
    )
    found.by_kernel = {c.name: served[f"{PLAIN}-{c.name}"] for c in kernels if served[f"{PLAIN}-{c.name}"]}
    if not found.by_kernel:
        raise PipelineError(
            f"serve_bench {batch.variant}: plain decoding failed on every kernel "
            f"({'; '.join(f'{k}: {v[:150]}' for k, v in found.kernel_failed.items())})"
        )
    found.kernel = choose.kernel(found.by_kernel, serving.target_concurrency, cfg.kernel_tie)
    found.configs[PLAIN] = found.by_kernel[found.kernel]
    for name in found.kernel_failed:
        say(f"serve_bench {batch.variant}: kernel {name} failed; the others go on")
    keep_raw(batch.out, f"{PLAIN}-{found.kernel}", PLAIN)
    return {**next(c.env for c in kernels if c.name == found.kernel), **user}


def serve_schedule(
    batch: Batch, candidates: dict[str, int], env: dict[str, str], found: Measured, choose: Choices
) -> None:
    """The k schedule decision.schedule_to_measure suggests from the fixed configs' sweep, where one does."""
    serving = batch.run.serving
    plan = choose.schedule(found.configs, candidates, serving.speculation.min_gain, serving.max_num_seqs)
    if plan is None:
        return
    speculation = methods.Speculation(plan[0], candidates[plan[0]], plan[1])
    result = batch.serve([Job(config_name(speculation), speculation, env, found.failed)])[config_name(speculation)]
    if result is not None:
        found.schedules[plan[0]] = result


def serve_tiers(batch: Batch, tiers: list[Tier], runs: list, env: dict[str, str], found: Measured) -> None:
    """Every tier the host has the GPUs for: its plain decoding at once, then the methods of those it served
    (a method vLLM could not start by default is not tried again). Only tiers with a failed config keep an entry
    in tier_failed."""
    measured = []
    for tier in tiers:
        too_few = vllm_spec.too_few_gpus(tier.tensor_parallel_size, len(batch.host_gpus), "tensor_parallel_size")
        if too_few:
            found.tier_skipped[tier.name] = too_few
        else:
            measured.append(tier)
    failed = {tier.name: {} for tier in measured}
    plains = batch.serve([Job(PLAIN, methods.NONE, env, failed[t.name], tier=t) for t in measured])
    more = [
        Job(name, speculation, env, failed[t.name], tier=t)
        for t in measured
        if t.speculation == "auto" and plains[f"{t.name}.{PLAIN}"] is not None
        for name, speculation in runs[1:]
        if name not in found.failed
    ]
    served = {**plains, **batch.serve(more)}
    for t in measured:
        for name, _ in runs:
            if served.get(f"{t.name}.{name}") is not None:
                found.tier_configs.setdefault(t.name, {})[name] = served[f"{t.name}.{name}"]
    found.tier_failed |= {name: why for name, why in failed.items() if why}


def record_of(
    variant: str,
    run: Settings,
    found: Measured,
    tensor_parallel_size: int,
    kernel_env: dict[str, str],
    kernel_note: str | None,
) -> ServeBenchRecord:
    import torch

    version = importlib.metadata.version("vllm")
    return ServeBenchRecord(
        variant=variant,
        gpu=torch.cuda.get_device_name(0),
        vllm_version=version,
        date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        load_generator=f"vllm bench serve (vLLM {version})",
        max_tokens=run.bench.max_tokens,
        temperature=run.temperature,
        configs=found.configs,
        failed_configs=found.failed,
        tiers=found.tier_configs,
        tier_skipped=found.tier_skipped,
        tier_failed_configs=found.tier_failed,
        schedules=found.schedules,
        kernels=found.by_kernel,
        kernel=found.kernel,
        kernel_env=kernel_env,
        tensor_parallel_size=tensor_parallel_size,
        kernel_note=kernel_note
        or "".join(f"{name} failed: {why[:200]}; " for name, why in found.kernel_failed.items())
        or None,
    )


def write_plots(record: ServeBenchRecord, slo: Slo) -> None:
    """The stage's dvc plots of the record (an empty chart's directory says why, where nothing was measured)."""
    why_empty = f"serve_bench {record.variant}: {record.skipped or 'nothing measured'}"
    for directory, (column, value) in PLOTS.items():
        write_plot(f"{directory}/{record.variant}", *plot_rows(record, column, value), why_empty)
    write_plot(f"plots/serve_pareto/{record.variant}", *capacity.pareto_rows(record, slo), why_empty)


def kernels_to_compare(spec, compute_capability: float, serving: ServingParams):
    """(choices, why none): the kernel choices serve_bench serves plain decoding on. A user's own
    VLLM_DISABLED_KERNELS in serving.env decides instead: it wins over any choice, so measuring them is moot."""
    choices = kernel_choices(spec, compute_capability)
    if len(choices) < 2:
        return [], None
    if KERNEL_SWITCH in user_env(serving):
        return [], f"serving.env sets {KERNEL_SWITCH}: the kernel is the user's choice, not compared"
    return choices, None


def keep_raw(out: Path, measured_as: str, name: str) -> None:
    """The chosen kernel's plain run also under plain decoding's own raw file names (what every other config
    and the bundle's checks compare against)."""
    for raw in (out / "raw").glob(f"{measured_as}-c*.json"):
        shutil.copy(raw, raw.with_name(raw.name.replace(f"{measured_as}-", f"{name}-", 1)))


@dataclasses.dataclass(frozen=True)
class Job:
    """One config to serve: name (plain or a method's config name), env its server's environment (the kernel's and
    serving.env), failed where its failure is recorded, tier the tier it is served at, label its raw files' and logs'
    name where it differs from name (plain decoding on one kernel: plain-<kernel>), must whether its failure fails
    the stage (None: plain decoding at the default settings)."""

    name: str
    speculation: methods.Speculation
    env: dict[str, str]
    failed: dict[str, str]
    tier: Tier | None = None
    label: str | None = None
    must: bool | None = None

    @property
    def key(self) -> str:
        """Unique among a variant's configs: its logs' name."""
        label = self.label or self.name
        return f"{self.tier.name}.{label}" if self.tier else label

    def where(self, out: Path) -> Path:
        """Its serve.yaml's and raw files' directory under the stage's output: a tier's own."""
        return out / "tiers" / self.tier.name if self.tier else out


@dataclasses.dataclass(frozen=True)
class Batch:
    """What every config of a variant is served with, and the host's GPUs they are spread over."""

    out: Path
    serving_dir: Path
    variant: str
    quantization: str | None
    traffic: load_generator.Traffic
    run: Settings
    bar: gpu_sets.Counter
    host_gpus: list[str]
    parallel: bool  # serve_bench.parallel: auto

    def engine(self, job: Job) -> dict:
        """The config's engine arguments, as its serve.yaml renders them."""
        return engine_args(
            self.run.spec,
            self.run.serving,
            self.run.speculative_config(job.speculation),
            self.quantization,
            job.tier.engine if job.tier else None,
        )

    def tensor_parallel_size(self, job: Job) -> int:
        """GPUs one server of the config shards over: its own engine argument, not a global setting."""
        return int(self.engine(job).get("tensor_parallel_size", 1))

    def serve(self, jobs: list[Job]) -> dict[str, ServeConfigResult | None]:
        """Each job's result by key (None: it failed, recorded in its job.failed), the independent jobs at once on
        disjoint GPU sets (pipeline/serving/gpu_sets.py)."""
        by_key = {job.key: job for job in jobs}
        waves = gpu_sets.pack(
            [gpu_sets.ConfigRun(job.key, self.tensor_parallel_size(job)) for job in jobs], self.host_gpus, self.parallel
        )
        served = gpu_sets.run_waves(
            waves,
            lambda placement: served_or_failed(
                by_key[placement.label].where(self.out),
                self.variant,
                by_key[placement.label],
                lambda: serve_config(self, by_key[placement.label], placement),
            ),
        )
        return {job.key: served[job.key] for job in jobs}  # in the order given (the record's), whatever the waves


def served_or_failed(out: Path, variant: str, job: Job, attempt) -> ServeConfigResult | None:
    """attempt() (serve_config of the job), or None when it failed: then why is in job.failed[label], its files in
    out are discarded and a line says so, and the caller goes on. Plain decoding at the default settings is every
    comparison's baseline: its failure fails the stage (job.must: unless another kernel may still serve it)."""
    label, tier = job.label or job.name, job.tier
    try:
        return attempt()
    except PipelineError as e:
        if (job.name == PLAIN and tier is None) if job.must is None else job.must:
            raise
        # One config vLLM can't serve (a head it can't load, a kernel it lacks) must not hide the others'
        # measurements; it is recorded and never shipped.
        job.failed[label] = str(e)[:500]
        discard(out, label)
        say(
            f"serve_bench {variant}: "
            + (f"tier {tier.name} {label} failed" if tier else f"{label} failed, the other configs go on")
            + f": {str(e)[:200]}"
        )
        return None


def discard(out: Path, name: str) -> None:
    """A config that failed leaves no file behind: its serve.yaml must not look measured to the bundle stage."""
    (out / f"serve-{name}.yaml").unlink(missing_ok=True)
    for partial in (out / "raw").glob(f"{name}-c*.json"):
        partial.unlink()


def _search_capacity(cfg, slo, arrival: str, levels: dict, gpus: int, bench):
    """The config's capacity at the SLO, probed through `bench` from the swept levels."""
    bounds = cfg.capacity
    seed, floor = capacity.open_loop_seed(levels.values(), slo)
    return capacity.search(
        lambda x: bench(
            x,
            capacity.probe_prompts(cfg, arrival, x),
            f"capacity-c{int(x)}" if arrival == capacity.CONCURRENCY else f"capacity-r{x:.4g}",
        ),
        slo,
        arrival,
        bounds.max_concurrency if arrival == capacity.CONCURRENCY else bounds.max_rate,
        bounds.max_probes,
        known=levels.values(),
        gpus=gpus,
        seed=seed,
        floor_meets=floor if arrival == capacity.POISSON else None,
    )


def serve_config(batch: Batch, job: Job, placement: gpu_sets.Placement) -> ServeConfigResult:
    """One serve.yaml (as the bundle would ship it: the tier's serve-<tier>.yaml for a tier) started with
    `vllm serve` under the job's env on the placement's GPUs and swept over the concurrencies (a tier: its own
    concurrency only), then its capacity searched at the SLO (a tier's own)."""
    cfg, serving, run, tier = batch.run.bench, batch.run.serving, batch.run, job.tier
    label = job.label or job.name
    out = job.where(batch.out)
    out.mkdir(parents=True, exist_ok=True)
    args = batch.engine(job)
    text = serve_yaml(args)
    (out / f"serve-{job.name}.yaml").write_text(text)
    # The server's own file, named after its key and written from the text, not copied from the one above: plain
    # decoding on two kernels at once writes that one twice.
    started = batch.serving_dir / f"serve-{job.key}.yaml"
    started.write_text(text)
    # Logs outside the output directory, which is discarded when the stage fails.
    server_log = paths.LOGS / f"serve_bench@{batch.variant}.{job.key}-server.log"
    bench_log = paths.LOGS / f"serve_bench@{batch.variant}.{job.key}-bench.log"
    # a tier is held to its own objective (serving.tiers.<tier>.slo over serving.slo): its probes and its capacity
    slo, arrival = (tier.slo if tier is not None and tier.slo is not None else serving.slo), serving.arrival
    # what one replica costs: the GPUs a tier's replica requests, else the ones the server shards over
    gpus = tier.gpus if tier else int(args.get("tensor_parallel_size", 1))
    env = {**job.env, **gpu_sets.server_env(placement)}
    client = load_generator.Client(
        served_model_name(serving, batch.variant), batch.traffic, cfg, run.temperature, slo.goodput()
    )
    port = cfg.port + gpu_sets.port_offset(placement)
    with serve(started, batch.serving_dir, server_log, cfg.startup_timeout_s, port, env) as server:

        def bench(load: float, prompts: int, tag: str, warmups: int = 0):
            """One `vllm bench serve` at a concurrency (closed loop), or at a Poisson rate for a capacity probe."""
            return load_generator.bench_level(
                server,
                client,
                out / "raw" / f"{label}-{tag}.json",
                bench_log,
                load,
                prompts,
                warmups,
                poisson=tag.startswith("capacity-r"),
            )

        levels = {}
        for c in [tier.concurrency] if tier else cfg.concurrency:
            levels[level_key(c)] = bench(c, load_generator.num_prompts(cfg, c), f"c{c}", cfg.warmup_requests)
            batch.bar.update()
        # Every config is searched, a tier's at its own engine settings from its one level (what sizes its replicas:
        # release/decision.size_tier prefers it to the default sweep's).
        found = _search_capacity(cfg, slo, arrival, levels, gpus, bench) if cfg.capacity.enabled else None
    return ServeConfigResult(
        num_speculative_tokens=job.speculation.k,
        startup_s=server.startup_s,
        levels=levels,
        schedule=[list(r) for r in job.speculation.schedule] if job.speculation.schedule else None,
        kernels_used=kernels_in_log(server_log),
        kernel_schemes=kernel_schemes_in_log(server_log),
        capacity=found,
        gpus=list(placement.gpus),
        beside=list(placement.beside),
    )


def candidates(run: Settings, variant: str) -> dict[str, int]:
    """Each requested method at the k its CPU estimate found best on this variant (or the fixed k)."""
    from pipeline.evaluate.estimate import SpeculativeEstimate

    fixed = run.bench.num_speculative_tokens
    return {
        m: records.read(SpeculativeEstimate, paths.EVAL / variant / f"speculative-{m}.json").num_speculative_tokens
        if fixed == "auto"
        else fixed
        for m in run.draft.method
    }


def summary_line(record: ServeBenchRecord, concurrency: int) -> str:
    if record.skipped:
        return f"serve_bench {record.variant}: skipped ({record.skipped})"
    parts = []
    for name, config in record.configs.items():
        level = config.at(concurrency)
        parts.append(
            f"{name} {level.output_throughput:.0f} tok/s, p99 ITL {level.itl_ms['p99']:.1f} ms"
            + (f", {level.failed} failed" if level.failed else "")
        )
    for method, config in record.schedules.items():
        level = config.at(concurrency)
        if level is not None:
            parts.append(f"{method} k per batch {config.schedule} {level.output_throughput:.0f} tok/s")
    if record.kernel:
        parts.append(f"kernel {record.kernel} (faster of {', '.join(record.kernels)})")
    held = {name: c.capacity for name, c in record.configs.items() if c.capacity is not None}
    if held:
        slo = next(iter(held.values())).slo
        parts.append(
            f"users per GPU at {slo.label()}: "
            + ", ".join(
                f"{name} {'>=' if cap.lower_bound else ''}{cap.users_per_gpu:.3g}" for name, cap in held.items()
            )
        )
    for tier, configs in record.tiers.items():
        parts.append(
            f"tier {tier}: "
            + ", ".join(
                f"{name} {level.output_throughput:.0f} tok/s at c={level.concurrency}"
                for name, config in configs.items()
                for level in config.levels.values()
            )
        )
    return f"serve_bench {record.variant} at concurrency {concurrency}: " + "; ".join(parts)


# dvc plots: a directory per curve and variant (dvc.yaml: serve_bench's plots), in long form (a row per config and
# concurrency, the config in its own column: one chart template draws any set of configs as lines).
PLOTS = {
    "plots/serve_itl": ("p99_itl_ms", lambda lvl: lvl.itl_ms["p99"]),
    "plots/serve_throughput": ("output_tokens_per_s", lambda lvl: lvl.output_throughput),
}


def plot_rows(record: ServeBenchRecord, column: str, value) -> tuple[list[dict], list[str]]:
    """(rows, header) of one curve: a row per measured config and concurrency; none when nothing was measured."""
    configs = {PLAIN: record.configs.get(PLAIN), **record.speculative()}
    rows = [
        {"concurrency": lvl.concurrency, CONFIG: config.label(name), column: value(lvl)}
        for name, config in configs.items()
        if config is not None
        for lvl in sorted(config.levels.values(), key=lambda lvl: lvl.concurrency)
    ]
    return rows, ["concurrency", CONFIG, column]
