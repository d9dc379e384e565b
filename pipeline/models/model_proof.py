"""A model proved before it is used: its tokenizer reads text as the model was trained to (round trip, plausible
pieces per character, the GGUF's own vocabulary, <bos> where it is declared), its prompt format is the one said, and
its perplexity on a few rows of its own traffic is not absurd.

Found in issue #45: a SentencePiece GGUF converted by transformers 5.17 came out with a tokenizer of zero merges
(every text single characters) and no <bos>, a base model without a chat template was silently sent raw text, and
`models` said "compatible"; only the gate's absolute perplexity (6,699) stopped it, after every expensive stage.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.models.gguf_vocab import BPE_KIND, SPM_KIND, GgufVocab, spm_reference, token_ids

# Text any tokenizer of a real model reads in few pieces: English prose and Python code.
SAMPLE = (
    "The quick brown fox jumps over the lazy dog. Please reset my password: I forgot it after the last update, "
    "and the login page keeps saying that my account is locked. Could you also explain how the new billing "
    "settings work?\n"
    "def mean(values: list[float]) -> float:\n"
    '    """Return the arithmetic mean of a non-empty list."""\n'
    "    if not values:\n"
    '        raise ValueError("mean of an empty list")\n'
    "    return sum(values) / len(values)\n"
)
# A vocabulary of tens of thousands of pieces reads English and code in well under one piece per two characters; from
# this size on, more than LARGE_VOCAB_MAX_TOKENS_PER_CHAR is not a working tokenizer of such a vocabulary.
LARGE_VOCAB = 16384
LARGE_VOCAB_MAX_TOKENS_PER_CHAR = 0.6
# Any vocabulary that joins characters at all makes some pieces of several characters on English; below this share
# of multi-character pieces, text is read as (nearly) single characters, as a BPE without merges reads it.
MIN_MULTI_CHAR_SHARE = 0.05
PERPLEXITY_ROWS = 8  # traffic rows the perplexity sanity check reads
PERPLEXITY_MAX_TOKENS = 256  # per row: the prompt's end and at most the answer's first half of this


@dataclass(frozen=True)
class TokenizerProof:
    """What the proof measured, for the stage's line and metrics."""

    tokens_per_char: float  # on SAMPLE
    multi_char_share: float  # of SAMPLE's pieces
    adds_bos: bool
    texts: int  # texts that round-tripped (SAMPLE and the traffic's)
    against: str | None  # what the tokenizer was compared with: the GGUF's merges or scores, or None

    def to_json(self) -> dict:
        return {
            "tokens_per_char": round(self.tokens_per_char, 4),
            "multi_char_share": round(self.multi_char_share, 4),
            "adds_bos": self.adds_bos,
            "texts_round_tripped": self.texts,
            "checked_against": self.against,
        }


def snippet(text: str, at: int = 0, width: int = 40) -> str:
    return repr(text[max(0, at - 10) : max(0, at - 10) + width])


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def loosely(text: str) -> str:
    """text up to what tokenizers normalize on purpose: Unicode compatibility forms and runs of whitespace."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def round_trip_problem(tokenizer, text: str) -> str | None:
    """Where decode(encode(text)) differs from text (beyond loosely's normalization), or None: a character read as
    <unk>, a byte sequence garbled, words run together."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if back == text or loosely(back) == loosely(text):
        return None
    at = first_difference(text, back)
    return f"its tokenizer does not give text back: {snippet(text, at)} decodes as {snippet(back, at)}"


def piece_counts(tokenizer, text: str) -> tuple[int, int]:
    """(pieces, pieces of more than one character) of text."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(ids), sum(len(tokenizer.decode([i], clean_up_tokenization_spaces=False).strip(" ")) > 1 for i in ids)


def bos_problem(tokenizer, expected: bool, declared_in: str) -> str | None:
    ids = tokenizer("hello", add_special_tokens=True)["input_ids"]
    bos = tokenizer.bos_token_id
    adds = bos is not None and bool(ids) and ids[0] == bos
    if adds == expected:
        return None
    if expected:
        named = f"{tokenizer.bos_token!r} (id {bos})" if bos is not None else "a bos token (it names none)"
        return f"{declared_in} says add_bos_token is true, but its tokenizer does not put {named} before a text"
    return f"{declared_in} says add_bos_token is false, but its tokenizer puts {tokenizer.bos_token!r} before a text"


def merges_of(tokenizer) -> int | None:
    """The BPE merges in the tokenizer's tokenizer.json, or None for another model type."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    return len(model.get("merges") or []) if model.get("type") == "BPE" else None


def gguf_problem(tokenizer, vocab: GgufVocab, texts: list[str]) -> str | None:
    """Where the tokenizer reads text otherwise than the GGUF's own vocabulary does, or None."""
    ids = token_ids(vocab)  # a string the GGUF repeats is compared at its first id
    mismatched = [t for t, i in ids.items() if tokenizer.convert_tokens_to_ids(t) != i]
    if mismatched:
        return (
            f"{len(mismatched)} of the GGUF's {len(vocab.tokens)} tokens have another id in its tokenizer "
            f"(first {mismatched[0]!r})"
        )
    if vocab.kind == BPE_KIND:
        merges = merges_of(tokenizer)
        if merges != len(vocab.merges):
            return (
                f"its tokenizer.json has {merges if merges is not None else 'no BPE'} merges where the GGUF's "
                f"tokenizer.ggml.merges has {len(vocab.merges)}"
            )
    if vocab.kind == SPM_KIND:
        specials = [t for t in tokenizer.all_special_tokens if t]
        for text in texts:
            if any(s in text for s in specials):
                continue  # special tokens written in the text are parsed by the tokenizer, never by llama.cpp's SPM
            ours = tokenizer(text, add_special_tokens=False)["input_ids"]
            reference = spm_reference(vocab, text)
            if ours != reference:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference))
                )
                return (
                    f"its tokenizer splits {snippet(text)} into {len(ours)} pieces where the GGUF's vocabulary "
                    f"(tokenizer.ggml.scores, as llama.cpp joins them) gives {len(reference)}; first difference "
                    f"at piece {at}: {tokenizer.convert_ids_to_tokens(ours[at : at + 1])} vs "
                    f"{tokenizer.convert_ids_to_tokens(reference[at : at + 1])}"
                )
    return bos_problem(
        tokenizer,
        vocab.adds_bos,
        "the GGUF (tokenizer.ggml.add_bos_token"
        + ("" if vocab.add_bos is not None else ", llama.cpp's default for its kind")
        + ")",
    )


def declared_add_bos(model_dir: Path) -> bool | None:
    try:
        value = json.loads((model_dir / "tokenizer_config.json").read_text()).get("add_bos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def pieces_problem(tokenizer) -> tuple[str | None, float, float]:
    """(what is implausible about how the tokenizer splits SAMPLE or None, tokens per character, share of pieces
    longer than one character)."""
    pieces, multi = piece_counts(tokenizer, SAMPLE)
    per_char, share = pieces / len(SAMPLE), multi / max(pieces, 1)
    if share < MIN_MULTI_CHAR_SHARE:
        return (
            (
                f"its tokenizer reads English and code as single characters ({pieces} pieces for {len(SAMPLE)} "
                f"characters, {multi} of them longer than one character): a BPE without merges, or merges it does "
                "not apply"
            ),
            per_char,
            share,
        )
    if len(tokenizer) >= LARGE_VOCAB and per_char > LARGE_VOCAB_MAX_TOKENS_PER_CHAR:
        return (
            (
                f"its tokenizer gives {per_char:.2f} tokens per character on English and code ({pieces} for "
                f"{len(SAMPLE)}); a vocabulary of {len(tokenizer)} gives well under "
                f"{LARGE_VOCAB_MAX_TOKENS_PER_CHAR}"
            ),
            per_char,
            share,
        )
    return None, per_char, share


def prove_tokenizer(
    model_dir: str | Path, role: str, shown: str, texts: list[str] = (), vocab: GgufVocab | None = None
) -> TokenizerProof:
    """One line naming the model and what is wrong when its tokenizer does not read text as a model can: it must give
    SAMPLE and texts (the traffic's) back, read English and code in plausibly few pieces, agree with the GGUF's own
    vocabulary where vocab is given, and add <bos> exactly where the GGUF or tokenizer_config.json says so."""
    from pipeline.models.loading import load_tokenizer

    model_dir = Path(model_dir)
    tokenizer = load_tokenizer(model_dir)
    all_texts = [SAMPLE, *texts]
    problem = next(filter(None, (round_trip_problem(tokenizer, text) for text in all_texts)), None)
    if problem is None:
        problem, per_char, share = pieces_problem(tokenizer)
    if problem is None and vocab is not None:
        problem = gguf_problem(tokenizer, vocab, all_texts)
    elif problem is None and (declared := declared_add_bos(model_dir)) is not None:
        problem = bos_problem(tokenizer, declared, "tokenizer_config.json")
    if problem:
        raise PipelineError(f"{role} model {shown}: {problem}")
    against = None if vocab is None else "tokenizer.ggml.merges" if vocab.kind == BPE_KIND else "tokenizer.ggml.scores"
    return TokenizerProof(per_char, share, bos_problem(tokenizer, True, "") is None, len(all_texts), against)


def prompt_format_line(tokenizer, model_dir: Path, shown: str, prompt_format: str, traffic: str) -> str:
    """The one line saying how prompts are laid out for this target; one error line when the format is not the one
    asked for: a model without a chat template (a base model) is sent chat traffic only as plain text when
    data.prompt_format says plain, and a model with one is never sent plain text."""
    from pipeline.models.tokenizer_check import template_file

    if tokenizer.chat_template:
        if prompt_format == "plain":
            raise PipelineError(
                f"data.prompt_format is plain, but target model {shown} has a chat template "
                f"({template_file(model_dir)}), which lays out its prompts as served; set "
                "data.prompt_format: chat_template"
            )
        return f"prompt format: the chat template of target model {shown} ({template_file(model_dir)})"
    if prompt_format != "plain":
        raise PipelineError(
            f"target model {shown} has no chat template (a base model), and {traffic} is chat traffic "
            "(user and assistant turns): set data.prompt_format: plain to send each turn's text on its "
            "own line, or use a model with a chat template"
        )
    return (
        f"prompt format: plain text, each turn's text on its own line (data.prompt_format: plain; target model "
        f"{shown} has no chat template)"
    )


def cut_example(prompt: list[int], response: list[int]) -> tuple[list[int], list[int]]:
    """At most PERPLEXITY_MAX_TOKENS: the answer's first half of them at most, after the prompt's end."""
    response = response[: PERPLEXITY_MAX_TOKENS // 2]
    return prompt[-(PERPLEXITY_MAX_TOKENS - len(response)) :], response


def traffic_perplexity(model_dir: str | Path, examples: list[tuple[list[int], list[int]]]) -> float:
    """The model's perplexity on the answers of examples, (prompt ids, answer ids) each, given their prompts."""
    import torch

    from pipeline.models.loading import load_causal_lm

    model = load_causal_lm(model_dir)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, response in (cut_example(p, r) for p, r in examples):
            if not prompt or not response:  # nothing to predict from, or nothing to predict
                continue
            ids = torch.tensor([prompt + response], device=device)
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            total += torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum").item()
            count += len(response)
    return math.exp(total / count) if count else float("nan")


def check_perplexity(perplexity: float, bound: float, shown: str, rows: int, traffic: str) -> None:
    if not perplexity <= bound:  # NaN too: an empty or broken measurement proves nothing
        raise PipelineError(
            f"target model {shown}: perplexity {perplexity:,.1f} on the answers of {rows} rows of "
            f"{traffic} is above target.max_perplexity {bound:g}: its tokenizer, prompt format or "
            "weights do not fit this text"
        )


def prove_source(model_dir: Path, role: str, source: str, texts: list[str]) -> TokenizerProof:
    """prove_tokenizer of a materialized source, against its GGUF's own vocabulary where it was one."""
    from pipeline.models.gguf_source import gguf_path, is_gguf_source
    from pipeline.models.gguf_vocab import read_vocab

    vocab = read_vocab(gguf_path(source, role)) if is_gguf_source(source) else None
    return prove_tokenizer(model_dir, role, source, texts, vocab)
