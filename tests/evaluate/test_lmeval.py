"""lm-eval through its real Python API: the custom held-out task in evals/ on the tiny demo model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import row_to_messages
from pipeline.evaluate import lmeval
from pipeline.models.loading import load_causal_lm, load_tokenizer
from tiny_project import ROOT, tiny_params

N_DOCS = 4


@pytest.fixture(scope="module")
def task_dir(demo_pair, tmp_path_factory):
    """A project-like directory holding artifacts/data/heldout_lmeval.jsonl, as the data stage writes it."""
    root = tmp_path_factory.mktemp("lmeval")
    lines = (ROOT / "data" / "demo" / "traffic.jsonl").read_text().splitlines()[:N_DOCS]
    (root / "artifacts" / "data").mkdir(parents=True)
    lmeval.write_task_data(
        [row_to_messages(json.loads(line)) for line in lines],
        load_tokenizer(demo_pair[0]),
        root / "artifacts" / "data" / "heldout_lmeval.jsonl",
    )
    return root


def expected_loglikelihoods(model_dir, docs: list[dict]) -> list[float]:
    """Each response's log-likelihood with the prompt tokenized as the server does (no space between
    prompt and answer, one BOS). lm-eval moves the prompt's trailing newline into the scored part."""
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    out = []
    for doc in docs:
        ids = tokenizer(doc["prompt"] + doc["response"], add_special_tokens=False)["input_ids"]
        context = tokenizer(doc["prompt"].rstrip(), add_special_tokens=False)["input_ids"]
        assert ids[: len(context)] == context
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        out.append(sum(logp[i - 1, ids[i]].item() for i in range(len(context), len(ids))))
    return out


@pytest.fixture(scope="module")
def nvfp4_target(demo_pair, tmp_path_factory):
    """The demo target as params.yaml's nvfp4a16 variant (data-free): its decompressor yields bfloat16 weights."""
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration

    params = tiny_params()
    out = tmp_path_factory.mktemp("nvfp4a16") / "model"
    quantize_model(
        demo_pair[0],
        out,
        parse_variant("nvfp4a16", params["quantize"]["variants"]["nvfp4a16"]),
        [],
        Calibration.parse(params["quantize"]["calibration"]),
    )
    return out


@pytest.mark.parametrize("model", ["target", "nvfp4a16"])
def test_custom_task_runs_on_the_demo_model(model, request, demo_pair, task_dir, monkeypatch):
    """On CPU lm-eval scores the model the evaluate stage scores (pipeline/models/loading.py), compressed-tensors
    checkpoints included."""
    model_dir = demo_pair[0] if model == "target" else request.getfixturevalue("nvfp4_target")
    monkeypatch.chdir(task_dir)  # the task's data_files path is relative to the project root
    result = lmeval.run_tasks(model_dir, ["domain_heldout"], limit=N_DOCS)
    assert result["backend"] == "hf"  # no GPU here
    scores = result["scores"]["domain_heldout"]
    # Only the task's metrics are scores (the summary, the gates and the card read them as quality): lm-eval's
    # sample_len is the number of documents scored, recorded apart.
    assert set(scores) == {"acc", "byte_perplexity", "bits_per_byte"}
    assert result["samples"] == {"domain_heldout": N_DOCS}
    assert 0.0 <= scores["acc"] <= 1.0
    assert math.isfinite(scores["byte_perplexity"]) and scores["byte_perplexity"] > 1.0
    assert scores["bits_per_byte"] == pytest.approx(math.log2(scores["byte_perplexity"]), rel=1e-6)

    docs = [json.loads(line) for line in (task_dir / "artifacts/data/heldout_lmeval.jsonl").read_text().splitlines()]
    lls = expected_loglikelihoods(model_dir, docs)
    n_bytes = sum(len(d["response"].encode()) for d in docs)
    assert scores["byte_perplexity"] == pytest.approx(math.exp(-sum(lls) / n_bytes), rel=1e-3)


def test_the_stage_loaded_model_and_the_evals_only_index_score_the_same(demo_pair, task_dir, monkeypatch):
    """The evaluate stage hands lm-eval the model it already loaded (CPU) and indexes evals/ alone when it defines
    every task: the same scores as a fresh load through lm-eval's whole task index."""
    import torch

    from pipeline.models.loading import load_causal_lm

    monkeypatch.chdir(task_dir)
    assert lmeval.manager_for(["domain_heldout"]) is lmeval.task_manager(include_defaults=False)
    assert lmeval.manager_for(["domain_heldout", "arc_easy"]) is lmeval.task_manager()
    fresh = lmeval.run_tasks(demo_pair[0], ["domain_heldout"], limit=N_DOCS)
    monkeypatch.setattr(lmeval, "manager_for", lambda tasks: lmeval.task_manager())  # the whole index, as before
    full_index = lmeval.run_tasks(
        demo_pair[0], ["domain_heldout"], limit=N_DOCS, loaded=load_causal_lm(demo_pair[0], torch.device("cpu"))
    )
    assert fresh == full_index


def test_unknown_task_is_named(demo_pair, task_dir, monkeypatch):
    monkeypatch.chdir(task_dir)
    with pytest.raises(PipelineError, match="'no_such_task' is not defined") as err:
        lmeval.run_tasks(demo_pair[0], ["domain_heldout", "no_such_task"], limit=2)
    assert "\n" not in str(err.value)


def test_missing_heldout_file_names_the_task(demo_pair, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no artifacts/data here
    with pytest.raises(PipelineError, match="'domain_heldout'.*not available locally") as err:
        lmeval.run_tasks(demo_pair[0], ["domain_heldout"], limit=2)
    assert "\n" not in str(err.value)


def test_standard_task_without_local_data_fails_in_one_line(demo_pair, tmp_path):
    """A standard lm-eval task whose dataset is not in the (empty) HF cache: offline, so no wait on a
    hub; the stage's error contract gives exit 2 and one line naming the task."""
    script = (
        "import sys; from pipeline.evaluate import lmeval; from pipeline.core.stage import stage_main; "
        "stage_main('lmeval')(lambda argv: lmeval.run_tasks(argv[0], ['arc_easy'], 2))(sys.argv[1:])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-c", script, str(demo_pair[0])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "arc_easy" in lines[0] and "not available locally" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
