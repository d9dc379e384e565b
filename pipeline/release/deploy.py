"""Kubernetes manifests for a bundle: a Deployment and a Service per serving tier, in deploy/<tier>.yaml.

The container runs the stock vLLM OpenAI server with `--config serve-<tier>.yaml` from the bundle's
directory on a read-only models volume: the file the bundle ships (and serve_bench measured for the
default tier) is the configuration, not a copy of it in container args. GPUs come from the tier's
tensor parallelism, /dev/shm is a memory-backed volume (vLLM's workers share tensors through it), the
startup probe's budget is the measured engine start times a margin, and readiness waits for the
warm-up (deploy/warmup.py, started by the postStart hook) as well as /health.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

import yaml

from pipeline.release.settings import DeployParams
from pipeline.serving.config import served_model_name
from pipeline.serving.settings import ServingParams
from pipeline.serving.tiers import Tier

WARM_MARKER = "/tmp/modelprep-warm"
GPUS_PER_REPLICA = "modelprep/gpus-per-replica"  # annotation: the GPUs one replica (pod) requests
WARMUP_ALLOWANCE_S = 600  # added to the startup budget for the rollout deadline
PROBE_PERIOD_S = 10


def object_name(serving_name: str, variant: str, tier: str, limit: int = 63) -> str:
    """A DNS-1035 label for the Deployment and Service: lowercase, starts with a letter, at most `limit`
    characters. Characters Kubernetes refuses are folded to '-', so a short hash of the exact
    (name, variant, tier) keeps two bundles or tiers from ever sharing an object name."""
    exact = f"{serving_name}\0{variant}\0{tier}"
    digest = hashlib.sha256(exact.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9-]+", "-", f"{serving_name}-{variant}-{tier}".lower()).strip("-")
    if not base[:1].isalpha():
        base = f"m-{base}"
    return f"{base[: limit - len(digest) - 1].rstrip('-')}-{digest}"


def startup_budget_s(measured_startup_s: float | None, deploy: DeployParams) -> int:
    """How long the startup probe lets the engine load: the measured start times the margin, else the default."""
    if measured_startup_s is None:
        return int(deploy.startup_seconds_default)
    return max(60, int(math.ceil(measured_startup_s * deploy.startup_margin)))


# The per-pod metric the autoscaler reads: vLLM's gauge of requests in the running batch, as a custom-metrics adapter
# (prometheus-adapter, with CUSTOM_METRICS_RULES) serves it: Kubernetes API metric names carry no ':'.
RUNNING = "vllm:num_requests_running"
RUNNING_METRIC = "vllm_num_requests_running"


@dataclass(frozen=True)
class PodSpec:
    """What one tier's server pod is made from. bundle_path: where the bundle lies in the container, under
    deploy.bundle_root (the models volume's mount); env: the server's environment (serving.config.server_env, as
    serve.env has it); startup_s: the startup probe's budget (startup_budget_s)."""

    tier: Tier
    serving: ServingParams
    variant: str
    deploy: DeployParams
    bundle_path: str
    startup_s: int
    env: dict[str, str]


def manifests(pod: PodSpec, annotations: dict[str, str], running_target: int | None = None) -> str:
    """deploy/<tier>.yaml: the Deployment and its Service, one YAML stream; with running_target (requests running
    per pod, from the measured capacity at the tier's SLO) a HorizontalPodAutoscaler too."""
    tier, serving, variant, deploy, startup_s = pod.tier, pod.serving, pod.variant, pod.deploy, pod.startup_s
    name = object_name(serving.name, variant, tier.name)
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "modelprep",
        "modelprep/variant": variant,
        "modelprep/tier": tier.name,
    }
    container = server_container(pod)
    deployment = deployment_of(name, labels, container, tier.gpus, deploy, startup_s, annotations)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": deploy.namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": deploy.port, "targetPort": "http"}],
        },
    }
    docs = [deployment, service]
    if running_target is not None:
        del deployment["spec"]["replicas"]  # the autoscaler owns it: `kubectl apply` must not reset it to 1
        docs.append(autoscaler(name, deploy, labels, running_target, tier.gpus))
    return yaml.safe_dump_all(docs, sort_keys=False)


def server_container(pod: PodSpec) -> dict:
    """The vLLM server's container: `vllm serve --config` of the tier's file, its probes, and the warm-up the
    postStart hook starts (readiness waits for its marker)."""
    tier, serving, variant, deploy = pod.tier, pod.serving, pod.variant, pod.deploy
    bundle_path, startup_s, env = pod.bundle_path, pod.startup_s, pod.env
    port = deploy.port
    env_vars = _env_vars(serving, env)
    return {
        "name": "vllm",
        "image": deploy.image,
        "workingDir": bundle_path,  # serve.yaml's paths (./model, ./draft) are relative to the bundle
        "command": ["vllm", "serve"],
        "args": ["--config", tier.serve_file, "--host", "0.0.0.0", "--port", str(port)],
        "env": env_vars + [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": port}],
        "resources": {
            "requests": {"cpu": deploy.cpu, "memory": deploy.memory, "nvidia.com/gpu": tier.gpus},
            "limits": {"memory": deploy.memory, "nvidia.com/gpu": tier.gpus},
        },
        **_probes(port, startup_s),
        "lifecycle": _warmup_hook(serving, variant, port),
        "volumeMounts": [
            {"name": "models", "mountPath": deploy.bundle_root, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }


def _env_vars(serving: ServingParams, env: dict[str, str]) -> list[dict]:
    env_vars = [{"name": k, "value": v} for k, v in sorted(env.items())]
    # serving.secret_env: values stay in the cluster's Secret, never in the bundle
    env_vars += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.split("/", 1)[0], "key": ref.split("/", 1)[1]}}}
        for k, ref in sorted(serving.secret_env.items())
    ]
    return env_vars


def _probes(port: int, startup_s: int) -> dict:
    """Startup and liveness on /health; readiness also waits for the warm-up's marker."""
    warm = [
        "python3",
        "-c",
        "import os, urllib.request; os.stat('%s'); "
        "urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=2)" % (WARM_MARKER, port),
    ]
    return {
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": math.ceil(startup_s / PROBE_PERIOD_S),
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": PROBE_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {"exec": {"command": warm}, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2},
    }


def _warmup_hook(serving: ServingParams, variant: str, port: int) -> dict:
    return {
        "postStart": {
            "exec": {
                "command": [
                    "/bin/sh",
                    "-c",
                    "nohup python3 deploy/warmup.py --prompts deploy/warmup_prompts.jsonl "
                    f"--model {served_model_name(serving, variant)} "
                    # its output goes to the container's own log (kubectl logs), not a file nobody reads
                    f"--port {port} --marker {WARM_MARKER} > /proc/1/fd/1 2>&1 &",
                ]
            }
        }
    }


def deployment_of(
    name: str,
    labels: dict,
    container: dict,
    gpus: int,
    deploy: DeployParams,
    startup_s: int,
    annotations: dict[str, str],
) -> dict:
    """The Deployment of one replica (gpus GPUs) running container, scraped by Prometheus."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": deploy.namespace,
            "labels": dict(labels),
            "annotations": {GPUS_PER_REPLICA: str(gpus)},
        },
        "spec": {
            "replicas": 1,
            # A rollout waits for the engine to load and warm up; the default 600 s deadline is often shorter.
            "progressDeadlineSeconds": startup_s + WARMUP_ALLOWANCE_S,
            # Replace pods in place: a surge pod would need a spare GPU the node usually does not have.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {
                    "labels": dict(labels),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(deploy.port),
                        "prometheus.io/path": "/metrics",
                        **annotations,
                    },
                },
                "spec": {
                    "containers": [container],
                    "terminationGracePeriodSeconds": 60,
                    "automountServiceAccountToken": False,  # the server never talks to the Kubernetes API
                    "volumes": [
                        {
                            "name": "models",
                            "persistentVolumeClaim": {"claimName": deploy.models_claim, "readOnly": True},
                        },
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": deploy.shm_size}},
                    ],
                },
            },
        },
    }


def autoscaler(name: str, deploy: DeployParams, labels: dict, running_target: int, gpus: int = 1) -> dict:
    """autoscaling/v2 HorizontalPodAutoscaler on the pods' mean running requests (a Pods metric). Not KEDA: a
    core API object needs no operator besides a custom-metrics adapter, and the same schemas validate it as the
    Deployment. Scaling in waits 5 minutes: a replica takes minutes to load and warm up, so one given back on a
    dip is dearly bought back. It counts replicas, each `gpus` GPUs (the tier's tensor parallelism): its annotations
    say so, and how many GPUs max_replicas takes, for whoever sizes the node pool."""
    cfg = deploy.autoscale
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": name,
            "namespace": deploy.namespace,
            "labels": dict(labels),
            "annotations": {GPUS_PER_REPLICA: str(gpus), "modelprep/max-gpus": str(cfg.max_replicas * gpus)},
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": cfg.min_replicas,
            "maxReplicas": cfg.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": RUNNING_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(running_target)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def custom_metrics_rules(served_name: str) -> str:
    """deploy/custom-metrics-rules.yaml: the prometheus-adapter rule serving RUNNING per pod as RUNNING_METRIC (its
    config's `rules:`); Prometheus must label the series with namespace and pod (a kubernetes_sd pod scrape does)."""
    rules = {
        "rules": [
            {
                "seriesQuery": f'{RUNNING}{{namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{RUNNING}$", "as": RUNNING_METRIC},
                "metricsQuery": f'sum(<<.Series>>{{<<.LabelMatchers>>,model_name="{served_name}"}}) by (<<.GroupBy>>)',
            }
        ]
    }
    return (
        "# prometheus-adapter rules (add to its config's `rules:`): the autoscalers in deploy/ read "
        f"{RUNNING_METRIC} per pod\n" + yaml.safe_dump(rules, sort_keys=False)
    )
