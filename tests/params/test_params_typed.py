"""Typed params per concern (issue #31): each params.yaml section parses into its concern's frozen dataclasses
(pipeline/<concern>/settings.py), one Params composes them, and a bad value is one line naming the file and the key.
Real params.yaml and profiles, no mocks."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from dvc_deps import closure
from pipeline.core.errors import PipelineError
from pipeline.params.load import load_params, parse_section
from pipeline.params.profiles import overlay
from pipeline.quantize.settings import QuantizeParams
from pipeline.sections import KINDS, Params, load_typed
from pipeline.serving.settings import ServingParams
from tiny_project import ROOT

SETTINGS = sorted(p.relative_to(ROOT) for p in (ROOT / "pipeline").glob("*/settings.py"))


def raw() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def with_value(dotted: str, value) -> dict:
    params = raw()
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node[key]
    node[leaf] = value
    return params


def profiled(name: str) -> dict:
    """params.yaml with a profile written over it, as `modelprep profile <name>` merges them (the gpu-* overlays over
    the gpu profile, as session.sh applies them; gpu-smollm2 over smollm2)."""
    base = raw()
    if name.startswith("gpu-"):
        base, _ = overlay(
            base,
            yaml.safe_load((ROOT / "profiles" / ("smollm2.yaml" if name == "gpu-smollm2" else "gpu.yaml")).read_text()),
        )
    merged, _ = overlay(base, yaml.safe_load((ROOT / "profiles" / f"{name}.yaml").read_text()))
    return merged


def test_params_yaml_parses_into_every_section_and_the_values_are_the_files():
    params, mapping = load_typed(ROOT / "params.yaml"), raw()
    assert [f.name for f in dataclasses.fields(Params)] == list(KINDS) == list(mapping)
    assert params.target.source == mapping["target"]["source"]
    assert params.draft.method == tuple(mapping["draft"]["method"])
    assert params.draft.ngram.prompt_lookup_max == mapping["draft"]["ngram"]["prompt_lookup_max"]
    assert params.draft.eagle3.ttt_steps == mapping["draft"]["eagle3"]["ttt_steps"]
    assert params.demo.draft.domain_share == mapping["demo"]["draft"]["domain_share"]
    assert params.data.fractions.heldout == mapping["data"]["fractions"]["heldout"]
    assert params.quantize.enabled == tuple(mapping["quantize"]["enabled"])
    assert params.quantize.calibration.ignore == tuple(mapping["quantize"]["calibration"]["ignore"])
    assert params.quantize.distributed.timeout_s == mapping["quantize"]["distributed"]["timeout_s"]
    assert dict(params.quantize.variants["gptq-w4a16"]) == mapping["quantize"]["variants"]["gptq-w4a16"]
    assert params.draft_training.lora.r == mapping["draft_training"]["lora"]["r"]
    assert params.draft_training.vllm.enforce_eager == mapping["draft_training"]["vllm"]["enforce_eager"]
    assert params.evaluate.vllm.throughput_batch_sizes == tuple(mapping["evaluate"]["vllm"]["throughput_batch_sizes"])
    variant = next(iter(mapping["gates"]["overrides"]))
    assert params.gates.for_variant(variant) == {
        **mapping["gates"]["thresholds"],
        **mapping["gates"]["overrides"][variant],
    }
    assert params.serving.slo.p99_ttft_ms == mapping["serving"]["slo"]["p99_ttft_ms"]
    assert params.serving.speculation.min_gain == mapping["serving"]["speculation"]["min_gain"]
    assert params.serve_bench.concurrency == tuple(mapping["serve_bench"]["concurrency"])
    assert params.serve_bench.capacity.max_probes == mapping["serve_bench"]["capacity"]["max_probes"]
    assert params.deploy.autoscale.tiers == tuple(mapping["deploy"]["autoscale"]["tiers"])
    assert params.monitoring.latency_margin == mapping["monitoring"]["latency_margin"]
    assert params.publish.signing.public_key == mapping["publish"]["signing"]["public_key"]


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml")))
def test_every_profile_parses(profile):
    """A profile that passes the whole-file check (test_profiles.py) must parse too: the stages read it typed."""
    merged = profiled(profile)
    params = Params.parse(merged)
    assert params.quantize.enabled == tuple(merged["quantize"]["enabled"])


def test_the_values_are_frozen_all_the_way_down():
    params = load_typed(ROOT / "params.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.serving.max_num_seqs = 1
    with pytest.raises(TypeError):
        params.quantize.variants["bf16"]["algorithm"] = "gptq"
    with pytest.raises(TypeError):
        params.serving.tiers["latency"]["concurrency"] = 2
    # the caller's mapping is not the one held: changing it later changes nothing parsed
    mapping = raw()
    quantize = QuantizeParams.parse(mapping["quantize"])
    mapping["quantize"]["variants"]["bf16"]["algorithm"] = "gptq"
    assert quantize.variants["bf16"]["algorithm"] == raw()["quantize"]["variants"]["bf16"]["algorithm"]


BAD = [  # (key, value, what the one line says after the key)
    ("target.source", 3, "must be a string"),
    ("target.source", " ", "must be a model source"),
    ("draft.source", {"from": "target"}, "draft.source must be a model source or {from: target, layers: N}"),
    ("draft.source", {"from": "target", "layers": 0}, "draft.source.layers must be an integer >= 1"),
    ("draft.method", ["medusa"], "draft.method: unknown method 'medusa'"),
    ("draft.ngram.prompt_lookup_min", 0, "draft.ngram.prompt_lookup_min must be an integer in 1..16"),
    ("draft.eagle3.aux_layers", [1, 2], "draft.eagle3.aux_layers must be auto or three distinct"),
    ("demo.target.hidden_size", "384", "demo.target.hidden_size must be an integer >= 1, got '384'"),
    ("data.max_tokens", 1.5, "data.max_tokens must be an integer >= 1"),
    ("data.fractions", None, "data.fractions.calibration is missing"),
    ("data.prompt_format", "raw", "data.prompt_format must be one of chat_template, plain, got 'raw'"),
    ("target.max_perplexity", 1, "target.max_perplexity must be a number above 1, got 1"),
    ("target.max_perplexity", "1000", "target.max_perplexity must be a number above 1, got '1000'"),
    ("quantize.enabled", ["bf16", "bf16"], "quantize.enabled must be a non-empty list of distinct variant names"),
    ("quantize.enabled", ["bf17"], "quantize.enabled names unknown variants ['bf17']"),
    ("quantize.calibration.num_samples", True, "quantize.calibration.num_samples must be an integer >= 1, got True"),
    ("quantize.calibration.pipeline", "layerwise", "quantize.calibration.pipeline must be one of"),
    ("quantize.distributed.gpus", 0, "quantize.distributed.gpus must be an integer >= 1"),
    ("quantize.distributed", {"gpu": 2}, "unknown key quantize.distributed.gpu (did you mean gpus?)"),
    ("draft_training.resume", "yes", "draft_training.resume must be true or false"),
    ("draft_training.generator", "tgi", "draft_training.generator must be one of auto, transformers, vllm"),
    ("draft_training.lora.r", 0, "draft_training.lora.r must be an integer >= 1"),
    ("draft_quantize.variant", 4, "draft_quantize.variant must be a string"),
    (
        "evaluate.acceptance.cost_ratio",
        "flops",
        "evaluate.acceptance.cost_ratio must be one of weight_bytes, measured or a number",
    ),
    ("evaluate.vllm.enabled", 1, "evaluate.vllm.enabled must be one of True, False, auto, got 1"),
    ("evaluate.lm_eval.tasks", "domain_heldout", "evaluate.lm_eval.tasks must be a list of strings"),
    ("gates.overrides", {"bf16": 3}, "gates.overrides.bf16 must be a mapping of thresholds"),
    ("serving.tensor_parallel_size", 0, "serving.tensor_parallel_size must be auto or an integer >= 1"),
    ("serving.slo", {"p99_itl_ms": 50}, "serving.slo.p99_ttft_ms must be a positive number"),
    ("serving.slo.arrival", "burst", "serving.slo.arrival must be one of"),
    ("serving.speculation.min_gain", 0, "serving.speculation.min_gain must be a positive number"),
    ("serving.env", ["A=1"], "serving.env must be a mapping"),
    ("serve_bench.num_speculative_tokens", 0, "serve_bench.num_speculative_tokens must be auto or an integer >= 1"),
    ("serve_bench.k_schedule", False, "serve_bench.k_schedule must be one of auto, off, got False"),
    ("serve_bench.parallel", False, "serve_bench.parallel must be one of auto, off, got False"),
    ("serve_bench.capacity", {"enabled": True}, "serve_bench.capacity.max_concurrency is missing"),
    ("deploy.warmup_from_traffic", "no", "deploy.warmup_from_traffic must be true or false"),
    ("deploy.autoscale.tiers", "throughput", "deploy.autoscale.tiers must be all or a list of strings"),
    ("monitoring.latency_margin", None, "monitoring.latency_margin must be a number in (1, 100], got None"),
    ("publish.version", 1.1, "publish.version must be a string, got 1.1"),
    ("publish.backend", "s3", "publish.backend must be one of local, mlflow, hf"),
]


@pytest.mark.parametrize("key, value, message", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(tmp_path, key, value, message):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(with_value(key, value)))
    with pytest.raises(PipelineError) as e:
        load_typed(path)
    line = str(e.value)
    assert line.startswith(f"{path}: ") and message in line and "\n" not in line, line


def test_a_missing_section_is_named():
    params = raw()
    del params["serve_bench"]
    with pytest.raises(PipelineError, match=r"missing sections \['serve_bench'\]"):
        Params.parse(params)
    with pytest.raises(PipelineError, match="params.yaml: missing section serve_bench"):
        parse_section(params, KINDS["serve_bench"], "params.yaml")


def test_a_stage_reads_one_section_typed_from_the_mapping_it_loaded():
    params = load_params(ROOT / "params.yaml")
    serving = parse_section(params, ServingParams)
    assert serving == load_typed(ROOT / "params.yaml").serving
    assert serving.tiers.keys() == params["serving"]["tiers"].keys()


def test_absent_optional_keys_read_as_the_defaults_the_code_documents():
    """Keys params.yaml may leave out (a user's own file, an old one): the typed value has the default the code
    applied to the missing key before (draft.method: draft_model; quantize.distributed: one process)."""
    params = raw()
    del params["draft"]["method"], params["quantize"]["distributed"], params["serving"]["env"]
    del params["quantize"]["calibration"]["ignore"], params["draft_training"]["vllm"]
    typed = Params.parse(copy.deepcopy(params))
    assert typed.draft.method == ("draft_model",) and typed.draft.ngram is None and typed.draft.eagle3 is None
    assert (typed.quantize.distributed.gpus, typed.quantize.calibration.ignore) == (1, ("lm_head",))
    assert dict(typed.serving.env) == {} and typed.draft_training.vllm.enforce_eager is True


@pytest.mark.parametrize("module", SETTINGS, ids=str)
def test_a_settings_module_imports_only_core_and_its_own_concern(module):
    """A stage's deps are its import closure: a concern's settings must not pull another concern's code (or its
    own heavy code) into the deps of every stage that reads one of its knobs. draft.source is the models concern's,
    so the drafts' settings read it from there."""
    concern = module.parts[1]
    allowed = {"core", "params", concern} | ({"models"} if concern == "drafts" else set())
    imported = {p for p in closure(ROOT / module) if p.parts[0] == "pipeline" and len(p.parts) > 2}
    assert {p.parts[1] for p in imported} <= allowed, sorted(map(str, imported))
    # of params, only the declarations' machinery (it imports core only): never the checks or another concern
    assert {p.name for p in imported if p.parts[1] == "params"} <= {"__init__.py", "declare.py"}
    heavy = {
        "oneshot.py",
        "recipes.py",
        "tiers.py",
        "loading.py",
        "load_generator.py",
        "sweep.py",
        "thresholds.py",
        "gates.py",
        "decision.py",
    }
    assert not {p.name for p in imported} & heavy, sorted(map(str, imported))
