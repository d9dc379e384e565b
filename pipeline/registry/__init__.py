"""Registries that bundles are published to; each backend exposes publish(bundle, name, version, tags)."""
from __future__ import annotations

from pipeline.errors import PipelineError

BACKENDS = ("local", "mlflow", "hf")


def get_backend(name: str):
    if name == "local":
        from pipeline.registry import local
        return local
    if name == "mlflow":
        from pipeline.registry import mlflow_registry
        return mlflow_registry
    if name == "hf":
        from pipeline.registry import hf
        return hf
    raise PipelineError(f"unknown registry backend {name!r}; choose one of {', '.join(BACKENDS)}")
