"""Placement, as Kubernetes spells it: the pod fields that say where a pod may run
(nodeSelector, tolerations, affinity, topologySpreadConstraints, priorityClassName), typed
after the core/v1 PodSpec, and how a model's own placement combines with what Neuron needs.

The serving pods take ``spec.placement``, the compile Job ``spec.compile.placement`` (it needs
no Neuron device, so a CPU node group can compile) and the scale-to-zero holder
``spec.autoscaling.holderPlacement``. Field names and meanings are the PodSpec's
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/), as KServe's
predictor and the NIM Operator's NIMService take them. :func:`pod_placement` says how they
combine with the operator's own: every constraint of both holds.

Lists are bounded so that the CRD's CEL rules over them stay within the API server's cost budget.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt

from .apimodel import ApiModel

MAX_ITEMS = 16
MAX_VALUES = 64
# A qualified name: a DNS subdomain prefix (253), a slash and a name (63).
Key = Annotated[str, Field(min_length=1, max_length=317)]
Value = Annotated[str, Field(max_length=63)]
Names = Annotated[list[Key] | None, Field(max_length=MAX_ITEMS)]


class Toleration(ApiModel):
    """A toleration of a node taint (core/v1 Toleration)."""

    key: Annotated[str | None, Field(max_length=317)] = None
    """The taint key the toleration applies to; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists (any value) or Equal (the value given). Default: Equal."""
    value: Value | None = None
    """The taint value to match, with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect to match; empty matches every effect."""
    toleration_seconds: Annotated[StrictInt | None, Field(ge=0)] = None
    """With effect NoExecute: how long the pod stays bound after the taint is added."""


class NodeSelectorRequirement(ApiModel):
    """A node label's key, an operator and values (core/v1 NodeSelectorRequirement)."""

    key: Key
    """The node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In and NotIn take at least one value, Exists and DoesNotExist none, Gt and Lt one whole number."""
    values: Annotated[list[Value] | None, Field(max_length=MAX_VALUES)] = None
    """The values the operator compares the label with."""


class NodeSelectorTerm(ApiModel):
    """Requirements that all hold (core/v1 NodeSelectorTerm)."""

    match_expressions: Annotated[list[NodeSelectorRequirement] | None, Field(max_length=MAX_ITEMS)] = None
    """Requirements on the node's labels."""
    match_fields: Annotated[list[NodeSelectorRequirement] | None, Field(max_length=MAX_ITEMS)] = None
    """Requirements on the node's fields (metadata.name)."""


class NodeSelector(ApiModel):
    """Terms of which one must hold (core/v1 NodeSelector)."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=MAX_ITEMS)]
    """The terms, ORed."""


class PreferredSchedulingTerm(ApiModel):
    """A weighted preference for nodes (core/v1 PreferredSchedulingTerm)."""

    weight: Annotated[StrictInt, Field(ge=1, le=100)]
    """The preference's weight, 1 to 100."""
    preference: NodeSelectorTerm
    """The nodes preferred."""


class NodeAffinity(ApiModel):
    """core/v1 NodeAffinity."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pod may run on. Combined with the operator's instance types: each of your terms must hold together with them."""
    preferred_during_scheduling_ignored_during_execution: Annotated[list[PreferredSchedulingTerm] | None, Field(max_length=MAX_ITEMS)] = (
        None
    )
    """Nodes the pod prefers, added to the operator's preferences."""


class LabelSelectorRequirement(ApiModel):
    """meta/v1 LabelSelectorRequirement."""

    key: Key
    """The label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In and NotIn take at least one value, Exists and DoesNotExist none."""
    values: Annotated[list[Value] | None, Field(max_length=MAX_VALUES)] = None
    """The values."""


class LabelSelector(ApiModel):
    """meta/v1 LabelSelector."""

    match_labels: Annotated[dict[str, Value] | None, Field(max_length=MAX_ITEMS)] = None
    """Labels that must all be present with these values."""
    match_expressions: Annotated[list[LabelSelectorRequirement] | None, Field(max_length=MAX_ITEMS)] = None
    """Requirements that must all hold."""


class PodAffinityTerm(ApiModel):
    """Pods to be near (or away from), by topology (core/v1 PodAffinityTerm)."""

    label_selector: LabelSelector | None = None
    """The pods, by label. The model's serving pods carry inferentia.dev/model: <model name>."""
    namespace_selector: LabelSelector | None = None
    """The namespaces of those pods, by label."""
    namespaces: Names = None
    """The namespaces of those pods; default the pod's own."""
    topology_key: Key
    """The node label whose value defines "near" (kubernetes.io/hostname: the same node)."""
    match_label_keys: Names = None
    """Label keys whose values, taken from the placed pod, are added to labelSelector with In."""
    mismatch_label_keys: Names = None
    """Label keys whose values, taken from the placed pod, are added to labelSelector with NotIn."""


class WeightedPodAffinityTerm(ApiModel):
    """core/v1 WeightedPodAffinityTerm."""

    weight: Annotated[StrictInt, Field(ge=1, le=100)]
    """The preference's weight, 1 to 100."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(ApiModel):
    """core/v1 PodAffinity and PodAntiAffinity."""

    required_during_scheduling_ignored_during_execution: Annotated[list[PodAffinityTerm] | None, Field(max_length=MAX_ITEMS)] = None
    """Terms that must all hold, added to the operator's."""
    preferred_during_scheduling_ignored_during_execution: Annotated[list[WeightedPodAffinityTerm] | None, Field(max_length=MAX_ITEMS)] = (
        None
    )
    """Weighted preferences, added to the operator's."""


class Affinity(ApiModel):
    """core/v1 Affinity."""

    node_affinity: NodeAffinity | None = None
    """Nodes, by label."""
    pod_affinity: PodAffinity | None = None
    """Near other pods."""
    pod_anti_affinity: PodAffinity | None = None
    """Away from other pods."""


class TopologySpreadConstraint(ApiModel):
    """core/v1 TopologySpreadConstraint."""

    max_skew: Annotated[StrictInt, Field(ge=1)]
    """The most the matching pods' count may differ between two domains."""
    topology_key: Key
    """The node label whose values are the domains (topology.kubernetes.io/zone, for example)."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """DoNotSchedule: a hard limit; ScheduleAnyway: a preference."""
    label_selector: LabelSelector | None = None
    """The pods counted (the model's serving pods carry inferentia.dev/model: <model name>); none: no pod."""
    min_domains: Annotated[StrictInt | None, Field(ge=1)] = None
    """With DoNotSchedule: the fewest eligible domains."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether the pod's nodeAffinity and nodeSelector limit the domains counted."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether taints the pod does not tolerate limit the domains counted."""
    match_label_keys: Names = None
    """Label keys whose values, taken from the placed pod, narrow labelSelector."""


class Placement(ApiModel):
    """Where pods may run, with the PodSpec's field names and meanings."""

    node_selector: Annotated[dict[str, Value] | None, Field(max_length=MAX_ITEMS)] = None
    """Node labels the node must carry, besides those the operator requires (the planned instance types)."""
    tolerations: Annotated[list[Toleration] | None, Field(max_length=MAX_ITEMS)] = None
    """Taints the pods tolerate, besides the Neuron taint the operator tolerates on serving pods (aws.amazon.com/neuron): a NodePool's own taint, say dedicated=llm:NoSchedule."""
    affinity: Affinity | None = None
    """Node and pod affinity, combined with the operator's: every required term of both holds, and the preferences add up."""
    topology_spread_constraints: Annotated[list[TopologySpreadConstraint] | None, Field(max_length=MAX_ITEMS)] = None
    """How the pods spread over zones or nodes."""
    priority_class_name: Annotated[str | None, Field(min_length=1, max_length=253)] = None
    """The PriorityClass of the pods: a higher one preempts lower ones when capacity is short."""


def _dump(value: ApiModel | None) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if value is not None else None


def _and_terms(own: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Required node terms are ORed within a list; for both lists to hold, each of the user's
    terms holds together with each of the operator's (the cross product of the two ORs)."""
    if not own or not user:
        return own or user
    return [
        {
            k: v
            for k, v in (
                ("matchExpressions", [*o.get("matchExpressions", []), *u.get("matchExpressions", [])]),
                ("matchFields", [*o.get("matchFields", []), *u.get("matchFields", [])]),
            )
            if v
        }
        for u in user
        for o in own
    ]


_REQUIRED, _PREFERRED = "requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution"


def _merged_affinity(own: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    node_own, node_user = own.get("nodeAffinity", {}), user.get("nodeAffinity", {})
    node: dict[str, Any] = {}
    terms = _and_terms(node_own.get(_REQUIRED, {}).get("nodeSelectorTerms", []), node_user.get(_REQUIRED, {}).get("nodeSelectorTerms", []))
    if terms:
        node[_REQUIRED] = {"nodeSelectorTerms": terms}
    if preferred := [*node_own.get(_PREFERRED, []), *node_user.get(_PREFERRED, [])]:
        node[_PREFERRED] = preferred
    if node:
        merged["nodeAffinity"] = node
    for kind in ("podAffinity", "podAntiAffinity"):
        both = {
            when: terms
            for when in (_REQUIRED, _PREFERRED)
            if (terms := [*own.get(kind, {}).get(when, []), *user.get(kind, {}).get(when, [])])
        }
        if both:
            merged[kind] = both
    return merged


def pod_placement(
    placement: Placement | None,
    *,
    tolerations: tuple[dict[str, Any], ...] = (),
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The PodSpec's placement fields: the model's ``placement`` with the operator's own
    ``tolerations`` and ``affinity`` (in PodSpec form). The operator's come first and are
    never dropped: its tolerations and the user's are one list (a duplicate once); its required
    node terms hold together with each of the user's; every other term and preference of
    either is kept. Fields nobody sets are left out, as the API server leaves them."""
    user = placement or Placement()
    fields: dict[str, Any] = {}
    if user.node_selector:
        fields["nodeSelector"] = dict(user.node_selector)
    listed = [*tolerations, *(_dump(t) for t in user.tolerations or ())]
    if listed:
        fields["tolerations"] = [t for i, t in enumerate(listed) if t not in listed[:i]]
    merged = _merged_affinity(affinity or {}, _dump(user.affinity) or {})
    if merged:
        fields["affinity"] = merged
    if user.topology_spread_constraints:
        fields["topologySpreadConstraints"] = [_dump(c) for c in user.topology_spread_constraints]
    if user.priority_class_name:
        fields["priorityClassName"] = user.priority_class_name
    return fields
