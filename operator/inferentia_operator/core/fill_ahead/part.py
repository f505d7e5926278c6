"""Fill-ahead: the node cache filled, before they are needed, on the nodes a model's replicas will
go to, so that a scale-up from one replica to three reads the store ahead of it, not during it.

A replica fetches its artefact through its node's cache (fetch.py, batching/node_cache.py): only
the first replica on a node reads the store. Replicas spread over nodes (a preference, weight
100, pod.affinity.serving_affinity), so each replica of a scale-up is usually the first on its node,
and without this each one reads the whole artefact (weights included: 141 GB for the 70B sample)
while the traffic that asked for it waits.

So, for a model compiled ahead and served through the node cache, the operator keeps one fill
Job on each of the nodes its replicas will go to (as many as its most replicas:
``autoscaling.maxReplicas``, else ``replicas``; at most MAX_FILL_NODES). With prefill and
decode pools the replicas that fetch are the pools' (the proxy fetches nothing), each pool
placed by its own plan (an EFA pool's instance types are those with EFA devices for it): each
pool's most replicas of the nodes its pods may take. Each Job's one container
is the serving pod's own fetch with ``--fill`` (fetch.fill): the same image, ServiceAccount,
store credentials and token for the node cache, on that node alone (required node affinity on
its name, with the model's own placement); it asks for no Neuron device. The cache records the
artefact and labels its pod (core/holds.py), and the replicas' preference for such nodes
(weight 50) sends the scale-up there; with the node plugin, they link to the node's view and
read nothing at all.

Which nodes: those a replica could be placed on (Ready, no Neuron fault, read whole, of the
plan's instance types, the serving pods' tolerations, node selector and required node affinity
met: device_faults.selects), ranked by a hash of the model's uid and the node's name
(rendezvous hashing): each model fills its own nodes, and a node that comes or goes moves at
most one model's fill, not all of them. Free Neuron devices are the scheduler's to know: a
replica that finds none on a filled node goes to another and reads the store there, as before.

A Job is written once and kept while its node is wanted (a finished one holds no disk: fetch
removes its copy); the Jobs of nodes no longer wanted go. A failed Job is left for status to
quote; deleting it fills again, and so does a new cache pod on its node. Status says which
nodes are filled (FilledAhead). A node's cache pod replaced after its fill, without views (its
store is its emptyDir, and it starts empty), holds no label of the artefact (core/holds.py) once
Ready: the fill's Job goes, and the node is filled again. A cache that evicts the artefact for
room later is filled again by the next replica there, not ahead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferentia_operator.core import api
from inferentia_operator.core.catalogue import INSTANCE_TYPE_LABEL
from inferentia_operator.core.conditions import cond
from inferentia_operator.core.holds import hold_key
from inferentia_operator.core.names import COMPONENT_LABEL, FILL_COMPONENT
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Conflict, Observed, WriteFailure, compile_failure, job_state
from inferentia_operator.core.placement import pod_placement
from inferentia_operator.core.pod.affinity import NEURON_TOLERATION, serving_affinity
from inferentia_operator.core.pod.artefact import compiled_uri, fetched_uris
from inferentia_operator.core.pod.containers import pod_security
from inferentia_operator.core.pod.fetch import fetch_container, node_cache_token_volumes, node_view_volumes
from inferentia_operator.core.pod.meta import child_metadata, labels, service_account
from inferentia_operator.core.pod.model import Model, stable_hash
from inferentia_operator.core.pod.nodes import selects
from inferentia_operator.core.pod.part import Part, ref
from inferentia_operator.core.pod.pools import ROLES
from inferentia_operator.core.pod.volumes import gib_quantity
from inferentia_operator.core.projection import project_pod_spec

# Shown while a model fills the node cache ahead of its replicas, absent otherwise (fill_ahead/part.py).
FILLED_AHEAD = "FilledAhead"

# A model fills at most this many nodes ahead: each fill reads the whole artefact from the store.
MAX_FILL_NODES = 16
NAMED = 3  # nodes a message names; the rest are counted
# Retries of a fill's pod before its Job fails (and status says so).
FILL_BACKOFF_LIMIT = 2
# How long a fill may take, pending included: a pod that cannot be placed (a namespace's
# admission defaults that the model's own placement does not show) fails its Job, and status
# says so, rather than filling for ever. Ten minutes, and a second for every 20 MiB.
FILL_SECONDS, FILL_RATE = 600, 20 << 20


@dataclass(frozen=True)
class FillAheadPart(Part):
    condition: api.Condition | None = None  # FilledAhead, while the model fills ahead

    def jobs(self) -> frozenset[str]:
        """The fill Jobs it writes or deletes: what writing them meets is said in FilledAhead."""
        return frozenset(name for kind, name in (*map(ref, self.children), *self.delete) if kind == "Job")


def fills_ahead(model: Model) -> bool:
    """A model whose replicas fetch a compiled artefact through the node cache, a node each."""
    return bool(model.node_cache_url) and model.spec.compile.image is not None and model.plan.nodes is None


def _most(replicas: int, autoscaling: api.Autoscaling | api.PoolAutoscaling | None) -> int:
    """The most replicas of a Deployment: its autoscaler's bound, else its replicas."""
    return autoscaling.max_replicas if autoscaling is not None else replicas


def most_replicas(model: Model) -> int:
    return _most(model.spec.replicas, model.spec.autoscaling)


def fetchers(model: Model) -> tuple[tuple[Model, int], ...]:
    """What fetches the artefact, and its most replicas: the model's serving replicas, or each
    pool (Model.pools: the pool's spec and plan) with its own autoscaling's bound."""
    d = model.spec.disaggregation
    if d is None:
        return ((model, most_replicas(model)),)
    bounds = (_most(p.replicas, p.autoscaling) for p in map(d.pool, ROLES))
    return tuple(zip(model.pools, bounds, strict=True))


def _rank(model: Model, node: str) -> str:
    return hashlib.sha256(f"{model.uid}\0{node}".encode()).hexdigest()


def fill_nodes(model: Model, nodes: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[str]:
    """The nodes the model's replicas will go to (module docstring), best first."""
    # A node each replica, the pools' too: their pods spread over nodes as one model's
    # (serving_affinity's anti-affinity selects the model's serving pods, both pools'). So each
    # pool takes its best nodes that another pool's replicas did not take first.
    wanted: list[str] = []
    for fetcher, most in fetchers(model):
        ranked = sorted(set(_open_nodes(fetcher, nodes)) - set(wanted), key=lambda name: _rank(model, name))
        wanted.extend(ranked[:most])
    return sorted(wanted, key=lambda name: _rank(model, name))[:MAX_FILL_NODES]


def _open_nodes(fetcher: Model, nodes: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[str]:
    """The nodes a replica of ``fetcher`` (the model, or one of its pools) could be placed on."""
    # The serving pods' placement fields alone, as serving_deployment puts them in its template:
    # not the whole Deployment, at every reconcile.
    template = pod_placement(fetcher.spec.placement, tolerations=(NEURON_TOLERATION,), affinity=serving_affinity(fetcher))
    placement = project_pod_spec(template)
    types = set(fetcher.plan.instance_types)
    return [
        name
        for name, projections in nodes.items()
        for node in list(projections)[:1]
        if node.get("ready") and not node.get("fault") and not node.get("cut") and node.get("instanceType") in types
        if selects(placement, name, node)
    ]


def fill_job_name(model: Model, node: str) -> str:
    """Named after the model, the node and what it fills: a new artefact fills again."""
    return f"{model.name[:40]}-fill-{stable_hash([model.name, node, fetched_uris(model)], 12)}"


def fill_job(model: Model, node: str) -> dict[str, Any]:
    """The fill Job of ``node``: the serving pod's artefact fetch, with --fill, on that node."""
    fetch = fetch_container(model)
    container = {**fetch, "name": "fill", "args": [*fetch["args"], "--fill"]}
    names = {m["name"] for m in container["volumeMounts"]}
    assert model.plan.sizes.artefact_bytes is not None, "a fill without a compile step"
    volumes = [
        # An emptyDir even with serving.storageClassName: a claim per fill would stay bound as
        # long as its finished Job is kept, where an emptyDir goes with the finished pod.
        {"name": "compiled", "emptyDir": {"sizeLimit": gib_quantity(model.plan.sizes.artefact_bytes)}},
        *node_cache_token_volumes(model),
        *node_view_volumes(model),
        # HOME and /tmp, as every container of the operator's image has them (small: fetch keeps nothing there).
        {"name": "home", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": model.spec.serving.tmp_size}},
    ]
    assert names == {v["name"] for v in volumes}, "every mount of the fill has its volume"
    on_node = {
        "matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": model.serving_instance_types}],
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}],
    }
    placed = pod_placement(
        model.spec.placement,
        tolerations=(NEURON_TOLERATION,),
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [on_node]}}},
    )
    # The model's placement decides where its replicas may go, so the fill keeps exactly that:
    # node selector, tolerations, required node terms (its pod terms and spreads are about
    # serving pods, and would count the fill among them).
    required = placed["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(model, fill_job_name(model, node), FILL_COMPONENT),
        "spec": {
            "backoffLimit": FILL_BACKOFF_LIMIT,
            "activeDeadlineSeconds": FILL_SECONDS + (model.plan.sizes.artefact_bytes or 0) // FILL_RATE,
            "template": {
                "metadata": {"labels": labels(model, FILL_COMPONENT)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    **service_account(model),
                    "securityContext": pod_security(model),
                    "containers": [container],
                    "volumes": volumes,
                    **{k: placed[k] for k in ("nodeSelector", "tolerations") if k in placed},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
                },
            },
        },
    }


def fill_ahead_part(model: Model, observed: Observed, compiled: bool) -> FillAheadPart:
    """The fill Jobs of the nodes wanted, the others' deleted, and what status says of them."""
    live = {Obj(j).name: j for j in observed.all("Job") if Obj(j).labels.get(COMPONENT_LABEL) == FILL_COMPONENT}
    filling = fills_ahead(model) and compiled and any(most > 0 for _, most in fetchers(model))
    wanted = fill_nodes(model, observed.nodes) if filling else []
    jobs = {fill_job_name(model, node): node for node in wanted}
    stale = tuple(("Job", name) for name in live if name and name not in jobs)
    if not filling:
        return FillAheadPart(delete=stale)
    made = tuple(fill_job(model, node) for node in wanted)
    key = hold_key(compiled_uri(model))
    lost = tuple(
        ("Job", name) for name, node in jobs.items() if name in live and _lost(live[name], observed.caches.get(node), key, model.node_views)
    )
    return FillAheadPart(made, delete=(*stale, *lost), condition=_condition(model, jobs, live, observed.pods))


def _lost(job: Mapping[str, Any], caches: Iterable[Mapping[str, Any]] | None, key: str, views: bool) -> bool:
    """The fill's Job is to go (and the next reconcile fills the node again): the node's newest
    cache pod is Ready (a fill before that would find no cache), holds no label of the artefact,
    and was made after the fill ended, either done, when the cache's store was that pod's
    emptyDir (without views: the new pod started empty; with views the store, on the node's
    disk, outlived it), or failed (a cache that was down or too small may take it now). A cache
    that evicts the artefact later is filled again by the next replica there, not ahead."""
    cache = max(caches or (), key=lambda c: str(c.get("created") or ""), default=None)
    state = job_state(job)
    if cache is None or not cache.get("ready") or key in cache.get("held", ()) or state.phase == "Running":
        return False
    if state.phase == "Complete":
        ended = None if views else Obj(job).status.get("completionTime")
    else:
        ended = Obj(job).condition("Failed").get("lastTransitionTime")
    return isinstance(ended, str) and str(cache.get("created") or "") > ended


def _named(nodes: list[str]) -> str:
    listed = ", ".join(nodes[:NAMED])
    return listed + (f" and {len(nodes) - NAMED} more" if len(nodes) > NAMED else "")


def _condition(
    model: Model, jobs: Mapping[str, str], live: Mapping[str | None, Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> api.Condition:
    if not jobs:
        types = ", ".join(model.serving_instance_types)
        return cond(
            FILLED_AHEAD, "False", "NoNode",
            f"no node of {types} is Ready, free of Neuron faults and open to the model's pods (or the operator "
            "does not watch nodes: run --no-node-faults): none is filled ahead",
        )  # fmt: skip
    states = {node: job_state(live.get(name)) if name in live else None for name, node in jobs.items()}
    # What the fill itself said (fetch.fill's error, its termination message), else the Job's condition.
    said = {node: compile_failure(name, pods) for name, node in jobs.items()}
    failed = {node: said[node] or state.why for node, state in states.items() if state is not None and state.phase == "Failed"}
    if failed:
        first = sorted(failed)[0]
        return cond(
            FILLED_AHEAD, "False", "FillFailed",
            f"the node cache could not be filled on {_named(sorted(failed))} ({first}: {failed[first] or 'its fill Job failed'}); "
            "a replica placed there reads the store. Delete the fill Job to fill again",
        )  # fmt: skip
    filling = sorted(node for node, state in states.items() if state is None or state.phase == "Running")
    if filling:
        return cond(
            FILLED_AHEAD,
            "False",
            "Filling",
            f"filling the node cache on {_named(filling)} ({len(jobs) - len(filling)} of {len(jobs)} filled)",
        )
    return cond(
        FILLED_AHEAD,
        "True",
        "Filled",
        f"the node cache holds the artefact on {_named(sorted(jobs.values()))}, where the model's replicas go first",
    )


def fill_ahead_said(said: api.Condition | None, found: Sequence[Conflict], failures: Sequence[WriteFailure]) -> api.Condition | None:
    """FilledAhead as reported (core/status.py): what the part said, unless writing a fill Job met a refusal or a conflict."""
    if not found and not failures:
        return said
    what = "; ".join(([f"{f.name}: {f.code} {f.message}" for f in failures] + [str(c) for c in found])[:3])
    if said is None:
        # The model fills ahead no more (no node cache, served otherwise, compiling again, or at
        # no replicas), and a fill Job of before could not be deleted: it holds nothing the
        # model needs, but it is said.
        return cond(
            FILLED_AHEAD, "False", "FillFailed",
            f"a fill Job no longer wanted could not be deleted ({what}); it is tried again at the next reconcile",
        )  # fmt: skip
    # A refused create or a refused delete (of a node no longer wanted): either is a write.
    return cond(FILLED_AHEAD, "False", "FillFailed", f"a fill Job could not be written ({what}); a replica reads the store where it lands")
