"""Prompts rendered through a checkpoint's chat template, remembered by content. Every bundle@<variant> renders the
same warm-up prompts with its copy of the target's tokenizer (bf16's byte for byte; llm-compressor re-saves a
quantized variant's with other bytes, so each of those renders once), and loading a tokenizer costs the stage
seconds (transformers and torch) where it has nothing else heavy to do. The memory is keyed by the sha256 of every
tokenizer file, the transformers version and the conversations, so what it returns is what a render gives; a
missing, damaged or edited memory file is rendered again."""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path

from pipeline.core.io import file_sha256, read_sealed_json, write_sealed_json
from pipeline.data.formatting import prompt_text

# What a chat template's rendering reads: the tokenizer's files (special tokens, the template), not the weights or
# config.json (which a quantized variant changes while its tokenizer stays the target's).
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab*",
    "merges*",
    "*.model",
    "*.tiktoken",
)


def render_key(model_dir: str | Path, conversations: list[list[dict]]) -> str:
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in Path(model_dir).iterdir()
        if p.is_file() and any(fnmatch(p.name, pattern) for pattern in TOKENIZER_PATTERNS)
    )
    for path in files:
        digest.update(json.dumps([path.name, file_sha256(path)]).encode())
    digest.update(json.dumps([metadata.version("transformers"), conversations], sort_keys=True).encode())
    return digest.hexdigest()


def rendered_prompts(
    model_dir: str | Path, conversations: list[list[dict]], memory_dir: Path
) -> list[tuple[str, bool]]:
    """prompt_text of each conversation with model_dir's tokenizer: (text, add_special_tokens) pairs."""
    key = render_key(model_dir, conversations)
    memory = memory_dir / f"rendered-prompts-{key[:24]}.json"
    try:
        body = read_sealed_json(memory)
        if body.get("key") == key:
            return [(text, bool(special)) for text, special in body["prompts"]]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass  # no memory, or one not to trust: render
    from pipeline.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    prompts = [prompt_text(tokenizer, messages) for messages in conversations]
    write_sealed_json(memory, {"key": key, "prompts": [list(p) for p in prompts]})
    return prompts
