"""params.yaml as a stage reads it: the mapping, every section present, and a section as its concern's typed value.

The whole file is checked once per `dvc repro`, by its always-run first stage (`sources`: pipeline/rules.py),
before any stage does work. A stage only reads, so its import closure (its code deps in dvc.yaml) is its own
concern: editing the gates, the tiers or the serving checks no longer re-runs the models, data, quantize or drafts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

import yaml

from pipeline.core.errors import PipelineError

# Always params.yaml: it is what dvc.yaml's params and dvc.lock track. Another file (the MODELPREP_PARAMS variable
# once chose one) would let a stage run on values DVC never saw, e.g. publish with the signing key unset (issue #47).
PARAMS_FILE = Path("params.yaml")
RETIRED_ENV = "MODELPREP_PARAMS"
SECTIONS = (
    "target",
    "draft",
    "demo",
    "data",
    "quantize",
    "draft_training",
    "draft_quantize",
    "evaluate",
    "gates",
    "serving",
    "serve_bench",
    "deploy",
    "monitoring",
    "publish",
)


def load_params(path: str | Path = PARAMS_FILE) -> dict:
    """params.yaml's mapping with every section present (one line naming what is missing); the values were checked
    by the `sources` stage of this `dvc repro` (pipeline/rules.py: load_checked)."""
    refuse_other_params()
    path = Path(path)
    params = read_yaml_mapping(path, hint="; run from the project root")
    missing = [s for s in SECTIONS if not isinstance(params.get(s), dict)]
    if missing:
        raise PipelineError(f"{path}: missing sections {missing}")
    return params


def refuse_other_params() -> None:
    """One line when MODELPREP_PARAMS is set: someone expects it to choose the params, and it no longer does."""
    if os.environ.get(RETIRED_ENV):
        raise PipelineError(
            f"{RETIRED_ENV} is set ({os.environ[RETIRED_ENV]}): stages read only params.yaml, which "
            "DVC tracks; unset it (to try other params, copy the project and edit its params.yaml)"
        )


class SectionParams(Protocol):
    """A concern's typed section (pipeline/<concern>/settings.py): its params.yaml key and its parser."""

    SECTION: ClassVar[str]

    @classmethod
    def parse(cls, section: dict) -> SectionParams: ...


S = TypeVar("S", bound=SectionParams)


def parse_section(params: Mapping, kind: type[S], path: str | Path = PARAMS_FILE) -> S:
    """params.yaml's section `kind.SECTION` as its typed value, or one line naming the file and the key. A stage
    reads the sections it uses this way (its deps: those concerns' settings modules, not every one's)."""
    try:
        return kind.parse(params[kind.SECTION])
    except KeyError:
        raise PipelineError(f"{path}: missing section {kind.SECTION}") from None
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None


def read_yaml_mapping(path: Path, what: str = "", hint: str = "") -> dict:
    """The mapping in a YAML file, or one line: `[<what> ]<path> not found<hint>`, not valid YAML, or not a
    mapping. Shared by load_params, the checks and profiles so params.yaml and a profile fail alike."""
    if not path.is_file():
        raise PipelineError(f"{what} {path} not found{hint}".lstrip())
    try:
        return parse_yaml_mapping(path.read_text(encoding="utf-8"), path)
    except UnicodeDecodeError as e:
        raise PipelineError(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None


def parse_yaml_mapping(text: str, path: Path) -> dict:
    """read_yaml_mapping's checks on text already read from path (no aliases, valid YAML, a mapping)."""
    try:
        # An alias (*name) is expanded in memory by every reader, DVC's too: nested ones are a billion-laughs bomb
        # (dvc status aborted, the bundle stage ran out of memory). Params need none, so none is read.
        alias = next((e for e in yaml.parse(text) if isinstance(e, yaml.AliasEvent)), None)
        if alias is not None:
            raise PipelineError(
                f"{path}:{alias.start_mark.line + 1}: YAML aliases (*{alias.anchor}) are not allowed "
                "in params; write the values out"
            )
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PipelineError(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a mapping")
    return data


def variant_argument(argv: list[str], stage: str) -> str:
    """The one VARIANT argument of a foreach stage (`python -m stages.<stage> VARIANT`)."""
    if len(argv) != 1:
        raise PipelineError(f"usage: python -m stages.{stage} VARIANT (one of quantize.enabled)")
    return argv[0]
