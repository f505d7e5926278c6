"""Device faults: a serving pod whose node's Neuron devices report a hardware error is named, and
moved where that is safe.

AWS's Neuron node problem detector sets the node condition NeuronHealth=True when the Neuron
driver logs a hardware error (projection.project_neuron_node). For each serving pod on such a
node the model's status says DeviceFault, and:

- a node that still takes the model's new pods (not cordoned, every NoSchedule and NoExecute
  taint tolerated by the serving pods) is left alone: a replacement could be placed there again,
  so status asks for the node to be cordoned, or for AWS's node recovery to replace it;
- on a node that takes none, the pod is evicted (the Eviction API, so the model's
  PodDisruptionBudget paces it) when another node of the plan's instance types is Ready, reports
  no fault and takes the model's pods; its ReplicaSet or LeaderWorkerSet makes the replacement,
  which cannot land on the faulty node;
- when no other node could take it, nothing is evicted, and status says so: a replica on a
  failing device may still answer, where an evicted one would answer nothing until a node
  comes.

Nodes are the kubelet's and the detector's; the operator never writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api, children, status
from inferentia_operator.core.children import Model
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.status import DEVICE_FAULT, Observed

from . import Part

REASON = "NeuronHardwareError"
# AWS's remedy: its node recovery marks the instance unhealthy so that its Auto Scaling group
# replaces it (the Neuron Helm chart's npd.nodeRecovery.enabled, off by default).
NODE_RECOVERY = "npd.nodeRecovery.enabled=true on AWS's Neuron Helm chart"
NAMED = 3  # pods a message names; the rest are counted


@dataclass(frozen=True)
class DeviceFaultPart(Part):
    condition: api.Condition | None = None  # DeviceFault, while a serving pod's node reports a fault
    evict: tuple[tuple[str, str], ...] = ()  # (pod name, uid) to evict


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ToleratesTaint: the effect (empty: any), the key (empty with Exists: any), and
    Exists, or Equal (the default) with the same value."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("key")) and str(toleration.get("value") or "") == str(taint.get("value") or "")


def takes_pods(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the scheduler may place a pod with ``tolerations`` on ``node``: not cordoned, and
    each of its NoSchedule and NoExecute taints tolerated."""
    return not node.get("unschedulable") and all(any(tolerates(t, taint) for t in tolerations) for taint in node.get("taints") or ())


def _others(
    nodes: Mapping[str, Iterable[Mapping[str, Any]]], types: Sequence[str], faulted: str, tolerations: Sequence[Mapping[str, Any]]
) -> int:
    """Other nodes that could take a replacement: of the plan's instance types (any Neuron one
    when the plan names none), Ready, with no fault, taking the model's pods."""
    found = 0
    for name, projections in nodes.items():
        for node in projections:
            if name != faulted and node.get("ready") and not node.get("fault") and (not types or node.get("instanceType") in types):
                found += takes_pods(node, tolerations)
    return found


def device_fault_part(model: Model, observed: Observed) -> DeviceFaultPart:
    nodes = observed.nodes
    hit: list[tuple[Obj, str, Mapping[str, Any]]] = []
    for body in observed.serving_pods:
        name = str(Obj(body).spec.get("nodeName") or "")
        node = next(iter(nodes.get(name) or ()), None) if name else None
        if node is not None and node.get("fault"):
            hit.append((Obj(body), name, node))
    if not hit:
        return DeviceFaultPart()
    tolerations = children.serving_tolerations(model)
    types = model.plan.instance_types
    evict: list[tuple[str, str]] = []
    said: list[str] = []
    open_nodes: set[str] = set()
    stuck: set[str] = set()
    for pod, name, node in hit:
        fault = node["fault"]
        if pod.deleting:
            what = "being replaced"
        elif takes_pods(node, tolerations):
            what = "left: the node still takes the model's pods"
            open_nodes.add(name)
        elif _others(nodes, types, name, tolerations):
            what = "evicted: its replacement goes to another node"
            evict.append((pod.name or "", pod.uid or ""))
        else:
            what = "left: no other node can take it"
            stuck.add(name)
        said.append(f"pod {pod.name} on node {name}: {fault.get('reason')} ({fault.get('message')}); {what}")
    n = len(hit)
    message = f"{n} serving pod{'s' if n > 1 else ''} on nodes whose Neuron devices report a hardware error: " + "; ".join(said[:NAMED])
    if n > NAMED:
        message += f"; and {n - NAMED} more"
    if open_nodes:
        listed = ", ".join(sorted(open_nodes)[:NAMED])
        message += f". Cordon {listed} (kubectl cordon) to have its pods moved, or set {NODE_RECOVERY} to have AWS replace it"
    if stuck:
        kinds = ", ".join(types) if types else "a Neuron instance type"
        message += f". No other node of {kinds} is Ready, free of faults and open to the model's pods"
    return DeviceFaultPart(condition=status.cond(DEVICE_FAULT, "True", REASON, message), evict=tuple(evict))
