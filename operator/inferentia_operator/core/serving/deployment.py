"""The serving Deployment: its containers (the model server, the batching front end beside it,
the fetches before it), their environment, probes and drain."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.autoscaling import desired_replicas
from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, PLAN_MOUNT, TRAFFIC_LABEL, TRAFFIC_ON
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.affinity import NEURON_TOLERATION, serving_affinity
from inferentia_operator.core.pod.claims import CLAIM, claim_template_name
from inferentia_operator.core.pod.containers import (
    CONTAINER_SECURITY,
    SCRATCH_ENV,
    pod_security,
    user_env_from,
    with_user_env,
)
from inferentia_operator.core.pod.contribution import PodContribution, combined, given
from inferentia_operator.core.pod.dirs import COMPILED_DIR, HUB_CACHE_DIR
from inferentia_operator.core.pod.fetch import (
    node_cache,
)
from inferentia_operator.core.pod.meta import child_metadata, labels, selector, service_account
from inferentia_operator.core.pod.model import Model, mounted_plan, plan_hash, vllm_plugin
from inferentia_operator.core.pod.ports import EVERY_PROCESS, process_base_port, scraped_at
from inferentia_operator.core.pod.vllm import VLLM_ENV, VLLM_PRECOMPILED_ENV
from inferentia_operator.core.pod.volumes import scratch
from inferentia_operator.core.serving.artefact import compiled_artefact, uncompiled_model
from inferentia_operator.core.serving.drain import serving_pre_stop, termination_grace_seconds
from inferentia_operator.core.serving.front_end import batching
from inferentia_operator.core.serving.runtime import lone_process, multi_node_env, processes, serving_args
from inferentia_operator.core.sizing import keeps_hub_snapshot

# How often a starting server is asked whether it is up: often, so that a start (from zero,
# or a scale-up) is seen ready within seconds of the model loading. How long it may take is
# the plan's (sizing.startup_seconds).
STARTUP_PROBE_SECONDS = 2


def _serving_env(model: Model) -> dict[str, str]:
    env: dict[str, str] = {}
    if vllm_plugin(model):
        if model.spec.compile.image:
            # The plugin's local cache, as the compile Job filled it and the fetch init container copied it.
            env |= {"VLLM_CACHE_ROOT": COMPILED_DIR, **VLLM_PRECOMPILED_ENV}
    elif model.spec.serving.runtime == "vllm":
        env |= VLLM_ENV
        if model.plan.nodes:
            env |= multi_node_env(model)
        if model.spec.compile.image:
            # A local directory, as vLLM's Neuron loader reads it: the fetch init container filled it.
            env |= {"NEURON_COMPILED_ARTIFACTS": COMPILED_DIR, **VLLM_PRECOMPILED_ENV}
    if keeps_hub_snapshot(model.spec):
        # The model id resolves to the commit the compile read, from the artefact's copy; the
        # Hub is never asked ("HF_HUB_OFFLINE", huggingface_hub's environment variables).
        env |= {"HF_HUB_CACHE": HUB_CACHE_DIR, "HF_HUB_OFFLINE": "1"}
    return env


def _startup_probe(model: Model, check: dict[str, Any]) -> dict[str, Any]:
    """Asked every STARTUP_PROBE_SECONDS, for as long as the plan says a start may take (loading,
    a download, a compile at start): the liveness probe takes over only after it."""
    budget = model.plan.sizes.startup_seconds
    return {**check, "periodSeconds": STARTUP_PROBE_SECONDS, "failureThreshold": -(-budget // STARTUP_PROBE_SECONDS)}


def _probes(model: Model) -> dict[str, Any]:
    if model.spec.serving.runtime == "vllm":
        # vLLM's OpenAI-compatible server answers /health once the model is loaded.
        health: dict[str, Any] = {"httpGet": {"path": "/health", "port": "serve-0"}}
    elif model.spec.serves_with_program:
        # The operator's server answers /healthz once its artefacts are loaded onto the cores
        # (or, without a compile step, traced).
        health = {"httpGet": {"path": "/healthz", "port": "serve-0"}}
    else:
        # A custom server says nothing of its health: it is up once it accepts connections.
        health = {"tcpSocket": {"port": "serve-0"}}
    return {
        "startupProbe": _startup_probe(model, health),
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
    }


def _vllm_scrape_annotations(model: Model) -> dict[str, str]:
    """Where Prometheus finds the pod's request gauges: the batching front end's
    inferentia_num_requests_waiting and _running on its one port, or vLLM's
    vllm:num_requests_waiting and _running on every process's port (each vLLM process serves
    its own /metrics, and the ScaledObject's target is the whole replica's). The
    prometheus.io annotations, which Prometheus's example Kubernetes configuration relabels
    on, name one port, the first; the metrics-port annotation names them all (SCRAPED_PORTS)."""
    if model.spec.serving.runtime == "vllm" and model.plan.front_end is None:
        return scraped_at(process_base_port(model), EVERY_PROCESS)
    return {}


def _not_yet_composed(model: Model) -> PodContribution:
    plan = model.plan
    dra = plan.allocation == "dra"  # devices from a resource claim, not the device plugin
    args = serving_args(model)
    return PodContribution(
        env=_serving_env(model),
        annotations=_vllm_scrape_annotations(model),
        probes=_probes(model),
        # One process per NeuronCore Group, each started with its group's environment.
        command=("/bin/sh", f"{PLAN_MOUNT}/launch.sh") if args else (),
        args=tuple(args or ()),
        claims=({"name": CLAIM},) if dra else (),
        resource_claims=({"name": CLAIM, "resourceClaimTemplateName": claim_template_name(model)},) if dra else (),
        # On EKS the Neuron scheduler extension places multi-device requests only
        # through a second scheduler the pod names
        # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-multiple-scheduler.html);
        # a DRA claim needs no extension.
        scheduler_name=model.scheduler_name if not dra else "",
    )


def serving_pod(model: Model) -> PodContribution:
    """Each concern's share of a serving pod, combined in this order: each list of the pod (the
    serve container's environment and mounts, the volumes, the init containers, the containers
    beside it, the annotations) holds the concerns' items in it."""
    return combined(
        (
            mounted_plan(model),
            scratch(model, model.plan.sizes.home_bytes),
            processes(model),
            compiled_artefact(model),
            uncompiled_model(model),
            node_cache(model),
            lone_process(model),
            batching(model),
            _not_yet_composed(model),
        )
    )


def _serve_container(model: Model, pod: PodContribution) -> dict[str, Any]:
    """The model server's container: its processes' ports, the plan's resources, restricted."""
    plan, spec = model.plan, model.spec
    base = process_base_port(model)
    return {
        "name": "serve",
        "image": spec.serving.image,
        **user_env_from(model),
        # Scratch's variables first: every process writes under HOME and /tmp alone.
        "env": with_user_env(model, {**SCRATCH_ENV, **pod.env}),
        "ports": [{"name": f"serve-{i}", "containerPort": base + i, "protocol": "TCP"} for i in range(plan.groups)],
        "resources": {**plan.resources.model_dump(), **given("claims", list(pod.claims))},
        **pod.probes,
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": spec.serving.read_only_root_filesystem},
        # The launcher's last words ("serving process 41 exited with 137; stopping the others")
        # become the termination message, which the model's status quotes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "lifecycle": serving_pre_stop(model),
        "volumeMounts": list(pod.mounts),
        **({"command": list(pod.command), "args": list(pod.args)} if pod.command else {}),
    }


def serving_deployment(model: Model, replicas: int | None = None, grouped: bool = False) -> dict[str, Any]:
    """The serving Deployment, with ``replicas`` (default: what the spec alone gives, for
    a model that autoscales minReplicas, as before its ScaledObject exists); ``grouped``: its
    template is for a LeaderWorkerSet's groups (core/serving/groups.py)."""
    spec, pod = model.spec, serving_pod(model)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "replicas": desired_replicas(spec, scaled=False) if replicas is None else replicas,
            "selector": {"matchLabels": selector(model)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
            },
            "template": {
                "metadata": {
                    "labels": {**labels(model, "serving"), TRAFFIC_LABEL: TRAFFIC_ON},
                    "annotations": {PLAN_HASH_ANNOTATION: plan_hash(model.plan), **pod.annotations},
                },
                "spec": {
                    # A model server has no business with the Kubernetes API.
                    "automountServiceAccountToken": False,
                    **given("schedulerName", pod.scheduler_name),
                    "terminationGracePeriodSeconds": termination_grace_seconds(model),
                    **service_account(model),
                    "securityContext": pod_security(model),
                    **given("initContainers", list(pod.init_containers)),
                    "containers": [_serve_container(model, pod), *pod.containers],
                    "volumes": list(pod.volumes),
                    **given("resourceClaims", list(pod.resource_claims)),
                    **pod_placement(spec.placement, tolerations=(NEURON_TOLERATION,), affinity=serving_affinity(model, grouped)),
                },
            },
        },
    }
