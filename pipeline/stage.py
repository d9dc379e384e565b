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
import sys
import traceback
from pathlib import Path
from typing import IO, Iterable, Iterator, TypeVar

from tqdm import tqdm

from pipeline.errors import PipelineError

LOG_DIR = Path("artifacts/logs")
T = TypeVar("T")

# The terminal's stdout and stderr while a stage's own fds 1 and 2 go to its log file.
_console_out: IO[str] | None = None
_console_err: IO[str] | None = None


def console() -> IO[str]:
    """Where progress bars and errors go: the terminal's stderr."""
    return _console_err or sys.stderr


def say(line: str) -> None:
    """A summary line for the person watching `dvc repro` (stdout, not the log file)."""
    print(line, file=_console_out or sys.stdout, flush=True)


def warn(line: str) -> None:
    """An error or warning line on the terminal's stderr."""
    print(line, file=console(), flush=True)


def progress_bar(desc: str, total: int | None = None, initial: int = 0, items: Iterable[T] | None = None) -> tqdm:
    """A progress bar on the console for a long step (library bars go to the log file)."""
    return tqdm(items, desc=desc, total=total, initial=initial, file=console(), leave=False, dynamic_ncols=True,
                mininterval=float(os.environ.get("TQDM_MININTERVAL", 2)))


def progress(items: Iterable[T], desc: str) -> Iterator[T]:
    yield from progress_bar(desc, items=items)


@contextlib.contextmanager
def output_to_log(log_path: Path) -> Iterator[None]:
    """Point fds 1 and 2 (and Python's logging, loguru) at log_path; console() keeps the terminal."""
    global _console_out, _console_err
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    _console_out, _console_err = os.fdopen(os.dup(1), "w", buffering=1), os.fdopen(os.dup(2), "w", buffering=1)
    with open(log_path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
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
            log_path = LOG_DIR / f"{stem}.log"
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
