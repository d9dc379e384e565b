"""A tiny SentencePiece-style vocabulary (`tokenizer.ggml.model: llama`: tokens, scores, token types, no merges,
add_bos_token) as llama.cpp's converter writes a Llama-2 or Gemma base model's, and no chat template: the layout of
issue #45's base model, for a GGUF written with the gguf package's writer (tiny_chatml.write_gguf)."""

from __future__ import annotations

from dataclasses import dataclass

from tiny_chatml import TEXT

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2, as Llama 2's


@dataclass(frozen=True)
class SpmVocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]


def spm_vocab() -> SpmVocab:
    """<unk> <s> </s>, the 256 byte tokens, then pieces learnt by a SentencePiece-style BPE on tiny_chatml.TEXT:
    joined pieces scored minus their merge order, single characters below every joined piece (as sentencepiece
    scores a BPE model)."""
    from gguf import TokenType
    from tokenizers import SentencePieceBPETokenizer

    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(TEXT * 4, vocab_size=200, special_tokens=SPECIALS, show_progress=False)
    learnt = sorted(trainer.get_vocab(), key=trainer.get_vocab().get)[len(SPECIALS) :]
    pieces = [t for t in learnt if len(t) > 1] + [t for t in learnt if len(t) == 1]
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * (len(SPECIALS) + 256) + [
        -float(k) - (1000.0 if len(t) == 1 else 0.0) for k, t in enumerate(pieces)
    ]
    types = (
        [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
        + [TokenType.BYTE] * 256
        + [TokenType.NORMAL] * len(pieces)
    )
    return SpmVocab(tokens, scores, [int(t) for t in types])


def spm_writer(vocab: SpmVocab, scores: str = "kept", bos: bool = True):
    """A tiny_chatml.write_gguf vocabulary writer: scores "kept", "dropped" (no tokenizer.ggml.scores) or "equal" (all
    zero); bos=False names no bos token although add_bos_token is true."""

    def write(writer) -> None:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(vocab.tokens)
        if scores != "dropped":
            writer.add_token_scores(vocab.scores if scores == "kept" else [0.0] * len(vocab.tokens))
        writer.add_token_types(vocab.types)
        if bos:
            writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)

    return write
