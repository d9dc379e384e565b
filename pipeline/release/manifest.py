"""MANIFEST.json: sha256 and size of every file in a bundle, plus provenance; and verification."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Iterator

from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json

MANIFEST = "MANIFEST.json"
SHA256_HEX = frozenset("0123456789abcdef")
MAX_DEPTH = 64  # directories below a bundle's root; real bundles are 2-3 levels deep


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _regular_files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every file under root, never following a link. A symlink could
    point outside the bundle and a fifo or socket has no content to hash, so both are refused.
    Walked with a stack, not recursion: 1,200 nested directories were a RecursionError (issue #47); deeper than
    MAX_DEPTH is one line (what reads the bundle next, model-signing's hashing and copytree, recurse)."""
    pending = [""]
    while pending:
        rel = pending.pop()
        if rel.count("/") + 1 > MAX_DEPTH:
            raise PipelineError(
                f"{root}: {rel.split('/')[0]}/... is nested more than {MAX_DEPTH} directories deep; "
                "a bundle is a few levels deep"
            )
        subdirs = []
        with os.scandir(root / rel if rel else root) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    raise PipelineError(f"{root}: {name} is a symlink; bundles hold only regular files")
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(name)
                elif entry.is_file(follow_symlinks=False):
                    yield name, entry.stat(follow_symlinks=False)
                else:
                    raise PipelineError(f"{root}: {name} is not a regular file (fifo, socket or device)")
        pending.extend(reversed(subdirs))


SIGNATURE = "model.sig"  # pipeline/release/signing.py: it signs the manifest, so the manifest can't list it
ATTESTATION = "attestation.intoto.json"  # pipeline/release/attestation.py: it names the digest, likewise


def file_table(root: Path) -> dict[str, dict]:
    """Every file but the root MANIFEST.json (and the root signature and attestation); a nested one would vouch
    for files it shouldn't."""
    table = {}
    for name, st in _regular_files(Path(root)):
        if name in (MANIFEST, SIGNATURE, ATTESTATION):
            continue
        if PurePosixPath(name).name == MANIFEST:
            raise PipelineError(f"{root}: nested {name}; a bundle has one MANIFEST.json, at its root")
        table[name] = {"sha256": sha256_file(Path(root) / name), "size": st.st_size}
    return table


def digest(files: dict[str, dict]) -> str:
    """One hash for the whole bundle content (names and file hashes)."""
    return hashlib.sha256("".join(f"{k}\0{v['sha256']}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def write_manifest(root: Path, provenance: dict) -> dict:
    files = file_table(root)
    manifest = {"bundle_digest": digest(files), "files": files, "provenance": provenance}
    write_json(root / MANIFEST, manifest)
    return manifest


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= SHA256_HEX


def _safe_entry(name: str) -> bool:
    """A relative path inside the bundle: not absolute, no '..', '.' or empty parts."""
    return not name.startswith("/") and not any(p in ("", ".", "..") for p in name.split("/"))


def _entry_problem(name: str, entry) -> str | None:
    if not _safe_entry(name):
        return f"unsafe path {name!r} (absolute or with '..')"
    if not isinstance(entry, dict) or not _is_sha256(entry.get("sha256")) or type(entry.get("size")) is not int:
        return f"entry {name!r} needs a sha256 (64 hex digits) and an integer size"
    return None


def load_manifest(root: Path) -> dict:
    """The root MANIFEST.json, checked for shape; a malformed one is one line naming the file."""
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise PipelineError(f"{root} has no {MANIFEST}; not a bundle")
    if not stat.S_ISREG(path.lstat().st_mode):
        raise PipelineError(f"{path} is not a regular file")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise PipelineError(f"{path} is not valid JSON ({e})") from None
    except RecursionError:
        raise PipelineError(f"{path} is malformed: JSON nested too deeply") from None
    if (
        not isinstance(manifest, dict)
        or not _is_sha256(manifest.get("bundle_digest"))
        or not isinstance(manifest.get("files"), dict)
    ):
        raise PipelineError(f"{path} is malformed: needs a bundle_digest (sha256) and a files object")
    for name, entry in manifest["files"].items():
        problem = _entry_problem(name, entry)
        if problem:
            raise PipelineError(f"{path} is malformed: {problem}")
    return manifest


def verify(root: str | Path) -> dict:
    """Re-hash every file and the digest; raise PipelineError naming the first problem."""
    root = Path(root)
    try:
        manifest = load_manifest(root)
        actual = file_table(root)
    except OSError as e:
        raise PipelineError(f"{root}: cannot read {e.filename or root}: {e.strerror or e}") from None
    expected = manifest["files"]
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            raise PipelineError(f"{root}: missing file {name}")
        if name not in expected:
            raise PipelineError(f"{root}: unexpected file {name} (not in the manifest)")
        if actual[name]["sha256"] != expected[name]["sha256"]:
            raise PipelineError(f"{root}: sha256 mismatch for {name}")
        if actual[name]["size"] != expected[name]["size"]:
            raise PipelineError(f"{root}: size mismatch for {name}")
    # The digest is what registries publish under: an edited one must not pass for these files.
    if digest(actual) != manifest["bundle_digest"]:
        raise PipelineError(f"{root}: bundle_digest in {MANIFEST} does not match its files")
    return manifest
