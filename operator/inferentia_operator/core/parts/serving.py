"""Serving: the plan ConfigMap, the model's Service, its Deployment (a LeaderWorkerSet when
a replica spans nodes), which waits for the compiled artefact (until then the previous one
keeps serving), the PodDisruptionBudget over its pods, and behind a batching front end the
NetworkPolicy that opens its port alone."""

from __future__ import annotations

from dataclasses import dataclass

from inferentia_operator.core import children
from inferentia_operator.core.children import Model
from inferentia_operator.core.leaderworkerset import serving_group
from inferentia_operator.core.status import ServingFacts

from . import Part, ref


@dataclass(frozen=True)
class ServingPart(Part):
    facts: ServingFacts | None = None


def serving_part(model: Model, compiled: bool, replicas: int, to_holder: bool) -> ServingPart:
    """``compiled``: the current plan's artefact exists (or nothing compiles ahead of serving);
    ``replicas``: what autoscaling and scale to zero leave the Deployment; ``to_holder``: the
    model's Service points at the scale-to-zero holder."""
    workload = serving_group(model, replicas) if model.plan.nodes else children.serving_deployment(model, replicas)
    facts = ServingFacts(replicas, children.plan_hash(model.plan), model.plan, children.selector_string(model))
    held = frozenset() if compiled else frozenset({ref(workload)})
    made = (children.plan_configmap(model), children.service(model, to_holder), workload, children.disruption_budget(model, replicas))
    policy = children.serving_network_policy(model)
    return ServingPart((*made, *([policy] if policy else [])), held, facts=facts)
