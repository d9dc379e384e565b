"""Do a model's tokenizer, config and chat template agree on how an answer ends?

Every stage takes the tokenizer's eos_token as the end of an assistant turn: distillation stops the
target's answers there, training appends it to every answer, and vLLM stops a served answer on it. A
tokenizer whose eos_token is not the token the chat template closes a turn with (a GGUF-derived
SmolLM2 tokenizer names <|im_start|>, its template ends turns with <|im_end|>) makes answers that never
end and a draft trained on a layout the target is not served with; found here, from the files alone,
before any weights load.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

PROBE = "modelprep-end-of-answer-probe"  # an assistant answer whose end is easy to find in the rendered text
# A real chat template renders two messages in milliseconds; one with nested range(100000) loops hung the check
# (issue #47). transformers renders in jinja2's sandbox, which bounds one range() to 100,000 items but not nesting.
RENDER_LIMIT_S = 5.0


class RenderTimeout(BaseException):  # not Exception: no library handler may swallow it
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """RenderTimeout when the block runs longer than seconds (SIGALRM: jinja renders in Python, so the signal
    lands between its bytecodes). Only the main thread receives signals: elsewhere the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RenderTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class EndTokens:
    """What each file of a model says ends an answer, and pads, as token ids."""

    eos: int | None  # the tokenizer's eos_token (tokenizer_config.json)
    eos_text: str | None
    turn_end: int | None  # the first special token the chat template writes after an answer
    declared_eos: tuple[int, ...]  # generation_config.json's eos_token_id, else config.json's
    declared_file: str | None  # which of the two declared it
    pad: int | None  # the tokenizer's pad_token
    pad_text: str | None
    declared_pad: int | None  # config.json's pad_token_id


def ids(value) -> tuple[int, ...]:
    """An eos_token_id as configs write it: one id, a list of ids, or null."""
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def read_config(path: Path) -> dict:
    """A JSON config's text part (multimodal configs nest it under text_config); {} when absent or unreadable
    (check_model_dir has already refused a config.json that is not JSON)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {**data, **data["text_config"]} if isinstance(data.get("text_config"), dict) else data


def template_file(model_dir: Path) -> str:
    """Where the chat template is stored, for error lines (transformers 5 writes chat_template.jinja)."""
    return "chat_template.jinja" if (model_dir / "chat_template.jinja").is_file() else "tokenizer_config.json"


def turn_end_id(tokenizer, model_dir: Path, shown: str) -> int | None:
    """The first special token the chat template writes after an assistant's answer (ChatML's <|im_end|>),
    or None without a template or when it writes no special token there."""
    if not tokenizer.chat_template:
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    try:
        with time_limit(RENDER_LIMIT_S):
            text = tokenizer.apply_chat_template(messages, tokenize=False)
    except RenderTimeout:
        raise PipelineError(
            f"{shown}/{template_file(model_dir)}: the chat template took over {RENDER_LIMIT_S:g} s to "
            "render a user question and an answer (real ones take milliseconds); refused"
        ) from None
    except Exception as e:  # noqa: BLE001 - jinja's errors and the template's own raise_exception
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(
            f"{shown}/{template_file(model_dir)}: the chat template cannot render a user question and "
            f"an answer ({type(e).__name__}: {first})"
        ) from None
    at = text.rfind(PROBE)
    if at < 0:
        return None
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return next(
        (i for i in tokenizer(text[at + len(PROBE) :], add_special_tokens=False)["input_ids"] if i in special), None
    )


def end_tokens(tokenizer, model_dir: Path, shown: str) -> EndTokens:
    model_dir = Path(model_dir)
    config = read_config(model_dir / "config.json")
    generation = read_config(model_dir / "generation_config.json")
    # What transformers' generate and vLLM stop on besides the tokenizer's eos: generation_config.json's list when
    # it has one (Llama 3's config.json names 128001 alone, its generation_config.json adds <|eot_id|>).
    if ids(generation.get("eos_token_id")):
        declared, declared_file = ids(generation["eos_token_id"]), "generation_config.json"
    else:
        declared, declared_file = (
            ids(config.get("eos_token_id")),
            "config.json" if ids(config.get("eos_token_id")) else None,
        )
    pad = config.get("pad_token_id")
    return EndTokens(
        eos=tokenizer.eos_token_id,
        eos_text=tokenizer.eos_token,
        turn_end=turn_end_id(tokenizer, model_dir, shown),
        declared_eos=declared,
        declared_file=declared_file,
        pad=tokenizer.pad_token_id,
        pad_text=tokenizer.pad_token,
        declared_pad=pad if isinstance(pad, int) and not isinstance(pad, bool) else None,
    )


def agreed_eos(tokens: EndTokens, metadata_eos: int | None = None) -> int | None:
    """The one eos id that every source other than the tokenizer allows (the template's turn end, the declared
    eos ids, a GGUF's own eos_token_id), or None when they allow none or several: then no fix is evident."""
    allowed = [set(tokens.declared_eos)] if tokens.declared_eos else []
    allowed += [{i} for i in (tokens.turn_end, metadata_eos) if i is not None]
    common = set.intersection(*allowed) if allowed else set()
    return next(iter(common)) if len(common) == 1 else None


def mismatch(tokens: EndTokens, tokenizer, model_dir: Path) -> str | None:
    """What disagrees, as the tail of one error line; None when eos, pad and the template agree."""

    def token(i: int) -> str:
        return f"{tokenizer.convert_ids_to_tokens(i)!r} (id {i})"

    eos = "names no eos_token" if tokens.eos is None else f"names eos_token {tokens.eos_text!r} (id {tokens.eos})"
    disagree = []
    if tokens.turn_end is not None and tokens.turn_end != tokens.eos:
        disagree.append(f"the chat template ({template_file(model_dir)}) ends an answer with {token(tokens.turn_end)}")
    if tokens.declared_eos and tokens.eos not in tokens.declared_eos:
        listed = ", ".join(map(str, tokens.declared_eos))
        disagree.append(f"{tokens.declared_file} eos_token_id is {listed}")
    if disagree:
        fix = agreed_eos(tokens)
        hint = f"; set eos_token to {tokenizer.convert_ids_to_tokens(fix)!r} there" if fix is not None else ""
        return (
            f"tokenizer_config.json {eos}, but {' and '.join(disagree)}: answers would not stop where a turn ends{hint}"
        )
    if tokens.pad is not None and tokens.declared_pad is not None and tokens.pad != tokens.declared_pad:
        return (
            f"tokenizer_config.json names pad_token {tokens.pad_text!r} (id {tokens.pad}), but config.json "
            f"pad_token_id is {tokens.declared_pad} ({tokenizer.convert_ids_to_tokens(tokens.declared_pad)!r})"
        )
    return None


def check_tokenizer(model_dir: str | Path, role: str, shown: str | None = None) -> None:
    """One line naming the file and the disagreement when eos, pad and the chat template disagree.
    shown: how the model is named in that line (the user's directory or repo id, not a temp copy)."""
    from pipeline.models.loading import load_tokenizer

    model_dir = Path(model_dir)
    shown = shown or str(model_dir)
    tokenizer = load_tokenizer(model_dir)
    problem = mismatch(end_tokens(tokenizer, model_dir, shown), tokenizer, model_dir)
    if problem:
        raise PipelineError(f"{role} model {shown}: {problem}")
