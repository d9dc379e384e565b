"""Domain traffic: load and validate JSONL, dedup, and split deterministically.

Rows are {"prompt", "response"} or {"messages": [{"role", "content"}, ...]} ending with an
assistant turn. Splits are assigned by a seeded hash of each conversation, so a row stays
in its split when the file grows (no leakage from held-out into calibration or training).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.formatting import row_to_messages

ROLES = {"system", "user", "assistant"}
SPLITS = ("calibration", "draft_train", "heldout")


def _validate_row(row, where: str) -> list[dict]:
    if not isinstance(row, dict):
        raise PipelineError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PipelineError(f"{where}: 'messages' must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise PipelineError(f"{where}: each message needs a role in {sorted(ROLES)} and a string content")
        if msgs[-1]["role"] != "assistant" or not any(m["role"] == "user" for m in msgs):
            raise PipelineError(f"{where}: a conversation needs a user turn and must end with an assistant turn")
    else:
        for key in ("prompt", "response"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise PipelineError(f"{where}: missing or empty string field {key!r} "
                                    "(expected {prompt, response} or {messages: [...]})")
    return row_to_messages(row)


def load_traffic(path: str | Path) -> list[list[dict]]:
    """All conversations in the file, as message lists; the first bad line stops with its number."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"traffic file {path} does not exist")
    conversations = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PipelineError(f"{where}: not valid JSON ({e.msg})") from None
            conversations.append(_validate_row(row, where))
    if not conversations:
        raise PipelineError(f"traffic file {path} has no rows")
    return conversations


def conversation_key(messages: list[dict]) -> str:
    """Identity for dedup: whitespace-normalized roles and contents."""
    canon = json.dumps([[m["role"], " ".join(m["content"].split())] for m in messages], ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def dedup(conversations: list[list[dict]]) -> list[list[dict]]:
    seen, unique = set(), []
    for msgs in conversations:
        key = conversation_key(msgs)
        if key not in seen:
            seen.add(key)
            unique.append(msgs)
    return unique


def split(conversations: list[list[dict]], fractions: dict, seed: int) -> dict[str, list[list[dict]]]:
    """Assign each conversation to a split by a seeded hash in [0, 1)."""
    cal, held = fractions["calibration"], fractions["heldout"]
    if not (0 < cal < 1 and 0 < held < 1 and cal + held < 1):
        raise PipelineError("data.fractions: calibration and heldout must be in (0, 1) and sum to < 1")
    out = {name: [] for name in SPLITS}
    for msgs in conversations:
        h = int(hashlib.sha256(f"{seed}:{conversation_key(msgs)}".encode()).hexdigest()[:12], 16) / 16**12
        name = "heldout" if h < held else "calibration" if h < held + cal else "draft_train"
        out[name].append(msgs)
    for name, rows in out.items():
        if not rows:
            raise PipelineError(f"split {name!r} is empty: the traffic file is too small for data.fractions")
    return out


def write_split(rows: list[list[dict]], path: Path) -> None:
    path.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in rows))


def read_split(path: str | Path) -> list[list[dict]]:
    return [json.loads(line)["messages"] for line in Path(path).read_text().splitlines() if line.strip()]


def drop_too_long(conversations: list[list[dict]], tokenizer, max_tokens: int) -> tuple[list[list[dict]], int]:
    """Keep conversations whose formatted length fits the serving context; return (kept, n_dropped)."""
    from pipeline.formatting import full_text

    kept = [m for m in conversations if len(tokenizer(full_text(tokenizer, m), add_special_tokens=False)["input_ids"])
            <= max_tokens]
    return kept, len(conversations) - len(kept)
