"""Fixtures only (helpers live in named modules: tiny_project, bundle_helpers, speculation_estimates,
trainer_callbacks): a tiny demo model pair, once per session, and a workspace with bundles, once per module."""

from __future__ import annotations

import os
from pathlib import Path

# Under `-n auto` two workers share the 2 cores and each starts stage processes: one math thread per process
# keeps them from oversubscribing the cores (the tiny models gain nothing from a second one). Set before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for a hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TQDM_MININTERVAL", "10")

import pytest  # noqa: E402

from bundle_helpers import BundleSpec, bundle_workspace  # noqa: E402
from tiny_project import demo_prompts, tiny_params  # noqa: E402


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of a tiny trained demo pair, built once per test session."""
    from pipeline.models.demo.models import build_demo_pair
    from pipeline.models.settings import DemoParams

    root = tmp_path_factory.mktemp("demo")
    build_demo_pair(root / "target", root / "draft", DemoParams.parse(tiny_params()["demo"]))
    return root / "target", root / "draft"


@pytest.fixture(scope="module")
def demo_target(demo_pair):
    """The demo pair's target model, loaded once per module."""
    from pipeline.models.loading import load_causal_lm

    return load_causal_lm(demo_pair[0])


@pytest.fixture(scope="module")
def demo_target_prompts(demo_pair) -> list[list[int]]:
    """Four demo prompts as the target's token ids."""
    return demo_prompts(demo_pair[0], 4)


@pytest.fixture(scope="module")
def bundled_workspace(bundle_spec: BundleSpec, demo_pair, tmp_path_factory, request) -> Path:
    """A scratch workspace holding the evaluation records of the module's `bundle_spec` (a fixture each module that
    uses this one defines) and the bundles the real bundle stage built from them. Once per module: the specs differ
    from module to module, and several tests publish from or edit their module's workspace."""
    return bundle_workspace(tmp_path_factory.mktemp(request.module.__name__), demo_pair, bundle_spec)


# After the slow files, the longest of the rest on 2 cores (measured on the suite of 2026-11): test_vllm_server.py
# (20 s, nearly all of it waiting on its servers: last, it left both cores idle), then the heaviest (20-90 s of CPU
# each). Handed out early, so the run ends on small files instead of one worker finishing a long one alone.
LONG_FILES = (
    "test_vllm_server.py",
    "test_quantize_dist.py",
    "test_handoff.py",
    "test_quantize.py",
    "test_bundle.py",
    "test_lmeval.py",
    "test_sources.py",
    "test_real_text.py",
    "test_registry.py",
    "test_signing.py",
    "test_mlflow_registry.py",
    "test_dvc_graph.py",
    "test_gguf_source.py",
    "test_sources_cache.py",
)


def pytest_configure(config):
    """pytest-xdist (3.6 on) hands `--dist loadfile`'s files out largest first by number of tests unless told not to,
    which ran the whole-pipeline builds (10 tests, the longest file by far) after files of 70 quick tests, last and
    alone: keep pytest_collection_modifyitems' order instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Files with slow tests (whole `dvc repro` builds) first, then LONG_FILES: with `-n auto --dist loadfile` the
    builds start on one worker while the rest of the suite fills the other, instead of starting last and running
    alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def order(item):
        name = item.path.name
        return item.path not in slow, LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)

    items.sort(key=order)
