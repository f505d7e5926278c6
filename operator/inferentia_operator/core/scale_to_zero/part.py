"""Scale to zero (autoscaling.minReplicas 0): the replicas Service, the holder that keeps
requests while no replica runs, where the model's Service points, and the replicas the
Deployment runs now.

The model's Service points at the replicas while one is available and the model wants one,
else at the holder once the holder is available (never at nothing). Going to zero, the
Service moves to the holder first, and the last replica stops only once the Service is seen
there: a request in between reaches the holder or the draining replica, never a Service
without endpoints. Without an available holder the model keeps a replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from inferentia_operator.core.autoscaling import scales_to_zero
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.meta import HOLDER_SUFFIX, holder_selector
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import Part, ref
from inferentia_operator.core.scale_to_zero.holder import (
    holder_deployment,
    holder_network_policy,
    holder_service,
    parked_holder,
    replicas_service,
)


class Scaling(Protocol):
    """What the autoscaling part concluded (scaling/part.py, ScalingPart), as decide passes it on."""

    @property
    def scaled(self) -> bool: ...  # a ScaledObject is wanted: autoscaling, and the operator knows Prometheus

    @property
    def replicas(self) -> int: ...  # spec.replicas, kept within the range while the ScaledObject scales it


@dataclass(frozen=True)
class ScaleToZeroPart(Part):
    replicas: int = 0  # the Deployment's
    to_holder: bool = False  # the model's Service points at the holder


def _available(deployment: Mapping[str, Any] | None) -> int:
    available = Obj(deployment).status.get("availableReplicas", 0)
    return available if isinstance(available, int) else 0


def scale_to_zero_part(model: Model, observed: Observed, scaling: Scaling) -> ScaleToZeroPart:
    holder_name = model.name + HOLDER_SUFFIX
    if not (scaling.scaled and scales_to_zero(model.spec)):
        stale = _stale_policy(model, observed, None)
        # A model that no longer scales to zero: its holder is parked at no replica, not
        # deleted (the operator may delete no Deployment); its owner's deletion removes it.
        parked = observed.live("Deployment", holder_name)
        if is_ours(parked, model) and Obj(parked).spec.get("replicas") != 0:
            return ScaleToZeroPart((parked_holder(model),), delete=stale, replicas=scaling.replicas)
        return ScaleToZeroPart(delete=stale, replicas=scaling.replicas)
    upstream = replicas_service(model)
    holder = holder_deployment(model)
    # The holder's pods find the replicas Service by the variables the kubelet sets for every
    # Service that exists when a pod is created (batching/holder.py): so the holder waits for it.
    held = frozenset() if observed.live("Service", Obj(upstream).name) is not None else frozenset({ref(holder)})
    holder_up = _available(observed.live("Deployment", holder_name)) > 0
    deployment = observed.own("Deployment")
    warm = scaling.replicas > 0 and _available(deployment) > 0
    to_holder = holder_up and not warm
    at_holder = Obj(observed.own("Service")).spec.get("selector") == holder_selector(model)
    replicas = scaling.replicas
    if replicas == 0 and not (to_holder and at_holder):
        replicas = max(Obj(deployment).spec.get("replicas") or 0, 1)
    # The holder's external scaler, which the ScaledObject's external-push trigger connects to,
    # and (with --keda-namespace) the policy that lets KEDA alone reach it.
    scaler_service = holder_service(model)
    policy = holder_network_policy(model)
    built = (upstream, holder, scaler_service, *([policy] if policy else []))
    return ScaleToZeroPart(built, held, delete=_stale_policy(model, observed, policy), replicas=replicas, to_holder=to_holder)


def _stale_policy(model: Model, observed: Observed, wanted: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The holder's NetworkPolicy of the operator's, once it is no longer wanted (--keda-namespace
    unset, push activation off): left, a namespace that is no longer KEDA's would keep it out."""
    name = model.name + HOLDER_SUFFIX
    live = observed.live("NetworkPolicy", name)
    if wanted is None and is_ours(live, model):
        return (("NetworkPolicy", name),)
    return ()
