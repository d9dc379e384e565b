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
from pipeline.release import attestation, signing
from pipeline.release.manifest import verify, write_manifest
from pipeline.release.registry import local

V = "fp8-dynamic"


def keypair(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory):
    """(directory, private key, public key) of the release signing key."""
    keys = tmp_path_factory.mktemp("keys")
    return keys, *keypair(keys, "release")


@pytest.fixture(scope="module")
def bundle_spec(release_keys):
    _, private, public = release_keys
    return BundleSpec(
        {V: {}}, {"publish": {"signing": {"private_key": str(private), "public_key": str(public)}}}, says="signed"
    )


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
    r = subprocess_run([MODELPREP, "verify", str(b), "--public-key", str(public)], ws2)  # this checkout's code
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
    from pipeline.rules import validate

    p = yaml.safe_load((signed[0] / "params.yaml").read_text())
    p["publish"]["signing"]["private_key"] = str(tmp_path / "nope.pem")
    with pytest.raises(PipelineError, match="publish.signing.private_key .*nope.pem not found"):
        validate(p, tmp_path / "params.yaml")


# Issue #47: a signature that binds name and version; no side door around params; a new key reaches the registry.

NAME = f"nimbus-support-{V}"


def published(ws: Path) -> tuple[Path, str]:
    """ws's registry after the real publish stage: (registry, the version published)."""
    r = run_stage(ws, "stages.publish")
    assert r.returncode == 0, r.stderr[-2000:]
    registry = ws / "registry"
    return registry, read_json(registry / "index.json")["models"][NAME]["latest"]


def plant(registry: Path, version_dir: Path, name: str, version: str) -> None:
    """What whoever can write the registry does: a version directory copied in, indexed, made `latest`."""
    shutil.copytree(version_dir, registry / name / version)
    index = read_json(registry / "index.json")
    record = index["models"][NAME]["versions"][version_dir.name]
    index["models"].setdefault(name, {"versions": {}})["versions"][version] = record
    index["models"][name]["latest"] = version
    (registry / "index.json").write_text(json.dumps(index))
    (registry / name / "latest").write_text(version + "\n")


def verify_ref(ws: Path, ref: str):
    """`modelprep verify <ref>` from ws, with this checkout's code (the console script's install may be another)."""
    import os
    import subprocess

    from tiny_project import ROOT

    return subprocess.run(
        [MODELPREP, "verify", ref],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_signed_bundle_is_refused_under_another_name_or_version(signed, tmp_path):
    """A signed fp8-dynamic version copied into `<name>-bf16/` (indexed, made latest) verified as `<name>-bf16`:
    the signature held, the name was nobody's to check. PROVENANCE.json now carries the name and version the
    bundle was built for, under the signature; resolution checks them."""
    ws = copy_ws(signed[0], tmp_path / "ws")
    registry, version = published(ws)
    assert verify_ref(ws, f"{NAME}@latest").returncode == 0
    other = "nimbus-support-bf16"
    plant(registry, registry / NAME / version, other, version)
    r = verify_ref(ws, f"{other}@latest")
    assert r.returncode == 2 and f"was built for {NAME}, not {other}" in r.stderr, r.stdout + r.stderr
    plant(registry, registry / NAME / version, NAME, "ffffffffffff")  # the same bundle as another version
    r = verify_ref(ws, f"{NAME}@latest")
    assert r.returncode == 2 and f"was built for version {version} of {NAME}, not ffffffffffff" in r.stderr
    # The binding is in the digest: an edit of it breaks the manifest, a fresh manifest breaks the signature
    b = ws / "artifacts/bundles" / V
    prov = read_json(b / "PROVENANCE.json")
    assert prov["release"] == {"name": NAME, "variant": V, "version": "auto"}
    (b / "PROVENANCE.json").write_text(json.dumps({**prov, "release": {**prov["release"], "name": other}}))
    write_manifest(b, read_json(b / "MANIFEST.json")["provenance"])
    with pytest.raises(PipelineError, match="signature does not verify"):
        signing.verify(b, signed[2])
    assert f"not {NAME}" in one_error_line(run_stage(ws, "stages.publish"))  # and publish refuses it as built


def test_modelprep_params_cannot_replace_the_params_dvc_tracks(signed, tmp_path):
    """MODELPREP_PARAMS=other.yaml (no signing key) published an unsigned bundle although params.yaml, the file
    dvc.lock records, sets publish.signing.public_key. A stage now refuses the variable in one line."""
    ws = copy_ws(signed[0], tmp_path / "ws")
    (ws / "artifacts/bundles" / V / signing.SIGNATURE).unlink()
    p = yaml.safe_load((ws / "params.yaml").read_text())
    p["publish"]["signing"] = {"private_key": None, "public_key": None}
    (ws / "other.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    line = one_error_line(run_stage(ws, "stages.publish", env={"MODELPREP_PARAMS": "other.yaml"}))
    assert "MODELPREP_PARAMS is set (other.yaml): stages read only params.yaml" in line
    assert not (ws / "registry").exists()
    assert "MODELPREP_PARAMS is set" in one_error_line(
        run_stage(ws, "stages.bundle", V, env={"MODELPREP_PARAMS": "other.yaml"})
    )


def set_signing(ws: Path, private: Path | None, public: Path | None) -> None:
    p = yaml.safe_load((ws / "params.yaml").read_text())
    p["publish"]["signing"] = {"private_key": private and str(private), "public_key": public and str(public)}
    (ws / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def test_turning_signing_on_or_changing_the_key_reaches_the_stored_version(signed, release_keys, tmp_path):
    """Published unsigned, then signing turned on (or the key changed): the digest is the same, so publish said
    `already published` and kept the stored copy, whose signature then failed `verify <name>@latest`. The stored
    version now gets the new, verified signature."""
    ws = copy_ws(signed[0], tmp_path / "ws")
    keys, private, public = release_keys
    b = ws / "artifacts/bundles" / V
    (b / signing.SIGNATURE).unlink()
    set_signing(ws, None, None)
    registry, version = published(ws)
    assert not (registry / NAME / version / signing.SIGNATURE).exists()
    signing.sign(b, private)  # the bundle stage, re-run with the key on
    set_signing(ws, private, public)
    r = run_stage(ws, "stages.publish")
    assert r.returncode == 0 and "already published, signature replaced" in r.stdout, r.stdout + r.stderr
    assert verify_ref(ws, f"{NAME}@latest").returncode == 0
    new_private, new_public = keypair(keys, "rotated")  # a new key: the stored copy no longer satisfies it
    signing.sign(b, new_private)
    set_signing(ws, new_private, new_public)
    line = one_error_line(run_stage(ws, "stages.publish"))  # the bundle's attestation is still the old key's
    assert f"attestation.intoto.json: its signature does not verify with {new_public}" in line
    attestation.attest(b, new_private, [])  # as the bundle stage does after signing
    r = run_stage(ws, "stages.publish")
    assert r.returncode == 0 and "signature replaced" in r.stdout, r.stdout + r.stderr
    local.resolve(registry, NAME, public_key=new_public)
    attestation.check(registry / NAME / version, new_public)  # the attestation went with the signature
    with pytest.raises(PipelineError, match="signature does not verify"):
        local.resolve(registry, NAME, public_key=public)
    assert "signature replaced" not in run_stage(ws, "stages.publish").stdout  # satisfied now: nothing to do


def test_a_key_changed_in_place_changes_what_bundle_and_publish_depend_on(release_keys, tmp_path):
    """The key's path in params.yaml is all DVC saw: a key file rewritten in place re-ran nothing. The `sources`
    stage (always run) now writes the key files' hashes to artifacts/signing-keys.json, a dep of bundle and
    publish, so DVC re-runs them exactly when a key's content changes."""
    from tiny_project import ROOT, copy_project, tiny_params

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "artifacts/signing-keys.json" in stages["bundle"]["do"]["deps"]
    assert "artifacts/signing-keys.json" in stages["publish"]["deps"]
    sources = yaml.safe_load((ROOT / "stages/dvc.yaml").read_text())["stages"]["sources"]
    assert {"artifacts/signing-keys.json": {"cache": False}} in sources["outs"]
    keys, _, _ = release_keys
    private, public = keypair(tmp_path, "inplace")
    params = tiny_params(publish={"signing": {"private_key": str(private), "public_key": str(public)}})
    (tmp_path / "proj").mkdir()
    proj = copy_project(tmp_path / "proj", params)
    assert run_stage(proj, "stages.sources").returncode == 0
    before = read_json(proj / "artifacts/signing-keys.json")
    assert before["private_key"]["file_sha256"] and before["public_key"]["file_sha256"]
    assert run_stage(proj, "stages.sources").returncode == 0
    assert read_json(proj / "artifacts/signing-keys.json") == before  # unchanged keys: nothing downstream re-runs
    private.write_bytes((keys / "release.pem").read_bytes())  # another key, same path
    public.write_bytes((keys / "release.pub.pem").read_bytes())
    assert run_stage(proj, "stages.sources").returncode == 0
    after = read_json(proj / "artifacts/signing-keys.json")
    assert after["private_key"] != before["private_key"] and after["public_key"] != before["public_key"]


def test_an_encrypted_ec_key_signs_and_other_key_types_are_named(signed, tmp_path, monkeypatch):
    """Issue #47: MODELPREP_SIGNING_KEY_PASSWORD reached the loader as str (`Cannot convert "<class 'str'>"
    instance to a buffer`), so an encrypted key never worked; an RSA or Ed25519 key was an AttributeError."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    b = shutil.copytree(signed[0] / "artifacts/bundles" / V, tmp_path / "b")
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "enc.pem", tmp_path / "enc.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    monkeypatch.setenv(signing.PASSWORD_ENV, "s3cret")
    signing.sign(b, private)
    signing.verify(b, public)
    monkeypatch.setenv(signing.PASSWORD_ENV, "wrong")
    with pytest.raises(PipelineError, match=r"publish.signing.private_key .*enc.pem cannot be read"):
        signing.sign(b, private)
    monkeypatch.delenv(signing.PASSWORD_ENV)
    for other in (rsa.generate_private_key(public_exponent=65537, key_size=2048), ed25519.Ed25519PrivateKey.generate()):
        priv, pub = tmp_path / "other.pem", tmp_path / "other.pub.pem"
        priv.write_bytes(
            other.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        pub.write_bytes(
            other.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        for call, path, role in ((signing.sign, priv, "private_key"), (signing.verify, pub, "public_key")):
            with pytest.raises(PipelineError, match=rf"publish.signing.{role} .* is a \w+ key; only elliptic-curve"):
                call(b, path)


# Issue #47: an in-toto attestation of the whole chain, signed with the same key, checked by `verify --attestation`.


def verify_attested(bundle: Path, public: Path, cwd: Path):
    return subprocess_run([MODELPREP, "verify", str(bundle), "--public-key", str(public), "--attestation"], cwd)


def test_the_attestation_names_the_whole_chain_and_verify_prints_it(signed):
    """The bundle stage (with a signing key) writes attestation.intoto.json: a DSSE envelope over an in-toto
    Statement v1 whose subject is the bundle's digest and whose SLSA provenance v1 predicate names the code
    commit, base model, calibration and training data (by sha256), recipe, eval and gate results."""
    import base64
    import hashlib

    from pipeline.release.manifest import digest, file_table

    ws, _, public = signed
    b = ws / "artifacts/bundles" / V
    envelope = read_json(b / attestation.ATTESTATION)
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    body = json.loads(base64.b64decode(envelope["payload"]))
    assert body["_type"] == "https://in-toto.io/Statement/v1"
    assert body["predicateType"] == "https://slsa.dev/provenance/v1"
    manifest = read_json(b / "MANIFEST.json")
    assert body["subject"] == [{"name": NAME, "digest": {"sha256": manifest["bundle_digest"]}}]
    deps = {d["name"]: d for d in body["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["base-model"]["digest"]["sha256"] == digest(file_table(ws / "artifacts/models/target"))
    for name, split in (("calibration-data", "calibration"), ("training-data", "draft_train")):
        data = (ws / f"artifacts/data/{split}.jsonl").read_bytes()
        assert deps[name]["digest"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["name"] == V
    products = {p["name"]: p for p in body["predicate"]["runDetails"]["byproducts"]}
    assert products["gate"]["annotations"]["passed"] is True
    assert products["evaluation"]["annotations"]["top1_agreement"] == 0.97
    assert products["evaluation"]["digest"]["sha256"] == manifest["files"]["EVAL.json"]["sha256"]
    r = verify_attested(b, public, ws)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "attestation: in-toto Statement v1, SLSA provenance v1" in out
    assert f"bundle     {NAME} sha256:{manifest['bundle_digest']}" in out
    assert f"base-model sha256:{deps['base-model']['digest']['sha256']}" in out
    assert "calibration-data sha256:" in out and "training-data sha256:" in out
    assert "gate       passed" in out and "evaluation" in out and f"recipe     {V}:" in out


def test_an_attestation_edited_moved_or_foreign_signed_is_refused(signed, release_keys, tmp_path):
    """The attacks on the attestation: its statement edited (the gate said passed), one signed by another key,
    one attesting another bundle moved beside this one, one missing, and no key to check it with."""
    import base64

    ws, keys, public = signed
    _, private, _ = release_keys
    b = shutil.copytree(ws / "artifacts/bundles" / V, tmp_path / "b")
    good = (b / attestation.ATTESTATION).read_text()
    envelope = json.loads(good)
    body = json.loads(base64.b64decode(envelope["payload"]))
    body["predicate"]["runDetails"]["byproducts"][1]["annotations"]["passed"] = False
    envelope["payload"] = base64.b64encode(json.dumps(body).encode()).decode()
    (b / attestation.ATTESTATION).write_text(json.dumps(envelope))
    assert "its signature does not verify" in one_error_line(verify_attested(b, public, tmp_path))
    other_private, _ = keypair(keys, "attest-intruder")
    attestation.attest(b, other_private, [])  # a valid envelope, by someone else
    assert "its signature does not verify" in one_error_line(verify_attested(b, public, tmp_path))
    # another bundle's genuine attestation (same key): EVAL.json differs, so does the digest
    c = shutil.copytree(b, tmp_path / "c")
    ev = read_json(c / "EVAL.json")
    (c / "EVAL.json").write_text(json.dumps({**ev, "top1_agreement": 0.5}))
    write_manifest(c, read_json(c / "MANIFEST.json")["provenance"])
    attestation.attest(c, private, [])
    shutil.copyfile(c / attestation.ATTESTATION, b / attestation.ATTESTATION)
    line = one_error_line(verify_attested(b, public, tmp_path))
    assert "attests bundle" in line and "MANIFEST.json digest is" in line
    (b / attestation.ATTESTATION).unlink()
    assert f"has no {attestation.ATTESTATION}" in one_error_line(verify_attested(b, public, tmp_path))
    (b / attestation.ATTESTATION).write_text(good)
    assert verify_attested(b, public, tmp_path).returncode == 0
    r = subprocess_run([MODELPREP, "verify", str(b), "--attestation"], tmp_path)
    assert "--attestation needs the signing key's public half" in one_error_line(r)


def subprocess_run(argv: list[str], cwd: Path):
    import os
    import subprocess

    from tiny_project import ROOT

    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )


def test_the_base_model_digest_covers_every_file_of_the_model_directory(tmp_path):
    """Round four's own attack on the attestation: a digest made with the bundle's file table would leave out a
    model directory's own root `MANIFEST.json`, `model.sig` or `attestation.intoto.json`, so editing one of them
    would not change the attested base-model digest."""
    from pipeline.release import attestation

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.bin").write_text("w")
    hashes = tmp_path / "hashes.json"
    before = attestation.dir_input("base-model", model, hashes=hashes).sha256
    for name in ("MANIFEST.json", "model.sig", "attestation.intoto.json"):
        (model / name).write_text(name)
        after = attestation.dir_input("base-model", model, hashes=hashes).sha256
        assert after != before, name
        before = after


def test_the_base_model_digest_remembers_its_files_by_stat_and_follows_a_rewrite(tmp_path):
    """Every bundle@<variant> attests the same base model: its files' sha256 are remembered by stat (the HashCache
    `sources` keeps for a model source), so only the first bundle reads them; a file rewritten in place since (same
    size) is read again, and the digest is the one computed without any memory."""
    import hashlib
    import time

    from pipeline.models.sources import HashCache

    model, hashes = tmp_path / "model", tmp_path / "hashes.json"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "w.bin").write_bytes(b"a" * 64)
    time.sleep(0.3)  # older than a timestamp tick: a file read as it is being written is never remembered
    first = attestation.dir_input("base-model", model, hashes=hashes)
    remembered = {Path(name).name: entry[5] for name, entry in HashCache(hashes).known.items()}
    assert remembered == {
        "config.json": hashlib.sha256(b"{}").hexdigest(),
        "w.bin": hashlib.sha256(b"a" * 64).hexdigest(),
    }
    assert attestation.dir_input("base-model", model, hashes=hashes) == first
    (model / "w.bin").write_bytes(b"b" * 64)
    again = attestation.dir_input("base-model", model, hashes=hashes)
    assert again.sha256 != first.sha256
    assert again == attestation.dir_input("base-model", model, hashes=None)
