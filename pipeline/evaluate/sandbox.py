"""Run untrusted generated Python (a model's completion and its tests) and say what happened, typed.

Generated code is never run anywhere else in this project. Each run is a fresh interpreter
(`python -I -S -B`: no environment variables read, no site-packages, no user site, no bytecode written) with an
empty environment (TMPDIR only, pointing at the scratch directory), its cwd a fresh scratch directory that is removed
afterwards, the code on stdin, and these layers, outermost first:

- kernel-enforced: a new network namespace (only a down loopback: nothing to reach) where the kernel allows it; when
  run as root, the process drops to the unprivileged `nobody` user (the kernel then refuses writes to root-owned
  files and directories, and RLIMIT_NPROC applies, which it never does to root); resource limits set before the code
  starts (RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC so that it cannot fork, RLIMIT_CORE 0);
  a wall-clock timeout that kills the whole process group; output read in bounded chunks and truncated.
- in-process, not a boundary: a `sys.addaudithook` hook installed before the code runs, refusing sockets, process
  creation (subprocess, os.system, os.exec*, os.fork, posix_spawn), signals to other processes, ctypes/cffi imports,
  and opening a file for writing (or renaming, removing, linking, ...) outside the scratch directory. Every refusal is
  reported on a private pipe as it happens, so code that catches the PermissionError still counts as `forbidden`.

What the audit hook is not: a security boundary. Code running in the interpreter can reach the hook's closure, the
pipe and the completion token through frames and `gc`, race a path check with a thread and a symlink swap, or use
modules the hook does not know; PEP 578 says as much. Against a determined attacker what holds is the kernel's part:
the network namespace, the unprivileged uid (root only: `Isolation.uid_dropped`) and the resource limits. Run as a
non-root user without user namespaces, file writes outside the scratch directory are limited only by that user's
own permissions and the hook. A real boundary for hostile code is a container or VM with no network and a read-only
root (gVisor, Firecracker, nsjail); this module is sized for model completions that are wrong, loop, allocate or call
things by accident, which is what a functional quality check meets.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534  # the unprivileged uid/gid a root parent drops to (Debian's and most distributions' `nobody`)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # readable by nobody where sys.executable is not


class Outcome(str, enum.Enum):
    PASSED = "passed"  # ran to the end (the tests passed) and exited 0
    FAILED = "failed"  # raised (an assertion, a syntax error, anything), exited early or non-zero
    TIMEOUT = "timeout"  # past the wall clock or the CPU seconds
    MEMORY = "memory"  # past the address-space limit
    FORBIDDEN = "forbidden"  # tried something the sandbox refuses (network, processes, writes outside its directory)
    ERROR = "error"  # the sandbox could not run it at all (the interpreter did not start)


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # wall clock, the whole process group killed past it
    cpu_s: int = 5  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL one second later
    memory_mb: int = 1024  # RLIMIT_AS: address space (a Python interpreter needs ~30 MB of it)
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 4096  # kept of stdout and of stderr each (the rest is read and dropped)


@dataclass(frozen=True)
class Isolation:
    """The kernel-enforced layers this run actually had (the audit hook is always installed)."""

    network_namespace: bool
    uid_dropped: bool  # ran as `nobody` (only possible, and only needed, when the parent is root)


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str  # one line: what was refused, what was raised, which signal
    returncode: int | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    isolation: Isolation | None = None
    refused: list[str] = field(default_factory=list)  # the audit events refused, in order

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED


# Runs inside the sandboxed interpreter (python -I -S -B -c). Reads a JSON header line and the code from stdin,
# installs the hook, runs the code, and reports on the status pipe: "started", "forbidden <event>", then one of
# "done <token>", "memory", "raised <type>: <message>". It must itself trigger no refused event after the hook.
BOOTSTRAP = r"""
import json, os, sys
sys.dont_write_bytecode = True
def _main():
    header = json.loads(sys.stdin.buffer.readline())
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    os.close(0)
    status_fd, token, scratch = header["fd"], header["token"], os.path.realpath(os.getcwd())
    def report(line):
        os.write(status_fd, (line.replace("\n", " ")[:500] + "\n").encode())
    REFUSED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
               "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "os.startfile", "sys.remote_exec"}
    NATIVE = {"ctypes", "_ctypes", "cffi", "_cffi_backend"}
    WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    # event -> (the positions of the paths it changes, the positions of its dir_fd arguments), as PEP 578's table
    # lists the arguments; os.symlink(src, dst) changes dst only (a link out is checked when opened through it)
    PATHS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
             "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()),
             "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()), "os.chflags": ((0,), ()),
             "os.lchflags": ((0,), ()), "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)),
             "os.symlink": ((1,), (2,)), "shutil.rmtree": ((0,), (1,))}
    def inside(path):
        if isinstance(path, int):
            return True  # an open descriptor: opened (and checked) before
        full = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))
        return full == scratch or full.startswith(scratch + os.sep)
    def why(event, args):
        if event in REFUSED or event.startswith(("socket.", "ctypes.")):
            return event
        if event == "import" and args[0].split(".")[0] in NATIVE:
            return f"import {args[0]}"
        if event == "open":
            path, mode, flags = args
            if isinstance(flags, int) and flags & WRITES:
                if mode is None and not isinstance(path, int) and not os.path.isabs(os.fsdecode(path)):
                    return "os.open for writing by a relative path (its dir_fd can't be checked)"
                if not inside(path):
                    return f"open {os.fsdecode(path) if not isinstance(path, int) else path!r} for writing"
        if event in PATHS:
            changed, dir_fds = PATHS[event]
            if any(i < len(args) and isinstance(args[i], int) and args[i] >= 0 for i in dir_fds):
                return f"{event} with a dir_fd"
            bad = [args[i] for i in changed if i < len(args) and not inside(args[i])]
            if bad:
                return f"{event} {bad[0] if isinstance(bad[0], int) else os.fsdecode(bad[0])}"
        return None
    busy = []
    def hook(event, args):
        if busy:  # events raised by the check itself
            return
        busy.append(1)
        try:
            reason = why(event, args)
        finally:
            busy.pop()
        if reason:
            report(f"forbidden {reason}")
            raise PermissionError(f"sandbox: {reason} refused")
    def leave(line, code):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        report(line)
        os._exit(code)
    sys.addaudithook(hook)
    report("started")
    try:
        exec(compile(code, "<generated>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except MemoryError:
        leave("memory", 3)
    except BaseException as e:
        leave(f"raised {type(e).__name__}: {e}", 2)
    leave(f"done {token}", 0)
_main()
"""


def python_for_sandbox(uid: int | None) -> str | None:
    """An interpreter the sandbox's user can run: this one where every directory above it is searchable by others
    (the venv's may live under a 0700 /root), else the system's python3; None: none."""
    if uid is None:
        return sys.executable
    for candidate in (sys.executable, *SYSTEM_PYTHONS):
        real = Path(candidate).resolve()
        if real.is_file() and all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents]):
            return str(real)
    return None


def _unshare_call():
    """libc's unshare(2), looked up in the parent: loading a library between fork and exec in a process with
    threads (torch's) can deadlock on the loader's lock. None where libc has none."""
    try:
        return ctypes.CDLL(None, use_errno=True).unshare
    except (OSError, AttributeError):
        return None


def _preexec(limits: Limits, uid: int | None, status_w: int):
    """The child's setup between fork and exec (start_new_session already made it a group leader): network
    namespace, limits, the uid drop, then RLIMIT_NPROC (after setuid: set before, it would fail the exec)."""
    unshare = _unshare_call()

    def setup() -> None:
        # as root a network namespace alone; otherwise a user namespace makes it allowed where the kernel permits
        net = unshare is not None and (unshare(CLONE_NEWNET) == 0 or unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0)
        mem = limits.memory_mb * 2**20
        for which, value in (
            (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1)),
            (resource.RLIMIT_AS, (mem, mem)),
            (resource.RLIMIT_FSIZE, (limits.file_mb * 2**20,) * 2),
            (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            resource.setrlimit(which, value)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # any fork fails: the user already runs this process
        os.write(status_w, f"isolation {int(net)} {int(uid is not None)}\n".encode())

    return setup


class _Reader(threading.Thread):
    """Drains a pipe to its end, keeping the first `keep` bytes: a child printing forever never fills the parent's
    memory nor blocks on a full pipe."""

    def __init__(self, fd, keep: int):
        super().__init__(daemon=True)
        self.fd, self.keep, self.head, self.total = fd, keep, bytearray(), 0

    def run(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.total += len(chunk)
            if len(self.head) < self.keep:
                self.head += chunk[: self.keep - len(self.head)]
        os.close(self.fd)

    def text(self) -> str:
        out = self.head.decode("utf-8", "replace")
        return out + (
            f"\n[... {self.total - len(self.head)} more bytes dropped]" if self.total > len(self.head) else ""
        )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the whole process group (the child is its leader), then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def supervise(
    argv: list[str], stdin: bytes, cwd: str, env: dict, preexec, limits: Limits, status_r: int, status_w: int
) -> tuple[int | None, bool, float, _Reader, _Reader, _Reader]:
    """Start argv in a new session, feed stdin, wait at most limits.wall_s, then kill its process group (always:
    whatever it left behind in the group goes too). (returncode, timed out, seconds, stdout, stderr, status)."""
    start = time.monotonic()
    # preexec_fn in a parent with threads (torch's): it only makes system calls (unshare resolved beforehand, setrlimit,
    # setuid, write), no imports, no library loads, nothing that takes a lock another thread could have held at fork
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,  # noqa: PLW1509
        pass_fds=(status_w,),
        close_fds=True,
    )
    os.close(status_w)
    readers = [_Reader(os.dup(s.fileno()), limits.output_bytes) for s in (proc.stdout, proc.stderr)]
    proc.stdout.close(), proc.stderr.close()
    status = _Reader(status_r, 64 * 1024)
    for r in (*readers, status):
        r.start()
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it exited (or was killed) before reading all of its code
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    kill_group(proc)
    seconds = time.monotonic() - start
    for r in (*readers, status):
        r.join(timeout=5)  # a grandchild outside the group could hold a pipe open: don't wait on it forever
    return proc.returncode, timed_out, seconds, readers[0], readers[1], status


def run(code: str, limits: Limits = Limits()) -> Result:
    """Run `code` in the sandbox; its outcome, typed. Passing means it ran to its end and exited 0: a test that
    calls `os._exit(0)` or `sys.exit(0)` before its checks end has not passed."""
    uid = NOBODY if os.geteuid() == 0 else None
    python = python_for_sandbox(uid)
    if python is None:
        return Result(
            Outcome.ERROR,
            f"no Python interpreter that uid {uid} can run ({sys.executable} is not "
            f"reachable by it, nor {', '.join(SYSTEM_PYTHONS)})",
            None,
            0.0,
        )
    scratch = tempfile.mkdtemp(prefix="modelprep-sandbox-")
    try:
        if uid is not None:
            os.chown(scratch, uid, uid)
        token = secrets.token_hex(16)
        status_r, status_w = os.pipe()
        header = json.dumps({"fd": status_w, "token": token})
        rc, timed_out, seconds, out, err, status = supervise(
            [python, "-I", "-S", "-B", "-c", BOOTSTRAP],
            header.encode() + b"\n" + code.encode(),
            scratch,
            {"TMPDIR": scratch},
            _preexec(limits, uid, status_w),
            limits,
            status_r,
            status_w,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return classify(rc, timed_out, seconds, out.text(), err.text(), status.text().splitlines(), token, limits)


def classify(
    rc: int | None,
    timed_out: bool,
    seconds: float,
    stdout: str,
    stderr: str,
    status: list[str],
    token: str,
    limits: Limits,
) -> Result:
    """The outcome from the exit and the status lines; a refusal outranks everything (code that caught the
    PermissionError and went on still tried it), then the clock, memory, and a finished run."""
    isolation = next(
        (
            Isolation(bool(int(line.split()[1])), bool(int(line.split()[2])))
            for line in status
            if line.startswith("isolation ")
        ),
        None,
    )
    refused = [line.removeprefix("forbidden ") for line in status if line.startswith("forbidden ")]

    def result(outcome: Outcome, detail: str) -> Result:
        return Result(outcome, detail, rc, seconds, stdout, stderr, isolation, refused)

    if refused:
        return result(Outcome.FORBIDDEN, f"refused: {refused[0]}")
    cpu_killed = rc is not None and rc in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out
    if timed_out or cpu_killed:
        return result(
            Outcome.TIMEOUT, f"past {limits.wall_s:g} s wall clock" if timed_out else f"past {limits.cpu_s} CPU seconds"
        )
    if "started" not in status:
        return result(Outcome.ERROR, f"the sandboxed interpreter did not start (exit {rc}): {stderr.strip()[-300:]}")
    if "memory" in status:
        return result(Outcome.MEMORY, f"MemoryError past {limits.memory_mb} MB of address space")
    if rc == 0 and f"done {token}" in status:
        return result(Outcome.PASSED, "ran to its end")
    raised = next((line.removeprefix("raised ") for line in status if line.startswith("raised ")), None)
    if raised and raised.startswith("MemoryError"):
        return result(Outcome.MEMORY, f"MemoryError past {limits.memory_mb} MB of address space")
    return result(
        Outcome.FAILED,
        raised or (f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exited {rc} before its end"),
    )
