"""Model sources: demo, local directory, Hugging Face Hub (offline here)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.models.sources import classify, fetch_model
from tiny_project import copy_project, run, tiny_params


@pytest.mark.parametrize(
    "source, kind",
    [
        ("demo", "demo"),
        ("./models/x", "local"),
        ("/abs/path", "local"),
        ("meta-llama/Llama-3.1-8B", "hf"),
        ("hf:org/name", "hf"),
    ],
)
def test_classify(source, kind):
    assert classify(source) == kind


def test_local_source_is_copied_and_checked(tmp_path, demo_pair):
    dst = tmp_path / "out"
    assert fetch_model(str(demo_pair[0]), dst, "target") == "local"
    assert (dst / "config.json").is_file() and list(dst.glob("*.safetensors"))


def test_a_link_out_of_the_model_directory_is_refused_before_any_copy(tmp_path, demo_pair):
    """model/notes.txt -> a secret elsewhere would be copied into the bundle and published; one line, no copy."""
    src = tmp_path / "model"
    shutil.copytree(demo_pair[0], src)
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2")
    (src / "notes.txt").symlink_to(secret)
    with pytest.raises(
        PipelineError,
        match=r"target model directory .*: notes.txt is a link to .*secret.txt, "
        "outside the model directory",
    ) as e:
        fetch_model(str(src), tmp_path / "out", "target")
    assert "hunter2" not in str(e.value) and not (tmp_path / "out").exists()
    (src / "notes.txt").unlink()
    (src / "notes.txt").symlink_to(src / "notes.txt")  # a loop
    with pytest.raises(PipelineError, match="notes.txt cannot be resolved"):
        fetch_model(str(src), tmp_path / "out", "target")


def test_a_hub_cache_snapshot_links_into_its_blobs(tmp_path, demo_pair):
    """The Hugging Face cache layout: snapshots/<rev>/<file> -> ../../blobs/<hash>, which is the model's own."""
    repo = tmp_path / "models--acme--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in sorted(demo_pair[0].iterdir()):
        if f.is_file():
            (blobs / f.name).write_bytes(f.read_bytes())
            (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    assert fetch_model(str(snap), tmp_path / "out", "target") == "local"
    assert not (tmp_path / "out" / "config.json").is_symlink()


def test_weights_that_do_not_match_the_config_are_refused(tmp_path, demo_pair):
    """A config with one layer more than the weights (or a decoy model.safetensors): transformers would initialise
    the missing layer at random and only log it; the models stage refuses it in one line instead."""
    src = tmp_path / "model"
    shutil.copytree(demo_pair[0], src)
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers + 1}))
    with pytest.raises(
        PipelineError,
        match=rf"target model .*: model.safetensors has no tensor for \d+ parameter\(s\) "
        rf"\(model.layers.{layers}\.",
    ):
        fetch_model(str(src), tmp_path / "out", "target")
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers - 1}))
    with pytest.raises(PipelineError, match="holds tensors the config has no place for"):
        fetch_model(str(src), tmp_path / "out2", "target")
    (src / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    with pytest.raises(PipelineError, match="holds tensors of another shape"):
        fetch_model(str(src), tmp_path / "out3", "target")


@pytest.fixture(scope="module")
def quantized_pair(demo_pair, tmp_path_factory) -> dict[str, Path]:
    """The demo target quantized for real (llm-compressor, round-to-nearest: no calibration data) in the two
    compressed-tensors layouts: INT4 packed (weight_packed, weight_scale, weight_shape) and FP8 (weight, scales)."""
    from pipeline.quantize.oneshot import quantize_model
    from pipeline.quantize.recipes import parse_variant
    from pipeline.quantize.settings import Calibration

    root = tmp_path_factory.mktemp("quantized")
    cfg = Calibration.parse(tiny_params()["quantize"]["calibration"])
    out = {}
    for name, spec in (
        ("w4a16", {"algorithm": "rtn", "scheme": "W4A16", "group_size": 32}),
        ("fp8", {"algorithm": "rtn", "scheme": "FP8_DYNAMIC"}),
    ):
        quantize_model(demo_pair[0], root / name, parse_variant(name, spec), [], cfg)
        out[name] = root / name
    return out


@pytest.mark.parametrize("layout", ["w4a16", "fp8"])
def test_a_quantized_checkpoint_whose_config_does_not_match_its_weights_is_refused(layout, quantized_pair, tmp_path):
    """Issue #47: the check skipped any config with a quantization_config, so a config with more layers than the
    quantized weights loaded with the extra layers at random. Checked through compressed-tensors' names now."""
    from pipeline.models.loading import check_checkpoint_tensors

    src = tmp_path / "model"
    shutil.copytree(quantized_pair[layout], src)
    check_checkpoint_tensors(src, "target")  # the real checkpoint passes
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2 * layers}))
    with pytest.raises(
        PipelineError,
        match=rf"target model .*: model.safetensors has no tensor for \d+ parameter\(s\) "
        rf"\(model.layers.{layers}\.",
    ):
        fetch_model(str(src), tmp_path / "out", "target")
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers - 1}))
    with pytest.raises(PipelineError, match="holds tensors the config has no place for"):
        check_checkpoint_tensors(src, "target")
    (src / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 8}))
    with pytest.raises(PipelineError, match="holds tensors of another shape"):
        check_checkpoint_tensors(src, "target")


def test_missing_local_dir_is_one_clear_error(tmp_path):
    with pytest.raises(PipelineError, match="target model directory .* does not exist"):
        fetch_model(str(tmp_path / "nope"), tmp_path / "out", "target")


def test_dir_without_weights_is_rejected(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(PipelineError, match="safetensors"):
        fetch_model(str(tmp_path / "m"), tmp_path / "out", "target")


def test_hub_source_offline_fails_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PipelineError, match="could not download 'org/model'") as e:
        fetch_model("org/model", tmp_path / "out", "target")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "target, draft, expected",
    [
        ("./no/such/model", "./no/such/draft", "target model directory no/such/model does not exist"),
        ("someorg/somemodel", "someorg/somedraft", "could not resolve target model 'someorg/somemodel'"),
        ("demo", "./some/draft", "both be 'demo'"),
    ],
)
def test_models_stage_bad_source_exits_2_with_one_line(tmp_path, target, draft, expected):
    params = tiny_params(target={"source": target, "revision": None}, draft={"source": draft})
    proj = copy_project(tmp_path, params)
    r = run([sys.executable, "-m", "stages.models"], proj, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], r.stderr
    assert not (proj / "artifacts" / "models" / "target").exists()


def test_editing_a_local_source_in_place_makes_models_stale(tmp_path, demo_pair):
    """Real DVC: the always-run `sources` stage fingerprints a local model directory, so an in-place
    edit re-runs `models` (and what follows), while an untouched directory leaves it up to date."""

    target, draft = (shutil.copytree(d, tmp_path / name) for d, name in zip(demo_pair, ("target", "draft")))
    params = tiny_params(target={"source": str(target), "revision": None}, draft={"source": str(draft)})
    (tmp_path / "proj").mkdir()
    proj = copy_project(tmp_path / "proj", params)
    assert run(["dvc", "repro", "models"], proj).returncode == 0
    recorded = json.loads((proj / "metrics/models.json").read_text())
    assert recorded["target"]["kind"] == "local" and str(tmp_path) not in json.dumps(recorded)  # hashes, no paths

    def models_stale() -> bool:
        assert run(["dvc", "repro", "--single-item", "stages/dvc.yaml:sources"], proj).returncode == 0
        r = run(["dvc", "status", "--json", "models"], proj)
        return "models" in json.loads(r.stdout or "{}")

    assert not models_stale()
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "rope_theta": config.get("rope_theta", 10000.0) * 2}))
    assert models_stale()
