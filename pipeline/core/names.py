"""Names that become paths: variant names (artifacts/<stage>/<variant>), registry model names and
versions (registry/<name>/<version>, MLflow filter strings, Hub repos and tags). Checked before
anything is written, so '../x' or 'org/x' never lands outside its place."""

from __future__ import annotations

import re

from pipeline.core.errors import PipelineError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
VARIANT_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise PipelineError(
            f"invalid model name {name!r}: use up to 128 letters, digits, '.', '_' and '-' (no '/' or '..')"
        )


def check_version(version: str) -> None:
    if version == "latest":
        raise PipelineError("publish version 'latest' is reserved for the alias; choose another")
    if not NAME_PATTERN.fullmatch(version) or ".." in version:
        raise PipelineError(f"invalid publish version {version!r}: use letters, digits, '.', '_' and '-'")


def check_variant_name(name) -> None:
    if not isinstance(name, str) or not VARIANT_PATTERN.fullmatch(name) or ".." in name:
        raise PipelineError(
            f"quantize.variants: invalid variant name {name!r} (lowercase letters, digits, '.', "
            "'_' and '-'; it becomes a directory name)"
        )


def registry_name(serving_name: str, variant: str) -> str:
    """A variant's registry name, `<serving.name>-<variant>`: what it is published and served under."""
    return f"{serving_name}-{variant}"
