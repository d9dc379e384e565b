"""The handoff kit in every bundle, checked by real validators: Kubernetes manifests against the API schemas
(kubernetes-validate), Prometheus rules with promtool (check and unit tests, the PromQL of the dashboard too),
the dashboard through grafana-foundation-sdk's Grafana models, and the warm-up script against a live server."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from bundle_helpers import one_error_line, run_stage, run_stage_in_process, stage_workspace
from conftest import ROOT, tiny_params
from pipeline import records
from pipeline.config import validate
from pipeline.errors import PipelineError
from pipeline.monitoring import ITL, TTFT, bucket_bound
from pipeline.serve_records import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult

V = "fp8-dynamic"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (setup.sh installs Debian's "
                                                                "prometheus package where it runs as root, as in CI)")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, demo_pair):
    ws = stage_workspace(tmp_path_factory.mktemp("handoff"), demo_pair, {V: {}})
    r = run_stage(ws, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    return ws


def bundle(ws):
    return ws / "artifacts/bundles" / V


def test_every_tier_has_a_config_and_a_valid_kubernetes_manifest(workspace):
    import kubernetes_validate

    b = bundle(workspace)
    for tier in ("default", "latency", "throughput"):
        docs = list(yaml.safe_load_all((b / "deploy" / f"{tier}.yaml").read_text()))
        assert [d["kind"] for d in docs] == ["Deployment", "Service"]
        for doc in docs:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        pod = docs[0]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        serve_file = "serve.yaml" if tier == "default" else f"serve-{tier}.yaml"
        assert container["args"][:2] == ["--config", serve_file] and (b / serve_file).is_file()
        assert container["workingDir"] == f"/models/nimbus-support-{V}"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {v["name"] for v in pod["volumes"]} == {"models", "shm"}
        assert "warmup.py" in " ".join(container["lifecycle"]["postStart"]["exec"]["command"])
        # no engine start was measured (no GPU): the startup probe gets deploy.startup_seconds_default
        probe = container["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] == tiny_params()["deploy"]["startup_seconds_default"]
    # the throughput tier's own settings, and no draft at a concurrency where speculation is predicted not to pay
    throughput = yaml.safe_load((b / "serve-throughput.yaml").read_text())
    assert throughput["max-num-seqs"] == 256 and throughput["enable-chunked-prefill"] is True
    assert "speculative-config" not in throughput
    latency = yaml.safe_load((b / "serve-latency.yaml").read_text())
    assert "speculative-config" in yaml.safe_load((b / "serve.yaml").read_text())  # one request at a time: predicted
    assert "speculative-config" not in latency  # 16 at once: a lockstep prediction does not hold there
    card = (b / "README.md").read_text()
    assert ("| throughput | `serve-throughput.yaml` | 64 | 1 | none | not measured on a GPU; this tier serves up to "
            "256 requests at concurrency 64") in card


@needs_promtool
def test_prometheus_rules_check_and_their_unit_tests_pass(workspace):
    mon = bundle(workspace) / "monitoring"
    r = subprocess.run([PROMTOOL, "check", "rules", "rules.yaml"], cwd=mon, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", "rules.test.yaml"], cwd=mon, capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    rules = yaml.safe_load((mon / "rules.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    summary = records.read_object(workspace / f"artifacts/eval/{V}/summary.json")
    warn_at = summary["accepted_per_draft_token"] * tiny_params()["monitoring"]["acceptance_warning_fraction"]
    assert alerts["SpeculativeAcceptanceLow"]["expr"].endswith(f"< {warn_at:.4g}")
    # no serving benchmark: the latency alerts fall back to the latency gates' thresholds
    itl = bucket_bound(ITL, tiny_params()["gates"]["thresholds"]["max_p99_itl_ms"] / 1000)
    assert alerts["VllmInterTokenLatencyP99High"]["expr"].endswith(f"> {itl:.4g}")


@needs_promtool
def test_dashboard_is_grafana_json_with_valid_promql(workspace, tmp_path):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads((bundle(workspace) / "monitoring/dashboard.json").read_text())
    # a round trip through the SDK's Dashboard model (generated from Grafana's schema) loses nothing
    assert json.loads(json.dumps(Dashboard.from_json(raw), cls=JSONEncoder)) == raw
    exprs = [t["expr"] for p in raw["panels"] for t in p["targets"]]
    assert exprs and all("model_name=\"nimbus-support\"" in e for e in exprs)
    check = tmp_path / "exprs.yaml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(check)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def measured(startup_s: float, concurrencies=(1, 64)) -> ServeBenchRecord:
    def lvl(c, tok_s, ttft, itl):
        lat = lambda p99: {"mean": p99 / 2, "p50": p99 / 2, "p90": p99 * 0.8, "p99": p99}  # noqa: E731
        return LoadLevel(c, 32, 32, 0, 2.0, 8.0, tok_s, lat(ttft), lat(itl), lat(itl), lat(ttft + 50),
                         accepted_per_draft_token=0.8)
    return ServeBenchRecord(V, gpu="NVIDIA H100 80GB HBM3", vllm_version="0.25.0", date="2026-11-24", configs={
        PLAIN: ServeConfigResult(0, startup_s, {f"c{c}": lvl(c, 100.0 * c, 20.0, 5.0) for c in concurrencies}),
        "draft_model": ServeConfigResult(4, startup_s + 5, {f"c{c}": lvl(c, (200.0 if c == 1 else 90.0) * c, 30.0, 8.0)
                                                          for c in concurrencies})})


def test_measured_numbers_size_the_probes_the_alerts_and_the_tiers(workspace, tmp_path):
    """With a serving benchmark: the startup probe is the measured start x margin, the latency alerts are the
    measured p99 x margin, and the throughput tier takes the decision measured at its own concurrency."""
    from pipeline import gates
    from pipeline.serving_config import checkpoint_quantization, engine_args, serve_yaml
    from pipeline.config import enabled_variant
    from pipeline.methods import Speculation, speculative_config

    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws, ignore=shutil.ignore_patterns("bundles"))
    p = yaml.safe_load((ws / "params.yaml").read_text())
    record = measured(startup_s=50.0)
    serve_dir = ws / "artifacts/serve" / V
    records.write(serve_dir / "record.json", record)
    spec, model = enabled_variant(p, V), ws / "artifacts/quantized" / V
    for name, k in ((PLAIN, 0), ("draft_model", 4)):  # the configs serve_bench would have written
        config = speculative_config(Speculation(name if k else None, k))
        (serve_dir / f"serve-{name}.yaml").write_text(serve_yaml(engine_args(spec, p["serving"], config,
                                                                             checkpoint_quantization(model))))
    summary = records.read_object(ws / f"artifacts/eval/{V}/summary.json")
    records.write(ws / "artifacts/gate/verdict.json", gates.run(p, {V: summary}, serve_by_variant={V: record}))
    r = run_stage(ws, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = ws / "artifacts/bundles" / V
    deployment = next(yaml.safe_load_all((b / "deploy/default.yaml").read_text()))
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= (50.0 + 5) * p["deploy"]["startup_margin"]
    rules = yaml.safe_load((b / "monitoring/rules.yaml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    margin = p["monitoring"]["latency_margin"]
    # the shipped (speculative) config's p99 x margin, raised to the next bound of vLLM's histogram buckets
    itl_bound, ttft_bound = bucket_bound(ITL, 8.0 * margin / 1000), bucket_bound(TTFT, 30.0 * margin / 1000)
    assert 8.0 * margin / 1000 <= itl_bound and alerts["VllmInterTokenLatencyP99High"].endswith(f"> {itl_bound:.4g}")
    assert alerts["VllmTimeToFirstTokenP99High"].endswith(f"> {ttft_bound:.4g}")
    assert alerts["VllmQueueTimeP99High"].endswith("> 0.3")  # never inside the queue histogram's first bucket
    assert "speculative-config" not in yaml.safe_load((b / "serve-throughput.yaml").read_text())  # x0.9 at 64
    card = (b / "README.md").read_text()
    assert "measured x0.90" in card
    # the default tier is the serving section the default sweep served: its row shows what ships, as served at c=1
    default_row = next(line for line in card.splitlines() if line.startswith("| default | `serve.yaml`"))
    assert "| draft_model k=4 |" in default_row and "| 200 |" in default_row, default_row
    latency_row = next(line for line in card.splitlines() if line.startswith("| latency |"))
    assert "not benchmarked" in latency_row  # other engine settings: the default sweep does not stand for it


def test_a_benchmarked_tier_ships_what_paid_at_its_own_settings(workspace, tmp_path, capfd):
    """serve_bench.tiers: the throughput tier was served at its own engine settings (max_num_seqs 256, chunked
    prefill) and there the draft paid at concurrency 64, although the default config's sweep says x0.90 there:
    the tier's own measurement decides, its serve-throughput.yaml must be byte for byte the one measured, and the
    card shows the tier's served tokens/s. A stale measured file is refused. (The bundle stage's main runs in this
    process, twice: the workspace fixture runs it as DVC does.)"""
    from pipeline import gates
    from pipeline.config import enabled_variant
    from pipeline.methods import Speculation, speculative_config
    from pipeline.serving_config import checkpoint_quantization, engine_args, serve_yaml
    from pipeline.tiers import parse_tiers

    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws, ignore=shutil.ignore_patterns("bundles"))
    p = yaml.safe_load((ws / "params.yaml").read_text())
    base = measured(startup_s=50.0)
    tier_levels = measured(startup_s=40.0, concurrencies=(64,)).configs
    tier_levels["draft_model"].levels["c64"].output_throughput = 150.0 * 64  # x1.5 at the tier's own settings
    record = ServeBenchRecord(**{**base.__dict__, "tiers": {"throughput": tier_levels}})
    serve_dir = ws / "artifacts/serve" / V
    records.write(serve_dir / "record.json", record)
    spec, quantization = enabled_variant(p, V), checkpoint_quantization(ws / "artifacts/quantized" / V)
    throughput = next(t for t in parse_tiers(p["serving"]) if t.name == "throughput")

    def render(name, k, tier=None):
        return serve_yaml(engine_args(spec, p["serving"], speculative_config(Speculation(name if k else None, k)),
                                      quantization, tier.engine if tier else None))
    for name, k in ((PLAIN, 0), ("draft_model", 4)):  # what serve_bench would have written
        (serve_dir / f"serve-{name}.yaml").write_text(render(name, k))
        (serve_dir / "tiers/throughput").mkdir(parents=True, exist_ok=True)
        (serve_dir / f"tiers/throughput/serve-{name}.yaml").write_text(render(name, k, throughput))
    summary = records.read_object(ws / f"artifacts/eval/{V}/summary.json")
    records.write(ws / "artifacts/gate/verdict.json", gates.run(p, {V: summary}, serve_by_variant={V: record}))
    r = run_stage_in_process(ws, capfd, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = ws / "artifacts/bundles" / V
    shipped = yaml.safe_load((b / "serve-throughput.yaml").read_text())
    assert shipped["speculative-config"]["method"] == "draft_model" and shipped["max-num-seqs"] == 256
    card = (b / "README.md").read_text()
    assert "this tier's own settings" in card and "| 9600 |" in card  # 150 tok/s x 64, as served

    (serve_dir / "tiers/throughput/serve-draft_model.yaml").write_text(render("draft_model", 3, throughput))
    shutil.rmtree(b)
    assert "differs from" in one_error_line(run_stage_in_process(ws, capfd, "stages.bundle", V))
    assert not b.exists()


def test_warmup_script_warms_a_live_server_and_marks_readiness(workspace, demo_pair, tmp_path):
    """deploy/warmup.py as the bundle ships it, against an OpenAI-compatible server on this machine."""
    from pipeline.vllm_server import serve

    b = bundle(workspace)
    config = tmp_path / "serve.yaml"
    server_cmd = [sys.executable, str(ROOT / "benchmarks/cpu/openai_cpu_server.py")]
    for fail_every, ok in ((0, True), (1, False)):
        config.write_text(json.dumps({"model": str(demo_pair[0]),
                                      "served-model-name": "nimbus-support", "fail-every": fail_every}))
        marker = tmp_path / f"warm-{fail_every}"
        with serve(config, tmp_path, tmp_path / "server.log", 120, None, command=server_cmd) as server:
            r = subprocess.run([sys.executable, str(b / "deploy/warmup.py"), "--prompts",
                                str(b / "deploy/warmup_prompts.jsonl"), "--model", "nimbus-support", "--port",
                                str(server.port), "--marker", str(marker), "--max-tokens", "4"],
                               capture_output=True, text=True, timeout=300)
        assert (r.returncode == 0) == ok and marker.exists() == ok, r.stdout + r.stderr
    prompts = (b / "deploy/warmup_prompts.jsonl").read_text().splitlines()
    assert json.loads((tmp_path / "warm-0").read_text())["prompts"] == len(prompts) > 0


@pytest.mark.parametrize("edit, message", [
    (lambda p: p["deploy"].update(tiers=["default", "latnecy"]), "deploy.tiers names unknown tiers.*latnecy"),
    (lambda p: p["serving"]["tiers"].update(tp4={"tensor_parallel_size": 4, "gpus": 2}),
     "serving.tiers.tp4: tensor_parallel_size 4 exceeds the 2 GPUs"),
    (lambda p: p["deploy"].pop("image"), "deploy.image must name a container image"),
    (lambda p: p["serving"]["tiers"].update(fast={"max_num_seq": 8}), r"serving.tiers.fast: unknown settings \['max_num_seq'\]"),
    (lambda p: p["deploy"].update(namespace="Prod_NS"), "deploy.namespace must be a Kubernetes name"),
    (lambda p: p["monitoring"].update(kv_cache_usage_max=90), "monitoring.kv_cache_usage_max"),
    (lambda p: p["serve_bench"].update(tiers=["throughput", "default"]), r"serve_bench.tiers names unknown tiers \['default'\]"),
])
def test_bad_handoff_params_are_one_line(edit, message, tmp_path):
    p = tiny_params()
    edit(p)
    with pytest.raises(PipelineError, match=message) as err:
        validate(p, tmp_path / "params.yaml")
    assert "\n" not in str(err.value)


def test_bundle_stage_refuses_a_bad_tier_before_writing(workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(workspace, ws, ignore=shutil.ignore_patterns("bundles"))
    p = yaml.safe_load((ws / "params.yaml").read_text())
    p["deploy"]["tiers"] = ["throughput", "gpu8"]
    (ws / "params.yaml").write_text(yaml.safe_dump(p))
    assert "deploy.tiers names unknown tiers ['gpu8']" in one_error_line(run_stage(ws, "stages.bundle", V))
    assert not (ws / "artifacts/bundles" / V).exists()


def test_server_secrets_reach_the_pod_from_a_kubernetes_secret_never_from_the_bundle(tmp_path, demo_pair):
    """VLLM_API_KEY in serving.env would ship in clear in serve.env and the manifests (0644): refused up front;
    serving.secret_env names the Secret, and every tier's Deployment reads it through secretKeyRef."""
    import kubernetes_validate

    p = tiny_params()
    p["serving"]["env"] = {"VLLM_API_KEY": "sk-live-123"}
    with pytest.raises(PipelineError, match="serving.env.VLLM_API_KEY looks like a secret"):
        validate(p, tmp_path / "params.yaml")
    (tmp_path / "ws").mkdir()
    ws = stage_workspace(tmp_path / "ws", demo_pair, {V: {}},
                         serving={"secret_env": {"VLLM_API_KEY": "vllm-auth/api-key", "HF_TOKEN": "hf-cred/token"}})
    r = run_stage(ws, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = bundle(ws)
    for tier in ("default", "latency", "throughput"):
        deployment = next(yaml.safe_load_all((b / "deploy" / f"{tier}.yaml").read_text()))
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["VLLM_API_KEY"] == {"name": "VLLM_API_KEY",
                                       "valueFrom": {"secretKeyRef": {"name": "vllm-auth", "key": "api-key"}}}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-cred", "key": "token"}
    assert "VLLM_API_KEY" not in ((b / "serve.env").read_text() if (b / "serve.env").exists() else "")
    p["serving"]["env"] = {}
    p["serving"]["secret_env"] = {"VLLM_API_KEY": "sk-live-123"}  # a value, not a reference
    with pytest.raises(PipelineError, match="serving.secret_env must map"):
        validate(p, tmp_path / "params.yaml")
