"""Registries that bundles are published to.

Each backend exposes publish(bundle, name, version, tags, cfg) -> {name, version, uri, status}, where
cfg is params.yaml's `publish` section (PublishParams). Every backend verifies the bundle first and keeps versions
immutable: the same content again is "already published", different content is refused.
"""
from __future__ import annotations

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
