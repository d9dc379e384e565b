"""A JSONL file read as bytes, one line at a time: a bad encoding, bad JSON or JSON nested too deeply is one error
naming the file and line, and a line over max_bytes is skipped without ever being held whole (a 50 MB traffic row
once cost 9.8 GB and 85 s of tokenizing before it was dropped as too long)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.core.errors import PipelineError


@dataclass(frozen=True)
class Line:
    """One non-blank line: where it is ("<path>:<number>", what an error about its row names) and its JSON;
    oversized: over max_bytes, skipped unread (row None)."""

    number: int
    where: str
    row: object = None
    oversized: bool = False


def read_lines(path: Path, max_bytes: int | None = None) -> Iterator[Line]:
    """path's non-blank lines in order, lazily: a caller that stops early leaves the rest unread."""
    with path.open("rb") as f:  # bytes, so a bad encoding is reported on its own line
        for number, raw in enumerate(raw_lines(f, max_bytes), 1):
            where = f"{path}:{number}"
            if raw is None:
                yield Line(number, where, oversized=True)
                continue
            text = decode(raw, number, where)
            if text.strip():
                yield Line(number, where, parse(text, where))


def raw_lines(f: BinaryIO, max_bytes: int | None) -> Iterator[bytes | None]:
    """(raw line or None for one over max_bytes) per line, never holding more than max_bytes + 1 of a line."""
    while True:
        raw = f.readline() if max_bytes is None else f.readline(max_bytes + 1)
        if not raw:
            return
        if max_bytes is not None and len(raw) > max_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line in bounded reads
                raw = f.readline(1 << 20)
            yield None
            continue
        yield raw


def decode(raw: bytes, number: int, where: str) -> str:
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")  # tolerate a leading byte-order mark
    except UnicodeDecodeError as e:
        raise PipelineError(
            f"{where}: not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start} of the "
            "line); save the file as UTF-8"
        ) from None


def parse(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PipelineError(f"{where}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise PipelineError(f"{where}: JSON nested too deeply") from None
