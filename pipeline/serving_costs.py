"""Served speed of speculative decoding, predicted from serving costs measured on a GPU (cost profiles).

Acceptance is half of what a speculative method is worth; the other half is what a step costs as vLLM
serves it, and that does not follow from weight bytes: vLLM 0.26's draft-model path pays a fixed
per-forward overhead for each drafted token whatever the draft's size. So the CPU estimator predicts served
speed only from costs measured on a GPU, kept as cost profiles (pipeline/cost_profiles/*.json), one per GPU,
vLLM version and target shape. `benchmarks/gpu/measure_costs.py` measures them; `assemble` (below) fits them.

Model, at concurrency c (c requests decoding together):
- a plain step takes T(c) ms and makes c tokens (T measured against batch size, interpolated);
- a speculative step drafting D tokens per request takes T(c * (1 + D)) for the target's verify pass over
  c * (1 + D) tokens, plus D * d(c) for the drafter (d: its cost per drafted token at that batch, fitted from
  steps measured at two k; D = k for a model drafter, fewer for n-gram lookups that find no match);
- each request gains 1 + A tokens per step, A the accepted tokens per step of the CPU acceptance estimate.
Predicted speedup = (1 + A) * T(c) / (T(c * (1 + D)) + D * d(c)). Decode only: prefill is the same with and
without speculation, so served ratios sit a little closer to 1 than predicted.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError

SCHEMA = 1
PROFILE_DIR = Path(__file__).parent / "cost_profiles"
VLLM_VERSION = "0.26.0"  # the vLLM the bundles are served with (deploy.image, the GPU evidence)
DEFAULT_GPU = "h100"  # serving.gpu null: the GPU the committed profiles were measured on


@dataclass(frozen=True)
class MethodCost:
    drafter: dict  # the drafter's shape as measured (parameters, layers), for the record
    draft_ms_per_token: dict[str, float]  # batch size -> drafter cost per drafted token (ms)
    drafted_per_step: dict[str, float]  # batch size -> tokens drafted per request per step as measured
    holdout_error: dict[str, float]  # batch size -> |predicted - measured| / measured step time, fit on one k
    measured_k: list[int]


@dataclass(frozen=True)
class CostProfile:
    name: str
    gpu: str
    gpu_name: str
    vllm_version: str
    target: dict  # params, hidden_size, num_hidden_layers, vocab_size
    plain_step_ms: dict[str, float]  # batch size (tokens per step) -> plain decode step time (ms), monotone fit
    methods: dict[str, MethodCost]
    source: str  # the raw files and the command that measured them
    plain_step_ms_measured: dict[str, float] = field(default_factory=dict)  # as measured, before the monotone fit
    schema: int = SCHEMA

    def plain_ms(self, tokens: float) -> float:
        return interpolate(self.plain_step_ms, tokens)

    def spec_ms(self, method: str, concurrency: int, drafted: float) -> float:
        """One speculative step at this concurrency, drafting `drafted` tokens per request."""
        cost = self.methods[method]
        return self.plain_ms(concurrency * (1 + drafted)) + drafted * interpolate(cost.draft_ms_per_token, concurrency)

    def speedup(self, method: str, concurrency: int, accepted: float, drafted: float) -> float:
        return (1 + accepted) * self.plain_ms(concurrency) / self.spec_ms(method, concurrency, drafted)


def interpolate(table: dict[str, float], x: float) -> float:
    """Piecewise linear over the measured points; the end segments extend beyond them (a step's time grows
    about linearly in its tokens once compute-bound; below the first point it is flat)."""
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
    h, inter, layers, vocab = (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                               config["vocab_size"])
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    per_layer = attn + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings") else vocab * h
    return vocab * h + layers * per_layer + h + head


# --- reading and choosing profiles -------------------------------------------------------------------------

def parse(data: dict, where: str) -> CostProfile:
    from pipeline.records import from_dict

    profile = from_dict(CostProfile, data, where)
    if profile.schema != SCHEMA:
        raise PipelineError(f"{where}: cost profile schema {profile.schema}, this pipeline reads {SCHEMA}")
    if not profile.plain_step_ms or any(v <= 0 for v in profile.plain_step_ms.values()):
        raise PipelineError(f"{where}: plain_step_ms must hold positive step times")
    return profile


def load(path: str | Path) -> CostProfile:
    from pipeline.records import read_object

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
        profile = load(path) if path.suffix == ".json" else next(
            (p for p in available(directory) if p.name == setting), None)
        if profile is None:
            raise PipelineError(f"serving.speculation.cost_profile: no profile named {setting!r} in {directory} "
                                f"(names: {', '.join(p.name for p in available(directory)) or 'none'})")
        return Choice(profile, f"serving.speculation.cost_profile names {profile.name}",
                      target_params / profile.target["params"])
    pool = [p for p in available(directory) if p.gpu == want_gpu and p.vllm_version == VLLM_VERSION]
    if not pool:
        return Choice(None, f"no serving-cost profile measured on {want_gpu} with vLLM {VLLM_VERSION} "
                            "(benchmarks/gpu/measure_costs.py measures one)")
    best = min(pool, key=lambda p: abs(math.log(target_params / p.target["params"])))
    ratio = target_params / best.target["params"]
    gpu_note = "" if gpu else f" (serving.gpu is null: predicted for the {DEFAULT_GPU})"
    return Choice(best, f"nearest target size among {len(pool)} {want_gpu} profiles: {best.name}, "
                        f"x{ratio:.3g} this target's parameters{gpu_note}", ratio)


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

    def tokens_per_s(self, concurrency: int, k: int) -> float:
        return self.plain_tokens_per_s[str(concurrency)] * (self.speedup(concurrency, k) if k else 1.0)


def predict(choice: Choice, method: str, accepted_per_step: dict[str, float], drafted_per_step: dict[str, float],
            concurrencies: list[int]) -> ServedPrediction | None:
    """accepted/drafted per step by k (the CPU estimate's schedule). None without a profile for the method."""
    profile = choice.profile
    if profile is None or method not in profile.methods:
        return None
    speedups, plain, best = {}, {}, {}
    for c in sorted(set(concurrencies)):
        by_k = {k: profile.speedup(method, c, accepted_per_step[k], drafted_per_step[k]) for k in accepted_per_step}
        speedups[str(c)] = by_k
        plain[str(c)] = 1000.0 * c / profile.plain_ms(c)
        best[str(c)] = int(max(by_k, key=by_k.get))
    return ServedPrediction(profile=profile.name, basis=choice.reason, method=method, plain_tokens_per_s=plain,
                            speedup_by_k=speedups, best_k=best, target_params_ratio=choice.target_params_ratio)


# --- fitting a profile from measure_costs.py's raw output (CPU) --------------------------------------------

def _step(run: dict, batch: int) -> tuple[float, float]:
    """(ms per engine step, drafted tokens per request per step) from a short and a long timed generation."""
    short, long = run["short"], run["long"]
    steps = [(r["tokens"] - (r.get("num_accepted_tokens") or 0)) / batch for r in (short, long)]
    ms = 1000.0 * (long["wall_s"] - short["wall_s"]) / (steps[1] - steps[0])
    drafted = ((long.get("num_draft_tokens") or 0) - (short.get("num_draft_tokens") or 0)) / batch / (steps[1] - steps[0])
    return ms, drafted


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


def _drafter_ms(plain: dict[str, float], points: list[tuple[int, float, float]], batch: int) -> float:
    """Least-squares drafter cost per drafted token over (k, step ms, drafted) points at one batch size."""
    num = sum(d * (ms - interpolate(plain, batch * (1 + d))) for _, ms, d in points)
    den = sum(d * d for _, _, d in points)
    return max(0.0, num / den) if den else 0.0


def assemble(raw_dir: Path, shape_dir: Path, name: str, gpu: str, source: str) -> CostProfile:
    """The profile of one shape from measure_costs.py's OUT/<shape>/*.json (plain-k0 plus <method>-k<k>) and
    the shape's configs (SHAPE_DIR/target/config.json, draft/config.json); gpu.txt and versions.txt beside
    the shape's raw folder name the GPU and vLLM."""
    shape_cfg = json.loads((shape_dir / "target" / "config.json").read_text())
    plain_raw = json.loads((raw_dir / "plain-k0.json").read_text())
    measured = {str(r["batch"]): _step(r, r["batch"])[0] for r in sorted(plain_raw["runs"], key=lambda r: r["batch"])}
    plain = monotone(measured)
    methods: dict[str, MethodCost] = {}
    for method in ("draft_model", "eagle3", "ngram"):
        files = sorted(raw_dir.glob(f"{method}-k*.json"))
        files = [f for f in files if not f.name.endswith(".failed.json")]
        if not files:
            continue
        by_k = {}
        for f in files:
            rec = json.loads(f.read_text())
            by_k[rec["k"]] = {r["batch"]: _step(r, r["batch"]) for r in rec["runs"]}
        batches = sorted(set.intersection(*(set(v) for v in by_k.values())))
        cost, drafted, error = {}, {}, {}
        for b in sorted(batches):
            points = [(k, *by_k[k][b]) for k in sorted(by_k)]
            cost[str(b)] = _drafter_ms(plain, points, b)
            drafted[str(b)] = max(d for _, _, d in points)
            if len(points) >= 2:  # fit on each k alone, predict the other(s): the model's own check
                errs = []
                for i, (_, _, _) in enumerate(points):
                    fit = _drafter_ms(plain, [points[i]], b)
                    for j, (_, ms, d) in enumerate(points):
                        if j != i:
                            errs.append(abs(interpolate(plain, b * (1 + d)) + d * fit - ms) / ms)
                error[str(b)] = max(errs)
        drafter = {}
        if method == "draft_model":
            dcfg = json.loads((shape_dir / "draft" / "config.json").read_text())
            drafter = {"params": llama_params(dcfg), "num_hidden_layers": dcfg["num_hidden_layers"]}
        methods[method] = MethodCost(drafter=drafter, draft_ms_per_token=cost, drafted_per_step=drafted,
                                     holdout_error=error, measured_k=sorted(by_k))
    target = {"params": llama_params(shape_cfg), **{k: shape_cfg[k] for k in (
        "hidden_size", "num_hidden_layers", "vocab_size")}}
    gpu_txt = raw_dir.parent / "gpu.txt"
    versions = (raw_dir.parent / "versions.txt").read_text().split() if (raw_dir.parent / "versions.txt").exists() else []
    return CostProfile(name=name, gpu=gpu, gpu_name=gpu_txt.read_text().split(",")[0].strip() if gpu_txt.exists() else "",
                       vllm_version=versions[1] if len(versions) > 1 else VLLM_VERSION, target=target,
                       plain_step_ms=plain, methods=methods, source=source, plain_step_ms_measured=measured)


def write(profile: CostProfile, path: Path) -> None:
    path.write_text(json.dumps(asdict(profile), indent=1) + "\n")  # batch sizes stay in ascending order


def main(argv: list[str]) -> int:
    """python -m pipeline.serving_costs assemble RAW_SHAPE_DIR SHAPE_DIR NAME GPU OUT.json"""
    if len(argv) != 6 or argv[0] != "assemble":
        print(main.__doc__, file=sys.stderr)
        return 2
    raw, shape, name, gpu, out = Path(argv[1]), Path(argv[2]), argv[3], argv[4], Path(argv[5])
    write(assemble(raw, shape, name, gpu, f"{raw} (python benchmarks/gpu/measure_costs.py run)"), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
