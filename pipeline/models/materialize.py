"""What the `models` stage puts in the target's and the base draft's directories: the demo pair built and pretrained,
or the sources fetched (Hub sources at the commit `sources` fingerprinted) and a draft cut from the target's first
layers, each tokenizer checked (pipeline/models/tokenizer_check.py) and proved (model_proof.py) on the traffic's
texts as soon as it is there, before the next model is downloaded or cut."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.io import read_json
from pipeline.core.stage import record_timings
from pipeline.models.loading import load_tokenizer
from pipeline.models.model_proof import TokenizerProof, prompt_format_line, prove_source, prove_tokenizer
from pipeline.models.settings import DemoParams, DraftSource, LayerDraft, TargetParams
from pipeline.models.sources import fetch_model, source_fingerprint
from pipeline.models.tokenizer_check import check_tokenizer


@dataclass(frozen=True)
class ProofTraffic:
    """The traffic the models are proved on: data.prompt_format, data.traffic and the first rows' message texts."""

    prompt_format: str
    path: str
    texts: list[str]


@dataclass(frozen=True)
class Materialized:
    """The two directories filled and proved: metrics/models.json's source record, each proved tokenizer, the prompt
    format's line, and the demo pair's pretraining seconds (None: fetched, not trained)."""

    summary: dict
    proofs: dict[str, TokenizerProof]
    format_line: str
    seconds: dict | None = None

    def record(self, prompt_format: str, rows: int, perplexity: float) -> dict:
        """metrics/models.json."""
        return {
            **self.summary,
            "proof": {
                **{role: proof.to_json() for role, proof in self.proofs.items()},
                "prompt_format": prompt_format,
                "traffic_rows": rows,
                "target_perplexity": round(perplexity, 3),
            },
        }


def shown_target(target: TargetParams) -> str:
    return "demo target" if target.source == "demo" else target.source


def build_demo(target_dir: Path, draft_dir: Path, demo: DemoParams, traffic: ProofTraffic) -> Materialized:
    from pipeline.models.demo.models import build_demo_pair

    pair, seconds = build_demo_pair(target_dir, draft_dir, demo)
    record_timings("models", seconds)
    proofs = {}
    for role, built in (("target", target_dir), ("draft", draft_dir)):
        check_tokenizer(built, role, shown=f"demo {role}")
        proofs[role] = prove_tokenizer(built, role, f"demo {role}", traffic.texts)
    line = prompt_format_line(
        load_tokenizer(target_dir), target_dir, "demo target", traffic.prompt_format, traffic.path
    )
    return Materialized({"source": "demo", **pair}, proofs, line, seconds)


def fetch_sources(
    target: TargetParams, draft: DraftSource, target_dir: Path, draft_dir: Path, traffic: ProofTraffic
) -> Materialized:
    # Hub sources download at the commit the `sources` stage fingerprinted, not wherever a branch is now.
    prints = (
        read_json(paths.SOURCES)
        if paths.SOURCES.is_file()
        else {  # run by hand, without `dvc repro`
            "target": source_fingerprint(target.source, "target", target.revision),
            "draft": source_fingerprint(draft, "draft"),
        }
    )
    fetch_model(target.source, target_dir, "target", prints["target"].get("revision"))
    check_tokenizer(target_dir, "target", shown=target.source)  # before a draft is downloaded or cut
    proofs = {"target": prove_source(target_dir, "target", target.source, traffic.texts)}
    line = prompt_format_line(
        load_tokenizer(target_dir), target_dir, target.source, traffic.prompt_format, traffic.path
    )
    if isinstance(draft, LayerDraft):  # the target's own tokenizer files, checked above
        from pipeline.models.layer_draft import build_layer_draft
        from pipeline.models.loading import check_checkpoint_tensors

        prints = {**prints, "draft": build_layer_draft(target_dir, draft_dir, draft.layers)}
        check_checkpoint_tensors(draft_dir, "draft")  # the cut config and weights describe one model
    else:
        fetch_model(draft, draft_dir, "draft", prints["draft"].get("revision"))
        check_tokenizer(draft_dir, "draft", shown=draft)
        proofs["draft"] = prove_source(draft_dir, "draft", draft, traffic.texts)
    return Materialized(prints, proofs, line)


def summary_line(
    built: Materialized, target: TargetParams, draft: DraftSource, perplexity: float, rows: int, gpus: str
) -> str:
    """The stage's last line; gpus: each enabled variant's GPUs per replica."""
    drafted = f", draft = its first {draft.layers} layers" if isinstance(draft, LayerDraft) else ""
    source = target.source if target.source == "demo" else "their sources"
    seconds = built.seconds
    pretrained = (
        f" (pretrained in {seconds['target']['train_s']:.0f} s and {seconds['draft']['train_s']:.0f} s)"
        if seconds
        else ""
    )
    return (
        f"models: target and draft from {source}{pretrained}{drafted}, compatible; target perplexity "
        f"{perplexity:.1f} on {rows} rows of its traffic; GPUs per replica: {gpus}"
    )
