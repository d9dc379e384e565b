"""The server supervisor with real processes on loopback: ready on /health, a crash reported with the
log's last lines, a hang stopped at the timeout, a taken port avoided, and no process left behind.

The server here is a small Python program that takes `serve --config F --host H --port P` as vLLM's CLI
does and behaves as told by its config file (vLLM itself needs a GPU, which CI never has)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.serving.vllm_server import HOST, _PortTaken, http_status, pick_port, serve, serves_on

SERVER = r"""
import http.server, os, subprocess, sys, time
args = sys.argv[1:]
config, port = args[args.index("--config") + 1], int(args[args.index("--port") + 1])
mode = open(config).read().strip()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # like vLLM's engine process
open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
if mode == "crash":
    print("loading weights"); print("RuntimeError: CUDA out of memory (boom)"); sys.exit(3)
if mode == "hang":
    time.sleep(600)
OTHER = '''
import http.server, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self): self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
class S(http.server.HTTPServer):
    def server_bind(self):
        if sys.argv[2] == "shared":  # SO_REUSEPORT, as vLLM binds when it runs several API servers
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''
if mode in ("intruded", "shared", "stalled") and not os.path.exists(os.environ["RACE_MARKER"]):
    # another run's server (its own session, as a second serve_bench's is) on this port: "intruded", it listens first
    # and answers /health while this one still starts, and this one then fails to listen, as vLLM does once its
    # engine is up; "shared", both listen (SO_REUSEPORT) and the kernel splits connections between them
    open(os.environ["RACE_MARKER"], "w").close()
    other = subprocess.Popen([sys.executable, "-c", OTHER, str(port), mode], start_new_session=True)
    open(os.environ["INTRUDER_PID_FILE"], "w").write(f"{other.pid} {port}")
    time.sleep(1)
    if mode == "intruded":
        time.sleep(2)
        print(f"OSError: [Errno 98] Address already in use ({port})"); sys.exit(1)
    if mode == "stalled":  # as vLLM 0.26 did on a 4-GPU host: "startup complete", never listening, never exiting
        print("Application startup complete.", flush=True); time.sleep(600)
if mode == "race" and not os.path.exists(os.environ["RACE_MARKER"]):
    open(os.environ["RACE_MARKER"], "w").close()
    print(f"OSError: [Errno 98] Address already in use ({port})"); sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
print("serving on", port, flush=True)
class Server(http.server.HTTPServer):
    def server_bind(self):
        if mode == "shared":
            import socket
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
Server(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_vllm.py"
    script.write_text(SERVER)
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    monkeypatch.setenv("RACE_MARKER", str(tmp_path / "raced"))
    monkeypatch.setenv("INTRUDER_PID_FILE", str(tmp_path / "intruder.pid"))

    def start(mode: str, timeout: float = 20.0, port: int | None = None):
        config = tmp_path / "serve.yaml"
        config.write_text(mode)
        return serve(
            config, tmp_path, tmp_path / "logs" / "server.log", timeout, port, command=[sys.executable, str(script)]
        )

    return start


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped by its parent yet) is gone for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def child_pid(tmp_path: Path) -> int:
    return int((tmp_path / "child.pid").read_text())


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_ready_server_answers_and_its_whole_process_group_is_stopped(fake, tmp_path):
    with fake("ok") as server:
        assert http_status(f"{server.base_url}/health") == 200
        assert server.startup_s > 0
        pids = (server.proc.pid, child_pid(tmp_path))
        assert all(alive(p) for p in pids)
    assert all(wait_gone(p) for p in pids), "a server process outlived the benchmark"
    assert http_status(f"{server.base_url}/health") is None


def test_crash_fails_with_the_server_log_tail(fake, tmp_path):
    with pytest.raises(PipelineError) as err:
        with fake("crash"):
            pass
    message = str(err.value)  # one line: what, the log's last line, where the log is
    assert message.startswith("vllm serve exited with status 3 before it was ready: RuntimeError: CUDA out of memory")
    assert "\n" not in message and f"(log: {tmp_path / 'logs' / 'server.log'})" in message
    assert wait_gone(child_pid(tmp_path))


def test_hung_start_times_out_and_leaves_no_process(fake, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(PipelineError, match=r"did not answer /health within 2 s .*serve_bench.startup_timeout_s"):
        with fake("hang", timeout=2):
            pass
    assert time.monotonic() - t0 < 45  # the SIGTERM grace is not needed: the group is killed
    assert wait_gone(child_pid(tmp_path))


def test_a_taken_port_is_avoided(fake):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert pick_port(busy) != busy
        with fake("ok", port=busy) as server:
            assert server.port != busy and http_status(f"{server.base_url}/health") == 200


def test_losing_a_port_race_retries_on_another(fake, tmp_path):
    with fake("race") as server:
        assert (tmp_path / "raced").exists()  # the first start said "Address already in use"
        assert http_status(f"{server.base_url}/health") == 200
    # the lost start's lines stay in the server's log, then why it was restarted and where
    log = (tmp_path / "logs" / "server.log").read_text()
    first, _, second = log.partition("modelprep: port ")
    assert "Address already in use" in first and f"vllm serve restarted on {server.port}" in second
    assert f"serving on {server.port}" in second


def test_another_processs_server_on_the_port_is_not_taken_for_ours(fake, tmp_path):
    """Two serve_bench runs on one host both found the same port free; the other run's server bound it first and
    answered /health while ours was still starting (a 4-GPU host: every request then got HTTP 404)."""
    record = tmp_path / "intruder.pid"
    try:
        with fake("intruded") as server:
            _, intruder_port = map(int, record.read_text().split())
            assert server.port != intruder_port  # retried on another port once ours failed to bind
            assert http_status(f"{server.base_url}/health") == 200
            assert serves_on(server.proc, server.port)
            with pytest.raises(_PortTaken):  # answering, but not ours
                serves_on(server.proc, intruder_port)
    finally:
        if record.exists():
            os.kill(int(record.read_text().split()[0]), 9)


def test_a_port_shared_with_another_processs_server_is_left_for_another(fake, tmp_path):
    """Both servers listen on one port (SO_REUSEPORT): half the benchmark's requests would reach the other one."""
    record = tmp_path / "intruder.pid"
    try:
        with fake("shared") as server:
            _, shared_port = map(int, record.read_text().split())
            assert server.port != shared_port
            assert serves_on(server.proc, server.port)
    finally:
        if record.exists():
            os.kill(int(record.read_text().split()[0]), 9)


def test_a_server_that_never_gets_its_port_is_restarted_on_another_at_once(fake, tmp_path):
    """The other run's server listens on the port first, and ours neither listens nor exits (vLLM 0.26 on a 4-GPU
    host: the FP8 benchmark waited out its 600 s startup timeout while the W4A16 one measured on the same port)."""
    record = tmp_path / "intruder.pid"
    t0 = time.monotonic()
    try:
        with fake("stalled", timeout=60) as server:
            _, intruder_port = map(int, record.read_text().split())
            assert server.port != intruder_port and serves_on(server.proc, server.port)
            assert http_status(f"{server.base_url}/health") == 200
        assert time.monotonic() - t0 < 30  # not the startup timeout: the stalled first start was stopped
    finally:
        if record.exists():
            os.kill(int(record.read_text().split()[0]), 9)
