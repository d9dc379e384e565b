"""The sandbox that runs generated code (pipeline/evaluate/sandbox.py): each kind of misbehaviour is stopped and
typed, a correct program passes, a wrong one fails, and a timeout takes the whole process group with it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from pipeline.evaluate import sandbox
from pipeline.evaluate.sandbox import Limits, Outcome

FAST = Limits(wall_s=4.0, cpu_s=2, memory_mb=512)


def run(code: str, limits: Limits = FAST) -> sandbox.Result:
    return sandbox.run(code, limits)


def test_a_correct_program_passes_and_a_wrong_one_fails():
    good = run("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n")
    assert good.outcome is Outcome.PASSED and good.passed, good
    bad = run("def add(a, b):\n    return a - b\nassert add(2, 3) == 5, 'add is wrong'\n")
    assert bad.outcome is Outcome.FAILED and "AssertionError: add is wrong" in bad.detail
    syntax = run("def add(a, b)\n    return a + b\n")
    assert syntax.outcome is Outcome.FAILED and "SyntaxError" in syntax.detail


@pytest.mark.parametrize("code", ["import os\nos._exit(0)\nassert False\n", "import sys\nsys.exit(0)\nassert False\n"])
def test_leaving_early_with_status_0_is_not_a_pass(code):
    """HumanEval-style harnesses read exit 0 as passed: a completion calling exit before check() ran would pass."""
    assert run(code).outcome is Outcome.FAILED


def test_a_loop_that_burns_cpu_is_stopped_by_its_cpu_limit():
    start = time.monotonic()
    result = run("while True:\n    pass\n", Limits(wall_s=20.0, cpu_s=1))
    assert result.outcome is Outcome.TIMEOUT and "CPU seconds" in result.detail
    assert time.monotonic() - start < 10


def test_a_program_that_waits_forever_is_stopped_by_the_wall_clock():
    result = run("import time\ntime.sleep(3600)\n", Limits(wall_s=1.0, cpu_s=5))
    assert result.outcome is Outcome.TIMEOUT and "wall clock" in result.detail and result.seconds < 5


def test_allocating_10_gb_is_a_memory_outcome():
    result = run("x = bytearray(10 * 2**30)\nassert len(x)\n")
    assert result.outcome is Outcome.MEMORY, result


@pytest.mark.parametrize(
    "code, refused",
    [
        ("import os\nif os.fork() == 0:\n    os._exit(0)\n", "os.fork"),
        ("import subprocess\nsubprocess.run(['true'])\n", "subprocess.Popen"),
        ("import os\nos.system('true')\n", "os.system"),
        ("import os\nos.execv('/bin/true', ['true'])\n", "os.exec"),
        ("import os\nos.posix_spawn('/bin/true', ['true'], {})\n", "os.posix_spawn"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "socket."),
        ("import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n", "socket."),
        ("open('../escape.txt', 'w').write('x')\n", "../escape.txt"),
        ("open('/tmp/modelprep-sandbox-escape.txt', 'w').write('x')\n", "/tmp/modelprep-sandbox-escape.txt"),
        (
            "import os\nos.symlink('/tmp/modelprep-sandbox-link.txt', 'inside')\nopen('inside', 'w').write('x')\n",
            "inside",
        ),
        ("import os\nos.remove('/tmp/modelprep-sandbox-remove.txt')\n", "os.remove"),
        ("import ctypes\n", "import ctypes"),
        ("import os\nos.chmod('/tmp', 0o777)\n", "os.chmod /tmp"),
        ("import os\nos.mkdir('../sibling')\n", "os.mkdir ../sibling"),
        ("import os\nos.rename('/tmp/modelprep-sandbox-x', 'x')\n", "os.rename /tmp/modelprep-sandbox-x"),
    ],
)
def test_forbidden_actions_are_stopped_and_typed(code, refused, tmp_path):
    result = run(code)
    assert result.outcome is Outcome.FORBIDDEN and refused in result.detail, result
    assert not Path("/tmp/modelprep-sandbox-escape.txt").exists()
    assert not Path("/tmp/modelprep-sandbox-link.txt").exists()


def test_a_refusal_caught_by_the_code_still_counts_as_forbidden():
    code = "import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    pass\nassert True\n"
    result = run(code)
    assert result.outcome is Outcome.FORBIDDEN and result.refused == ["socket.__new__"]


def test_a_fork_the_audit_hook_never_sees_is_refused_by_the_kernel_limit():
    """_posixsubprocess.fork_exec forks in C with no audit event: RLIMIT_NPROC (the process already counts as one
    of its user's) makes the fork itself fail."""
    code = (
        "import _posixsubprocess, os\nr, w = os.pipe()\n"
        "_posixsubprocess.fork_exec([b'/bin/sleep', b'30'], [b'/bin/sleep'], True, (), None, None, -1, -1, -1,"
        " -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False)\n"
    )
    result = run(code)
    assert result.outcome is Outcome.FAILED and "BlockingIOError" in result.detail, result


def test_writing_inside_the_scratch_directory_is_allowed_and_the_directory_is_removed():
    code = (
        "import os, tempfile\nopen('notes.txt', 'w').write('kept')\nassert open('notes.txt').read() == 'kept'\n"
        "os.mkdir('sub')\nos.chmod('sub', 0o700)\nos.rename('notes.txt', 'sub/notes.txt')\n"
        "os.remove('sub/notes.txt')\ntempfile.NamedTemporaryFile().close()\nprint(os.getcwd())\n"
        "assert set(os.environ) <= {'TMPDIR', 'LC_CTYPE'}\n"
    )
    result = run(code)
    assert result.outcome is Outcome.PASSED, result
    scratch = result.stdout.strip()
    assert Path(scratch).name.startswith("modelprep-sandbox-") and not Path(scratch).exists()


def test_the_kernel_layers_it_had_are_recorded():
    result = run("pass\n")
    assert result.isolation is not None
    if os.geteuid() == 0:  # root: the uid drop and the network namespace are both possible, and happen
        assert result.isolation.uid_dropped and result.isolation.network_namespace


def test_output_is_truncated_and_the_flood_does_not_hang_the_parent():
    result = run(
        "import sys\nfor _ in range(20000):\n    sys.stdout.write('x' * 1000)\n", Limits(wall_s=10.0, output_bytes=100)
    )
    assert result.outcome is Outcome.PASSED
    assert result.stdout.startswith("x" * 100) and "more bytes dropped" in result.stdout and len(result.stdout) < 200


def test_a_timeout_kills_the_children_too(tmp_path):
    """The wall-clock kill goes to the whole process group: a trusted parent (no limits, no hook, so that it can
    fork at all) leaves a grandchild sleeping; once its time is up, both are gone."""
    pids = tmp_path / "pids"
    spawner = (
        f"import subprocess, os, time\np = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\ntime.sleep(60)\n"
    )
    status_r, status_w = os.pipe()
    rc, timed_out, _, _, _, _ = sandbox.supervise(
        [sys.executable, "-c", spawner],
        b"",
        str(tmp_path),
        dict(os.environ),
        None,
        Limits(wall_s=2.0),
        status_r,
        status_w,
    )
    assert timed_out and rc is not None and rc < 0
    parent, child = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.05)
    assert not alive(parent) and not alive(child)


def alive(pid: int) -> bool:
    """Running (a zombie whose parent is gone and that init has not reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
