"""Autoscaling: the model's KEDA ScaledObject, and the replicas it leaves the Deployment; with
prefill and decode pools, each autoscaled pool's ScaledObject, and the replicas it leaves the
pool's Deployment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.autoscaling import (
    SCALED_OBJECT_KIND,
    PoolFacts,
    desired_replicas,
    in_flight_query,
    pool_autoscaling,
    pool_desired_replicas,
    pool_signals,
)
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import ChildRef, Part, ref
from inferentia_operator.core.pod.pools import ROLES, pool_name
from inferentia_operator.core.scaling.keda import pool_scaled_object, scaled_object
from inferentia_operator.core.settings import Settings


@dataclass(frozen=True)
class ScalingFacts:
    """What the autoscaling part concluded (scaling/part.py), for a model with spec.autoscaling
    or a pool with its own."""

    spec: api.InferentiaModelSpec  # the Autoscaling condition is read against it
    configured: bool  # the operator knows where Prometheus is
    query: str | None  # the model's ScaledObject's query, when there is one
    pools: tuple[PoolFacts, ...] = ()  # each autoscaled pool's


@dataclass(frozen=True)
class ScalingPart(Part):
    facts: ScalingFacts | None = None
    replicas: int = 0  # spec.replicas, kept within the range while the ScaledObject scales it
    scaled: bool = False  # a ScaledObject is wanted: autoscaling, and the operator knows Prometheus
    # With prefill and decode pools: the replicas of each pool's Deployment, by role.
    pool_replicas: Mapping[str, int] = field(default_factory=dict)


def scaling_part(model: Model, observed: Observed, settings: Settings, has_artefact: bool) -> ScalingPart:
    """``has_artefact``: a model that scales to zero stays at one replica at least until it has one."""
    spec = model.spec
    if spec.disaggregation is not None:
        return _pools_part(model, observed, settings)
    live = observed.own(SCALED_OBJECT_KIND)
    ours = is_ours(live, model)
    # The ScaledObject only where the operator knows where Prometheus is; without autoscaling,
    # or without Prometheus, one the operator made earlier goes; so do the pools' of a model
    # that had pools.
    stale = _pool_scaled_objects(model, observed)
    gone = (*(((SCALED_OBJECT_KIND, model.name),) if ours else ()), *stale)
    if spec.autoscaling is None:
        return ScalingPart(delete=gone, replicas=spec.replicas)
    configured = bool(settings.prometheus.address)
    facts = ScalingFacts(spec, configured, in_flight_query(spec, model.namespace, model.name, settings.prometheus) if configured else None)
    if not configured:
        return ScalingPart(delete=gone, facts=facts, replicas=desired_replicas(spec, scaled=False, has_artefact=has_artefact))
    body = scaled_object(model, settings.prometheus, has_artefact, push=settings.push_activation)
    # While the cluster serves no ScaledObjects (KEDA not installed), none is written.
    held = frozenset() if observed.served(SCALED_OBJECT_KIND) else frozenset({ref(body)})
    replicas = desired_replicas(spec, scaled=ours, has_artefact=has_artefact)
    return ScalingPart((body,), held, stale, facts=facts, replicas=replicas, scaled=True)


def _pool_scaled_objects(model: Model, observed: Observed) -> tuple[ChildRef, ...]:
    """The pools' ScaledObjects that are the model's, whatever its spec says now."""
    names = (pool_name(model, role) for role in ROLES)
    return tuple((SCALED_OBJECT_KIND, n) for n in names if is_ours(observed.live(SCALED_OBJECT_KIND, n), model))


def _pools_part(model: Model, observed: Observed, settings: Settings) -> ScalingPart:
    """Each pool with its own autoscaling gets a ScaledObject on its Deployment, where the
    operator knows Prometheus; while the ScaledObject exists or is being written, the pool's
    Deployment keeps the replicas it runs as last observed (the HPA's, within the range; see
    pool_desired_replicas for the one race). A pool's ScaledObject goes with its autoscaling or
    with Prometheus (with the pools: scaling_part). The model's own ScaledObject
    (spec.autoscaling is refused with pools) goes too. spec.replicas is the proxy's."""
    spec = model.spec
    configured = bool(settings.prometheus.address)
    own = observed.own(SCALED_OBJECT_KIND)
    gone: list[ChildRef] = [(SCALED_OBJECT_KIND, model.name)] if is_ours(own, model) else []
    bodies: list[dict[str, Any]] = []
    replicas: dict[str, int] = {}
    facts: list[PoolFacts] = []
    for role in ROLES:
        name = pool_name(model, role)
        a = pool_autoscaling(spec, role)
        ours = is_ours(observed.live(SCALED_OBJECT_KIND, name), model)
        if ours and (a is None or not configured):
            gone.append((SCALED_OBJECT_KIND, name))
        deployment = observed.live("Deployment", name)
        now = Obj(deployment).spec.get("replicas") if is_ours(deployment, model) else None
        # Scaled from the moment its ScaledObject is to be written, not from when it exists:
        # minReplicas meanwhile would take a running pool's replicas away for the HPA to start
        # again (and the next reconcile would read that minimum as what the HPA set).
        scaled = a is not None and configured and observed.served(SCALED_OBJECT_KIND)
        n = pool_desired_replicas(spec, role, scaled=scaled, live=now if isinstance(now, int) else None)
        replicas[role] = n
        if a is None:
            continue
        signals = pool_signals(spec, role, model.namespace, model.name, settings.prometheus) if configured else ()
        facts.append(PoolFacts(role, name, a, signals, n))
        if configured:
            bodies.append(pool_scaled_object(model, role, settings.prometheus))
    # While the cluster serves no ScaledObjects (KEDA not installed), none is written.
    held = frozenset() if observed.served(SCALED_OBJECT_KIND) else frozenset(ref(b) for b in bodies)
    scaling = ScalingFacts(spec, configured, None, tuple(facts)) if facts else None
    return ScalingPart(tuple(bodies), held, tuple(gone), facts=scaling, replicas=spec.replicas, pool_replicas=replicas)
