"""Where models come from: the embedded `demo`, a local HF-layout directory, or a Hub repo id."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pipeline.errors import PipelineError

REPO_ID = re.compile(r"^(hf:)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a serving bundle needs from a Hub snapshot; never pickled weights (*.bin, *.pt).
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


def classify(source: str) -> str:
    """'demo', 'local' or 'hf'. A path-like string is local even when it does not exist."""
    if source == "demo":
        return "demo"
    if source.startswith("hf:"):
        return "hf"
    if Path(source).expanduser().exists() or source.startswith(("/", ".", "~")) or not REPO_ID.match(source):
        return "local"
    return "hf"


def check_model_dir(path: Path, role: str) -> None:
    if not path.is_dir():
        raise PipelineError(f"{role} model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise PipelineError(f"{role} model directory {path} has no config.json (expected a Hugging Face layout)")
    if not any(path.glob("*.safetensors")):
        raise PipelineError(f"{role} model directory {path} has no *.safetensors weights "
                            "(pickled .bin checkpoints are not loaded; convert them to safetensors)")
    if not any(path.glob("tokenizer*")):
        raise PipelineError(f"{role} model directory {path} has no tokenizer files")


def copy_tree(src: Path, dst: Path) -> None:
    """Hard-link when on the same filesystem (multi-GB checkpoints), copy otherwise."""
    def link_or_copy(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link_or_copy, dirs_exist_ok=True)


def download_from_hub(repo_id: str, dst: Path, revision: str | None = None) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        snapshot_download(repo_id, revision=revision, local_dir=dst, allow_patterns=HUB_PATTERNS,
                          token=os.environ.get("HF_TOKEN"))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PipelineError(f"could not download {repo_id!r} from the Hugging Face Hub "
                            f"(offline or no access?): {first}") from None


def fetch_model(source: str, dst: Path, role: str, revision: str | None = None) -> str:
    """Materialize a non-demo source into dst (a fresh directory). Returns the source kind."""
    kind = classify(source)
    if kind == "local":
        src = Path(source).expanduser()
        check_model_dir(src, role)
        copy_tree(src, dst)
    elif kind == "hf":
        download_from_hub(source.removeprefix("hf:"), dst, revision)
        check_model_dir(dst, role)
    else:
        raise PipelineError(f"{role}: the demo source builds target and draft together; use it for both")
    return kind
