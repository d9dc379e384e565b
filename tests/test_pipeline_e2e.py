"""The whole pipeline through real `dvc repro` in a throwaway copy of the project."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import copy_project, run, tiny_params

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = copy_project(tmp_path_factory.mktemp("project"))
    r = run(["dvc", "repro"], proj)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return proj


def stages_run(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")]


def test_repro_publishes_every_variant(project):
    params = tiny_params()
    index = json.loads((project / "registry" / "index.json").read_text())
    for variant in params["quantize"]["enabled"]:
        name = f"{params['serving']['name']}-{variant}"
        latest = index["models"][name]["latest"]
        bundle = project / "registry" / name / latest
        assert (bundle / "model" / "config.json").is_file()
        assert (bundle / "draft" / "config.json").is_file()
        serve = yaml.safe_load((bundle / "serve.yaml").read_text())
        assert serve["model"] == "./model"
        assert serve["speculative-config"]["method"] == "draft_model"  # a YAML mapping (vLLM 0.25 --config)
        assert run(["modelprep", "verify", str(bundle)], project).returncode == 0
    gates = json.loads((project / "metrics" / "gates.json").read_text())
    assert gates["passed"] is True


def test_second_repro_is_a_noop(project):
    r = run(["dvc", "repro"], project)
    assert r.returncode == 0
    assert stages_run(r.stdout) == []


def test_threshold_change_reruns_only_gate_onward(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["gates"]["thresholds"]["max_kl_divergence"] = 0.049
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = run(["dvc", "repro"], project)
    assert r.returncode == 0, r.stderr[-2000:]
    ran = stages_run(r.stdout)
    assert ran and ran[0] == "gate"
    assert all(s == "gate" or s.startswith("bundle@") or s == "publish" for s in ran), ran


def test_failed_gate_fails_repro_naming_the_check(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["gates"]["thresholds"]["min_top1_agreement"] = 1.01  # unreachable
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = run(["dvc", "repro"], project)
    assert r.returncode != 0
    assert "min_top1_agreement" in r.stderr + r.stdout
    report = json.loads((project / "metrics" / "gates.json").read_text())
    assert report["passed"] is False
