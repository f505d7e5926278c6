"""Autoscaling: the model's KEDA ScaledObject, and the replicas it leaves the Deployment."""

from __future__ import annotations

from dataclasses import dataclass

from inferentia_operator.core import api
from inferentia_operator.core.autoscaling import SCALED_OBJECT_KIND, desired_replicas, in_flight_query
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import Part, ref
from inferentia_operator.core.scaling.keda import scaled_object
from inferentia_operator.core.settings import Settings


@dataclass(frozen=True)
class ScalingFacts:
    """What the autoscaling part concluded (scaling/part.py), for a model with spec.autoscaling."""

    spec: api.InferentiaModelSpec  # the Autoscaling condition is read against it
    configured: bool  # the operator knows where Prometheus is
    query: str | None  # the ScaledObject's query, when there is one


@dataclass(frozen=True)
class ScalingPart(Part):
    facts: ScalingFacts | None = None
    replicas: int = 0  # spec.replicas, kept within the range while the ScaledObject scales it
    scaled: bool = False  # a ScaledObject is wanted: autoscaling, and the operator knows Prometheus


def scaling_part(model: Model, observed: Observed, settings: Settings, has_artefact: bool) -> ScalingPart:
    """``has_artefact``: a model that scales to zero stays at one replica at least until it has one."""
    spec = model.spec
    live = observed.own(SCALED_OBJECT_KIND)
    ours = is_ours(live, model)
    # The ScaledObject only where the operator knows where Prometheus is; without autoscaling,
    # or without Prometheus, one the operator made earlier goes.
    gone = ((SCALED_OBJECT_KIND, model.name),) if ours else ()
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
    return ScalingPart((body,), held, facts=facts, replicas=replicas, scaled=True)
