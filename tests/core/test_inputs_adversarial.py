"""Inputs that try to get past the pipeline: corrupt or pickled model directories, moving model
sources, badly encoded or malformed traffic, half-written training checkpoints, and the temp
directories of killed stages. Each is one clear line, or handled, before any expensive work."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_dir, atomic_write_text
from pipeline.data.traffic import load_traffic
from pipeline.drafts.finetune import fine_tune
from pipeline.drafts.settings import DraftTrainingParams
from pipeline.models.sources import check_model_dir, fetch_model, source_fingerprint
from tiny_project import copy_project, run, tiny_params
from trainer_callbacks import Interrupt, RecordStart


def one_line_error(call, *args) -> str:
    with pytest.raises(PipelineError) as e:
        call(*args)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


# --- model directories --------------------------------------------------------------------------


def model_dir(path: Path) -> Path:
    """A directory that passes the checks: a tiny Llama's config and weights (the tensors its config names), a
    tokenizer file."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True)
    config = LlamaConfig(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=16,
    )
    (path / "config.json").write_text(config.to_json_string())
    save_file({k: v.contiguous() for k, v in LlamaForCausalLM(config).state_dict().items()}, path / "model.safetensors")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_pickle_beside_a_decoy_safetensors_is_refused(tmp_path):
    src = model_dir(tmp_path / "m")
    os.rename(src / "model.safetensors", src / "adapter.safetensors")  # a *.safetensors that is not the model
    torch.save({"w": torch.zeros(4)}, src / "pytorch_model.bin")
    message = one_line_error(fetch_model, str(src), tmp_path / "out", "target")
    assert "has no model.safetensors" in message
    assert "pickled weights are never loaded: convert pytorch_model.bin to safetensors" in message
    assert not (tmp_path / "out").exists()


def test_pickles_and_git_internals_are_never_copied(tmp_path, capsys):
    src = model_dir(tmp_path / "m")
    for name in ("pytorch_model.bin", "training_args.pt", "extra.pkl"):
        (src / name).write_bytes(b"pickle")
    (src / ".git" / "lfs").mkdir(parents=True)
    (src / ".git" / "lfs" / "model.safetensors").write_bytes(b"second copy of the weights")
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text("{}")
    (src / "original" / "consolidated.00.pth").write_bytes(b"pickle")
    out = tmp_path / "out"
    out.mkdir()
    assert fetch_model(str(src), out, "target") == "local"
    copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert copied == ["config.json", "model.safetensors", "original/params.json", "tokenizer.json"]
    assert "not copied, pickled: extra.pkl, pytorch_model.bin, training_args.pt" in capsys.readouterr().out


def test_a_tokenizer_config_without_a_vocabulary_names_the_missing_file(tmp_path):
    src = model_dir(tmp_path / "m")
    (src / "tokenizer.json").rename(src / "tokenizer_config.json")
    assert "has no tokenizer vocabulary: expected tokenizer.json" in one_line_error(check_model_dir, src, "target")


def test_hub_cache_snapshot_is_copied_as_files_not_links(tmp_path):
    """A snapshot in the Hub cache is symlinks into its repository's blobs/: artifacts must not point out of the
    workspace."""
    repo = tmp_path / "models--acme--tiny"
    blobs, snapshot = model_dir(repo / "blobs"), repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for f in blobs.iterdir():
        (snapshot / f.name).symlink_to(f)
    out = tmp_path / "out"
    out.mkdir()
    fetch_model(str(snapshot), out, "target")
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.is_symlink()) == sorted(
        p.name for p in blobs.iterdir()
    )


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize(
    "damage, bad_file, expected",
    [
        (lambda d: truncate(d / "model.safetensors"), "model.safetensors", "truncated or not a safetensors file"),
        (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors", "truncated or not a safetensors"),
        (lambda d: (d / "config.json").write_text('{"model_type": "llama",'), "config.json", "not valid JSON"),
        (lambda d: (d / "config.json").write_bytes(b'{"model_type": "\xff"}'), "config.json", "not valid JSON"),
        (lambda d: (d / "config.json").write_text('{"hidden_size": 8}'), "config.json", "has no model_type"),
        (lambda d: (d / "config.json").write_text("[]"), "config.json", "has no model_type"),
    ],
    ids=["truncated-weights", "empty-weights", "cut-off-config", "latin1-config", "no-model-type", "config-not-object"],
)
def test_corrupt_model_files_are_one_line_naming_the_file(tmp_path, damage, bad_file, expected):
    src = model_dir(tmp_path / "m")
    damage(src)
    message = one_line_error(check_model_dir, src, "draft")
    assert message.startswith(f"draft model file {src / bad_file} ") and expected in message


def sharded_model_dir(path: Path) -> Path:
    src = model_dir(path)
    os.rename(src / "model.safetensors", src / "model-00001-of-00002.safetensors")
    save_file({"v": torch.zeros(4)}, src / "model-00002-of-00002.safetensors")
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}})
    )
    return src


def test_sharded_checkpoint_needs_every_shard_whole(tmp_path):
    src = sharded_model_dir(tmp_path / "m")
    check_model_dir(src, "target")
    truncate(src / "model-00002-of-00002.safetensors")
    assert "model-00002-of-00002.safetensors is truncated" in one_line_error(check_model_dir, src, "target")
    (src / "model-00002-of-00002.safetensors").unlink()
    message = one_line_error(check_model_dir, src, "target")
    assert "index.json names shard 'model-00002-of-00002.safetensors', which is not in" in message


def test_models_stage_rejects_a_truncated_download_with_one_line(tmp_path):
    src = model_dir(tmp_path / "m")
    truncate(src / "model.safetensors")
    draft = model_dir(tmp_path / "d")
    proj = tmp_path / "proj"
    proj.mkdir()
    copy_project(proj, tiny_params(target={"source": str(src), "revision": None}, draft={"source": str(draft)}))
    r = run([sys.executable, "-m", "stages.models"], proj)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: target model file ") and "truncated" in lines[0], r.stderr
    assert not (proj / "artifacts" / "models" / "target").exists()


# --- source fingerprints ---------------------------------------------------------------------------


def test_local_fingerprint_follows_content_not_mtime_or_location(tmp_path):
    src = model_dir(tmp_path / "m")
    first = source_fingerprint(str(src), "target")
    assert first["kind"] == "local" and first["files"] == 3 and str(tmp_path) not in json.dumps(first)
    os.utime(src / "model.safetensors", (1, 1))
    (src / "pytorch_model.bin").write_bytes(b"never copied, so not part of the source")
    assert source_fingerprint(str(src), "target") == first
    assert source_fingerprint(str(shutil.copytree(src, tmp_path / "elsewhere")), "target") == first
    edited = (src / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 2e-06')
    with (src / "config.json").open("r+") as f:  # edited in place: same inode, same size
        f.write(edited)
    assert source_fingerprint(str(src), "target")["sha256"] != first["sha256"]


def test_demo_and_unreachable_hub_fingerprints(tmp_path, monkeypatch):
    from huggingface_hub import constants

    assert source_fingerprint("demo", "target") == {"kind": "demo"}
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "could not resolve target model 'org/model'" in one_line_error(source_fingerprint, "org/model", "target")
    # Online but nothing answers: httpx's errors are not OSErrors, and used to escape as a traceback.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    assert "could not resolve draft model 'org/model'" in one_line_error(source_fingerprint, "hf:org/model", "draft")
    assert "could not download 'org/model'" in one_line_error(fetch_model, "org/model", tmp_path / "o", "target")


# --- traffic files -----------------------------------------------------------------------------------

GOOD = json.dumps({"prompt": "question?", "response": "answer."})


def conversation(*turns: tuple[str, str]) -> str:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})


def test_non_utf8_traffic_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes((GOOD + "\n").encode() * 2 + '{"prompt": "caf\xe9?", "response": "yes"}\n'.encode("latin-1"))
    message = one_line_error(load_traffic, path)
    assert message.startswith(f"{path}:3: not valid UTF-8 (byte 0xe9")


def test_byte_order_mark_is_tolerated(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(("\ufeff" + GOOD + "\n" + GOOD + "\n").encode())
    assert len(load_traffic(path)) == 2


@pytest.mark.parametrize(
    "bad, expected",
    [
        (conversation(("user", "hi"), ("assistant", "")), "message 2 (assistant) has empty content"),
        (
            conversation(("system", " \n\t"), ("user", "hi"), ("assistant", "yo")),
            "message 1 (system) has empty content",
        ),
        (
            conversation(("assistant", "hello"), ("user", "hi"), ("assistant", "yo")),
            "message 1 is from the assistant where the user is expected",
        ),
        (
            conversation(("system", "s"), ("assistant", "hello"), ("user", "hi"), ("assistant", "yo")),
            "message 2 is from the assistant where the user is expected",
        ),
        (
            conversation(("user", "a"), ("user", "b"), ("assistant", "c")),
            "message 2 is from the user where the assistant",
        ),
        (conversation(("user", "a"), ("system", "b"), ("assistant", "c")), "message 2 is from the system where"),
        (conversation(("user", "a"), ("assistant", "b"), ("user", "c")), "must end with an assistant turn"),
        (conversation(("system", "only a system prompt")), "must end with an assistant turn"),
        (json.dumps({"prompt": "  ", "response": "x"}), "missing or empty string field 'prompt'"),
        ('{"prompt": "\\ud800", "response": "x"}', "unpaired surrogate"),
    ],
)
def test_malformed_conversation_names_file_and_line(tmp_path, bad, expected):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([GOOD, GOOD, bad]) + "\n")
    message = one_line_error(load_traffic, path)
    assert message.startswith(f"{path}:3: ") and expected in message, message


def test_well_formed_multi_turn_conversations_load(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        conversation(("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"))
        + "\n"
        + conversation(("user", "a"), ("assistant", "b"))
        + "\n"
    )
    assert [len(c) for c in load_traffic(path)] == [5, 2]


# --- half-written training checkpoints ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_training(tmp_path_factory):
    """(base_dir, train, evals, cfg, uninterrupted weights): a random 1-layer Llama and 20 token
    sequences, the same Trainer path and checkpoint cadence as tests/drafts/test_draft.py in ~1 s a run."""
    base = tmp_path_factory.mktemp("tiny") / "base"
    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
    ).save_pretrained(base)
    rng = random.Random(0)
    examples = [
        {"input_ids": ids, "labels": ids} for ids in ([rng.randrange(1, 64) for _ in range(12)] for _ in range(20))
    ]
    cfg = DraftTrainingParams.parse(
        tiny_params(
            draft_training={
                "epochs": 2,
                "batch_size": 4,
                "logging_steps": 2,
                "save_steps": 4,
                "warmup_steps": 1,
                "resume": True,
            }
        )["draft_training"]
    )
    model, _ = fine_tune(
        base, 0, examples[:16], examples[16:], dataclasses.replace(cfg, resume=False), tmp_path_factory.mktemp("ref")
    )
    return base, examples[:16], examples[16:], cfg, model.state_dict()


def interrupted_run(tiny_training, work: Path) -> Path:
    """work/checkpoint-4, complete, from a run stopped right after saving it."""
    base, train, evals, cfg, _ = tiny_training
    with pytest.raises(KeyboardInterrupt):
        fine_tune(base, 0, train, evals, cfg, work, callbacks=[Interrupt()])
    return work / "checkpoint-4"


def resume(tiny_training, work: Path) -> int:
    """Resume in work; check the result is the uninterrupted run's; return the step it started at."""
    base, train, evals, cfg, reference = tiny_training
    start = RecordStart()
    model, _ = fine_tune(base, 0, train, evals, cfg, work, callbacks=[start])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in reference.items())
    return start.start_step


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
        (lambda c: (c / "trainer_state.json").write_text('{"global_step": 8,'), "unreadable trainer_state.json"),
        (lambda c: truncate(c / "model.safetensors"), "truncated model.safetensors"),
        (lambda c: truncate(c / "optimizer.pt"), "truncated optimizer.pt"),
    ],
    ids=["no-state", "cut-off-state", "truncated-weights", "truncated-optimizer"],
)
def test_resume_skips_a_half_written_newest_checkpoint(tiny_training, tmp_path, capsys, damage, reason):
    complete = interrupted_run(tiny_training, tmp_path / "work")
    partial = shutil.copytree(complete, tmp_path / "work" / "checkpoint-8")  # killed while saving step 8
    damage(partial)
    capsys.readouterr()
    assert resume(tiny_training, tmp_path / "work") == 4
    assert (
        f"draft training: discarded incomplete checkpoint-8 ({reason}); resuming from checkpoint-4\n"
        in capsys.readouterr().out
    )


def test_resume_with_only_a_half_written_checkpoint_starts_afresh(tiny_training, tmp_path, capsys):
    checkpoint = interrupted_run(tiny_training, tmp_path / "work")
    os.unlink(checkpoint / "model.safetensors")
    capsys.readouterr()
    assert resume(tiny_training, tmp_path / "work") == 0
    assert "discarded incomplete checkpoint-4 (no model weights); starting afresh\n" in capsys.readouterr().out


# --- temp files of killed stages ---------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_atomic_dir_removes_temps_of_dead_processes_only(tmp_path):
    dead, live = dead_pid(), os.getpid()
    stale_dir, stale_aside = tmp_path / f".out.tmp-{dead}-ab12", tmp_path / f".out.tmp-{dead}-cd34-old"
    for d in (stale_dir, stale_aside):
        d.mkdir()
        (d / "weights").write_text("half")
    (tmp_path / f".out.tmp-{dead}-ef56").write_text("stale temp file")
    kept = [tmp_path / f".out.tmp-{live}-gh78", tmp_path / f".other.tmp-{dead}-ij90", tmp_path / ".out.tmp-legacy"]
    for d in kept:
        d.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").write_text("previous")
    with atomic_dir(tmp_path / "out") as tmp:
        assert tmp.name.startswith(f".out.tmp-{live}-")
        (tmp / "new").write_text("complete")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *(d.name for d in kept)])
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["new"]  # replaced, no aside left behind


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_atomic_dir_output_gets_the_modes_the_umask_gives(tmp_path, umask):
    """mkdtemp makes 0700 and safetensors writes weights 0600; the finished output is 0644/0755 under umask 022
    (0640/0750 under 027), an executable keeps its x bits, a hard-linked file (a user's own weights, linked in by
    the models stage) keeps its mode, and a link is not followed."""
    import stat

    import torch
    from safetensors.torch import save_file

    outside = tmp_path / "users-weights.safetensors"
    save_file({"w": torch.zeros(2)}, outside)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    old = os.umask(umask)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            assert stat.S_IMODE(tmp.stat().st_mode) == 0o700
            (tmp / "model").mkdir(mode=0o700)
            save_file({"w": torch.zeros(2)}, tmp / "model" / "model.safetensors")
            (tmp / "run.sh").write_text("#!/bin/sh\n")
            (tmp / "run.sh").chmod(0o700)
            os.link(outside, tmp / "linked.safetensors")
            (tmp / "alias").symlink_to("model/model.safetensors")
    finally:
        os.umask(old)
    out = tmp_path / "out"
    modes = {
        p.relative_to(out).as_posix(): stat.S_IMODE(p.lstat().st_mode)
        for p in [out, *out.rglob("*")]
        if not p.is_symlink()
    }
    assert modes == {
        ".": 0o777 & ~umask,
        "model": 0o777 & ~umask,
        "model/model.safetensors": 0o666 & ~umask,
        "run.sh": 0o777 & ~umask,
        "linked.safetensors": 0o600,
    }
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600  # never someone else's file


def test_failed_atomic_dir_keeps_the_previous_output(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").write_text("previous")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "out") as tmp:
        (tmp / "new").write_text("half")
        raise RuntimeError
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (tmp_path / "out" / "old").is_file()


def test_atomic_write_text_removes_temps_of_dead_processes_only(tmp_path):
    dead, live = dead_pid(), os.getpid()
    (tmp_path / f".m.json.tmp-{dead}-ab12").write_text("stale")
    (tmp_path / f".m.json.tmp-{live}-cd34").write_text("live")
    atomic_write_text(tmp_path / "m.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.json", f".m.json.tmp-{live}-cd34"])


# --- issue #47: absurd shapes and templates -----------------------------------------------------------


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_hidden_layers", 200_000),
        ("hidden_size", 10**7),
        ("vocab_size", 10**9),
        ("intermediate_size", 10**8),
        ("num_hidden_layers", -3),
        ("hidden_size", "4096"),
    ],
)
def test_an_absurd_config_shape_is_refused_before_anything_is_built(tmp_path, key, value):
    """num_hidden_layers 200000 took 4.3 GB and was still building a meta-device model after 150 s: refused now
    by the directory check and by the weights check, in one line naming the file and the key, in well under a
    second."""
    import time

    from pipeline.models.loading import check_checkpoint_tensors

    path = model_dir(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, key: value}))
    t0 = time.monotonic()
    line = one_line_error(check_model_dir, path, "target")
    assert line.startswith(f"target model file {path / 'config.json'}: {key} ") and (
        "beyond any real model's" in line or "not a positive integer" in line
    ), line
    line = one_line_error(check_checkpoint_tensors, path, "target")
    assert f"{key} " in line and "config.json" in line
    assert time.monotonic() - t0 < 5
    nested = {**config, "text_config": {"num_hidden_layers": 200_000}}  # a multimodal config's text part
    (path / "config.json").write_text(json.dumps(nested))
    assert "num_hidden_layers 200000 is beyond" in one_line_error(check_model_dir, path, "target")


def test_a_chat_template_that_would_run_for_ever_is_stopped(tmp_path):
    """A chat template with nested range(100000) loops hung the tokenizer check (jinja's sandbox bounds one range,
    not ten billion iterations of two): the render is now bounded in time, one line naming the file."""
    import time

    from pipeline.models.tokenizer_check import RENDER_LIMIT_S, check_tokenizer
    from tiny_chatml import chatml_tokenizer, save_checkpoint, tiny_llama

    tokenizer = chatml_tokenizer()
    target = save_checkpoint(tmp_path / "t", tiny_llama(tokenizer, layers=1, tied=True), tokenizer)
    check_tokenizer(target, "target")
    template = target / "chat_template.jinja"
    template.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + template.read_text()
    )
    t0 = time.monotonic()
    line = one_line_error(check_tokenizer, target, "target")
    assert time.monotonic() - t0 < RENDER_LIMIT_S + 10
    assert line == (
        f"{target}/chat_template.jinja: the chat template took over {RENDER_LIMIT_S:g} s to render a "
        "user question and an answer (real ones take milliseconds); refused"
    )
