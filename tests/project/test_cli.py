"""The modelprep CLI: help on every command, unknown variants rejected in one line."""

from __future__ import annotations

import sys

import pytest

from tiny_project import copy_project, run, tiny_params


@pytest.mark.parametrize("args", [[], ["run"], ["status"], ["verify"], ["gate"]])
def test_help(args, tmp_path):
    r = run(["modelprep", *args, "--help"], tmp_path)
    assert r.returncode == 0 and "usage: modelprep" in r.stdout


@pytest.mark.parametrize("stage", ["quantize", "evaluate", "bundle"])
def test_unknown_variant_is_one_line(stage, tmp_path):
    proj = copy_project(tmp_path)
    r = run([sys.executable, "-m", f"stages.{stage}", "int3-magic"], proj)
    assert r.returncode == 2
    known = ", ".join(sorted(tiny_params()["quantize"]["variants"]))  # the defined ones, enabled or not
    assert r.stderr.strip() == f"error: unknown variant 'int3-magic'; known variants: {known}"


@pytest.mark.parametrize("stage", ["quantize", "evaluate", "bundle"])
def test_missing_variant_argument_is_one_line(stage, tmp_path):
    r = run([sys.executable, "-m", f"stages.{stage}"], copy_project(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: usage: python -m stages.{stage} VARIANT (one of quantize.enabled)"
