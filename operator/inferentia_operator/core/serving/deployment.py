"""The serving Deployment: its pod composed from the contribution of each concern, in a fixed
order (serving_pod), the serve container and the Deployment around them."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.autoscaling import desired_replicas
from inferentia_operator.core.names import PLAN_HASH_ANNOTATION, TRAFFIC_LABEL, TRAFFIC_ON
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.affinity import NEURON_TOLERATION, serving_affinity
from inferentia_operator.core.pod.claims import devices
from inferentia_operator.core.pod.containers import CONTAINER_SECURITY, SCRATCH_ENV, pod_security, user_env_from, with_user_env
from inferentia_operator.core.pod.contribution import PodContribution, combined, field_if_nonempty
from inferentia_operator.core.pod.fetch import node_cache
from inferentia_operator.core.pod.meta import child_metadata, labels, selector, service_account
from inferentia_operator.core.pod.model import Model, mounted_plan
from inferentia_operator.core.pod.ports import process_base_port
from inferentia_operator.core.pod.volumes import scratch
from inferentia_operator.core.serving.artefact import compiled_artefact, hub_snapshot, uncompiled_model
from inferentia_operator.core.serving.drain import serving_pre_stop, termination_grace_seconds
from inferentia_operator.core.serving.front_end import batching
from inferentia_operator.core.serving.runtime import lone_process, processes, runtime


def serving_pod(model: Model) -> PodContribution:
    """Each concern's share of a serving pod, combined in this order: each list of the pod (the
    serve container's environment and mounts, the volumes, the init containers, the containers
    beside it, the annotations) holds the concerns' items in it. A concern that changes the pod
    adds its contribution here, where its items belong in those lists."""
    return combined(
        (
            mounted_plan(model),  # the plan ConfigMap (pod/model.py)
            scratch(model, model.plan.sizes.home_bytes),  # HOME and /tmp (pod/volumes.py)
            processes(model),  # what the launcher and every process read (serving/runtime.py)
            compiled_artefact(model),  # fetched first, with a compile step (serving/artefact.py)
            uncompiled_model(model),  # traced at start, or fetched where the server reads it (serving/artefact.py)
            node_cache(model),  # its token and views (pod/fetch.py)
            lone_process(model),  # one process: its group's environment (serving/runtime.py)
            batching(model),  # the bounds, and the front end beside the processes (serving/front_end.py)
            runtime(model),  # what each process runs, its variables and probes (serving/runtime.py)
            hub_snapshot(model),  # a Hub model's snapshot in the artefact (serving/artefact.py)
            devices(model),  # a DRA claim, or the device plugin's scheduler (pod/claims.py)
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
        "resources": {**plan.resources.model_dump(), **field_if_nonempty("claims", list(pod.claims))},
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
                    "annotations": {PLAN_HASH_ANNOTATION: model.plan_hash, **pod.annotations},
                },
                "spec": {
                    # A model server has no business with the Kubernetes API.
                    "automountServiceAccountToken": False,
                    **field_if_nonempty("schedulerName", pod.scheduler_name),
                    "terminationGracePeriodSeconds": termination_grace_seconds(model),
                    **service_account(model),
                    "securityContext": pod_security(model),
                    **field_if_nonempty("initContainers", list(pod.init_containers)),
                    "containers": [_serve_container(model, pod), *pod.containers],
                    "volumes": list(pod.volumes),
                    **field_if_nonempty("resourceClaims", list(pod.resource_claims)),
                    **pod_placement(spec.placement, tolerations=(NEURON_TOLERATION,), affinity=serving_affinity(model, grouped)),
                },
            },
        },
    }
