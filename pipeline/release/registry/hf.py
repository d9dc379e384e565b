"""Hugging Face Hub backend: one model repo per published name, one git tag per version.

The repo's main branch mirrors the latest published bundle (files of older bundles are deleted in
the same commit, so a download verifies against its MANIFEST.json); each version is a tag on the
commit that uploaded it. Immutability is by tag: an existing tag whose MANIFEST.json has the same
digest is "already published", a different digest is refused. The token comes from HF_TOKEN only,
never from a cached login, so what publishes is what the environment says.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.release.manifest import MANIFEST, verify
from pipeline.release.registry import (already_published, check_name, check_stored_signature, check_version,
                                       first_line)
from pipeline.release.settings import PublishParams


def _token() -> str:
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise PipelineError("publish.backend hf needs the Hugging Face Hub, but HF_HUB_OFFLINE is set; "
                            "unset it or use publish.backend local")
    token = os.environ.get("HF_TOKEN")
    if not token:
        raise PipelineError("publish.backend hf needs a Hub write token in HF_TOKEN")
    return token


def repo_id(name: str, cfg: PublishParams) -> str:
    namespace = cfg.hf.namespace
    return f"{namespace}/{name}" if namespace else name


def publish(bundle: Path, name: str, version: str, tags: dict, cfg: PublishParams) -> dict:
    import httpx
    from huggingface_hub import HfApi, errors

    check_name(name)  # a name with '/' would be another namespace's repo
    check_version(version)
    manifest = verify(bundle)
    api = HfApi(token=_token())
    repo = repo_id(name, cfg)
    try:
        repo = api.create_repo(repo, private=cfg.hf.private,
                               exist_ok=True).repo_id
        if already_published(name, version, _tagged_digest(api, repo, version), manifest["bundle_digest"],
                             f"Hub repo {repo}"):
            check_stored_signature(_tagged_signature(api, repo, version), bundle, cfg.signing.public_key, name,
                                   version, f"Hub repo {repo}")
            return {"name": name, "version": version, "uri": f"hf://{repo}@{version}", "status": "already published"}
        tag_text = ", ".join(f"{k}={v}" for k, v in tags.items())
        commit = api.upload_folder(repo_id=repo, folder_path=str(bundle), delete_patterns="*",
                                   commit_message=f"{name} {version}", commit_description=tag_text)
        api.create_tag(repo, tag=version, revision=commit.oid, tag_message=tag_text)
    except (errors.HfHubHTTPError, errors.HFValidationError, httpx.HTTPError, OSError) as e:
        raise PipelineError(f"Hugging Face Hub publish of {name} {version} to {repo} failed: {first_line(e)}") from None
    return {"name": name, "version": version, "uri": f"hf://{repo}@{version}", "status": "published"}


def _tagged_digest(api, repo: str, version: str) -> str | None:
    if version not in {t.name for t in api.list_repo_refs(repo).tags}:
        return None
    path = api.hf_hub_download(repo, MANIFEST, revision=version)
    return json.loads(Path(path).read_text())["bundle_digest"]


def _tagged_signature(api, repo: str, version: str) -> bytes | None:
    """The model.sig of the version's tag; None when the tagged commit has none."""
    from huggingface_hub import errors

    from pipeline.release.signing import SIGNATURE

    try:
        return Path(api.hf_hub_download(repo, SIGNATURE, revision=version)).read_bytes()
    except errors.EntryNotFoundError:
        return None
