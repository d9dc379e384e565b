"""Run `vllm serve --config serve.yaml` from a serving directory as a supervised child process.

What a benchmark of a server must get right, whatever the server does: a free loopback port (the
preferred one, else another when it is taken), readiness from `GET /health` answered by this server's own
process group (not a sleep, and not another process's server that took the port first), a start
that fails with the server log's last lines, a start that hangs ended at a timeout, and a stop that
leaves no process behind. The server runs in its own session (process group) so that a stop reaches
the engine processes vLLM forks or spawns, not only the API server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import PipelineError

HOST = "127.0.0.1"  # the benchmark's traffic never leaves this machine
LOG_TAIL_LINES = 15
PORT_ATTEMPTS = 3
LOST_PORT_GRACE_S = 2.0  # SIGTERM to SIGKILL for a start that lost its port
ADDRESS_IN_USE = "address already in use"
VLLM_MODULE = "vllm.entrypoints.cli.main"  # `vllm` as `python -m`: its CLI's entry point


def vllm_command() -> list[str]:
    """`vllm` without relying on a console script (offline installs into a --target dir have none)."""
    return [sys.executable, "-m", VLLM_MODULE]


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int | None, host: str = HOST) -> int:
    """The preferred port when it is free, else one the kernel hands out."""
    if preferred and port_is_free(preferred, host):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_sockets(port: int) -> set[str] | None:
    """The inodes of the TCP sockets listening on `port` (any local address) in /proc/net/tcp and tcp6; None where
    /proc has no such table (not Linux: nothing to tell a listener's owner by)."""
    found: set[str] = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(fields[9])
    return found if tables else None


def group_sockets(pgid: int) -> set[str]:
    """The inodes of every socket a process of group `pgid` holds open (/proc/<pid>/fd links `socket:[inode]`)."""
    inodes: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # /proc/<pid>/stat: `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except (OSError, IndexError, ValueError):  # a process that ended while read, or one not ours to read
            continue
    return inodes


class _PortTaken(Exception):
    """The server's port is another process's: ours failed to bind or listen there."""


class _PortShared(Exception):
    """Another process listens on the server's port beside it (SO_REUSEPORT): connections go to either."""


def serves_on(proc: subprocess.Popen, port: int) -> bool:
    """Whether every socket listening on `port` belongs to `proc`'s process group (its own session); False while
    nothing listens there yet. Two runs on one host can both find a port free and start on it: vLLM binds with
    SO_REUSEADDR before its engine loads and listens after, so the first to listen answers /health for both, and a
    benchmark that took that for its own server measured another model (seen on a 4-GPU host: HTTP 404 for every
    request, the other server's model name). The second neither exits nor listens then (vLLM 0.26 logged "startup
    complete" and waited out serve_bench.startup_timeout_s, seen on the same host), so another process listening
    where the group does not raises _PortTaken at once: the port was free when picked, so the other run holds it for
    its whole benchmark. Raises _PortShared where the group listens beside another process (both with SO_REUSEPORT,
    as vLLM's several API servers bind). True where /proc cannot tell."""
    listening = listening_sockets(port)
    if listening is None:
        return True
    if not listening:
        return False
    ours = listening & group_sockets(proc.pid)
    if not ours:
        raise _PortTaken()
    if ours != listening:
        raise _PortShared()
    return True


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no server log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def failure(what: str, log_path: Path) -> PipelineError:
    """One error line (what happened, the log's last line, where the log is); the log's last lines go to
    stderr, which is the stage's log file while a stage runs."""
    tail = log_tail(log_path)
    print(f"{what}; last lines of {log_path}:\n{tail}", file=sys.stderr, flush=True)
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    return PipelineError(f"{what}: {last[:300]} (log: {log_path})")


@contextlib.contextmanager
def stop_on_termination():
    """SIGTERM and SIGHUP (a cancelled `dvc repro`, a CI timeout, a closed session) end Python without unwinding,
    which would leave the server, in its own session, holding the GPU: raise instead, so `finally` stops it."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the whole group (vLLM shuts its engine down on it), SIGKILL to what is left after
    grace_s, then reap. The server was started in a new session, so its group id is its pid, which
    still names the group after the server itself has died and left its engine processes behind.
    Safe to call twice."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not group_alive(pgid):
            return


# Every server started here and not stopped yet: serve_bench runs several at once on threads, which a signal (handled
# on the main thread only) cannot unwind; gpu_sets.run_waves stops them all instead.
_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
# Set by stop_all: a thread that had not started its server yet when the run was interrupted must not start one
# afterwards (it would outlive the stop and hold its GPUs); allow_starts() clears it for the next run.
_stopping = threading.Event()


def stop_all() -> None:
    """Stop every server this process started and has not stopped yet (safe beside their own stops), and refuse to
    start another until allow_starts()."""
    with _live_lock:
        _stopping.set()
        procs = list(_live)
    for proc in procs:
        stop_process_group(proc, grace_s=10.0)


def allow_starts() -> None:
    """A new run may start servers again (gpu_sets.run_waves calls it first)."""
    _stopping.clear()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ServerHandle:
    """A ready server: where it listens and how long it took to answer /health."""

    port: int
    startup_s: float
    log_path: Path
    proc: subprocess.Popen = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


@contextlib.contextmanager
def serve(
    config: Path,
    cwd: Path,
    log_path: Path,
    startup_timeout_s: float,
    preferred_port: int | None = None,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
):
    """Start the server, yield a ServerHandle once /health answers 200, always stop it afterwards.

    command: the `vllm` command line before `serve` (default: this Python's vLLM). A port that turns
    out to be taken when the server binds it (another process got there first) is retried on another.
    """
    command = command or vllm_command()
    port = pick_port(preferred_port)
    with stop_on_termination():
        yield from _serve(command, config, cwd, log_path, startup_timeout_s, port, env)


def _serve(command, config, cwd, log_path, startup_timeout_s, port, env):
    retried = None  # why the last start was given up: its log stays, this line after it
    for attempt in range(1, PORT_ATTEMPTS + 1):
        with _live_lock:  # checked and registered at once: stop_all can't run between the two
            if _stopping.is_set():
                raise PipelineError(f"vllm serve {config.name}: not started, the run was interrupted")
            handle = _start(command, config, cwd, log_path, port, env, retried)
            _live.add(handle.proc)
        try:
            try:
                _wait_ready(handle, startup_timeout_s)
            except (_PortTaken, _PortShared) as lost:
                # nothing of a server that lost its port is worth a graceful shutdown: the grace only delays the next
                # start (30 s of a 4x H100 lease, seen)
                stop_process_group(handle.proc, grace_s=LOST_PORT_GRACE_S)
                if attempt == PORT_ATTEMPTS:
                    raise failure(
                        f"vllm serve could not bind a port after {PORT_ATTEMPTS} tries (last {port})", log_path
                    ) from None
                how = "taken" if isinstance(lost, _PortTaken) else "shared"
                old, port = port, pick_port(None)
                retried = f"modelprep: port {old} was {how} by another process's server; vllm serve restarted on {port}"
                continue
            except BaseException:
                stop_process_group(handle.proc)
                raise
            try:
                yield handle
            finally:
                stop_process_group(handle.proc)
            return
        finally:
            with _live_lock:
                _live.discard(handle.proc)


def _start(
    command: list[str], config: Path, cwd: Path, log_path: Path, port: int, env: dict | None, retried: str | None = None
) -> ServerHandle:
    """retried: the reason a start on another port was given up; the log then keeps that start's lines, this after."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a" if retried else "w") as log:
        if retried:
            log.write(f"\n{retried}\n")
            log.flush()
        proc = subprocess.Popen(
            [*command, "serve", "--config", str(config), "--host", HOST, "--port", str(port)],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return ServerHandle(port=port, startup_s=0.0, log_path=log_path, proc=proc)


def _wait_ready(handle: ServerHandle, timeout_s: float) -> None:
    t0 = time.monotonic()
    while True:
        code = handle.proc.poll()
        if code is not None:
            # Only our HTTP port: vLLM's internal ports (ZMQ, distributed init) failing is another error.
            if any(
                ADDRESS_IN_USE in line.lower() and str(handle.port) in line
                for line in log_tail(handle.log_path).splitlines()
            ):
                raise _PortTaken()
            raise failure(f"vllm serve exited with status {code} before it was ready", handle.log_path)
        # another process's server that listens on the port first answers too: serves_on tells it from ours, and
        # the port is retried above (_PortTaken)
        if http_status(f"{handle.base_url}/health") == 200 and serves_on(handle.proc, handle.port):
            handle.startup_s = time.monotonic() - t0
            return
        if time.monotonic() - t0 > timeout_s:
            raise failure(
                f"vllm serve did not answer /health within {timeout_s:.0f} s "
                "(serve_bench.startup_timeout_s) and was stopped",
                handle.log_path,
            )
        time.sleep(1.0)
