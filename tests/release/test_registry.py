"""The publish stage and the local registry: index, `latest` alias, immutable versions, verify-before-push."""

from __future__ import annotations

import json
import shutil

import pytest

from bundle_helpers import BundleSpec, one_error_line, run_stage, verify_cli
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.release.manifest import write_manifest
from pipeline.release.registry import get_backend, local
from tiny_project import publish_settings

VARIANTS = ("fp8-static", "fp8-dynamic")


@pytest.fixture(scope="module")
def bundle_spec():
    return BundleSpec({v: {} for v in VARIANTS})


def different_bundle(src, dest):
    """A legitimately different bundle (re-manifested), as a changed build would produce."""
    b = shutil.copytree(src, dest)
    (b / "serve.yaml").write_text((b / "serve.yaml").read_text().replace("max-num-seqs: 1\n", "max-num-seqs: 32\n"))
    write_manifest(b, read_json(b / "MANIFEST.json")["provenance"])
    return b


def test_publish_stage_fills_the_local_registry(bundled_workspace):
    r = run_stage(bundled_workspace, "stages.publish")
    assert r.returncode == 0, r.stderr[-3000:]
    registry = bundled_workspace / "registry"
    index = json.loads((registry / "index.json").read_text())
    receipt = json.loads((bundled_workspace / "artifacts/publish/receipt.json").read_text())
    assert receipt["backend"] == "local" and len(receipt["published"]) == len(VARIANTS)
    for variant in VARIANTS:
        name = f"nimbus-support-{variant}"
        digest = read_json(bundled_workspace / "artifacts/bundles" / variant / "MANIFEST.json")["bundle_digest"]
        entry = index["models"][name]
        assert entry["latest"] == digest[:12]
        assert (registry / name / "latest").read_text().strip() == digest[:12]
        assert entry["versions"][digest[:12]]["bundle_digest"] == digest
        assert entry["versions"][digest[:12]]["tags"]["variant"] == variant
        assert entry["versions"][digest[:12]]["tags"]["gates"] == "passed"
        published = local.resolve(registry, name)
        assert verify_cli(published).returncode == 0
    # Re-running the stage (dvc repro after an unrelated change) is idempotent.
    again = run_stage(bundled_workspace, "stages.publish")
    assert again.returncode == 0 and again.stdout.count("already published") == len(VARIANTS)
    assert json.loads((registry / "index.json").read_text())["models"].keys() == index["models"].keys()


def test_versions_are_immutable_and_latest_follows_the_last_publish(bundled_workspace, tmp_path):
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    first = bundled_workspace / "artifacts/bundles/fp8-dynamic"
    second = different_bundle(first, tmp_path / "second")
    assert local.publish(first, "m", "1.0", {}, cfg)["status"] == "published"
    assert local.publish(first, "m", "1.0", {}, cfg)["status"] == "already published"
    with pytest.raises(PipelineError, match="m version 1.0 already exists .* different content"):
        local.publish(second, "m", "1.0", {}, cfg)
    assert verify_cli(local.resolve(cfg.registry_dir, "m", "1.0")).returncode == 0  # untouched
    assert local.publish(second, "m", "1.1", {}, cfg)["status"] == "published"
    assert local.resolve(cfg.registry_dir, "m") == tmp_path / "registry/m/1.1"
    # Publishing 1.0's content again would move `latest` back to an older build: refused unless asked for (#47),
    # then it copies nothing and re-points `latest`.
    with pytest.raises(
        PipelineError, match="m version 1.0 is already published and 1.1 is latest: .* publish.allow_rollback: true"
    ):
        local.publish(first, "m", "1.0", {}, cfg)
    assert local.resolve(cfg.registry_dir, "m") == tmp_path / "registry/m/1.1"
    assert (tmp_path / "registry/m/latest").read_text() == "1.1\n"
    rollback = publish_settings(registry_dir=str(tmp_path / "registry"), allow_rollback=True)
    assert local.publish(first, "m", "1.0", {}, rollback)["status"] == "already published"
    assert local.resolve(cfg.registry_dir, "m") == tmp_path / "registry/m/1.0"
    assert sorted(read_json(tmp_path / "registry/index.json")["models"]["m"]["versions"]) == ["1.0", "1.1"]


def test_publish_refuses_a_tampered_bundle(bundled_workspace, tmp_path):
    b = shutil.copytree(bundled_workspace / "artifacts/bundles/fp8-static", tmp_path / "b")
    with (b / "draft/model.safetensors").open("r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    with pytest.raises(PipelineError, match="sha256 mismatch for draft/model.safetensors"):
        local.publish(b, "m", "1.0", {}, cfg)
    assert not (tmp_path / "registry").exists()


def test_publish_stage_tampered_bundle_is_one_line(bundled_workspace, tmp_path):
    ws = shutil.copytree(bundled_workspace, tmp_path / "ws", ignore=shutil.ignore_patterns("registry", "publish"))
    (ws / "artifacts/bundles/fp8-static/README.md").write_text("edited by hand\n")
    line = one_error_line(run_stage(ws, "stages.publish"))
    assert "sha256 mismatch for README.md" in line
    assert not (ws / "artifacts/publish/receipt.json").exists()


def test_a_verdict_reached_under_other_thresholds_is_not_published(bundled_workspace, tmp_path):
    """Raise a bar in params.yaml after the gate ran, then run the publish stage by hand: the stored verdict says
    passed under the old bar, so publishing it would tag a failing build `gates: passed`."""
    import yaml

    ws = shutil.copytree(bundled_workspace, tmp_path / "ws", ignore=shutil.ignore_patterns("registry", "publish"))
    p = yaml.safe_load((ws / "params.yaml").read_text())
    p["gates"]["overrides"]["fp8-dynamic"] = {
        **p["gates"]["overrides"].get("fp8-dynamic", {}),
        "max_kl_divergence": 0.0001,
    }
    (ws / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    line = one_error_line(run_stage(ws, "stages.publish"))
    assert (
        "fp8-dynamic: its gate verdict was reached with max_kl_divergence = 0.05, params.yaml now says 0.0001"
    ) in line
    assert not (ws / "registry").exists() and not (ws / "artifacts/publish/receipt.json").exists()


def test_a_bundle_swapped_after_its_verdict_was_checked_is_not_published_under_its_tags(bundled_workspace, tmp_path):
    """A concurrent `bundle@v` renames a new bundle into place between the verdict check and the upload: the
    registry must not store the new content under the old one's digest and tags."""
    from pipeline.core import records
    from pipeline.release.gates import GateReport
    from pipeline.release.publish import pinned_copy, release_tags

    ws = shutil.copytree(bundled_workspace, tmp_path / "ws", ignore=shutil.ignore_patterns("registry", "publish"))
    bundle = ws / "artifacts/bundles/fp8-static"
    current = records.read(GateReport, ws / "artifacts/gate/verdict.json")
    version, tags = release_tags(bundle, "fp8-static", "auto", [], current)
    assert tags["bundle_digest"].startswith(version)
    other = different_bundle(bundle, tmp_path / "other")
    bundle.rename(tmp_path / "old")
    other.rename(bundle)  # the swap, as an atomic rename
    with pytest.raises(PipelineError, match="changed while it was being published"):
        with pinned_copy(bundle, tags["bundle_digest"], tmp_path / "staging"):
            pass
    assert not any((tmp_path / "staging").iterdir())  # the private copy is gone
    with pinned_copy(tmp_path / "old", tags["bundle_digest"], tmp_path / "staging") as copy:
        cfg = publish_settings(registry_dir=str(tmp_path / "reg"))
        assert local.publish(copy, "m", version, tags, cfg)["status"] == "published"
    assert read_json(tmp_path / "reg/m" / version / "MANIFEST.json")["bundle_digest"] == tags["bundle_digest"]


def test_a_console_reader_that_goes_away_does_not_cut_a_release_short(bundled_workspace, tmp_path):
    """`python -m stages.publish | head -1`: head exits after the first line; every variant is still published and
    the receipt written."""
    import os
    import subprocess
    import sys

    from tiny_project import ROOT

    ws = shutil.copytree(bundled_workspace, tmp_path / "ws", ignore=shutil.ignore_patterns("registry", "publish"))
    r = subprocess.run(
        f"{sys.executable} -m stages.publish | head -1",
        shell=True,
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.stdout.count("\n") == 1 and "publish " in r.stdout and "BrokenPipe" not in r.stderr, r.stderr
    receipt = read_json(ws / "artifacts/publish/receipt.json")
    assert len(receipt["published"]) == len(VARIANTS)


@pytest.mark.parametrize("version", ["latest", "../escape", "a b", ""])
def test_bad_versions_are_refused(bundled_workspace, tmp_path, version):
    with pytest.raises(PipelineError, match="version"):
        local.publish(
            bundled_workspace / "artifacts/bundles/fp8-static",
            "m",
            version,
            {},
            publish_settings(registry_dir=str(tmp_path / "registry")),
        )
    assert not (tmp_path / "registry").exists()


def test_unknown_backend_is_one_line():
    with pytest.raises(PipelineError, match="unknown registry backend 's3'; choose one of local, mlflow, hf"):
        get_backend("s3")


def test_the_acceptance_tag_is_the_shipped_methods_as_the_gate_checked_it():
    """publish's accepted_per_draft_token tag: the gate's applied value, else the shipped method's own estimate
    (candidate_metrics), never another method's number (the unsuffixed one is the CPU-best method's); n/a without."""
    from eval_helpers import eval_summary
    from pipeline.release.decision import SpeculationDecision
    from pipeline.release.gates import GateCheck, VariantVerdict
    from pipeline.release.publish import accepted_per_draft_token

    def verdict(method, k, checked=None):
        checks = (
            []
            if checked is None
            else [
                GateCheck("min_accepted_per_draft_token", "served_accepted_per_draft_token", checked, 0.5, ">=", True)
            ]
        )
        return VariantVerdict(True, False, checks, SpeculationDecision(k, k, "measured", 2.0, 1, "", method=method))

    summary = eval_summary(
        {
            "estimated_method": "draft_model",
            "accepted_per_draft_token": 0.9,
            "methods": [
                {"method": "draft_model", "accepted_per_draft_token": 0.9},
                {"method": "eagle3", "accepted_per_draft_token": 0.31},
            ],
        }
    )
    assert accepted_per_draft_token(verdict("eagle3", 7, checked=0.7), summary) == "0.700"
    assert accepted_per_draft_token(verdict("eagle3", 7), summary) == "0.310"
    assert accepted_per_draft_token(verdict("ngram", 5), summary) == "n/a"  # not the draft model's 0.9
    assert accepted_per_draft_token(verdict("eagle3", 0, checked=0.7), summary) == "n/a"  # nothing ships
    # a summary without per-method numbers: the unsuffixed one, only when it is the shipped method's
    assert (
        accepted_per_draft_token(verdict("draft_model", 4), eval_summary({"accepted_per_draft_token": 0.9})) == "0.900"
    )
    assert (
        accepted_per_draft_token(
            verdict("eagle3", 4), eval_summary({"estimated_method": "draft_model", "accepted_per_draft_token": 0.9})
        )
        == "n/a"
    )
