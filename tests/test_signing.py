"""Signed bundles (OpenSSF model signing): what the manifest alone can't stop. Whoever can write a bundle can edit
EVAL.json and write a fresh MANIFEST.json; with a signing key in params the signature over every file catches it
at publish, `modelprep verify` and registry resolution. Keys are generated here; nothing reaches a network."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundle_helpers import MODELPREP, BundleSpec, one_error_line, run_stage
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json
from pipeline.release import signing
from pipeline.release.manifest import verify, write_manifest
from pipeline.release.registry import local

V = "fp8-dynamic"


def keypair(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory):
    """(directory, private key, public key) of the release signing key."""
    keys = tmp_path_factory.mktemp("keys")
    return keys, *keypair(keys, "release")


@pytest.fixture(scope="module")
def bundle_spec(release_keys):
    _, private, public = release_keys
    return BundleSpec({V: {}}, {"publish": {"signing": {"private_key": str(private), "public_key": str(public)}}},
                      says="signed")


@pytest.fixture(scope="module")
def signed(bundled_workspace, release_keys):
    keys, _, public = release_keys
    return bundled_workspace, keys, public


def copy_ws(ws: Path, dest: Path) -> Path:
    return shutil.copytree(ws, dest, ignore=shutil.ignore_patterns("registry", "publish"))


def test_a_signed_bundle_verifies_and_publishes(signed, tmp_path):
    ws, _, public = signed
    b = ws / "artifacts/bundles" / V
    assert (b / signing.SIGNATURE).is_file() and signing.SIGNATURE not in read_json(b / "MANIFEST.json")["files"]
    signing.verify(b, public)
    verify(b)  # the manifest's own check ignores the signature it can't list
    ws2 = copy_ws(ws, tmp_path / "ws")
    r = run_stage(ws2, "stages.publish")
    assert r.returncode == 0, r.stderr[-2000:]
    name = f"nimbus-support-{V}"
    stored = local.resolve(ws2 / "registry", name, public_key=public)
    assert (stored / signing.SIGNATURE).is_file()


def test_an_edited_eval_with_a_fresh_manifest_is_caught_by_the_signature(signed, tmp_path):
    """The README's admitted limit of the manifest: EVAL.json edited, MANIFEST.json written anew. verify() alone
    passes it; the signature does not."""
    ws, _, public = signed
    ws2 = copy_ws(ws, tmp_path / "ws")
    b = ws2 / "artifacts/bundles" / V
    ev = read_json(b / "EVAL.json")
    ev["top1_agreement"] = 0.99
    (b / "EVAL.json").write_text(json.dumps(ev))
    write_manifest(b, read_json(b / "MANIFEST.json")["provenance"])
    verify(b)  # the manifest is consistent again
    with pytest.raises(PipelineError, match="signature does not verify"):
        signing.verify(b, public)
    line = one_error_line(run_stage(ws2, "stages.publish"))
    assert "signature does not verify" in line and not (ws2 / "registry").exists()
    r = __import__("subprocess").run([MODELPREP, "verify", str(b), "--public-key", str(public)], cwd=ws2,
                                     capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "signature does not verify" in r.stderr


def test_unsigned_or_foreign_signed_bundles_are_refused_when_a_key_is_configured(signed, tmp_path):
    ws, keys, public = signed
    ws2 = copy_ws(ws, tmp_path / "ws")
    b = ws2 / "artifacts/bundles" / V
    (b / signing.SIGNATURE).unlink()
    line = one_error_line(run_stage(ws2, "stages.publish"))
    assert "is not signed (model.sig missing)" in line
    other_private, _ = keypair(keys, "intruder")
    signing.sign(b, other_private)  # a valid signature, by someone else
    line = one_error_line(run_stage(ws2, "stages.publish"))
    assert "signature does not verify" in line and not (ws2 / "registry").exists()


def test_a_missing_key_file_is_one_line_before_any_work(signed, tmp_path):
    from pipeline.params.check import validate

    p = yaml.safe_load((signed[0] / "params.yaml").read_text())
    p["publish"]["signing"]["private_key"] = str(tmp_path / "nope.pem")
    with pytest.raises(PipelineError, match="publish.signing.private_key .*nope.pem not found"):
        validate(p, tmp_path / "params.yaml")
