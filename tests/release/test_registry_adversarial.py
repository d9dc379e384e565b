"""Attacks on bundles and registries, run against the real code: concurrent publishers, hostile names,
doctored manifests, tampered stored copies, corrupt indexes, failing disks, leaked credentials."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from bundle_helpers import free_port, one_error_line
from pipeline.core.errors import PipelineError
from pipeline.core.io import read_json, write_json
from pipeline.release.manifest import MANIFEST, verify, write_manifest
from pipeline.release.registry import get_backend, local
from tiny_project import publish_settings

TREE = Path(pipeline.__file__).resolve().parents[1]  # child processes run the code under test
ENV = {**os.environ, "PYTHONPATH": str(TREE), "PYTHONDONTWRITEBYTECODE": "1"}
MODELPREP = str(Path(sys.executable).parent / "modelprep")
TRIALS = 5

# A publisher that waits for the go file, so that two of them run check-copy-index at the same time.
RACER = """
import sys, time
from pathlib import Path
from pipeline.core.errors import PipelineError
from pipeline.release.registry import local
from pipeline.release.settings import PublishParams
bundle, name, version, registry, go = sys.argv[1:]
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.0005)
try:
    print(local.publish(Path(bundle), name, version, {}, PublishParams("local", registry, "auto"))["status"])
except PipelineError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""

# A publisher whose writes fail past a size limit (EFBIG, as a full disk fails with ENOSPC).
SMALL_DISK = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process being killed
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
from pipeline.core.errors import PipelineError
from pipeline.release.registry import local
from pipeline.release.settings import PublishParams
try:
    local.publish(Path(sys.argv[1]), "m", "1", {}, PublishParams("local", sys.argv[2], "auto"))
except PipelineError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


def make_bundle(path: Path, marker: str = "a", weights: int = 4096) -> Path:
    files = {
        "README.md": f"bundle {marker}\n",
        "model/config.json": '{"layers": 2}\n',
        "model/weights.bin": marker * weights,
    }
    files.update({f"draft/shard-{i}.bin": f"{marker}{i}" * 64 for i in range(12)})  # a copy that takes a moment
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    write_manifest(path, {"variant": marker})
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MODELPREP, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=ENV)


def race(tmp: Path, jobs: list[tuple]) -> list[tuple[int, str, str]]:
    tmp.mkdir()
    go = tmp / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, *map(str, job), str(go)],
            env=ENV,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for job in jobs
    ]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    return [(p.returncode, *out) for p, out in zip(procs, outputs)]


@pytest.fixture
def bundles(tmp_path):
    return make_bundle(tmp_path / "a", "a"), make_bundle(tmp_path / "b", "b")


# 1. Concurrent publishers


def test_concurrent_publishes_of_different_models_keep_both_index_entries(tmp_path, bundles):
    for trial in range(TRIALS):
        registry = tmp_path / f"registry-{trial}"
        results = race(
            tmp_path / f"t{trial}", [(bundles[0], "model-a", "1", registry), (bundles[1], "model-b", "1", registry)]
        )
        assert [r[0] for r in results] == [0, 0], results
        assert set(read_json(registry / "index.json")["models"]) == {"model-a", "model-b"}
        for name in ("model-a", "model-b"):
            verify(local.resolve(registry, name))


def test_concurrent_publishes_of_one_version_with_different_content_admit_one(tmp_path, bundles):
    for trial in range(TRIALS):
        registry = tmp_path / f"registry-{trial}"
        results = race(tmp_path / f"t{trial}", [(b, "m", "1", registry) for b in bundles])
        assert sorted(r[0] for r in results) == [0, 2], results
        winner = bundles[[r[0] for r in results].index(0)]
        loser_err = next(r[2] for r in results if r[0] == 2)
        assert "m version 1 already exists" in loser_err and "different content" in loser_err
        stored = verify(registry / "m" / "1")
        assert stored["bundle_digest"] == read_json(winner / MANIFEST)["bundle_digest"]
        assert (
            read_json(registry / "index.json")["models"]["m"]["versions"]["1"]["bundle_digest"]
            == stored["bundle_digest"]
        )


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_lock_that_is_a_link_changes_nothing_outside_the_registry(tmp_path, bundles, target_exists):
    """registry/.lock -> a file elsewhere: the publisher must neither create it nor change its mode."""
    registry, outside = tmp_path / "registry", tmp_path / "someone-elses-file"
    registry.mkdir()
    if target_exists:
        outside.write_text("keep")
        outside.chmod(0o600)
    (registry / ".lock").symlink_to(outside)
    with pytest.raises(PipelineError, match=r"registry lock .*\.lock is a symbolic link"):
        local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    if target_exists:
        assert stat.S_IMODE(outside.stat().st_mode) == 0o600 and outside.read_text() == "keep"
    else:
        assert not outside.exists()
    assert not (registry / "m").exists()


def test_a_lock_that_is_a_fifo_is_refused_without_blocking(tmp_path, bundles):
    registry = tmp_path / "registry"
    registry.mkdir()
    os.mkfifo(registry / ".lock")
    with pytest.raises(PipelineError, match="is not a regular file"):
        local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))


def test_a_killed_publishs_temp_dir_goes_with_the_next_publish_of_any_version(tmp_path, bundles):
    """kill -9 mid-copy leaves registry/m/.1.tmp-*; the next publish, of another version, removes it under the lock."""
    registry = tmp_path / "registry"
    local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    left = registry / "m" / ".2.tmp-killed"
    (left / "model").mkdir(parents=True)
    (left / "model" / "weights.bin").write_text("half")
    local.publish(bundles[1], "m", "3", {}, publish_settings(registry_dir=str(registry)))
    assert not left.exists() and sorted(p.name for p in (registry / "m").iterdir()) == ["1", "3", "latest"]


def test_verify_never_follows_or_prints_a_latest_that_is_not_a_version(tmp_path, bundles):
    registry = tmp_path / "registry"
    local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    big = tmp_path / "big.txt"
    big.write_text("SECRET-CONTENT " * 10000)
    (registry / "m" / "latest").unlink()
    (registry / "m" / "latest").symlink_to(big)
    r = cli("verify", str(registry / "m" / "latest"), cwd=tmp_path)
    assert r.returncode != 0 and "is a link or not a file" in r.stderr and "SECRET" not in r.stdout + r.stderr
    (registry / "m" / "latest").unlink()
    (registry / "m" / "latest").write_text("SECRET-CONTENT " * 100)
    r = cli("verify", str(registry / "m" / "latest"), cwd=tmp_path)
    assert r.returncode != 0 and "not a registry's latest file" in r.stderr and "SECRET" not in r.stdout + r.stderr
    (registry / "m" / "latest").write_text("1\n")
    assert cli("verify", str(registry / "m" / "latest"), cwd=tmp_path).returncode == 0


def test_a_malformed_index_or_manifest_is_one_line_not_a_traceback(tmp_path, bundles):
    registry = tmp_path / "registry"
    local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    index = read_json(registry / "index.json")
    index["models"]["m"]["versions"]["1"]["bundle_digest"] = 12345
    write_json(registry / "index.json", index)
    with pytest.raises(PipelineError, match="registry index .* is corrupt"):
        local.resolve(registry, "m")
    (registry / "index.json").write_text('{"models": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(PipelineError, match="nested too deeply"):
        local.resolve(registry, "m")
    (bundles[1] / MANIFEST).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(PipelineError, match="MANIFEST.json is malformed: JSON nested too deeply"):
        verify(bundles[1])


def test_a_registry_inside_the_bundle_is_refused_before_any_copy(bundles):
    registry = bundles[0] / "model" / "registry"
    with pytest.raises(PipelineError, match="is inside the bundle"):
        local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    assert not registry.exists()


# 2. Names reach the filesystem


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", ".hidden", "a..b", "x" * 129, "index.json"])
def test_hostile_names_write_nothing(tmp_path, bundles, name):
    registry = tmp_path / "deep" / "registry"
    with pytest.raises(PipelineError, match="name"):
        local.publish(bundles[0], name, "1", {}, publish_settings(registry_dir=str(registry)))
    assert not (tmp_path / "deep").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("backend", ["mlflow", "hf"])
def test_remote_backends_check_names_before_anything(tmp_path, bundles, backend):
    cfg = publish_settings(mlflow={"tracking_uri": f"http://127.0.0.1:{free_port()}"}, hf={"namespace": "acme"})
    with pytest.raises(PipelineError, match="invalid model name '../x'"):
        get_backend(backend).publish(bundles[0], "../x", "1", {}, cfg)


# 3. verify() against doctored bundles


def test_symlinked_file_is_refused_even_with_the_right_content(tmp_path, bundles):
    outside = tmp_path / "outside-readme"
    outside.write_text((bundles[0] / "README.md").read_text())
    (bundles[0] / "README.md").unlink()
    (bundles[0] / "README.md").symlink_to(outside)
    with pytest.raises(PipelineError, match="README.md is a symlink"):
        verify(bundles[0])


def test_symlinked_directory_is_refused(tmp_path, bundles):
    (bundles[0] / "model").rename(tmp_path / "outside-model")
    (bundles[0] / "model").symlink_to(tmp_path / "outside-model")
    with pytest.raises(PipelineError, match="model is a symlink"):
        verify(bundles[0])


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_files_are_refused(bundles, kind):
    path = bundles[0] / "model" / kind
    if kind == "fifo":
        os.mkfifo(path)
        made = None
    else:
        made = socket.socket(socket.AF_UNIX)
        made.bind(str(path))
    try:
        with pytest.raises(PipelineError, match=f"model/{kind} is not a regular file"):
            verify(bundles[0])
    finally:
        if made:
            made.close()


def test_nested_manifest_is_refused(bundles):
    (bundles[0] / "model" / MANIFEST).write_text("{}\n")  # used to be skipped: unverified content
    with pytest.raises(PipelineError, match="nested model/MANIFEST.json"):
        verify(bundles[0])


@pytest.mark.parametrize("entry", ["../outside", "/etc/passwd", "model/../README.md", "model//x"])
def test_manifest_entries_outside_the_bundle_are_refused(bundles, entry):
    manifest = read_json(bundles[0] / MANIFEST)
    manifest["files"][entry] = {"sha256": "0" * 64, "size": 1}
    write_json(bundles[0] / MANIFEST, manifest)
    with pytest.raises(PipelineError, match="unsafe path"):
        verify(bundles[0])


def test_edited_digest_is_refused_and_never_published(tmp_path, bundles):
    manifest = read_json(bundles[0] / MANIFEST)
    manifest["bundle_digest"] = "f" * 64
    write_json(bundles[0] / MANIFEST, manifest)
    with pytest.raises(PipelineError, match="bundle_digest in MANIFEST.json does not match its files"):
        verify(bundles[0])
    with pytest.raises(PipelineError, match="does not match"):
        local.publish(bundles[0], "m", "ffffffffffff", {}, publish_settings(registry_dir=str(tmp_path / "registry")))
    assert not (tmp_path / "registry").exists()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"files": {}}',
        '{"bundle_digest": "%s", "files": []}' % ("0" * 64),
        '{"bundle_digest": "%s", "files": {"a": {"size": 1}}}' % ("0" * 64),
        '{"bundle_digest": "%s", "files": {"a": {"sha256": "%s", "size": "1"}}}' % ("0" * 64, "0" * 64),
        '{"bundle_digest": 5, "files": {}}',
        b"\xff\xfe{}",
    ],
    ids=["bad-json", "list", "no-digest", "files-list", "no-sha", "size-str", "digest-int", "bad-utf8"],
)
def test_malformed_manifest_is_one_pipeline_error_naming_it(bundles, text):
    path = bundles[0] / MANIFEST
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PipelineError, match="MANIFEST.json") as e:
        verify(bundles[0])
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_doctored_bundles_are_one_line_from_the_cli(tmp_path, bundles):
    (bundles[0] / MANIFEST).write_text("{not json")
    assert "MANIFEST.json is not valid JSON" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))
    os.mkfifo(bundles[1] / "pipe")
    assert "pipe is not a regular file" in one_error_line(cli("verify", str(bundles[1]), cwd=tmp_path))


# 4. The registry does not trust its own copies; team-readable modes


def tamper(path: Path) -> None:
    path.chmod(0o644)
    path.write_text(path.read_text() + "tampered\n")


def test_tampered_stored_version_is_refused_and_latest_stays(tmp_path, bundles):
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    local.publish(bundles[0], "m", "1", {}, cfg)
    local.publish(bundles[1], "m", "2", {}, cfg)
    tamper(tmp_path / "registry/m/1/README.md")
    with pytest.raises(
        PipelineError, match="stored m version 1 in the local registry at .*/ fails verification: .*README.md"
    ):
        local.publish(bundles[0], "m", "1", {}, cfg)  # a rollback to 1 must not land on the tampered copy
    assert (tmp_path / "registry/m/latest").read_text() == "2\n"
    assert read_json(tmp_path / "registry/index.json")["models"]["m"]["latest"] == "2"
    with pytest.raises(PipelineError, match="fails verification"):
        local.resolve(cfg.registry_dir, "m", "1")


def test_remanifested_stored_version_is_caught_by_the_index_digest(tmp_path, bundles):
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    local.publish(bundles[0], "m", "1", {}, cfg)
    stored = tmp_path / "registry/m/1"
    tamper(stored / "README.md")
    (stored / MANIFEST).chmod(0o644)
    write_manifest(stored, {})  # self-consistent again, but not what was published
    with pytest.raises(PipelineError, match="fails verification: its digest differs from the one the index"):
        local.resolve(cfg.registry_dir, "m")


def test_published_files_are_team_readable_whatever_the_umask(tmp_path, bundles):
    for path in [*bundles[0].rglob("*"), bundles[0]]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    old = os.umask(0o077)
    try:
        local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(tmp_path / "registry")))
    finally:
        os.umask(old)
    registry = tmp_path / "registry"
    for path in [registry, registry / "m", *(registry / "m").rglob("*"), registry / "index.json"]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))


# 5. Corrupt index, failing copies


@pytest.mark.parametrize("text", ["{not json", '{"models": []}', '{"models": {"m": {"versions": 1}}}'])
def test_corrupt_index_is_one_line_naming_it(tmp_path, bundles, text):
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "index.json").write_text(text)
    for action in (
        lambda: local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry))),
        lambda: local.resolve(registry, "m"),
    ):
        with pytest.raises(PipelineError, match=f"registry index {registry / 'index.json'} is corrupt") as e:
            action()
        assert "\n" not in str(e.value)
    assert not (registry / "m" / "1").exists()


def test_failing_copy_is_one_line_and_leaves_no_partial_version(tmp_path):
    bundle = make_bundle(tmp_path / "big", "z", weights=65536)
    registry = tmp_path / "registry"
    r = subprocess.run(
        [sys.executable, "-c", SMALL_DISK, str(bundle), str(registry)],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    line = one_error_line(r)
    assert "weights.bin" in line and "File too large" in line
    assert list((registry / "m").iterdir()) == []  # no version, no temp dir
    assert not (registry / "index.json").exists()


# 6. Registry references through the CLI


@pytest.fixture
def registry_with_two(tmp_path, bundles):
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    local.publish(bundles[0], "m", "1.0", {}, cfg)
    local.publish(bundles[1], "m", "2.0", {}, cfg)
    return tmp_path / "registry"


def test_verify_accepts_registry_references(tmp_path, registry_with_two):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for ref, version in [("m@latest", "2.0"), ("m@1.0", "1.0")]:
        r = cli("verify", ref, "--registry", str(registry_with_two), cwd=elsewhere)
        assert r.returncode == 0 and f"registry/m/{version})" in r.stdout, r.stderr
    r = cli("verify", "registry/m/latest", cwd=tmp_path)  # the alias file names its version
    assert r.returncode == 0 and "registry/m/2.0" in r.stdout, r.stderr
    r = cli("verify", "m@1.0", cwd=tmp_path)  # default: ./registry
    assert r.returncode == 0, r.stderr
    (elsewhere / "params.yaml").write_text(f"publish:\n  registry_dir: {registry_with_two}\n")
    r = cli("verify", "m@latest", cwd=elsewhere)  # default: publish.registry_dir
    assert r.returncode == 0 and "m/2.0" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "ref, expected",
    [
        # issue #49: "in registry registry" (publish.registry_dir's default is `registry`)
        ("m@9.9", "m has no version '9.9' in the local registry at registry/"),
        ("nope@latest", "no model 'nope' in the local registry at registry/"),
        ("../m@1.0", "invalid model name"),
        ("m@../1.0", "invalid publish version"),
    ],
)
def test_bad_references_are_one_line(tmp_path, registry_with_two, ref, expected):
    assert expected in one_error_line(cli("verify", ref, cwd=tmp_path))


def test_status_counts_versions_in_words(tmp_path, bundles):
    """Issue #49: `modelprep status` said "(1 versions)"."""
    cfg = publish_settings(registry_dir=str(tmp_path / "registry"))
    local.publish(bundles[0], "one", "1.0", {}, cfg)
    local.publish(bundles[0], "two", "1.0", {}, cfg)
    local.publish(bundles[1], "two", "2.0", {}, cfg)
    out = cli("status", cwd=tmp_path).stdout
    assert "registry one: latest 1.0 (1 version)\n" in out and "registry two: latest 2.0 (2 versions)\n" in out


def test_references_to_tampered_versions_are_one_line(tmp_path, registry_with_two):
    tamper(registry_with_two / "m/2.0/model/config.json")
    for ref in ("m@latest", "registry/m/latest"):
        assert "fails verification" in one_error_line(cli("verify", ref, cwd=tmp_path))
    (registry_with_two / "m/latest").write_text("../../etc\n")
    assert "invalid publish version" in one_error_line(cli("verify", "registry/m/latest", cwd=tmp_path))


# 7. Secrets


def test_mlflow_errors_never_show_the_tracking_password(bundles):
    uri = f"http://alice:s3cret-pw@127.0.0.1:{free_port()}"
    with pytest.raises(PipelineError, match="unreachable") as e:
        get_backend("mlflow").publish(bundles[0], "m", "1", {}, publish_settings(mlflow={"tracking_uri": uri}))
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)
    assert "http://***@127.0.0.1" in str(e.value)


def test_redaction_of_uris_and_params():
    from pipeline.core.redact import redact_params, redact_uri

    assert (
        redact_uri("at http://alice:s3cret@host:5000/x, https://bob@h/ and http://h:1/p")
        == "at http://***@host:5000/x, https://***@h/ and http://h:1/p"
    )
    assert redact_uri("postgresql://u:p@ss@db/x") == "postgresql://***@db/x"  # unescaped '@' in the password
    params = {
        "publish": {"mlflow": {"tracking_uri": "http://u:pw@h:5000"}, "hf": {"token": "hf_abc"}},
        "creds": [{"db_password": "pw", "apiKey": "k", "HF_TOKEN": None}],
        "draft_training": {"max_new_tokens": 96},
        "client_secret": {"nested": "x"},
    }
    redacted = redact_params(params)
    assert redacted == {
        "publish": {"mlflow": {"tracking_uri": "http://***@h:5000"}, "hf": {"token": "***"}},
        "creds": [{"db_password": "***", "apiKey": "***", "HF_TOKEN": None}],
        "draft_training": {"max_new_tokens": 96},
        "client_secret": "***",
    }
    assert params["publish"]["hf"]["token"] == "hf_abc"  # a copy; the input is untouched
    # issue #49: an empty mapping under a secret-named key holds nothing to hide, and must read as empty
    assert redact_params({"secret_env": {}, "api_key": [], "secret": {"VAR": "name/key"}}) == {
        "secret_env": {},
        "api_key": [],
        "secret": "***",
    }


def test_secret_query_parameters_are_redacted_too():
    from pipeline.core.redact import redact_uri

    assert (
        redact_uri("GET https://h/api?x=1&token=abc123&access_token=t2;sig=zz#f")
        == "GET https://h/api?x=1&token=***&access_token=***;sig=***#f"
    )
    assert redact_uri("max_tokens=96 &tokens=1") == "max_tokens=96 &tokens=***"  # a query-looking key is hidden
    assert redact_uri("?max_new_tokens=5") == "?max_new_tokens=***"


STAGE_THAT_LEAKS = """
import logging, os, subprocess, sys
from pipeline.core.stage import say, stage_main

@stage_main("leaky")
def main(argv):
    uri = os.environ["MLFLOW_TRACKING_URI"]
    print(f"View run at: {uri}/#/experiments/1", flush=True)  # what MLflow prints
    logging.getLogger("mlflow").warning("retrying %s", uri)
    os.write(2, f"raw fd write {uri}\\n".encode())
    subprocess.run([sys.executable, "-c", f"print('child process {uri}?token=tok-secret-9')"], check=True)
    say(f"publish: {uri}/api?api_key=key-secret-7")

main()
"""


def test_every_line_a_stage_and_its_children_write_reaches_the_log_redacted(tmp_path):
    """A password in MLFLOW_TRACKING_URI (the environment, where secrets belong) printed by a library, by logging,
    by a raw write to fd 2 or by a child process, and a key in a console line: none reaches the log or console."""
    env = {**ENV, "MLFLOW_TRACKING_URI": "http://bob:pw-secret-1@127.0.0.1:5123"}
    r = subprocess.run(
        [sys.executable, "-c", STAGE_THAT_LEAKS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "artifacts/logs/leaky.log").read_text()
    for line in (
        "View run at: http://***@127.0.0.1:5123",
        "retrying http://***@127.0.0.1:5123",
        "raw fd write http://***@127.0.0.1:5123",
        "child process http://***@127.0.0.1:5123?token=***",
    ):
        assert line in log, log
    assert "publish: http://***@127.0.0.1:5123/api?api_key=***" in r.stdout
    for secret in ("pw-secret-1", "tok-secret-9", "key-secret-7", "bob"):
        assert secret not in log + r.stdout + r.stderr


STAGE_ON_A_FULL_DISK = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail (EFBIG), as a full disk fails them
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
from pipeline.core.stage import say, stage_main

@stage_main("full")
def main(argv):
    for i in range(20000):  # far more than the pipe holds: the copier must keep draining after the log fails
        print(f"library line {i} " + "x" * 60)
    say("full: done")

main()
"""


def test_a_stage_whose_log_fills_the_disk_finishes_instead_of_hanging(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", STAGE_ON_A_FULL_DISK], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "full: done" in r.stdout, r.stderr[-2000:]
    assert (tmp_path / "artifacts/logs/full.log").stat().st_size <= 16384


STAGE_WITH_A_SPAWNED_PROCESS = """
import multiprocessing, time
from pipeline.core.stage import say, stage_main

def child():
    print("from the spawned child", flush=True)

@stage_main("spawned")
def main(argv):
    # a spawn-context process starts multiprocessing's resource tracker, which keeps a copy of fd 2 (the log's pipe)
    # until the stage exits, as vLLM's engine does in the evaluate stage
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    print("partial line without a newline", end="", flush=True)
    say("spawned: done")

if __name__ == "__main__":
    t0 = time.perf_counter()
    try:
        main()
    finally:
        print(f"took {time.perf_counter() - t0:.2f}")
"""


def test_a_process_holding_the_log_pipe_does_not_delay_the_stage_end(tmp_path):
    """The log copier stops once the stage is done and the pipe is drained, not at EOF: the resource tracker holds
    the pipe open until the stage exits, which cost every evaluate stage on a GPU 10 s after its summary line."""
    (tmp_path / "spawned_stage.py").write_text(STAGE_WITH_A_SPAWNED_PROCESS)
    r = subprocess.run(
        [sys.executable, "spawned_stage.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "spawned: done" in r.stdout, r.stderr[-2000:]
    assert float(r.stdout.split("took ")[-1]) < 5.0  # was 10 s (the copier's join timeout) and more
    log = (tmp_path / "artifacts/logs/spawned.log").read_text()
    assert "from the spawned child\n" in log and log.endswith("partial line without a newline"), log


@pytest.mark.parametrize(
    "where, value",
    [
        (("publish", "mlflow", "tracking_uri"), "http://bob:pw@mlflow.internal:5000"),
        (("publish", "mlflow", "tracking_uri"), "https://mlflow.internal/?token=abc"),
        (("data", "traffic"), "s3://key:secret@bucket/traffic.jsonl"),
    ],
)
def test_params_never_carry_credentials(tmp_path, where, value):
    """Params are recorded in dvc.lock, PROVENANCE.json and logs: a credential there is refused up front."""
    from pipeline.rules import validate
    from tiny_project import tiny_params

    p = tiny_params()
    node = p
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    key = re.escape(".".join(where))
    with pytest.raises(PipelineError, match=rf"{key} holds a credential") as e:
        validate(p, tmp_path / "params.yaml")
    assert "pw" not in str(e.value) and "abc" not in str(e.value) and "secret" not in str(e.value).split("holds")[0]


# 8. Status of a variant published under allow_fail


def test_status_flags_allowed_failures(tmp_path):
    (tmp_path / "params.yaml").write_text("publish:\n  registry_dir: registry\n")
    write_json(
        tmp_path / "artifacts/gate/verdict.json",
        {
            "variants": {
                "good": {"passed": True, "allowed_failure": False, "checks": []},
                "flagged": {"passed": False, "allowed_failure": True, "checks": []},
                "bad": {"passed": False, "allowed_failure": False, "checks": []},
            }
        },
    )
    out = cli("status", cwd=tmp_path).stdout.splitlines()  # dvc status fails here (no repo); gates still print
    assert {"gate good: pass", "gate flagged: FAIL (allowed, flagged)", "gate bad: FAIL"} <= set(out), out


# 5. Issue #47's minor cases


def test_a_bundle_nested_1200_directories_deep_is_one_line_not_a_recursion_error(tmp_path):
    """The walk is a loop (a bundle as deep as MAX_DEPTH verifies, an edit deep down is found) and deeper than that
    is one line: 1,200 levels were a RecursionError (issue #47)."""
    from pipeline.release.manifest import MAX_DEPTH

    b = make_bundle(tmp_path / "deep")
    levels = [b.joinpath(*["d"] * n) for n in range(1, 1201)]
    try:
        for level in levels[:MAX_DEPTH]:  # not mkdir(parents=True): pathlib's own recursion
            level.mkdir()
        (levels[MAX_DEPTH - 1] / "leaf.txt").write_text("x")
        write_manifest(b, {"variant": "a"})
        assert "/".join(["d"] * MAX_DEPTH) + "/leaf.txt" in verify(b)["files"]
        (levels[MAX_DEPTH - 1] / "leaf.txt").write_text("y")
        with pytest.raises(PipelineError, match="sha256 mismatch for d/d/"):
            verify(b)
        for level in levels[MAX_DEPTH:]:
            level.mkdir()
        (levels[-1] / "leaf.txt").write_text("x")
        with pytest.raises(PipelineError, match=f"d/... is nested more than {MAX_DEPTH} directories deep"):
            write_manifest(b, {"variant": "a"})
        line = one_error_line(cli("verify", str(b), cwd=tmp_path))
        assert f"nested more than {MAX_DEPTH} directories deep" in line
    finally:  # pytest's cleanup (shutil.rmtree, recursive) would fail on it, in this session or a later one
        for level in (levels[-1], levels[MAX_DEPTH - 1]):
            (level / "leaf.txt").unlink(missing_ok=True)
        for level in reversed(levels):
            if level.is_dir():
                level.rmdir()


def test_verify_fails_closed_when_the_signing_policy_cannot_be_read(tmp_path, bundles):
    """`modelprep verify` with params.yaml a FIFO printed `ok` without checking a signature; run where there is no
    params.yaml, a signed bundle passed unchecked too."""
    (tmp_path / "params.yaml").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "params.yaml")
    r = cli("verify", str(bundles[0]), cwd=tmp_path)
    assert "params.yaml is not a regular file" in one_error_line(r)
    (tmp_path / "params.yaml").unlink()
    (tmp_path / "params.yaml").symlink_to("/dev/zero")
    assert "params.yaml is not a regular file" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))
    (tmp_path / "params.yaml").unlink()
    assert cli("verify", str(bundles[0]), cwd=tmp_path).returncode == 0  # unsigned, no policy: nothing to check
    (bundles[0] / "model.sig").write_text("{}")  # signed (the signature is outside the manifest)
    assert "is signed, and there is no params.yaml here" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))


def test_verify_reads_a_bounded_params_file_and_refuses_what_is_not_params(tmp_path, bundles):
    """The policy is read with a non-blocking open and a bounded read: a 2 MB params.yaml, a YAML alias bomb or a
    list are one line, never `ok` with the signature unchecked nor a read without end."""
    params = tmp_path / "params.yaml"
    params.write_text("publish:\n  registry_dir: registry\n" + "# padding\n" * 250_000)
    assert "params.yaml is over 1048576 bytes" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))
    params.write_text("a: &a [x, x]\nb: &b [*a, *a]\npublish: {signing: {public_key: *b}}\n")
    assert "YAML aliases (*a) are not allowed" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))
    params.write_text("- publish\n")
    assert "params.yaml: expected a mapping" in one_error_line(cli("verify", str(bundles[0]), cwd=tmp_path))


def test_status_with_a_malformed_or_fifo_verdict_is_one_line(tmp_path):
    verdict = tmp_path / "artifacts/gate/verdict.json"
    verdict.parent.mkdir(parents=True)
    verdict.write_text('{"variants": [1, 2]}')
    r = cli("status", cwd=tmp_path)
    assert "verdict.json is malformed" in r.stderr and "Traceback" not in r.stderr and r.returncode == 2
    verdict.unlink()
    os.mkfifo(verdict)
    r = cli("status", cwd=tmp_path)  # cli's timeout: a hang fails the test
    assert "verdict.json is not a regular file" in r.stderr and r.returncode == 2


def test_a_registry_whose_index_was_deleted_does_not_read_as_empty(tmp_path, bundles):
    registry = tmp_path / "registry"
    local.publish(bundles[0], "m", "1", {}, publish_settings(registry_dir=str(registry)))
    (registry / "index.json").unlink()
    with pytest.raises(PipelineError, match=r"registry index .*index.json is missing although the registry holds m"):
        local.resolve(registry, "m")
    with pytest.raises(PipelineError, match="is missing"):
        local.publish(bundles[1], "m", "2", {}, publish_settings(registry_dir=str(registry)))
    r = cli("status", cwd=tmp_path)
    assert "index.json is missing" in r.stderr and r.returncode == 2


def test_a_full_disk_while_indexing_leaves_no_unindexed_version_and_names_the_path(tmp_path):
    """Issue #47: on a nearly full registry filesystem the version's copy fitted and the index did not: a version
    left unindexed (or an index without its `latest`), and `No space left on device` without a path. Simulated
    with a real size limit (RLIMIT_FSIZE in a child process: writes past it fail with EFBIG as a full disk fails
    with ENOSPC): the registry's index already holds many models, so the new index is the one write too big."""
    registry = tmp_path / "registry"
    registry.mkdir()
    models = {
        f"model-{i:03d}": {"latest": "1", "versions": {"1": {"bundle_digest": "0" * 64, "tags": {}}}}
        for i in range(200)
    }
    write_json(registry / "index.json", {"models": models})
    before = (registry / "index.json").read_bytes()
    assert len(before) > 16384  # SMALL_DISK's limit; the bundle's files are each below it
    bundle = make_bundle(tmp_path / "small", "s", weights=2048)
    r = subprocess.run(
        [sys.executable, "-c", SMALL_DISK, str(bundle), str(registry)],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    line = one_error_line(r)
    assert f"{registry}/index.json" in line and "File too large" in line
    assert (registry / "index.json").read_bytes() == before  # the old index, whole
    assert sorted(p.name for p in (registry / "m").iterdir()) == []  # no version, no latest, no temp file
    assert sorted(p.name for p in registry.iterdir()) == [".lock", "index.json", "m"]
    outside = tmp_path / "outside.txt"
    outside.write_text("not the registry's")
    (registry / ".index.json.staged").symlink_to(outside)  # a killed publish's leftover, or a planted link
    local.publish(bundle, "m", "1", {}, publish_settings(registry_dir=str(registry)))  # room again: it publishes
    assert local.resolve(registry, "m") == registry / "m" / "1"
    assert outside.read_text() == "not the registry's" and not os.path.lexists(registry / ".index.json.staged")


class Misbehaving:
    """A real HTTP server on loopback (stdlib, in a thread) that plays a broken MLflow tracking server: `500`
    answers every request with 500; `stall` answers /health and then never answers anything else."""

    def __init__(self, mode: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        release = self.release = threading.Event()
        self.requests: list[str] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                requests.append(f"{self.command} {self.path}")
                if mode == "stall" and not self.path.startswith("/health"):
                    release.wait(120)  # holds the connection open, silent, until the test ends
                    return
                status = 500 if mode == "500" else 200
                body = b'{"error_code": "INTERNAL_ERROR", "message": "boom"}' if status == 500 else b"OK"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = answer

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Misbehaving":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["500", "stall"])
def test_a_misbehaving_mlflow_server_is_one_line_in_bounded_time(bundles, mode, monkeypatch, capsys):
    """Issue #47: a server answering 500 gave its one line after 248 s (MLflow's client: 7 retries, backoff 2);
    one answering /health and then stalling kept publish silent for 590 s (120 s per request, retried). Each
    request is now bounded, and a line before each call says what publish waits for."""
    import time

    for var in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(var, raising=False)
    if mode == "stall":  # the user's own bound wins over the default (30 s), which keeps this test short
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with Misbehaving(mode) as server:
        t0 = time.monotonic()
        with pytest.raises(PipelineError) as e:
            get_backend("mlflow").publish(
                bundles[0], "m", "1", {}, publish_settings(mlflow={"tracking_uri": server.uri})
            )
        elapsed = time.monotonic() - t0
    assert "\n" not in str(e.value) and str(e.value).startswith(f"MLflow registry {server.uri}:")
    assert elapsed < 40, elapsed
    timeout = "2" if mode == "stall" else "30"
    assert (
        f"mlflow: looking up m version 1 at {server.uri} (each request up to {timeout} s, 2 retries)"
        in capsys.readouterr().out
    )
    assert any("model-versions/search" in r for r in server.requests), server.requests
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ or mode == "stall"  # the bounds don't outlive publish
