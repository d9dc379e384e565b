"""params.yaml as one typed value: every concern's section parsed by its own settings module. The whole-file check
(check.py, run by `sources` and the CLI) parses it so; a stage reads only its sections (load.parse_section), so
that its deps stay its own concerns'."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.data.settings import DataParams
from pipeline.drafts.settings import DraftParams, DraftQuantizeParams, DraftTrainingParams
from pipeline.evaluate.settings import EvaluateParams
from pipeline.models.settings import DemoParams, TargetParams
from pipeline.params.load import PARAMS_FILE, SECTIONS, load_params, parse_section
from pipeline.quantize.settings import QuantizeParams
from pipeline.release.settings import DeployParams, GatesParams, MonitoringParams, PublishParams
from pipeline.serving.settings import ServeBenchParams, ServingParams


@dataclass(frozen=True)
class Params:
    """Every section of params.yaml, typed; a field per section, named as the section."""
    target: TargetParams
    draft: DraftParams
    demo: DemoParams
    data: DataParams
    quantize: QuantizeParams
    draft_training: DraftTrainingParams
    draft_quantize: DraftQuantizeParams
    evaluate: EvaluateParams
    gates: GatesParams
    serving: ServingParams
    serve_bench: ServeBenchParams
    deploy: DeployParams
    monitoring: MonitoringParams
    publish: PublishParams

    @classmethod
    def parse(cls, mapping: Mapping, path: str | Path = PARAMS_FILE) -> Params:
        """Each section by its concern's parser, in params.yaml's order; the first problem as one line naming the
        file and the key."""
        if not isinstance(mapping, Mapping):
            raise PipelineError(f"{path}: expected a mapping of sections")
        missing = [s for s in SECTIONS if not isinstance(mapping.get(s), Mapping)]
        if missing:
            raise PipelineError(f"{path}: missing sections {missing}")
        return cls(**{f.name: parse_section(mapping, KINDS[f.name], path) for f in fields(cls)})


KINDS = {kind.SECTION: kind for kind in (
    TargetParams, DraftParams, DemoParams, DataParams, QuantizeParams, DraftTrainingParams, DraftQuantizeParams,
    EvaluateParams, GatesParams, ServingParams, ServeBenchParams, DeployParams, MonitoringParams, PublishParams)}
assert tuple(KINDS) == SECTIONS  # a section added to one list and not the other fails at import


def load_typed(path: str | Path = PARAMS_FILE) -> Params:
    return Params.parse(load_params(path), path)
