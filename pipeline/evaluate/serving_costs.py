"""Served speed of speculative decoding, predicted from serving costs measured on a GPU (cost profiles).

Acceptance is half of what a speculative method is worth; the other half is what a step costs as vLLM
serves it, and that does not follow from weight bytes: vLLM 0.26's draft-model path pays a fixed
per-forward overhead for each drafted token whatever the draft's size. So the CPU estimator predicts served
speed only from step times measured on a GPU, kept as cost profiles (data/serving-cost-profiles/*.json), one per
GPU, vLLM version and target shape. `benchmarks/gpu/measure_costs.py` measures them; `assemble` (below)
turns its raw output into a profile.

Model, at concurrency c (c requests decoding together): a plain step takes T(c) ms and makes c tokens; a
speculative step drafting D tokens per request takes S(c, D), measured at D = k for a few k (random weights
of the target's shape, so every step drafts k tokens) and interpolated linearly between them, from S(c, 0) =
T(c); both interpolated linearly over the measured batch sizes. A request makes R response tokens per step:
the CPU acceptance estimate's tokens up to each response's end over the steps vLLM's schedule takes to reach
it (about 1 + the accepted tokens per step on long answers; less on short ones, whose last step's tokens past
EOS are wasted). D is the estimate's drafted tokens per step (k for a model drafter, fewer for n-gram lookups
that find nothing). A response of N verification steps makes R * N tokens after the prefill's; plain decoding
takes R * N steps of T, speculation N steps of S plus the drafting in the prefill step, S - T. Predicted
speedup = R N T / ((N + 1) S - T), which tends to R T / S on long answers; T and S from one run. The prefill's
own forward pass is the same with and without speculation and left out.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pipeline.core.errors import PipelineError

SCHEMA = 3  # 3: a method's served calibration names every run it pools (served_runs, served_estimates)
# Measured GPU data, not code: kept beside the project's other data, read by path (as profiles/ and evals/ are)
PROFILE_DIR = Path(__file__).resolve().parents[2] / "data" / "serving-cost-profiles"
VLLM_VERSION = "0.26.0"  # the vLLM the bundles are served with (deploy.image, the GPU evidence)
DEFAULT_GPU = "h100"  # serving.gpu null: the GPU the committed profiles were measured on
METHODS = ("draft_model", "eagle3", "ngram")
DRAFT_EVERY_STEP = ("draft_model", "eagle3")  # model drafters: k tokens on every step


@dataclass(frozen=True)
class MethodCost:
    run: str  # the raw folder (one engine start per config, one lease) plain and speculative steps come from
    drafter: dict  # the drafter's shape as measured (parameters, layers), for the record
    plain_step_ms: dict[str, float]  # batch size -> that run's plain decode step (ms): the ratio's denominator
    step_ms: dict[str, dict[str, float]]  # k -> batch size -> speculative step (ms), monotone fit
    step_ms_measured: dict[str, dict[str, float]]  # the same as measured (median of the timed pairs)
    drafted_per_step: dict[str, float]  # k -> tokens drafted per request per step, as measured
    interpolation_error: dict[str, float] = field(default_factory=dict)  # batch -> |S interpolated - measured| /
    # measured at an inner k, from its neighbours (only where three or more k were measured)
    # Served calibration (`calibrate`): concurrency -> the served step's cost relative to plain decoding's, as
    # `vllm serve` + `vllm bench serve` measured it with a trained drafter (S/T = tokens per step x plain tokens/s
    # / speculative tokens/s), over the same ratio from these step times. Random weights draft as much but accept
    # nothing, and an engine step is not all a served token costs; where a served run measured the method, S is
    # scaled by it (interpolated over concurrency). Empty: not calibrated. Several served runs pool: at each
    # concurrency the geometric mean of the runs that measured it (one short level per concurrency and run is noisy:
    # the GPU profile's draft model served x0.88 and x0.73 of plain at c=1 in two leases).
    served_scale: dict[str, float] = field(default_factory=dict)
    served_runs: list[str] = field(default_factory=list)  # the serve_bench records the scale was measured from
    served_estimates: dict[str, str] = field(default_factory=dict)  # n-gram: run -> the CPU estimate it is read with

    def spec_ms(self, concurrency: float, drafted: float) -> float:
        """S(c, D): piecewise linear in D through (0, T(c)) and each measured (D_k, S_k(c)), times the served
        scale at c where the method was calibrated."""
        pts = [(0.0, interpolate(self.plain_step_ms, concurrency))] + sorted(
            (self.drafted_per_step[k], interpolate(by_batch, concurrency)) for k, by_batch in self.step_ms.items()
        )
        scale = interpolate(self.served_scale, concurrency) if self.served_scale else 1.0
        return interpolate({str(d): ms for d, ms in pts}, drafted) * scale

    def uncalibrated(self) -> MethodCost:
        """These costs as the step timings measured them, without a served run's scale."""
        return replace(self, served_scale={}, served_runs=[], served_estimates={})


@dataclass(frozen=True)
class CostProfile:
    name: str
    gpu: str
    gpu_name: str
    vllm_version: str
    target: dict  # params, hidden_size, num_hidden_layers, vocab_size
    plain_step_ms: dict[str, float]  # batch size -> plain decode step (ms), monotone fit, of the newest run
    methods: dict[str, MethodCost]
    runs: list[str]  # the raw folders it was assembled from, in order (benchmarks/gpu/raw/costs/...)
    plain_step_ms_measured: dict[str, float] = field(default_factory=dict)
    schema: int = SCHEMA

    def uncalibrated(self) -> CostProfile:
        """The profile without its served calibration (`calibrate`): what the step timings alone predict."""
        return replace(self, methods={m: cost.uncalibrated() for m, cost in self.methods.items()})

    def plain_ms(self, concurrency: float) -> float:
        return interpolate(self.plain_step_ms, concurrency)

    def speedup(
        self,
        method: str,
        concurrency: int,
        tokens_per_step: float,
        drafted: float,
        steps_per_response: float | None = None,
    ) -> float:
        cost = self.methods[method]
        plain, spec = interpolate(cost.plain_step_ms, concurrency), cost.spec_ms(concurrency, drafted)
        if not steps_per_response:  # the long-answer limit
            return tokens_per_step * plain / spec
        n = steps_per_response
        return tokens_per_step * n * plain / ((n + 1) * spec - plain)


def interpolate(table: dict[str, float], x: float) -> float:
    """Piecewise linear over the measured points; beyond the last one the last segment extends (never
    downwards); below the first one it is flat."""
    pts = sorted((float(k), float(v)) for k, v in table.items())
    if len(pts) == 1 or x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (x - x1)


def llama_params(config: dict) -> int:
    """Parameters of a Llama-family decoder from its config (embeddings, attention, MLP, norms, head)."""
    h, inter, layers, vocab = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
        config["vocab_size"],
    )
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    per_layer = attn + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings") else vocab * h
    return vocab * h + layers * per_layer + h + head


# --- reading and choosing profiles -------------------------------------------------------------------------


def parse(data: dict, where: str) -> CostProfile:
    from pipeline.core.records import from_dict

    profile = from_dict(CostProfile, data, where)
    if profile.schema != SCHEMA:
        raise PipelineError(f"{where}: cost profile schema {profile.schema}, this pipeline reads {SCHEMA}")
    if not profile.plain_step_ms or any(v <= 0 for v in profile.plain_step_ms.values()):
        raise PipelineError(f"{where}: plain_step_ms must hold positive step times")
    return profile


def load(path: str | Path) -> CostProfile:
    from pipeline.core.records import read_object

    return parse(read_object(path), str(path))


def available(directory: Path = PROFILE_DIR) -> list[CostProfile]:
    return [load(p) for p in sorted(directory.glob("*.json"))]


@dataclass(frozen=True)
class Choice:
    profile: CostProfile | None
    reason: str  # why this one (or why none)
    target_params_ratio: float | None = None  # this build's target parameters / the profile's


def choose(setting: str, gpu: str | None, target_params: int, directory: Path = PROFILE_DIR) -> Choice:
    """serving.speculation.cost_profile: auto picks, among the profiles measured on the serving GPU with the
    served vLLM, the one whose target size is nearest this target's (in log ratio); a name picks that
    profile, a path that file. None when nothing was measured for that GPU and vLLM."""
    want_gpu = gpu or DEFAULT_GPU
    if setting != "auto":
        path = Path(setting)
        profile = (
            load(path) if path.suffix == ".json" else next((p for p in available(directory) if p.name == setting), None)
        )
        if profile is None:
            raise PipelineError(
                f"serving.speculation.cost_profile: no profile named {setting!r} in {directory} "
                f"(names: {', '.join(p.name for p in available(directory)) or 'none'})"
            )
        return Choice(
            profile, f"serving.speculation.cost_profile names {profile.name}", target_params / profile.target["params"]
        )
    pool = [p for p in available(directory) if p.gpu == want_gpu and p.vllm_version == VLLM_VERSION]
    if not pool:
        return Choice(
            None,
            f"no serving-cost profile measured on {want_gpu} with vLLM {VLLM_VERSION} "
            "(benchmarks/gpu/measure_costs.py measures one)",
        )
    best = min(pool, key=lambda p: abs(math.log(target_params / p.target["params"])))
    ratio = target_params / best.target["params"]
    gpu_note = "" if gpu else f" (serving.gpu is null: predicted for the {DEFAULT_GPU})"
    return Choice(
        best,
        f"nearest target size among {len(pool)} {want_gpu} profiles: {best.name}, "
        f"x{ratio:.3g} this target's parameters{gpu_note}",
        ratio,
    )


# --- prediction --------------------------------------------------------------------------------------------


@dataclass
class ServedPrediction:
    """Predicted served speed of one method on one variant, per concurrency and k."""

    profile: str
    basis: str  # what the numbers rest on, for the card
    method: str
    plain_tokens_per_s: dict[str, float]  # concurrency -> predicted plain decode output tokens/s
    speedup_by_k: dict[str, dict[str, float]]  # concurrency -> k -> predicted speedup over plain
    best_k: dict[str, int]  # concurrency -> the k predicted fastest there
    target_params_ratio: float | None = None

    def speedup(self, concurrency: int, k: int) -> float:
        return self.speedup_by_k[str(concurrency)][str(k)]


def predict(
    choice: Choice,
    method: str,
    tokens_per_step: dict[str, float],
    drafted_per_step: dict[str, float],
    concurrencies: list[int],
    steps_per_response: dict[str, float] | None = None,
) -> ServedPrediction | None:
    """Response tokens, drafted tokens and steps per response by k (the CPU estimate's schedule). None without a
    profile for the method."""
    profile = choice.profile
    if profile is None or method not in profile.methods:
        return None
    speedups, plain, best = {}, {}, {}
    for c in sorted(set(concurrencies)):
        by_k = {
            k: profile.speedup(method, c, tokens_per_step[k], drafted_per_step[k], (steps_per_response or {}).get(k))
            for k in tokens_per_step
        }
        speedups[str(c)] = by_k
        plain[str(c)] = 1000.0 * c / profile.plain_ms(c)
        # An input to release/decision.py, not a decision: the k this prediction says is fastest, which evaluate
        # writes into its summary; whether any k ships (min_gain, checks, measured runs) is decided there.
        best[str(c)] = int(max(by_k, key=by_k.get))
    cost = profile.methods[method]
    runs = ", ".join(cost.served_runs)
    basis = choice.reason + (
        f"; {method}'s step costs scaled by served runs ({runs})"
        if len(cost.served_runs) > 1
        else f"; {method}'s step costs scaled by a served run ({runs})"
        if cost.served_scale
        else f"; {method}'s step costs not calibrated by a served run"
    )
    return ServedPrediction(
        profile=profile.name,
        basis=basis,
        method=method,
        plain_tokens_per_s=plain,
        speedup_by_k=speedups,
        best_k=best,
        target_params_ratio=choice.target_params_ratio,
    )


# --- assembling a profile from measure_costs.py's raw output (CPU) -----------------------------------------


def _pairs(run: dict) -> list[tuple[dict, dict]]:
    """(short, long) timed generations of one batch size: one pair (first runs) or several (repeats)."""
    short, long = run["short"], run["long"]
    return list(zip(short, long)) if isinstance(short, list) else [(short, long)]


def _steps(r: dict, batch: int) -> float:
    """Engine steps of one timed generation: every step of a model drafter (and of n-gram lookups on random
    weights' repetitive output) verifies one draft per request, so vLLM's num_drafts counts them exactly; the
    tokens less the accepted ones would overcount the last step's accepted tokens past max_tokens."""
    if r.get("num_drafts"):
        return r["num_drafts"] / batch
    return (r["tokens"] - (r.get("num_accepted_tokens") or 0)) / batch


def _step(run: dict, batch: int) -> tuple[float, float]:
    """(ms per engine step, drafted tokens per request per step): the median over the timed pairs of the
    difference between a long and a short generation over the difference in steps (start-up and prefill cancel)."""
    ms, drafted = [], []
    for short, long in _pairs(run):
        steps = _steps(long, batch) - _steps(short, batch)
        ms.append(1000.0 * (long["wall_s"] - short["wall_s"]) / steps)
        drafted.append(((long.get("num_draft_tokens") or 0) - (short.get("num_draft_tokens") or 0)) / batch / steps)
    return statistics.median(ms), statistics.median(drafted)


def monotone(points: dict[str, float]) -> dict[str, float]:
    """The non-decreasing fit nearest the measured step times (pool adjacent violators): a step over more tokens
    never takes less time, so a smaller reading at a larger batch is timing noise, averaged with its neighbours."""
    keys = sorted(points, key=float)
    blocks: list[list] = []  # [sum, count, keys]
    for k in keys:
        blocks.append([points[k], 1, [k]])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1][0] += last[0]
            blocks[-1][1] += last[1]
            blocks[-1][2] += last[2]
    return {k: total / n for total, n, ks in blocks for k in ks}


def _plain(raw_dir: Path) -> tuple[dict[str, float], dict[str, float]] | None:
    path = raw_dir / "plain-k0.json"
    if not path.is_file():
        return None
    runs = sorted(json.loads(path.read_text())["runs"], key=lambda r: r["batch"])
    measured = {str(r["batch"]): _step(r, r["batch"])[0] for r in runs}
    return monotone(measured), measured


def _method(raw_dir: Path, method: str, plain: dict[str, float], drafter: dict) -> MethodCost | None:
    files = [f for f in raw_dir.glob(f"{method}-k*.json") if not f.name.endswith(".failed.json")]
    if not files:
        return None
    measured, drafted = {}, {}
    for f in files:
        rec = json.loads(f.read_text())
        steps = {r["batch"]: _step(r, r["batch"]) for r in sorted(rec["runs"], key=lambda r: r["batch"])}
        measured[str(rec["k"])] = {str(b): ms for b, (ms, _) in steps.items()}
        drafted[str(rec["k"])] = statistics.median(d for _, d in steps.values())
    ks = sorted(measured, key=int)
    measured = {k: measured[k] for k in ks}
    cost = MethodCost(
        run=raw_dir.as_posix(),
        drafter=drafter,
        plain_step_ms=plain,
        step_ms={k: monotone(v) for k, v in measured.items()},
        step_ms_measured=measured,
        drafted_per_step={k: drafted[k] for k in ks},
    )
    if len(ks) < 3:
        return cost
    errors: dict[str, float] = {}
    for i in range(1, len(ks) - 1):  # each inner k predicted from its neighbours alone
        k, around = ks[i], {key: cost.step_ms[key] for key in (ks[i - 1], ks[i + 1])}
        partial = MethodCost(
            cost.run, drafter, plain, around, around, {key: cost.drafted_per_step[key] for key in around}
        )
        for b, ms in measured[k].items():
            err = abs(partial.spec_ms(int(b), cost.drafted_per_step[k]) - ms) / ms
            errors[b] = max(errors.get(b, 0.0), err)
    return replace(cost, interpolation_error=errors)


def assemble(raw_dirs: list[Path], shape_dir: Path, name: str, gpu: str) -> CostProfile:
    """The profile of one shape from measure_costs.py's output folders (OUT/<shape>/, one per run, oldest first;
    gpu.txt and versions.txt beside each): each method from the newest run that measured it, its step times
    against that run's plain decoding; shape from SHAPE_DIR/target and draft config.json."""
    target_cfg = json.loads((shape_dir / "target" / "config.json").read_text())
    draft_cfg = json.loads((shape_dir / "draft" / "config.json").read_text())
    methods: dict[str, MethodCost] = {}
    newest_plain = None
    for raw_dir in raw_dirs:
        plain = _plain(raw_dir)
        if plain is None:
            continue
        newest_plain = (raw_dir, *plain)
        for method in METHODS:
            drafter = (
                {"params": llama_params(draft_cfg), "num_hidden_layers": draft_cfg["num_hidden_layers"]}
                if method == "draft_model"
                else {}
            )
            cost = _method(raw_dir, method, plain[0], drafter)
            if cost is not None:
                methods[method] = cost
    if newest_plain is None:
        raise PipelineError(f"no plain decoding measured (plain-k0.json) in {', '.join(map(str, raw_dirs))}")
    run_dir, plain, measured = newest_plain
    gpu_name = (run_dir.parent / "gpu.txt").read_text().split(",")[0].strip()
    vllm = (run_dir.parent / "versions.txt").read_text().split()[1]
    target = {
        "params": llama_params(target_cfg),
        **{k: target_cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
    }
    return CostProfile(
        name=name,
        gpu=gpu,
        gpu_name=gpu_name,
        vllm_version=vllm,
        target=target,
        plain_step_ms=plain,
        methods={m: methods[m] for m in METHODS if m in methods},
        runs=[d.as_posix() for d in raw_dirs],
        plain_step_ms_measured=measured,
    )


def served_step_ratio(level: dict, plain: dict, known: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """(S/T, drafted tokens per request per step) of one served load level against plain decoding's at the same
    load, from `vllm bench serve`'s output tokens/s: S/T = tokens per step x plain tokens/s / speculative tokens/s.
    Tokens and drafted tokens per step come from vLLM's acceptance counters (a step makes the mean acceptance
    length L tokens and drafts (L - 1) / accepted per drafted token), or are `known` from elsewhere where those
    counters do not give them (n-gram: its CPU estimate). None where either run failed requests or measured no
    throughput, or the acceptance was not measured."""
    if (
        level.get("failed")
        or plain.get("failed")
        or not level["output_throughput"]
        or not plain.get("output_throughput")
    ):
        return None
    if known is None:
        mal, rate = level.get("mean_acceptance_length"), level.get("accepted_per_draft_token")
        if not mal or not rate:
            return None
        known = (mal, (mal - 1) / rate)
    tokens, drafted = known
    return tokens * plain["output_throughput"] / level["output_throughput"], drafted


@dataclass(frozen=True)
class ServedRun:
    """One serve_bench record to calibrate by, with its variant's CPU n-gram estimate (None: n-gram stays as
    measured); `run` and `estimate_run` are the paths the profile names them by."""

    record: dict
    run: str
    ngram_estimate: dict | None = None
    estimate_run: str | None = None


def served_scales(profile: CostProfile, served: ServedRun) -> dict[str, tuple[dict[str, float], bool]]:
    """method -> (concurrency -> served S/T over this profile's step-time S/T at the drafted tokens per step served,
    whether the n-gram estimate read it), for each method the record served that can be read.

    Model drafters draft k tokens on every step, so vLLM's mean acceptance length is the served tokens per step.
    n-gram drafts only on steps whose context repeats and vLLM's counters cover those steps alone, so its served
    tokens per step come from the CPU estimate of the same variant (its speculative-ngram.json, at the served k);
    without one n-gram is not read. Its calibration matters: SmolLM2's n-gram step cost 1.8-2.5 plain steps served
    on the H100, well above the offline engine's random-weight timing (the cause is not measured: both ran n-gram
    with vLLM's asynchronous scheduling off and plain decoding with it on)."""
    configs = served.record.get("configs") or {}
    plain = (configs.get("plain") or {}).get("levels") or {}
    out = {}
    for method, config in configs.items():
        known = None  # n-gram's tokens and drafted tokens per step, from its CPU estimate at the served k
        if method == "ngram" and served.ngram_estimate:
            k = str(config["num_speculative_tokens"])
            known = (
                served.ngram_estimate["tokens_per_step_by_k"][k],
                served.ngram_estimate["drafted_per_step_by_k"][k],
            )
        if method not in profile.methods or (method not in DRAFT_EVERY_STEP and known is None):
            continue
        cost = profile.methods[method].uncalibrated()
        scale = {}
        for key, level in config["levels"].items():
            measured = served_step_ratio(level, plain.get(key) or {}, known)
            if measured is None:
                continue
            ratio, drafted = measured
            c = level["concurrency"]
            scale[str(c)] = ratio / (cost.spec_ms(c, drafted) / interpolate(cost.plain_step_ms, c))
        if scale:
            out[method] = (scale, known is not None)
    return out


def calibrate(profile: CostProfile, served: list[ServedRun]) -> CostProfile:
    """The profile with each method the served runs measured scaled to what was served (served_scale): at each
    concurrency, the geometric mean over the runs that measured it of served S/T over this profile's S/T
    (`served_scales`). A method no run could read stays as it was; a method read loses any earlier calibration."""
    per_run = [(s, served_scales(profile, s)) for s in served]
    methods = dict(profile.methods)
    for method in profile.methods:
        read = [(s, scales[method]) for s, scales in per_run if method in scales]
        if not read:
            continue
        by_c: dict[str, list[float]] = {}
        for _, (scale, _) in read:
            for c, v in scale.items():
                by_c.setdefault(c, []).append(v)
        pooled = {
            c: math.exp(statistics.fmean(math.log(v) for v in vs))
            for c, vs in sorted(by_c.items(), key=lambda kv: float(kv[0]))
        }
        methods[method] = replace(
            profile.methods[method].uncalibrated(),
            served_scale=pooled,
            served_runs=[s.run for s, _ in read],
            served_estimates={s.run: s.estimate_run for s, (_, by_estimate) in read if by_estimate and s.estimate_run},
        )
    return replace(profile, methods=methods)


def write(profile: CostProfile, path: Path) -> None:
    path.write_text(json.dumps(asdict(profile), indent=1) + "\n")  # batch sizes stay in ascending order


def main(argv: list[str]) -> int:
    """python -m pipeline.evaluate.serving_costs assemble NAME GPU SHAPE_DIR OUT.json RAW_DIR [RAW_DIR...]
       python -m pipeline.evaluate.serving_costs calibrate PROFILE.json RECORD.json [NGRAM_ESTIMATE.json] \
[RECORD.json ...]
         (each serve_bench record, optionally followed by its variant's speculative-ngram.json; the runs pool)"""
    if len(argv) >= 3 and argv[0] == "calibrate":
        path, served = Path(argv[1]), []
        for arg in map(Path, argv[2:]):
            try:
                data = json.loads(arg.read_text())
            except (OSError, ValueError) as e:
                print(f"calibrate: {arg}: not readable JSON ({e})", file=sys.stderr)
                return 2
            if isinstance(data, dict) and "configs" in data:
                served.append(ServedRun(data, arg.as_posix()))
            elif (
                isinstance(data, dict)
                and "tokens_per_step_by_k" in data
                and served
                and served[-1].ngram_estimate is None
            ):
                served[-1] = replace(served[-1], ngram_estimate=data, estimate_run=arg.as_posix())
            else:
                print(
                    f"calibrate: {arg}: neither a serve_bench record (configs) nor a CPU n-gram estimate "
                    "(tokens_per_step_by_k) following one",
                    file=sys.stderr,
                )
                return 2
        calibrated = calibrate(load(path), served)
        write(calibrated, path)
        for m, cost in calibrated.methods.items():
            print(f"{m}: served scale {({c: round(v, 3) for c, v in cost.served_scale.items()}) or 'none'}")
        return 0
    if len(argv) < 6 or argv[0] != "assemble":
        print(main.__doc__, file=sys.stderr)
        return 2
    name, gpu, shape, out, raws = argv[1], argv[2], Path(argv[3]), Path(argv[4]), [Path(a) for a in argv[5:]]
    write(assemble(raws, shape, name, gpu), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
