"""The act step: a create of each child the caches do not hold, a server-side apply of each
that differs, and deletes of superseded plans.

A write the API server refuses is recorded (it ends in the model's status) and the
others still go ahead. A create refused as taken (409) is the only time a reconcile reads:
the name may be held by an object the label-filtered watch cannot see, and the operator
never writes over someone else's.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from inferentia_operator.core.decide import Decision
from inferentia_operator.core.names import TRAFFIC_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.observed import Conflict, Observed, WriteFailure
from inferentia_operator.core.ownership import CREATE_THEN_APPLY, WritePolicy, foreign_owner, same_component_of_ours
from inferentia_operator.core.pod.artefact import job_output_uri
from inferentia_operator.core.projection import OWN_UPDATE_ENTRY, project, project_record
from inferentia_operator.core.proof import PROOF_ANNOTATION, Prover

from .cache import GONE
from .kube import ApiError, Kube

log = logging.getLogger(__name__)

# Calls one reconcile may have in flight at once: its children's writes (plan ConfigMap,
# Services, compile Job, claim template, Deployments), or its status patch and events.
WRITES_PER_RECONCILE = 5


def calls_in_flight(workers: int) -> int:
    """The API calls the operator may have in flight at once: each of the ``workers`` and the
    urgent lane's own worker (shell/reconciler.py) with WRITES_PER_RECONCILE each. The one
    figure sizes both the thread pool the calls run in and the client's connection pool, so
    that no call waits on a connection another figure forgot."""
    return (workers + 1) * WRITES_PER_RECONCILE


@dataclass
class Outcome:
    """What the act step wrote and what it could not."""

    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) -> object
    failures: list[WriteFailure] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    record: dict[str, Any] | None = None  # the record of a completed compile it created

    @property
    def changed(self) -> bool:
        return bool(self.written) or self.record is not None


async def act(pool: Executor, kube: Kube, observed: Observed, decision: Decision, prover: Prover) -> Outcome:
    """The decision's writes, each failure recorded, none stopping the rest. The children are
    independent (a pod waits for its plan ConfigMap by itself), so they are written at once,
    each a blocking call in ``pool`` (the reconciler's one pool of API calls): a reconcile
    takes one or two round trips, not six. Each child is written by its write policy
    (``decision.policies``, core/ownership.py), which the part that builds it decided."""
    out = Outcome()
    model = Obj(observed.model)
    namespace = model.namespace or ""

    def after_conflict(body: dict[str, Any], policy: WritePolicy) -> tuple[bool, dict[str, Any] | None]:
        """After a create's 409: whether the model may write the object that holds the name (one
        it does not control is recorded as a conflict), and that object projected as the caches
        would hold it, so that the apply that follows sees what the watch has not delivered yet:
        the POST's Update entry among it, which is then made the apply's at once."""
        kind, name = body["kind"], body["metadata"]["name"]
        existing = kube.get(kind, namespace, name)
        if existing is None:
            return True, None  # deleted since the 409: the apply creates it
        if policy.shared and same_component_of_ours(existing, body):
            # Another model with the same child (a compile Job of the same inputs) created it a
            # moment ago: this model waits for it (the next reconcile sees it in the cache),
            # never a conflict.
            return False, None
        owner = foreign_owner(existing, model.uid, model.name)
        if owner is not None:
            out.conflicts.append(Conflict(kind, name, owner))
            return False, None
        return True, project(existing)

    def write(body: dict[str, Any]) -> None:
        kind, name = body["kind"], body["metadata"]["name"]
        policy = decision.policies.get((kind, name), CREATE_THEN_APPLY)
        try:
            live = observed.live(kind, name)
            if live is None:
                # Not in the caches: a plain create, so that the usual case (a new model) costs
                # no read, and a POST, which costs the API server less than an apply
                # (docs/benchmarks.md); its fields are made the apply's before a first apply
                # (apply, below). It fails (409) where the name is taken by an object the
                # label-filtered watch cannot see: only then is it read, and never written over
                # if it is someone else's.
                created = kube.create(body)
                if created is not None:
                    out.written[(kind, name)] = project(prove_job(kube, created, prover) if policy.prove else created)
                    return
                ours, live = after_conflict(body, policy)
                if not ours:
                    return
            out.written[(kind, name)] = project(apply(kube, body, live))
        except ApiError as exc:
            out.failures.append(WriteFailure(kind, name, exc.code, exc.message))

    loop = asyncio.get_running_loop()
    if decision.traffic:
        await loop.run_in_executor(pool, label_traffic, kube, namespace, decision.traffic)
    await asyncio.gather(*(loop.run_in_executor(pool, write, body) for body in decision.apply))
    await loop.run_in_executor(pool, record_and_delete, kube, namespace, decision, out)
    return out


def label_traffic(kube: Kube, namespace: str, traffic: tuple[tuple[str, str, str], ...]) -> None:
    """The serving pods' traffic labels (core/device_faults/part.py), before the writes: a
    Service that starts selecting the label (an upgrade of the operator) finds its pods already
    labelled."""
    for name, uid, value in traffic:
        try:
            kube.label_pod(namespace, name, uid, {TRAFFIC_LABEL: value})
            log.info("pod %s/%s: traffic %s (core/device_faults/part.py)", namespace, name, value)
        except ApiError as exc:
            log.log(logging.INFO if exc.code in (409, 422) else logging.WARNING, "could not label pod %s/%s: %s", namespace, name, exc)


def record_and_delete(kube: Kube, namespace: str, decision: Decision, out: Outcome) -> None:
    """After the writes: the record of a completed compile, the deletes and the evictions."""
    if decision.record is not None:
        try:
            # Taken (409): another reconcile recorded the same compile first; nothing to do.
            created = kube.create(decision.record)
            out.record = project_record(created) if created is not None else None
        except ApiError as exc:
            out.failures.append(WriteFailure("ConfigMap", decision.record["metadata"]["name"], exc.code, exc.message))
    for kind, name in decision.delete:
        try:
            kube.delete(kind, namespace, name)
            out.written[(kind, name)] = GONE
        except ApiError as exc:
            log.warning("could not delete superseded %s %s/%s: %s", kind, namespace, name, exc)
    for name, uid in decision.evict:
        # A serving pod on a node whose Neuron devices fail (device_faults/part.py): the
        # model's status names it whatever happens here, and the next reconcile asks again.
        try:
            kube.evict(namespace, name, uid)
            log.info("evicted pod %s/%s from a node whose Neuron devices report an error", namespace, name)
        except ApiError as exc:
            # 429: the model's disruption budget allows no eviction now; 409: another pod by that name.
            log.log(logging.INFO if exc.code in (409, 429) else logging.WARNING, "could not evict pod %s/%s: %s", namespace, name, exc)


def prove_job(kube: Kube, job: dict[str, Any], prover: Prover) -> dict[str, Any]:
    """The proof that the operator made ``job`` (core/proof.py), added right after its create,
    from the create's answer: it names the Job's UID, which only exists from then on. Should
    this fail, the Job is never trusted and its model says CompileJobUnverified. For a child
    whose write policy says ``prove`` (the compile Job's; a fill Job vouches for nothing)."""
    meta = job["metadata"]
    proof = prover.job(meta["namespace"], meta["name"], meta["uid"], job_output_uri(job) or "")
    return kube.annotate("Job", meta["namespace"], meta["name"], {PROOF_ANNOTATION: proof})


def apply(kube: Kube, body: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """Server-side apply; first, on a child the operator created with a POST, its fields made
    the apply's (Kube.make_own_fields_applied), once; for a Service of ours whose ports someone
    edited by hand, the ports are first replaced whole.

    Service ports are a list keyed by port and protocol: an entry someone else changed
    (``kubectl patch`` of a port) belongs to them, so applying the planned entry beside
    it makes two ports of one name, which the API server refuses (422, Duplicate value)
    on every apply after. Replacing the list takes the entries back."""
    meta = body["metadata"]
    if live is not None and isinstance(entry := live.get(OWN_UPDATE_ENTRY), dict):
        kube.make_own_fields_applied(body["kind"], meta["namespace"], meta["name"], entry["index"], entry["besideApply"])
    try:
        return kube.apply(body)
    except ApiError as exc:
        if exc.code != 422 or body["kind"] != "Service" or live is None:
            raise
        log.info("Service %s/%s: ports edited by someone else; replacing them with the planned ones", meta["namespace"], meta["name"])
        kube.replace_field("Service", meta["namespace"], meta["name"], "/spec/ports", body["spec"]["ports"])
        return kube.apply(body)
