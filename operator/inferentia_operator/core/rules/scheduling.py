"""Placement the API server would refuse in a pod, refused on the model instead: a pod template
it refuses leaves the model's Deployment or Job unwritten, or their pods uncreated. The rules
are the PodSpec's own (Kubernetes' ValidateTolerations and node selector validation,
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#scheduling), for
each placement a model has: its serving pods', its compile Job's and its holder's."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import FAMILY_NAMES, NEURON_RESOURCE, NEURONCORE_RESOURCE, Family
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.findings import Finding, format_list
from inferentia_operator.core.placement import NodeSelectorRequirement, NodeSelectorTerm, Placement

from .child_values import SUBDOMAIN_PATTERN, bound_findings, bound_rule, object_name_rule

# Each placement's schema node, and how to reach it from a parsed spec.
PLACEMENTS: dict[str, Callable[[InferentiaModelSpec], Placement | None]] = {
    "spec.placement": lambda s: s.placement,
    "spec.compile.placement": lambda s: s.compile.placement,
    "spec.autoscaling.holderPlacement": lambda s: s.autoscaling.holder_placement if s.autoscaling else None,
}

_EXISTS_WITH_VALUE = "(has(t.operator) && t.operator == 'Exists' && has(t.value) && t.value != '')"
_KEYLESS_EQUAL = "((!has(t.key) || t.key == '') && (!has(t.operator) || t.operator == 'Equal'))"
_SECONDS_NOT_NO_EXECUTE = "(has(t.tolerationSeconds) && (!has(t.effect) || t.effect != 'NoExecute'))"
_INTEGER = r"^-?[0-9]+$"
# A node selector requirement's values fit its operator (core/v1 NodeSelectorRequirement).
_REQUIREMENT_OK = (
    "(e.operator in ['In', 'NotIn'] ? has(e.values) && size(e.values) > 0"
    " : e.operator in ['Exists', 'DoesNotExist'] ? !has(e.values) || size(e.values) == 0"
    f" : has(e.values) && size(e.values) == 1 && e.values[0].matches({json.dumps(_INTEGER)}))"
)
_NODE = "self.affinity.nodeAffinity"
_HAS_NODE_AFFINITY = "has(self.affinity) && has(self.affinity.nodeAffinity)"
# Required terms and preferred ones are checked apart: the API server's CEL types each schema
# node on its own, and will not add a list of one to a list of the other.
_REQUIRED = f"{_NODE}.requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = f"{_NODE}.preferredDuringSchedulingIgnoredDuringExecution"
_BAD_TERM = f"has(term.matchExpressions) && term.matchExpressions.exists(e, !{_REQUIREMENT_OK})"
_BAD_PREFERENCE = f"has(p.preference.matchExpressions) && p.preference.matchExpressions.exists(e, !{_REQUIREMENT_OK})"
_BAD_REQUIRED = f"(has({_REQUIRED}) && {_REQUIRED}.nodeSelectorTerms.exists(term, {_BAD_TERM}))"
_BAD_PREFERRED = f"(has({_PREFERRED}) && {_PREFERRED}.exists(p, {_BAD_PREFERENCE}))"


def _rules(node: str) -> dict[str, CrossFieldRule]:
    return {
        "exists-value": CrossFieldRule(
            f"{node}.tolerations",
            node,
            "a toleration with operator Exists has value '%s'; valid values are none: Exists tolerates every value of its key",
            f"!has(self.tolerations) || !self.tolerations.exists(t, {_EXISTS_WITH_VALUE})",
            (f"self.tolerations.filter(t, {_EXISTS_WITH_VALUE})[0].value",),
        ),
        "keyless": CrossFieldRule(
            f"{node}.tolerations",
            node,
            "a toleration without a key has operator Equal; valid values are Exists, which tolerates every taint",
            f"!has(self.tolerations) || !self.tolerations.exists(t, {_KEYLESS_EQUAL})",
            (),
        ),
        "seconds": CrossFieldRule(
            f"{node}.tolerations",
            node,
            "a toleration with tolerationSeconds has effect '%s'; valid values are NoExecute",
            f"!has(self.tolerations) || !self.tolerations.exists(t, {_SECONDS_NOT_NO_EXECUTE})",
            (f"self.tolerations.filter(t, {_SECONDS_NOT_NO_EXECUTE}).map(t, has(t.effect) ? t.effect : '')[0]",),
        ),
        "requirement": CrossFieldRule(
            f"{node}.affinity.nodeAffinity",
            node,
            # No argument names the requirement: finding it again costs the API server's estimator
            # more than a message may (over 100 times its budget); the rule alone fits.
            "a node requirement has values that do not fit its operator; valid values are at least one for In and NotIn, "
            "none for Exists and DoesNotExist, and one whole number for Gt and Lt",
            f"!({_HAS_NODE_AFFINITY}) || !({_BAD_REQUIRED} || {_BAD_PREFERRED})",
            (),
        ),
        "priority": object_name_rule(f"{node}.priorityClassName", node, "priorityClassName", "PriorityClass"),
    }


RULES_BY_NODE = {node: _rules(node) for node in PLACEMENTS}
DISRUPTION_VALUE = bound_rule("maxUnavailable", "100", node="spec.disruptionBudget")


def _requirement_ok(e: NodeSelectorRequirement) -> bool:
    values = e.values or []
    if e.operator in ("In", "NotIn"):
        return bool(values)
    if e.operator in ("Exists", "DoesNotExist"):
        return not values
    return len(values) == 1 and bool(re.fullmatch(_INTEGER, values[0]))


def _terms(p: Placement) -> Iterator[NodeSelectorTerm]:
    node = p.affinity.node_affinity if p.affinity else None
    if node is None:
        return
    if node.required_during_scheduling_ignored_during_execution:
        yield from node.required_during_scheduling_ignored_during_execution.node_selector_terms
    yield from (t.preference for t in node.preferred_during_scheduling_ignored_during_execution or ())


def _check_placement(node: str, p: Placement) -> list[Finding]:
    rules, found = RULES_BY_NODE[node], []
    tolerations = p.tolerations or []
    if with_value := [t for t in tolerations if t.operator == "Exists" and t.value]:
        found.append(rules["exists-value"].finding(with_value[0].value))
    if any(not t.key and t.operator in (None, "Equal") for t in tolerations):
        found.append(rules["keyless"].finding())
    if timed := [t for t in tolerations if t.toleration_seconds is not None and t.effect != "NoExecute"]:
        found.append(rules["seconds"].finding(timed[0].effect or ""))
    bad = [e for term in _terms(p) for e in term.match_expressions or () if not _requirement_ok(e)]
    if bad:
        found.append(rules["requirement"].finding())
    if p.priority_class_name is not None and not re.fullmatch(SUBDOMAIN_PATTERN, p.priority_class_name):
        found.append(rules["priority"].finding(p.priority_class_name))
    return found


def _check_scheduling(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    found = []
    for node, of in PLACEMENTS.items():
        placement = of(spec)
        if placement is not None:
            found += _check_placement(node, placement)
    return found + bound_findings(DISRUPTION_VALUE, spec.disruption_budget.max_unavailable, "100")


RULES: list[CrossFieldRule] = [*(rule for rules in RULES_BY_NODE.values() for rule in rules.values()), DISRUPTION_VALUE]
CHECKS = (_check_scheduling,)


# AWS: "The scheduler extension is required for scheduling Pods that request more than one Neuron
# core or device resource. It finds sets of directly connected devices"
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/deploy/infrastructure/scheduler.html);
# on EKS it runs beside a second scheduler that pods name (k8s-multiple-scheduler.html).
def check_scheduler(spec: InferentiaModelSpec, scheduler_name: str | None) -> list[Finding]:
    """A warning where a pod takes more than one device or core from the device plugin and no
    scheduler is named for it (``scheduler_name``: the operator's; None where unknown, as for
    validate without --scheduler-name)."""
    c = spec.compute
    if c.allocation == "dra" or scheduler_name:
        return []
    count, resource = (c.cores, NEURONCORE_RESOURCE) if c.inf is None else (c.inf, NEURON_RESOURCE)
    if count is None or count <= 1:
        return []
    return [
        Finding(
            "spec.compute",
            f"each pod asks the Neuron device plugin for {count} {resource}, which needs AWS's Neuron scheduler extension "
            "to get devices that are connected; run it and name its scheduler in the chart's schedulerName (the operator's "
            "--scheduler-name; my-scheduler on EKS), or set allocation: dra",
            "warning",
        )
    ]


def check_family_named(raw_spec: object) -> list[Finding]:
    """A warning where spec.compute.family is left out: the model is then planned for inf1."""
    compute = raw_spec.get("compute") if isinstance(raw_spec, dict) else None
    if not isinstance(compute, dict) or "family" in compute:
        return []
    return [
        Finding(
            "spec.compute.family",
            f"not set, so the model is planned for inf1, the default; valid values are {format_list(list(FAMILY_NAMES))}: "
            "name the family of the nodes it is to run on",
            "warning",
        )
    ]
