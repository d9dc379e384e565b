"""The Hugging Face Hub backend without a Hub: every way of being offline is one clear line, exit 2."""

from __future__ import annotations

import pytest

from bundle_helpers import BundleSpec, free_port, one_error_line, run_stage


@pytest.fixture(scope="module")
def bundle_spec():
    return BundleSpec({"fp8-dynamic": {}}, {"publish": {"backend": "hf", "hf": {"namespace": "acme", "private": True}}})


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_test"}, "HF_HUB_OFFLINE is set"),
        ({"HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}, "needs a Hub write token in HF_TOKEN"),
        # Online mode with a token, but no Hub reachable: the real HTTP client fails, reported in one line.
        (
            {"HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_test", "HF_ENDPOINT": "http://127.0.0.1:{port}"},
            "publish of nimbus-support-fp8-dynamic",
        ),
    ],
    ids=["offline-mode", "no-token", "hub-unreachable"],
)
def test_offline_publish_is_one_line(bundled_workspace, env, expected):
    env = {k: v.format(port=free_port()) for k, v in env.items()}
    line = one_error_line(run_stage(bundled_workspace, "stages.publish", env=env))
    assert expected in line
    if "HF_ENDPOINT" in env:
        assert "acme/nimbus-support-fp8-dynamic" in line and "failed" in line
    assert not (bundled_workspace / "artifacts/publish/receipt.json").exists()
