"""Registries that bundles are published to.

Each backend exposes publish(bundle, name, version, tags, cfg) -> {name, version, uri, status}, where
cfg is params.yaml's `publish` section (PublishParams). Every backend verifies the bundle first and keeps versions
immutable: the same content again is "already published", different content is refused.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.names import check_name, check_version  # noqa: F401 - the backends' checks, defined with the other names

BACKENDS = ("local", "mlflow", "hf")


def get_backend(name: str):
    if name == "local":
        from pipeline.release.registry import local
        return local
    if name == "mlflow":
        from pipeline.release.registry import mlflow_registry
        return mlflow_registry
    if name == "hf":
        from pipeline.release.registry import hf
        return hf
    raise PipelineError(f"unknown registry backend {name!r}; choose one of {', '.join(BACKENDS)}")


def already_published(name: str, version: str, existing_digest: str | None, digest: str, where: str) -> bool:
    """True when `version` already holds this exact bundle; refuses different content under it."""
    if existing_digest is None:
        return False
    if existing_digest != digest:
        raise PipelineError(f"{name} version {version} already exists in {where} with different content; "
                            "versions are immutable, publish under a new version")
    return True


def first_line(error: BaseException) -> str:
    """A backend's exception as one line (MLflow and HTTP errors can span many)."""
    text = str(getattr(error, "message", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_stored_signature(stored: bytes | None, bundle: Path, public_key: str | None, name: str, version: str,
                           where: str) -> None:
    """A remote registry's "already published" is decided by the digest, and the signature is outside it: with
    publish.signing.public_key set, the stored copy's model.sig (None: it has none) must verify with that key over
    this same content, else the version is refused, never reported as published (issue #47). Remote versions are
    not re-signed in place: publish under a new version."""
    if not public_key:
        return
    from pipeline.release import signing

    problem = "is unsigned" if stored is None else None
    if stored is not None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / signing.SIGNATURE
            copy.write_bytes(stored)
            try:
                signing.verify(bundle, public_key, signature=copy)
            except PipelineError:
                problem = f"is signed with another key than {public_key}"
    if problem:
        raise PipelineError(f"{name} version {version} in {where} holds this content but {problem}; "
                            "publish.signing.public_key asks for a signature it can't be given there: "
                            "publish under a new version (publish.version)")
