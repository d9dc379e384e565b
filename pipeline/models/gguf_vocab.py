"""A GGUF's own vocabulary: read from its metadata, refused when it cannot tokenize, and for SentencePiece-style
vocabularies (`tokenizer.ggml.model: llama`) turned into a working tokenizer.

transformers 5.17 picks a GGUF's tokenizer converter by the model's architecture, not by its vocabulary
(integrations/ggml.py GGUF_TO_FAST_CONVERTERS): a SentencePiece vocabulary in a gemma2/gemma3 GGUF goes through
GGUFGemmaConverter, whose Unigram model GemmaTokenizer then rebuilds as a BPE with zero merges (every text becomes
single characters), and in a qwen2 or stablelm GGUF through a byte-level BPE that ignores its scores; none of them
adds `<bos>` although the GGUF says `add_bos_token`. So a SentencePiece vocabulary is built here from its tokens,
scores and token types, as llama.cpp tokenizes it (llm_tokenizer_spm: repeatedly join the adjacent pair whose joined
text is the highest-scoring token, leftmost first; what is left outside the vocabulary falls back to <0xXX> byte
tokens): a `tokenizers` BPE whose merges are every split of a token into two tokens, ranked by the joined token's
score (what sentencepiece's own BPE scores are: minus the merge order).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

BPE_KIND, SPM_KIND = "gpt2", "llama"  # tokenizer.ggml.model of byte-level BPE and SentencePiece vocabularies
KINDS = (BPE_KIND, SPM_KIND)
# llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MERGEABLE = (NORMAL, USER_DEFINED)  # the types a join of two pieces may produce (never a control or byte token)
SPACE = "\u2581"  # SentencePiece's visible space


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer part of a GGUF's metadata."""

    kind: str  # tokenizer.ggml.model
    tokens: tuple[str, ...]
    scores: tuple[float, ...] | None  # SentencePiece: the merge priority of each token
    types: tuple[int, ...] | None
    merges: tuple[str, ...]  # BPE: "left right" pairs, in rank order
    bos: int | None
    eos: int | None
    unk: int | None
    pad: int | None
    add_bos: bool | None  # tokenizer.ggml.add_bos_token as written (None: not written)
    add_eos: bool | None
    add_space_prefix: bool  # SentencePiece: a space before the text (llama.cpp's default: yes)
    chat_template: str | None

    @property
    def adds_bos(self) -> bool:
        """Whether llama.cpp puts <bos> before a text: the GGUF's add_bos_token, else its default (SentencePiece
        vocabularies add it, BPE ones do not)."""
        return self.add_bos if self.add_bos is not None else self.kind == SPM_KIND

    def type_of(self, i: int) -> int:
        return self.types[i] if self.types else NORMAL


def read_vocab(gguf: Path) -> GgufVocab:
    """The vocabulary from the GGUF's metadata alone, through transformers' GGUF reader (gguf's GGUFReader parses every
    array and tensor entry first: many times slower for a vocabulary of 151,936 tokens)."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    md, _ = read_gguf_metadata(str(gguf), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))

    def optional_id(key: str) -> int | None:
        value = md.get(f"tokenizer.ggml.{key}")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    def flag(key: str) -> bool | None:
        value = md.get(f"tokenizer.ggml.{key}")
        return bool(value) if isinstance(value, bool) else None

    def array(key: str) -> tuple | None:
        value = md.get(f"tokenizer.ggml.{key}")
        return tuple(value) if isinstance(value, (list, tuple)) else None

    template = md.get("tokenizer.chat_template")
    space_prefix = flag("add_space_prefix")
    return GgufVocab(
        kind=str(md.get("tokenizer.ggml.model", "")),
        tokens=array("tokens") or (),
        scores=array("scores"),
        types=array("token_type"),
        merges=array("merges") or (),
        bos=optional_id("bos_token_id"),
        eos=optional_id("eos_token_id"),
        unk=optional_id("unknown_token_id"),
        pad=optional_id("padding_token_id"),
        add_bos=flag("add_bos_token"),
        add_eos=flag("add_eos_token"),
        add_space_prefix=True if space_prefix is None else space_prefix,
        chat_template=template if isinstance(template, str) and template else None,
    )


def vocab_problem(vocab: GgufVocab) -> str | None:
    """Why this vocabulary cannot tokenize text as the model was trained to read it, or None; read before any weight
    is loaded."""
    if vocab.kind not in KINDS:
        return (
            f"its tokenizer.ggml.model is {vocab.kind or 'missing'!r}; only byte-level BPE ('gpt2') and "
            "SentencePiece ('llama') vocabularies are converted and checked here"
        )
    if not vocab.tokens:
        return "it has no tokenizer.ggml.tokens"
    if vocab.kind == BPE_KIND and not vocab.merges:
        return (
            "its tokenizer.ggml.model is 'gpt2' (BPE) but it has no tokenizer.ggml.merges: without merges every "
            "text becomes single characters"
        )
    if vocab.kind == SPM_KIND:
        if vocab.scores is None or len(vocab.scores) != len(vocab.tokens):
            return (
                "its tokenizer.ggml.model is 'llama' (SentencePiece) but it has no tokenizer.ggml.scores for its "
                f"{len(vocab.tokens)} tokens: the scores are the order pieces are joined in"
            )
        if len(set(vocab.scores)) < 2:
            return (
                "its tokenizer.ggml.scores are all equal: SentencePiece joins pieces in the order of their scores, "
                "so these give no order"
            )
    for name, i in (("bos", vocab.bos), ("eos", vocab.eos), ("unknown", vocab.unk), ("padding", vocab.pad)):
        if i is not None and not 0 <= i < len(vocab.tokens):
            return f"its tokenizer.ggml.{name}_token_id {i} is outside its {len(vocab.tokens)} tokens"
    if vocab.adds_bos and vocab.bos is None:
        return (
            "it says tokenizer.ggml.add_bos_token is true"
            if vocab.add_bos
            else "it is a SentencePiece vocabulary "
            "(which adds <bos> unless tokenizer.ggml.add_bos_token says otherwise)"
        ) + " but names no tokenizer.ggml.bos_token_id"
    return None


def check_vocab(vocab: GgufVocab, gguf: Path, role: str) -> None:
    if problem := vocab_problem(vocab):
        raise PipelineError(f"{role}.source {gguf}: {problem}; not converted")


def token_ids(vocab: GgufVocab) -> dict[str, int]:
    ids: dict[str, int] = {}
    for i, token in enumerate(vocab.tokens):
        ids.setdefault(token, i)  # a repeated string keeps its first id, as llama.cpp's token_to_id does
    return ids


def mergeable(vocab: GgufVocab) -> dict[str, int]:
    """The tokens a join of two pieces may produce, by text."""
    return {t: i for t, i in token_ids(vocab).items() if vocab.type_of(i) in MERGEABLE}


def spm_merges(vocab: GgufVocab) -> list[tuple[str, str]]:
    """Every split of a joinable token into two tokens, highest-scoring joined token first (ties: the lower id, as
    sentencepiece numbers its merges)."""
    ids, joinable = token_ids(vocab), mergeable(vocab)
    ranked = []
    for token, i in joinable.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-vocab.scores[i], i, -vocab.scores[ids[left]], cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_vocab_tokens(tok, vocab: GgufVocab, name: dict) -> None:
    """Control tokens are special (never made from text unless written whole); user-defined ones are matched in the
    raw text before anything else, as llama.cpp partitions them."""
    from tokenizers import AddedToken

    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for i, t in enumerate(vocab.tokens)
            if vocab.type_of(i) in (CONTROL, UNKNOWN) or i in name
        ]
    )  # named ones even without types
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for i, t in enumerate(vocab.tokens)
            if vocab.type_of(i) == USER_DEFINED
        ]
    )


def spm_tokenizer(vocab: GgufVocab):
    """A transformers tokenizer of a SentencePiece GGUF vocabulary, tokenizing as llama.cpp does, with <bos> (and
    <eos>) added as the GGUF says and its chat template."""
    from tokenizers import Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    name = {i: vocab.tokens[i] for i in (vocab.bos, vocab.eos, vocab.unk, vocab.pad) if i is not None}
    tok = Tokenizer(
        BPE(token_ids(vocab), spm_merges(vocab), unk_token=name.get(vocab.unk), fuse_unk=True, byte_fallback=True)
    )
    prefix = [normalizers.Prepend(SPACE)] if vocab.add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace(SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            *([decoders.Strip(" ", 1, 0)] if vocab.add_space_prefix else []),
        ]
    )
    _add_vocab_tokens(tok, vocab, name)
    add_eos = bool(vocab.add_eos) and vocab.eos is not None
    added = [i for i in (vocab.bos if vocab.adds_bos else None, vocab.eos if add_eos else None) if i is not None]

    def template(seq: str, type_id: int) -> list[str]:
        return (
            ([f"{name[vocab.bos]}:{type_id}"] if vocab.adds_bos else [])
            + [f"${seq}:{type_id}"]
            + ([f"{name[vocab.eos]}:{type_id}"] if add_eos else [])
        )

    tok.post_processor = processors.TemplateProcessing(
        single=template("A", 0),
        pair=template("A", 0) + template("B", 1),
        special_tokens=sorted({(name[i], i) for i in added}),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name.get(vocab.bos),
        eos_token=name.get(vocab.eos),
        unk_token=name.get(vocab.unk),
        pad_token=name.get(vocab.pad),
        add_bos_token=vocab.adds_bos,
        add_eos_token=add_eos,
        clean_up_tokenization_spaces=False,
    )
    if vocab.chat_template:
        fast.chat_template = vocab.chat_template
    return fast


def spm_reference(vocab: GgufVocab, text: str) -> list[int]:
    """text's token ids as llama.cpp's SentencePiece tokenizer gives them (llm_tokenizer_spm, no special tokens
    parsed, no <bos>): the reference a converted tokenizer is compared with."""
    ids, joinable = token_ids(vocab), mergeable(vocab)
    text = ((" " if vocab.add_space_prefix else "") + text).replace(" ", SPACE)
    pieces = list(text)
    nxt = list(range(1, len(pieces))) + [-1]
    prev = list(range(-1, len(pieces) - 1))
    heap: list[tuple[float, int, str]] = []

    def offer(left: int) -> None:
        if left >= 0 and nxt[left] >= 0 and (joined := pieces[left] + pieces[nxt[left]]) in joinable:
            heapq.heappush(heap, (-vocab.scores[joinable[joined]], left, joined))

    for i in range(len(pieces) - 1):
        offer(i)
    while heap:
        _, left, joined = heapq.heappop(heap)
        right = nxt[left]
        if right < 0 or pieces[left] is None or pieces[left] + (pieces[right] or "\0") != joined:
            continue  # one of the two pieces was joined to another since this pair was offered
        pieces[left], pieces[right] = joined, None
        nxt[left] = nxt[right]
        if nxt[left] >= 0:
            prev[nxt[left]] = left
        offer(prev[left])
        offer(left)
    out = []
    for piece in pieces:
        if piece is None:
            continue
        if piece in ids:
            out.append(ids[piece])
            continue
        for byte in piece.encode("utf-8"):  # byte fallback, else the unknown token
            out.append(ids.get(f"<0x{byte:02X}>", vocab.unk if vocab.unk is not None else 0))
    return out
