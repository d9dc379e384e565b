"""What serve_bench chooses besides the method: a k per batch-size range (vLLM's num_speculative_tokens_per_batch_size)
and the GEMM kernel; how the choice is rendered into serve.yaml / serve.env and decided from a measured sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.drafts import methods
from pipeline.drafts.settings import DraftParams
from pipeline.quantize.hardware import DEEPGEMM_OFF, MACHETE_OFF, kernel_choices, kernel_env
from pipeline.quantize.recipes import parse_variant
from pipeline.release.decision import k_schedule, schedule_to_measure, speculation_for as decide
from pipeline.release.shipped_config import config_name, config_of, k_at
from pipeline.serving.bench_record import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult
from pipeline.serving.config import engine_args, serve_yaml, server_env, speculative_config_for
from pipeline.serving.sweep import kernels_in_log, kernels_to_compare
from tiny_project import serving_of, tiny_params, tiny_serving

# ---- vLLM 0.26.0's own rules, transcribed as the oracle (vllm/v1/spec_decode/dynamic/utils.py)


def vllm_dense_schedule(schedule: list, max_batch: int, k: int) -> list[int]:
    """validate_and_normalize_dynamic_sd_schedule + build_dynamic_sd_schedule_lookup: ValueError where vLLM raises,
    else batch size -> k (index 0 unused)."""
    if not isinstance(schedule, list) or not schedule:
        raise ValueError("must be a non-empty list")
    parsed = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError("3-item entries")
        lo, hi, kk = (int(x) for x in entry)
        if lo <= 0 or hi <= 0 or lo > hi or kk < 0:
            raise ValueError("bad range")
        parsed.append((lo, hi, kk))
    parsed.sort(key=lambda e: e[0])
    previous = 0
    for lo, hi, _ in parsed:
        if lo <= previous:
            raise ValueError("overlap")
        previous = hi
    if parsed[0][0] != 1:
        raise ValueError("first range must start at 1")
    if k <= 0:
        raise ValueError("num_speculative_tokens must be > 0")
    dense, nxt, last = [0] * (max_batch + 1), 1, None
    for lo, hi, kk in parsed:
        if lo > nxt and last is not None:
            for b in range(nxt, min(lo, max_batch + 1)):
                dense[b] = min(k, last)
        for b in range(max(lo, nxt), min(hi, max_batch) + 1):
            dense[b] = min(k, kk)
        nxt, last = max(nxt, hi + 1), kk
        if nxt > max_batch:
            break
    for b in range(nxt, max_batch + 1):
        dense[b] = min(k, last)
    return dense


@pytest.mark.parametrize(
    "speedups, expected",
    [
        # wins at small batches, loses at large: k up to halfway (geometrically) between 8 and 32, none after
        ({1: 1.5, 8: 1.2, 32: 0.8, 64: 0.6}, ((1, 16, 4), (17, 64, 0))),
        # loses at batch 1 (below min_gain), wins at 8: none first
        ({1: 1.05, 8: 1.3, 32: 0.9}, ((1, 2, 0), (3, 16, 4), (17, 64, 0))),
        ({1: 1.5, 8: 1.3}, None),  # wins everywhere: that is the fixed config
        ({1: 0.9, 8: 0.8}, None),  # loses everywhere: that is plain decoding
    ],
)
def test_the_schedule_drafts_where_the_fixed_config_paid_and_vllm_reads_it_so(speedups, expected):
    schedule = k_schedule(speedups, 4, 1.1, 64)
    assert schedule == expected
    if schedule is None:
        return
    methods.check_schedule(schedule, "test")
    dense = vllm_dense_schedule([list(r) for r in schedule], 64, 4)
    assert [k_at(schedule, b) for b in range(1, 65)] == dense[1:]
    for c, v in speedups.items():  # every measured concurrency gets the k it was measured to pay with
        assert k_at(schedule, c) == (4 if v >= 1.1 else 0)


@pytest.mark.parametrize(
    "bad", [((2, 8, 4),), ((1, 8, 4), (8, 16, 0)), ((1, 8, -1),), ((1, 0, 4),), ((1, 8, 0), (9, 16, 0))]
)
def test_a_schedule_vllm_would_refuse_is_refused_when_rendered(bad):
    with pytest.raises(PipelineError, match="k schedule|never drafts"):
        methods.speculative_config(methods.Speculation("eagle3", 4, bad))
    if max(k for _, _, k in bad) > 0:  # the same ones vLLM refuses at start
        with pytest.raises(ValueError):
            vllm_dense_schedule([list(r) for r in bad], 64, 4)


def test_a_schedule_renders_into_serve_yaml_with_k_its_largest():
    p = tiny_params()
    spec = parse_variant("bf16", p["quantize"]["variants"]["bf16"])
    speculation = methods.Speculation("eagle3", 4, ((1, 16, 4), (17, 64, 0)))
    serving = serving_of(p)
    config = speculative_config_for(speculation, DraftParams.parse(p["draft"]), serving)
    text = serve_yaml(engine_args(spec, serving, config, None))
    config = yaml.safe_load(text)["speculative-config"]
    assert config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 4], [17, 64, 0]]
    assert speculation.label == "eagle3 k=4 at batch 1-16, none from batch 17"
    assert config_name(speculation) == "eagle3-schedule" and config_name(methods.Speculation("eagle3", 4)) == "eagle3"
    with pytest.raises(PipelineError, match="largest k"):
        methods.speculative_config(methods.Speculation("eagle3", 8, ((1, 16, 4), (17, 64, 0))))


# ---- deciding from a measured sweep


def level(c: int, tokens_per_s: float, failed: int = 0) -> LoadLevel:
    lat = {"mean": 10.0, "p50": 10.0, "p90": 11.0, "p99": 12.0}
    return LoadLevel(
        concurrency=c,
        num_prompts=32,
        completed=32 - failed,
        failed=failed,
        duration_s=1.0,
        request_throughput=1.0,
        output_throughput=tokens_per_s,
        ttft_ms=lat,
        tpot_ms=lat,
        itl_ms=lat,
        e2el_ms=lat,
    )


def config(k: int, by_c: dict[int, float], schedule=None, failed_at: int | None = None) -> ServeConfigResult:
    return ServeConfigResult(
        num_speculative_tokens=k,
        startup_s=60.0,
        schedule=schedule,
        levels={f"c{c}": level(c, v, 3 if c == failed_at else 0) for c, v in by_c.items()},
    )


PLAIN_SWEEP = {1: 100.0, 8: 700.0, 32: 2000.0, 64: 3000.0}
SCHEDULE = [[1, 16, 4], [17, 64, 0]]


def sweep(fixed: dict[int, float], scheduled: dict[int, float] | None, failed_at: int | None = None):
    return ServeBenchRecord(
        variant="bf16",
        gpu="H100",
        vllm_version="0.26.0",
        configs={PLAIN: config(0, PLAIN_SWEEP), "eagle3": config(4, fixed)},
        schedules={} if scheduled is None else {"eagle3": config(4, scheduled, SCHEDULE, failed_at)},
    )


def test_a_schedule_that_beats_the_best_fixed_setting_over_the_sweep_ships():
    fixed = {1: 150.0, 8: 840.0, 32: 1600.0, 64: 1800.0}  # x1.5, x1.2, x0.8, x0.6
    scheduled = {1: 148.0, 8: 830.0, 32: 1990.0, 64: 2990.0}  # the same drafting, then plain decoding
    d = decide(None, sweep(fixed, scheduled), 1, min_gain=1.1)
    assert (d.method, d.num_speculative_tokens, d.schedule) == ("eagle3", 4, SCHEDULE)
    assert d.speculation.schedule == ((1, 16, 4), (17, 64, 0)) and d.speedup == pytest.approx(1.48)
    assert "beats eagle3 k=4" in d.reason and "geometric mean" in d.reason
    assert config_of(sweep(fixed, scheduled), d.speculation).schedule == SCHEDULE


def test_the_fixed_k_ships_when_the_schedule_is_no_better_or_failed_or_loses_at_the_target():
    fixed = {1: 150.0, 8: 840.0, 32: 2100.0, 64: 3100.0}  # wins everywhere
    d = decide(None, sweep(fixed, {1: 149.0, 8: 835.0, 32: 2000.0, 64: 3000.0}), 1, min_gain=1.1)
    assert (d.num_speculative_tokens, d.schedule) == (4, None)
    losing = {1: 150.0, 8: 840.0, 32: 1600.0, 64: 1800.0}
    d = decide(None, sweep(losing, {1: 148.0, 8: 830.0, 32: 1990.0, 64: 2990.0}, failed_at=32), 1, min_gain=1.1)
    assert d.schedule is None  # failed requests anywhere in its sweep: not a candidate
    # PIECEWISE CUDA graphs made the schedule's drafting slower than min_gain at the target: it does not ship there
    d = decide(None, sweep(losing, {1: 105.0, 8: 800.0, 32: 1990.0, 64: 2990.0}), 1, min_gain=1.1)
    assert (d.num_speculative_tokens, d.schedule) == (4, None)


def test_a_schedule_can_ship_where_no_fixed_setting_paid_at_the_target():
    fixed = {1: 104.0, 8: 910.0, 32: 1600.0, 64: 1800.0}  # x1.04 at the target: plain decoding is the best fixed
    scheduled = {1: 100.0, 8: 900.0, 32: 2000.0, 64: 3000.0}  # plain at batch 1-2, k from 3 to 16, plain after
    record = sweep(fixed, None)
    record.schedules = {"eagle3": config(4, scheduled, [[1, 2, 0], [3, 16, 4], [17, 64, 0]])}
    d = decide(None, record, 1, min_gain=1.1)
    assert d.num_speculative_tokens == 4 and d.schedule == [[1, 2, 0], [3, 16, 4], [17, 64, 0]]
    assert "beats plain decoding" in d.reason


def test_serve_bench_schedules_the_method_whose_sweep_suggests_the_most():
    configs = {
        PLAIN: config(0, PLAIN_SWEEP),
        "eagle3": config(4, {1: 150.0, 8: 840.0, 32: 1600.0, 64: 1800.0}),
        "ngram": config(3, {1: 120.0, 8: 800.0, 32: 1900.0, 64: 2900.0}),
        "draft_model": config(8, {1: 110.0, 8: 560.0, 32: 1000.0, 64: 1500.0}),
    }
    assert schedule_to_measure(configs, {"eagle3": 4, "ngram": 3, "draft_model": 8}, 1.1, 64) == (
        "eagle3",
        ((1, 16, 4), (17, 64, 0)),
    )
    configs["eagle3"] = config(4, {1: 160.0, 8: 900.0, 32: 2200.0, 64: 3300.0})  # wins everywhere: no schedule
    assert schedule_to_measure(configs, {"eagle3": 4}, 1.1, 64) is None


# ---- the GEMM kernel


def spec_of(variant: str):
    return parse_variant(variant, tiny_params()["quantize"]["variants"][variant])


def test_kernel_choices_are_the_ones_vllm_offers_on_hopper_only():
    w4 = spec_of("gptq-w4a16")
    assert [(c.name, c.env) for c in kernel_choices(w4, 9.0)] == [("machete", {}), ("marlin", MACHETE_OFF)]
    assert kernel_choices(w4, 8.0) == [] and kernel_choices(spec_of("bf16"), 9.0) == []
    assert kernel_choices(spec_of("fp8-dynamic"), 9.0) == []
    assert kernel_env(w4, "h100") == {}  # unmeasured: vLLM's own pick (Machete)


def test_the_measured_kernel_ships_and_the_users_setting_wins():
    w4 = spec_of("gptq-w4a16")
    assert server_env(w4, tiny_serving(gpu="h100"), dict(MACHETE_OFF)) == MACHETE_OFF
    assert server_env(w4, tiny_serving(gpu="h100"), {}) == {}  # measured: Machete was faster
    mine = {"VLLM_DISABLED_KERNELS": "MarlinLinearKernel"}
    assert server_env(w4, tiny_serving(gpu="h100", env=mine), dict(MACHETE_OFF)) == mine
    choices, why = kernels_to_compare(w4, 9.0, tiny_serving(env=mine))
    assert choices == [] and "serving.env sets VLLM_DISABLED_KERNELS" in why
    assert [c.name for c in kernels_to_compare(w4, 9.0, tiny_serving(env={}))[0]] == ["machete", "marlin"]
    assert kernels_to_compare(spec_of("bf16"), 9.0, tiny_serving()) == ([], None)
    assert DEEPGEMM_OFF == {"VLLM_DISABLED_KERNELS": "DeepGemmFp8BlockScaledMMKernel"}


def test_the_kernels_vllm_selected_are_read_from_its_log(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text(  # vLLM 0.26 lines (kernels/linear/__init__.py: logger.info_once("Selected %s for %s", ...))
        "(EngineCore pid=12) INFO 11-25 04:01:02 [__init__.py:605] Selected MarlinLinearKernel for "
        "CompressedTensorsWNA16\n"
        "(EngineCore pid=12) INFO 11-25 04:01:02 [__init__.py:605] Selected MacheteLinearKernel for "
        "CompressedTensorsWNA16\n"
        "(EngineCore pid=12) INFO 11-25 04:01:03 [__init__.py:605] Selected MarlinLinearKernel for x\n"
    )
    assert kernels_in_log(log) == ["MarlinLinearKernel", "MacheteLinearKernel"]
    assert kernels_in_log(tmp_path / "missing.log") == []


def test_a_kernel_within_noise_at_the_target_loses_to_the_one_faster_under_load():
    """The demo's GPTQ checkpoint on an H100 (benchmarks/gpu/raw/demo-serve): Machete 405 tok/s at concurrency 1
    against Marlin's 402, Marlin 12-13% faster at 16 and 32."""
    from pipeline.release.decision import choose_kernel

    machete = config(0, {1: 405.0, 8: 2221.0, 16: 3025.0, 32: 5377.0})
    marlin = config(0, {1: 402.0, 8: 2226.0, 16: 3377.0, 32: 6096.0})
    assert choose_kernel({"machete": machete, "marlin": marlin}, 1, 0.04) == "marlin"
    assert choose_kernel({"machete": machete, "marlin": marlin}, 1, 0.0) == "machete"  # strictly the target's
    slow_at_target = config(0, {1: 300.0, 8: 2500.0, 16: 4000.0, 32: 7000.0})
    assert choose_kernel({"machete": machete, "marlin": slow_at_target}, 1, 0.04) == "machete"


def load_render(root: Path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_render", root / "benchmarks/render.py")
    render = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = render  # dataclasses look their module up there
    spec.loader.exec_module(render)
    return render


def test_serving_md_is_the_rendering_of_its_raw_files():
    """benchmarks/gpu/SERVING.md: every table from the serve_bench records under raw/, every decision by the
    pipeline's own functions over those records (benchmarks/tables/serving.py)."""
    root = Path(__file__).resolve().parents[2]
    out = load_render(root).render(root / "benchmarks/gpu/SERVING.md")
    assert out == (root / "benchmarks/gpu/SERVING.md").read_text()
    # the demo's GPTQ: Machete faster at the target alone, Marlin picked under the tie rule; EAGLE-3 k=2 clears min_gain
    assert "| `demo-serve` | `gptq-w4a16` | 1 | machete 405, marlin 402 | machete | marlin | **eagle3 k=2** |" in out


def test_capacity_md_is_the_rendering_of_its_raw_files():
    """benchmarks/gpu/CAPACITY.md: the shipped bundles' numbers from raw/shipped, every served config's capacity from
    the serve_bench records under raw/ (benchmarks/tables/capacity.py)."""
    root = Path(__file__).resolve().parents[2]
    out = load_render(root).render(root / "benchmarks/gpu/CAPACITY.md")
    assert out == (root / "benchmarks/gpu/CAPACITY.md").read_text()
    # the gate's own words over the run's record: EAGLE-3 (x0.88 of plain's users at the SLO) gives way to plain
    assert "ships without speculation (measured; eagle3 k=8 gave way: fewer users at the SLO" in out
    assert "| 56 (probes ran out; 64 missed) | x0.88 | 12,504 |" in out
