"""The registry name, variant and version a bundle is built for, inside the bundle (PROVENANCE.json's `release`).

The signature covers every file, so with signing on a bundle carries a signed statement of where it may be
published: copied under another model's name (a signed gptq-w4a16 version put into `<name>-bf16/`) or another
version, it is refused by publish and by registry resolution (issue #47). PROVENANCE.json is in the manifest, so
the binding is also part of the bundle's digest: the same weights built for two names are two versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json

PROVENANCE = "PROVENANCE.json"  # pipeline/release/bundle.py writes it
RELEASE = "release"
AUTO = "auto"  # publish.version auto: the version is the bundle's digest (first 12 hex digits)


@dataclass(frozen=True)
class Binding:
    name: str  # the registry model name
    variant: str
    version: str  # publish.version as set: AUTO, or an explicit version

    def as_record(self) -> dict:
        return {"name": self.name, "variant": self.variant, "version": self.version}

    def version_for(self, digest: str) -> str:
        return digest[:12] if self.version == AUTO else self.version


def read_binding(bundle: Path) -> Binding | None:
    """The bundle's binding; None when its PROVENANCE.json has none (a bundle built before there was one)."""
    path = Path(bundle) / PROVENANCE
    record = read_json(path).get(RELEASE) if path.is_file() else None
    if record is None:
        return None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("name", "variant", "version")):
        raise PipelineError(f"{path}: `{RELEASE}` must hold the name, variant and version strings it was built for")
    return Binding(record["name"], record["variant"], record["version"])


def check_binding(bundle: Path, name: str, version: str, digest: str, required: bool) -> Binding | None:
    """The bundle was built for registry name `name`, version `version` (digest: its bundle_digest, which an auto
    version must start); one line naming the difference. required: refuse a bundle with no binding (signing on:
    an old signed bundle must not be movable between names either)."""
    binding = read_binding(bundle)
    if binding is None:
        if required:
            raise PipelineError(
                f"{bundle}: {PROVENANCE} names no registry name and version it was built for (built "
                "before bundles carried one); rebuild it (`dvc repro`) and publish it again"
            )
        return None
    if binding.name != name:
        raise PipelineError(
            f"{bundle} was built for {binding.name}, not {name}: a bundle is valid only under the name it was built for"
        )
    if not name.endswith(f"-{binding.variant}"):
        raise PipelineError(f"{bundle}: its variant {binding.variant} does not match the name {name}")
    if binding.version_for(digest) != version:
        raise PipelineError(f"{bundle} was built for version {binding.version_for(digest)} of {name}, not {version}")
    return binding
