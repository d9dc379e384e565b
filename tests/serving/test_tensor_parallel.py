"""Tensor parallelism (issue #19): serving.tensor_parallel_size and the draft model's own, validated up front,
carried into every serving file of a bundle (serve.yaml, engine_args.json, serve-<tier>.yaml, the manifests' GPU
requests), and into the engines that evaluate and distill through vLLM, so what is measured is what is served.
vLLM itself is not here (CPU): its side is the arguments it is handed, and the GPU count the stages read."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from bundle_helpers import BundleSpec, run_stage_in_process
from pipeline import evaluation as evaluate  # imported before a test fakes the host's GPUs
from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.drafts import methods
from pipeline.drafts.settings import DraftParams
from pipeline.evaluate import vllm_spec
from pipeline.rules import validate
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.config import speculative_config_for
from pipeline.serving.settings import ServingParams
from pipeline.serving.tiers import parse_tiers
from stages import serve_bench  # noqa: F401 - imported before a test fakes the host's GPUs
from tiny_project import tiny_params

V = "fp8-dynamic"
# The tiny pair's o_proj (128 inputs) holds 64 per GPU at TP 2, not a whole group of GPTQ's 128: vLLM can't shard
# gptq-w4a16 there (tests/serving/test_sharding.py), so the sharded params here build the variants without groups.
UNGROUPED = {"enabled": ["bf16", "fp8-static"]}
TP2 = {
    "tensor_parallel_size": 2,
    "speculation": {"draft_tensor_parallel_size": 2},
    # wide: serving's tensor parallelism on more GPUs than it shards over; tp4: its own, not speculating
    "tiers": {"wide": {"gpus": 4, "concurrency": 1}, "tp4": {"tensor_parallel_size": 4, "speculation": "off"}},
}


# ---- params


@pytest.mark.parametrize(
    "serving, message",
    [
        (
            {"tensor_parallel_size": 0},
            r"serving.tensor_parallel_size is 0; allowed: type integer or enum \['auto'\], minimum 1",
        ),
        (
            {"tensor_parallel_size": "2"},
            r"serving.tensor_parallel_size is '2'; allowed: type integer or enum \['auto'\], minimum 1",
        ),
        (
            {"tensor_parallel_size": True},
            r"serving.tensor_parallel_size is True; allowed: type integer or enum \['auto'\], minimum 1",
        ),
        (
            {"tensor_parallel_size": None},
            r"serving.tensor_parallel_size is None; allowed: type integer or enum \['auto'\], minimum 1",
        ),
        # a tier inherits serving's tensor parallelism, so its declared GPUs must hold it
        (
            {"tensor_parallel_size": 2, "tiers": {"small": {"gpus": 1}}},
            r"serving.tiers.small: tensor_parallel_size 2 \(serving.tensor_parallel_size\) exceeds the 1 GPUs",
        ),
        (
            {"speculation": {"draft_tensor_parallel_size": 0}},
            r"serving.speculation.draft_tensor_parallel_size is 0; allowed: type \['integer', 'null'\], minimum 1",
        ),
        (
            {"speculation": {"draft_tensor_parallel_size": "auto"}},
            r"serving.speculation.draft_tensor_parallel_size is 'auto'; allowed: type \['integer', 'null'\], minimum 1",
        ),
        # vLLM 0.25's SpeculativeConfig takes 1 under a TP-2 target; its draft-model proposer refuses it at start
        (
            {"tensor_parallel_size": 2, "speculation": {"draft_tensor_parallel_size": 1}},
            "serving.speculation.draft_tensor_parallel_size 1 differs from tier default's tensor_parallel_size 2",
        ),
        (
            {
                "tensor_parallel_size": 2,
                "speculation": {"draft_tensor_parallel_size": 2},
                "tiers": {"big": {"tensor_parallel_size": 4}},
            },
            "draft_tensor_parallel_size 2 differs from tier big's tensor_parallel_size 4",
        ),
    ],
)
def test_bad_tensor_parallel_params_are_one_line(serving, message, tmp_path):
    p = tiny_params(serving=serving, quantize=UNGROUPED)
    with pytest.raises(PipelineError, match=message) as err:
        validate(p, tmp_path / "params.yaml")
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_tiers_inherit_serving_tensor_parallelism_and_request_its_gpus(tmp_path):
    p = tiny_params(serving=TP2, quantize=UNGROUPED)
    validate(p, tmp_path / "params.yaml")  # a tier that does not speculate may shard differently from the draft
    tiers = {t.name: t for t in parse_tiers(ServingParams.parse(p["serving"]))}
    assert {n: (t.tensor_parallel_size, t.gpus) for n, t in tiers.items()} == {
        "default": (2, 2),
        "latency": (2, 2),
        "throughput": (2, 2),
        "wide": (2, 4),
        "tp4": (4, 4),
    }
    assert tiers["wide"].engine == {} and tiers["tp4"].engine == {"tensor_parallel_size": 4}
    # a null draft TP follows
    validate(tiny_params(serving={"tensor_parallel_size": 2}, quantize=UNGROUPED), tmp_path / "params.yaml")


def test_draft_tensor_parallelism_goes_to_the_draft_model_only():
    assert methods.speculative_config(methods.Speculation("draft_model", 4), draft_tensor_parallel_size=2) == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": "./draft",
        "draft_tensor_parallel_size": 2,
    }
    assert "draft_tensor_parallel_size" not in methods.speculative_config(methods.Speculation("draft_model", 4))
    # vLLM shards an EAGLE-3 head with its target; n-gram lookup has no model
    assert methods.speculative_config(methods.Speculation("eagle3", 5), draft_tensor_parallel_size=2) == {
        "method": "eagle3",
        "num_speculative_tokens": 5,
        "model": "./eagle3",
    }
    ngram = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert "draft_tensor_parallel_size" not in methods.speculative_config(methods.Speculation("ngram", 4), ngram, 2)
    p = tiny_params(serving=TP2)
    draft, serving = DraftParams.parse(p["draft"]), ServingParams.parse(p["serving"])
    assert (
        speculative_config_for(methods.Speculation("draft_model", 3), draft, serving)["draft_tensor_parallel_size"] == 2
    )
    assert speculative_config_for(methods.NONE, draft, serving) is None


# ---- the bundle


@pytest.fixture(scope="module")
def bundle_spec():
    return BundleSpec({V: {}}, {"serving": TP2})


@pytest.fixture(scope="module")
def tp2_bundle(bundled_workspace):
    return bundled_workspace / "artifacts/bundles" / V


def test_bundle_serving_files_carry_tensor_parallelism(tp2_bundle):
    b = tp2_bundle
    args = json.loads((b / "engine_args.json").read_text())
    serve = yaml.safe_load((b / "serve.yaml").read_text())
    assert args["tensor_parallel_size"] == 2 and serve["tensor-parallel-size"] == 2
    assert serve["speculative-config"]["method"] == "draft_model"  # the demo pair's draft ships
    assert serve["speculative-config"]["draft_tensor_parallel_size"] == 2
    assert args["speculative_config"] == serve["speculative-config"]
    for tier, tp in (("latency", 2), ("throughput", 2), ("wide", 2), ("tp4", 4)):
        assert yaml.safe_load((b / f"serve-{tier}.yaml").read_text())["tensor-parallel-size"] == tp, tier
    assert "speculative-config" not in yaml.safe_load((b / "serve-tp4.yaml").read_text())


def test_manifests_request_each_tiers_gpus(tp2_bundle):
    import kubernetes_validate

    for tier, gpus in (("default", 2), ("latency", 2), ("throughput", 2), ("wide", 4), ("tp4", 4)):
        docs = list(yaml.safe_load_all((tp2_bundle / "deploy" / f"{tier}.yaml").read_text()))
        for doc in docs:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        resources = docs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == gpus, tier
    card = (tp2_bundle / "README.md").read_text()
    assert any(line.startswith("| wide | `serve-wide.yaml` | 1 | 4 |") for line in card.splitlines()), card


# ---- evaluation and distillation through vLLM


def test_evaluation_engines_are_sharded_as_served():
    from pipeline.evaluate import lmeval
    from pipeline.evaluation import Settings, lm_eval_engine

    p = tiny_params(serving=TP2)
    args = lmeval.vllm_model_args("/m", lm_eval_engine(Settings.of(p)))
    assert args["tensor_parallel_size"] == 2 and args["pretrained"] == "/m"
    assert args["max_model_len"] == p["serving"]["max_model_len"]
    assert lmeval.vllm_model_args("/m")["tensor_parallel_size"] == 1
    (_, baseline), (_, speculative) = vllm_spec.engine_configs("/m", "/d", 4, 0.3, 512, 2, 2, enforce_eager=True)
    assert baseline["tensor_parallel_size"] == speculative["tensor_parallel_size"] == 2
    assert "speculative_config" not in baseline and baseline["enforce_eager"] is True
    assert speculative["speculative_config"] == {
        "method": "draft_model",
        "model": "/d",
        "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 2,
    }
    [(label, only)] = vllm_spec.engine_configs("/m", None, 4, 0.3, 512)
    assert label == "baseline" and only["tensor_parallel_size"] == 1


def test_distillation_engine_is_sharded_as_served(tmp_path):
    from pipeline.drafts.distill_vllm import engine_kwargs, resolve_generator
    from pipeline.drafts.settings import DraftTrainingParams

    engine = DraftTrainingParams.parse(tiny_params()["draft_training"]).vllm
    kwargs = engine_kwargs(tmp_path, 512, engine, 2)
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["model"] == str(tmp_path.resolve())
    if vllm_spec.unavailable_reason(2) is not None:  # this host can't shard over 2 GPUs: transformers answers
        assert resolve_generator("auto", 2) == "transformers"


def test_too_few_gpus_names_what_needs_them():
    assert vllm_spec.too_few_gpus(2, 2) is None and vllm_spec.too_few_gpus(1, 8) is None
    assert vllm_spec.too_few_gpus(2, 1) == "serving.tensor_parallel_size 2 needs more GPUs than the 1 here"
    assert (
        vllm_spec.too_few_gpus(4, 0, "tensor_parallel_size") == "tensor_parallel_size 4 needs more GPUs than the 0 here"
    )


# ---- serve_bench on a host with fewer GPUs than serving shards over


@pytest.fixture
def one_gpu_host(monkeypatch):
    """A host where CUDA and vLLM are present with one GPU, as torch and importlib report it: what the stages read."""
    import torch

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(vllm_spec, "GPU_DEVICE_FILES", ("/dev/null",))  # a device file torch would look behind
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else find_spec(name, *a)
    )


def test_serve_bench_records_the_default_sweep_skipped_when_serving_needs_more_gpus(one_gpu_host, tmp_path, capfd):
    variant = "bf16"
    p = tiny_params(serving={"tensor_parallel_size": 2})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    assert vllm_spec.unavailable_reason() is None  # one GPU would do for an unsharded model
    r = run_stage_in_process(tmp_path, capfd, "stages.serve_bench", variant)
    reason = "serving.tensor_parallel_size 2 needs more GPUs than the 1 here"
    assert r.returncode == 0 and f"skipped ({reason})" in r.stdout, r.stderr[-2000:]
    assert records.read(ServeBenchRecord, tmp_path / f"metrics/serve-{variant}.json") == ServeBenchRecord(
        variant, skipped=reason
    )
    p["serve_bench"]["enabled"] = True  # asked for explicitly: an error, not a silent skip
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    r = run_stage_in_process(tmp_path, capfd, "stages.serve_bench", variant)
    assert r.returncode == 2 and f"serve_bench.enabled is true but the GPU path cannot run: {reason}" in r.stderr


def test_vllm_engines_elsewhere_need_serving_gpus_too(one_gpu_host, tmp_path):
    """evaluate's speculative check is skipped with the reason, lm-eval refuses to score elsewhere than sharded as
    served (one line, before the stage's work), distillation
    generates through transformers (or, asked for vLLM, fails naming why): none starts vLLM on too few GPUs."""
    from pipeline.drafts.distill_vllm import resolve_generator
    from pipeline.evaluate import lmeval

    reason = "serving.tensor_parallel_size 2 needs more GPUs than the 1 here"
    p = tiny_params(serving={"tensor_parallel_size": 2})
    assert evaluate.gpu_measurement(tmp_path, [[1, 2, 3]], 2, evaluate.Settings.of(p)) == vllm_spec.VllmMeasurement(
        skipped=reason
    )
    assert lmeval.backend(1) == "vllm"
    with pytest.raises(PipelineError, match=f"evaluate.lm_eval runs through vLLM sharded as served, but {reason}"):
        lmeval.backend(2)
    assert resolve_generator("auto", 2) == "transformers" and resolve_generator("auto", 1) == "vllm"
    with pytest.raises(PipelineError, match=f"generator is vllm but vLLM cannot run here: {reason}"):
        resolve_generator("vllm", 2)
