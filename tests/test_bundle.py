"""The bundle stage on the tiny demo pair: layout, vLLM configs, model card, MANIFEST and `modelprep verify`."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import shutil

import pytest
import yaml

from tiny_project import tiny_params, tiny_serving
from bundle_helpers import BundleSpec, one_error_line, run_stage, verify_cli
from eval_helpers import eval_summary
from speculation_estimates import PER_POSITION, speculative_estimate
from pipeline.core.errors import PipelineError
from pipeline.evaluate.summary import EvalSummary, Quality
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.quantize.recipes import parse_variant
from pipeline.release.bundle import SPEC_METRICS, model_card
from pipeline.release.gates import VariantVerdict
from pipeline.release.speculation_choice import SpeculationDecision
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.config import engine_args

VARIANTS = {
    "fp8-static": {},                          # kv_cache: fp8 in params -> calibrated KV scales
    "fp8-dynamic": {},
    "awq-w4a16": {"kl_divergence": 0.2},       # fails its gate, allowed below
    "gptq-w4a16": {"top1_agreement": 0.5},     # fails its gate, not allowed
}


@pytest.fixture(scope="module")
def bundle_spec():
    return BundleSpec(VARIANTS, {"gates": {"allow_fail": ["awq-w4a16"]}},
                      bundled=("fp8-static", "fp8-dynamic", "awq-w4a16"))


def bundle(ws, variant):
    return ws / "artifacts/bundles" / variant


def test_bundle_layout_and_manifest(bundled_workspace):
    b = bundle(bundled_workspace, "fp8-static")
    for name in ("model/config.json", "model/model.safetensors", "model/tokenizer.json", "model/tokenizer_config.json",
                 "model/chat_template.jinja", "draft/config.json", "draft/model.safetensors", "serve.yaml",
                 "engine_args.json", "README.md", "PROVENANCE.json", "GATE.json", "EVAL.json", "MANIFEST.json"):
        assert (b / name).is_file(), name
    manifest = json.loads((b / "MANIFEST.json").read_text())
    on_disk = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()} - {"MANIFEST.json"}
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        data = (b / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}, name
    prov = json.loads((b / "PROVENANCE.json").read_text())
    assert prov["variant"] == "fp8-static" and prov["recipe"]["scheme"] == "FP8" and prov["recipe"]["kv_cache"] == "fp8"
    assert prov["serving"]["name"] == tiny_params()["serving"]["name"]
    assert prov["libraries"]["torch"] == importlib.metadata.version("torch")
    assert "git_commit" in prov and str(bundled_workspace) not in json.dumps(prov)  # no paths of the building machine
    r = verify_cli(b)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: ") and manifest["bundle_digest"][:12] in r.stdout


def test_bundle_files_are_as_readable_as_any_file_the_user_makes(bundled_workspace):
    """Issue #29: bundles were 0600/0700 (mkdtemp's directory, safetensors' weights, copytree carrying both).
    Every file and directory of a built bundle gets the modes of a file the user makes under the umask."""
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    b = bundle(bundled_workspace, "fp8-static")
    source = bundled_workspace / "artifacts/quantized/fp8-static/model.safetensors"
    assert stat.S_IMODE(source.stat().st_mode) == 0o600  # as safetensors wrote it: what the bundle must not keep
    for path in [b, *b.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        expected = 0o777 & ~mask if path.is_dir() or mode & 0o111 else 0o666 & ~mask
        assert mode == expected, (path.relative_to(b), oct(mode))


def test_serve_yaml_is_a_vllm_config_file_matching_engine_args(bundled_workspace):
    b = bundle(bundled_workspace, "fp8-static")
    serve = yaml.safe_load((b / "serve.yaml").read_text())
    args = json.loads((b / "engine_args.json").read_text())
    params = yaml.safe_load((bundled_workspace / "params.yaml").read_text())
    k = speculative_estimate().num_speculative_tokens
    assert 1 <= k <= len(PER_POSITION)
    # vLLM's --config takes CLI option names; a nested mapping becomes that option's JSON value.
    assert serve == {key.replace("_", "-"): v for key, v in args.items()}
    assert serve["model"] == "./model"
    assert serve["served-model-name"] == params["serving"]["name"]
    assert serve["max-model-len"] == params["serving"]["max_model_len"]
    assert serve["gpu-memory-utilization"] == params["serving"]["gpu_memory_utilization"]
    assert serve["quantization"] == "compressed-tensors"
    assert serve["kv-cache-dtype"] == "fp8"
    assert serve["speculative-config"] == {"method": "draft_model", "model": "./draft", "num_speculative_tokens": k}


def test_kv_cache_dtype_only_for_calibrated_kv_scales(bundled_workspace):
    serve = yaml.safe_load((bundle(bundled_workspace, "fp8-dynamic") / "serve.yaml").read_text())
    assert "kv-cache-dtype" not in serve
    assert serve["speculative-config"]["model"] == "./draft"


def test_model_card_is_a_runbook(bundled_workspace):
    card = (bundle(bundled_workspace, "fp8-static") / "README.md").read_text()
    spec = speculative_estimate()
    assert "vllm serve --config serve.yaml" in card and "engine_args.json" in card
    assert "modelprep verify" in card and "sha256sum --check" in card
    assert f"**Shipped: the domain-tuned draft model with `num_speculative_tokens: {spec.num_speculative_tokens}`.**" in card
    assert " / ".join(f"{a:.2f}" for a in spec.accepted_per_position) in card
    assert f"x{spec.expected_speedup:.2f}" in card
    assert "not measured in this build (no CUDA device)" in card
    for item in ("Domain benchmark", "Latency thresholds", "Cold start", "Acceptance monitoring", "Rollback"):
        assert f"- [ ] {item}" in card
    for metric in SPEC_METRICS:
        assert f"`{metric}_total`" in card
    # The alert level follows this bundle's estimate of vLLM's accepted/draft ratio, E[accepted]/k.
    assert f"expected {spec.expected_accepted_tokens / spec.num_speculative_tokens:.2f}" in card
    for check in ("max_kl_divergence", "min_top1_agreement", "min_accepted_per_draft_token"):
        assert f"| {check} |" in card
    assert "WARNING" not in card


def render_card(variant: str, gpu: VllmMeasurement, serve: ServeBenchRecord, quant: dict | None = None) -> str:
    """The card of params.yaml's `variant` from these GPU records (and quantize metrics), with passing numbers for
    the rest."""
    spec = speculative_estimate()
    return model_card(variant, parse_variant(variant, tiny_params()["quantize"]["variants"][variant]),
                      eval_summary({"perplexity_baseline": 1.0, "perplexity": 1.0, "perplexity_increase_pct": 0.0,
                                    "kl_divergence": 0.0, "top1_agreement": 1.0, "greedy_match": 1.0}), spec,
                      VariantVerdict(passed=True, allowed_failure=False, speculation=SpeculationDecision(
                          spec.num_speculative_tokens, spec.num_speculative_tokens, "estimated", 2.0, None, "test")),
                      quant or {"size_before_mb": 2, "size_after_mb": 1, "compression_ratio": 2}, tiny_serving(name="svc"), gpu,
                      serve)


MEASURED_GPU = {"measured_speedup_bs1": 1.734, "accepted_per_draft_token": 0.81, "accepted_per_position": [0.9, 0.75],
                "spec_output_matches_baseline": True, "vllm_metrics": {"num_drafts": 10}}


def test_card_shows_measured_gpu_numbers():
    card = render_card("fp8-static", VllmMeasurement.from_measure(MEASURED_GPU),
                       ServeBenchRecord("fp8-static", skipped="no CUDA device"))
    assert "- speculative speedup at bs1: x1.73" in card and "- accepted per draft token: 0.810" in card
    assert "per position 0.90 / 0.75" in card and "num_drafts" not in card.split("## 4.")[1].split("## 5.")[0]
    assert "not measured" not in card


@pytest.mark.parametrize("ran", ["nowhere", "offline engine", "served"])
def test_card_names_the_hopper_kernel_and_whether_a_gpu_ran_it(ran):
    """NVFP4A16's hardware line: the kernel vLLM 0.26 picks on Hopper, read from its source, and plainly whether
    this build ran the variant on a GPU at all."""
    no_gpu = VllmMeasurement(skipped="no CUDA device")
    gpu, serve = {"nowhere": (no_gpu, ServeBenchRecord("nvfp4a16", skipped="no CUDA device")),
                  "offline engine": (VllmMeasurement.from_measure(MEASURED_GPU),
                                     ServeBenchRecord("nvfp4a16", skipped="no CUDA device")),
                  "served": (no_gpu, ServeBenchRecord("nvfp4a16", gpu="NVIDIA H100 80GB HBM3", vllm_version="0.25.0",
                                                      date="2026-01-01", load_generator="vllm bench serve",
                                                      max_tokens=64, temperature=0.0))}[ran]
    card = render_card("nvfp4a16", gpu, serve)
    hardware = card[card.index("Hardware:"):card.index("Paths in `serve.yaml`")]
    line = hardware.splitlines()[0]
    assert line.startswith("Hardware: compute capability 7.5+ (NVFP4 weight-only: vLLM's FP4 Marlin kernel (W4A16) on "
                           "every GPU from 7.5, Hopper (9.0) and Blackwell included, never FP4 tensor cores")
    assert "h100" in line and "t4" in line
    assert "come from vLLM 0.26.0's source" in hardware and "not from a GPU run" in hardware
    assert {"nowhere": "this build ran the variant on no GPU.",
            "offline engine": "this build ran the variant on a GPU with vLLM's offline engine (section 4).",
            "served": "this build served the variant on NVIDIA H100 80GB HBM3 (section 5)."}[ran] in hardware


def test_eval_json_keeps_estimates_apart_from_what_ships(bundled_workspace):
    """Issue #29: EVAL.json said "n-gram k=8 x1.46" at its top level while the bundle shipped no speculation.
    The shipped setting is the gate's; the methods' estimates sit under speculation_estimates, marked as such."""
    from pipeline.release.publish import eval_record, summary_of

    b = bundle(bundled_workspace, "fp8-static")
    ev, gate = json.loads((b / "EVAL.json").read_text()), json.loads((b / "GATE.json").read_text())
    k = gate["speculation"]["num_speculative_tokens"]
    assert k and ev["speculation_shipped"] == {"method": "draft_model", "num_speculative_tokens": k,
                                               "basis": "estimated", "speedup": gate["speculation"]["speedup"],
                                               "reason": gate["speculation"]["reason"]}
    assert not {"estimated_num_speculative_tokens", "estimated_speedup", "estimated_method", "cost_profile"} & set(ev)
    assert ev["speculation_estimates"]["estimated_num_speculative_tokens"] == k and "do not say what ships" in \
        ev["speculation_estimates"]["note"]
    summary = EvalSummary.load(bundled_workspace / "artifacts/eval/fp8-static/summary.json")
    assert ev["top1_agreement"] == summary.quality.top1_agreement
    assert summary_of(ev, "EVAL.json") == summary  # publish reads the summary the bundle was built from

    # The case: n-gram was estimated at x1.46 with k=8, and a speculation check turned it off.
    summary = eval_summary({"variant": "bf16", "perplexity": 20.5, "top1_agreement": 1.0, "estimated_method": "ngram",
                            "estimated_num_speculative_tokens": 8, "estimated_speedup": 1.46,
                            "accepted_per_draft_token": 0.398,
                            "methods": [{"method": "ngram", "num_speculative_tokens": 8, "estimated_speedup": 1.46}],
                            "lm_eval_domain_heldout_acc": 0.1})
    off = SpeculationDecision(0, 8, "estimated", 1.46, 1, "x1.46 ...; not shipped: min_accepted_per_draft_token",
                              method="ngram", turned_off_by=["min_accepted_per_draft_token"])
    record = eval_record(summary, VariantVerdict(passed=True, allowed_failure=False, speculation=off))
    assert record["speculation_shipped"] == {"method": None, "num_speculative_tokens": 0, "basis": "estimated",
                                             "speedup": None, "reason": off.reason}
    quality = [f.name for f in dataclasses.fields(Quality)]
    assert list(record) == ["variant", *quality, "lm_eval_domain_heldout_acc", "speculation_shipped",
                            "speculation_estimates"]
    estimates = record["speculation_estimates"]
    assert not {"variant", "lm_eval_domain_heldout_acc", *quality} & set(estimates)
    assert (estimates["estimated_num_speculative_tokens"], estimates["methods"][0]["estimated_speedup"]) == (8, 1.46)
    assert summary_of(record, "EVAL.json") == summary
    with pytest.raises(PipelineError, match="^old/EVAL.json: no speculation_estimates object; rebuild the bundle"):
        summary_of(summary.to_metrics(), "old/EVAL.json")  # a bundle from before the estimates moved


def test_bf16_card_does_not_call_its_model_quantized():
    card = render_card("bf16", VllmMeasurement(skipped="no CUDA device"), ServeBenchRecord("bf16", skipped="no CUDA device"))
    assert "| `model/` | the target, unquantized (this build's baseline): safetensors" in card
    assert "| `model/` | quantized target" not in card and " quantized target" not in card
    assert "| `model/` | quantized target: " in render_card("fp8-static", VllmMeasurement(skipped="no CUDA device"),
                                                           ServeBenchRecord("fp8-static", skipped="no CUDA device"))


def test_card_states_the_group_size_configured_and_used():
    no_gpu, not_served = VllmMeasurement(skipped="no CUDA device"), ServeBenchRecord("gptq-w4a16", skipped="no CUDA device")
    why = "group size 128 does not divide the input width 576 of layer model.layers.0.self_attn.q_proj; 64 is ..."
    quant = {"size_before_mb": 269.1, "size_after_mb": 86.3, "compression_ratio": 3.1, "group_size": 64,
             "group_size_configured": 128, "group_size_reason": [why]}
    card = render_card("gptq-w4a16", no_gpu, not_served, quant)
    assert f"(x3.1). Weight group size 64, not the configured 128: {why}." in card
    card = render_card("gptq-w4a16", no_gpu, not_served, {**quant, "group_size": 128, "group_size_reason": []})
    assert "(x3.1). Weight group size 128." in card and "configured" not in card.split("## 1.")[0]
    card = render_card("gptq-w4a16", no_gpu, not_served, {**quant, "group_size": -1, "group_size_reason": ["no ..."]})
    assert "Weight group size channel-wise (one scale per output channel), not the configured 128: no ...." in card


def test_allowed_failure_is_flagged_in_the_card(bundled_workspace):
    card = (bundle(bundled_workspace, "awq-w4a16") / "README.md").read_text()
    assert "WARNING: this variant failed its release gates" in card
    assert "| max_kl_divergence | 0.2000 | <= 0.05 | FAIL |" in card
    assert "Failed: max_kl_divergence (kl_divergence=0.2, needs <= 0.05 (over by 0.15))" in card


def test_failed_variant_is_not_bundled(bundled_workspace):
    line = one_error_line(run_stage(bundled_workspace, "stages.bundle", "gptq-w4a16"))
    assert "gptq-w4a16 failed its gates" in line
    assert not bundle(bundled_workspace, "gptq-w4a16").exists()


def test_engine_args_without_draft_or_quantization():
    args = engine_args(parse_variant("v", {"algorithm": "rtn", "scheme": "FP8"}),
                       tiny_serving(name="svc", max_model_len=512, gpu_memory_utilization=0.5, max_num_seqs=4,
                                    tensor_parallel_size=1), None)
    assert "speculative_config" not in args and "quantization" not in args and "kv_cache_dtype" not in args
    assert args["tensor_parallel_size"] == 1  # written unsharded too: the file says how many GPUs it needs


def _flip_byte(b):
    path = b / "model/model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return "model/model.safetensors"


def _delete(b):
    (b / "draft/config.json").unlink()
    return "draft/config.json"


def _add(b):
    (b / "model/extra.bin").write_bytes(b"\0")
    return "model/extra.bin"


@pytest.mark.parametrize("tamper", [_flip_byte, _delete, _add], ids=["byte-flipped", "deleted", "added"])
def test_verify_fails_on_any_change(bundled_workspace, tmp_path, tamper):
    b = shutil.copytree(bundle(bundled_workspace, "fp8-dynamic"), tmp_path / "b")
    assert verify_cli(b).returncode == 0
    name = tamper(b)
    assert name in one_error_line(verify_cli(b))


def test_verify_rejects_a_directory_without_manifest(tmp_path):
    assert "no MANIFEST.json" in one_error_line(verify_cli(tmp_path))


def test_vllm_parses_serve_yaml(bundled_workspace, monkeypatch):
    """With vLLM installed: `vllm serve --config serve.yaml` resolves to the engine_args.json settings."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    b = bundle(bundled_workspace, "fp8-static")
    monkeypatch.chdir(b)
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    ns = parser.parse_args(["serve", "--config", "serve.yaml"])
    parsed = EngineArgs.from_cli_args(ns)
    args = json.loads((b / "engine_args.json").read_text())
    assert parsed.model == args["model"] and parsed.kv_cache_dtype == "fp8"
    assert parsed.speculative_config == args["speculative_config"]
