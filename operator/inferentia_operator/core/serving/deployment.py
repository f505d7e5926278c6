"""The serving Deployment: its containers (the model server, the batching front end beside it,
the fetches before it), their environment, probes and drain."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.autoscaling import desired_replicas
from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, TRAFFIC_LABEL, TRAFFIC_ON
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
from inferentia_operator.core.pod.fetch import (
    node_cache,
)
from inferentia_operator.core.pod.meta import child_metadata, labels, selector, service_account
from inferentia_operator.core.pod.model import Model, mounted_plan, plan_hash
from inferentia_operator.core.pod.ports import process_base_port
from inferentia_operator.core.pod.volumes import scratch
from inferentia_operator.core.serving.artefact import compiled_artefact, hub_snapshot, uncompiled_model
from inferentia_operator.core.serving.drain import serving_pre_stop, termination_grace_seconds
from inferentia_operator.core.serving.front_end import batching
from inferentia_operator.core.serving.runtime import lone_process, processes, runtime


def _not_yet_composed(model: Model) -> PodContribution:
    plan = model.plan
    dra = plan.allocation == "dra"  # devices from a resource claim, not the device plugin
    return PodContribution(
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
            runtime(model),
            hub_snapshot(model),
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
