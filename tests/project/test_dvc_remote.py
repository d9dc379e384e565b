"""`dvc push` to a local directory remote and `dvc pull` of the exact build on another checkout."""

from __future__ import annotations

import shutil
import sys

import yaml

from tiny_project import run

BUILD = """import pathlib
out = pathlib.Path("artifacts/bundles/v")
out.mkdir(parents=True)
(out / "weights.bin").write_bytes(bytes(range(256)) * 64)
(out / "serve.yaml").write_text("model: ./model\\n")
"""


def ok(cmd, cwd):
    r = run(cmd, cwd)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return r


def git_commit(cwd, message):
    ok(["git", "add", "-A"], cwd)
    ok(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], cwd)


def test_push_then_pull_restores_the_build_elsewhere(tmp_path):
    build, remote, other = tmp_path / "build", tmp_path / "remote", tmp_path / "other"
    build.mkdir()
    ok(["git", "init", "-q"], build)
    ok(["dvc", "init", "-q"], build)
    (build / "build.py").write_text(BUILD)
    stage = {"cmd": f"{sys.executable} build.py", "deps": ["build.py"], "outs": ["artifacts/bundles"]}
    (build / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"build": stage}}))
    ok(["dvc", "repro"], build)
    ok(["dvc", "remote", "add", "-d", "storage", str(remote)], build)
    git_commit(build, "build")  # dvc.lock + .dvc/config: what another machine checks out
    ok(["dvc", "push"], build)
    assert any(p.is_file() for p in remote.rglob("*"))
    built = {p.name: p.read_bytes() for p in (build / "artifacts/bundles/v").iterdir()}

    # Same machine, cache and outputs gone: pull restores them.
    shutil.rmtree(build / ".dvc/cache")
    shutil.rmtree(build / "artifacts")
    ok(["dvc", "pull"], build)
    assert {p.name: p.read_bytes() for p in (build / "artifacts/bundles/v").iterdir()} == built

    # Another checkout (a fresh clone, empty cache): pull gives the exact build, and nothing is stale.
    ok(["git", "clone", "-q", str(build), str(other)], tmp_path)
    assert not (other / "artifacts/bundles").exists()  # git holds only dvc.lock and .gitignore
    ok(["dvc", "pull"], other)
    assert {p.name: p.read_bytes() for p in (other / "artifacts/bundles/v").iterdir()} == built
    assert "up to date" in ok(["dvc", "status"], other).stdout
