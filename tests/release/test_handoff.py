"""The handoff kit in every bundle, checked by real validators: Kubernetes manifests against the API schemas
(kubernetes-validate), Prometheus rules with promtool (check and unit tests, the PromQL of the dashboard too),
the dashboard through grafana-foundation-sdk's Grafana models, and the warm-up script against a live server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bundle_helpers import (
    BundleSpec,
    bundle_workspace,
    one_error_line,
    run_stage,
    run_stage_in_process,
    stage_workspace,
)
from latency_model import H100_RUN, Server, lat, search, swept
from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.evaluate.summary import EvalSummary
from pipeline.release.monitoring import ITL, TTFT, bucket_bound
from pipeline.rules import validate
from pipeline.serving.bench_record import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult
from tiny_project import ROOT, serving_of, tiny_params, tiny_serving

V = "fp8-dynamic"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (setup.sh installs Debian's prometheus package where it runs as root, as in CI)",
)


@pytest.fixture(scope="module")
def bundle_spec():
    return BundleSpec({V: {}})


def bundle(ws):
    return ws / "artifacts/bundles" / V


def unbundled_copy(ws: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the workspace without its bundles, to change and bundle again, and its params."""
    copy = tmp_path / "ws"
    shutil.copytree(ws, copy, ignore=shutil.ignore_patterns("bundles"))
    return copy, yaml.safe_load((copy / "params.yaml").read_text())


def served_yaml(ws: Path, p: dict, name: str, k: int, tier=None) -> str:
    """The serve-<name>.yaml serve_bench writes for V's config `name` with k draft tokens (at a tier's engine)."""
    from pipeline.drafts.methods import Speculation, speculative_config
    from pipeline.quantize.recipes import enabled_variant
    from pipeline.serving.config import checkpoint_quantization, engine_args, serve_yaml

    config = speculative_config(Speculation(name if k else None, k))
    return serve_yaml(
        engine_args(
            enabled_variant(p, V),
            serving_of(p),
            config,
            checkpoint_quantization(ws / "artifacts/quantized" / V),
            tier.engine if tier else None,
        )
    )


def gate_on(ws: Path, p: dict, record: ServeBenchRecord) -> None:
    """The gate's verdict on V's evaluation and this serving record, where the gate stage writes it."""
    from eval_helpers import gate_report

    summary = EvalSummary.load(ws / f"artifacts/eval/{V}/summary.json")
    records.write(ws / "artifacts/gate/verdict.json", gate_report(p, {V: summary}, serve_by_variant={V: record}))


def test_every_tier_has_a_config_and_a_valid_kubernetes_manifest(bundled_workspace):
    import kubernetes_validate

    b = bundle(bundled_workspace)
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
    assert (
        "| throughput | `serve-throughput.yaml` | 64 | 1 | none | not measured on a GPU; this tier serves up to "
        "256 requests at concurrency 64"
    ) in card


@needs_promtool
def test_prometheus_rules_check_and_their_unit_tests_pass(bundled_workspace):
    mon = bundle(bundled_workspace) / "monitoring"
    r = subprocess.run([PROMTOOL, "check", "rules", "rules.yaml"], cwd=mon, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", "rules.test.yaml"], cwd=mon, capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    rules = yaml.safe_load((mon / "rules.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    summary = EvalSummary.load(bundled_workspace / f"artifacts/eval/{V}/summary.json")
    warn_at = summary.speculation.accepted_per_draft_token * tiny_params()["monitoring"]["acceptance_warning_fraction"]
    assert alerts["SpeculativeAcceptanceLow"]["expr"].endswith(f"< {warn_at:.4g}")
    # no serving benchmark: the latency alerts fall back to the latency gates' thresholds
    itl = bucket_bound(ITL, tiny_params()["gates"]["thresholds"]["max_p99_itl_ms"] / 1000)
    assert alerts["VllmInterTokenLatencyP99High"]["expr"].endswith(f"> {itl:.4g}")


@needs_promtool
def test_dashboard_is_grafana_json_with_valid_promql(bundled_workspace, tmp_path):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads((bundle(bundled_workspace) / "monitoring/dashboard.json").read_text())
    # a round trip through the SDK's Dashboard model (generated from Grafana's schema) loses nothing
    assert json.loads(json.dumps(Dashboard.from_json(raw), cls=JSONEncoder)) == raw
    exprs = [t["expr"] for p in raw["panels"] for t in p["targets"]]
    assert exprs and all(f'model_name="nimbus-support-{V}"' in e for e in exprs)  # the variant's served name
    check = tmp_path / "exprs.yaml"
    check.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "dashboard",
                        "rules": [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)],
                    }
                ]
            }
        )
    )
    r = subprocess.run([PROMTOOL, "check", "rules", str(check)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def measured(startup_s: float, concurrencies=(1, 64)) -> ServeBenchRecord:
    def lvl(c, tok_s, ttft, itl):
        return LoadLevel(
            c, 32, 32, 0, 2.0, 8.0, tok_s, lat(ttft), lat(itl), lat(itl), lat(ttft + 50), accepted_per_draft_token=0.8
        )

    return ServeBenchRecord(
        V,
        gpu="NVIDIA H100 80GB HBM3",
        vllm_version="0.25.0",
        date="2026-11-24",
        configs={
            PLAIN: ServeConfigResult(0, startup_s, {f"c{c}": lvl(c, 100.0 * c, 20.0, 5.0) for c in concurrencies}),
            "draft_model": ServeConfigResult(
                4, startup_s + 5, {f"c{c}": lvl(c, (200.0 if c == 1 else 90.0) * c, 30.0, 8.0) for c in concurrencies}
            ),
        },
    )


def test_measured_numbers_size_the_probes_the_alerts_and_the_tiers(bundled_workspace, tmp_path):
    """With a serving benchmark: the startup probe is the measured start x margin, the latency alerts are the
    measured p99 x margin, and the throughput tier takes the decision measured at its own concurrency."""
    ws, p = unbundled_copy(bundled_workspace, tmp_path)
    record = measured(startup_s=50.0)
    serve_dir = ws / "artifacts/serve" / V
    records.write(serve_dir / "record.json", record)
    for name, k in ((PLAIN, 0), ("draft_model", 4)):  # the configs serve_bench would have written
        (serve_dir / f"serve-{name}.yaml").write_text(served_yaml(ws, p, name, k))
    gate_on(ws, p, record)
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


def test_a_benchmarked_tier_ships_what_paid_at_its_own_settings(bundled_workspace, tmp_path, capfd):
    """serve_bench.tiers: the throughput tier was served at its own engine settings (max_num_seqs 256, chunked
    prefill) and there the draft paid at concurrency 64, although the default config's sweep says x0.90 there:
    the tier's own measurement decides, its serve-throughput.yaml must be byte for byte the one measured, and the
    card shows the tier's served tokens/s. A stale measured file is refused. (The bundle stage's main runs in this
    process, twice: the bundled_workspace fixture runs it as DVC does.)"""
    from pipeline.serving.tiers import parse_tiers

    ws, p = unbundled_copy(bundled_workspace, tmp_path)
    base = measured(startup_s=50.0)
    tier_levels = measured(startup_s=40.0, concurrencies=(64,)).configs
    tier_levels["draft_model"].levels["c64"].output_throughput = 150.0 * 64  # x1.5 at the tier's own settings
    record = ServeBenchRecord(**{**base.__dict__, "tiers": {"throughput": tier_levels}})
    serve_dir = ws / "artifacts/serve" / V
    records.write(serve_dir / "record.json", record)
    throughput = next(t for t in parse_tiers(serving_of(p)) if t.name == "throughput")
    for name, k in ((PLAIN, 0), ("draft_model", 4)):  # what serve_bench would have written
        (serve_dir / f"serve-{name}.yaml").write_text(served_yaml(ws, p, name, k))
        (serve_dir / "tiers/throughput").mkdir(parents=True, exist_ok=True)
        (serve_dir / f"tiers/throughput/serve-{name}.yaml").write_text(served_yaml(ws, p, name, k, throughput))
    gate_on(ws, p, record)
    r = run_stage_in_process(ws, capfd, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = ws / "artifacts/bundles" / V
    shipped = yaml.safe_load((b / "serve-throughput.yaml").read_text())
    assert shipped["speculative-config"]["method"] == "draft_model" and shipped["max-num-seqs"] == 256
    card = (b / "README.md").read_text()
    assert "this tier's own settings" in card and "| 9600 |" in card  # 150 tok/s x 64, as served

    (serve_dir / "tiers/throughput/serve-draft_model.yaml").write_text(served_yaml(ws, p, "draft_model", 3, throughput))
    shutil.rmtree(b)
    assert "differs from" in one_error_line(run_stage_in_process(ws, capfd, "stages.bundle", V))
    assert not b.exists()


def test_without_a_measured_capacity_the_tiers_keep_their_size_and_no_autoscaler_ships(bundled_workspace):
    """The CPU case: no serving benchmark, so no capacity; the card says why, the autoscaled tier keeps its
    configured max-num-seqs and its manifest has no HorizontalPodAutoscaler."""
    b = bundle(bundled_workspace)
    card = (b / "README.md").read_text()
    assert (
        "Not measured in this build (no CUDA device): no users per GPU, `min_capacity_vs_bf16` was skipped, "
        "and the tiers of\n`deploy.autoscale.tiers` ship their configured max-num-seqs without an "
        "autoscaler."
    ) in card
    row = next(line for line in card.splitlines() if line.startswith("| throughput |"))
    assert row.endswith("| capacity not measured (no CUDA device): max-num-seqs as configured, no autoscaler |")
    # this workspace's verdict was reached without the serving records (bundle_helpers): skipped, with why
    assert (
        next(line for line in card.splitlines() if line.startswith("| min_capacity_vs_bf16 |"))
        == "| min_capacity_vs_bf16 | n/a | >= 1.0 | skipped: not measured: no serving benchmark |"
    )
    kinds = [d["kind"] for d in yaml.safe_load_all((b / "deploy/throughput.yaml").read_text())]
    assert kinds == ["Deployment", "Service"]
    assert not (b / "deploy/custom-metrics-rules.yaml").exists() and not (b / "capacity.png").exists()


def test_a_tier_searched_at_its_own_settings_is_sized_from_that_search():
    """serve_bench.tiers served the throughput tier at its own engine settings and searched its capacity at the tier's
    SLO there: that search sizes the tier's autoscaler, not the default sweep's read at the tier's SLO. A benchmarked
    tier ships as measured (no max-num-seqs override); without its own search the default sweep's decides."""
    from pipeline.drafts.methods import NONE
    from pipeline.release.decision import size_tier
    from pipeline.serving.tiers import parse_tiers

    serving = tiny_serving()
    throughput = next(t for t in parse_tiers(serving) if t.name == "throughput")
    default, own = Server(itl_slope=1.0), Server(itl_slope=0.5)  # 40 users at the default settings, 80 at its own
    level = own.closed(throughput.concurrency)
    record = ServeBenchRecord(
        V,
        **H100_RUN,
        configs={PLAIN: ServeConfigResult(0, 50.0, swept(default), capacity=search(default))},
        tiers={
            "throughput": {
                PLAIN: ServeConfigResult(
                    0,
                    50.0,
                    {f"c{throughput.concurrency}": level},
                    capacity=search(own, slo=throughput.slo, known=[level]),
                )
            }
        },
    )
    sized = size_tier(throughput, NONE, record, serving, 0.8, resizable=False, own=record.tier("throughput"))
    assert (sized.users, sized.max_num_seqs, sized.running_target) == (80, None, 64), sized.why
    assert "the tier's own search at its engine settings" in sized.why
    fallback = size_tier(throughput, NONE, record, serving, 0.8, resizable=False, own=None)
    assert (fallback.users, fallback.running_target) == (40, 32) and "the default sweep's" in fallback.why


def test_measured_capacity_sizes_the_throughput_tier_and_its_autoscaler(tmp_path, demo_pair):
    """A GPU run's records (the serving benchmark of this variant and of bf16, with their capacity searches over a
    deterministic latency model) through the real gate and bundle stages: the card states users and tokens/s per GPU
    at the SLO, the ratio against bf16 plain decoding and the cost per million tokens; the throughput tier ships
    max-num-seqs at the capacity of the config it serves and an autoscaling/v2 HorizontalPodAutoscaler that the
    Kubernetes schemas accept; the gate's chart is in the bundle."""
    import kubernetes_validate

    (tmp_path / "ws").mkdir()
    ws = stage_workspace(
        tmp_path / "ws", demo_pair, {"bf16": {}, V: {}}, serving={"max_num_seqs": 64, "gpu_hour_cost": 3.0}
    )
    p = yaml.safe_load((ws / "params.yaml").read_text())

    def draft_pays_at_one_request(server):
        levels = swept(server)
        for key, lvl in levels.items():  # the draft pays at one request, not under load
            lvl.output_throughput *= 2.0 if key == "c1" else 0.9
        return levels

    plain, draft, base = Server(itl_slope=1.0), Server(itl_slope=1.25), Server(itl_slope=2.0)  # 40, 32 and 20 users
    record = ServeBenchRecord(
        V,
        **H100_RUN,
        configs={
            PLAIN: ServeConfigResult(0, 50.0, swept(plain), capacity=search(plain)),
            "draft_model": ServeConfigResult(4, 55.0, draft_pays_at_one_request(draft), capacity=search(draft)),
        },
    )
    records.write(ws / f"artifacts/serve/{V}/record.json", record)
    records.write(
        ws / "artifacts/serve/bf16/record.json",
        ServeBenchRecord(
            "bf16", **H100_RUN, configs={PLAIN: ServeConfigResult(0, 50.0, swept(base), capacity=search(base))}
        ),
    )
    for name, k in ((PLAIN, 0), ("draft_model", 4)):  # the configs serve_bench would have written
        (ws / f"artifacts/serve/{V}/serve-{name}.yaml").write_text(served_yaml(ws, p, name, k))
    r = run_stage(ws, "stages.gate")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (ws / "artifacts/gate/pareto.png").read_bytes()[:4] == b"\x89PNG"
    r = run_stage(ws, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = ws / "artifacts/bundles" / V

    card = (b / "README.md").read_text()
    assert "Objective: p99 TTFT <= 200 ms, p99 ITL <= 50 ms, no failed request; arrival closed loop" in card
    plain_row = next(line for line in card.splitlines() if line.startswith("| plain | 40.0 |"))
    assert plain_row.endswith("| 40 users; 42 users missed it; 4 probes |")
    tokens = 100.0 * 32**0.8  # the draft's capacity level at 32 users, as its search measured it
    assert (
        f"**What ships (draft_model): 32.0 users per GPU and {tokens:.0f} output tokens/s per GPU at the "
        "objective**;\nx1.60 the users per GPU of bf16 plain decoding (20.0, same GPU and vLLM);\n"
        f"{3.0 / (tokens * 3600) * 1e6:.3f} per million output tokens at 3.0 per GPU-hour."
    ) in card
    # per GPU against bf16 on its own GPUs, and every variant of the build ranked by cost per output token
    bf16_tokens = 100.0 * 20**0.8
    assert (
        f"On 1 GPU per replica against bf16 on its own 1: x{bf16_tokens / tokens:.2f} its cost per output token "
        f"({3.0 / (bf16_tokens * 3600) * 1e6:.3f} per million)."
    ) in card
    ranked = [line for line in card.splitlines() if line.startswith((f"| {V} | draft_model | 1 |", "| bf16 | plain |"))]
    assert ranked == [
        f"| {V} | draft_model | 1 | 32.0 | 32.0 | {tokens:.0f} | {3.0 / (tokens * 3600) * 1e6:.3f} | pass |",
        f"| bf16 | plain | 1 | 20.0 | 20.0 | {bf16_tokens:.0f} | {3.0 / (bf16_tokens * 3600) * 1e6:.3f} | pass |",
    ]
    assert f"**Lowest cost per output token within the objective: {V} (draft_model) on 1 GPU per replica.**" in card
    assert "`capacity.png`: output tokens/s per GPU against p99 ITL" in card and (b / "capacity.png").is_file()
    gate_row = next(line for line in card.splitlines() if line.startswith("| min_capacity_vs_bf16 |"))
    assert gate_row == "| min_capacity_vs_bf16 | 1.6000 | >= 1.0 | pass |"

    # the throughput tier serves plain decoding at 64 (the draft lost there): sized from plain's 40 users
    served = yaml.safe_load((b / "serve-throughput.yaml").read_text())
    assert served["max-num-seqs"] == 40 and "speculative-config" not in served
    docs = list(yaml.safe_load_all((b / "deploy/throughput.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    deployment, _, hpa = docs
    assert "replicas" not in deployment["spec"]  # the autoscaler owns it
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_running"},
                "target": {"type": "AverageValue", "averageValue": "32"},
            },
        }
    ]
    row = next(line for line in card.splitlines() if line.startswith("| throughput |"))
    assert (
        "| 40 users per replica at p99 TTFT <= 200 ms, p99 ITL <= 50 ms (plain, the default sweep's, "
        "serve_bench on NVIDIA H100 80GB HBM3); max-num-seqs 40 (of 256 configured, batches measured up to "
        "serving.max_num_seqs 64); autoscaler at 32 running requests per pod (0.8 of it) |"
    ) in row
    # the default tier is not autoscaled, and serve.yaml ships as measured
    assert [d["kind"] for d in yaml.safe_load_all((b / "deploy/default.yaml").read_text())] == ["Deployment", "Service"]
    rules = yaml.safe_load((b / "deploy/custom-metrics-rules.yaml").read_text())["rules"]
    assert rules[0]["name"] == {"matches": "^vllm:num_requests_running$", "as": "vllm_num_requests_running"}
    if PROMTOOL:  # the adapter's query, its templates filled as prometheus-adapter fills them, is valid PromQL
        query = (
            rules[0]["metricsQuery"]
            .replace("<<.Series>>", "vllm:num_requests_running")
            .replace("<<.LabelMatchers>>", 'namespace="default"')
            .replace("<<.GroupBy>>", "pod")
        )
        check = tmp_path / "adapter.yaml"
        check.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": [{"record": "x:y", "expr": query}]}]}))
        r = subprocess.run([PROMTOOL, "check", "rules", str(check)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_warmup_script_warms_a_live_server_and_marks_readiness(bundled_workspace, demo_pair, tmp_path):
    """deploy/warmup.py as the bundle ships it, against an OpenAI-compatible server on this machine."""
    from pipeline.serving.vllm_server import serve

    b = bundle(bundled_workspace)
    config = tmp_path / "serve.yaml"
    server_cmd = [sys.executable, str(ROOT / "benchmarks/cpu/openai_cpu_server.py")]
    for fail_every, ok in ((0, True), (1, False)):
        config.write_text(
            json.dumps({"model": str(demo_pair[0]), "served-model-name": "nimbus-support", "fail-every": fail_every})
        )
        marker = tmp_path / f"warm-{fail_every}"
        with serve(config, tmp_path, tmp_path / "server.log", 120, None, command=server_cmd) as server:
            r = subprocess.run(
                [
                    sys.executable,
                    str(b / "deploy/warmup.py"),
                    "--prompts",
                    str(b / "deploy/warmup_prompts.jsonl"),
                    "--model",
                    "nimbus-support",
                    "--port",
                    str(server.port),
                    "--marker",
                    str(marker),
                    "--max-tokens",
                    "4",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
        assert (r.returncode == 0) == ok and marker.exists() == ok, r.stdout + r.stderr
    prompts = (b / "deploy/warmup_prompts.jsonl").read_text().splitlines()
    assert json.loads((tmp_path / "warm-0").read_text())["prompts"] == len(prompts) > 0


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p["deploy"].update(tiers=["default", "latnecy"]), "deploy.tiers names unknown tiers.*latnecy"),
        (
            lambda p: p["serving"]["tiers"].update(tp4={"tensor_parallel_size": 4, "gpus": 2}),
            "serving.tiers.tp4: tensor_parallel_size 4 exceeds the 2 GPUs",
        ),
        (lambda p: p["deploy"].pop("image"), "deploy: 'image' is a required property"),
        (lambda p: p["deploy"].update(image="vllm serve"), "deploy.image must name a container image"),
        (
            lambda p: p["serving"]["tiers"].update(fast={"max_num_seq": 8}),
            r"serving.tiers.fast: unknown settings \['max_num_seq'\]",
        ),
        (lambda p: p["deploy"].update(namespace="Prod_NS"), "deploy.namespace must be a Kubernetes name"),
        (lambda p: p["monitoring"].update(kv_cache_usage_max=90), "monitoring.kv_cache_usage_max"),
        (
            lambda p: p["serve_bench"].update(tiers=["throughput", "default"]),
            r"serve_bench.tiers names unknown tiers \['default'\]",
        ),
    ],
)
def test_bad_handoff_params_are_one_line(edit, message, tmp_path):
    p = tiny_params()
    edit(p)
    with pytest.raises(PipelineError, match=message) as err:
        validate(p, tmp_path / "params.yaml")
    assert "\n" not in str(err.value)


def test_bundle_stage_refuses_a_bad_tier_before_writing(bundled_workspace, tmp_path):
    ws, p = unbundled_copy(bundled_workspace, tmp_path)
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
    ws = bundle_workspace(
        tmp_path / "ws",
        demo_pair,
        BundleSpec(
            {V: {}}, {"serving": {"secret_env": {"VLLM_API_KEY": "vllm-auth/api-key", "HF_TOKEN": "hf-cred/token"}}}
        ),
    )
    b = bundle(ws)
    for tier in ("default", "latency", "throughput"):
        deployment = next(yaml.safe_load_all((b / "deploy" / f"{tier}.yaml").read_text()))
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["VLLM_API_KEY"] == {
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "vllm-auth", "key": "api-key"}},
        }
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-cred", "key": "token"}
    assert "VLLM_API_KEY" not in ((b / "serve.env").read_text() if (b / "serve.env").exists() else "")
    p["serving"]["env"] = {}
    p["serving"]["secret_env"] = {"VLLM_API_KEY": "sk-live-123"}  # a value, not a reference
    with pytest.raises(PipelineError, match="serving.secret_env must map"):
        validate(p, tmp_path / "params.yaml")


@needs_promtool
def test_rules_unit_test_ships_and_passes_when_no_speculation_ships(bundled_workspace, tmp_path):
    """Issue #49: monitoring/rules.test.yaml was missing when no speculation shipped, though the docs list it. It
    tests the KV cache and latency alerts too: each fires above its threshold and stays quiet at it."""
    ws, p = unbundled_copy(bundled_workspace, tmp_path)
    p["serving"]["max_num_seqs"] = 64  # batched: a lockstep prediction does not hold, plain decoding ships
    (ws / "params.yaml").write_text(yaml.safe_dump(p))
    gate_on(ws, p, ServeBenchRecord(V, skipped="no CUDA device"))
    r = run_stage(ws, "stages.bundle", V)
    assert r.returncode == 0, r.stderr[-3000:]
    b = ws / "artifacts/bundles" / V
    assert "speculative-config" not in yaml.safe_load((b / "serve.yaml").read_text())
    mon = b / "monitoring"
    r = subprocess.run([PROMTOOL, "test", "rules", "rules.test.yaml"], cwd=mon, capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    tested = {
        t["alertname"]
        for case in yaml.safe_load((mon / "rules.test.yaml").read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    rules = yaml.safe_load((mon / "rules.yaml").read_text())
    assert (
        tested
        == {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
        == {
            "VllmKvCacheNearlyFull",
            "VllmTimeToFirstTokenP99High",
            "VllmInterTokenLatencyP99High",
            "VllmQueueTimeP99High",
        }
    )
    assert "promtool test rules monitoring/rules.test.yaml" in (b / "README.md").read_text()


@needs_promtool
@pytest.mark.parametrize("kv_max", [0.9, 1.0])
def test_rules_unit_test_passes_at_every_allowed_kv_cache_threshold(tmp_path, kv_max):
    """monitoring.kv_cache_usage_max may be 1.0 (params check: 0 to 1): the alert, usage above it, can never fire
    there, so the shipped unit test must not expect it to (it did: promtool failed on the bundle's own test)."""
    from pipeline.release import monitoring

    levels = monitoring.AlertLevels("svc-bf16", None, "", None, 2.0, 0.1, "the latency gates", kv_max, 0.8)
    (tmp_path / "rules.yaml").write_text(monitoring.rules_yaml(levels, "svc"))
    (tmp_path / "rules.test.yaml").write_text(monitoring.rules_unit_test(levels, "rules.yaml"))
    r = subprocess.run([PROMTOOL, "test", "rules", "rules.test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_latency_alerts_name_the_slo_and_the_latency_gate_beside_their_own_threshold(bundled_workspace):
    """Issue #49: three latency targets ten times apart, with no word on which is which. Each alert's description
    names itself the latency alert and sets the SLO and the latency gate beside it, under their params names."""
    rules = yaml.safe_load((bundle(bundled_workspace) / "monitoring/rules.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    p = tiny_params()
    slo, gate = p["serving"]["slo"], p["gates"]["thresholds"]
    ttft = alerts["VllmTimeToFirstTokenP99High"]["annotations"]
    assert ttft["summary"] == "p99 time to first token above 2500.0 ms (latency alert)"
    assert ttft["description"] == (
        f"Latency alert: {gate['max_p99_ttft_ms']:.1f} ms from the latency gates' thresholds (no serving benchmark in "
        "this build), raised to the histogram's next bucket bound. Beside it: the SLO (serving.slo) p99 TTFT "
        f"{slo['p99_ttft_ms']:g} ms; the latency gate (gates.thresholds.max_p99_ttft_ms) "
        f"{gate['max_p99_ttft_ms']:g} ms."
    )
    assert (
        f"the SLO (serving.slo) p99 ITL {slo['p99_itl_ms']:g} ms; the latency gate "
        f"(gates.thresholds.max_p99_itl_ms) {gate['max_p99_itl_ms']:g} ms."
    ) in alerts["VllmInterTokenLatencyP99High"]["annotations"]["description"]
    assert (
        "Beside it (queue time is part of TTFT): the SLO"
        in alerts["VllmQueueTimeP99High"]["annotations"]["description"]
    )
