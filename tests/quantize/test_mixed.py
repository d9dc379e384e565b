"""The per-layer precision search (quantize.variants.<v>.mixed, pipeline/quantize/mixed.py) with real llm-compressor
and compressed-tensors on the tiny demo target: the sensitivity proxy is what RTN saves, a layer made fragile on
purpose ranks first and is promoted first, the checkpoint holds one config group per scheme and loads as evaluate
loads it, the walk ships a layout passing a KL bound uniform INT4 fails, and bad `mixed:` sections are refused."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import full_text, prompt_and_response_ids
from pipeline.data.settings import DataParams
from pipeline.data.traffic import dedup, load_traffic, split, write_split
from pipeline.evaluate.quality import fidelity
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.quantize import mixed
from pipeline.quantize.oneshot import RUN_DEPENDENT, quantize_model
from pipeline.quantize.recipes import parse_variant
from pipeline.quantize.settings import UNQUANTIZED, Calibration
from tiny_project import ROOT, copy_project, run, tiny_params

FRAGILE = 1  # the tiny target's middle layer of three
SPEC = {
    "algorithm": "rtn",
    "scheme": "W4A16",
    "group_size": 128,
    "mixed": {"schemes": ["W8A16", UNQUANTIZED], "samples": 3, "max_tries": 3},
}
CFG = Calibration.parse({"num_samples": 16, "max_seq_length": 256})


def make_fragile(src: Path, dest: Path, layer: int, factor: float = 50.0, group: int = 128) -> Path:
    """The target with one outlier per weight group in a layer's residual outputs (o_proj, down_proj): the group's
    INT4 scale grows with it and every other weight of the group rounds to zero, so INT4 hurts this layer most."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dest)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        weight = model.get_submodule(f"model.layers.{layer}.{name}").weight.data
        grouped = weight.view(weight.shape[0], -1, group)
        grouped[:, :, 0] = factor * grouped.abs().amax(-1)
    model.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def fragile(demo_pair, tmp_path_factory) -> Path:
    return make_fragile(demo_pair[0], tmp_path_factory.mktemp("fragile") / "target", FRAGILE)


@pytest.fixture(scope="module")
def calibration(demo_pair) -> tuple[list[str], list]:
    """(texts, (prompt, response) ids) of the demo's calibration split, short rows first (the scoring's cost)."""
    data = DataParams.parse(tiny_params()["data"])
    rows = split(dedup(load_traffic(ROOT / data.traffic)), data.fractions, data.seed)["calibration"]
    tokenizer = load_tokenizer(demo_pair[0])
    rows = sorted(rows, key=lambda m: len(full_text(tokenizer, m)))[:8]
    return [full_text(tokenizer, m) for m in rows], [prompt_and_response_ids(tokenizer, m) for m in rows]


@pytest.fixture(scope="module")
def measured(fragile, calibration):
    """The fragile target's units, ladder and per-layer sensitivities."""
    spec = parse_variant("mixed-w4a16", SPEC)
    model = load_causal_lm(fragile)
    units, ladder = mixed.decoder_units(model, ["lm_head"]), mixed.ladder_of(spec)
    return units, ladder, mixed.measure_sensitivity(model, units, ladder, calibration[1][:3])


def test_the_fragile_layer_ranks_first_and_is_promoted_first(measured):
    units, ladder, sensitivity = measured
    int4 = {u.index: sensitivity[u.index]["W4A16"] for u in units}
    assert max(int4, key=int4.get) == FRAGILE, int4
    assert all(sensitivity[i]["W8A16"] < int4[i] for i in int4)  # eight bits hurt every layer less than four
    points = mixed.frontier(units, ladder, sensitivity, itemsize=2)
    assert points[1].promoted == FRAGILE and points[1].rungs[FRAGILE] == 1
    assert [p.bytes for p in points] == sorted(p.bytes for p in points)  # each step buys precision with bytes
    assert points[-1].predicted_kl == 0.0 and set(points[-1].rungs) == {len(ladder) - 1}


def test_the_search_spends_bytes_where_they_remove_most_kl_per_byte():
    """Greedy per byte, not per layer: a small layer half as sensitive as a layer four times its size goes first."""
    big = mixed.Unit("model.layers", 0, ("mlp.down_proj",), ((512, 512),))
    small = mixed.Unit("model.layers", 1, ("mlp.down_proj",), ((128, 512),))
    spec = parse_variant("m", SPEC)
    ladder = mixed.ladder_of(spec)
    sensitivity = {0: {"W4A16": 2e-3, "W8A16": 1e-5}, 1: {"W4A16": 1e-3, "W8A16": 1e-5}}
    points = mixed.frontier((big, small), ladder, sensitivity, itemsize=2)
    assert [p.promoted for p in points[1:3]] == [1, 0]
    # Under a KL budget the walk starts at the cheapest layout predicted within it: only the small layer promoted.
    bound = (mixed.Bound("max_kl_divergence", "kl_divergence", "<=", 2.5e-3),)
    assert mixed.start_point(points, bound) == 1
    assert mixed.layout_of((big, small), ladder, points[1].rungs) == {"W4A16": [0], "W8A16": [1], UNQUANTIZED: []}
    # W4A16 group 128: half a byte per weight plus a two-byte scale per group of 128
    assert points[0].bytes == (512 * 512 + 128 * 512) // 2 + (512 * 4 + 128 * 4) * 2


def test_one_checkpoint_holds_a_config_group_per_scheme_and_rtn_saves_the_proxy(fragile, measured, tmp_path):
    units, ladder, _ = measured
    spec = parse_variant("mixed-w4a16", SPEC)
    rungs = tuple({FRAGILE: 2, 0: 1}.get(u.index, 0) for u in units)  # layer 0 W8A16, the fragile one BF16, 2 INT4
    out = tmp_path / "ckpt"
    quantize_model(fragile, out, spec, [], CFG, mixed.targets_of(units, ladder, rungs))

    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    groups = {g["weights"]["num_bits"]: g["targets"] for g in qc["config_groups"].values()}
    assert set(groups) == {4, 8}
    assert groups[8] == [
        r"re:model\.layers\.(?:0)\.(?:self_attn\.q_proj|self_attn\.k_proj|self_attn\.v_proj|"
        r"self_attn\.o_proj|mlp\.gate_proj|mlp\.up_proj|mlp\.down_proj)$"
    ]
    assert set(qc["ignore"]) == {"lm_head", *units[FRAGILE].names}

    original, saved = load_causal_lm(fragile), load_causal_lm(out)  # as the evaluate stage loads a variant
    for unit, rung in zip(units, rungs):
        for name in unit.names:
            w, got = original.get_submodule(name), saved.get_submodule(name).weight.data
            if ladder[rung].weights is None:
                assert torch.equal(got, w.weight.data), name  # left as it was
                continue
            before = w.weight.data.clone()
            mixed.fake_quantize_(w, ladder[rung].weights)
            # The proxy rounds as RTN does; the checkpoint's scales and dequantized weights are BF16, the proxy's
            # float32, so a weight on a rounding boundary may land one step apart.
            err = (w.weight.data - got).abs()
            same = (err <= 2**-7 * before.abs().max()).float().mean().item()
            assert same >= 0.99, (name, same)
            if ladder[rung].weights.num_bits == 4:  # INT4 moves the weights far more than BF16 storage does
                assert err.mean() < (before - got).abs().mean() / 8, name


def test_the_walk_ships_a_layout_that_passes_a_bound_uniform_int4_fails(fragile, measured, calibration, tmp_path):
    units, ladder, sensitivity = measured
    texts, examples = calibration
    points = mixed.frontier(units, ladder, sensitivity, itemsize=2)
    # Between what INT4 on every layer is predicted to cost and what it costs with the fragile layer promoted.
    bound_kl = (points[0].predicted_kl * points[1].predicted_kl) ** 0.5
    bounds = (mixed.Bound("max_kl_divergence", "kl_divergence", "<=", bound_kl),)
    spec = parse_variant("mixed-w4a16", SPEC)

    found = mixed.search(fragile, spec, texts, examples, CFG, bounds)
    assert found.passed and found.reason is None
    quantize_model(fragile, tmp_path / "mixed", spec, texts, CFG, mixed.shipped_targets(found))  # quantize@'s part
    shipped = fidelity(load_causal_lm(fragile), load_causal_lm(tmp_path / "mixed"), examples[:3])
    assert shipped["kl_divergence"] <= bound_kl
    record = mixed.search_metrics(found)
    assert FRAGILE not in record["layout"]["W4A16"] and record["layout"]["W4A16"]  # mixed: some layers stay INT4
    assert record["predicted_bytes"] < record["predicted_bytes_top"]

    quantize_model(fragile, tmp_path / "uniform", spec, [], CFG)  # the same variant without the search
    uniform = fidelity(load_causal_lm(fragile), load_causal_lm(tmp_path / "uniform"), examples[:3])
    assert uniform["kl_divergence"] > bound_kl, (uniform["kl_divergence"], bound_kl)


def walk_on(top1: dict[int, float], max_tries: int, bounds=None):
    """The walk over six points (predicted KL 1/(i+1)) against a KL bound of 0.6 (start: point 1) and a top-1 bound
    of 0.9, each point scoring top1[i]; (the points tried, the walk's answer)."""
    points = tuple(mixed.Point((i,), 100 * (i + 1), 1.0 / (i + 1)) for i in range(6))
    bounds = bounds or (
        mixed.Bound("max_kl_divergence", "kl_divergence", "<=", 0.6),
        mixed.Bound("min_top1_agreement", "top1_agreement", ">=", 0.9),
    )
    tried = []

    def evaluate(i):
        tried.append(i)
        return {"kl_divergence": 1.0 / (i + 1), "top1_agreement": top1[i]}, {"size_after_mb": float(i)}

    return tried, mixed.walk(points, bounds, max_tries, evaluate)


def test_the_walk_bisects_up_the_frontier_to_the_cheapest_passing_point():
    rising = {i: 0.8 + 0.03 * i for i in range(6)}  # point 4 is the first that passes both
    # One point at a time, three tries (1, 2, 3) would all fail; bisecting reaches 4 and ships it.
    tried, (attempts, chosen, passed, why) = walk_on(rising, 3)
    assert tried == [1, 3, 4] and chosen == 4 and passed and why is None
    assert "min_top1_agreement" in attempts[0].failed[0] and attempts[-1].failed == ()

    # Until a point passes, the frontier's end stands in for one: 3 (between 1 and 6), then 4, fail; 5 passes.
    tried, (_, chosen, passed, _) = walk_on({i: 0.95 if i >= 5 else 0.8 for i in range(6)}, 5)
    assert tried == [1, 3, 4, 5] and chosen == 5 and passed  # stops once the failing and passing points touch
    # After a pass, the bisection goes on below it: 3 passes, then 2 passes and ships.
    tried, (_, chosen, passed, _) = walk_on({i: 0.95 if i >= 2 else 0.8 for i in range(6)}, 3)
    assert tried == [1, 3, 2] and chosen == 2 and passed

    tried, (_, chosen, passed, _) = walk_on(rising, 1)  # the start passes or not: one try
    assert tried == [1] and chosen == 1 and not passed


def test_the_walk_says_when_it_runs_out_of_tries_or_the_frontier_ends():
    tried, (_, chosen, passed, why) = walk_on({i: 0.8 + 0.03 * i for i in range(6)}, 2)
    assert tried == [1, 3] and chosen == 3 and not passed  # the most expensive tried
    assert "within 2 tries" in why and "max_tries: 2" in why and "tried 1, 3 of 5" in why
    assert "min_top1_agreement: top1_agreement 0.89 not >= 0.9" in why and "\n" not in why

    tried, (_, chosen, passed, why) = walk_on({i: 0.8 for i in range(6)}, 10)
    assert tried == [1, 3, 4, 5] and chosen == 5 and not passed
    assert "even the frontier's most expensive point failed" in why and "max_tries" not in why


def test_a_margin_keeps_part_of_each_thresholds_allowed_loss_in_reserve():
    gate = (
        mixed.Bound("max_perplexity_increase_pct", "perplexity_increase_pct", "<=", 10.0),
        mixed.Bound("max_kl_divergence", "kl_divergence", "<=", 0.15),
        mixed.Bound("min_top1_agreement", "top1_agreement", ">=", 0.85),
    )
    assert mixed.tightened(gate, 0.0) == gate
    assert [b.bound for b in mixed.tightened(gate, 0.2)] == [8.0, 0.12, 0.88]
    # Point 1 passes the gate's own top-1 bound (0.9) by 0.035; with half its allowed loss in reserve (0.95), no.
    top1 = {i: 0.915 + 0.02 * i for i in range(6)}
    strict = mixed.tightened((mixed.Bound("min_top1_agreement", "top1_agreement", ">=", 0.9),), 0.5)
    assert walk_on(top1, 4)[1][1] == 1
    tried, (_, chosen, passed, _) = walk_on(top1, 4, strict)
    assert tried == [0, 3, 1, 2] and chosen == 2 and passed  # no KL bound: from point 0


def test_a_pass_at_1_bound_walks_past_layouts_whose_fidelity_passes():
    """Qwen2.5-Coder-1.5B's GPTQ W4A16 kept perplexity, KL and top-1 within their bounds and lost 6 of 64 tasks: with
    the gate's pass@1 bound in the walk, a layout that passes on fidelity and loses code is not shipped."""
    sys.path.insert(0, str(ROOT))
    from stages.mixed import gate_bounds

    params = tiny_params()
    fidelity_only = gate_bounds(params, "mixed-w4a16")
    with_code = gate_bounds(params, "mixed-w4a16", functional=True)
    assert [b.metric for b in with_code] == [*(b.metric for b in fidelity_only), mixed.PASS_AT_1_DROP]
    assert with_code[-1] == mixed.Bound("max_pass_at_1_drop", "pass_at_1_drop", "<=", 0.05)
    points = tuple(mixed.Point((i,), 100 * (i + 1), 1.0 / (i + 1)) for i in range(6))
    drop = {0: 0.2, 1: 0.12, 2: 0.08, 3: 0.04, 4: 0.0, 5: 0.0}  # fidelity passes everywhere; code from point 3

    def evaluate(i):
        return {
            "kl_divergence": 0.0,
            "top1_agreement": 1.0,
            "perplexity_increase_pct": 0.0,
            "pass_at_1_drop": drop[i],
        }, {}

    assert mixed.walk(points, fidelity_only, 4, evaluate)[1] == 0  # uniform INT4 ships, and fails the gate
    attempts, chosen, passed, _ = mixed.walk(points, with_code, 4, evaluate)
    assert (chosen, passed) == (3, True) and "max_pass_at_1_drop: pass_at_1_drop 0.2 not <= 0.05" in attempts[0].failed


def test_the_search_passes_where_one_point_at_a_time_would_run_out_of_tries(demo_pair, calibration, tmp_path):
    """Real quantization and scoring, every layer made fragile (unequally) so that the first promotions move
    perplexity well past the noise of a few rows: a perplexity bound frontier points 0 and 1 fail, 2 and 3 pass. With
    no KL bound the walk starts at point 0, so two tries one point at a time (0, 1) both fail; bisecting from 0
    tries the midpoint of the seven points, 3, and ships it."""
    target = demo_pair[0]
    for layer, factor in ((0, 20.0), (1, 50.0), (2, 10.0)):
        target = make_fragile(target, tmp_path / f"fragile-{layer}", layer, factor)
    texts, examples = calibration
    spec = parse_variant("mixed-w4a16", {**SPEC, "mixed": {**SPEC["mixed"], "max_tries": 2}})
    baseline = load_causal_lm(target)
    units, ladder = mixed.decoder_units(baseline, ["lm_head"]), mixed.ladder_of(spec)
    points = mixed.frontier(units, ladder, mixed.measure_sensitivity(baseline, units, ladder, examples[:3]), 2)

    def scored(i: int) -> float:  # as the walk scores a point
        out = tmp_path / f"point-{i}"
        quantize_model(target, out, spec, texts, CFG, mixed.targets_of(units, ladder, points[i].rungs))
        return fidelity(baseline, load_causal_lm(out), examples[:3])["perplexity_increase_pct"]

    ppl = [scored(i) for i in range(4)]
    assert max(ppl[2:]) < min(ppl[:2]), ppl  # the measured loss falls along the frontier
    bounds = (
        mixed.Bound("max_perplexity_increase_pct", "perplexity_increase_pct", "<=", (max(ppl[2:]) + min(ppl[:2])) / 2),
    )

    found = mixed.search(target, spec, texts, examples, CFG, bounds)
    assert found.frontier == points
    assert len(points) == 7 and [a.point for a in found.attempts] == [0, 3] and found.chosen == 3 and found.passed
    assert [a.metrics["perplexity_increase_pct"] for a in found.attempts] == pytest.approx([ppl[0], ppl[3]])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"algorithm": "awq"}, "quantizes with ['gptq', 'rtn'], not 'awq'"),
        ({"mixed": {"schemes": ["FP8_DYNAMIC"]}}, "'FP8_DYNAMIC' is not an integer weight-only scheme"),
        ({"mixed": {"schemes": [UNQUANTIZED, "W8A16"]}}, "must widen the variant's W4A16 step by step"),
        ({"mixed": {"schemes": ["W8A16"], "tries": 3}}, "unknown keys ['tries']"),
        ({"mixed": {"schemes": ["W8A16"], "max_tries": 0}}, "mixed.max_tries must be an integer >= 1"),
        ({"mixed": {"schemes": ["W8A16"], "margin": 1}}, "mixed.margin must be a number in [0, 1), got 1"),
        ({"mixed": {"schemes": ["W8A16"], "margin": -0.1}}, "mixed.margin must be a number in [0, 1)"),
        ({"mixed": {"schemes": ["W8A16"], "functional_tasks": -1}}, "mixed.functional_tasks must be an integer >= 0"),
    ],
)
def test_bad_mixed_sections_are_refused_with_one_line(change, message):
    with pytest.raises(PipelineError) as e:
        parse_variant("m", {**SPEC, **change})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_stage_writes_the_search_its_plots_and_the_uniform_variants_note(demo_pair, tmp_path):
    params = tiny_params()
    params["quantize"]["variants"]["mixed-w4a16"] = replace_samples(params["quantize"]["variants"]["mixed-w4a16"])
    params["quantize"]["enabled"] = ["mixed-w4a16", "fp8-dynamic"]
    params["gates"]["overrides"]["mixed-w4a16"] = {
        "max_kl_divergence": 10.0,
        "max_perplexity_increase_pct": 1000.0,
        "min_top1_agreement": 0.0,
    }  # loose: uniform INT4 passes
    project = copy_project(tmp_path, params)
    make_fragile(demo_pair[0], project / "artifacts" / "models" / "target", FRAGILE)
    data = DataParams.parse(params["data"])
    (project / "artifacts" / "data").mkdir()
    rows = split(dedup(load_traffic(ROOT / data.traffic)), data.fractions, data.seed)["calibration"]
    write_split(rows[:6], project / "artifacts" / "data" / "calibration.jsonl")

    refused = run([sys.executable, "-m", "stages.quantize", "mixed-w4a16"], cwd=project)  # before its search
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1 and "mixed/mixed-w4a16/layout.json" in errors[0], refused.stderr
    assert not (project / "artifacts" / "quantized" / "mixed-w4a16").exists()
    target = project / "artifacts" / "models" / "target"
    for variant in ("mixed-w4a16", "fp8-dynamic"):
        for stage in ("mixed", "quantize"):
            if (variant, stage) == ("mixed-w4a16", "quantize"):  # ships the searched checkpoint: needs no target
                target.rename(target.with_name("away"))
            result = run([sys.executable, "-m", f"stages.{stage}", variant], cwd=project)
            assert result.returncode == 0, result.stderr[-3000:]
            if target.with_name("away").exists():
                target.with_name("away").rename(target)
    searched, shipped = (project / "artifacts" / d / "mixed-w4a16" for d in ("mixed", "quantized"))
    assert {p.name: p.read_bytes() for p in (searched / "checkpoint").iterdir()} == {
        p.name: p.read_bytes() for p in shipped.iterdir()
    }  # the checkpoint the walk scored, byte for byte
    layout = json.loads((project / "artifacts" / "mixed" / "mixed-w4a16" / "layout.json").read_text())
    record = json.loads((project / "metrics" / "quantize-mixed-w4a16.json").read_text())
    assert record["mixed"] == layout["search"] and set(layout["targets"]) == {"W4A16", "W8A16", UNQUANTIZED}
    # quantize@'s record as quantizing the layout would write it: the group size as configured, nothing run-dependent
    assert {k: v for k, v in record.items() if k != "mixed"} == layout["quantized"]
    assert (record["variant"], record["group_size_configured"]) == ("mixed-w4a16", 128)
    assert not set(RUN_DEPENDENT) & set(record)
    qc = json.loads((project / "artifacts" / "quantized" / "mixed-w4a16" / "config.json").read_text())
    assert [g["targets"] for g in qc["quantization_config"]["config_groups"].values()] == [layout["targets"]["W4A16"]]
    assert record["mixed"]["passed"] and record["mixed"]["frontier_point"] == 0  # a loose bound: uniform INT4 ships
    assert [t["point"] for t in record["mixed"]["tries"]] == [0]
    sensitivity = (project / "plots" / "sensitivity" / "mixed-w4a16" / "data.csv").read_text().splitlines()
    assert sensitivity[0].startswith("layer,kl_divergence") and len(sensitivity) == 1 + 3
    frontier = (project / "plots" / "mixed_frontier" / "mixed-w4a16" / "data.csv").read_text().splitlines()
    assert len(frontier) == 1 + 1 + 3 * 2  # the start, then each of 3 layers promoted twice
    assert sorted(p.name for p in (project / "plots" / "sensitivity" / "fp8-dynamic").iterdir()) == ["skipped.txt"]
    assert "mixed" not in json.loads((project / "metrics" / "quantize-fp8-dynamic.json").read_text())
    note = json.loads((project / "artifacts" / "mixed" / "fp8-dynamic" / "layout.json").read_text())
    assert note == {"variant": "fp8-dynamic", "targets": None, "search": None}  # no threshold in it: quantize@ stays


def test_the_stage_checks_pass_at_1_on_tasks_the_gate_does_not_score(demo_pair, tmp_path):
    """evaluate.functional on with a limit: the walk decodes the next mixed.functional_tasks tasks with the
    unquantized target once and with each layout, in the sandbox, and records each try's pass@1 and drop; with no
    limit every task is the gate's, and the stage says in one line that pass@1 is left to it."""
    params = tiny_params()
    raw = replace_samples(params["quantize"]["variants"]["mixed-w4a16"])
    params["quantize"]["variants"]["mixed-w4a16"] = {**raw, "mixed": {**raw["mixed"], "functional_tasks": 2}}
    params["quantize"]["enabled"] = ["mixed-w4a16"]
    params["gates"]["overrides"]["mixed-w4a16"] = {
        "max_kl_divergence": 10.0,
        "max_perplexity_increase_pct": 1000.0,
        "min_top1_agreement": 0.0,
    }
    params["evaluate"]["functional"] |= {"tasks": "evals/human-eval/functional.jsonl", "limit": 3, "max_new_tokens": 4}
    data = DataParams.parse(params["data"])
    rows = split(dedup(load_traffic(ROOT / data.traffic)), data.fractions, data.seed)["calibration"]

    def project_with(where: Path) -> Path:
        where.mkdir(exist_ok=True)
        project = copy_project(where, params)
        shutil.copytree(demo_pair[0], project / "artifacts" / "models" / "target")
        (project / "artifacts" / "data").mkdir()
        write_split(rows[:4], project / "artifacts" / "data" / "calibration.jsonl")
        return project

    project = project_with(tmp_path)
    result = run([sys.executable, "-m", "stages.mixed", "mixed-w4a16"], cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pass@1 checked on 2 tasks the gate does not score (evals/human-eval/functional.jsonl)" in result.stdout
    tries = json.loads((project / "artifacts" / "mixed" / "mixed-w4a16" / "layout.json").read_text())["search"]["tries"]
    for t in tries:
        assert t["pass_at_1_drop"] == pytest.approx(t["pass_at_1_baseline"] - t["pass_at_1"])
        assert 0 <= t["pass_at_1"] <= 1 and t["pass_at_1"] * 2 == round(t["pass_at_1"] * 2)  # of 2 tasks

    every = len((ROOT / "evals" / "human-eval" / "functional.jsonl").read_text().splitlines())
    params["evaluate"]["functional"]["limit"] = None
    project = project_with(tmp_path / "all")
    result = run([sys.executable, "-m", "stages.mixed", "mixed-w4a16"], cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if "pass@1" in line]
    assert said == [
        f"mixed mixed-w4a16: pass@1 left to the gate: evaluate.functional.limit leaves none of the {every} tasks in "
        "evals/human-eval/functional.jsonl unscored"
    ]
    tries = json.loads((project / "artifacts" / "mixed" / "mixed-w4a16" / "layout.json").read_text())["search"]["tries"]
    assert all("pass_at_1_drop" not in t for t in tries)


def replace_samples(raw: dict) -> dict:
    return {**raw, "mixed": {**raw["mixed"], "samples": 2, "max_tries": 1}}
