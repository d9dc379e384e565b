"""GPUs per replica (issue 50 item 1): each variant's tensor parallelism from the memory model, pinned sizes honoured,
a variant that can't fit refused in one line when params are checked, and manifests at TP 2 that Kubernetes accepts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.quantize.recipes import parse_variant
from pipeline.rules import validate
from pipeline.serving import parallelism
from pipeline.serving.parallelism import GB, ModelShape, decide, per_gpu
from pipeline.serving.plan import SHAPES
from tiny_project import tiny_params, tiny_serving

# Llama-3-70B's published config (plan.SHAPES: meta-llama/Meta-Llama-3-70B config.json), the shape issue 50 served.
LLAMA3_70B = {"model_type": "llama", **SHAPES["llama-3-70b"], "tie_word_embeddings": False}
SHAPE_70B = ModelShape.from_config(LLAMA3_70B)
VARIANTS = tiny_params()["quantize"]["variants"]


def spec(name: str):
    return parse_variant(name, VARIANTS[name])


def auto(**serving):
    """The serving section with auto tensor parallelism, as params.yaml holds it (not resolved)."""
    from pipeline.serving.settings import ServingParams

    return ServingParams.parse(tiny_params(serving={"tensor_parallel_size": "auto", **serving})["serving"])


def test_llama3_70b_shape_counts_its_parameters_and_kv_bytes():
    assert SHAPE_70B.parameters == pytest.approx(70.55e9, rel=1e-3)  # 70.6B published
    assert SHAPE_70B.kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2  # 320 KiB per token in BF16
    assert parallelism.estimated_weight_bytes(SHAPE_70B, spec("bf16")) == pytest.approx(141.1e9, rel=1e-3)
    # W4A16: 4 bits plus a 16-bit scale per 128 weights in the layers; embeddings and head stay BF16 (4.2 GB)
    assert parallelism.estimated_weight_bytes(SHAPE_70B, spec("gptq-w4a16")) == pytest.approx(39.5e9, rel=1e-2)


@pytest.mark.parametrize(
    "gpu, variant, tp",
    [
        ("h100", "bf16", 4),  # 141 GB of weights: 2 GPUs hold them but not the KV cache of 64 x 2048 tokens
        ("h100", "fp8-dynamic", 2),  # issue 50: FP8 at TP 1 left no memory for the KV cache
        ("h100", "gptq-w4a16", 2),
        ("h100", "gptq-w4a16-kv8", 1),  # an FP8 KV cache halves it: INT4 on one GPU
        ("h200", "bf16", 2),
        ("h200", "gptq-w4a16", 1),
        ("a100", "bf16", 4),
        ("l40s", "bf16", 8),
    ],
)
def test_auto_takes_the_smallest_tensor_parallelism_that_fits(gpu, variant, tp):
    decision = decide(variant, spec(variant), auto(gpu=gpu), SHAPE_70B)
    assert decision.tensor_parallel_size == tp and not decision.pinned and decision.weights_from == "estimate"
    assert decision.share.fits
    if tp > 1:  # and the next smaller one does not
        inputs = parallelism.memory_inputs(auto(gpu=gpu), SHAPE_70B, decision.share.weight_bytes * tp, spec(variant))
        assert not per_gpu(inputs, tp // 2).fits


def test_null_gpu_plans_for_an_h100_and_the_demo_takes_one_gpu():
    assert decide("bf16", spec("bf16"), auto(gpu=None), SHAPE_70B).gpu == "h100"
    p = tiny_params()
    config = parallelism.source_config(p)
    decided = parallelism.decide_enabled(auto(), {v: spec(v) for v in p["quantize"]["enabled"]}, config)
    assert {v: d.tensor_parallel_size for v, d in decided.items()} == {v: 1 for v in p["quantize"]["enabled"]}


def test_fewer_sequences_or_a_shorter_context_need_fewer_gpus():
    assert decide("gptq-w4a16", spec("gptq-w4a16"), auto(max_num_seqs=8), SHAPE_70B).tensor_parallel_size == 1
    # FP8's 73 GB of weights exceed one H100's 72 GB budget whatever the KV cache (issue 50: it did not start)
    assert decide("fp8-dynamic", spec("fp8-dynamic"), auto(max_num_seqs=1), SHAPE_70B).tensor_parallel_size == 2
    assert decide("gptq-w4a16", spec("gptq-w4a16"), auto(max_model_len=512), SHAPE_70B).tensor_parallel_size == 1


def test_kv_heads_split_up_to_their_count_then_replicate():
    shape = ModelShape(
        layers=4, hidden_size=512, heads=8, kv_heads=2, head_dim=64, intermediate_size=1024, vocab_size=1000
    )
    inputs = parallelism.memory_inputs(auto(), shape, 10**6, spec("bf16"))
    kv = {tp: per_gpu(inputs, tp).kv_bytes for tp in (1, 2, 4, 8)}
    assert kv[1] == 2 * kv[2] and kv[2] == kv[4] == kv[8]  # one KV head per GPU from TP 2 on


def test_pinned_size_is_honoured_and_refused_when_it_cannot_fit_a_named_gpu():
    pinned = tiny_serving(tensor_parallel_size=8, gpu="h100")
    assert decide("gptq-w4a16", spec("gptq-w4a16"), pinned, SHAPE_70B).tensor_parallel_size == 8
    with pytest.raises(PipelineError) as err:
        decide("bf16", spec("bf16"), tiny_serving(tensor_parallel_size=1, gpu="h100"), SHAPE_70B)
    line = str(err.value)
    assert "\n" not in line and line.startswith(
        "variant bf16 does not fit serving.gpu h100 at the pinned serving.tensor_parallel_size 1: weights 141.1 GB"
    )
    # no GPU named: the pinned size is the user's to know
    assert (
        decide("bf16", spec("bf16"), tiny_serving(tensor_parallel_size=1, gpu=None), SHAPE_70B).tensor_parallel_size
        == 1
    )
    with pytest.raises(
        PipelineError, match="tensor_parallel_size 4 can't shard variant bf16: the model's 6 attention heads do not"
    ):
        decide("bf16", spec("bf16"), tiny_serving(tensor_parallel_size=4), ModelShape(2, 384, 6, 2, 64, 1024, 4096))


def test_auto_skips_sizes_that_do_not_divide_the_heads():
    shape = ModelShape(
        layers=80, hidden_size=8064, heads=6, kv_heads=6, head_dim=1344, intermediate_size=28672, vocab_size=128256
    )  # too big for 2 GPUs; 4 and 8 don't divide 6 heads
    with pytest.raises(PipelineError, match="does not fit h100 GPUs .* up to serving.max_tensor_parallel_size 8"):
        decide("bf16", spec("bf16"), auto(), shape)


def test_the_checkpoints_own_bytes_decide_once_it_exists(tmp_path):
    """A checkpoint larger than the estimate (here a sparse file of BF16 size under a W4A16 name) decides by its
    real bytes."""
    ckpt = tmp_path / "gptq-w4a16"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA3_70B))
    with open(ckpt / "model.safetensors", "wb") as f:
        f.truncate(141 * GB)  # sparse: no disk used
    p = tiny_params(serving={"tensor_parallel_size": "auto"})
    decision = parallelism.decision_for("gptq-w4a16", p, ckpt)
    assert decision.weights_from == "checkpoint" and decision.tensor_parallel_size == 4
    assert parallelism.tensor_parallel_for("gptq-w4a16", p, ckpt) == 4
    os.remove(ckpt / "model.safetensors")


@pytest.fixture()
def llama70b_source(tmp_path) -> Path:
    source = tmp_path / "llama70b"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(LLAMA3_70B))
    return source


def params_for(source: Path, evaluate_share: float = 0.5, **serving) -> dict:
    """A 70B target; evaluate's vLLM engines at evaluate_share of each GPU (the default 0.3 can't hold BF16 70B on 8
    H100s: test_evaluate_engines_...)."""
    return tiny_params(
        target={"source": str(source)},
        draft={"source": {"from": "target", "layers": 2}},
        serving=serving,
        evaluate={"vllm": {"gpu_memory_utilization": evaluate_share}},
    )


@pytest.mark.parametrize(
    "serving, message",
    [
        (
            {"gpu": "h100", "tensor_parallel_size": 1},
            "variant bf16 does not fit serving.gpu h100 at the pinned serving.tensor_parallel_size 1",
        ),
        (
            {"max_tensor_parallel_size": 2},
            "variant bf16 does not fit h100 GPUs (80 GB) at tensor parallel up to serving.max_tensor_parallel_size 2",
        ),
        ({"max_tensor_parallel_size": 3}, "serving.max_tensor_parallel_size is 3; allowed: enum [1, 2, 4, 8]"),
        # a tier's declared GPUs are checked at the size decided for the variants (bf16: 4)
        ({"tiers": {"small": {"gpus": 2}}}, "serving.tiers.small: tensor_parallel_size 4"),
    ],
)
def test_a_variant_that_cannot_fit_is_refused_when_params_are_checked(llama70b_source, serving, message, tmp_path):
    with pytest.raises(PipelineError) as err:
        validate(params_for(llama70b_source, **serving), tmp_path / "params.yaml")
    assert "\n" not in str(err.value) and message in str(err.value), str(err.value)


def test_a_70b_shape_that_fits_passes_the_params_check(llama70b_source, tmp_path):
    validate(params_for(llama70b_source), tmp_path / "params.yaml")  # bf16 at 4, the others at 2


def test_manifests_at_tp2_request_two_gpus_shared_memory_and_count_replicas():
    """A tier resolved at TP 2 (as the bundle stage resolves a variant): the Deployment requests 2 GPUs with a
    memory-backed /dev/shm for NCCL, and the autoscaler says it scales replicas of 2 GPUs; the Kubernetes schemas
    accept every document."""
    import kubernetes_validate

    from pipeline.release import deploy
    from pipeline.release.settings import DeployParams
    from pipeline.serving.tiers import parse_tiers

    p = tiny_params()
    serving = parallelism.resolved(auto(), 2)
    tiers = {t.name: t for t in parse_tiers(serving)}
    assert tiers["default"].gpus == tiers["throughput"].gpus == 2
    settings = DeployParams.parse(p["deploy"])
    text = deploy.manifests(
        deploy.PodSpec(tiers["throughput"], serving, "gptq-w4a16", settings, "/models/x", 900, {}),
        {},
        running_target=32,
    )
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    deployment, _, hpa = docs
    pod = deployment["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 2
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    assert deployment["metadata"]["annotations"][deploy.GPUS_PER_REPLICA] == "2"
    assert hpa["metadata"]["annotations"] == {
        deploy.GPUS_PER_REPLICA: "2",
        "modelprep/max-gpus": str(2 * settings.autoscale.max_replicas),
    }


@pytest.mark.parametrize(
    "run,plan,folder,config,variant",
    [
        ("scale-70b", "scale-70b", "out", "bf16-tp4", "bf16"),
        ("scale-70b", "scale-70b", "out", "fp8-dynamic-tp2", "fp8-dynamic"),
        ("scale-70b", "scale-70b", "out", "w4a16-tp2", "gptq-w4a16"),
        ("scale-host", "scale-70b-fp8-tp4", "scale", "fp8-dynamic-tp4", "fp8-dynamic"),
    ],
)
def test_weights_per_gpu_match_what_vllm_loaded_at_70b_on_the_h100s(run, plan, folder, config, variant):
    """The memory model's weight bytes, split over TP GPUs, against vLLM 0.26's own "Actual usage is X GiB for weight"
    per GPU when it served the 70B shape at that TP on the 4x H100 host (benchmarks/gpu/raw/scale-70b and
    raw/scale-host, SCALE.md)."""
    import re

    root = Path(__file__).resolve().parents[2] / "benchmarks/gpu/raw" / run
    tp = next(
        c["tp"]
        for wave in json.loads((root.parents[2] / f"gpu/plans/{plan}.json").read_text())
        for c in wave
        if c["name"] == config
    )
    log = (root / folder / config / "server.brief.log").read_text()
    served_gib = float(re.search(r"Actual usage is ([0-9.]+) GiB for weight", log)[1])
    modelled_gib = parallelism.estimated_weight_bytes(SHAPE_70B, spec(variant)) / tp / parallelism.GIB
    assert modelled_gib == pytest.approx(served_gib, rel=0.02)


LLAMA3_8B = {"model_type": "llama", **SHAPES["llama-3-8b"], "tie_word_embeddings": False}


def test_the_draft_tensor_parallel_size_at_the_decided_size_passes_with_the_recipe_check_remembered(tmp_path):
    """A second `dvc repro` remembers the recipe check (check_recipes=False): the tiers are still checked at the
    size decided from the config (8B BF16 with 256 x 4096 tokens of KV cache: 4), not at a made-up 1."""
    source = tmp_path / "llama8b"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(LLAMA3_8B))
    p = tiny_params(
        target={"source": str(source)},
        draft={"source": {"from": "target", "layers": 2}},
        quantize={"enabled": ["bf16"]},
        serving={"max_num_seqs": 256, "max_model_len": 4096, "speculation": {"draft_tensor_parallel_size": 4}},
    )
    assert (
        parallelism.decide(
            "bf16", spec("bf16"), parallelism.ServingParams.parse(p["serving"]), ModelShape.from_config(LLAMA3_8B)
        ).tensor_parallel_size
        == 4
    )
    validate(p, tmp_path / "params.yaml", check_recipes=True)
    validate(p, tmp_path / "params.yaml", check_recipes=False)
    # and a size the decision contradicts is still refused without the recipe check
    p["serving"]["speculation"]["draft_tensor_parallel_size"] = 2
    with pytest.raises(
        PipelineError, match="draft_tensor_parallel_size 2 differs from tier default's tensor_parallel_size 4"
    ):
        validate(p, tmp_path / "params.yaml", check_recipes=False)


def test_the_draft_tensor_parallel_size_is_not_checked_at_a_made_up_size_before_auto_decides(tmp_path):
    """A Hub target not in the cache yet: its config (and so its tensor parallelism) is unknown until the models
    stage; a draft_tensor_parallel_size of 4 is not refused against a guessed 1."""
    p = tiny_params(
        target={"source": "hf:example-org/not-cached-8b"},
        draft={"source": "hf:example-org/not-cached-1b"},
        serving={"speculation": {"draft_tensor_parallel_size": 4}},
    )
    validate(p, tmp_path / "params.yaml")
    validate(p, tmp_path / "params.yaml", check_recipes=False)


def test_distill_sizes_the_targets_engine_at_its_own_memory_share(tmp_path):
    """distill's vLLM engine runs at draft_training.vllm.gpu_memory_utilization (0.5), not serving's 0.9: the BF16 70B
    target (141 GB) needs 8 H100s there (at 4: 35.3 GB + overhead over 40 GB), where serving's load decided 4."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(LLAMA3_70B))
    with open(target / "model.safetensors", "wb") as f:
        f.truncate(141 * GB)  # sparse
    p = tiny_params(serving={"tensor_parallel_size": "auto"})
    assert p["draft_training"]["vllm"]["gpu_memory_utilization"] == 0.5
    assert parallelism.target_tensor_parallel(p, target) == 8
    p["draft_training"]["vllm"]["gpu_memory_utilization"] = 0.9
    assert parallelism.target_tensor_parallel(p, target) == 4
    os.remove(target / "model.safetensors")


def test_evaluate_engines_take_at_least_the_served_size_at_their_own_share(tmp_path):
    """evaluate's vLLM engines run at evaluate.vllm.gpu_memory_utilization: W4A16 70B is served at TP 2; at 0.5 its
    engines take 2 too (never fewer than served, though one GPU would hold them), at 0.3 (24 GB) they need 4."""
    ckpt = tmp_path / "gptq-w4a16"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA3_70B))
    with open(ckpt / "model.safetensors", "wb") as f:
        f.truncate(int(39.5 * GB))  # sparse
    p = tiny_params(serving={"tensor_parallel_size": "auto"}, evaluate={"vllm": {"gpu_memory_utilization": 0.5}})
    assert parallelism.tensor_parallel_for("gptq-w4a16", p, ckpt) == 2
    assert parallelism.evaluate_tensor_parallel("gptq-w4a16", p, ckpt) == 2
    p["evaluate"]["vllm"]["gpu_memory_utilization"] = 0.3
    assert parallelism.evaluate_tensor_parallel("gptq-w4a16", p, ckpt) == 4
    os.remove(ckpt / "model.safetensors")
    # the engines' draft model follows their size where one is set (vLLM serves a draft only at its target's)
    served = parallelism.resolved(auto(speculation={"draft_tensor_parallel_size": 2}), 2)
    engines = parallelism.engine_serving(served, 4)
    assert (engines.tensor_parallel_size, engines.speculation.draft_tensor_parallel_size) == (4, 4)
    assert parallelism.engine_serving(parallelism.resolved(auto(), 2), 4).speculation.draft_tensor_parallel_size is None


def test_a_variant_evaluates_share_cannot_hold_is_refused_when_params_are_checked(llama70b_source, tmp_path):
    """Refused only where the weights and KV cache alone exceed the share at every size (BF16 70B's 17.6 GB per GPU at
    TP 8 against 8 GB at 0.1); where only the overhead estimate tips it (0.3: 24 GB), the largest size is used."""
    with pytest.raises(PipelineError) as err:
        validate(params_for(llama70b_source, evaluate_share=0.1), tmp_path / "params.yaml")
    line = str(err.value)
    assert (
        "\n" not in line
        and "evaluate@bf16: vLLM at evaluate.vllm.gpu_memory_utilization 0.1 does not fit h100 "
        "GPUs at tensor parallel 4 up to serving.max_tensor_parallel_size 8: at 8 weights 17.6 GB"
        in line
    ), line
    validate(params_for(llama70b_source, evaluate_share=0.3), tmp_path / "params.yaml")


def test_a_small_model_on_a_small_gpu_is_not_refused_for_the_overhead_estimate():
    """A tiny model's evaluate engine on a T4 at the default share 0.3 (4.8 GB): the 6.4 GiB overhead estimate alone
    exceeds it, its weights and KV cache do not; the engine runs at the served size, not refused."""
    p = tiny_params(serving={"tensor_parallel_size": "auto", "gpu": "t4"})
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 256,
        "vocab_size": 1024,
    }
    serving = parallelism.ServingParams.parse(p["serving"])
    fit = parallelism.engine_fit(
        "evaluate@bf16",
        parallelism.Engine.of(p, "evaluate.vllm"),
        serving,
        ModelShape.from_config(config),
        10**6,
        spec("bf16"),
    )
    assert fit.tensor_parallel_size == 1 and not fit.fits  # as served: vLLM's memory check has the last word


def test_a_config_the_memory_model_cannot_read_serves_on_one_gpu_and_says_why():
    """A GPT-2-style config (n_head, n_embd) is no Llama-style decoder's: auto can't size it, and a build of such a
    model must not be refused for it (as it was, with a KeyError line, before any stage ran): one GPU, said why."""
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257}
    assert parallelism.shape_of(gpt2) is None
    d = decide("bf16", spec("bf16"), auto(), parallelism.shape_of(gpt2))
    assert d.tensor_parallel_size == 1 and "can't read this model config's layer shapes" in d.reason()
