"""The release params, typed: `gates` (thresholds as written: thresholds.py knows each check), `deploy` (the
Kubernetes manifests), `monitoring` (the alerts' margins) and `publish` (the registry, signing)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pipeline.core.errors import PipelineError
from pipeline.params.declare import knob, parse_declared, section

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # Kubernetes object and namespace names


@section("gates")
@dataclass(frozen=True)
class GatesParams:
    """params.yaml `gates`: the release checks' bounds (pipeline/release/thresholds.py knows each check)."""

    thresholds: Mapping[str, float] = knob({}, help="check -> bound, for every variant (release/thresholds.py)")
    overrides: Mapping[str, Mapping[str, float]] = knob({}, help="variant -> its own bounds over thresholds")
    allow_fail: tuple[str, ...] = knob((), help="variants published despite failed gates, flagged in their card")

    @classmethod
    def parse(cls, section: dict) -> GatesParams:
        out = parse_declared(cls, section)
        for variant, bounds in out.overrides.items():
            if not isinstance(bounds, Mapping):
                raise PipelineError(f"gates.overrides.{variant} must be a mapping of thresholds, got {bounds!r}")
        return out

    def for_variant(self, variant: str) -> Mapping[str, float]:
        """gates.thresholds with the variant's overrides on top."""
        return {**self.thresholds, **self.overrides.get(variant, {})}


TierNames = Literal["all"] | tuple[str, ...]  # all, or serving.tiers names (tiers.select checks them)


@dataclass(frozen=True)
class Autoscale:
    """deploy.autoscale: tiers sized from the measured capacity get a HorizontalPodAutoscaler."""

    tiers: TierNames = knob(
        ("throughput",), required=True, help="tiers given an autoscaler (each one deploy.tiers renders)"
    )
    min_replicas: int = knob(1, required=True, help="the autoscaler's fewest pods", minimum=1)
    max_replicas: int = knob(4, required=True, help="the autoscaler's most pods", minimum=1)
    target_utilization: float = knob(
        0.8,
        required=True,
        help="mean running requests held at this fraction of the measured capacity",
        exclusive_minimum=0,
        exclusive_maximum=1,
    )

    def __post_init__(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise PipelineError(
                f"deploy.autoscale.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )


@section("deploy")
@dataclass(frozen=True)
class DeployParams:
    """params.yaml `deploy`: the Kubernetes manifests in every bundle (deploy/<tier>.yaml)."""

    image: str = knob("vllm/vllm-openai:v0.26.0", required=True, help="the serving container image")
    namespace: str = knob("default", required=True, help="Kubernetes namespace")
    models_claim: str = knob("models", required=True, help="PersistentVolumeClaim holding the bundles")
    bundle_root: str = knob("/models", required=True, help="where the bundles are mounted in the container")
    port: int = knob(8000, required=True, help="the server's port", minimum=1, maximum=65535)
    cpu: str = knob("8", required=True, help="CPU request (a Kubernetes quantity)", min_length=1)
    memory: str = knob("32Gi", required=True, help="memory request (a Kubernetes quantity)", min_length=1)
    shm_size: str = knob("8Gi", required=True, help="/dev/shm for vLLM's workers", min_length=1)
    startup_seconds_default: int = knob(
        900, required=True, help="startup probe budget without a measured start", minimum=1
    )
    startup_margin: float = knob(3.0, required=True, help="x the measured engine start otherwise", minimum=1)
    warmup_prompts: int = knob(
        8, required=True, help="prompts sent before the pod reports ready", minimum=1, maximum=10000
    )
    warmup_from_traffic: bool = knob(False, required=True, help="true: held-out traffic prompts; false: neutral")
    autoscale: Autoscale = knob(Autoscale(), required=True, help="tiers sized from the measured capacity")
    tiers: TierNames = knob("all", help="tiers rendered: all, or a list of tier names")

    def __post_init__(self) -> None:
        """What a type can't say of the values the manifests are rendered from: one line naming the key."""
        if not self.image.strip() or any(c.isspace() for c in self.image):
            raise PipelineError(
                f"deploy.image must name a container image (e.g. vllm/vllm-openai:v0.26.0), got {self.image!r}"
            )
        for key in ("namespace", "models_claim"):
            if not DNS_LABEL.match(getattr(self, key)):
                raise PipelineError(
                    f"deploy.{key} must be a Kubernetes name (lowercase letters, digits, '-'), "
                    f"got {getattr(self, key)!r}"
                )
        # Plain path characters only: the value lands in manifests, shell-free args and the model card's markdown
        root = self.bundle_root
        if not re.fullmatch(r"/[A-Za-z0-9._/-]*", root) or ".." in root.split("/"):
            raise PipelineError(
                f"deploy.bundle_root must be an absolute path in the container (letters, digits, "
                f"'.', '_', '-', '/'), got {root!r}"
            )


@section("monitoring")
@dataclass(frozen=True)
class MonitoringParams:
    """params.yaml `monitoring`: Prometheus rules and a Grafana dashboard in every bundle."""

    acceptance_warning_fraction: float = knob(
        0.8,
        required=True,
        help="warn below this fraction of the evaluated accepted/drafted ratio",
        exclusive_minimum=0,
        maximum=1,
    )
    latency_margin: float = knob(
        1.5, required=True, help="alert above the measured p99 TTFT/ITL times this", exclusive_minimum=1, maximum=100
    )
    kv_cache_usage_max: float = knob(
        0.9, required=True, help="alert above this KV cache usage", exclusive_minimum=0, maximum=1
    )


@dataclass(frozen=True)
class Mlflow:
    tracking_uri: str | None = knob(None, help="MLflow server; null: $MLFLOW_TRACKING_URI")
    experiment: str = knob("modelprep", help="runs holding the bundle artifacts")


@dataclass(frozen=True)
class Hf:
    namespace: str | None = knob(None, help="Hub user or org; null: the HF_TOKEN owner's")
    private: bool = knob(True, help="create the repo private")


@dataclass(frozen=True)
class Signing:
    private_key: str | None = knob(None, help="EC key (PEM) signing every bundle into model.sig", min_length=1)
    public_key: str | None = knob(None, help="publish and resolution refuse bundles it did not sign", min_length=1)


def parse_version(value: object, where: str) -> str:
    """A string, with the YAML pitfall named: an unquoted 1.10 is the number 1.1."""
    if not isinstance(value, str):
        raise PipelineError(
            f"{where} must be a string, got {value!r} ({type(value).__name__}); quote it in YAML "
            "(version: '1.10' — unquoted 1.10 is the number 1.1)"
        )
    return value


@section("publish")
@dataclass(frozen=True)
class PublishParams:
    """params.yaml `publish`: the registry, and signing."""

    backend: Literal["local", "mlflow", "hf"] = knob("local", required=True, help="where bundles are published")
    registry_dir: str = knob("registry", required=True, help="the local registry's directory", min_length=1)
    version: str = knob(
        "auto",
        required=True,
        help="auto: the bundle's content hash; or an explicit immutable version, quoted ('1.10')",
        parse=parse_version,
        schema={"description": "auto or a version string (quoted in YAML)"},
    )
    allow_rollback: bool = knob(False, help="publishing an older, already published version moves `latest` back")
    mlflow: Mlflow = knob(Mlflow(), help="the mlflow backend")
    hf: Hf = knob(Hf(), help="the hf backend")
    signing: Signing = knob(Signing(), help="OpenSSF model signing (pipeline/release/signing.py)")
