"""Atomic writes: an artifact is either complete or absent, never half-written."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory beside `final`; on success it replaces `final` (renamed in, then the
    old one deleted), readable as any file the user makes (share_modes). Temp directories of killed runs
    are removed when the next run starts."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(final), dir=final.parent))
    try:
        yield tmp
        share_modes(tmp)
        swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def share_modes(tree: Path) -> None:
    """The modes a file or directory the user creates gets (0644 / 0755 under the usual umask 022), for everything
    in tree: mkdtemp makes the directory 0700, and safetensors 0.8 writes weights 0600 (its save is a temp file
    renamed in), which copytree then carries into quantized variants and bundles. Each gets exactly what the umask
    allows (an executable keeps its x bits); links are left alone, and so is a file with other hard links (a
    model's weights linked from the user's own directory keep that file's mode: never chmod someone else's file)."""
    mask = _umask()
    for path in [tree, *tree.rglob("*")]:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
            continue
        executable = stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111
        want = (0o777 if executable else 0o666) & ~mask
        if stat.S_IMODE(st.st_mode) != want:
            os.chmod(path, want)


def write_skipped(final: str | os.PathLike, reason: str) -> None:
    """A stage that made nothing: `final` (its DVC output, which must exist) holds only skipped.json saying why."""
    with atomic_dir(final) as tmp:
        write_json(tmp / "skipped.json", {"skipped": reason})


def swap_in(new: Path, final: Path) -> None:
    """Old aside, new in, old deleted: an interruption leaves one of them at `final`, never neither.
    The aside carries the temp prefix, so a run killed before deleting it is cleaned up later."""
    if not os.path.lexists(final):
        new.rename(final)
        return
    aside = new.with_name(new.name + "-old")
    final.rename(aside)
    try:
        new.rename(final)
    except BaseException:
        aside.rename(final)
        raise
    remove(aside)


def temp_prefix(final: Path) -> str:
    """The writer's pid is in the name so that a later run can tell its leftovers from live work."""
    return f".{final.name}.tmp-{os.getpid()}-"


def remove_stale_temps(final: Path) -> None:
    """Delete temp siblings of `final` whose creating process is gone (killed mid-stage)."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.tmp-(\d{{1,9}})-")  # 1-9 digits: fits os.kill
    for sibling in final.parent.iterdir():
        m = pattern.match(sibling.name)
        if m and not pid_alive(int(m.group(1))):
            remove(sibling)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    return True


def remove(path: Path) -> None:
    """Delete a file, link or directory; one already gone (another run cleaning up) is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; an artifact is as readable as any file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike):
    return json.loads(Path(path).read_text())


def write_sealed_json(path: str | os.PathLike, body: dict) -> None:
    """A cache file that carries the sha256 of its own body: read_sealed_json refuses one that was truncated or
    edited. Atomic, so concurrent writers leave one complete file (the last), never a mix."""
    write_json(path, {"sha256": _seal(body), "body": body})


def read_sealed_json(path: str | os.PathLike) -> dict:
    """The body write_sealed_json wrote. FileNotFoundError when there is none; ValueError, saying why, when the
    file is not one or its body no longer matches its sha256. A checksum, not a signature: it catches corruption
    and hand edits, not a writer who recomputes it (who could as well rewrite the outputs the cache feeds)."""
    try:
        sealed = json.loads(Path(path).read_bytes())
        if not isinstance(sealed, dict) or set(sealed) != {"sha256", "body"} or not isinstance(sealed["body"], dict):
            raise ValueError("not a sealed cache file")
        intact = sealed["sha256"] == _seal(sealed["body"])
    except FileNotFoundError:
        raise
    except (OSError, RecursionError, UnicodeDecodeError, json.JSONDecodeError) as e:  # nested past the parser too
        raise ValueError(f"not readable as JSON ({type(e).__name__})") from None
    if not intact:
        raise ValueError("its checksum does not match its content (edited or corrupted)")
    return sealed["body"]


def _seal(body: dict) -> str:
    """sha256 of the body's canonical JSON (sorted keys, no spaces): the same body always seals alike."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_csv(path: str | os.PathLike, rows: list[dict], fieldnames: list[str] | None = None) -> None:
    """fieldnames: the header when rows may be empty (a header-only file is still a valid plot)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames or list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def file_sha256(path: Path) -> str:
    """One file's sha256, read whole, no stat cache (a GGUF and its extracted copy: hashed once per conversion)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
