"""Device faults: a serving pod whose node's Neuron devices report a hardware error is named, and
moved where that is safe.

AWS's Neuron node problem detector sets the node condition NeuronHealth=True when the Neuron
driver logs a hardware error (projection.project_neuron_node). For each serving pod on such a
node the model's status says DeviceFault, and:

- a node that would still take the pod (not cordoned, every NoSchedule and NoExecute taint
  tolerated, its node selector and required node affinity met: the pod's own placement, as
  admission left it) is left alone: a replacement could be placed there again, so status asks
  for the node to be cordoned, or for AWS's node recovery to replace it;
- on a node that would not, the pod is evicted (the Eviction API, so the model's
  PodDisruptionBudget paces it) when another node is Ready, reports no fault and would take it
  (the plan's instance types are among its required affinity); its ReplicaSet or
  LeaderWorkerSet makes the replacement, which cannot land on the faulty node (free devices are
  the scheduler's to find: a replacement with none waits, and Scheduled says so);
- when no other node could take it, nothing is evicted, and status says so: a replica on a
  failing device may still answer, where an evicted one would answer nothing until a node
  comes.

Wherever it is left, and until an eviction the disruption budget holds back goes through, such a
pod is taken out of traffic (its names.TRAFFIC_LABEL turned "off": the Service, InferencePool and
holder no longer select it, its ReplicaSet still counts it) while another replica answers from a
node without a fault; it is put back once its node reports none, or once no other replica is
left to answer. A pod without the label (made before the label existed) gets it "on", so that an
upgrade of the operator does not leave a model's Service without endpoints until its rollout.

Nodes are the kubelet's and the detector's; the operator never writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.conditions import cond
from inferentia_operator.core.names import POOL_LABEL, TRAFFIC_LABEL, TRAFFIC_OFF, TRAFFIC_ON, WORKER_INDEX_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.nodes import selects
from inferentia_operator.core.pod.part import Part
from inferentia_operator.core.pod.pools import ROLES, pool_name

# Shown while a serving pod's node reports a Neuron hardware fault, absent otherwise (device_faults/part.py).
DEVICE_FAULT = "DeviceFault"
DEVICE_FAULT_REASON = "NeuronHardwareError"

# AWS's remedy: its node recovery marks the instance unhealthy so that its Auto Scaling group
# replaces it (the Neuron Helm chart's npd.nodeRecovery.enabled, off by default).
NODE_RECOVERY = "npd.nodeRecovery.enabled=true on AWS's Neuron Helm chart"
NAMED = 3  # pods a message names; the rest are counted
MAX_DECIDED = 64


@dataclass(frozen=True)
class DeviceFaultPart(Part):
    condition: api.Condition | None = None  # DeviceFault, while a serving pod's node reports a fault
    evict: tuple[tuple[str, str], ...] = ()  # (pod name, uid) to evict
    traffic: tuple[tuple[str, str, str], ...] = ()  # (pod name, uid, TRAFFIC_ON or _OFF) to label


def _closed(spec: Mapping[str, Any], name: str, node: Mapping[str, Any]) -> bool:
    """The faulty node takes no replacement of the pod. A node too large to have been read whole
    (``cut``) is taken as open: moving a pod off it could bring it straight back."""
    return not node.get("cut") and not selects(spec, name, node)


def _elsewhere(nodes: Mapping[str, Iterable[Mapping[str, Any]]], spec: Mapping[str, Any], faulted: str) -> bool:
    """Whether another node could take a replacement of the pod: Ready, with no fault, read whole,
    and open to the pod's own placement (its ReplicaSet's template, as admission completed it)."""
    return any(
        name != faulted and node.get("ready") and not node.get("fault") and not node.get("cut") and selects(spec, name, node)
        for name, projections in nodes.items()
        for node in projections
    )


def _node_of(nodes: Mapping[str, Iterable[Mapping[str, Any]]], pod: Obj) -> tuple[str, Mapping[str, Any] | None]:
    """The pod's node's name and projection (None: not placed, or not a Neuron node)."""
    name = str(pod.spec.get("nodeName") or "")
    return name, next(iter(nodes.get(name) or ()), None) if name else None


def _answers(pod: Obj) -> bool:
    """A group's workers answer nothing themselves (pod.meta.answering_selector)."""
    return pod.labels.get(WORKER_INDEX_LABEL, "0") == "0"


def _made_by_the_model(model: Model, pod: Obj) -> bool:
    """The pod's controller is one of the model's: a ReplicaSet of its Deployment (``<model>-<hash>``),
    of a prefill or decode pool's the pod's pool label names (``<model>-<pool>-<hash>``), or a
    StatefulSet of its LeaderWorkerSet (``<model>``, ``<model>-<group>``). Labels alone are anyone's
    to write; the operator labels only pods its children made."""
    owner = pod.controller or {}
    owner_name = str(owner.get("name") or "")
    if owner.get("kind") == "ReplicaSet":
        pool = pod.labels.get(POOL_LABEL)
        deployment = pool_name(model, pool) if pool in ROLES else model.name
        return owner_name.rpartition("-")[0] == deployment
    return owner.get("kind") == "StatefulSet" and (owner_name == model.name or owner_name.rpartition("-")[0] == model.name)


def traffic_changes(model: Model, observed: Observed) -> tuple[tuple[str, str, str], ...]:
    """The pods whose traffic label is not what it should be (module docstring), at most
    MAX_DECIDED a reconcile: "off" for a pod that answers requests on a node reporting a fault
    while another answers from a node reporting none; "on" for every other."""
    answering = [pod for pod in map(Obj, observed.serving_pods) if not pod.deleting and _answers(pod) and _made_by_the_model(model, pod)]
    faulted = {pod.uid for pod in answering if (_node_of(observed.nodes, pod)[1] or {}).get("fault")}
    # Per prefill or decode pool (one group without pools): a pool's requests go to its own pods
    # alone, so another pool answering never lets the last of a pool go.
    others_answer = {
        pod.labels.get(POOL_LABEL)
        for pod in answering
        if pod.uid not in faulted and pod.labels.get(TRAFFIC_LABEL) != TRAFFIC_OFF and pod.condition("Ready").get("status") == "True"
    }
    changes = []
    for pod in answering:
        wanted = TRAFFIC_OFF if pod.uid in faulted and pod.labels.get(POOL_LABEL) in others_answer else TRAFFIC_ON
        if pod.labels.get(TRAFFIC_LABEL) != wanted:
            changes.append((pod.name or "", pod.uid or "", wanted))
    return tuple(changes[:MAX_DECIDED])


def _traffic_said(pod: Obj, traffic: tuple[tuple[str, str, str], ...]) -> str:
    if not _answers(pod):
        return ""  # a group's worker: its leader answers
    wanted = next((value for name, uid, value in traffic if uid == pod.uid), pod.labels.get(TRAFFIC_LABEL))
    if wanted == TRAFFIC_OFF:
        return "out of traffic, "
    return "still receives requests (no other replica answers from a node without a fault), "


def device_fault_part(model: Model, observed: Observed) -> DeviceFaultPart:
    nodes = observed.nodes
    traffic = traffic_changes(model, observed)
    hit: list[tuple[Obj, str, Mapping[str, Any]]] = []
    for pod in map(Obj, observed.serving_pods):
        name, node = _node_of(nodes, pod)
        if node is not None and node.get("fault"):
            hit.append((pod, name, node))
    if not hit:
        return DeviceFaultPart(traffic=traffic)
    # Each pod decided costs a look at every node: a bounded number a reconcile (pods that
    # claim to be the model's are a user's to make), the rest at the next.
    decided, undecided = hit[:MAX_DECIDED], len(hit) - MAX_DECIDED
    types = model.serving_instance_types
    evict: list[tuple[str, str]] = []
    said: list[str] = []
    open_nodes: set[str] = set()
    stuck: set[str] = set()
    for pod, name, node in decided:
        fault = node["fault"]
        if pod.deleting:
            what = "being replaced"
        else:
            if not _closed(pod.spec, name, node):
                move = "left: the node still takes the model's pods"
                open_nodes.add(name)
            elif _elsewhere(nodes, pod.spec, name):
                # The eviction may wait for the model's disruption budget; the next reconcile asks again.
                move = "evicting: its replacement goes to another node, as the disruption budget allows"
                evict.append((pod.name or "", pod.uid or ""))
            else:
                move = "left: no other node can take it"
                stuck.add(name)
            what = _traffic_said(pod, traffic) + move
        said.append(f"pod {pod.name} on node {name}: {fault.get('reason')} ({fault.get('message')}); {what}")
    if undecided > 0:
        said.append(f"{undecided} more pods on such nodes are decided at the next reconcile")
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
    condition = cond(DEVICE_FAULT, "True", DEVICE_FAULT_REASON, message)
    return DeviceFaultPart(condition=condition, evict=tuple(evict), traffic=traffic)
