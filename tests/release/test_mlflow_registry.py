"""The MLflow backend against a real `mlflow server` on loopback (sqlite store, temp artifact root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from bundle_helpers import BundleSpec, free_port, one_error_line, run_stage, verify_cli
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.release.manifest import write_manifest
from pipeline.release.registry import mlflow_registry
from pipeline.release.settings import PublishParams
from tiny_project import publish_settings

STARTUP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Without its job runners (huey consumers for GenAI scorers and trace roll-ups, none of which the model
        # registry uses): they cost the 2-core CI about 30 s of CPU per server and slowed its start and stop.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        request.getfixturevalue("demo_pair")  # built (once per session) while the server boots
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow server did not start:\n" + (root / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        yield uri, root
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server's own session: it and its uvicorn worker
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def bundle_spec(mlflow_server):
    uri, _ = mlflow_server
    return BundleSpec(
        {"fp8-static": {}},
        {"publish": {"backend": "mlflow", "mlflow": {"tracking_uri": uri, "experiment": "modelprep-test"}}},
    )


def test_publish_registers_a_version_that_reads_back(bundled_workspace, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    uri, _ = mlflow_server
    r = run_stage(bundled_workspace, "stages.publish")
    assert r.returncode == 0, r.stderr[-3000:]
    bundle = bundled_workspace / "artifacts/bundles/fp8-static"
    digest = read_json(bundle / "MANIFEST.json")["bundle_digest"]
    spec = read_json(bundled_workspace / "artifacts/eval/fp8-static/speculative.json")
    receipt = read_json(bundled_workspace / "artifacts/publish/receipt.json")["published"][0]
    assert receipt["status"] == "published" and receipt["version"] == digest[:12]

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    [mv] = client.search_model_versions("name = 'nimbus-support-fp8-static'")
    assert receipt["uri"] == f"models:/nimbus-support-fp8-static/{mv.version}"
    assert mv.status == "READY"
    assert mv.tags["variant"] == "fp8-static"
    assert mv.tags["gates"] == "passed"
    assert mv.tags["num_speculative_tokens"] == str(spec["num_speculative_tokens"])
    assert float(mv.tags["accepted_per_draft_token"]) == pytest.approx(spec["accepted_per_draft_token"], abs=1e-3)
    assert mv.tags["bundle_digest"] == digest and mv.tags["version_label"] == digest[:12]
    run = client.get_run(mv.run_id)
    assert run.info.status == "FINISHED" and mv.source == f"{run.info.artifact_uri}/bundle"
    # The registered artifacts are the exact bundle: downloaded, they verify against their manifest.
    downloaded = Path(client.download_artifacts(mv.run_id, "bundle", str(tmp_path)))
    assert verify_cli(downloaded).returncode == 0
    assert read_json(downloaded / "MANIFEST.json")["bundle_digest"] == digest


def test_republish_is_idempotent_and_versions_are_immutable(bundled_workspace, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    uri, _ = mlflow_server
    cfg = PublishParams.parse(yaml.safe_load((bundled_workspace / "params.yaml").read_text())["publish"])
    bundle = bundled_workspace / "artifacts/bundles/fp8-static"
    first = mlflow_registry.publish(bundle, "immutable-test", "1.0", {"variant": "fp8-static"}, cfg)
    again = mlflow_registry.publish(bundle, "immutable-test", "1.0", {"variant": "fp8-static"}, cfg)
    assert (first["status"], again["status"]) == ("published", "already published")
    assert again["uri"] == first["uri"]
    changed = shutil.copytree(bundle, tmp_path / "changed")
    (changed / "README.md").write_text("a different build\n")
    write_manifest(changed, {})
    with pytest.raises(PipelineError, match="immutable-test version 1.0 already exists in MLflow registry"):
        mlflow_registry.publish(changed, "immutable-test", "1.0", {}, cfg)
    assert mlflow_registry.publish(changed, "immutable-test", "1.1", {}, cfg)["status"] == "published"
    versions = MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions("name = 'immutable-test'")
    assert sorted(v.tags["version_label"] for v in versions) == ["1.0", "1.1"]


def test_unreachable_server_fails_fast_in_one_line(bundled_workspace, tmp_path):
    ws = shutil.copytree(bundled_workspace, tmp_path / "ws")
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["publish"]["mlflow"]["tracking_uri"] = f"http://127.0.0.1:{free_port()}"
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    t0 = time.monotonic()
    line = one_error_line(run_stage(ws, "stages.publish"))
    assert "is unreachable" in line and params["publish"]["mlflow"]["tracking_uri"] in line
    assert time.monotonic() - t0 < 60


def test_missing_tracking_uri_is_one_line(bundled_workspace, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(PipelineError, match="publish.mlflow.tracking_uri"):
        mlflow_registry.publish(
            bundled_workspace / "artifacts/bundles/fp8-static", "x", "1", {}, publish_settings(mlflow={})
        )


def test_tracking_uri_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    assert mlflow_registry.tracking_uri(publish_settings(mlflow={"tracking_uri": None})) == "http://mlflow.example:5000"
    assert mlflow_registry.tracking_uri(publish_settings(mlflow={"tracking_uri": "http://a:1"})) == "http://a:1"


def test_an_already_published_version_whose_stored_signature_fails_the_policy_is_refused(
    bundled_workspace, mlflow_server, tmp_path
):
    """Issue #47: MLflow's `already published` was decided by the digest alone, and the signature is outside it:
    signing turned on (or the key changed) after a publish reported the unsigned (or old-signed) stored version
    as published. It is refused now, naming why; a version whose stored signature satisfies the key is reused."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from pipeline.release import signing

    def keypair(name: str) -> dict:
        key = ec.generate_private_key(ec.SECP256R1())
        private, public = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem"
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        public.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return {"private_key": str(private), "public_key": str(public)}

    publish = yaml.safe_load((bundled_workspace / "params.yaml").read_text())["publish"]
    unsigned_cfg = PublishParams.parse(publish)
    bundle = shutil.copytree(bundled_workspace / "artifacts/bundles/fp8-static", tmp_path / "b")
    assert mlflow_registry.publish(bundle, "sig-policy", "1", {}, unsigned_cfg)["status"] == "published"
    release, other = keypair("release"), keypair("other")
    signed_cfg = PublishParams.parse({**publish, "signing": release})
    signing.sign(bundle, release["private_key"])  # the same content, now signed
    with pytest.raises(
        PipelineError,
        match=r"sig-policy version 1 in MLflow registry .* holds this content but is "
        r"unsigned; .*publish under a new version",
    ):
        mlflow_registry.publish(bundle, "sig-policy", "1", {}, signed_cfg)
    assert mlflow_registry.publish(bundle, "sig-policy", "2", {}, signed_cfg)["status"] == "published"
    assert mlflow_registry.publish(bundle, "sig-policy", "2", {}, signed_cfg)["status"] == "already published"
    signing.sign(bundle, other["private_key"])  # the key rotated
    with pytest.raises(PipelineError, match=r"sig-policy version 2 .* is signed with another key than"):
        mlflow_registry.publish(bundle, "sig-policy", "2", {}, PublishParams.parse({**publish, "signing": other}))
