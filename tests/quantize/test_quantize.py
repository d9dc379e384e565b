"""The quantize stage with real llm-compressor on the tiny demo target: every params.yaml variant
produces a compressed-tensors checkpoint that reloads in transformers on CPU with finite held-out
perplexity inside its gate, overrides pass through, and bad recipes or untraceable
architectures are refused with one line and no artifact."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import full_text, prompt_and_response_ids
from pipeline.data.settings import DataParams
from pipeline.data.traffic import dedup, load_traffic, split, write_split
from pipeline.evaluate.quality import fidelity
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.quantize.oneshot import awq_pinning_off_without_accelerator, quantize_model
from pipeline.quantize.recipes import needs_calibration, parse_variant, scheme_for
from pipeline.quantize.settings import Calibration
from pipeline.release.settings import GatesParams
from tiny_project import ROOT, copy_project, run, tiny_params

PARAMS = tiny_params()
CALIBRATION = PARAMS["quantize"]["calibration"]
# The quantized variants (bf16, `algorithm: none`, is the unquantized baseline: tested on its own below).
VARIANTS = {k: v for k, v in PARAMS["quantize"]["variants"].items() if v["algorithm"] != "none"}
# compressed-tensors' checkpoint format by weight type and bits: INT4 packs eight to an int32, INT8 is stored as
# is, FP8 stores float8, NVFP4 packs two FP4 values to a uint8 (with FP8 group scales and a float32 global scale).
FORMATS = {
    ("int", 4): "pack-quantized",
    ("int", 8): "int-quantized",
    ("float", 8): "float-quantized",
    ("float", 4): "nvfp4-pack-quantized",
}
METRIC_KEYS = {"wall_time_s", "peak_memory_mb", "size_before_mb", "size_after_mb", "compression_ratio"}


@pytest.fixture(scope="module")
def splits() -> dict:
    """The demo traffic split the way the data stage splits it."""
    data = DataParams.parse(PARAMS["data"])
    return split(dedup(load_traffic(ROOT / data.traffic)), data.fractions, data.seed)


@pytest.fixture(scope="module")
def calibration_texts(demo_pair, splits) -> list[str]:
    tokenizer = load_tokenizer(demo_pair[0])
    return [full_text(tokenizer, m) for m in splits["calibration"]]


@pytest.fixture(scope="module")
def heldout_examples(demo_pair, splits) -> list:
    tokenizer = load_tokenizer(demo_pair[0])
    return [prompt_and_response_ids(tokenizer, m) for m in splits["heldout"][:8]]


@pytest.fixture(scope="module")
def baseline(demo_pair):
    return load_causal_lm(demo_pair[0])


def quantize(model_dir: Path, out: Path, name: str, raw_spec: dict, texts: list[str], cfg: dict) -> dict:
    """The quantize stage's path: the params entry parsed into a VariantSpec, then quantize_model."""
    return quantize_model(model_dir, out, parse_variant(name, raw_spec), texts, Calibration.parse(cfg))


def test_baseline_variant_is_the_target_byte_for_byte(demo_pair, tmp_path):
    import hashlib

    raw = PARAMS["quantize"]["variants"]["bf16"]
    metrics = quantize(demo_pair[0], tmp_path / "bf16", "bf16", raw, [], CALIBRATION)

    def digests(d: Path) -> dict:
        return {
            p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in d.rglob("*") if p.is_file()
        }

    assert digests(tmp_path / "bf16") == digests(demo_pair[0])
    assert "quantization_config" not in json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert metrics["compression_ratio"] == 1.0 and metrics["calibration_samples"] == 0 and metrics["scheme"] is None
    weights = sum(p.stat().st_size for p in demo_pair[0].glob("*.safetensors"))
    assert metrics["size_after_mb"] == round(weights / 1e6, 3) != round(weights / 2**20, 3)  # MB as labelled, not MiB
    with pytest.raises(PipelineError, match="algorithm 'none' is the unquantized target"):
        parse_variant("bf16", {"algorithm": "none", "group_size": 128})


def quantization_config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["quantization_config"]


def tensors(out: Path) -> dict[str, torch.Tensor]:
    with safe_open(out / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_reloads_with_finite_perplexity_inside_its_gate(
    variant, demo_pair, calibration_texts, heldout_examples, baseline, tmp_path
):
    spec = VARIANTS[variant]
    out = tmp_path / variant
    metrics = quantize(demo_pair[0], out, variant, spec, calibration_texts, CALIBRATION)

    qc = quantization_config(out)
    expected = scheme_for(parse_variant(variant, spec))
    group = qc["config_groups"]["group_0"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == FORMATS[expected.weights.type, expected.weights.num_bits]
    for field in ("num_bits", "type", "symmetric", "strategy", "group_size"):
        assert group["weights"][field] == getattr(expected.weights, field), field
    if expected.input_activations is None:
        assert group["input_activations"] is None
    else:
        assert group["input_activations"]["dynamic"] == expected.input_activations.dynamic
    assert "lm_head" in qc["ignore"]

    weights = tensors(out)
    assert weights["lm_head.weight"].is_floating_point() and "lm_head.weight_scale" not in weights
    if spec.get("kv_cache"):
        assert qc["kv_cache_scheme"]["num_bits"] == 8 and qc["kv_cache_scheme"]["type"] == "float"
        kv_scales = [v for k, v in weights.items() if k.endswith(("k_scale", "v_scale"))]
        assert kv_scales and all(torch.isfinite(s).all() and (s > 0).all() for s in kv_scales)
    else:
        assert qc.get("kv_cache_scheme") is None
    if expected.input_activations is not None and not expected.input_activations.dynamic:
        # FP8-static: calibrated per-tensor activation scales, one per quantized layer.
        input_scales = [v for k, v in weights.items() if k.endswith("input_scale")]
        assert input_scales and all(s.numel() == 1 and s.item() > 0 for s in input_scales)
    if qc["format"] == "nvfp4-pack-quantized":
        # NVFP4: two FP4 values per byte, an FP8 scale per 16 weights, a positive float32 global scale per layer.
        layer = "model.layers.0.mlp.up_proj"
        packed, scale = weights[f"{layer}.weight_packed"], weights[f"{layer}.weight_scale"]
        assert packed.dtype == torch.uint8 and scale.dtype == torch.float8_e4m3fn
        assert scale.shape == (packed.shape[0], packed.shape[1] * 2 // 16)
        global_scales = [v for k, v in weights.items() if k.endswith("weight_global_scale")]
        assert global_scales and all(g.dtype == torch.float32 and (g > 0).all() for g in global_scales)

    assert METRIC_KEYS <= set(metrics)
    assert metrics["compression_ratio"] > 1
    assert metrics["size_after_mb"] < metrics["size_before_mb"]
    spec_value = parse_variant(variant, spec)
    assert metrics["calibration_samples"] == (CALIBRATION["num_samples"] if needs_calibration(spec_value) else 0)

    model = load_causal_lm(out, torch.device("cpu"))  # compressed-tensors decompresses on load
    # Into the evaluation dtype, whatever the format's decompressor produces (NVFP4's is bfloat16).
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.float32}
    quality = fidelity(baseline, model, heldout_examples)
    assert math.isfinite(quality["perplexity"])
    assert (
        quality["perplexity_increase_pct"]
        <= GatesParams.parse(PARAMS["gates"]).for_variant(variant)["max_perplexity_increase_pct"]
    )


def test_recipe_overrides_pass_straight_through(demo_pair, calibration_texts, tmp_path):
    spec = {
        "algorithm": "gptq",
        "scheme": "W4A16",
        "group_size": 64,
        "actorder": None,
        "dampening_frac": 0.05,
        "ignore": ["re:.*down_proj"],
        "num_samples": 4,
        "max_seq_length": 64,
    }
    metrics = quantize(demo_pair[0], tmp_path / "q", "custom", spec, calibration_texts, CALIBRATION)
    qc = quantization_config(tmp_path / "q")
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 64
    assert qc["config_groups"]["group_0"]["weights"]["actorder"] is None
    # The saved config lists the ignored modules by name.
    assert {"lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"} <= set(qc["ignore"])
    weights = tensors(tmp_path / "q")
    assert weights["model.layers.0.mlp.down_proj.weight"].is_floating_point()
    assert "model.layers.0.mlp.up_proj.weight_packed" in weights
    assert metrics["calibration_samples"] == 4


def test_a_compressed_checkpoint_loads_with_plain_parameters_that_follow_the_model(
    demo_pair, calibration_texts, baseline, heldout_examples, tmp_path
):
    """compressed-tensors loads a checkpoint it decompresses into its OffloadCache (onloaded to CPU), which
    `model.to(cuda)` does not move: on an H100 the GPTQ variant stayed on CPU beside a CUDA baseline
    (benchmarks/gpu/raw/tpeval exact-demo). load_causal_lm hands back plain parameters, scoring as before."""
    from compressed_tensors.offload.cache import OffloadCache

    quantize(demo_pair[0], tmp_path / "q", "gptq-w4a16", VARIANTS["gptq-w4a16"], calibration_texts, CALIBRATION)
    model = load_causal_lm(tmp_path / "q", torch.device("cpu"))
    assert [n for n, m in model.named_modules() if isinstance(m._parameters, OffloadCache)] == []
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
    assert 0 < fidelity(baseline, model, heldout_examples)["kl_divergence"] < 1


@pytest.mark.parametrize("variant", ["gptq-w4a16", "nvfp4a16"])
def test_offloaded_load_quantizes(variant, demo_pair, calibration_texts, tmp_path):
    """offload: true goes through compressed-tensors' offloaded loading; the result is the same kind
    of checkpoint (on a GPU host the sequential pipeline onloads one layer at a time), NVFP4's global
    scales in float32 as without offloading."""
    cfg = {**CALIBRATION, "offload": True, "pipeline": "sequential"}
    metrics = quantize(demo_pair[0], tmp_path / "q", variant, VARIANTS[variant], calibration_texts, cfg)
    weights = scheme_for(parse_variant(variant, VARIANTS[variant])).weights
    assert quantization_config(tmp_path / "q")["format"] == FORMATS[weights.type, weights.num_bits]
    assert all(v.dtype == torch.float32 for k, v in tensors(tmp_path / "q").items() if k.endswith("global_scale"))
    assert metrics["compression_ratio"] > 1
    load_causal_lm(tmp_path / "q", torch.device("cpu"))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"algorithm": "rtn", "scheme": "INT3"}, "unknown quantization scheme 'INT3'"),
        ({"algorithm": "gptq", "scheme": "W4A16", "groupsize": 128}, "unknown recipe keys ['groupsize']"),
        ({"algorithm": "rtn", "scheme": "W4A16", "actorder": "static"}, "do not apply to algorithm 'rtn'"),
        ({"algorithm": "gptq", "scheme": "W4A16", "actorder": "group"}, "actorder must be one of"),
        ({"algorithm": "gptq", "scheme": "W4A16", "dampening_frac": "lots"}, "invalid recipe value: dampening_frac"),
        ({"algorithm": "gptq", "scheme": "FP8_DYNAMIC", "group_size": 128}, "group_size applies to grouped schemes"),
        (
            {"algorithm": "gptq", "scheme": "W4A16", "group_size": 96},
            "quantize.variants.bad.group_size is 96, a size vLLM's INT4 weight-only kernels do not serve",
        ),
        (
            {"algorithm": "rtn", "scheme": "MXFP4A16", "group_size": 96},  # no served fallback outside INT weight-only
            "quantize.variants.bad.group_size: group size 96 does not divide the input width 128 of layer "
            "model.layers.0.",
        ),
    ],
)
def test_bad_recipes_are_refused_before_calibration(spec, message, demo_pair, calibration_texts, tmp_path):
    with pytest.raises(PipelineError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        quantize(demo_pair[0], tmp_path / "q", "bad", spec, calibration_texts, CALIBRATION)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "q").exists()


def test_unknown_calibration_pipeline_is_refused(demo_pair, calibration_texts, tmp_path):
    with pytest.raises(PipelineError, match="pipeline must be one of"):
        quantize(
            demo_pair[0],
            tmp_path / "q",
            "gptq-w4a16",
            VARIANTS["gptq-w4a16"],
            calibration_texts,
            {**CALIBRATION, "pipeline": "layerwise"},
        )


def untraceable_target(demo_target: Path, dest: Path) -> Path:
    """A real transformers architecture that llm-compressor 0.14's tracer can't split into layers:
    TrOCR's decoder (its autowrapper rebinds TrOCRDecoder.forward's `input` variable to the builtin)."""
    from transformers import TrOCRConfig, TrOCRForCausalLM

    tokenizer = load_tokenizer(demo_target)
    config = TrOCRConfig(
        vocab_size=len(tokenizer),
        d_model=128,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_ffn_dim=256,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    TrOCRForCausalLM(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def test_untraceable_architecture_is_refused_with_the_basic_pipeline_as_way_out(demo_pair, calibration_texts, tmp_path):
    target = untraceable_target(demo_pair[0], tmp_path / "trocr")
    spec = VARIANTS["gptq-w4a16"]
    with pytest.raises(PipelineError, match="cannot trace TrOCRForCausalLM.*pipeline: basic") as err:
        quantize(target, tmp_path / "q", "gptq-w4a16", spec, calibration_texts, CALIBRATION)
    assert "\n" not in str(err.value)
    # The remedy the message names works: the whole model calibrated in one pass.
    quantize(target, tmp_path / "basic", "gptq-w4a16", spec, calibration_texts, {**CALIBRATION, "pipeline": "basic"})
    assert quantization_config(tmp_path / "basic")["format"] == "pack-quantized"


def test_awq_pinning_guard_applies_only_without_an_accelerator():
    from llmcompressor.pipelines.cache import IntermediatesCache

    cache = IntermediatesCache.from_dataloader([{"hidden": torch.ones(2, 4)}])
    original = IntermediatesCache.pin_memory
    with awq_pinning_off_without_accelerator():
        patched = IntermediatesCache.pin_memory
        cache.pin_memory(0)  # what AWQ's smoothing does; must not raise on this host
    assert IntermediatesCache.pin_memory is original  # restored after the run
    if torch.accelerator.is_available():
        assert patched is original
    else:
        assert patched is not original
        with pytest.raises(RuntimeError):  # the crash the guard exists for
            cache.pin_memory(0)


def test_stage_refuses_with_one_line_and_leaves_no_artifact(demo_pair, splits, tmp_path):
    params = tiny_params()
    params["quantize"]["enabled"] = ["gptq-w4a16"]
    project = copy_project(tmp_path, params)
    untraceable_target(demo_pair[0], project / "artifacts" / "models" / "target")
    (project / "artifacts" / "data").mkdir()
    write_split(splits["calibration"], project / "artifacts" / "data" / "calibration.jsonl")

    for variant, message in (("bogus", "unknown variant 'bogus'"), ("gptq-w4a16", "cannot trace")):
        result = run([sys.executable, "-m", "stages.quantize", variant], cwd=project)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(errors) == 1 and message in errors[0]
        assert "Traceback" not in result.stderr
        assert not (project / "metrics" / f"quantize-{variant}.json").exists()
        assert not (project / "artifacts" / "quantized").exists() or not list(
            (project / "artifacts" / "quantized").iterdir()
        )


@pytest.mark.parametrize("variant", ["gptq-w4a16", "awq-w4a16"])
def test_gptq_and_awq_show_per_layer_progress_in_short_lines(variant, demo_pair, splits, tmp_path):
    """Issue #29: GPTQ and AWQ printed nothing for 11 and 24 minutes, and a progress bar written to a non-terminal
    made one multi-KB line. The stage's console bar advances once per layer llm-compressor finishes; into a pipe (not
    a terminal) each refresh is a line of its own; library bars in the log keep their last state per line."""
    import os
    import shutil

    params = tiny_params()
    params["quantize"]["enabled"] = [variant]
    project = copy_project(tmp_path, params)
    shutil.copytree(demo_pair[0], project / "artifacts" / "models" / "target")
    (project / "artifacts" / "data").mkdir()
    write_split(splits["calibration"], project / "artifacts" / "data" / "calibration.jsonl")
    result = run(
        [sys.executable, "-m", "stages.quantize", variant],
        cwd=project,
        env={**os.environ, "MODELPREP_PROGRESS_INTERVAL": "0"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    layers = PARAMS["demo"]["target"]["num_hidden_layers"] + 1  # each decoder layer, then the head
    algorithm = PARAMS["quantize"]["variants"][variant]["algorithm"]
    bar = [line for line in result.stderr.splitlines() if line.startswith(f"quantize {variant} ({algorithm}, layers)")]
    assert f"0/{layers}" in bar[0] and all(f"{i}/{layers}" in result.stderr for i in range(1, layers + 1)), bar
    assert "\r" not in result.stderr and max(map(len, result.stderr.splitlines())) <= 100
    log = (project / "artifacts" / "logs" / f"quantize@{variant}.log").read_text()
    assert "\r" not in log and max(map(len, log.splitlines())) < 1000
    assert result.stdout.startswith(f"quantize {variant}: ")
    if algorithm == "awq":  # this host has no GPU: the CPU grid ran, and the metrics say so
        metrics = json.loads((project / "metrics" / f"quantize-{variant}.json").read_text())
        assert metrics["awq_n_grid"] == params["quantize"]["calibration"]["cpu_awq_n_grid"]


def shaped_target(demo_target: Path, dest: Path, hidden: int, intermediate: int, heads: int) -> Path:
    """The demo target's tokenizer on a randomly initialized Llama of other widths: hidden 192 (3 heads of 64) and
    intermediate 512 are SmolLM2-135M's 576 (9 heads of 64) and 1536 scaled down, not multiples of 128."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(demo_target)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


WHY_64 = (
    "group size 128 does not divide the input width 192 of layer model.layers.0.self_attn.q_proj; 64 is the "
    "largest group size vLLM's INT4 weight-only kernels serve (Marlin: 32, 64, 128; Machete on Hopper: 64, 128; "
    "or channel-wise) that divides every quantized layer's input width"
)


def test_group_size_is_checked_against_layer_widths_when_params_are_validated(demo_pair, tmp_path):
    """Issue #29: group_size 128 on SmolLM2 (hidden 576) stopped the build 2.7 minutes in, after other variants were
    built, naming no size that works. The params check reads the target's config.json (widths on the meta device):
    a group_size the variant sets that does not divide a width is refused in one line naming the size that fits (a
    configured value wins or is refused, never silently replaced); the scheme's own size, where the variant sets
    none, gives way to the largest vLLM serves that divides every width (the `sources` stage, first in every repro,
    says so); a size vLLM's kernels do not serve fails in one line naming the param, before any stage does work."""
    from pipeline.quantize.recipes import enabled_variant
    from pipeline.rules import group_sizes, validate

    target = shaped_target(demo_pair[0], tmp_path / "narrow", hidden=192, intermediate=512, heads=3)
    params = tiny_params(target={"source": str(target)}, draft={"source": str(demo_pair[1])})
    assert params["quantize"]["variants"]["gptq-w4a16"]["group_size"] == 128
    with pytest.raises(PipelineError) as e:
        validate(params, tmp_path / "params.yaml")
    assert str(e.value) == (
        f"{tmp_path / 'params.yaml'}: quantize.variants.gptq-w4a16.group_size: group size 128 does not divide the "
        "input width 192 of layer model.layers.0.self_attn.q_proj; set group_size: 64 (the largest vLLM's INT4 "
        "weight-only kernels serve that divides every quantized layer's input width), or leave group_size out to "
        "have the scheme's 128 replaced by what fits"
    )

    del params["quantize"]["variants"]["gptq-w4a16"]["group_size"]  # W4A16's own 128
    validate(params, tmp_path / "params.yaml")
    chosen = group_sizes(params, [enabled_variant(params, v) for v in params["quantize"]["enabled"]])
    assert set(chosen) == {"gptq-w4a16"} and chosen["gptq-w4a16"].as_metrics() == {
        "group_size": 64,
        "group_size_configured": 128,
        "group_size_reason": [WHY_64],
    }

    (tmp_path / "auto").mkdir()
    project = copy_project(tmp_path / "auto", params)
    r = run([sys.executable, "-m", "stages.sources"], cwd=project)
    assert r.returncode == 0, r.stderr
    assert f"sources: quantize gptq-w4a16: group_size 128 -> 64 ({WHY_64})" in r.stdout.splitlines()

    params["quantize"]["variants"]["gptq-w4a16"]["group_size"] = 96  # divides 192 and 512, but no kernel serves it
    with pytest.raises(
        PipelineError,
        match=r"quantize\.variants\.gptq-w4a16\.group_size is 96, a size vLLM's INT4 "
        r"weight-only kernels do not serve .*set it to one of 128, 64, 32",
    ):
        validate(params, tmp_path / "params.yaml")
    (tmp_path / "explicit").mkdir()
    project = copy_project(tmp_path / "explicit", params)
    r = run([sys.executable, "-m", "stages.sources"], cwd=project)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("error: params.yaml: quantize.variants.gptq-w4a16.group_size is 96")
    assert not (project / "artifacts" / "sources.json").exists()


def test_a_narrow_target_quantizes_with_the_group_size_chosen_for_it(demo_pair, calibration_texts, tmp_path):
    """GPTQ with W4A16's own group size 128 on widths 192/512: the checkpoint is grouped by 64, the metrics record
    what was configured, what was used and why; widths no served group divides (80) go channel-wise. A group_size
    the variant sets is never replaced: refused in one line before calibration."""
    gptq = {k: v for k, v in VARIANTS["gptq-w4a16"].items() if k != "group_size"}
    narrow = shaped_target(demo_pair[0], tmp_path / "narrow", hidden=192, intermediate=512, heads=3)
    metrics = quantize(narrow, tmp_path / "q", "gptq-w4a16", gptq, calibration_texts, {**CALIBRATION, "num_samples": 8})
    assert quantization_config(tmp_path / "q")["config_groups"]["group_0"]["weights"]["group_size"] == 64
    assert (metrics["group_size"], metrics["group_size_configured"], metrics["group_size_reason"]) == (
        64,
        128,
        [WHY_64],
    )
    with torch.no_grad():
        model = load_causal_lm(tmp_path / "q", torch.device("cpu"))
        assert math.isfinite(model(torch.tensor([[1, 2, 3]])).logits.sum())

    odd = shaped_target(demo_pair[0], tmp_path / "odd", hidden=80, intermediate=240, heads=5)  # 80 = 16 x 5
    with pytest.raises(
        PipelineError,
        match=r"^quantize\.variants\.rtn-w4a16\.group_size: group size 64 does not "
        r"divide the input width 80 of layer .*; no group size vLLM's INT4",
    ):
        quantize(
            odd,
            tmp_path / "refused",
            "rtn-w4a16",
            {"algorithm": "rtn", "scheme": "W4A16", "group_size": 64},
            [],
            CALIBRATION,
        )
    assert not (tmp_path / "refused").exists()
    metrics = quantize(odd, tmp_path / "c", "rtn-w4a16", {"algorithm": "rtn", "scheme": "W4A16"}, [], CALIBRATION)
    weights = quantization_config(tmp_path / "c")["config_groups"]["group_0"]["weights"]
    assert (weights["strategy"], weights["group_size"]) == ("channel", None)
    assert (metrics["group_size"], metrics["group_size_configured"]) == (-1, 128)
    [why] = metrics["group_size_reason"]
    assert why.startswith("group size 128 does not divide the input width 80 of layer ")
    assert why.endswith(
        "divides every quantized layer's input width: one scale per output channel (vLLM's group size -1)"
    )


def test_awq_on_a_cpu_searches_the_cpu_grid_unless_the_variant_sets_one():
    """Issue #32 item 5: AWQ's default grid (20 ratios per mapping) was most of a CPU quantize stage; a CPU host
    searches quantize.calibration.cpu_awq_n_grid where the variant sets no n_grid, a GPU llm-compressor's default,
    and a variant's own n_grid wins on both. The metrics say which grid ran and where it came from."""
    from pipeline.quantize.oneshot import awq_grid
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration

    cfg = Calibration.parse(PARAMS["quantize"]["calibration"])
    assert cfg.cpu_awq_n_grid == 4
    unset = parse_variant("awq-w4a16", PARAMS["quantize"]["variants"]["awq-w4a16"])
    spec, grid = awq_grid(unset, cfg, "cpu")
    assert spec.knobs["n_grid"] == 4 and grid == {
        "awq_n_grid": 4,
        "awq_n_grid_from": "quantize.calibration.cpu_awq_n_grid",
    }
    spec, grid = awq_grid(unset, cfg, "cuda")
    assert "n_grid" not in spec.knobs and grid["awq_n_grid"] == 20  # llm-compressor 0.14's default
    own = parse_variant("awq-w4a16", {**PARAMS["quantize"]["variants"]["awq-w4a16"], "n_grid": 8})
    for device in ("cpu", "cuda"):
        spec, grid = awq_grid(own, cfg, device)
        assert spec.knobs["n_grid"] == 8 and grid["awq_n_grid_from"] == "quantize.variants.awq-w4a16.n_grid"
    gptq = parse_variant("gptq-w4a16", PARAMS["quantize"]["variants"]["gptq-w4a16"])
    assert awq_grid(gptq, cfg, "cpu") == (gptq, {})
    off = Calibration.parse({**PARAMS["quantize"]["calibration"], "cpu_awq_n_grid": None})
    assert "n_grid" not in awq_grid(unset, off, "cpu")[0].knobs
    with pytest.raises(PipelineError, match="cpu_awq_n_grid"):
        Calibration.parse({**PARAMS["quantize"]["calibration"], "cpu_awq_n_grid": 0})
