"""The `sources` stage's memories (issue #32): model files hashed again only when their stat changed, the recipe
check run again only when what it depends on changed. On real files and real stage processes: whatever the
cache holds, the fingerprint is the one a full read gives."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pipeline.core.io import read_sealed_json, write_sealed_json
from pipeline.models.sources import HashCache, model_files, settled, source_fingerprint
from tiny_project import copy_project, run, tiny_params


def make_model(path: Path) -> Path:
    """What check_model_dir accepts, without torch: a config, safetensors weights, a tokenizer."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    save_file({"w": np.arange(256, dtype=np.float32).reshape(16, 16)}, str(path / "model.safetensors"))
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}))
    return path


def settle(*roots: Path) -> None:
    """Wait until every file is older than a timestamp tick, so that a hash of it is remembered (see settled)."""
    while not all(settled(os.stat(f), time.time_ns()) for r in roots for f in r.rglob("*") if f.is_file()):
        time.sleep(0.02)


def full_read(path: Path) -> str:
    """The fingerprint's sha256 computed here, independently: the listing of every model file and its sha256."""
    listing = [[rel, hashlib.sha256((path / rel).read_bytes()).hexdigest()] for rel in model_files(path)]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def fingerprint(path: Path, cache_file: Path) -> tuple[dict, HashCache]:
    """One stage run's worth: the cache as on disk, the fingerprint, the cache saved."""
    cache = HashCache(cache_file)
    fp = source_fingerprint(str(path), "target", cache=cache)
    assert cache.save() is None
    assert fp["sha256"] == full_read(path) == source_fingerprint(str(path), "target")["sha256"]  # with, without
    return fp, cache


def rewrite_same_size(file: Path, keep_mtime: bool = False) -> None:
    """Change the last byte in place (a weight edited): same inode, same size; the mtime set back if asked."""
    before = os.stat(file)
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF
    with file.open("r+b") as f:
        f.write(data)
    if keep_mtime:
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (os.stat(file).st_size, os.stat(file).st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.fixture
def model(tmp_path) -> Path:
    path = make_model(tmp_path / "model")
    settle(path)
    return path


def test_unchanged_files_are_not_read_again(model, tmp_path):
    cache_file = tmp_path / "cache.json"
    first, cache = fingerprint(model, cache_file)
    assert (cache.reads, cache.hits) == (3, 0)
    again, cache = fingerprint(model, cache_file)
    assert again == first and (cache.reads, cache.hits) == (0, 3)
    mtime = cache_file.stat().st_mtime_ns
    fingerprint(model, cache_file)
    assert cache_file.stat().st_mtime_ns == mtime  # nothing changed, nothing rewritten


def test_a_same_size_edit_is_read_again(model, tmp_path):
    cache_file = tmp_path / "cache.json"
    first, _ = fingerprint(model, cache_file)
    rewrite_same_size(model / "model.safetensors")
    edited, cache = fingerprint(model, cache_file)
    assert edited["sha256"] != first["sha256"] and (cache.reads, cache.hits) == (1, 2)


def test_a_touched_or_grown_file_is_read_again(model, tmp_path):
    cache_file = tmp_path / "cache.json"
    first, _ = fingerprint(model, cache_file)
    os.utime(model / "config.json")  # mtime only: read again, same content
    settle(model)
    touched, cache = fingerprint(model, cache_file)
    assert touched == first and cache.reads == 1
    with (model / "tokenizer.json").open("a") as f:
        f.write(" ")
    grown, cache = fingerprint(model, cache_file)
    assert grown["sha256"] != first["sha256"] and cache.reads == 1


def test_a_same_size_edit_with_its_mtime_set_back_is_read_again(model, tmp_path):
    """The blind spot of DVC's state (inode, mtime, size): ctime, which utime itself sets, gives it away."""
    cache_file = tmp_path / "cache.json"
    first, _ = fingerprint(model, cache_file)
    rewrite_same_size(model / "model.safetensors", keep_mtime=True)
    edited, cache = fingerprint(model, cache_file)
    assert edited["sha256"] != first["sha256"] and cache.reads == 1


def test_a_replaced_file_a_swapped_directory_and_a_moved_link_are_read_again(tmp_path):
    """Same names, sizes and mtimes (copy2 keeps them), other content: another inode each time."""
    cache_file = tmp_path / "cache.json"
    model = make_model(tmp_path / "model")
    twin = shutil.copytree(model, tmp_path / "twin")  # copy2: the same mtimes
    rewrite_same_size(twin / "model.safetensors", keep_mtime=True)
    settle(model, twin)
    first, _ = fingerprint(model, cache_file)

    replacement = tmp_path / "replacement.safetensors"
    shutil.copy2(twin / "model.safetensors", replacement)
    os.replace(replacement, model / "model.safetensors")  # replaced by rename: new inode, same size and mtime
    replaced, cache = fingerprint(model, cache_file)
    assert replaced["sha256"] != first["sha256"] and cache.reads == 1

    rewrite_same_size(model / "model.safetensors", keep_mtime=True)  # back to the first content
    settle(model)
    assert fingerprint(model, cache_file)[0] == first
    os.rename(model, tmp_path / "old")
    os.rename(twin, model)  # the whole directory swapped for one of the same names, sizes and mtimes
    swapped, cache = fingerprint(model, cache_file)
    assert swapped["sha256"] != first["sha256"] and cache.reads == 3

    # A Hub cache snapshot: links into blobs/; pointing one at another blob of the same size and mtime
    snapshot, blobs = tmp_path / "models--o--m" / "snapshots" / "abc", tmp_path / "models--o--m" / "blobs"
    snapshot.mkdir(parents=True)
    shutil.copytree(tmp_path / "old", blobs)
    shutil.copy2(model / "model.safetensors", blobs / "other")
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (snapshot / f).symlink_to(Path("../../blobs") / f)
    settle(blobs)
    linked, _ = fingerprint(snapshot, cache_file)
    assert linked["sha256"] == first["sha256"]
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(Path("../../blobs/other"))
    moved, cache = fingerprint(snapshot, cache_file)
    assert moved["sha256"] == swapped["sha256"] and cache.reads == 1


def test_a_file_changed_just_before_it_was_read_is_not_remembered(model, tmp_path):
    """Racy git: within a timestamp tick a second change could keep the stat, so a file changed less than a tick
    before it was read (here: stamped in the future, as by a server whose clock runs ahead) is read every time."""
    cache_file = tmp_path / "cache.json"
    future = time.time_ns() + 3_000_000_000
    os.utime(model / "config.json", ns=(future, future))
    fingerprint(model, cache_file)
    assert fingerprint(model, cache_file)[1].reads == 1
    os.utime(model / "config.json", ns=(1_000_000_123, 1_000_000_123))  # its ctime is now: still young
    settle(model)
    fingerprint(model, cache_file)
    assert fingerprint(model, cache_file)[1].reads == 0


def test_a_deleted_cache_reads_everything(model, tmp_path):
    cache_file = tmp_path / "cache.json"
    first, _ = fingerprint(model, cache_file)
    cache_file.unlink()
    again, cache = fingerprint(model, cache_file)
    assert again == first and cache.reads == 3 and cache.problem is None and cache_file.is_file()


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "truncated",
        "edited hash",
        "resealed bad entry",
        "other format",
        "nested",
        "not a list",
        "a bool for an int",
    ],
)
def test_a_corrupt_or_edited_cache_is_ignored_whole(model, tmp_path, damage):
    """Nothing in a damaged cache is used: every file is read, the fingerprint is the true one, the file rewritten."""
    cache_file = tmp_path / "cache.json"
    first, _ = fingerprint(model, cache_file)
    body = read_sealed_json(cache_file)
    name = os.path.abspath(model / "model.safetensors")
    wrong = hashlib.sha256(b"not the weights").hexdigest()
    if damage == "garbage":
        cache_file.write_bytes(os.urandom(512))
    elif damage == "truncated":
        cache_file.write_bytes(cache_file.read_bytes()[:-40])
    elif damage == "edited hash":  # a hash swapped for another, the checksum left as it was
        sealed = json.loads(cache_file.read_text())
        sealed["body"]["files"][name][5] = wrong
        cache_file.write_text(json.dumps(sealed))
    elif damage == "resealed bad entry":  # checksum right, entry not an entry
        body["files"][name] = body["files"][name][:5] + ["WRONG"]
        write_sealed_json(cache_file, body)
    elif damage == "other format":
        write_sealed_json(cache_file, {**body, "format": 999})
    elif damage == "nested":
        cache_file.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "not a list":
        write_sealed_json(cache_file, {**body, "files": {name: "x"}})
    else:
        body["files"][name][2] = True
        write_sealed_json(cache_file, body)
    again, cache = fingerprint(model, cache_file)
    assert again == first and cache.reads == 3 and cache.hits == 0 and cache.problem
    assert fingerprint(model, cache_file)[1].hits == 3  # rewritten whole


def test_the_checksum_is_no_signature_a_resealed_forgery_is_believed(model, tmp_path):
    """What a checksum can't tell: a writer who recomputes it. Stated, not hidden: such a cache is believed for
    files whose stat it matches (that writer could as well rewrite artifacts/sources.json itself)."""
    cache_file = tmp_path / "cache.json"
    fingerprint(model, cache_file)
    body = read_sealed_json(cache_file)
    for entry in body["files"].values():
        entry[5] = hashlib.sha256(b"forged").hexdigest()
    write_sealed_json(cache_file, body)
    cache = HashCache(cache_file)
    assert cache.problem is None and source_fingerprint(str(model), "target", cache=cache)["sha256"] != full_read(model)


def test_concurrent_writers_leave_one_whole_cache(model, tmp_path):
    """Two processes saving the cache over and over while it is read: every read finds a whole, valid file."""
    cache_file = tmp_path / "cache.json"
    fingerprint(model, cache_file)
    writer = (
        "import sys; from pathlib import Path; from pipeline.models.sources import HashCache\n"
        "for i in range(40):\n"
        "    c = HashCache(Path(sys.argv[1])); c.problem = 'force a write'; c.seen = c.known\n"
        "    assert c.save() is None\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(cache_file)], env=env) for _ in range(2)]
    while any(p.poll() is None for p in procs):
        cache = HashCache(cache_file)
        assert cache.problem is None and len(cache.known) == 3
    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "model"]  # no temp file left behind


def test_a_fifo_among_the_model_files_is_one_line_not_a_hang(model, tmp_path):
    """A named pipe matching a model pattern (notes.txt) would block the read for ever: refused, naming it."""
    from pipeline.core.errors import PipelineError

    os.mkfifo(model / "notes.txt")
    with pytest.raises(
        PipelineError,
        match=r"target model directory .*: notes.txt cannot be read "
        r"\(not a regular file\)",
    ):
        source_fingerprint(str(model), "target", cache=HashCache(tmp_path / "cache.json"))


# --- the stage ----------------------------------------------------------------------------------


def stage(proj: Path, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """python -m stages.sources in proj; its console output and what it imported (-X importtime, log included)."""
    r = run([sys.executable, *flags, "-m", "stages.sources"], proj)
    assert r.returncode in (0, 2), r.stderr[-2000:]
    return r, r.stderr + (proj / "artifacts/logs/sources.log").read_text()


HEAVY = ("torch", "transformers", "compressed_tensors", "llmcompressor")


def imported(trace: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in trace.splitlines() if line.startswith("import time:")}


def test_the_stage_reads_nothing_and_imports_nothing_heavy_when_nothing_changed(tmp_path):
    target, draft = make_model(tmp_path / "target"), make_model(tmp_path / "draft")
    settle(target, draft)
    (tmp_path / "proj").mkdir()
    proj = copy_project(
        tmp_path / "proj", tiny_params(target={"source": str(target), "revision": None}, draft={"source": str(draft)})
    )
    first, trace = stage(proj, "-X", "importtime")
    assert first.returncode == 0 and "(6 file(s) read, 0 unchanged by stat)" in first.stdout
    assert "compressed_tensors" in imported(trace)  # the recipe check ran once in full
    out = (proj / "artifacts/sources.json").read_bytes()
    second, trace = stage(proj, "-X", "importtime")
    assert second.returncode == 0 and "(0 file(s) read, 6 unchanged by stat)" in second.stdout, second.stdout
    assert not imported(trace) & set(HEAVY), sorted(imported(trace) & set(HEAVY))
    assert (proj / "artifacts/sources.json").read_bytes() == out  # what `models` depends on: unchanged
    assert json.loads(out)["target"]["sha256"] == full_read(target)

    # a variant edited into a bad recipe: checked in full again, one line; the memory of the good one stays
    params = tiny_params(target={"source": str(target), "revision": None}, draft={"source": str(draft)})
    good = (proj / "params.yaml").read_text()
    params["quantize"]["variants"]["awq-w4a16"]["scheme"] = "W9A16"
    import yaml

    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    bad, _ = stage(proj)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "unknown quantization scheme 'W9A16'" in bad.stderr
    (proj / "params.yaml").write_text(good)
    _, trace = stage(proj, "-X", "importtime")
    assert not imported(trace) & set(HEAVY)

    # its memory damaged: checked in full again, never skipped
    (proj / "artifacts/cache/recipes-checked.json").write_text("{}")
    (proj / "artifacts/cache/source-hashes.json").write_text("{}")
    third, trace = stage(proj, "-X", "importtime")
    assert "compressed_tensors" in imported(trace) and "(6 file(s) read, 0 unchanged by stat)" in third.stdout
    assert "ignored artifacts/cache/source-hashes.json" in third.stderr
    assert (proj / "artifacts/sources.json").read_bytes() == out
