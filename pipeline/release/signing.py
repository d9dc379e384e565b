"""Signed bundles: the OpenSSF model-signing format (`model-signing` on PyPI, a Sigstore bundle over every file).

MANIFEST.json proves a bundle is intact, not who made it: whoever can write a bundle can edit EVAL.json and
write a new manifest, and a top-1 of 0.12 would then publish as passed. With `publish.signing.private_key` the
bundle stage signs the finished bundle (every file, MANIFEST.json and the card included) into `model.sig`;
with `publish.signing.public_key`, publish, `modelprep verify` and registry resolution refuse a bundle that is
unsigned or signed by another key. The signature is not in the manifest (it signs the manifest), so a bundle's
digest, its registry version, is the same signed or not. Elliptic-curve keys only (PEM; RSA and Ed25519 are refused
in one line); a key's password, where it has one, comes from MODELPREP_SIGNING_KEY_PASSWORD, never from params.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.release.manifest import ATTESTATION, SIGNATURE  # the manifest leaves both out: one name each

PASSWORD_ENV = "MODELPREP_SIGNING_KEY_PASSWORD"
KEY_HASHES = paths.SIGNING_KEYS  # a dep of bundle and publish


def _hashing():
    from model_signing import hashing

    # Every file, .git-like names too: nothing in a bundle is exempt but the signature itself and the attestation
    # (signed on its own, with the same key: pipeline/release/attestation.py).
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE, ATTESTATION], ignore_git_paths=False)


def _key(path: str | Path, what: str) -> Path:
    key = Path(path)
    if not key.is_file():
        raise PipelineError(f"publish.signing.{what} {key} not found")
    return key


def key_identities(private_key: str | None, public_key: str | None) -> dict:
    """sha256 of each configured key file (None where unset): the `sources` stage writes it to
    artifacts/signing-keys.json, a dependency of bundle and publish, so that a key changed in place re-signs and
    re-publishes (its path in params.yaml alone does not change; issue #47). A hash of a key file reveals nothing
    of the key."""
    from pipeline.core.io import file_sha256

    return {
        role: None if key is None else {"file_sha256": file_sha256(_key(key, role))}
        for role, key in (("private_key", private_key), ("public_key", public_key))
    }


def _password() -> bytes | None:
    """MODELPREP_SIGNING_KEY_PASSWORD as the bytes cryptography's loader takes (model-signing passes it on as is:
    a str failed with `Cannot convert "<class 'str'>" instance to a buffer`, issue #47)."""
    password = os.environ.get(PASSWORD_ENV)
    return password.encode() if password else None


def check_key_type(path: Path, what: str) -> None:
    """Only elliptic-curve keys are supported (model-signing's key signer); an RSA or Ed25519 key is one line
    naming its type, not an AttributeError about `curve`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = path.read_bytes()
    try:
        key = (
            serialization.load_pem_public_key(data)
            if what == "public_key"
            else serialization.load_pem_private_key(data, _password())
        )
    except (ValueError, TypeError) as e:  # not PEM, or a wrong or missing password
        raise PipelineError(f"publish.signing.{what} {path} cannot be read: {str(e).splitlines()[0][:160]}") from None
    except Exception as e:  # noqa: BLE001 - cryptography's UnsupportedAlgorithm and the like
        raise PipelineError(f"publish.signing.{what} {path} cannot be read: {type(e).__name__}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        raise PipelineError(
            f"publish.signing.{what} {path} is a {type(key).__name__.lstrip('_')} key; only "
            "elliptic-curve (EC, e.g. P-256) keys are supported"
        )


def sign(bundle: Path, private_key: str | Path) -> None:
    import model_signing

    key = _key(private_key, "private_key")
    check_key_type(key, "private_key")
    try:
        model_signing.signing.Config().use_elliptic_key_signer(
            private_key=key, password=_password()
        ).set_hashing_config(_hashing()).sign(bundle, bundle / SIGNATURE)
    except (ValueError, TypeError) as e:  # a key that is not an EC private key, or a wrong password
        raise PipelineError(f"signing {bundle} with {key} failed: {str(e).splitlines()[0][:200]}") from None


def verify(bundle: Path, public_key: str | Path, signature: Path | None = None) -> None:
    """One line when the bundle is unsigned, or its files or signer don't match the signature (the bundle's
    model.sig, or another copy of it: a remote registry's stored one)."""
    import model_signing

    key = _key(public_key, "public_key")
    check_key_type(key, "public_key")
    signature = Path(bundle) / SIGNATURE if signature is None else signature
    if not signature.is_file() or signature.is_symlink():
        raise PipelineError(f"{bundle} is not signed ({SIGNATURE} missing) and publish.signing.public_key is set")
    try:
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key).set_hashing_config(
            _hashing()
        ).verify(bundle, signature)
    except Exception as e:  # noqa: BLE001 - model-signing raises ValueError, sigstore its own errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(f"{bundle}: its signature does not verify with {key}: {first[:160]}") from None
