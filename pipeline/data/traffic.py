"""Domain traffic: load and validate JSONL, dedup, and split deterministically.

Rows are {"prompt", "response"} or {"messages": [{"role", "content"}, ...]} ending with an
assistant turn, with an optional "group" (a string: the document a question is about, a user's session). Splits
are assigned by a seeded hash of each conversation, or of its group where it has one, so a row stays in its split
when the file grows (no leakage from held-out into calibration or training), and rows of one group share a split
(held-out traffic is then about documents the draft never saw).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.jsonl import read_lines
from pipeline.data.formatting import row_to_messages, split_prompt_response
from pipeline.data.settings import Fractions

ROLES = {"system", "user", "assistant"}
SPLITS = ("calibration", "draft_train", "heldout")


def _validate_row(row, where: str) -> list[dict]:
    if not isinstance(row, dict):
        raise PipelineError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "group" in row and not (isinstance(row["group"], str) and row["group"].strip()):
        raise PipelineError(f"{where}: 'group' must be a non-empty string (rows of one group share a split)")
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PipelineError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs, 1):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise PipelineError(f"{where}: each message needs a role in {sorted(ROLES)} and a string content")
            _check_text(m["content"], f"message {i} ({m['role']}) has empty content", where)
        _check_turn_order([m["role"] for m in msgs], where)
    else:
        for key in ("prompt", "response"):
            if not isinstance(row.get(key), str):
                raise PipelineError(
                    f"{where}: missing or empty string field {key!r} "
                    "(expected {prompt, response} or {messages: [...]})"
                )
            _check_text(row[key], f"missing or empty string field {key!r}", where)
    return row_to_messages(row)


def _check_text(text: str, empty_message: str, where: str) -> None:
    if not text.strip():
        raise PipelineError(f"{where}: {empty_message}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800" would crash writing the splits
        raise PipelineError(f"{where}: text contains an unpaired surrogate escape (not valid Unicode)") from None


def _check_turn_order(roles: list[str], where: str) -> None:
    """An optional leading system message, then user/assistant alternating, ending with the
    assistant: the shape chat templates accept and that every training prefix has."""
    start = 1 if roles[0] == "system" else 0
    for i in range(start, len(roles)):
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if roles[i] != expected:
            raise PipelineError(
                f"{where}: message {i + 1} is from the {roles[i]} where the {expected} is expected "
                "(after an optional leading system message, turns alternate user/assistant)"
            )
    if roles[-1] != "assistant":
        raise PipelineError(f"{where}: a conversation needs a user turn and must end with an assistant turn")


def load_traffic(path: str | Path) -> list[list[dict]]:
    """All conversations in the file, as message lists; the first bad line stops with its number."""
    return read_traffic(path)[0]


def read_traffic(path: str | Path, max_row_bytes: int | None = None) -> tuple[list[list[dict]], int]:
    """(conversations, rows over max_row_bytes skipped unread); the first bad line stops with its number."""
    conversations, _, oversized = read_grouped(path, max_row_bytes)
    return conversations, oversized


def read_grouped(path: str | Path, max_row_bytes: int | None = None) -> tuple[list[list[dict]], dict[str, str], int]:
    """read_traffic's, plus the group of each conversation that has one, by conversation_key (a conversation that
    appears twice keeps its first row's group, as dedup keeps the first row)."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"traffic file {path} does not exist")
    conversations, groups, oversized = [], {}, 0
    for line in read_lines(path, max_row_bytes):
        if line.oversized:
            oversized += 1
            continue
        conversations.append(_validate_row(line.row, line.where))
        if "group" in line.row:
            groups.setdefault(conversation_key(conversations[-1]), line.row["group"])
    if not conversations:
        raise PipelineError(
            f"traffic file {path} has no rows" + (f" within {max_row_bytes} bytes" if oversized else "")
        )
    return conversations, groups, oversized


def first_conversations(path: str | Path, count: int) -> list[list[dict]]:
    """The file's first count conversations, the rest unread (`models` proves the target on them before `data`
    reads the whole file); a bad line among them stops with its number, as read_traffic's."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"traffic file {path} does not exist")
    conversations = []
    for line in read_lines(path, 1 << 20):  # a row over 1 MiB is not a sample: skipped unread
        if not line.oversized:
            conversations.append(_validate_row(line.row, line.where))
        if len(conversations) == count:
            break
    if not conversations:
        raise PipelineError(f"traffic file {path} has no rows")
    return conversations


def source_path(traffic: str | Path) -> Path:
    """`<stem>.source.json` beside a traffic file: what a generator (pipeline/data/real_text.py) made it from."""
    traffic = Path(traffic)
    return traffic.with_name(f"{traffic.stem}.source.json")


def read_source(traffic: str | Path) -> dict | None:
    """The generator's record beside the traffic file (None when the file was not generated here): the `data`
    stage copies its provenance keys into its metrics, e.g. the Python version whose docstrings made the rows."""
    path = source_path(traffic)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path}: not valid JSON ({e}); regenerate it with the traffic file") from None
    if not isinstance(record, dict):
        raise PipelineError(f"{path}: expected a JSON object (the traffic generator's record)")
    return {k: record[k] for k in SOURCE_KEYS if k in record}


SOURCE_KEYS = ("generator", "python", "implementation", "seed")  # what decides a generated file's rows


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of this tokenizer stands for: a row longer than max_tokens times this can't
    fit in max_tokens tokens, so it is dropped before it is parsed or tokenized."""
    return max(
        len(tokenizer.convert_tokens_to_string([t]).encode("utf-8", "replace"))
        for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        if t is not None
    )


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


def split(
    conversations: list[list[dict]], fractions: Fractions, seed: int, groups: dict[str, str] | None = None
) -> dict[str, list[list[dict]]]:
    """Assign each conversation to a split by a seeded hash in [0, 1) of the conversation, or of its group (by
    conversation_key, read_grouped's) where it has one: a group's rows land in one split."""
    cal, held = fractions.calibration, fractions.heldout
    if not (0 < cal < 1 and 0 < held < 1 and cal + held < 1):
        raise PipelineError("data.fractions: calibration and heldout must be in (0, 1) and sum to < 1")
    out = {name: [] for name in SPLITS}
    for msgs in conversations:
        key = conversation_key(msgs)
        unit = f"group:{groups[key]}" if groups and key in groups else key  # ungrouped rows hash as before
        h = int(hashlib.sha256(f"{seed}:{unit}".encode()).hexdigest()[:12], 16) / 16**12
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
    from pipeline.data.formatting import full_text

    kept = [
        m
        for m in conversations
        if len(tokenizer(full_text(tokenizer, m), add_special_tokens=False)["input_ids"]) <= max_tokens
    ]
    return kept, len(conversations) - len(kept)


def heldout_prompts(path: str | Path, limit: int | None = None) -> list[list[dict]]:
    """Each conversation's prompt messages (everything before its final answer), the first `limit` of them."""
    return [split_prompt_response(m)[0] for m in read_split(path)[:limit]]
