"""Schemes beyond FP8/W4A16 (recipes) and which GPUs a variant can be served on (`serving.gpu`)."""

from __future__ import annotations

import pytest

from pipeline.core.errors import PipelineError
from pipeline.quantize.hardware import DEEPGEMM_OFF, GPUS, check_runs_on, requirements, scoped_env
from pipeline.quantize.presets import PRESETS, Quant, Scheme
from pipeline.quantize.recipes import (
    CHANNELWISE,
    VariantSpec,
    build_recipe,
    needs_calibration,
    parse_variant,
    scheme_for,
    scheme_of,
)
from pipeline.rules import validate
from pipeline.serving.config import server_env
from tiny_project import tiny_params, tiny_serving

VARIANTS = tiny_params()["quantize"]["variants"]


def spec(name):
    return parse_variant(name, VARIANTS[name])


def test_int8_w8a8_is_smoothquant_then_gptq():
    recipe = build_recipe(spec("int8-w8a8"), ["lm_head"])
    assert [type(m).__name__ for m in recipe] == ["SmoothQuantModifier", "GPTQModifier"]
    assert recipe[0].smoothing_strength == VARIANTS["int8-w8a8"]["smoothing_strength"]
    assert needs_calibration(spec("int8-w8a8")) and not needs_calibration(spec("fp8-block"))


def test_nvfp4a16_is_data_free_round_to_nearest():
    recipe = build_recipe(spec("nvfp4a16"), ["lm_head"])
    assert [type(m).__name__ for m in recipe] == ["QuantizationModifier"]
    weights = recipe[0].config_groups["group_0"].weights
    assert (weights.type, weights.num_bits, weights.group_size, weights.strategy) == ("float", 4, 16, "tensor_group")
    assert recipe[0].config_groups["group_0"].input_activations is None and not needs_calibration(spec("nvfp4a16"))


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"algorithm": "awq", "scheme": "W4A16", "smoothing_strength": 0.5}, "applies to"),
        ({"algorithm": "gptq", "scheme": "W8A8", "smoothing_strength": 1.5}, r"number in \(0, 1\)"),
    ],
)
def test_bad_smoothing_is_one_line(raw, message):
    with pytest.raises(PipelineError, match=message):
        parse_variant("x", raw)


def test_presets_are_compressed_tensors_presets():
    """presets.PRESETS, which the bundle and serve_bench stages read instead of importing compressed-tensors, states
    the installed compressed-tensors' presets: the same names, and scheme_of gives each one's weights and input
    activations as scheme_for builds them, with a group size and channel-wise too, or refuses as it does."""
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    def quant(args):
        return None if args is None else Quant(args.type, args.num_bits, args.strategy)

    assert sorted(PRESETS) == sorted(PRESET_SCHEMES)
    for name in PRESETS:
        for group_size in (None, 64, CHANNELWISE):
            spec = VariantSpec(name="v", algorithm="rtn", scheme=name, group_size=group_size)
            try:
                real = scheme_for(spec)
            except PipelineError as e:
                with pytest.raises(PipelineError) as err:
                    scheme_of(spec)
                assert str(err.value) == str(e)
                continue
            assert scheme_of(spec) == Scheme(quant(real.weights), quant(real.input_activations)), (name, group_size)


def test_requirements_by_scheme():
    assert requirements(spec("bf16")).min_compute_capability == 8.0
    assert requirements(spec("int8-w8a8")).min_compute_capability == 7.5
    fp8 = requirements(spec("fp8-dynamic"))
    assert (fp8.min_compute_capability, fp8.native_compute_capability) == (8.0, 8.9)
    assert "t4" not in requirements(spec("gptq-w4a16")).runs_on() and "t4" in requirements(spec("int8-w8a8")).runs_on()
    for gpu in (g for g, cc in GPUS.items() if cc >= 8.9):
        check_runs_on(spec("fp8-block"), gpu)  # FP8 serves natively from Ada/Hopper on
    check_runs_on(spec("bf16"), None)  # no fleet named: nothing refused
    # vLLM 0.26.0's source: NVFP4A16 is CompressedTensorsW4A4Fp4(use_a16=True) (min capability 75) and always
    # FP4 Marlin, weight-only by design, so Marlin is its native path on Hopper and Blackwell too.
    nvfp4 = requirements(spec("nvfp4a16"))
    assert (nvfp4.min_compute_capability, nvfp4.native_compute_capability) == (7.5, 7.5)
    assert "FP4 Marlin" in nvfp4.kernels and "Hopper (9.0)" in nvfp4.kernels and "vLLM 0.26.0" in nvfp4.source
    assert nvfp4.runs_on() == list(GPUS)


def test_serving_gpu_refuses_what_it_cannot_run_before_any_stage(tmp_path):
    ok = tiny_params(quantize={"enabled": ["int8-w8a8", "nvfp4a16"]}, serving={"gpu": "t4"})
    validate(ok, tmp_path / "params.yaml")
    bad = tiny_params(serving={"gpu": "t4"})  # bf16 and INT4 Marlin need 8.0
    with pytest.raises(
        PipelineError, match=r"variant bf16 can't be served on serving.gpu t4 \(compute capability 7.5\)"
    ):
        validate(bad, tmp_path / "params.yaml")
    with pytest.raises(PipelineError, match="serving.gpu must be one of"):
        validate(tiny_params(serving={"gpu": "h800x"}), tmp_path / "params.yaml")


def test_fp8_block_is_steered_off_deepgemm_where_it_was_measured_slower():
    """serve.env, the manifests and serve_bench's server all take server_env: for FP8 block-wise weights on Hopper
    (or no fleet named) DeepGEMM off; elsewhere and for other schemes nothing; serving.env always wins."""
    assert (
        server_env(spec("fp8-block"), tiny_serving(gpu="h100"))
        == DEEPGEMM_OFF
        == {"VLLM_DISABLED_KERNELS": "DeepGemmFp8BlockScaledMMKernel"}
    )
    assert server_env(spec("fp8-block"), tiny_serving(gpu=None)) == DEEPGEMM_OFF
    assert server_env(spec("fp8-block"), tiny_serving(gpu="b200")) == {}  # not measured there: vLLM's own choice
    assert server_env(spec("fp8-dynamic"), tiny_serving(gpu="h100")) == {}
    assert server_env(spec("bf16"), tiny_serving()) == {}
    mine = {"VLLM_DISABLED_KERNELS": "CutlassFp8BlockScaledMMKernel", "VLLM_LOGGING_LEVEL": "INFO"}
    assert server_env(spec("fp8-block"), tiny_serving(gpu="h100", env=mine)) == mine
    assert "DeepGEMM" in requirements(spec("fp8-block")).kernels


def test_scoped_env_is_restored_even_on_error(monkeypatch):
    """evaluate runs lm-eval's and the speculative check's vLLM engines under server_env; the stage also runs
    in-process in tests, so a variable it set or replaced is put back afterwards, on error too."""
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "Mine")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    import os

    with pytest.raises(RuntimeError):
        with scoped_env({**DEEPGEMM_OFF, "VLLM_LOGGING_LEVEL": "INFO"}):
            assert os.environ["VLLM_DISABLED_KERNELS"] == "DeepGemmFp8BlockScaledMMKernel"
            assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
            raise RuntimeError("engine failed")
    assert os.environ["VLLM_DISABLED_KERNELS"] == "Mine" and "VLLM_LOGGING_LEVEL" not in os.environ
