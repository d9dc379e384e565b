"""MANIFEST.json: sha256 and size of every file in a bundle, plus provenance; and verification."""
from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.io import read_json, write_json

MANIFEST = "MANIFEST.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_table(root: Path) -> dict[str, dict]:
    return {str(p.relative_to(root)): {"sha256": sha256_file(p), "size": p.stat().st_size}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def digest(files: dict[str, dict]) -> str:
    """One hash for the whole bundle content (names and file hashes)."""
    return hashlib.sha256("".join(f"{k}\0{v['sha256']}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def write_manifest(root: Path, provenance: dict) -> dict:
    files = file_table(root)
    manifest = {"bundle_digest": digest(files), "files": files, "provenance": provenance}
    write_json(root / MANIFEST, manifest)
    return manifest


def verify(root: str | Path) -> dict:
    """Re-hash every file; raise PipelineError naming the first problem."""
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise PipelineError(f"{root} has no {MANIFEST}; not a bundle")
    manifest = read_json(root / MANIFEST)
    actual = file_table(root)
    expected = manifest["files"]
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            raise PipelineError(f"{root}: missing file {name}")
        if name not in expected:
            raise PipelineError(f"{root}: unexpected file {name} (not in the manifest)")
        if actual[name]["sha256"] != expected[name]["sha256"]:
            raise PipelineError(f"{root}: sha256 mismatch for {name}")
    return manifest
