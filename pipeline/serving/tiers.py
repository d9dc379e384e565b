"""Serving tiers: named variations of the serving settings (latency-first, throughput-first, multi-GPU),
each rendered into every bundle as its own `serve-<tier>.yaml` and Kubernetes manifest.

The `default` tier is `serving` itself (the bundle's `serve.yaml`, what serve_bench measured). A tier
overrides engine settings and says at which concurrency it will run; its speculation follows the
measurement at that concurrency, never a guess: the gate's decision where the tier runs at the target
concurrency, a serving-benchmark decision where the sweep measured the tier's concurrency, and no
speculation where nothing says it pays there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.core.errors import PipelineError
from pipeline.core.values import is_positive_int
from pipeline.serving.settings import AUTO_TP, ServingParams, Slo, parse_slo

DEFAULT = "default"
# Engine settings a tier may override (vLLM engine args of the same names).
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "tensor_parallel_size")
TIER_KEYS = {*ENGINE_KEYS, "gpus", "concurrency", "speculation", "slo"}
SPECULATION = ("auto", "off")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")  # part of Kubernetes object names


@dataclass(frozen=True)
class Tier:
    name: str
    engine: dict = field(default_factory=dict)  # overrides of the serving section's engine settings
    gpus: int = 1  # GPUs a replica requests; tensor_parallel_size must fit in them
    concurrency: int = 1  # the load it is sized for: where its speculative setting is decided
    speculation: str = "auto"  # auto: what was measured (or estimated) to pay at that concurrency; off
    tensor_parallel_size: int = 1  # its own, or serving.tensor_parallel_size's
    slo: Slo | None = None  # the latency objective it is sized for: serving.slo with its own overrides

    @property
    def serve_file(self) -> str:
        return "serve.yaml" if self.name == DEFAULT else f"serve-{self.name}.yaml"


def parse_tiers(serving: ServingParams) -> list[Tier]:
    """The default tier and serving.tiers, validated; one error line naming the bad key. serving: resolved for one
    variant (parallelism.serving_for) where its tensor_parallel_size is auto."""
    default_tp = serving.tensor_parallel_size
    if default_tp == AUTO_TP:  # a programming error, not the user's: say where the size comes from
        raise PipelineError(
            "serving.tensor_parallel_size auto: the tiers need a variant's own size "
            "(pipeline/serving/parallelism.py serving_for)"
        )
    # The default tier requests exactly the GPUs it shards over: a replica can't use more.
    tiers = [
        Tier(
            DEFAULT,
            {},
            gpus=default_tp,
            concurrency=serving.target_concurrency,
            tensor_parallel_size=default_tp,
            slo=serving.slo,
        )
    ]
    for name, spec in serving.tiers.items():
        where = f"serving.tiers.{name}"
        if not isinstance(name, str) or not NAME.match(name) or name == DEFAULT:
            raise PipelineError(
                f"serving.tiers: invalid tier name {name!r} (lowercase letters, digits and '-', "
                f"at most 32; {DEFAULT!r} is the serving section itself)"
            )
        if not isinstance(spec, Mapping):
            raise PipelineError(f"{where} must be a mapping of settings")
        unknown = sorted(set(spec) - TIER_KEYS)
        if unknown:
            raise PipelineError(f"{where}: unknown settings {unknown}; known: {sorted(TIER_KEYS)}")
        for key in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "gpus", "concurrency"):
            if key in spec and not is_positive_int(spec[key]):
                raise PipelineError(f"{where}.{key} must be a positive integer, got {spec[key]!r}")
        if "enable_chunked_prefill" in spec and spec["enable_chunked_prefill"] is not True:
            # vLLM's --config drops false flags, so false would silently keep its default (on): refuse it
            raise PipelineError(f"{where}.enable_chunked_prefill can only be true (leave it out for vLLM's default)")
        speculation = spec.get("speculation", "auto")
        if speculation not in SPECULATION:
            raise PipelineError(f"{where}.speculation must be one of {list(SPECULATION)}, got {speculation!r}")
        engine = {k: spec[k] for k in ENGINE_KEYS if k in spec}
        tp = engine.get("tensor_parallel_size", default_tp)
        gpus = spec.get("gpus", tp)
        if tp > gpus:
            inherited = "" if "tensor_parallel_size" in engine else " (serving.tensor_parallel_size)"
            raise PipelineError(
                f"{where}: tensor_parallel_size {tp}{inherited} exceeds the {gpus} GPUs the tier declares (gpus)"
            )
        concurrency = spec.get("concurrency", engine.get("max_num_seqs", serving.max_num_seqs))
        own_slo = parse_slo(spec["slo"], f"{where}.slo", serving.slo) if "slo" in spec else serving.slo
        tiers.append(Tier(name, engine, gpus, concurrency, speculation, tp, own_slo))
    check_draft_tensor_parallel_size(serving.speculation.draft_tensor_parallel_size, tiers)
    return tiers


def check_draft_tensor_parallel_size(draft_tp: int | None, tiers: list[Tier]) -> None:
    """serving.speculation.draft_tensor_parallel_size: null, or the tensor parallelism of every tier that may ship
    the draft model. vLLM 0.26's SpeculativeConfig takes 1 as well, but its draft-model proposer
    (vllm/v1/spec_decode/draft_model.py, _raise_if_draft_tp_mismatch) refuses any other than the target's when
    the engine starts, so 1 under a sharded target would only fail on the GPU."""
    if draft_tp is None:
        return
    for tier in tiers:
        if tier.speculation != "off" and tier.tensor_parallel_size != draft_tp:
            raise PipelineError(
                f"serving.speculation.draft_tensor_parallel_size {draft_tp} differs from tier "
                f"{tier.name}'s tensor_parallel_size {tier.tensor_parallel_size}: vLLM 0.26 serves a "
                "draft model only at its target's (null follows each tier's)"
            )


def is_names(wanted) -> bool:
    """A list or tuple of tier names, as written or as typed params hold it (a string is a sequence of letters)."""
    return isinstance(wanted, Sequence) and not isinstance(wanted, str)


def select(tiers: list[Tier], wanted, param: str = "deploy.tiers") -> list[Tier]:
    """deploy.tiers: `all`, or a sequence of tier names (an unknown one is an error)."""
    if wanted == "all":
        return tiers
    known = {t.name for t in tiers}
    if not is_names(wanted) or not wanted:
        raise PipelineError(f"{param} must be `all` or a non-empty list of tiers, got {wanted!r}")
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise PipelineError(f"{param} names unknown tiers {unknown}; known: {sorted(known)}")
    return [t for t in tiers if t.name in wanted]


def benchmarked(serving: ServingParams, wanted) -> list[Tier]:
    """serve_bench.tiers: the tiers serve_bench also measures at their own settings and concurrency, besides the
    default sweep (the serving section itself): `all`, a list of serving.tiers names, or [] for none."""
    if is_names(wanted) and not wanted:
        return []
    return select([t for t in parse_tiers(serving) if t.name != DEFAULT], wanted, "serve_bench.tiers")
