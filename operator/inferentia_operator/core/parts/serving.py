"""Serving: the plan ConfigMap, the model's Service and its Deployment (a LeaderWorkerSet when
a replica spans nodes), which waits for the compiled artefact (until then the previous one
keeps serving)."""

from __future__ import annotations

from dataclasses import dataclass

from inferentia_operator.core import children
from inferentia_operator.core.children import Model
from inferentia_operator.core.leaderworkerset import serving_group
from inferentia_operator.core.names import GROUP_KIND
from inferentia_operator.core.ownership import foreign_owner
from inferentia_operator.core.status import Observed, ServingFacts

from . import ChildRef, Part, ref


@dataclass(frozen=True)
class ServingPart(Part):
    facts: ServingFacts | None = None


def serving_part(model: Model, compiled: bool, replicas: int, to_holder: bool, observed: Observed | None = None) -> ServingPart:
    """``compiled``: the current plan's artefact exists (or nothing compiles ahead of serving);
    ``replicas``: what autoscaling and scale to zero leave the Deployment; ``to_holder``: the
    model's Service points at the scale-to-zero holder. A model whose replicas changed shape
    (spec.compute.nodes to or from 1) loses its workload of the other shape: ``observed`` says
    whether it has one (never someone else's object of that name)."""
    workload = serving_group(model, replicas) if model.plan.nodes else children.serving_deployment(model, replicas)
    facts = ServingFacts(replicas, children.plan_hash(model.plan), model.plan, children.selector_string(model))
    held = frozenset() if compiled else frozenset({ref(workload)})
    other = "Deployment" if model.plan.nodes else GROUP_KIND
    live = observed.own(other) if observed is not None else None
    ours = live is not None and foreign_owner(live, model.uid, model.name) is None
    delete: tuple[ChildRef, ...] = ((other, model.name),) if ours else ()
    return ServingPart((children.plan_configmap(model), children.service(model, to_holder), workload), held, delete, facts=facts)
