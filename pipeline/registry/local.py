"""Embedded filesystem registry: registry/<name>/<version>/ with an index and a `latest` alias.

Versions are immutable: publishing different content under an existing version is refused.
Publishing the identical bundle again copies nothing but moves `latest` back to it, so re-running
the pipeline is idempotent and a rollback (params back to an earlier build) re-points `latest`.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.io import atomic_dir, atomic_write_text, read_json, write_json
from pipeline.manifest import MANIFEST, verify
from pipeline.registry import already_published, check_version

INDEX = "index.json"


def read_index(root: Path) -> dict:
    return read_json(root / INDEX) if (root / INDEX).exists() else {"models": {}}


def publish(bundle: Path, name: str, version: str, tags: dict, cfg: dict) -> dict:
    check_version(version)
    root = Path(cfg["registry_dir"])
    manifest = verify(bundle)
    dest = root / name / version
    index = read_index(root)
    entry = index["models"].setdefault(name, {"versions": {}})
    existing = read_json(dest / MANIFEST)["bundle_digest"] if dest.exists() else None
    if already_published(name, version, existing, manifest["bundle_digest"], str(root)):
        status = "already published"
    else:
        with atomic_dir(dest) as tmp:
            shutil.copytree(bundle, tmp, dirs_exist_ok=True)
        status = "published"
    # An existing version keeps its first record; one copied but never indexed (crash) gets indexed now.
    entry["versions"].setdefault(version, {"bundle_digest": manifest["bundle_digest"], "tags": tags,
                                           "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    entry["latest"] = version
    write_json(root / INDEX, index)
    atomic_write_text(root / name / "latest", version + "\n")
    return {"name": name, "version": version, "uri": str(dest), "status": status}


def resolve(root: str | Path, name: str, version: str = "latest") -> Path:
    root = Path(root)
    entry = read_index(root)["models"].get(name)
    if entry is None:
        raise PipelineError(f"no model {name!r} in registry {root}")
    version = entry["latest"] if version == "latest" else version
    if version not in entry["versions"]:
        raise PipelineError(f"{name} has no version {version!r} in registry {root}")
    return root / name / version
