"""Issue #45 item 0: a converted or local model is proved before it is used. Tiny GGUFs of each vocabulary kind,
written with the gguf package's writer: a byte-level BPE ("gpt2") with merges and a SentencePiece ("llama") one with
scores and add_bos_token convert and pass; a BPE without merges, a SentencePiece vocabulary without scores, with
equal scores or without a bos token are refused with one line; transformers 5.17's own conversion of the
SentencePiece vocabulary (zero merges, no <bos>) is refused by the proof; a base model without a chat template is
refused for chat traffic unless data.prompt_format is plain; an absurd perplexity stops `models`."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.models.gguf_source import converted
from pipeline.models.gguf_vocab import read_vocab, spm_reference
from pipeline.models.loading import load_tokenizer
from pipeline.models.model_proof import SAMPLE, prove_tokenizer
from tiny_chatml import TEXT, TINY_GROUP, chatml_tokenizer, save_checkpoint, tiny_llama, write_gguf
from tiny_project import copy_project, run, tiny_params
from tiny_spm import spm_vocab, spm_writer


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MODELPREP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def spm():
    """(vocabulary, model): a SentencePiece vocabulary and a 2-layer Llama of its size."""
    vocab = spm_vocab()
    return vocab, tiny_llama(vocab.tokens, layers=2, tied=True)  # 2: a draft of its first layer


@pytest.fixture(scope="module")
def bpe():
    tokenizer = chatml_tokenizer()
    return tokenizer, tiny_llama(tokenizer, layers=1, tied=True)


def nothing_converted(cache: Path) -> bool:
    root = cache / "converted"
    return not root.exists() or not any(p.name[0] != "." for p in root.iterdir())


def test_a_bpe_gguf_with_merges_converts_and_is_proved_against_its_merges(tmp_path, cache, bpe):
    tokenizer, model = bpe
    gguf = write_gguf(tmp_path / "bpe.gguf", model, tokenizer)
    conv = converted(str(gguf), "target")
    proof = prove_tokenizer(conv.path, "target", str(gguf), TEXT, read_vocab(gguf))
    assert proof.against == "tokenizer.ggml.merges" and not proof.adds_bos  # add_bos_token false, as SmolLM2's
    assert proof.multi_char_share > 0.1 and proof.texts == 1 + len(TEXT)


def test_a_sentencepiece_gguf_converts_to_the_tokenizer_llama_cpp_reads_it_with(tmp_path, cache, spm):
    """Scores honoured (every text split as llama.cpp's SentencePiece tokenizer splits it from the GGUF's tokens and
    scores), <bos> added as add_bos_token says, text given back; the rebuild is recorded with the conversion."""
    vocab, model = spm
    gguf = write_gguf(tmp_path / "spm.gguf", model, None, vocabulary=spm_writer(vocab))
    conv = converted(str(gguf), "target")
    assert conv.tokenizer_fixes[0].startswith("tokenizer built from the GGUF's SentencePiece tokens, scores and types")
    tokenizer = load_tokenizer(conv.path)
    gguf_vocab = read_vocab(gguf)
    for text in [SAMPLE, *TEXT, "héllo  wörld\ttab"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == spm_reference(gguf_vocab, text)
        assert tokenizer.decode(ids) == text
    assert tokenizer.tokenize(TEXT[0])[:3] == ["▁the", "▁quick", "▁brown"]
    assert tokenizer("hi")["input_ids"][0] == 1 and tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    proof = prove_tokenizer(conv.path, "target", str(gguf), TEXT, gguf_vocab)
    assert proof.against == "tokenizer.ggml.scores" and proof.adds_bos


def test_transformers_own_conversion_of_a_sentencepiece_gguf_is_refused_by_the_proof(tmp_path, spm):
    """What transformers 5.17 writes for the same vocabulary: in a gemma3 GGUF (its converter picked by architecture)
    a BPE of zero merges, every text single characters; in a llama GGUF merges but no <bos>. Both passed `models`
    before; the proof refuses each with one line."""
    from gguf import GGUFWriter
    from transformers import AutoTokenizer

    vocab, model = spm
    gguf = write_gguf(tmp_path / "llama-arch.gguf", model, None, vocabulary=spm_writer(vocab))
    raw = save_checkpoint(
        tmp_path / "raw-llama", model, AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf.name)
    )
    with pytest.raises(PipelineError) as e:
        prove_tokenizer(raw, "target", str(gguf), TEXT, read_vocab(gguf))
    assert str(e.value) == (
        f"target model {gguf}: the GGUF (tokenizer.ggml.add_bos_token) says add_bos_token is "
        "true, but its tokenizer does not put '<s>' (id 1) before a text"
    )
    # A gemma3 GGUF's tokenizer needs the metadata alone.
    writer = GGUFWriter(str(tmp_path / "gemma3.gguf"), "gemma3")
    for add in (
        writer.add_context_length,
        writer.add_embedding_length,
        writer.add_block_count,
        writer.add_feed_forward_length,
        writer.add_head_count,
        writer.add_head_count_kv,
    ):
        add(64)
    writer.add_layer_norm_rms_eps(1e-6)
    spm_writer(vocab)(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gemma = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="gemma3.gguf")
    assert len(json.loads(gemma.backend_tokenizer.to_str())["model"].get("merges") or []) == 0  # the bug, as found
    gemma.save_pretrained(raw)
    with pytest.raises(PipelineError) as e:
        prove_tokenizer(raw, "target", "gemma3.gguf", TEXT)
    assert str(e.value).startswith(
        "target model gemma3.gguf: its tokenizer reads English and code as single characters ("
    ) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kind, writer_args, message",
    [
        (
            "bpe",
            {"merges": False},
            (
                "its tokenizer.ggml.model is 'gpt2' (BPE) but it has no tokenizer.ggml.merges: "
                "without merges every text becomes single characters; not converted"
            ),
        ),
        (
            "spm",
            {"scores": "dropped"},
            (
                "its tokenizer.ggml.model is 'llama' (SentencePiece) but it has no "
                "tokenizer.ggml.scores for its 402 tokens"
            ),
        ),
        ("spm", {"scores": "equal"}, "its tokenizer.ggml.scores are all equal"),
        (
            "spm",
            {"bos": False},
            ("it says tokenizer.ggml.add_bos_token is true but names no tokenizer.ggml.bos_token_id; not converted"),
        ),
    ],
)
def test_a_broken_gguf_vocabulary_is_refused_in_one_line_before_its_weights_load(
    tmp_path, cache, bpe, spm, kind, writer_args, message
):
    if kind == "bpe":
        gguf = write_gguf(tmp_path / "broken.gguf", bpe[1], bpe[0], **writer_args)
    else:
        gguf = write_gguf(tmp_path / "broken.gguf", spm[1], None, vocabulary=spm_writer(spm[0], **writer_args))
    with pytest.raises(PipelineError) as e:
        converted(str(gguf), "target")
    line = str(e.value)
    assert line.startswith(f"target.source {gguf}: ") and message in line and "\n" not in line
    assert nothing_converted(cache)


def test_a_declared_add_bos_token_the_tokenizer_does_not_follow_is_refused(tmp_path, bpe):
    tokenizer, model = bpe
    local = save_checkpoint(tmp_path / "m", model, tokenizer)
    prove_tokenizer(local, "draft", "m", TEXT)
    config = json.loads((local / "tokenizer_config.json").read_text())
    (local / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    with pytest.raises(
        PipelineError,
        match=r"^draft model m: tokenizer_config.json says add_bos_token is true, but "
        r"its tokenizer does not put '<\|im_start\|>' \(id 1\)",
    ):
        prove_tokenizer(local, "draft", "m", TEXT)


def models_stage(proj: Path, cache: Path):
    r = run([sys.executable, "-m", "stages.models"], proj, env={**os.environ, "MODELPREP_CACHE": str(cache)})
    return r, r.stderr.strip().splitlines()


def test_models_stage_base_model_chat_traffic_needs_the_plain_format_and_a_sane_perplexity(tmp_path, cache, spm):
    """A SentencePiece base model (no chat template) as the target, a draft cut from it, chat traffic: refused in one
    line until data.prompt_format says plain; then proved, the format said in one line; and a perplexity above
    target.max_perplexity stops `models` with one line, nothing materialized."""
    vocab, model = spm
    gguf = write_gguf(tmp_path / "base.gguf", model, None, vocabulary=spm_writer(vocab))
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text(
        "".join(json.dumps({"prompt": TEXT[i], "response": TEXT[(i + 1) % len(TEXT)]}) + "\n" for i in range(len(TEXT)))
    )

    def project(name: str, **overrides) -> Path:
        params = tiny_params(
            target={"source": str(gguf), "revision": None, **overrides.pop("target", {})},
            draft={"source": {"from": "target", "layers": 1}},
            data={"traffic": str(traffic), **overrides.pop("data", {})},
            quantize=TINY_GROUP,
        )
        (tmp_path / name).mkdir()
        return copy_project(tmp_path / name, params)

    proj = project("chat")
    r, lines = models_stage(proj, cache)
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0] == (
        f"error: target model {gguf} has no chat template (a base model), and {traffic} is chat "
        "traffic (user and assistant turns): set data.prompt_format: plain to send each turn's text on "
        "its own line, or use a model with a chat template"
    )
    assert not (proj / "artifacts/models/target").exists()

    proj = project("plain", data={"prompt_format": "plain"})
    r, _ = models_stage(proj, cache)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        f"models: prompt format: plain text, each turn's text on its own line (data.prompt_format: plain; target "
        f"model {gguf} has no chat template)"
    ) in r.stdout + r.stderr
    proof = json.loads((proj / "metrics/models.json").read_text())["proof"]
    assert proof["target"]["checked_against"] == "tokenizer.ggml.scores" and proof["target"]["adds_bos"]
    assert proof["prompt_format"] == "plain" and proof["traffic_rows"] == len(TEXT)
    assert 1 < proof["target_perplexity"] < 1000  # random weights: about the vocabulary's size

    shutil.rmtree(proj / "artifacts/models")
    proj = project("absurd", data={"prompt_format": "plain"}, target={"max_perplexity": 2})
    r, lines = models_stage(proj, cache)
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: target model {gguf}: perplexity ") and lines[0].endswith(
        f"on the answers of {len(TEXT)} rows of {traffic} is above target.max_perplexity 2: its tokenizer, prompt "
        "format or weights do not fit this text"
    )
    assert not (proj / "artifacts/models/target").exists()


def test_a_tokenizer_that_loses_text_is_refused(tmp_path, bpe):
    """Words split on whitespace and never joined back, characters outside its vocabulary read as <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TEXT * 4, trainer=trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"], show_progress=False)
    )
    lossy = save_checkpoint(
        tmp_path / "lossy", bpe[1], PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    )
    with pytest.raises(PipelineError) as e:
        prove_tokenizer(lossy, "target", "lossy", TEXT)
    assert str(e.value).startswith("target model lossy: its tokenizer does not give text back: 'The quick brown fox ")
    assert "\n" not in str(e.value)
