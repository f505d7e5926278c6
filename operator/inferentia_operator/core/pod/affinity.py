"""Where serving pods go: the planned instance types, the nodes that hold the artefact, one
replica a node, a group within its topology domain, and the Neuron taint tolerated."""

from __future__ import annotations

from typing import Any

from inferentia_operator.core.catalogue import INSTANCE_TYPE_LABEL, NEURON_TAINT_KEY
from inferentia_operator.core.holds import hold_label
from inferentia_operator.core.names import GROUP_KEY_LABEL, GROUP_SET_LABEL
from inferentia_operator.core.pod.artefact import fetched_uris
from inferentia_operator.core.pod.meta import selector
from inferentia_operator.core.pod.model import Model


def _instance_type_affinity(model: Model) -> dict[str, Any]:
    """Nodes of the planned instance types. With dra, the claim's selector on the devices'
    instanceType says it instead, as AWS's templates do."""
    term = {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": model.plan.instance_types}]}
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}


# Below the spread of a model's replicas over nodes (weight 100): a replica goes first where no
# other of its model runs, then, among those, where the artefact is already on the node.
ARTEFACT_AFFINITY_WEIGHT = 50


def _artefact_affinity(model: Model) -> dict[str, Any]:
    """With the node cache, a preference (never a requirement) for nodes whose cache pod is
    labelled as holding what this model's pods fetch (core/holds.py): there the fetch reads
    the node's disk, not the store. Nothing else changes in the template as caches fill and
    empty, so nothing rolls."""
    uris = fetched_uris(model)
    if not (model.node_cache_url and model.node_cache_namespace and uris):
        return {}
    # Split between what it fetches (artefact and weights), so that a node holding all of it
    # weighs what one holding the only one did, and one holding a part weighs less.
    weight = max(1, ARTEFACT_AFFINITY_WEIGHT // len(uris))
    terms = [
        {
            "weight": weight,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "namespaces": [model.node_cache_namespace],
                "labelSelector": {"matchExpressions": [{"key": hold_label(uri), "operator": "Exists"}]},
            },
        }
        for uri in uris
    ]
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}


def together(name: str, topology_key: str) -> dict[str, Any]:
    """Every pod of a group on nodes that share the value of ``topology_key``: a required pod
    affinity to the pods of its own group, which matchLabelKeys picks by the placed pod's own
    group-key label (Kubernetes 1.33 and later; the group's first pod matches its own term, so
    it may go anywhere: https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#matchlabelkeys).
    Not LWS's exclusive-topology annotation, which would also keep every other group out of
    the domain: a network node's instances may hold several groups."""
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {GROUP_SET_LABEL: name}},
                "matchLabelKeys": [GROUP_KEY_LABEL],
                "topologyKey": topology_key,
            }
        ]
    }


# Neuron nodes carry this taint (AWS's EKS node groups and Karpenter NodePools for Neuron);
# serving pods tolerate it, whatever else the model's placement says.
NEURON_TOLERATION = {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def serving_affinity(model: Model, grouped: bool = False) -> dict[str, Any]:
    """The operator's own affinity for serving pods: nodes of the planned instance types (with
    dra, the claim says it), nodes that hold the artefact, and, for a Deployment's replicas,
    a node each. ``grouped``: the pods of a LeaderWorkerSet's groups, which take a node each
    by their chips, and keep a group within its topology domain (core/serving/groups.py)."""
    affinity: dict[str, Any] = {
        **({} if model.plan.allocation == "dra" else {"nodeAffinity": _instance_type_affinity(model)}),
        **_artefact_affinity(model),
    }
    if grouped:
        if model.spec.compute.topology_key:
            # Groups are placed whole, one pod a node: each pod takes every chip of its node, so
            # the Deployment's preference to spread replicas over nodes has nothing left to choose.
            affinity["podAffinity"] = {**affinity.get("podAffinity", {}), **together(model.name, model.spec.compute.topology_key)}
        return affinity
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector(model)}}
    affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    return affinity
