"""Signed bundles: the OpenSSF model-signing format (`model-signing` on PyPI, a Sigstore bundle over every file).

MANIFEST.json proves a bundle is intact, not who made it: whoever can write a bundle can edit EVAL.json and
write a new manifest, and a top-1 of 0.12 would then publish as passed. With `publish.signing.private_key` the
bundle stage signs the finished bundle (every file, MANIFEST.json and the card included) into `model.sig`;
with `publish.signing.public_key`, publish, `modelprep verify` and registry resolution refuse a bundle that is
unsigned or signed by another key. The signature is not in the manifest (it signs the manifest), so a bundle's
digest, its registry version, is the same signed or not. Elliptic-curve keys (PEM); a key's password, where
it has one, comes from MODELPREP_SIGNING_KEY_PASSWORD, never from params.
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.release.manifest import SIGNATURE  # the manifest leaves it out: the one name for both
PASSWORD_ENV = "MODELPREP_SIGNING_KEY_PASSWORD"


def _hashing():
    from model_signing import hashing

    # Every file, .git-like names too: nothing in a bundle is exempt but the signature itself.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE], ignore_git_paths=False)


def _key(path: str | Path, what: str) -> Path:
    key = Path(path)
    if not key.is_file():
        raise PipelineError(f"publish.signing.{what} {key} not found")
    return key


def sign(bundle: Path, private_key: str | Path) -> None:
    import model_signing

    key = _key(private_key, "private_key")
    try:
        model_signing.signing.Config().use_elliptic_key_signer(
            private_key=key, password=os.environ.get(PASSWORD_ENV)).set_hashing_config(_hashing()).sign(
            bundle, bundle / SIGNATURE)
    except (ValueError, TypeError) as e:  # a key that is not an EC private key, or a wrong password
        raise PipelineError(f"signing {bundle} with {key} failed: {str(e).splitlines()[0][:200]}") from None


def verify(bundle: Path, public_key: str | Path) -> None:
    """One line when the bundle is unsigned, or its files or signer don't match the signature."""
    import model_signing

    key = _key(public_key, "public_key")
    signature = Path(bundle) / SIGNATURE
    if not signature.is_file() or signature.is_symlink():
        raise PipelineError(f"{bundle} is not signed ({SIGNATURE} missing) and publish.signing.public_key is set")
    try:
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key).set_hashing_config(
            _hashing()).verify(bundle, signature)
    except Exception as e:  # noqa: BLE001 - model-signing raises ValueError, sigstore its own errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(f"{bundle}: its signature does not verify with {key}: {first[:160]}") from None

