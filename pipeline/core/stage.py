"""How every DVC stage runs: its own log file for library noise, one summary line on the console,
progress bars for long steps, and the one-line-error contract.

`dvc repro` shows a stage's stdout and stderr. Libraries (transformers, llm-compressor's loguru
METRIC lines, datasets, lm-eval, AWQ's per-layer grid-search bars) write hundreds of lines there, so
while a stage runs file descriptors 1 and 2 point at `artifacts/logs/<stage>.log`; the pipeline's own
progress bars and summary go to the console streams saved before the redirect.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Iterable, Iterator, TypeVar

from tqdm import tqdm

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json
from pipeline.core.redact import redact_uri

T = TypeVar("T")

# The terminal's stdout and stderr while a stage's own fds 1 and 2 go to its log file.
_console_out: IO[str] | None = None
_console_err: IO[str] | None = None


def console() -> IO[str]:
    """Where progress bars and errors go: the terminal's stderr."""
    return _console_err or sys.stderr


def _print(line: str, stream: IO[str]) -> None:
    """A console line, redacted; a reader that went away (`... | head -1`) must not stop the stage half way
    through (a partial release, no receipt): the line is dropped and the work goes on."""
    try:
        print(redact_uri(line), file=stream, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # later lines and the final flush go nowhere


def say(line: str) -> None:
    """A summary line for the person watching `dvc repro` (stdout, not the log file)."""
    _print(line, _console_out or sys.stdout)


def record_timings(name: str, values: dict) -> None:
    """A stage's run-dependent measurements (seconds, peak memory) into artifacts/timings/<name>.json. They differ
    between two builds of the same inputs, so they stay out of DVC metrics and outputs, whose hashes dvc.lock
    records and a fresh clone must rebuild bit for bit (issue #32): this file is no DVC output and not in git, each
    workspace's own (as the logs). The stage's summary line shows them too."""
    write_json(paths.TIMINGS / f"{name}.json", values)


def warn(line: str) -> None:
    """An error or warning line on the terminal's stderr."""
    _print(line, console())


# A console that is not a terminal (`dvc repro > build.log 2>&1`, CI) gets a progress line at most this often, plus
# the last one when the step ends; MODELPREP_PROGRESS_INTERVAL sets it (seconds).
LINE_INTERVAL_S = 30.0
LINE_WIDTH = 100


class _Lines:
    """A progress bar's stream when the console is not a terminal. tqdm redraws its one line with carriage returns,
    which a file keeps as a single line growing by a whole bar per refresh (6 KB lines in issue #29); here each
    refresh becomes a line of its own, and tqdm's clearing writes (blanks, cursor moves) become nothing."""

    def __init__(self, stream: IO[str]):
        self._stream = stream

    def write(self, text: str) -> int:
        for part in text.replace("\x1b[A", "").split("\r"):
            if part.strip():
                _print(part.strip(), self._stream)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def progress_bar(desc: str, total: int | None = None, initial: int = 0, items: Iterable[T] | None = None) -> tqdm:
    """A progress bar on the console for a long step (library bars go to the log file): redrawn in place on a
    terminal; elsewhere a line every LINE_INTERVAL_S seconds and one when the step ends."""
    stream = console()
    if _is_terminal(stream):
        return tqdm(
            items,
            desc=desc,
            total=total,
            initial=initial,
            file=stream,
            leave=False,
            dynamic_ncols=True,
            mininterval=float(os.environ.get("TQDM_MININTERVAL", 2)),
        )
    return tqdm(
        items,
        desc=desc,
        total=total,
        initial=initial,
        file=_Lines(stream),
        leave=True,
        ncols=LINE_WIDTH,
        ascii=True,
        mininterval=float(os.environ.get("MODELPREP_PROGRESS_INTERVAL", LINE_INTERVAL_S)),
    )


def progress(items: Iterable[T], desc: str) -> Iterator[T]:
    yield from progress_bar(desc, items=items)


def collapse_redraws(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a library's progress bar writing into the log,
    e.g. AWQ's per-layer bars): its last non-blank state, not every refresh glued into one line of kilobytes."""
    if "\r" not in line:
        return line
    end = "\n" if line.endswith("\n") else ""
    states = [part for part in line.rstrip("\n").split("\r") if part.strip()]
    return (states[-1] if states else "") + end


# How long the copier waits for more output once the stage is done before it stops (see _redacting_copy).
DRAIN_S = 0.2


def _redacting_copy(read_fd: int, log: IO[bytes], done: threading.Event) -> None:
    """Every line written to fds 1 and 2 (this process's, its libraries', its children's) reaches the log with
    credentials in URLs replaced (MLflow prints `View run ... at: http://user:password@host/...`), and a line redrawn
    with carriage returns as its last state (collapse_redraws).

    It reads to EOF, or, once `done` is set, until the pipe has been quiet for DRAIN_S: a process that outlives the
    stage's work can hold the pipe's write end open for the rest of the stage's life, e.g. multiprocessing's
    resource tracker, started with a copy of fd 2 by any spawn-context process (vLLM's engine), which exits only with
    the stage. Waiting for EOF then cost the stage the whole join timeout (10 s) after its summary line."""
    writable, pending = True, b""

    def write(raw: bytes) -> None:
        nonlocal writable
        if not writable:
            return
        try:
            log.write(redact_uri(collapse_redraws(raw.decode("utf-8", "replace"))).encode())
            log.flush()
        except OSError:  # a full disk: the log stops, the stage goes on (and fails on its own writes)
            writable = False

    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:  # always drained: a copier that stopped reading would block the stage on its next print
            if not select.select([pipe], [], [], DRAIN_S)[0]:
                if done.is_set():
                    break
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                write(line + b"\n")
        if pending:
            write(pending)


@contextlib.contextmanager
def output_to_log(log_path: Path) -> Iterator[None]:
    """Point fds 1 and 2 (and Python's logging, loguru) at log_path, through a redacting pipe; console() keeps the
    terminal."""
    global _console_out, _console_err
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    _console_out, _console_err = os.fdopen(os.dup(1), "w", buffering=1), os.fdopen(os.dup(2), "w", buffering=1)
    with open(log_path, "ab", buffering=0) as log:
        read_fd, write_fd = os.pipe()
        done = threading.Event()
        copier = threading.Thread(target=_redacting_copy, args=(read_fd, log, done), daemon=True)
        copier.start()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)  # fds 1 and 2 hold the pipe open now
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)  # the pipe's last write ends close here (children have exited)...
            os.dup2(saved[1], 2)
            done.set()
            # ...so the copier reads to EOF, or drains what is left (_redacting_copy), and stops
            copier.join(timeout=10)
            for fd in saved:
                os.close(fd)
            _console_out.close()
            _console_err.close()
            _console_out = _console_err = None


def stage_main(name: str | None = None):
    """Decorator for a stage's main(argv): log file, one-line errors (exit 2), tracebacks to the log.

    name: the log file's name; None takes `<module>` or `<module>@<argv[0]>` for foreach stages."""

    def decorate(main):
        @functools.wraps(main)
        def wrapper(argv: list[str] | None = None):
            argv = sys.argv[1:] if argv is None else argv
            module = getattr(sys.modules[main.__module__].__spec__, "name", main.__module__)  # not __main__ under -m
            stem = name or module.rsplit(".", 1)[-1] + (f"@{argv[0]}" if argv else "")
            stem = stem.replace("/", "_").replace("..", "_")  # a bad argument must not pick the log's path
            log_path = paths.LOGS / f"{stem}.log"
            if log_path.exists():
                log_path.unlink()
            code = 0
            with output_to_log(log_path):
                try:
                    main(argv)
                except PipelineError as e:
                    warn(f"error: {e}")
                    code = 2
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except KeyboardInterrupt:
                    warn(f"{stem}: interrupted; its outputs were left as they were before it started")
                    code = 130
                except BaseException as e:  # noqa: BLE001 - the traceback goes to the log, a pointer to the console
                    traceback.print_exc()
                    first = (str(e).strip().splitlines() or [""])[0]
                    warn(f"error: {stem} failed: {type(e).__name__}: {first} (traceback in {log_path})")
                    code = 1
            sys.exit(code)

        return wrapper

    return decorate
