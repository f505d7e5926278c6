"""What surrounds the serving pods: the plan ConfigMap they mount, the model's Service, the
PodDisruptionBudget over them and, behind a batching front end, the NetworkPolicy that opens its port alone."""

from __future__ import annotations

import math
from typing import Any

from inferentia_operator.core.autoscaling import desired_replicas
from inferentia_operator.core.pod.meta import answering_selector, child_metadata, holder_selector, selector
from inferentia_operator.core.pod.model import Model, plan_configmap_name
from inferentia_operator.core.pod.ports import batching_front_end, named_service, service_ports


def plan_configmap(model: Model) -> dict[str, Any]:
    """The plan, for the compile and serving pods: plan.json, one env file per process, the launcher.

    Content-addressed and immutable: pods of the previous plan keep reading their own
    while a new plan compiles and rolls out."""
    data = dict(model.plan_files)  # the body's own, which its caller may change
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(model, plan_configmap_name(model), "plan"),
        "immutable": True,
        "data": data,
    }


def disruption_budget(model: Model, replicas: int | None = None) -> dict[str, Any]:
    """The model's PodDisruptionBudget over its serving pods. Pods that are not ready may always
    be evicted (AlwaysAllow: https://kubernetes.io/docs/tasks/run-application/configure-pdb/#unhealthy-pod-eviction-policy),
    so a model that does not serve never blocks a node's drain.

    The budget counts pods. A replica that spans nodes is a group that LeaderWorkerSet makes
    again whole when one of its pods goes, and its other pods then count as unavailable until
    it is back: so a whole number of replicas is that many pods (each eviction takes its whole
    group), and a percentage is taken of the ``replicas`` groups (default: what the spec alone
    gives) and rounded up, as Kubernetes rounds a maxUnavailable percentage."""
    most = model.spec.disruption_budget.max_unavailable
    if model.plan.nodes and isinstance(most, str):
        groups = desired_replicas(model.spec, scaled=False) if replicas is None else replicas
        most = math.ceil(int(most.rstrip("%")) * groups / 100)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(model, model.name, "serving"),
        "spec": {
            "maxUnavailable": most,
            "selector": {"matchLabels": selector(model)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def serving_policy_name(model: Model) -> str:
    """Not the model's bare name, which a namespace's own NetworkPolicy may well have."""
    return model.name + "-front-end"


def serving_network_policy(model: Model) -> dict[str, Any] | None:
    """Behind a batching front end, its port alone admits other pods: a NetworkPolicy over the
    serving pods, so that no client skips the front end's limits for a model process's, where
    the cluster enforces NetworkPolicies. The node's own traffic (the kubelet's probes of the
    processes) is always allowed
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/); policies add
    up, so a namespace's own can admit more. None without a front end: the processes are the doors."""
    if not batching_front_end(model):
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(model, serving_policy_name(model), "serving"),
        "spec": {
            "podSelector": {"matchLabels": selector(model)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": p["port"], "protocol": "TCP"} for p in service_ports(model)]}],
        },
    }


def service(model: Model, to_holder: bool = False) -> dict[str, Any]:
    """The model's Service: its serving pods, or, while a model that scales to zero has no
    replica that answers, its holder (the same port names, so clients see no change)."""
    return named_service(model, model.name, holder_selector(model) if to_holder else answering_selector(model))
