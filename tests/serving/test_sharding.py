"""Tensor parallel sizes vLLM can shard a variant at (issue 50 item 1, pipeline/serving/sharding.py): each GPU's share
of a layer's input a whole number of the weights' groups, and the heads split as vLLM requires. Found on 2 H100s
(benchmarks/gpu/SCALE.md, raw/tpeval): the demo target's GPTQ W4A16 group-128 checkpoint did not start at TP 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.quantize.recipes import parse_variant
from pipeline.rules import load_checked
from pipeline.serving import parallelism
from pipeline.serving.parallelism import ModelShape
from pipeline.serving.settings import ServingParams
from pipeline.serving.sharding import NO_GROUPS, checkpoint_groups, shard_problem, spec_groups
from tiny_project import ROOT, tiny_params

# params.yaml's demo.target: hidden 384 (o_proj's input too: 6 heads of 64), FFN 1024, 2 KV heads
DEMO_TARGET = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
}
DEMO = ModelShape(layers=6, hidden_size=384, heads=6, kv_heads=2, head_dim=64, intermediate_size=1024, vocab_size=4096)
# Llama-3-70B's published config
LLAMA3_70B = ModelShape(
    layers=80, hidden_size=8192, heads=64, kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256
)
GPTQ = {"algorithm": "gptq", "scheme": "W4A16", "actorder": "static", "dampening_frac": 0.01}
O_PROJ_AT_2 = (
    "o_proj's input per GPU at tensor parallel 2 is 192 (384 / 2, row-parallel), not a whole number of weight "
    "groups of 128"
)


def w4a16(group_size: int | None = 128, **more):
    return parse_variant("gptq-w4a16", {**GPTQ, **({"group_size": group_size} if group_size else {}), **more})


def test_the_demo_target_at_group_128_does_not_shard_at_tp2_and_group_64_does():
    assert shard_problem(DEMO, spec_groups(w4a16(128), DEMO), 1) is None
    assert shard_problem(DEMO, spec_groups(w4a16(128), DEMO), 2) == O_PROJ_AT_2
    assert shard_problem(DEMO, spec_groups(w4a16(None), DEMO), 2) == O_PROJ_AT_2  # the preset's 128 too
    assert shard_problem(DEMO, spec_groups(w4a16(64), DEMO), 2) is None
    assert shard_problem(DEMO, NO_GROUPS, 2) is None  # BF16 and FP8 (per channel, per tensor) shard there


def test_down_proj_splits_its_input_too():
    shape = ModelShape(
        layers=2, hidden_size=512, heads=8, kv_heads=8, head_dim=64, intermediate_size=1280, vocab_size=1
    )
    assert shard_problem(shape, spec_groups(w4a16(128), shape), 1) is None  # 1280 = 10 groups of 128
    assert shard_problem(shape, spec_groups(w4a16(128), shape), 4) == (
        "down_proj's input per GPU at tensor parallel 4 is 320 (1280 / 4, row-parallel), not a whole number of "
        "weight groups of 128"
    )
    # a layer the variant leaves unquantized has no groups to split
    ignored = spec_groups(w4a16(128, ignore=["lm_head", "re:.*mlp\\.down_proj$"]), shape)
    assert shard_problem(shape, ignored, 4) is None


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama3_70b_shards_at_group_128_on_every_size(tp):
    assert shard_problem(LLAMA3_70B, spec_groups(w4a16(128), LLAMA3_70B), tp) is None


@pytest.mark.parametrize(
    "heads, kv_heads, tp, problem",
    [
        (6, 2, 4, "the model's 6 attention heads do not divide over 4 GPUs (vLLM requires it)"),
        (12, 6, 4, "the model's 6 KV heads neither divide over 4 GPUs nor replicate evenly on them"),
        (12, 3, 2, "the model's 3 KV heads neither divide over 2 GPUs nor replicate evenly on them"),
        (8, 2, 8, None),  # 2 KV heads, each on 4 of the 8 GPUs
        (64, 8, 8, None),
    ],
)
def test_heads_must_divide_and_kv_heads_split_or_replicate_evenly(heads, kv_heads, tp, problem):
    shape = ModelShape(
        layers=2,
        hidden_size=heads * 64,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=64,
        intermediate_size=1024,
        vocab_size=1,
    )
    found = shard_problem(shape, NO_GROUPS, tp)
    assert found == problem if problem is None else found.startswith(problem), found


def test_a_mixed_variant_checks_every_grouped_scheme_it_may_place():
    mixed = parse_variant(
        "mixed-w4a16",
        {"algorithm": "rtn", "scheme": "W4A16", "group_size": 128, "mixed": {"schemes": ["W8A16", "UNQUANTIZED"]}},
    )
    assert set(spec_groups(mixed, DEMO).of("o_proj")) == {128}
    assert shard_problem(DEMO, spec_groups(mixed, DEMO), 2) == O_PROJ_AT_2


def quantization_config(targets: list[str], ignore: list[str], group_size: int = 128) -> dict:
    """config.json's quantization_config as llm-compressor writes it (artifacts/quantized/gptq-w4a16's, one group)."""
    weights = {"type": "int", "num_bits": 4, "strategy": "group", "group_size": group_size, "symmetric": True}
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": targets, "weights": weights, "input_activations": None}},
        "ignore": ignore,
    }


def demo_config(**quant) -> dict:
    return {
        "model_type": "llama",
        **DEMO_TARGET,
        "head_dim": 64,
        "vocab_size": 4096,
        "quantization_config": quantization_config(**quant),
    }


def test_a_built_checkpoint_is_checked_by_the_groups_its_config_records():
    whole = checkpoint_groups(demo_config(targets=["Linear"], ignore=["lm_head"]), DEMO, "gptq-w4a16")
    assert shard_problem(DEMO, whole, 2) == O_PROJ_AT_2
    # a per-layer layout that left every o_proj in BF16 (mixed.py writes `re:` targets; ignore lists module names)
    layout = demo_config(
        targets=["re:model\\.layers\\.(?:0|1|2|3|4|5)\\.(?:self_attn\\.(?:q|k|v)_proj|mlp\\.(?:gate|up|down)_proj)$"],
        ignore=["lm_head", *(f"model.layers.{i}.self_attn.o_proj" for i in range(6))],
    )
    assert shard_problem(DEMO, checkpoint_groups(layout, DEMO, "gptq-w4a16"), 2) is None
    assert checkpoint_groups({"model_type": "llama"}, DEMO, "bf16") is None  # unquantized: the spec decides


def test_a_checkpoint_pinned_at_a_size_it_cannot_shard_is_refused_by_the_stages(tmp_path):
    """decision_for (evaluate, serve_bench and bundle size a variant with it) reads the built checkpoint's groups."""
    ckpt = tmp_path / "gptq-w4a16"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(demo_config(targets=["Linear"], ignore=["lm_head"])))
    (ckpt / "model.safetensors").write_bytes(b"\0" * 1024)
    p = tiny_params(serving={"tensor_parallel_size": 2})
    with pytest.raises(PipelineError, match="serving.tensor_parallel_size 2 can't shard variant gptq-w4a16: o_proj"):
        parallelism.decision_for("gptq-w4a16", p, ckpt)


def demo_params(tmp_path, group_size: int = 128, ignore: tuple[str, ...] = ("lm_head",), **serving) -> Path:
    """A params.yaml of the demo with its real target shape (the tiny test pair is 128 wide: it shards at 2)."""
    variants = tiny_params()["quantize"]["variants"]
    p = tiny_params(
        demo={"target": DEMO_TARGET},
        serving=serving,
        quantize={
            "variants": {**variants, "gptq-w4a16": {**variants["gptq-w4a16"], "group_size": group_size}},
            "calibration": {"ignore": list(ignore)},
        },
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return path


def test_a_pinned_size_that_cannot_shard_is_refused_when_params_are_checked(tmp_path):
    path = demo_params(tmp_path, tensor_parallel_size=2)
    with pytest.raises(PipelineError) as err:
        load_checked(path)
    line = str(err.value)
    assert "\n" not in line and line == (
        f"{path}: serving.tensor_parallel_size 2 can't shard variant gptq-w4a16: {O_PROJ_AT_2}; use "
        "quantize.variants.gptq-w4a16.group_size 64 or serving.tensor_parallel_size 1"
    )
    load_checked(demo_params(tmp_path, group_size=64, tensor_parallel_size=2))  # group 64 shards at 2
    with pytest.raises(PipelineError, match="serving.tensor_parallel_size 4 can't shard variant bf16: the model's 6"):
        load_checked(demo_params(tmp_path, tensor_parallel_size=4))


def test_layers_quantize_calibration_ignore_leaves_unquantized_need_no_groups_per_gpu(tmp_path):
    load_checked(demo_params(tmp_path, ignore=("lm_head", "re:.*self_attn\\.o_proj$"), tensor_parallel_size=2))


def test_auto_refuses_a_variant_whose_memory_fit_cannot_shard_and_names_the_group_that_would(tmp_path):
    """On an L4 (24 GB) the KV cache of 4096 x 2048 tokens needs 2 GPUs: BF16 and FP8 (its KV cache in FP8: 1 GPU)
    shard there, INT4 in groups of 128 does not, nor at 4 or 8 (6 heads)."""
    load = {"gpu": "l4", "max_num_seqs": 4096, "max_model_len": 2048}
    with pytest.raises(PipelineError) as err:
        load_checked(demo_params(tmp_path, tensor_parallel_size="auto", **load))
    line = str(err.value)
    assert "\n" not in line and line.endswith(
        f"variant gptq-w4a16 fits l4 GPUs from tensor parallel 2 but vLLM can't shard it there: {O_PROJ_AT_2}, nor "
        "at any larger size up to serving.max_tensor_parallel_size 8; use quantize.variants.gptq-w4a16.group_size 64"
    ), line
    params = load_checked(demo_params(tmp_path, group_size=64, tensor_parallel_size="auto", **load))
    decision = parallelism.decide_enabled(
        ServingParams.parse(params["serving"]),
        {n: parse_variant(n, params["quantize"]["variants"][n]) for n in params["quantize"]["enabled"]},
        parallelism.source_config(params),
    )
    assert {n: d.tensor_parallel_size for n, d in decision.items()} == {"bf16": 2, "fp8-static": 1, "gptq-w4a16": 2}
    assert "that fits l4 and shards" in decision["gptq-w4a16"].reason()


def test_modelprep_plan_refuses_a_size_that_cannot_shard_in_one_line(tmp_path):
    path = demo_params(tmp_path, tensor_parallel_size=2)
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "plan", "--params", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == (
        f"error: plan does not fit: serve_bench@gptq-w4a16: vLLM can't shard gptq-w4a16 at TP 2: {O_PROJ_AT_2}; use "
        "quantize.variants.gptq-w4a16.group_size 64 or serving.tensor_parallel_size 1\n"
    )
    assert "NO" in next(line for line in r.stdout.splitlines() if line.startswith("serve_bench@gptq-w4a16"))
