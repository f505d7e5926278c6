"""The reconcile loop: read the world, plan, apply what differs, report status.

Level-based: every trigger (create, update, resume after a restart, a change to
any owned child, a slow timer) runs the same ``reconcile``, which looks only at
the current spec and the current children. Nothing is written when the world
already matches the plan, so running it twice changes nothing the second time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import kopf

from . import api, children, conditions
from .children import Model
from .names import FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_LABEL
from .drift import applied
from .kube import Kube, TransientError
from .planner import plan as make_plan
from .rules import check_name, errors, parse_spec

EventSink = Callable[[dict[str, Any], str, str, str], None]

# One reconcile at a time per model: kopf serialises a model's own handlers, but a
# child's event may trigger the same model concurrently.
_locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)


def reconcile(kube: Kube, namespace: str, name: str, emit: EventSink) -> dict[str, Any]:
    """Brings one InferentiaModel's children to its plan; returns the status it reports.

    Reads the model itself, under the lock, so a reconcile queued behind another never
    works from a stale copy."""
    with _locks[(namespace, name)]:
        live = kube.get(api.KIND, namespace, name)
        if live is None or live["metadata"].get("deletionTimestamp"):
            return {}  # gone, or going: the garbage collector removes the children
        return _reconcile(kube, live, emit)


def _reconcile(kube: Kube, body: dict[str, Any], emit: EventSink) -> dict[str, Any]:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    previous = body.get("status") or {}
    observed = conditions.Observed(deployment=kube.get("Deployment", namespace, name))

    spec, findings = parse_spec(body.get("spec"))
    problems = check_name(name) + errors(findings)
    if spec is None or problems:
        # Invalid (a cluster without the CRD's CEL rules, or a rule CEL cannot express):
        # report it, and leave the running Deployment exactly as it is.
        message = "; ".join(str(f) for f in problems)
        rollout = conditions.rollout_of(observed.deployment, (body.get("spec") or {}).get("replicas", 0), None)
        conds = conditions.conditions(valid=False, invalid_message=message, compiled=None, rollout=rollout, observed=observed)
        status = {**_counts(rollout, previous.get("selector")), "plan": previous.get("plan")}
        return _report(kube, body, previous, status, conds, emit)

    plan = make_plan(spec)
    m = Model(name, namespace, meta["uid"], spec, plan)
    plan_hash = children.plan_hash(plan)

    # The plan ConfigMap is named after its content, so pods of the previous plan keep
    # reading theirs while a new compile runs.
    configmap = children.plan_configmap(m)
    _ensure(kube, configmap, kube.get("ConfigMap", namespace, configmap["metadata"]["name"]))
    _ensure(kube, children.service(m), kube.get("Service", namespace, name))

    job_body = children.compile_job(m)
    if job_body is not None:
        observed.job = kube.get("Job", namespace, job_body["metadata"]["name"])
        if observed.job is None:
            # Named after the hash of its inputs: a finished compile is found and reused.
            observed.job = kube.apply(job_body)
    compiled = conditions.compile_state(
        job_body is not None, job_body and job_body["metadata"]["name"], observed.job, children.compiled_uri(m)
    )
    if compiled.status == "True":
        observed.deployment = _ensure(kube, children.serving_deployment(m), observed.deployment)
    # else: compiling or failed, and the previous Deployment (if any) keeps serving untouched.

    _delete_superseded_plans(kube, m, configmap["metadata"]["name"], observed.deployment)
    observed.pods = kube.list("Pod", namespace, children.selector_string(m))
    rollout = conditions.rollout_of(observed.deployment, spec.replicas, plan_hash)
    conds = conditions.conditions(valid=True, invalid_message="", compiled=compiled, rollout=rollout, observed=observed)
    status = {
        **_counts(rollout, children.selector_string(m)),
        "plan": children.plan_document(plan),
        "compileJob": job_body["metadata"]["name"] if job_body else None,
        "compiledUri": children.compiled_uri(m) if job_body else None,
    }
    return _report(kube, body, previous, status, conds, emit)


def _ensure(kube: Kube, desired: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """Applies ``desired`` unless it is already live; returns the live object either way
    (server-side apply answers with the object it stored)."""
    if live is not None and applied(desired, live):
        return live
    return kube.apply(desired)


def _delete_superseded_plans(kube: Kube, m: Model, current: str, deployment: dict[str, Any] | None) -> None:
    in_use = {current}
    for volume in (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []:
        if "configMap" in volume:
            in_use.add(volume["configMap"]["name"])
    for cm in kube.list("ConfigMap", m.namespace, f"{MODEL_LABEL}={m.name},app.kubernetes.io/component=plan"):
        if cm["metadata"]["name"] not in in_use:
            kube.delete("ConfigMap", m.namespace, cm["metadata"]["name"])


def _counts(rollout: conditions.Rollout, selector: str | None) -> dict[str, Any]:
    return {
        "replicas": rollout.replicas,
        "readyReplicas": rollout.ready,
        "updatedReplicas": rollout.updated,
        "selector": selector,
    }


def _report(kube, body, previous, status, conds, emit) -> dict[str, Any]:
    generation = body["metadata"].get("generation", 1)
    old_conditions = previous.get("conditions") or []
    stamped = conditions.with_times(conds, old_conditions, generation, conditions.now())
    status = {"observedGeneration": generation, **status, "conditions": stamped}
    current = {k: v for k, v in previous.items() if k != "kopf"}
    wanted = {k: v for k, v in status.items() if v is not None}
    if current != wanted:
        # A merge patch: keys we no longer report are nulled, kopf's own stanza is kept.
        kube.patch_status(body["metadata"]["namespace"], body["metadata"]["name"], {**{k: None for k in current}, **wanted})
        for kind, reason, message in conditions.transitions(stamped, old_conditions):
            emit(body, kind, reason, message)
    return wanted


# --- kopf wiring ------------------------------------------------------------------------------


def _without_finalizer(registry: kopf.OperatorRegistry, fn: Callable[..., Any]) -> None:
    """Registers the timer ``fn`` as not needing a finalizer on the model.

    kopf puts a finalizer on every object a timer runs for, so that the timer stops
    before the object goes. Ours only calls an idempotent reconcile that returns early
    for a model that is gone, and a finalizer would make deleting a model (or its
    namespace) hang whenever the operator is down or uninstalled. kopf has no public
    switch for this, so the registered handler is swapped for a copy without the flag;
    if kopf's internals ever move, this fails at start-up rather than silently."""
    import dataclasses

    spawning = registry._spawning  # noqa: SLF001 - see the docstring
    matches = [h for h in spawning._handlers if getattr(h, "fn", None) is fn]  # noqa: SLF001
    if len(matches) != 1 or not dataclasses.is_dataclass(matches[0]) or not hasattr(matches[0], "requires_finalizer"):
        raise RuntimeError("kopf's timer registry changed: cannot register the resync timer without a finalizer")
    index = spawning._handlers.index(matches[0])  # noqa: SLF001
    spawning._handlers[index] = dataclasses.replace(matches[0], requires_finalizer=False)  # noqa: SLF001


def _emit(body: dict[str, Any], kind: str, reason: str, message: str) -> None:
    kopf.event(body, type=kind, reason=reason, message=message[:1024])


def register(registry: kopf.OperatorRegistry, kube: Callable[[], Kube], resync_seconds: float) -> None:
    """Registers the handlers; ``kube()`` gives the operator's API client, called only once
    handlers run (after kopf's login), so it must return the same client every time."""

    def handle(namespace: str, name: str) -> None:
        try:
            reconcile(kube(), namespace, name, _emit)
        except TransientError as exc:
            raise kopf.TemporaryError(str(exc), delay=10) from exc

    model = dict(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, registry=registry)

    @kopf.on.resume(**model, backoff=10)
    @kopf.on.create(**model, backoff=10)
    @kopf.on.update(**model, backoff=10)
    def on_model(namespace, name, **_):
        handle(namespace, name)

    @kopf.timer(**model, interval=resync_seconds, initial_delay=resync_seconds, idle=0)
    def resync(namespace, name, **_):
        # A slow, level-based sweep: catches anything an event did not.
        handle(namespace, name)

    _without_finalizer(registry, resync)

    def on_child(body, logger, **_):
        owner = (body.get("metadata", {}).get("labels") or {}).get(MODEL_LABEL)
        namespace = body.get("metadata", {}).get("namespace")
        if not owner or not namespace:
            return
        try:
            reconcile(kube(), namespace, owner, _emit)
        except TransientError as exc:
            logger.warning("reconcile of %s/%s after a child's change will be retried by the resync: %s", namespace, owner, exc)

    managed = {MANAGED_BY_LABEL: FIELD_MANAGER}
    for group, version, plural in (
        ("apps", "v1", "deployments"),
        ("batch", "v1", "jobs"),
        ("", "v1", "services"),
        ("", "v1", "configmaps"),
        ("", "v1", "pods"),
    ):
        kopf.on.event(group, version, plural, labels=managed, registry=registry)(on_child)
