"""params.yaml as one typed value: every concern's section, declared and registered by its own settings module
(pipeline/params/declare.py). Importing this module imports every concern's settings, so the registry is whole: the
whole-file check (pipeline/rules.py, run by `sources` and the CLI), the generated schema and docs table read it here.
A stage reads only its sections (load.parse_section), so that its deps stay its own concerns'.

`python -m pipeline.sections --write` regenerates pipeline/params/params.schema.json and docs/params.md's table from
the declarations (tests/params/test_params_declared.py fails while either is stale)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.data.settings import DataParams
from pipeline.drafts.settings import DraftParams, DraftQuantizeParams, DraftTrainingParams
from pipeline.evaluate.settings import EvaluateParams
from pipeline.models.settings import DemoParams, TargetParams
from pipeline.params.declare import REGISTRY, docs_table, params_schema
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


KINDS = {name: REGISTRY[name] for name in SECTIONS}  # params.yaml's order; a section not registered fails at import
assert set(REGISTRY) == set(SECTIONS), sorted(set(REGISTRY) ^ set(SECTIONS))
assert all(
    KINDS[f.name] is kind
    for f, kind in zip(
        fields(Params),
        (
            TargetParams,
            DraftParams,
            DemoParams,
            DataParams,
            QuantizeParams,
            DraftTrainingParams,
            DraftQuantizeParams,
            EvaluateParams,
            GatesParams,
            ServingParams,
            ServeBenchParams,
            DeployParams,
            MonitoringParams,
            PublishParams,
        ),
        strict=True,
    )
)
from pipeline.params.check import SCHEMA_FILE  # noqa: E402 - written here, read by the check

DOCS_FILE = Path(__file__).parents[1] / "docs" / "params.md"
TABLE_BEGIN = "<!-- params-table:begin (python -m pipeline.sections --write) -->"
TABLE_END = "<!-- params-table:end -->"


def schema_text(sections: Mapping[str, type] = KINDS) -> str:
    import json

    return json.dumps(params_schema(sections), indent=1) + "\n"


def docs_text(current: str, sections: Mapping[str, type] = KINDS) -> str:
    """docs/params.md with its generated table replaced (the text between the markers)."""
    head, rest = current.split(TABLE_BEGIN, 1)
    return head + TABLE_BEGIN + "\n" + docs_table(sections) + "\n" + TABLE_END + rest.split(TABLE_END, 1)[1]


def load_typed(path: str | Path = PARAMS_FILE) -> Params:
    return Params.parse(load_params(path), path)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m pipeline.sections --write")
    SCHEMA_FILE.write_text(schema_text())
    DOCS_FILE.write_text(docs_text(DOCS_FILE.read_text()))
