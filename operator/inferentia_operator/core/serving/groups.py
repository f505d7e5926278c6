"""A replica that spans nodes (spec.compute.nodes above 1) as a LeaderWorkerSet group: pure, no
API client.

LeaderWorkerSet (kubernetes-sigs/lws, ``leaderworkerset.x-k8s.io/v1``) creates, places,
restarts and scales a leader pod and ``size - 1`` workers as one; its pod webhook gives each
pod LWS_WORKER_INDEX (0 on the leader), LWS_LEADER_ADDRESS and LWS_GROUP_SIZE
(api/leaderworkerset/v1/leaderworkerset_types.go), from which each rank finds its place
(serving.runtime.multi_node_command). Its scale subresource and ``status.readyReplicas`` count groups,
so the model's replicas stay one number whatever a replica's size.

The pods are the serving Deployment's pods, one a node: the leader's serves and is probed; a
worker's runs the same container without the API's ports and probes, since it answers nothing
until the leader's engine drives it. ``restartPolicy: RecreateGroupOnPodRestart``: the ranks of
one model start together, so a worker lost takes its whole group with it, leader included.
"""

from __future__ import annotations

import copy
from typing import Any

from inferentia_operator.core.names import GROUP_API_VERSION, GROUP_KIND, PLAN_HASH_ANNOTATION
from inferentia_operator.core.pod.meta import child_metadata
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.serving.deployment import serving_deployment

# What a worker's serving container does not have: it answers nothing itself.
_LEADER_ONLY = ("ports", "readinessProbe", "livenessProbe", "startupProbe")


def serving_group(model: Model, replicas: int | None = None) -> dict[str, Any]:
    """The LeaderWorkerSet in place of the serving Deployment: ``replicas`` groups of
    ``plan.nodes`` pods (default: what the spec alone gives, as for the Deployment)."""
    assert model.plan.nodes is not None
    deployment = serving_deployment(model, replicas, grouped=True)
    leader = deployment["spec"]["template"]
    worker = copy.deepcopy(leader)
    serve = worker["spec"]["containers"][0]
    for field in _LEADER_ONLY:
        serve.pop(field, None)
    # Nor does it serve /metrics: Prometheus scrapes leaders only.
    worker["metadata"]["annotations"] = {PLAN_HASH_ANNOTATION: leader["metadata"]["annotations"][PLAN_HASH_ANNOTATION]}
    return {
        "apiVersion": GROUP_API_VERSION,
        "kind": GROUP_KIND,
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "replicas": deployment["spec"]["replicas"],
            "leaderWorkerTemplate": {
                "size": model.plan.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
            # A headless Service for each group, named after its leader (<model>-<group>): the
            # shared one would take the set's name, which the model's Service has, and LWS then
            # makes none, so LWS_LEADER_ADDRESS would resolve nowhere.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": model.spec.rollout.max_surge,
                    "maxUnavailable": model.spec.rollout.max_unavailable,
                },
            },
        },
    }
