"""A per-layer precision search (quantize.variants.<v>.mixed, issue 46): the cheapest checkpoint, one scheme per decoder
layer from a ladder (the variant's own, e.g. W4A16, then its `mixed.schemes`, e.g. W8A16, UNQUANTIZED), that passes
the variant's own quality gate.

1. Sensitivity: each decoder layer's Linear weights quantized alone to each quantized scheme of the ladder, round to
   nearest exactly as compressed-tensors quantizes them (calculate_qparams, fake_quantize: the weights an RTN
   checkpoint holds, tests/quantize/test_mixed.py), the rest of the model left as it is; KL(unquantized || that model)
   per response token on calibration rows (the evaluate stage's KL, on data the gate does not score).
2. Frontier: from every layer at the variant's scheme, promote the layer whose next scheme removes the most predicted
   KL per checkpoint byte it adds, until every layer is at the top of the ladder. A layout's KL is predicted as the
   sum of its layers' (each measured alone); its cost is its predicted checkpoint bytes (layout_bytes).
3. Walk: from the cheapest point predicted within the gate's KL bound, quantize the layout for real (the variant's
   GPTQ or RTN, one config group per scheme), score it with the gate's own metrics (evaluate/quality.py's fidelity)
   on the same calibration rows, and its pass@1 drop on functional tasks the gate does not score where the stage
   measures one, against the variant's thresholds less `margin` of each one's allowed loss, and
   where it fails bisect between the last failing point and the first passing one (the frontier's end while none
   has) until `max_tries` layouts were tried; the layout shipped is the cheapest that passed, else the most
   expensive tried, with why none passed.

The stage `mixed@<variant>` runs the search and writes the layout (paths.MIXED / <variant> / paths.LAYOUT) with the
checkpoint the walk quantized and scored for it (paths.CHECKPOINT); `quantize@<variant>` ships that very checkpoint,
never a second quantization of the layout. Apart, so the gate's thresholds, which the walk reads, are params of the
search only: an edited threshold re-runs every variant's search stage (a note that does not change for a variant
without `mixed:`), and no quantize@ whose checkpoint stays the same.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.stage import progress, say
from pipeline.quantize.recipes import GroupSize, VariantSpec, choose_group_size, scheme_for, with_group_size
from pipeline.quantize.settings import UNQUANTIZED, Calibration

# A Linear inside a numbered block: model.layers.3.self_attn.q_proj -> (model.layers, 3, self_attn.q_proj)
IN_LAYER = re.compile(r"^(?P<container>.+?)\.(?P<index>\d+)\.(?P<linear>.+)$")
OPS = {"<=": lambda v, b: v <= b, ">=": lambda v, b: v >= b, ">": lambda v, b: v > b}
FIDELITY = ("perplexity_increase_pct", "kl_divergence", "top1_agreement")  # the gate's metrics the walk checks
PASS_AT_1_DROP = "pass_at_1_drop"  # and, given a pass@1 measure, the gate's functional one (search's pass_at_1)
SENSITIVITY_PLOT = "plots/sensitivity"  # + /<variant>: pipeline/core/plots.py's directory plots
FRONTIER_PLOT = "plots/mixed_frontier"


@dataclass(frozen=True)
class Unit:
    """One decoder layer as the search sees it: its quantized Linear modules (names within the layer), their
    (out, in) shapes, in the model's order."""

    container: str
    index: int
    linears: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{self.container}.{self.index}.{name}" for name in self.linears)


@dataclass(frozen=True)
class Rung:
    """One scheme of the ladder and its weights' quantization (None: left in the checkpoint's dtype)."""

    scheme: str
    weights: object | None  # compressed_tensors QuantizationArgs


@dataclass(frozen=True)
class Point:
    """A frontier layout: each unit's rung index, its predicted checkpoint bytes of the searched layers' weights
    and predicted KL, and the unit promoted to reach it (None: the start, every layer at the variant's scheme)."""

    rungs: tuple[int, ...]
    bytes: int
    predicted_kl: float
    promoted: int | None = None


@dataclass(frozen=True)
class Bound:
    """One gate threshold the walk checks: the metric (fidelity's key), its comparison and the bound."""

    threshold: str
    metric: str
    op: str
    bound: float

    def holds(self, metrics: Mapping) -> bool:
        return OPS[self.op](metrics[self.metric], self.bound)


@dataclass(frozen=True)
class Attempt:
    """One layout quantized and scored: its frontier point, predicted bytes, the gate's metrics on it, the checks it
    failed, and its quantize metrics (oneshot.quantize_metrics)."""

    point: int
    bytes: int
    metrics: dict
    failed: tuple[str, ...]
    quantized: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Search:
    """What the search found: units, ladder, sensitivities (unit index -> scheme -> KL), the frontier, the layouts
    tried and the one shipped."""

    units: tuple[Unit, ...]
    ladder: tuple[Rung, ...]
    sensitivity: dict[int, dict[str, float]]
    frontier: tuple[Point, ...]
    attempts: tuple[Attempt, ...] = ()
    chosen: int | None = None
    passed: bool = False
    reason: str | None = None
    spec: VariantSpec | None = field(default=None, compare=False)
    group: GroupSize | None = field(default=None, compare=False)  # the variant's group size against these layers


def decoder_units(model, ignore: list[str]) -> tuple[Unit, ...]:
    """The model's quantized Linear modules (minus ignore, matched as llm-compressor matches them) by decoder layer.
    A Linear outside a numbered block has no layer to search: refused, so nothing is left unquantized unsaid."""
    from compressed_tensors.utils import match_named_modules

    layers: dict[tuple[str, int], list[tuple[str, tuple[int, int]]]] = {}
    for name, module in match_named_modules(model, ["Linear"], ignore):
        m = IN_LAYER.match(name)
        if m is None:
            raise PipelineError(
                f"the per-layer search (mixed) found Linear {name} outside any numbered decoder layer; "
                "add it to quantize.calibration.ignore or the variant's ignore"
            )
        layers.setdefault((m["container"], int(m["index"])), []).append(
            (m["linear"], (module.out_features, module.in_features))
        )
    return tuple(
        Unit(container, index, tuple(n for n, _ in linears), tuple(s for _, s in linears))
        for (container, index), linears in layers.items()
    )


def ladder_of(spec: VariantSpec) -> tuple[Rung, ...]:
    """The variant's scheme then its mixed.schemes, each with the variant's (resolved) group size."""
    schemes = (spec.scheme, *spec.mixed.schemes)
    return tuple(Rung(s, None if s == UNQUANTIZED else scheme_for(replace(spec, scheme=s)).weights) for s in schemes)


def linear_bytes(weights, out: int, inp: int, itemsize: int) -> int:
    """Predicted checkpoint bytes of one Linear's weight: packed integers, a scale in the checkpoint's dtype per group
    (per row when channel-wise) and, asymmetric, a packed zero point per group; unquantized, out x in x itemsize."""
    if weights is None:
        return out * inp * itemsize
    groups = out * (inp // weights.group_size if weights.strategy == "group" else 1)
    zero_points = 0 if weights.symmetric else math.ceil(groups * weights.num_bits / 8)
    return math.ceil(out * inp * weights.num_bits / 8) + groups * itemsize + zero_points


def unit_bytes(unit: Unit, rung: Rung, itemsize: int) -> int:
    return sum(linear_bytes(rung.weights, out, inp, itemsize) for out, inp in unit.shapes)


def fake_quantize_(module, weights) -> None:
    """module.weight rounded in place as compressed-tensors' RTN quantizes it (min/max per group or row)."""
    import torch
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = module.weight.data
    out, inp = w.shape
    size = weights.group_size if weights.strategy == "group" else inp
    grouped = w.float().reshape(out, inp // size, size)
    scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), weights)
    with torch.no_grad():
        module.weight.data = fake_quantize(w.float(), scale, zero_point, weights).to(w.dtype)


class KLScore:
    """Mean KL(unquantized || model) per response token over fixed examples; the unquantized log-probabilities are
    computed once (float32: tokens x vocabulary, kept in memory)."""

    def __init__(self, model, examples: list[tuple[list[int], list[int]]]):
        from pipeline.evaluate.quality import response_logprobs

        self.model, self.examples = model, [(p, r) for p, r in examples if r]
        if not self.examples:
            raise PipelineError("the per-layer search (mixed) has no calibration response tokens to score")
        self.baseline = [response_logprobs(model, p, r) for p, r in self.examples]
        self.tokens = sum(len(r) for _, r in self.examples)

    def __call__(self) -> float:
        import torch.nn.functional as F

        from pipeline.evaluate.quality import response_logprobs

        kl = sum(
            F.kl_div(response_logprobs(self.model, p, r), base, log_target=True, reduction="sum").item()
            for (p, r), base in zip(self.examples, self.baseline)
        )
        return kl / self.tokens


def measure_sensitivity(
    model, units: tuple[Unit, ...], ladder: tuple[Rung, ...], examples: list[tuple[list[int], list[int]]]
) -> dict[int, dict[str, float]]:
    """unit index -> quantized scheme -> KL of the model with only that unit's weights quantized to it."""
    score = KLScore(model, examples)
    modules = dict(model.named_modules())
    out: dict[int, dict[str, float]] = {}
    work = [(u, r) for u in units for r in ladder if r.weights is not None]
    for unit, rung in progress(work, desc="mixed: per-layer sensitivity"):
        originals = {n: modules[n].weight.data.clone() for n in unit.names}
        for n in unit.names:
            fake_quantize_(modules[n], rung.weights)
        out.setdefault(unit.index, {})[rung.scheme] = score()
        for n, w in originals.items():
            modules[n].weight.data = w
    return out


def frontier(
    units: tuple[Unit, ...], ladder: tuple[Rung, ...], sensitivity: Mapping[int, Mapping[str, float]], itemsize: int
) -> tuple[Point, ...]:
    """Greedy by KL removed per byte added: each step promotes the unit whose next rung buys the most (ties: the
    earlier layer), from every unit at rung 0 until every unit is at the top."""

    def kl(u: Unit, r: int) -> float:
        return 0.0 if ladder[r].weights is None else sensitivity[u.index][ladder[r].scheme]

    def cost(u: Unit, r: int) -> int:
        return unit_bytes(u, ladder[r], itemsize)

    rungs = [0] * len(units)
    points = [Point(tuple(rungs), sum(cost(u, 0) for u in units), sum(kl(u, 0) for u in units))]
    while any(r < len(ladder) - 1 for r in rungs):
        best = max(
            (i for i, r in enumerate(rungs) if r < len(ladder) - 1),
            key=lambda i: (
                (kl(units[i], rungs[i]) - kl(units[i], rungs[i] + 1))
                / max(cost(units[i], rungs[i] + 1) - cost(units[i], rungs[i]), 1),
                -i,
            ),
        )
        rungs[best] += 1
        points.append(
            Point(
                tuple(rungs),
                sum(cost(u, r) for u, r in zip(units, rungs)),
                sum(kl(u, r) for u, r in zip(units, rungs)),
                units[best].index,
            )
        )
    return tuple(points)


def targets_of(units: tuple[Unit, ...], ladder: tuple[Rung, ...], rungs: tuple[int, ...]) -> dict[str, list[str]]:
    """scheme -> module patterns for recipes.config_groups: one regex per scheme and layer container
    (`re:model\\.layers\\.(?:0|5)\\.(?:mlp\\.down_proj|...)$`, matched from the start of a module name, as
    compressed-tensors and vLLM match `re:` targets)."""
    out: dict[str, list[str]] = {}
    for r, rung in enumerate(ladder):
        chosen = [u for u, ur in zip(units, rungs) if ur == r]
        by_container: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for u in chosen:
            by_container.setdefault((u.container, u.linears), []).append(u.index)
        out[rung.scheme] = [
            f"re:{re.escape(c)}\\.(?:{'|'.join(map(str, idx))})\\.(?:{'|'.join(re.escape(n) for n in linears)})$"
            for (c, linears), idx in by_container.items()
        ]
    return out


def layout_of(units: tuple[Unit, ...], ladder: tuple[Rung, ...], rungs: tuple[int, ...]) -> dict[str, list[int]]:
    """scheme -> the decoder layers at it (the card's and the metrics' layout)."""
    return {rung.scheme: [u.index for u, ur in zip(units, rungs) if ur == r] for r, rung in enumerate(ladder)}


def start_point(points: tuple[Point, ...], bounds: tuple[Bound, ...]) -> int:
    """The cheapest point whose predicted KL is within the gate's KL bound (0 without one, or where none is)."""
    kl = [b.bound for b in bounds if b.metric == "kl_divergence" and b.op == "<="]
    if not kl:
        return 0
    return next((i for i, p in enumerate(points) if p.predicted_kl <= min(kl)), 0)


def tightened(bounds: tuple[Bound, ...], margin: float) -> tuple[Bound, ...]:
    """The bounds with `margin` of each threshold's allowed loss kept in reserve: a maximum (perplexity increase, KL)
    times 1 - margin, a minimum agreement (top-1, a share) raised so that its allowed disagreement shrinks alike
    (0.85 at 0.2: 0.88). The walk scores calibration rows; the gate, held-out rows it never saw."""
    if not margin:
        return bounds

    def tighter(b: Bound) -> float:
        bound = b.bound * (1 - margin) if b.op == "<=" else 1 - (1 - b.bound) * (1 - margin)
        return float(f"{bound:.6g}")

    return tuple(replace(b, bound=tighter(b)) for b in bounds)


def walk(
    points: tuple[Point, ...], bounds: tuple[Bound, ...], max_tries: int, evaluate: Callable[[int], tuple[dict, dict]]
) -> tuple[tuple[Attempt, ...], int, bool, str | None]:
    """Score start_point; where it fails, bisect between the most expensive point that failed and the cheapest that
    passed (the end of the frontier while none has): the measured loss falls near-monotonically with cost, so
    max_tries layouts reach about 2**(max_tries - 1) points past the start, not max_tries. evaluate(i) quantizes point
    i and returns (the gate's metrics, its quantize metrics). (attempts, the point shipped: the cheapest that passed,
    else the most expensive tried; passed; why not)."""
    attempts: list[Attempt] = []

    def passes(i: int) -> bool:
        metrics, quantized = evaluate(i)
        failed = tuple(
            f"{b.threshold}: {b.metric} {metrics[b.metric]:.4g} not {b.op} {b.bound}"
            for b in bounds
            if not b.holds(metrics)
        )
        attempts.append(Attempt(i, points[i].bytes, metrics, failed, quantized))
        return not failed

    first = start_point(points, bounds)
    if passes(first):
        return tuple(attempts), first, True, None
    failing, passing = first, len(points)  # len(points): none passed yet
    while len(attempts) < max_tries and passing - failing > 1:
        mid = (failing + passing) // 2
        failing, passing = (failing, mid) if passes(mid) else (mid, passing)
    if passing < len(points):
        return tuple(attempts), passing, True, None
    last = attempts[-1]  # every try failed: the last is the most expensive
    where = (
        "even the frontier's most expensive point failed"
        if last.point == len(points) - 1
        else f"within {len(attempts)} tries (quantize.variants.<v>.mixed.max_tries: {max_tries})"
    )
    why = (
        f"no layout passed the gate {where}; frontier points tried {', '.join(str(a.point) for a in attempts)} of "
        f"{len(points) - 1}, from {first}, the cheapest predicted to pass; the most expensive tried failed "
        + "; ".join(last.failed)
    )
    return tuple(attempts), last.point, False, why


def search(
    model_dir: Path,
    spec: VariantSpec,
    calibration_texts: list[str],
    examples: list[tuple[list[int], list[int]]],
    cfg: Calibration,
    bounds: tuple[Bound, ...],
    keep: Path | None = None,
    pass_at_1: Callable[[object], float] | None = None,
) -> Search:
    """Sensitivity, frontier and walk for a variant with `mixed:` (each try quantized into a temporary directory);
    keep: where the shipped layout's checkpoint is moved (None: dropped with the other tries); pass_at_1: a model's
    pass@1 on functional tasks the gate does not score (None: not checked), measured once on the unquantized target
    and on each try, whose drop (PASS_AT_1_DROP) a bound in `bounds` may then hold."""
    from pipeline.evaluate.quality import fidelity
    from pipeline.models.loading import load_causal_lm
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import input_widths

    ignore = sorted(set(cfg.ignore) | set(spec.ignore))
    baseline = load_causal_lm(model_dir)
    group = choose_group_size(spec, input_widths(baseline, ignore))
    spec = with_group_size(spec, group)
    units, ladder = decoder_units(baseline, ignore), ladder_of(spec)
    rows = examples[: spec.mixed.samples]
    itemsize = checkpoint_itemsize(model_dir)
    sensitivity = measure_sensitivity(baseline, units, ladder, rows)
    points = frontier(units, ladder, sensitivity, itemsize)
    base_pass = pass_at_1(baseline) if pass_at_1 else None
    with tempfile.TemporaryDirectory(prefix="mixed-", dir=keep.parent if keep else None) as work:  # keep: a rename

        def evaluate(i: int) -> tuple[dict, dict]:
            tried = Path(work) / f"point-{i}"
            metrics = quantize_model(
                model_dir, tried, spec, calibration_texts, cfg, targets_of(units, ladder, points[i].rungs)
            )
            model = load_causal_lm(tried)
            quality = fidelity(baseline, model, rows)
            functional = ""
            if pass_at_1:
                own = pass_at_1(model)
                quality |= {"pass_at_1": own, "pass_at_1_baseline": base_pass, PASS_AT_1_DROP: base_pass - own}
                functional = f", pass@1 {own:.3f} (unquantized {base_pass:.3f})"
            say(
                f"mixed {spec.name}: frontier point {i}, {metrics['size_after_mb']} MB, "
                f"KL {quality['kl_divergence']:.4g} (predicted {points[i].predicted_kl:.4g}), "
                f"ppl {quality['perplexity_increase_pct']:+.2f}%, top-1 {quality['top1_agreement']:.3f}{functional}"
            )
            return quality, metrics

        attempts, chosen, passed, reason = walk(
            points, tightened(bounds, spec.mixed.margin), spec.mixed.max_tries, evaluate
        )
        if reason and spec.mixed.margin:
            reason += f" (thresholds less quantize.variants.<v>.mixed.margin {spec.mixed.margin} of their loss)"
        if keep is not None:
            shutil.move(Path(work) / f"point-{chosen}", keep)
    return Search(units, ladder, sensitivity, points, attempts, chosen, passed, reason, spec, group)


def checkpoint_itemsize(model_dir: Path) -> int:
    """Bytes per unquantized weight in the checkpoint (its config's dtype; 2 for BF16/FP16)."""
    import torch
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).dtype
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 2


def shipped_targets(found: Search) -> dict[str, list[str]]:
    """The layout quantize@<variant> quantizes: scheme -> module patterns (recipes.config_groups' targets)."""
    return targets_of(found.units, found.ladder, found.frontier[found.chosen].rungs)


def shipped_metrics(found: Search) -> dict:
    """The shipped checkpoint's quantize metrics as quantize@<variant> records them: without the run-dependent ones
    (a DVC output is rebuilt bit for bit), the group size as configured (each try quantized with the one chosen)."""
    from pipeline.quantize.oneshot import RUN_DEPENDENT, group_metrics

    quantized = next(a.quantized for a in found.attempts if a.point == found.chosen)
    return {**{k: v for k, v in quantized.items() if k not in RUN_DEPENDENT}, **group_metrics(found.group)}


def search_metrics(found: Search) -> dict:
    """The quantize metrics' `mixed` record: the layout shipped, whether it passed, each try, the sensitivities."""
    chosen = found.frontier[found.chosen]
    return {
        "schemes": [r.scheme for r in found.ladder],
        "layout": layout_of(found.units, found.ladder, chosen.rungs),
        "passed": found.passed,
        "reason": [found.reason] if found.reason else [],
        "margin": found.spec.mixed.margin if found.spec else 0.0,
        "frontier_point": found.chosen,
        "frontier_points": len(found.frontier),
        "predicted_bytes": chosen.bytes,
        "predicted_bytes_uniform": found.frontier[0].bytes,
        "predicted_bytes_top": found.frontier[-1].bytes,
        "tries": [
            {
                "point": a.point,
                "predicted_bytes": a.bytes,
                "size_mb": a.quantized.get("size_after_mb"),
                **{
                    k: a.metrics[k]
                    for k in (*FIDELITY, "pass_at_1", "pass_at_1_baseline", PASS_AT_1_DROP)
                    if k in a.metrics
                },
                "failed": list(a.failed),
            }
            for a in found.attempts
        ],
        "sensitivity": [{"layer": u.index, **found.sensitivity[u.index]} for u in found.units],
    }


def sensitivity_rows(found: Search) -> list[dict]:
    """plots/sensitivity/<v>: a bar per decoder layer, the KL of the variant's own scheme on it alone."""
    base = found.ladder[0].scheme
    return [
        {
            "layer": f"layer {u.index}",
            "kl_divergence": found.sensitivity[u.index][base],
            **{r.scheme: found.sensitivity[u.index][r.scheme] for r in found.ladder if r.weights is not None},
        }
        for u in found.units
    ]


def frontier_rows(found: Search) -> list[dict]:
    """plots/mixed_frontier/<v>: predicted checkpoint MB of the searched layers against predicted KL, each point's
    measured KL where the walk quantized and scored it."""
    measured = {a.point: a.metrics["kl_divergence"] for a in found.attempts}
    return [
        {
            "point": i,
            "predicted_mb": round(p.bytes / 1e6, 4),
            "predicted_kl": p.predicted_kl,
            "measured_kl": measured.get(i),
            "promoted_layer": p.promoted,
        }
        for i, p in enumerate(found.frontier)
    ]
