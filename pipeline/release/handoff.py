"""The handoff kit a bundle carries besides its model: serving tiers (serve-<tier>.yaml), Kubernetes
manifests and the warm-up (deploy/), Prometheus rules, their unit test and a Grafana dashboard
(monitoring/). Everything is rendered from the same values the bundle ships and was gated on."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.io import atomic_write_text
from pipeline.core.names import registry_name
from pipeline.drafts.methods import Speculation
from pipeline.drafts.settings import DraftParams
from pipeline.quantize.recipes import VariantSpec
from pipeline.release import deploy, latency, monitoring
from pipeline.release.decision import Decision, TierChoice, TierSizing, size_tier
from pipeline.release.gates import VariantVerdict
from pipeline.release.settings import DeployParams, MonitoringParams
from pipeline.release.shipped_config import config_of
from pipeline.serving import warmup
from pipeline.serving.bench_record import ServeBenchRecord
from pipeline.serving.config import engine_args, serve_yaml, served_model_name, speculative_config_for
from pipeline.serving.settings import ServingParams, Slo
from pipeline.serving.tiers import DEFAULT, Tier, select

RULES, RULES_TEST, DASHBOARD = "monitoring/rules.yaml", "monitoring/rules.test.yaml", "monitoring/dashboard.json"
METRICS_RULES = "deploy/custom-metrics-rules.yaml"


# Prompts the warm-up sends unless deploy.warmup_from_traffic: neutral text, so that no user traffic is copied
# into bundles that get published (registries, the Hub). They exercise the same engine paths (prefill, decode,
# the draft); held-out traffic would only match the domain's lengths more closely.
GENERIC_PROMPTS = [
    "Summarize the main steps to reset a password.",
    "Explain what a service level objective is in two sentences.",
    "List three ways to reduce the latency of a web request.",
    "Write a short, polite reply confirming that an issue was fixed.",
    "What information should a good bug report contain?",
    "Describe how to roll back a software deployment.",
    "Give a one-paragraph overview of how caching works.",
    "How do I check which version of an application is installed?",
]


def bundle_location(deploy_cfg: DeployParams, serving_name: str, variant: str) -> str:
    return f"{deploy_cfg.bundle_root.rstrip('/')}/{registry_name(serving_name, variant)}"


@dataclass
class TierPlan:
    """What one tier ships: its speculation and why, and the files that describe it."""

    name: str
    num_speculative_tokens: int
    why: str
    method: str | None  # the speculative method at this tier (None: none)
    concurrency: int
    gpus: int
    serve_file: str
    manifest: str | None  # deploy/<tier>.yaml, when deploy.tiers includes it
    served_tokens_per_s: float | None = None  # the shipped config at the tier's concurrency, where it was served
    schedule: tuple[tuple[int, int, int], ...] | None = None  # a k per batch-size range, where one ships
    sizing: TierSizing | None = None  # deploy.autoscale.tiers: sized from the capacity, or why not

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.method, self.num_speculative_tokens, self.schedule)


def alert_levels(
    served_name: str,
    verdict: VariantVerdict,
    cost_ratio: float,
    serve: ServeBenchRecord,
    target_concurrency: int,
    cfg: MonitoringParams,
    slo: Slo | None = None,
) -> monitoring.AlertLevels:
    """The alerts' thresholds; slo: serving.slo, which the latency alerts' descriptions set beside their own."""
    shipped = verdict.speculation.speculation if verdict.speculation else Speculation(None, 0)
    k = shipped.k
    acceptance = verdict.applied("min_accepted_per_draft_token")
    config = config_of(serve, shipped) if not serve.skipped else None
    level = config.at(target_concurrency) if config else None
    margin = cfg.latency_margin
    if level is not None:
        ttft, itl = level.ttft_ms["p99"] * margin / 1000, level.itl_ms["p99"] * margin / 1000
        source = f"serve_bench p99 at concurrency {target_concurrency} on {serve.gpu} ({serve.date}) x{margin}"
    else:  # the thresholds this variant's latency gates were checked against (recorded in its verdict)
        gate = {c.check: c.threshold / 1000 for c in verdict.checks if c.check in ("max_p99_ttft_ms", "max_p99_itl_ms")}
        ttft, itl = gate.get("max_p99_ttft_ms"), gate.get("max_p99_itl_ms")
        source = "the latency gates' thresholds (no serving benchmark in this build)"
    return monitoring.AlertLevels(
        served_name=served_name,
        acceptance=acceptance.value if k and acceptance else None,
        acceptance_source=acceptance.metric if acceptance else "",
        cost_ratio=cost_ratio if k and cost_ratio else None,  # n-gram lookups cost no GPU weights
        ttft_p99_s=ttft or None,
        itl_p99_s=itl or None,
        latency_source=source,
        kv_cache_usage_max=cfg.kv_cache_usage_max,
        warning_fraction=cfg.acceptance_warning_fraction,
        slo_ms={"ttft": slo.p99_ttft_ms, "itl": slo.p99_itl_ms} if slo is not None else {},
        gate_ms=latency.gate_ms(verdict.checks),
    )


@dataclass(frozen=True)
class HandoffInputs:
    """What the handoff kit is rendered from: the variant's recipe and settings, its verdict and the decision that
    ships (pipeline/release/decision.py shipped: speculation, kernel, each tier's setting), the draft's cost ratio
    (its estimate's break-even), the serving benchmark's record, the checkpoint's quantization, the warm-up's
    rendered prompts and env, the server's environment (serving.config.server_env, as serve.env has it), the same
    for every tier's manifest."""

    variant: str
    spec: VariantSpec
    serving: ServingParams
    draft: DraftParams
    deploy: DeployParams
    monitoring: MonitoringParams
    verdict: VariantVerdict
    decision: Decision
    cost_ratio: float
    serve: ServeBenchRecord
    quantization: str | None
    warmup_prompts: list[tuple[str, bool]]
    env: dict[str, str]


def write_handoff(out: Path, kit: HandoffInputs) -> tuple[list[TierPlan], monitoring.AlertLevels]:
    """Write serve-<tier>.yaml, deploy/ and monitoring/ into the bundle directory `out`."""
    serving, deploy_cfg, serve, variant = kit.serving, kit.deploy, kit.serve, kit.variant
    tiers = [choice.tier for choice in kit.decision.tiers]
    deployed = {t.name for t in select(tiers, deploy_cfg.tiers)}
    scaling = deploy_cfg.autoscale
    autoscaled = {t.name for t in select(tiers, scaling.tiers, "deploy.autoscale.tiers")} if scaling.tiers else set()
    startup = [c.startup_s for c in serve.configs.values()] if not serve.skipped else []
    startup_s = deploy.startup_budget_s(max(startup) if startup else None, deploy_cfg)
    (out / "deploy").mkdir(exist_ok=True)
    plans = [
        tier_plan(out, kit, choice, choice.tier.name in deployed, choice.tier.name in autoscaled, startup_s)
        for choice in kit.decision.tiers
    ]
    served_name = served_model_name(serving, variant)
    if any(p.sizing and p.sizing.running_target for p in plans):
        atomic_write_text(out / METRICS_RULES, deploy.custom_metrics_rules(served_name))
    shutil.copyfile(warmup.__file__, out / "deploy" / "warmup.py")
    atomic_write_text(
        out / "deploy" / "warmup_prompts.jsonl",
        "".join(
            json.dumps({"prompt": text, "add_special_tokens": special}) + "\n"
            for text, special in kit.warmup_prompts[: deploy_cfg.warmup_prompts]
        ),
    )

    levels = alert_levels(
        served_name, kit.verdict, kit.cost_ratio, serve, serving.target_concurrency, kit.monitoring, serving.slo
    )
    (out / "monitoring").mkdir(exist_ok=True)
    atomic_write_text(out / RULES, monitoring.rules_yaml(levels, f"modelprep.{serving.name}-{variant}"))
    atomic_write_text(out / RULES_TEST, monitoring.rules_unit_test(levels, Path(RULES).name))
    atomic_write_text(
        out / DASHBOARD,
        monitoring.dashboard_json(
            levels, f"{serving.name} {variant}", deploy.object_name(serving.name, variant, "dash", 40)
        ),
    )
    return plans, levels


def tier_plan(
    out: Path, kit: HandoffInputs, choice: TierChoice, deployed: bool, autoscaled: bool, startup_s: int
) -> TierPlan:
    """One tier's files (serve-<tier>.yaml, deploy/<tier>.yaml where deploy.tiers has it) at the speculation the
    decision gave it, sized from the measured capacity where deploy.autoscale.tiers has it."""
    tier, chosen, serving, serve = choice.tier, choice.speculation, kit.serving, kit.serve
    sizing = _sizing(kit, choice) if autoscaled else None
    engine = {**tier.engine, **({"max_num_seqs": sizing.max_num_seqs} if sizing and sizing.max_num_seqs else {})}
    if tier.name != DEFAULT:  # the default tier's file is serve.yaml, written with the bundle
        atomic_write_text(
            out / tier.serve_file,
            serve_yaml(
                engine_args(
                    kit.spec, serving, speculative_config_for(chosen, kit.draft, serving), kit.quantization, engine
                )
            ),
        )
    manifest = _write_manifest(out, kit, tier, startup_s, sizing) if deployed else None
    # The default tier is the serving section itself: the default sweep measured it at its own settings.
    own = (None if serve.skipped else serve) if tier.name == DEFAULT else serve.tier(tier.name)
    config = config_of(own, chosen) if own is not None else None
    level = config.at(tier.concurrency) if config is not None else None
    return TierPlan(
        tier.name,
        chosen.k,
        choice.why,
        chosen.method,
        tier.concurrency,
        tier.gpus,
        tier.serve_file,
        manifest,
        level.output_throughput if level is not None else None,
        chosen.schedule,
        sizing,
    )


def _sizing(kit: HandoffInputs, choice: TierChoice) -> TierSizing:
    tier, serve = choice.tier, kit.serve
    return size_tier(
        tier,
        choice.speculation,
        serve,
        kit.serving,
        kit.deploy.autoscale.target_utilization,
        resizable=tier.name != DEFAULT and tier.name not in serve.tiers,
        own=serve.tier(tier.name) if tier.name != DEFAULT else None,
    )


def _write_manifest(out: Path, kit: HandoffInputs, tier: Tier, startup_s: int, sizing: TierSizing | None) -> str:
    """deploy/<tier>.yaml, its pods annotated with the serve file's sha256; its path in the bundle."""
    manifest = f"deploy/{tier.name}.yaml"
    sha = hashlib.sha256((out / tier.serve_file).read_bytes()).hexdigest()
    atomic_write_text(
        out / manifest,
        deploy.manifests(
            deploy.PodSpec(
                tier,
                kit.serving,
                kit.variant,
                kit.deploy,
                bundle_location(kit.deploy, kit.serving.name, kit.variant),
                startup_s,
                kit.env,
            ),
            {"modelprep/serve-config-sha256": sha},
            sizing.running_target if sizing else None,
        ),
    )
    return manifest
