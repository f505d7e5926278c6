"""The serving Deployment: its containers (the model server, the batching front end beside it,
the fetches before it), their environment, probes and drain."""

from __future__ import annotations

import json
import math
from typing import Any

from inferentia_operator.core.autoscaling import desired_replicas
from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, PLAN_MOUNT, TRAFFIC_LABEL, TRAFFIC_ON
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.affinity import NEURON_TOLERATION, serving_affinity
from inferentia_operator.core.pod.claims import CLAIM, claim_template_name
from inferentia_operator.core.pod.containers import (
    BATCHER_RESOURCES,
    CONTAINER_SECURITY,
    SCRATCH_ENV,
    own_server_probes,
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
from inferentia_operator.core.pod.ports import EVERY_PROCESS, batching_front_end, process_base_port, scraped_at
from inferentia_operator.core.pod.vllm import VLLM_ENV, VLLM_PRECOMPILED_ENV
from inferentia_operator.core.pod.volumes import scratch
from inferentia_operator.core.serving.artefact import compiled_artefact, uncompiled_model
from inferentia_operator.core.serving.runtime import lone_process, multi_node_env, processes, serving_args
from inferentia_operator.core.sizing import keeps_hub_snapshot

# How often a starting server is asked whether it is up: often, so that a start (from zero,
# or a scale-up) is seen ready within seconds of the model loading. How long it may take is
# the plan's (sizing.startup_seconds).
STARTUP_PROBE_SECONDS = 2


def _serving_env(model: Model) -> dict[str, str]:
    env: dict[str, str] = {}
    if model.spec.serving.batching:
        env["INFERENTIA_MAX_BATCH_SIZE"] = str(model.spec.serving.batching.max_batch_size)
        env["INFERENTIA_MAX_LATENCY_MS"] = str(model.spec.serving.batching.max_latency_ms)
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


# A pod being deleted is taken out of its Service's endpoints at the same time as its
# containers are told to stop; the endpoints controller and every node's kube-proxy take a
# moment to stop sending it new connections. A preStop sleep keeps each container serving
# for that moment (the Kubernetes docs' "Pod termination" flow; the sleep action is GA
# since Kubernetes 1.34), and only then does SIGTERM start the graceful stop.
DRAIN_SECONDS = 5
# The longest request a process may hold when no batching budget bounds it.
UNBOUNDED_REQUEST_SECONDS = 30


def longest_request_seconds(model: Model) -> int:
    """With the batching front end, a request is answered within maxLatencyMs or refused."""
    front = model.plan.front_end
    return math.ceil(front.max_latency_ms / 1000) + 1 if front else UNBOUNDED_REQUEST_SECONDS


def termination_grace_seconds(model: Model) -> int:
    """The drain, the longest request, and ten seconds for the processes to exit."""
    return DRAIN_SECONDS + longest_request_seconds(model) + 10


def _pre_stop_sleep(seconds: int) -> dict[str, Any]:
    return {"preStop": {"sleep": {"seconds": seconds}}}


def batcher_container(model: Model) -> dict[str, Any]:
    front, batching = model.plan.front_end, model.spec.serving.batching
    assert front is not None and batching is not None
    args = [
        "batch", "--port", str(front.port),
        "--processes", str(model.plan.groups), "--process-base-port", str(front.process_base_port),
        "--max-batch-size", str(front.max_batch_size), "--max-latency-ms", str(front.max_latency_ms),
    ]  # fmt: skip
    if model.plan.buckets:
        args += ["--buckets", json.dumps(model.plan.buckets)]
    return {
        "name": "batcher",
        "image": batching.image or model.operator_image,
        "args": args,
        "ports": [{"name": "batch", "containerPort": front.port, "protocol": "TCP"}],
        "resources": BATCHER_RESOURCES,
        # Ready only when every model process answers: the pod's readiness is the front end's.
        **own_server_probes("batch"),
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Serve through the drain; then SIGTERM: stop listening, answer what it holds, exit.
        "lifecycle": _pre_stop_sleep(DRAIN_SECONDS),
    }


def scrape_annotations(model: Model) -> dict[str, str]:
    """Where Prometheus finds the pod's request gauges: the batching front end's
    inferentia_num_requests_waiting and _running on its one port, or vLLM's
    vllm:num_requests_waiting and _running on every process's port (each vLLM process serves
    its own /metrics, and the ScaledObject's target is the whole replica's). The
    prometheus.io annotations, which Prometheus's example Kubernetes configuration relabels
    on, name one port, the first; the metrics-port annotation names them all (SCRAPED_PORTS)."""
    if model.plan.front_end is not None:  # batching_front_end(m)
        return scraped_at(model.plan.front_end.port, "batch")
    if model.spec.serving.runtime == "vllm":
        return scraped_at(process_base_port(model), EVERY_PROCESS)
    return {}


def _not_yet_composed(model: Model) -> PodContribution:
    plan = model.plan
    dra = plan.allocation == "dra"  # devices from a resource claim, not the device plugin
    args = serving_args(model)
    return PodContribution(
        env=_serving_env(model),
        containers=(batcher_container(model),) if batching_front_end(model) else (),
        annotations=scrape_annotations(model),
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
        # Behind the front end, the processes outlive its drain and the requests it holds;
        # alone, they drain as it would, then the launcher passes SIGTERM on to each.
        "lifecycle": _pre_stop_sleep(DRAIN_SECONDS + (longest_request_seconds(model) if batching_front_end(model) else 0)),
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
