"""`modelprep plan` (issue 50 item 6): per stage GPUs, GPU memory, disk and time from committed measured runs, for the
configured model or a named shape, and one line refusing a plan that can't fit; run as the CLI a user runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from pipeline.serving.plan import SHAPES
from tiny_project import ROOT, tiny_params

SHAPES_8B = SHAPES["llama-3-8b"]


def plan(tmp_path, *args: str, **overrides) -> subprocess.CompletedProcess:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params(**overrides), sort_keys=False))
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "plan", "--params", str(params), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def rows(stdout: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: line.split()
        for line in stdout.splitlines()[2:]
        if "@" in line.split()[0] or line.split()[0] in ("models", "distill", "draft_finetune", "eagle3")
    }


def test_plan_points_are_the_committed_raw_runs():
    r = subprocess.run([sys.executable, "benchmarks/plan_points.py", "--check"], cwd=ROOT, timeout=120)
    assert r.returncode == 0, "pipeline/serving/plan_points.json differs from benchmarks/gpu/raw: rerun the script"


def test_plan_points_read_the_mib_records_in_mb():
    """raw/llama3-8b and raw/schemes8b wrote their `*_mb` sizes in MiB (benchmarks/tables/read.py
    RECORDED_IN_MIB): read as MB, the BF16 Llama-3-8B checkpoint's bytes / 2 are its published parameter count, and
    every 8B run scales from the same count."""
    from pipeline.serving.parallelism import ModelShape
    from pipeline.serving.plan import SHAPES, load_points

    points = load_points()["quantize"]
    published = ModelShape.from_config(SHAPES["llama-3-8b"]).parameters  # 8.03B
    assert [p["parameters"] for p in points.values()] == [pytest.approx(published, rel=1e-3)] * len(points)
    # int8-w8a8's peak_gpu_memory_mb (raw/schemes8b) is 18729.8 MiB
    assert points["int8-w8a8"]["peak_gpu_memory_bytes"] == pytest.approx(18729.8 * 2**20, rel=1e-6)


def test_the_demo_plan_fits_one_gpu_and_names_every_stage_and_its_source(tmp_path):
    r = plan(tmp_path)
    assert r.returncode == 0, r.stderr
    table = rows(r.stdout)
    enabled = tiny_params()["quantize"]["enabled"]
    assert {f"{s}@{v}" for s in ("quantize", "evaluate", "serve_bench", "bundle") for v in enabled} <= set(table)
    assert all(table[f"serve_bench@{v}"][1:4] == ["yes", "1", "(TP"] for v in enabled)
    assert "benchmarks/gpu/raw/llama3-8b/quant8b-gptq-w4a16.json (28.1 s at 8.03B parameters" in r.stdout
    assert "a proportional guess, not a measurement" in r.stdout


def test_a_70b_shape_on_four_h100s_plans_each_variants_gpus(tmp_path):
    """With offload (one layer at a time) quantization fits; serving takes BF16 over 4 GPUs, the rest over 2; the
    transformers stages that hold the whole model on one GPU are what refuses, in one line."""
    r = plan(
        tmp_path, "--model-shape", "llama-3-70b", "--gpus-per-host", "4", quantize={"calibration": {"offload": True}}
    )
    table = rows(r.stdout)
    assert table["serve_bench@bf16"][1:4] == ["yes", "4", "(TP"]
    assert table["serve_bench@gptq-w4a16"][1:4] == ["yes", "2", "(TP"]
    assert table["quantize@gptq-w4a16"][1] == "yes" and table["eagle3"][1] == "NO"
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: plan does not fit: distill: the target's vLLM engine at draft_training.vllm.")


def test_bf16_70b_at_tensor_parallel_1_on_80_gb_is_refused_in_one_line(tmp_path):
    r = plan(tmp_path, "--model-shape", "llama-3-70b", "--gpu", "h100", serving={"tensor_parallel_size": 1})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        "error: plan does not fit: serve_bench@bf16: bf16 does not fit 1 host(s) of 8 h100: at TP 1 weights 141.1 GB"
    ), r.stderr


def test_405b_needs_two_hosts_of_eight_with_pipeline_parallelism(tmp_path):
    one = plan(tmp_path, "--model-shape", "llama-3.1-405b", "--gpus-per-host", "8")
    assert "error: plan does not fit: serve_bench@bf16: bf16 does not fit 1 host(s) of 8 h100" in one.stderr
    two = plan(tmp_path, "--model-shape", "llama-3.1-405b", "--gpus-per-host", "8", "--hosts", "2")
    assert rows(two.stdout)["serve_bench@bf16"][1:6] == ["yes", "16", "(TP", "8", "x"]


def test_a_pinned_size_is_not_refused_by_the_plan_with_serving_gpu_null(tmp_path):
    """decide() checks a pinned tensor_parallel_size against a GPU only where serving.gpu names one (the pinned size
    is the user's to know); the sources stage's resource plan does the same: Llama-3-8B in BF16 with a KV cache of
    256 x 4096 tokens misses one H100, pinned at 1 it is shown as not checked, and refused once serving.gpu is h100."""
    import json

    from pipeline.core.errors import PipelineError
    from pipeline.rules import validate
    from stages.sources import resource_plan

    source = tmp_path / "llama8b"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({**SHAPES_8B, "model_type": "llama"}))
    p = tiny_params(
        target={"source": str(source)},
        draft={"source": {"from": "target", "layers": 2}},
        quantize={"enabled": ["bf16"]},
        serving={"tensor_parallel_size": 1, "max_num_seqs": 256, "max_model_len": 4096, "gpu": None},
    )
    validate(p, tmp_path / "params.yaml")
    resource_plan(p, show=False)
    r = plan(
        tmp_path,
        "--config",
        str(source / "config.json"),
        **{k: p[k] for k in ("target", "draft", "quantize", "serving")},
    )
    assert r.returncode == 0, r.stderr
    assert "serve_bench@bf16  not checked (serving.gpu null)  1 (TP 1)" in r.stdout
    p["serving"]["gpu"] = "h100"
    with pytest.raises(PipelineError, match="the resource plan does not fit: serve_bench@bf16: bf16 does not fit"):
        resource_plan(p, show=False)


def test_each_stage_scales_from_the_measured_run_nearest_the_models_size(tmp_path):
    """Two whole-repro runs are measured (1.07B on one H100, 8.03B on four): an 8B plan takes evaluate's and
    serve_bench's times from the 8B run, the tiny demo's from the 1B run, each named in its row."""
    small, large = plan(tmp_path), plan(tmp_path, "--model-shape", "llama-3-8b")
    assert small.returncode == 0 and large.returncode == 0, small.stderr + large.stderr
    for stage in ("evaluate@gptq-w4a16", "serve_bench@gptq-w4a16"):
        assert "raw/gpu-tp1/repro.log" in " ".join(rows(small.stdout)[stage])
        assert "raw/repro8b/listing.txt" in " ".join(rows(large.stdout)[stage])


def seventy_b_layer_parameters() -> int:
    """One Llama-3-70B decoder layer: q, k, v, o, the gated MLP's three matrices and two norms."""
    s = SHAPES["llama-3-70b"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    hidden = s["hidden_size"]
    return hidden * (2 * q + 2 * kv) + 3 * hidden * s["intermediate_size"] + 2 * hidden


@pytest.mark.parametrize(
    "quantize, gpus",
    [({"calibration": {"offload": True}}, 1), ({"distributed": {"gpus": 4}}, 4)],
    ids=["one-h100-onloading", "four-h100s"],
)
def test_70b_gptq_layer_by_layer_scales_the_layer_measured_at_70b_width(tmp_path, quantize, gpus):
    """A 70B model quantizes on H100s only layer by layer: its GPTQ time is 80 layers x the seconds per layer measured
    at 70B width on as many GPUs (raw/scale-host, plan_points.json's gptq_layers) x calibration samples over the
    measured ones, and its GPU memory the measured one-layer peak per process, no longer 'not measured'."""
    from pipeline.serving.plan import duration, gb, load_points

    layer = seventy_b_layer_parameters()
    point = next(
        p
        for p in load_points()["gptq_layers"]
        if (p["gpus"], p["offload"], p["layer_parameters"]) == (gpus, True, layer)
    )
    params = tiny_params(quantize=quantize)
    samples = (
        params["quantize"]["variants"]["gptq-w4a16"].get("num_samples")
        or params["quantize"]["calibration"]["num_samples"]
    )
    seconds = (
        SHAPES["llama-3-70b"]["num_hidden_layers"] * point["layer_seconds"] * samples / point["calibration_samples"]
    )
    r = plan(tmp_path, "--model-shape", "llama-3-70b", "--gpus-per-host", "4", "--gpu", "h100", quantize=quantize)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("quantize@gptq-w4a16 "))
    assert line.split()[1:3] == ["yes", str(gpus)], line
    assert f"{gb(point['peak_gpu_memory_bytes'])} (measured one-layer peak x layer parameters)" in line
    assert f"  {duration(seconds)}  " in line and f"{point['run']} {point['step']} " in line
    assert "not measured" not in line
