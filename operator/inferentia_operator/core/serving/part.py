"""Serving: the plan ConfigMap, the model's Service, its Deployment (a LeaderWorkerSet when
a replica spans nodes), which waits for the compiled artefact (until then the previous one
keeps serving), the PodDisruptionBudget over its pods, and behind a batching front end the
NetworkPolicy that opens its port alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.meta import selector_string
from inferentia_operator.core.pod.model import Model, plan_hash
from inferentia_operator.core.pod.part import ChildRef, Part, ref
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.groups import serving_group
from inferentia_operator.core.serving.service import disruption_budget, plan_configmap, service, serving_network_policy, serving_policy_name


@dataclass(frozen=True)
class ServingFacts:
    """What the serving part concluded (serving/part.py)."""

    replicas: int  # the Deployment's desired replicas
    plan_hash: str | None  # the current plan's, which an up-to-date Deployment carries
    plan: api.Plan | None
    selector: str | None


@dataclass(frozen=True)
class ServingPart(Part):
    facts: ServingFacts | None = None


def serving_part(model: Model, compiled: bool, replicas: int, to_holder: bool, observed: Observed | None = None) -> ServingPart:
    """``compiled``: the current plan's artefact exists (or nothing compiles ahead of serving);
    ``replicas``: what autoscaling and scale to zero leave the Deployment; ``to_holder``: the
    model's Service points at the scale-to-zero holder."""
    workload = serving_group(model, replicas) if model.plan.nodes else serving_deployment(model, replicas)
    facts = ServingFacts(replicas, plan_hash(model.plan), model.plan, selector_string(model))
    held = frozenset() if compiled else frozenset({ref(workload)})
    made = (plan_configmap(model), service(model, to_holder), workload, disruption_budget(model, replicas))
    policy = serving_network_policy(model)
    stale = _stale_policy(model, observed, policy) if observed is not None else ()
    return ServingPart((*made, *([policy] if policy else [])), held, delete=stale, facts=facts)


def _stale_policy(model: Model, observed: Observed, policy: dict[str, Any] | None) -> tuple[ChildRef, ...]:
    """The front end's NetworkPolicy of a model that has none any more: it would keep every other
    port of its pods closed. Never someone else's of that name."""
    name = serving_policy_name(model)
    live = observed.live("NetworkPolicy", name)
    if policy is not None or not is_ours(live, model):
        return ()
    return (("NetworkPolicy", name),)
