"""MLflow Model Registry backend: the bundle as run artifacts plus a registered model version.

MLflow numbers model versions itself (1, 2, ...); the pipeline's version (content hash or an
explicit label) is kept in the `version_label` tag, next to `bundle_digest`. Immutability is
by label: a label already registered with the same digest is "already published" (no new run),
with a different digest it is refused. The model version is created only after every artifact
is uploaded, so the registry never points at a half-uploaded bundle.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.core.errors import PipelineError
from pipeline.core.redact import redact_uri
from pipeline.release.manifest import verify
from pipeline.release.registry import already_published, check_name, check_version, first_line
from pipeline.release.settings import PublishParams

ARTIFACT_PATH = "bundle"
HEALTH_TIMEOUT_S = 10


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
        existing = client.search_model_versions(_label_filter(name, version))
        if already_published(name, version, existing[0].tags.get("bundle_digest") if existing else None,
                             digest, f"MLflow registry {redact_uri(uri)}"):
            return {"name": name, "version": version, "uri": f"models:/{name}/{existing[0].version}",
                    "status": "already published"}
        run_id = _log_bundle(client, bundle, name, version, tags, manifest, cfg)
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
