"""benchmarks/gpu/stage_groups.py on a real DVC repository: independent stages run at once, each with its group's
CUDA_VISIBLE_DEVICES, and `dvc commit` leaves them up to date for a later `dvc repro`; a failed stage ends its group
and is not recorded; a stage whose dep does not exist yet is refused before anything runs."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "stage_groups.py"
DVC = [sys.executable, "-m", "dvc"]

# each stage writes the GPUs it saw and its input, so the test can tell which group ran it and on what
WRITE = (
    "python -c \"import os,sys; open(sys.argv[2],'w')"
    ".write(os.environ.get('CUDA_VISIBLE_DEVICES','') + ':' + open(sys.argv[1]).read())\""
)


def project(tmp_path: Path, fail: str = "") -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*DVC, "init", "-q"], cwd=repo, check=True)
    (repo / "in.txt").write_text("x")
    stages = {
        "a": {"cmd": f"{WRITE} in.txt a.txt", "deps": ["in.txt"], "outs": ["a.txt"]},
        "b": {"cmd": f"{WRITE} a.txt b.txt", "deps": ["a.txt"], "outs": ["b.txt"]},
        "c": {"cmd": f"{WRITE} in.txt c.txt", "deps": ["in.txt"], "outs": ["c.txt"]},
        "d": {"cmd": f"{WRITE} b.txt d.txt", "deps": ["b.txt", "c.txt"], "outs": ["d.txt"]},
    }
    if fail:
        stages[fail]["cmd"] = "python -c 'raise SystemExit(3)'"
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    return repo


def groups(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "STAGE_GROUPS_LOGS": str(repo / "logs")},
    )


def status(repo: Path) -> dict:
    out = subprocess.run([*DVC, "status", "--json"], cwd=repo, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for a DVC repository")
def test_groups_run_on_their_gpus_and_are_committed(tmp_path):
    repo = project(tmp_path)
    r = groups(repo, "0:a,b", "1,2:c")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (repo / "b.txt").read_text() == "0:0:x"  # b ran after a, both on group 0's GPU
    assert (repo / "c.txt").read_text() == "1,2:x"
    assert set(status(repo)) == {"d"}  # a, b, c recorded as up to date; only d is left to run
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"a", "b", "c"}
    repro = subprocess.run([*DVC, "repro"], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert "Running stage 'd'" in repro and "Running stage 'a'" not in repro


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for a DVC repository")
def test_failed_stage_ends_its_group_and_is_not_recorded(tmp_path):
    repo = project(tmp_path, fail="a")
    r = groups(repo, "0:a,b", "1:c")
    assert r.returncode == 1
    assert "Stage 'a' FAILED (exit status 3" in r.stdout
    assert "Running stage 'b'" not in r.stdout  # the rest of a's group did not run
    assert (repo / "c.txt").exists()  # the other group did
    assert set(yaml.safe_load((repo / "dvc.lock").read_text())["stages"]) == {"c"}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for a DVC repository")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0:b"], "stage_groups: b: dep a.txt does not exist"),  # its upstream stage is in no earlier place
        (["0:a", "1:a"], "stage 'a' named twice"),
        (["0:a", "1:b"], "stage_groups: b: dep a.txt is written by a, not earlier in its group"),  # read half-made
        (["0:b,a"], "stage_groups: b: dep a.txt is written by a, not earlier in its group"),
        (["0:nope"], "no stage 'nope'"),
        (["a,b"], "expected GPUS:STAGE"),
    ],
)
def test_bad_groups_refused_before_anything_runs(tmp_path, args, message):
    repo = project(tmp_path)
    r = groups(repo, *args)
    assert r.returncode != 0 and message in r.stderr, r.stdout + r.stderr
    assert not (repo / "a.txt").exists() and not (repo / "c.txt").exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for a DVC repository")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_running_stages_and_commits_nothing(tmp_path, sig):
    repo = project(tmp_path)
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())
    stages["stages"]["c"]["cmd"] = (
        "python -c \"import os, time; open('c.pid', 'w').write(str(os.getpid())); time.sleep(120)\""
    )
    (repo / "dvc.yaml").write_text(yaml.safe_dump(stages))
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "STAGE_GROUPS_LOGS": str(repo / "logs")}
    # SIGINT ignored as a test runner's worker may leave it: the script handles both signals itself
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "0:a", "1:c"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 60
    while not (repo / "c.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    child = int((repo / "c.pid").read_text())
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists(), "the stage's process outlived the interrupt"
    assert not (repo / "dvc.lock").exists()  # nothing committed, not even a, which finished
