"""Embedded filesystem registry: registry/<name>/<version>/ with an index and a `latest` alias.

Versions are immutable: publishing different content under an existing version is refused, and an
existing version directory is never replaced or deleted. Publishing the identical bundle again
copies nothing, so re-running the pipeline is idempotent; when that version is not `latest`, it would move
`latest` back to an older build, which is refused unless publish.allow_rollback says so (issue #47).
A stored version whose signature does not satisfy publish.signing.public_key (published unsigned, or
under an older key) gets the new bundle's verified signature; its content, the digest, is the same.

A publish holds an exclusive flock on registry/.lock from the existence check to the index update.
The copy goes to a private temp dir, is verified, made team-readable, then renamed into place.
The registry does not trust its own copies: a stored version is re-verified before it is reused
or resolved, including against the digest the index recorded for it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.release.binding import check_binding
from pipeline.release.manifest import verify
from pipeline.release.registry import already_published, check_name, check_version
from pipeline.release.settings import PublishParams

INDEX = "index.json"
LATEST = "latest"
LOCK = ".lock"
FILE_MODE, DIR_MODE = 0o644, 0o755  # a team shares the registry: everyone reads what one publishes


def read_index(root: str | Path) -> dict:
    path = Path(root) / INDEX
    if not path.exists():
        # A registry with versions but no index would read as empty (and a publish would start a new index over
        # them): one line instead (issue #47).
        stored = sorted(p.parent.name for p in Path(root).glob(f"*/{LATEST}"))
        if stored:
            raise PipelineError(f"registry index {path} is missing although the registry holds {', '.join(stored[:3])}"
                                f"{' ...' if len(stored) > 3 else ''}; restore it from a backup")
        return {"models": {}}
    try:
        index = json.loads(path.read_bytes())
    except OSError as e:
        raise PipelineError(f"cannot read registry index {path}: {e.strerror}") from None
    except ValueError as e:  # bad JSON and bad UTF-8 alike
        raise PipelineError(f"registry index {path} is corrupt ({e})") from None
    except RecursionError:
        raise PipelineError(f"registry index {path} is corrupt (JSON nested too deeply)") from None
    if not _well_formed(index):
        raise PipelineError(f"registry index {path} is corrupt: expected "
                            '{"models": {name: {"latest": version, "versions": {version: record}}}}')
    return index


def _well_formed(index) -> bool:
    models = index.get("models") if isinstance(index, dict) else None
    return isinstance(models, dict) and all(
        isinstance(e, dict) and isinstance(e.get("latest"), str) and isinstance(e.get("versions"), dict)
        and all(isinstance(r, dict) and isinstance(r.get("bundle_digest"), str) for r in e["versions"].values())
        for e in models.values())


def publish(bundle: Path, name: str, version: str, tags: dict, cfg: PublishParams) -> dict:
    check_name(name)
    check_version(version)
    if name == INDEX:
        raise PipelineError(f"model name {INDEX!r} is taken by the local registry's index; choose another")
    root = Path(cfg.registry_dir)
    if root.resolve() == Path(bundle).resolve() or Path(bundle).resolve() in root.resolve().parents:
        raise PipelineError(f"publish.registry_dir {root} is inside the bundle {bundle}: publishing would copy the "
                            "registry into itself; put the registry elsewhere")
    digest = verify(bundle)["bundle_digest"]
    try:
        with _locked(root):
            status = _store(root, Path(bundle), name, version, digest, tags, cfg)
    except OSError as e:  # disk full, permissions, ...: one line naming the path
        raise PipelineError(f"local registry {root}: {_describe(e)}") from None
    return {"name": name, "version": version, "uri": str(root / name / version), "status": status}


@contextlib.contextmanager
def _locked(root: Path):
    """Exclusive across processes; across hosts only where the filesystem honours flock."""
    _make_dir(root)
    path = root / LOCK
    # flock needs no write access, so a team member can lock a file another one created. O_NOFOLLOW: a lock
    # that is a link would have this process create or chmod a file outside the registry.
    created = True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        created = False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise PipelineError(f"local registry lock {path} is a symbolic link or unreadable ({_describe(e)}); "
                                "remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PipelineError(f"local registry lock {path} is not a regular file; remove it")
        if created:  # never chmod a lock another process or person made
            os.fchmod(fd, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _store(root: Path, bundle: Path, name: str, version: str, digest: str, tags: dict, cfg: PublishParams) -> str:
    """Under the lock: reuse a verified stored version or install a new one; index it; move `latest`.
    Transactional against a full disk: the version's copy, the new index and the new `latest` are all written
    to temp files first, then renamed into place (renames take no space); a write that fails removes what was
    written, so no version is left unindexed and no index without its `latest` (issue #47)."""
    index = read_index(root)
    dest = root / name / version
    entry = index["models"].setdefault(name, {"versions": {}})
    record = {"bundle_digest": digest, "tags": tags,
              "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    stored = _verified(root, index, name, version)["bundle_digest"] if os.path.lexists(dest) else None
    copy = None
    if already_published(name, version, stored, digest, str(root)):
        _refuse_rollback(entry, name, version, cfg)
        status = "already published"
        entry["versions"].setdefault(version, record)  # indexes a version a crash left unindexed
        if cfg.signing.public_key and _resign(bundle, dest, cfg.signing.public_key):
            status = "already published, signature replaced"
    else:
        copy = _stage_copy(bundle, dest, digest)
        status = "published"
        entry["versions"][version] = record
    entry["latest"] = version
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in ((root / INDEX, json.dumps(index, indent=2) + "\n"), (root / name / LATEST, version + "\n")):
            staged.append((_stage_text(path, text), path))
        if copy is not None:
            os.rename(copy, dest)  # dest is absent: checked under the lock
            copy = None
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return status


def _refuse_rollback(entry: dict, name: str, version: str, cfg: PublishParams) -> None:
    """An indexed version that is not `latest` is an older build: moving `latest` back to it must be asked for."""
    latest = entry.get("latest")
    if version in entry["versions"] and latest not in (None, version) and not cfg.allow_rollback:
        raise PipelineError(f"{name} version {version} is already published and {latest} is latest: publishing it "
                            "again would move latest back to it; set publish.allow_rollback: true to roll back")


def _resign(bundle: Path, dest: Path, public_key: str) -> bool:
    """Give a stored version the bundle's signature when its own does not verify with public_key (it was published
    unsigned or under another key): the same content, so the same version, now signed as the policy asks. The
    bundle's signature is verified first; the swap is one rename. True when replaced."""
    from pipeline.release import attestation, signing
    from pipeline.release.manifest import ATTESTATION

    try:
        signing.verify(dest, public_key)
        return False
    except PipelineError:
        pass
    signing.verify(bundle, public_key)  # the new signature satisfies the policy, or nothing is changed
    names = [signing.SIGNATURE]
    if os.path.lexists(bundle / ATTESTATION):  # the attestation is signed by the same key: it goes with it
        attestation.check(bundle, public_key)
        names.append(ATTESTATION)
    staged = {name: dest / f".{name}.staged" for name in names}
    try:
        for name, path in staged.items():  # every copy written before any rename (a full disk changes nothing)
            shutil.copyfile(bundle / name, path)
            os.chmod(path, FILE_MODE)
        for name, path in staged.items():
            os.replace(path, dest / name)
        if ATTESTATION not in names:  # one by the old key would contradict the new signature
            with contextlib.suppress(FileNotFoundError):
                (dest / ATTESTATION).unlink()
    finally:
        for path in staged.values():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    signing.verify(dest, public_key)
    return True


def _stage_copy(bundle: Path, dest: Path, digest: str) -> Path:
    """The bundle copied into a private temp dir beside dest, verified and made readable; the caller renames it
    into place (never a partial version) or removes it."""
    _make_dir(dest.parent)
    for stale in dest.parent.glob(".*.tmp-*"):  # killed publishes' of any version; under the lock none is live
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        shutil.copytree(bundle, tmp, symlinks=True, dirs_exist_ok=True)  # a link is copied as one, then refused
        if verify(tmp)["bundle_digest"] != digest:
            raise PipelineError(f"{bundle} changed while it was being published; publish it again")
        _share(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _share(tree: Path) -> None:
    """copytree keeps the source's modes and mkdtemp makes 0700; published is 0644 files, 0755 dirs.
    Safe to follow paths: tree was verified link-free and is still private (0700) until here."""
    os.chmod(tree, DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(tree):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), DIR_MODE)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), FILE_MODE)


def _make_dir(path: Path) -> None:
    """mkdir honours the umask; a directory this creates is 0755 whatever the umask."""
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)


def _stage_text(path: Path, text: str) -> Path:
    """text in a temp file beside path, 0644, flushed to disk; the caller renames it over path. The staging name is
    fixed: only the lock holder writes here. A failed write (a full disk) names path: write() errors carry none."""
    staged = path.with_name(f".{path.name}.staged")
    try:
        with contextlib.suppress(FileNotFoundError):  # a killed publish's, maybe a teammate's: under the lock, stale
            staged.unlink()
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
        try:
            with os.fdopen(fd, "w") as f:
                fd = None
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        finally:
            if fd is not None:
                os.close(fd)
        os.chmod(staged, FILE_MODE)  # O_CREAT honours the umask
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
        raise OSError(e.errno, f"writing {path.name} failed: {e.strerror}", str(path)) from None
    return staged


def _describe(e: OSError) -> str:
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list):
        src, dst, why = e.args[0][0]  # copytree gathers every file's failure; the first is enough
        return f"copying {src} to {dst} failed: {why}"
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p)
    return f"{e.strerror or e}: {paths}" if paths else str(e.strerror or e)


def _verified(root: Path, index: dict, name: str, version: str) -> dict:
    """A stored version's manifest after re-hashing it and matching the digest the index recorded."""
    dest = root / name / version
    recorded = index["models"].get(name, {}).get("versions", {}).get(version, {}).get("bundle_digest")
    try:
        if dest.is_symlink():
            raise PipelineError(f"{dest} is a symlink")
        manifest = verify(dest)
        if recorded not in (None, manifest["bundle_digest"]):
            raise PipelineError(f"its digest differs from the one the index recorded ({recorded[:12]})")
    except PipelineError as e:
        raise PipelineError(f"stored {name} version {version} in {_registry(root)} fails verification: {e}") from None
    return manifest


def _registry(root: Path) -> str:
    """'the local registry at registry/': the directory named as one (publish.registry_dir is `registry` by default,
    and "in registry registry" read as a typo)."""
    return f"the local registry at {root.as_posix().rstrip('/')}/"


def resolve(root: str | Path, name: str, version: str = "latest", public_key: str | Path | None = None) -> Path:
    """A stored version's directory (`latest` as the index has it), verified before it is handed out (and its
    signature checked against public_key, when given)."""
    check_name(name)
    root = Path(root)
    index = read_index(root)
    entry = index["models"].get(name)
    if entry is None:
        raise PipelineError(f"no model {name!r} in {_registry(root)}")
    version = entry["latest"] if version == "latest" else version
    check_version(version)
    if version not in entry["versions"]:
        raise PipelineError(f"{name} has no version {version!r} in {_registry(root)}")
    manifest = _verified(root, index, name, version)
    if public_key is not None:
        from pipeline.release import signing

        signing.verify(root / name / version, public_key)
        # A signed bundle built for another name or version (copied in, `latest` pointed at it) is refused (issue
        # #47). Unsigned, whoever can write the registry can rewrite the binding too: only the signature makes it one.
        check_binding(root / name / version, name, version, manifest["bundle_digest"], required=True)
    return root / name / version


def resolve_ref(ref: str, registry_dir: str | Path, public_key: str | Path | None = None) -> Path:
    """`<name>@<version>` or `<name>@latest` -> that version's directory in registry_dir, verified."""
    name, at, version = ref.rpartition("@")
    if not at:
        raise PipelineError(f"{ref!r} is not a registry reference (<name>@<version> or <name>@latest)")
    return resolve(registry_dir, name, version, public_key)
