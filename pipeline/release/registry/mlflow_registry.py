"""MLflow Model Registry backend: the bundle as run artifacts plus a registered model version.

MLflow numbers model versions itself (1, 2, ...); the pipeline's version (content hash or an
explicit label) is kept in the `version_label` tag, next to `bundle_digest`. Immutability is
by label: a label already registered with the same digest is "already published" (no new run),
with a different digest it is refused. The model version is created only after every artifact
is uploaded, so the registry never points at a half-uploaded bundle.
"""
from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.core.errors import PipelineError
from pipeline.core.redact import redact_uri
from pipeline.release.manifest import verify
from pipeline.release.registry import (already_published, check_name, check_stored_signature, check_version,
                                       first_line)
from pipeline.release.settings import PublishParams

ARTIFACT_PATH = "bundle"
HEALTH_TIMEOUT_S = 10
# Each request MLflow's client makes, bounded (issue #47: a server answering 500 took 248 s to give up, one that
# answered /health and then stalled kept publish silent for 590 s): its defaults are a 120 s timeout and 7 retries
# with a backoff factor of 2. The user's own MLFLOW_HTTP_REQUEST_* variables win.
REQUEST_BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def tracking_uri(cfg: PublishParams) -> str:
    uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise PipelineError("publish.backend mlflow needs publish.mlflow.tracking_uri in params.yaml "
                            "or MLFLOW_TRACKING_URI in the environment")
    return uri


def check_reachable(uri: str) -> None:
    """Fail in seconds: MLflow's client retries an unreachable server with backoff
    (MLFLOW_HTTP_REQUEST_MAX_RETRIES), which takes minutes."""
    if not uri.startswith(("http://", "https://")):
        return
    # urllib takes `user:password@` for part of the host name; /health needs no credentials anyway.
    parts = urlsplit(uri)
    probe = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    try:
        with urllib.request.urlopen(probe.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        return  # it answered (e.g. 401 behind an auth proxy); MLflow's client brings the credentials
    except (urllib.error.URLError, OSError) as e:
        raise PipelineError(redact_uri(f"MLflow tracking server {uri} is unreachable ({getattr(e, 'reason', e)})")) \
            from None


@contextlib.contextmanager
def bounded_requests():
    """REQUEST_BOUNDS for the variables the environment does not set, for the duration of a publish."""
    added = {k: v for k, v in REQUEST_BOUNDS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield int(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]), int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    finally:
        for k in added:
            os.environ.pop(k, None)


def waiting(uri: str, what: str, bounds: tuple[int, int]) -> None:
    """The line that says what publish is waiting for, before each call to the server."""
    from pipeline.core.stage import say

    say(redact_uri(f"mlflow: {what} at {uri} (each request up to {bounds[0]} s, {bounds[1]} retries)"))


def _label_filter(name: str, version: str) -> str:
    return f"name = '{name}' and tags.version_label = '{version}'"


def publish(bundle: Path, name: str, version: str, tags: dict, cfg: PublishParams) -> dict:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    check_name(name)
    check_version(version)
    manifest = verify(bundle)
    digest = manifest["bundle_digest"]
    uri = tracking_uri(cfg)
    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        with bounded_requests() as bounds:
            waiting(uri, f"looking up {name} version {version}", bounds)
            existing = client.search_model_versions(_label_filter(name, version))
            where = f"MLflow registry {redact_uri(uri)}"
            if already_published(name, version, existing[0].tags.get("bundle_digest") if existing else None,
                                 digest, where):
                check_stored_signature(_stored_signature(client, existing[0].run_id), bundle,
                                       cfg.signing.public_key, name, version, where)
                return {"name": name, "version": version, "uri": f"models:/{name}/{existing[0].version}",
                        "status": "already published"}
            waiting(uri, f"uploading {len(manifest['files'])} bundle files", bounds)
            run_id = _log_bundle(client, bundle, name, version, tags, manifest, cfg)
            waiting(uri, f"registering {name} version {version}", bounds)
            try:
                client.create_registered_model(name)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            source = f"{client.get_run(run_id).info.artifact_uri}/{ARTIFACT_PATH}"
            mv = client.create_model_version(
                name, source, run_id=run_id,
                tags={**{k: str(v) for k, v in tags.items()}, "version_label": version, "bundle_digest": digest},
                description=f"modelprep bundle {version} (sha256 digest {digest})")
    except (MlflowException, OSError) as e:  # OSError covers requests' connection errors mid-upload
        # MLflow's messages repeat the request URL, credentials included.
        raise PipelineError(redact_uri(f"MLflow registry {uri}: {first_line(e)}")) from None
    return {"name": name, "version": version, "uri": f"models:/{name}/{mv.version}", "status": "published"}


def _stored_signature(client, run_id: str) -> bytes | None:
    """The model.sig a registered version's run holds; None when it has none."""
    import tempfile

    from mlflow.exceptions import MlflowException

    from pipeline.release.signing import SIGNATURE

    names = {Path(f.path).name for f in client.list_artifacts(run_id, ARTIFACT_PATH)}
    if SIGNATURE not in names:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, f"{ARTIFACT_PATH}/{SIGNATURE}", tmp)
        except MlflowException:
            return None
        return Path(path).read_bytes()


def _log_bundle(client, bundle: Path, name: str, version: str, tags: dict, manifest: dict, cfg: PublishParams) -> str:
    """A run holding the whole bundle directory as artifacts; FAILED if the upload breaks."""
    experiment = cfg.mlflow.experiment or "modelprep"
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run_tags = {**{k: str(v) for k, v in tags.items()}, "version_label": version,
                "bundle_digest": manifest["bundle_digest"]}
    commit = manifest.get("provenance", {}).get("git_commit")
    if commit:
        run_tags["mlflow.source.git.commit"] = commit
    run = client.create_run(experiment_id, run_name=f"{name}-{version}", tags=run_tags)
    try:
        client.log_artifacts(run.info.run_id, str(bundle), artifact_path=ARTIFACT_PATH)
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id
