"""The release params, typed: `gates` (thresholds as written: thresholds.py knows each check), `deploy` (the
Kubernetes manifests), `monitoring` (the alerts' margins) and `publish` (the registry, signing)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pipeline.core.errors import PipelineError
from pipeline.core.sections import Section

BACKENDS = ("local", "mlflow", "hf")  # publish.backend


@dataclass(frozen=True)
class GatesParams:
    SECTION: ClassVar[str] = "gates"
    thresholds: Mapping[str, float]  # check -> bound, for every variant
    overrides: Mapping[str, Mapping[str, float]]  # variant -> its own bounds over thresholds
    allow_fail: tuple[str, ...] = ()  # variants published despite failed gates, flagged

    @classmethod
    def parse(cls, section: dict) -> GatesParams:
        s = Section(section, cls.SECTION)
        overrides = s.mapping("overrides")
        for variant, bounds in overrides.items():
            if not isinstance(bounds, Mapping):
                raise PipelineError(f"gates.overrides.{variant} must be a mapping of thresholds, got {bounds!r}")
        return cls(s.mapping("thresholds"), overrides, s.strs("allow_fail", []))

    def for_variant(self, variant: str) -> Mapping[str, float]:
        """gates.thresholds with the variant's overrides on top."""
        return {**self.thresholds, **self.overrides.get(variant, {})}


def tier_names(s: Section, name: str, default: object) -> str | tuple[str, ...]:
    """`all` or a list of tier names (tiers.select checks the names against serving.tiers)."""
    value = s.value(name, default)
    return value if value == "all" else s.strs(name, default)


@dataclass(frozen=True)
class Autoscale:
    """deploy.autoscale: tiers sized from the measured capacity get a HorizontalPodAutoscaler."""
    tiers: str | tuple[str, ...]
    min_replicas: int
    max_replicas: int
    target_utilization: float


@dataclass(frozen=True)
class DeployParams:
    SECTION: ClassVar[str] = "deploy"
    image: str
    namespace: str
    models_claim: str
    bundle_root: str
    port: int
    cpu: str
    memory: str
    shm_size: str
    startup_seconds_default: int
    startup_margin: float
    warmup_prompts: int
    warmup_from_traffic: bool
    autoscale: Autoscale
    tiers: str | tuple[str, ...] = "all"

    @classmethod
    def parse(cls, section: dict) -> DeployParams:
        s = Section(section, cls.SECTION)
        a = s.section("autoscale")
        return cls(
            image=s.str("image"), namespace=s.str("namespace"), models_claim=s.str("models_claim"),
            bundle_root=s.str("bundle_root"), port=s.int("port", minimum=1), cpu=s.str("cpu"), memory=s.str("memory"),
            shm_size=s.str("shm_size"), startup_seconds_default=s.int("startup_seconds_default", minimum=1),
            startup_margin=s.number("startup_margin"), warmup_prompts=s.int("warmup_prompts", minimum=0),
            warmup_from_traffic=s.bool("warmup_from_traffic"),
            autoscale=Autoscale(tier_names(a, "tiers", []), a.int("min_replicas", minimum=1),
                                a.int("max_replicas", minimum=1), a.number("target_utilization")),
            tiers=tier_names(s, "tiers", "all"))


@dataclass(frozen=True)
class MonitoringParams:
    SECTION: ClassVar[str] = "monitoring"
    acceptance_warning_fraction: float
    latency_margin: float
    kv_cache_usage_max: float

    @classmethod
    def parse(cls, section: dict) -> MonitoringParams:
        s = Section(section, cls.SECTION)
        return cls(s.number("acceptance_warning_fraction"), s.number("latency_margin"), s.number("kv_cache_usage_max"))


@dataclass(frozen=True)
class Mlflow:
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI
    experiment: str = "modelprep"


@dataclass(frozen=True)
class Hf:
    namespace: str | None = None  # None: the HF_TOKEN owner's
    private: bool = True


@dataclass(frozen=True)
class Signing:
    private_key: str | None = None  # signs every bundle into model.sig
    public_key: str | None = None  # publish and resolution refuse bundles it did not sign


@dataclass(frozen=True)
class PublishParams:
    SECTION: ClassVar[str] = "publish"
    backend: str
    registry_dir: str
    version: str  # auto: the bundle's content hash; else an explicit, immutable version
    allow_rollback: bool = False  # publishing an older, already published version moves `latest` back to it
    mlflow: Mlflow = Mlflow()
    hf: Hf = Hf()
    signing: Signing = Signing()

    @classmethod
    def parse(cls, section: dict) -> PublishParams:
        s = Section(section, cls.SECTION)
        m, h, g = s.section("mlflow"), s.section("hf"), s.section("signing")
        return cls(
            backend=s.choice("backend", BACKENDS), registry_dir=s.str("registry_dir"), version=s.str("version"),
            allow_rollback=s.bool("allow_rollback", False),
            mlflow=Mlflow(m.str_or_none("tracking_uri"), m.str("experiment", "modelprep")),
            hf=Hf(h.str_or_none("namespace"), h.bool("private", True)),
            signing=Signing(g.str_or_none("private_key"), g.str_or_none("public_key")))
