"""Whether a node would take a pod, as the scheduler decides it from the pod's (projected)
placement: its taints tolerated, the cordon too, its node selector and required node affinity met.
The device-faults part asks it of a faulty node and of the others, the fill-ahead part of the
nodes a replica could land on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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


# What a cordon is to the scheduler: its NodeUnschedulable filter lets through a pod that tolerates this.
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def takes_pods(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the scheduler may place a pod with ``tolerations`` on ``node``: each of its
    NoSchedule and NoExecute taints tolerated, and the cordon too where it is cordoned."""
    taints = [*(node.get("taints") or ()), *([CORDON] if node.get("unschedulable") else [])]
    return all(any(tolerates(t, taint) for t in tolerations) for taint in taints)


def _meets(requirement: Mapping[str, Any], value: str | None) -> bool:
    """One node selector requirement (Kubernetes' NodeSelectorRequirement) of a label's value."""
    op, values = requirement.get("operator"), requirement.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def selects(spec: Mapping[str, Any], name: str, node: Mapping[str, Any]) -> bool:
    """Whether a pod of this (projected) spec may be placed on ``node``: its taints tolerated,
    its node selector and one of its required node affinity's terms met by the node's labels.
    A spec whose placement was too large to keep (``placementCut``) is placed nowhere."""
    labels = node.get("labels") or {}
    if spec.get("placementCut") or not takes_pods(node, spec.get("tolerations") or ()):
        return False
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = spec.get("nodeSelectorTerms") or ()
    return not terms or any(
        # An empty term matches no node (Kubernetes' NodeSelectorTerm).
        bool(term.get("matchExpressions") or term.get("matchFields"))
        and all(_meets(r, labels.get(r.get("key", ""))) for r in term.get("matchExpressions") or ())
        and all(_meets(r, name if r.get("key") == "metadata.name" else None) for r in term.get("matchFields") or ())
        for term in terms
    )
