"""Serving: the plan ConfigMap, the model's Service, its Deployment (a LeaderWorkerSet when
a replica spans nodes), which waits for the compiled artefact (until then the previous one
keeps serving), the PodDisruptionBudget over its pods, and behind a batching front end the
NetworkPolicy that opens its port alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.observed import Observed, Rollout, rollout_of, rollout_of_all
from inferentia_operator.core.ownership import is_ours
from inferentia_operator.core.pod.meta import labels_string, proxy_selector, selector_string
from inferentia_operator.core.pod.model import Model
from inferentia_operator.core.pod.part import ChildRef, Part, ref
from inferentia_operator.core.pod.pools import ROLES, pool_name
from inferentia_operator.core.serving.deployment import serving_deployment
from inferentia_operator.core.serving.groups import serving_group
from inferentia_operator.core.serving.pools import pools, pools_policy_name, proxy_deployment
from inferentia_operator.core.serving.service import disruption_budget, plan_configmap, service, serving_network_policy, serving_policy_name


@dataclass(frozen=True)
class ServingFacts:
    """What the serving part concluded (serving/part.py)."""

    replicas: int  # the Deployment's desired replicas
    plan_hash: str | None  # the current plan's, which an up-to-date Deployment carries
    plan: api.Plan | None
    selector: str | None
    # With prefill and decode pools: each pool's Deployment and the replicas it runs, by role.
    pools: tuple[tuple[str, str, int], ...] = ()
    # Why the model's own Deployment is being deleted, to be created again once it is gone: its
    # selector, which the API server never lets change, is not the one wanted any more (to or
    # from prefill and decode pools: the serving pods' or the proxy's).
    replacing: str | None = None


@dataclass(frozen=True)
class ServingPart(Part):
    facts: ServingFacts | None = None


def serving_part(
    model: Model,
    compiled: bool,
    replicas: int,
    to_holder: bool,
    observed: Observed | None = None,
    pool_replicas: Mapping[str, int] | None = None,
) -> ServingPart:
    """``compiled``: the current plan's artefact exists (or nothing compiles ahead of serving);
    ``replicas``: what autoscaling and scale to zero leave the Deployment; ``to_holder``: the
    model's Service points at the scale-to-zero holder; ``pool_replicas``: what the pools'
    autoscaling leaves each pool's Deployment, by role."""
    if model.spec.disaggregation is not None:
        return _pools_part(model, compiled, replicas, observed, pool_replicas)
    workload = serving_group(model, replicas) if model.plan.nodes else serving_deployment(model, replicas)
    replacing = _replacing(model, observed, workload)
    facts = ServingFacts(replicas, model.plan_hash, model.plan, selector_string(model), replacing=replacing)
    held = frozenset({ref(workload)}) if replacing is not None or not compiled else frozenset()
    made = (plan_configmap(model), service(model, to_holder), workload, disruption_budget(model, replicas))
    policy = serving_network_policy(model)
    return ServingPart(
        (*made, *([policy] if policy else [])), held, delete=_stale(model, observed, policy, workload, replacing), facts=facts
    )


def _replacing(model: Model, observed: Observed | None, wanted: dict[str, Any]) -> str | None:
    """The model's own live Deployment, when its selector is not ``wanted``'s: the API server
    refuses any change of a Deployment's selector, so it is deleted, and ``wanted`` is held back
    until it is gone (every pass decides the same until then). Never someone else's."""
    if observed is None or wanted["kind"] != "Deployment":
        return None
    live = observed.own("Deployment")
    if live is None or not is_ours(live, model) or (live.get("spec") or {}).get("selector") == wanted["spec"]["selector"]:
        return None
    return f"Deployment {model.name} selects other pods than it should and a selector cannot change: deleted, to be created again"


def _stale(
    model: Model, observed: Observed | None, policy: dict[str, Any] | None, workload: dict[str, Any], replacing: str | None
) -> tuple[ChildRef, ...]:
    """What the serving part deletes, with pools or without: the front end's NetworkPolicy where
    ``policy`` (the one written now, None with pools) does not replace it, the pools' Deployments
    and Services of a model without pools, and the model's own ``workload`` while it is replaced."""
    if observed is None:
        return ()
    pools = () if model.spec.disaggregation is not None else _stale_pools(model, observed)
    return (*_stale_policy(model, observed, policy), *pools, *((ref(workload),) if replacing is not None else ()))


def _stale_pools(model: Model, observed: Observed) -> tuple[ChildRef, ...]:
    """A model without prefill and decode pools any more: each pool's Deployment and Service,
    which would keep their Neuron chips until the model is deleted, and the pools'
    NetworkPolicy, which selects no pod then. Never someone else's."""
    names = (pool_name(model, role) for role in ROLES)
    made = [(kind, n) for n in names for kind in ("Deployment", "Service")] + [("NetworkPolicy", pools_policy_name(model))]
    return tuple((kind, n) for kind, n in made if is_ours(observed.live(kind, n), model))


def _pools_part(
    model: Model, compiled: bool, replicas: int, observed: Observed | None = None, pool_replicas: Mapping[str, int] | None = None
) -> ServingPart:
    """Prefill and decode pools (serving/pools.py): the model's Deployment is their proxy, and
    each pool's Deployment waits for the compiled artefact as the serving Deployment does. The
    disruption budget covers both pools' servers (they are the serving pods), not the proxy."""
    around, workloads = pools(model, pool_replicas)
    proxy = proxy_deployment(model, replicas)
    replacing = _replacing(model, observed, proxy)
    held = frozenset() if compiled else frozenset(ref(w) for w in workloads)
    held |= {ref(proxy)} if replacing is not None else frozenset()
    made = (plan_configmap(model), service(model), proxy, *around, *workloads, disruption_budget(model))
    roles = tuple((role, w["metadata"]["name"], w["spec"]["replicas"]) for role, w in zip(ROLES, workloads, strict=True))
    facts = ServingFacts(replicas, model.plan_hash, model.plan, labels_string(proxy_selector(model)), roles, replacing=replacing)
    return ServingPart(made, held, delete=_stale(model, observed, None, proxy, replacing), facts=facts)


def pools_rollout(observed: Observed, facts: ServingFacts, proxy: Rollout) -> tuple[Rollout, api.PoolsStatus]:
    """A disaggregated model's proxy (``proxy``: its Deployment's rollout, whose pods status.replicas
    counts, as spec.replicas is the proxy's and the scale subresource's selector selects it) and
    pools as one rollout, which the conditions read as the serving Deployment's (Ready once all
    three are); and each pool's pods."""
    each = {role: rollout_of(observed.live("Deployment", name), n, facts.plan_hash) for role, name, n in facts.pools}
    desired = {role: n for role, _, n in facts.pools}
    counts = {role: api.PoolStatus(replicas=r.replicas, ready_replicas=r.ready, desired_replicas=desired[role]) for role, r in each.items()}
    return rollout_of_all([proxy, *each.values()]), api.PoolsStatus(**counts)


def _stale_policy(model: Model, observed: Observed, policy: dict[str, Any] | None) -> tuple[ChildRef, ...]:
    """The front end's NetworkPolicy of a model that has none any more: it would keep every other
    port of its pods closed. Never someone else's of that name."""
    name = serving_policy_name(model)
    live = observed.live("NetworkPolicy", name)
    if policy is not None or not is_ours(live, model):
        return ()
    return (("NetworkPolicy", name),)
