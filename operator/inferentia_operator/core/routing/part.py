"""Routing by queue: the model's InferencePool and its endpoint picker (core/routing/pool.py)."""

from __future__ import annotations

from dataclasses import dataclass

from inferentia_operator.core.names import INFERENCE_POOL_KIND
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Observed
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import Part, ref
from inferentia_operator.core.routing import pool as routing
from inferentia_operator.core.settings import Settings


@dataclass(frozen=True)
class RoutingFacts:
    """What the routing part concluded (routing/part.py), for a model with spec.routing.inferencePool."""

    served: bool  # the cluster serves InferencePools (the Extension's CRDs are installed)
    pool: str | None  # the model's InferencePool, once the caches hold it


@dataclass(frozen=True)
class RoutingPart(Part):
    facts: RoutingFacts | None = None


def routing_part(model: Model, observed: Observed, settings: Settings) -> RoutingPart:
    pool_name, picker = model.name, routing.picker_name(model)
    live_pool = observed.live(INFERENCE_POOL_KIND, pool_name)
    live_picker = observed.live("Deployment", picker)
    if model.spec.routing is None or model.spec.routing.inference_pool is None:
        # Turned off: the pool goes at once, so no gateway routes by it; the picker is parked
        # (the operator deletes no Deployment) and goes with the model, as its Service does.
        gone = ((INFERENCE_POOL_KIND, pool_name),) if is_ours(live_pool, model) else ()
        running = is_ours(live_picker, model) and Obj(live_picker).spec.get("replicas") != 0
        return RoutingPart((routing.parked_picker(model, settings.endpoint_picker_image),) if running else (), delete=gone)
    objects = (
        routing.inference_pool(model),
        routing.picker_service_account(model),
        routing.picker_role_binding(model, settings.endpoint_picker_role),
        routing.picker_deployment(model, settings.endpoint_picker_image),
        routing.picker_service(model),
    )
    served = observed.served(INFERENCE_POOL_KIND)
    # The pool first: a picker without its pool would only fail to find it. Without the
    # Extension's CRDs (the pool's write answered 404), nothing is written.
    if not served:
        held = frozenset(ref(o) for o in objects)
    elif live_pool is None:
        held = frozenset(ref(o) for o in objects[1:])
    else:
        held = frozenset()
    return RoutingPart(objects, held, facts=RoutingFacts(served=served, pool=pool_name if is_ours(live_pool, model) else None))
