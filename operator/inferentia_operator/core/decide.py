"""The reconcile's decision: from what the caches hold to what to write. Pure, no API client.

``decide(observed, now)`` returns the children to apply, the objects to delete, and the
basis of the model's status (from :mod:`status`), with the status and events that basis
gives before any write. Where there are writes, the reconciler reports once more from the
same basis, with what the writes found (``status.report``); it never decides again. Every branch of a reconcile is here:
the invalid spec (leave the running Deployment alone), the compile gate (hold the
rollout until the compile Job of the current plan completed), objects that belong to
someone else (write nothing, report NameConflict), writes the API server refused
(report its message), and the clean-up of superseded plans (only when no pod, Job or
Deployment still uses them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import api, children, status
from .autoscaling import SCALED_OBJECT_KIND, desired_replicas, in_flight_query, scales_to_zero, target_in_flight
from .children import Model
from .drift import applied
from .model import check_model
from .names import COMPILE_INPUTS_ANNOTATION, COMPILE_RECORD_COMPONENT, COMPONENT_LABEL, FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_LABEL
from .objects import Obj
from .proof import Prover
from .status import Conflict, Observed, Report, ReportBasis, job_state


@dataclass(frozen=True)
class Decision:
    apply: list[dict[str, Any]]  # bodies to server-side apply, in order
    delete: list[tuple[str, str]]  # (kind, name)
    basis: ReportBasis | None  # None: the model is going away, report nothing
    report: Report | None  # the status from basis, before any write
    # The record of a completed compile to create: nobody's child, so not among ``apply``.
    record: dict[str, Any] | None = None


def holder_of(live: Mapping[str, Any], uid: str | None, model: str | None) -> str | None:
    """Why ``live`` is not this model's to write, or None when it is: another controller
    owns it, or it has no controller and does not carry this model's labels either (an
    object of someone else's with the child's name). A child of this model whose owner
    reference someone removed still has its labels, and is taken back."""
    obj = Obj(live)
    controller = obj.controller
    if controller is None:
        if obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER and obj.labels.get(MODEL_LABEL) == model:
            return None
        return "not managed by this model (it has no controller)"
    if controller.get("uid") != uid:
        return f"controlled by {controller.get('kind')} {controller.get('name')}"
    return None


def is_compile_job_of_ours(live: Mapping[str, Any]) -> bool:
    """A compile Job the operator made for some model: compile Jobs are named after their
    artefact, so a model finding one under its Job's name shares it rather than competing."""
    obj = Obj(live)
    return (
        obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER
        and obj.labels.get(COMPONENT_LABEL) == "compile"
        and (obj.controller or {}).get("kind") == api.KIND
    )


def _trusted_record(records: list[dict[str, Any]] | None, uri: str, prover: Prover) -> dict[str, Any] | None:
    """The operator's record of a completed compile of ``uri``, among the ConfigMaps that say
    they are one: only a record carrying the operator's proof counts."""
    for record in records or ():
        obj = Obj(record)
        if obj.labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER and obj.labels.get(COMPONENT_LABEL) == COMPILE_RECORD_COMPONENT:
            if prover.made_record(record, uri):
                return record
    return None


def _record_data(record: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (record.get("data") or {}).items()}


@dataclass(frozen=True)
class _Compile:
    """Where the model's artefact comes from, with one compile per key.

    The operator does not read the store (it holds no storage credentials: those are each
    namespace's, or its models' cloud identity). It knows an artefact is complete because a
    compile Job that uploads it completed: the upload writes the completion marker last, and
    the Job completes only when the upload exits 0. Each such completion is recorded
    (:func:`children.compile_record`), so a model with the same key, or one deleted and
    created again, starts from the artefact with no Job. A Job that failed is never recorded.
    While another model's Job compiles the key, the model waits for it; the Job is named
    after the artefact, so two models reconciled at once cannot start two.

    Only what the operator made counts (core/proof.py): a record or a completed Job without
    the operator's proof is no cache hit, and a Job under the key's name without it is
    reported (CompileJobUnverified), never waited for, and never written over."""

    job: dict[str, Any] | None  # the compile Job this model creates (or already runs)
    condition: api.Condition
    record: dict[str, Any] | None  # the record to write, once the key's Job completed
    hit: bool | None
    changed: list[str]

    @staticmethod
    def of(m: Model, o: Observed) -> _Compile:
        body = children.compile_job(m)
        if body is None:
            return _Compile(None, status.compiled_condition(False, None, None, ""), None, None, [])
        name, uri, key = Obj(body).name, children.compiled_uri(m), children.compile_hash(m)
        changed = _changed_compile_inputs(o, name, children.compile_inputs(m), uri)
        # The Jobs of this artefact: under the key's name, or (made by an operator that named
        # them after their model) under another; this model's own first, as the overlay has them.
        jobs = {Obj(j).name: j for j in [*o.compile_jobs.get(uri, ()), *o.jobs] if children.job_output_uri(j) == uri}
        made = {n: j for n, j in jobs.items() if o.prover.made_job(j, uri)}
        live = jobs.get(name)
        ours = live is not None and name in made and holder_of(live, Obj(o.model).uid, Obj(o.model).name) is None
        complete = sorted((j for j in made.values() if job_state(j).phase == "Complete"), key=lambda j: j is not live)
        known = _trusted_record(o.compile_records.get(uri), uri, o.prover)
        record = children.compile_record(m, complete[0], o.prover) if complete and known is None else None
        if ours:
            failure = status.compile_failure(name, o.pods)
            cond = status.compiled_condition(True, name, live, uri, changed, failure, key=key)
            return _Compile(body, cond, record, False, changed)
        hit = _record_data(known) if known is not None else record["data"] if record is not None else None
        if hit is not None:
            return _Compile(None, status.compiled_condition(True, None, None, uri, key=key, hit=hit), record, True, changed)
        if live is not None and name not in made and is_compile_job_of_ours(live):
            # Looks like the operator's, but it cannot show it made it: someone with rights in
            # the namespace did, or the operator stopped between its create and its proof.
            cond = status.compiled_condition(True, name, live, uri, changed, key=key, unverified=True)
            return _Compile(None, cond, None, None, changed)
        if live is not None and is_compile_job_of_ours(live):
            # Another model's Job compiles this key (or failed to): this one waits for it.
            by = (Obj(live).controller or {}).get("name", "")
            cond = status.compiled_condition(True, name, live, uri, changed, key=key, compiled_by=by)
            return _Compile(None, cond, None, None, changed)
        cond = status.compiled_condition(True, name, None, uri, changed, key=key)
        return _Compile(body, cond, None, False, changed)


def _plan_configmaps_in_use(o: Observed) -> set[str]:
    """Plan ConfigMaps that a running pod, an unfinished Job or the Deployment of the
    model still mounts (a finished pod or Job never reads its plan again)."""
    templates = [Obj(o.deployment).spec.get("template")]
    templates += [Obj(j).spec.get("template") for j in o.jobs if not job_state(j).finished]
    volumes = [v for t in templates for v in Obj(t).spec.get("volumes") or ()]
    running = [p for p in map(Obj, o.pods) if p.status.get("phase") not in ("Succeeded", "Failed")]
    volumes += [v for p in running for v in p.spec.get("volumes") or ()]
    return {v["configMap"]["name"] for v in volumes if isinstance(v.get("configMap"), dict) and "name" in v["configMap"]}


def _newest_earlier_success(o: Observed, current: str | None) -> Obj | None:
    """The newest compile Job of an earlier plan that the operator made and that succeeded, if any."""
    succeeded = [
        j for j in map(Obj, o.jobs)
        if j.name != current and job_state(j.raw).phase == "Complete" and o.prover.made_job(j.raw, children.job_output_uri(j.raw))
    ]  # fmt: skip
    return max(succeeded, key=lambda j: j.created, default=None)


def _superseded_jobs(o: Observed, current: str | None) -> list[str]:
    """Compile Jobs of earlier plans, less the newest that succeeded (kept for a rollback to reuse)."""
    kept = _newest_earlier_success(o, current)
    keep = {current, kept.name if kept is not None else None}
    return [name for name in (Obj(j).name for j in o.jobs) if name is not None and name not in keep]


def _changed_compile_inputs(o: Observed, current: str | None, inputs: dict[str, Any], uri: str) -> list[str]:
    """The compile inputs that differ from those of the model's previous artefact: the newest
    earlier compile Job of the model that succeeded, else the record of the artefact its
    Deployment serves now (a model that started from a cache hit ran no Job)."""
    earlier = _newest_earlier_success(o, current)
    if earlier is not None:
        said = earlier.annotations.get(COMPILE_INPUTS_ANNOTATION, "")
    else:
        served = children.served_uri(o.deployment)
        record = _trusted_record(o.compile_records.get(served), served, o.prover) if served and served != uri else None
        said = Obj(record).annotations.get(COMPILE_INPUTS_ANNOTATION, "")
    try:
        before = json.loads(said)
    except ValueError:
        return []  # nothing earlier, or a Job of an operator that did not record its inputs
    if not isinstance(before, dict):
        return []
    return sorted(k for k in inputs.keys() | before.keys() if inputs.get(k) != before.get(k))


def _available(deployment: Mapping[str, Any] | None) -> int:
    available = Obj(deployment).status.get("availableReplicas", 0)
    return available if isinstance(available, int) else 0


@dataclass(frozen=True)
class _ScaleToZero:
    """What a model that scales to zero adds: the replicas Service, the holder, where the
    model's Service points, and the replicas its Deployment runs now.

    The model's Service points at the replicas while one is available and the model wants
    one, else at the holder once the holder is available (never at nothing). Going to zero,
    the Service moves to the holder first, and the last replica stops only once the Service
    is seen there: a request in between reaches the holder or the draining replica, never a
    Service without endpoints. Without an available holder the model keeps a replica."""

    service: dict[str, Any]
    children: list[dict[str, Any]]
    deployment_replicas: int

    @staticmethod
    def of(m: Model, o: Observed, replicas: int) -> _ScaleToZero:
        replicas_service = children.replicas_service(m)
        upstream = Obj(o.live("Service", Obj(replicas_service).name)).spec.get("clusterIP")
        # The holder forwards to the replicas Service's address, so it waits for one.
        holder = [children.holder_deployment(m, upstream)] if isinstance(upstream, str) and upstream else []
        holder_up = _available(o.live("Deployment", m.name + children.HOLDER_SUFFIX)) > 0
        warm = replicas > 0 and _available(o.deployment) > 0
        to_holder = holder_up and not warm
        at_holder = Obj(o.service).spec.get("selector") == children.holder_selector(m)
        deployment_replicas = replicas
        if replicas == 0 and not (to_holder and at_holder):
            deployment_replicas = max(Obj(o.deployment).spec.get("replicas") or 0, 1)
        return _ScaleToZero(children.service(m, to_holder), [replicas_service, *holder], deployment_replicas)


def decide(o: Observed, now: str) -> Decision:
    model = Obj(o.model)
    if model.deleting:
        return Decision([], [], None, None)  # going: the garbage collector removes the children
    name, namespace, uid = model.name, model.namespace, model.uid
    previous = model.status

    checked = check_model(name, namespace, o.model.get("spec"), uid=uid or "", operator_image=o.operator_image, allocation=o.allocation)
    if checked.model is None:
        # Invalid (a cluster without the CRD's CEL rules, or a rule CEL cannot express):
        # report it, and leave every child exactly as it is.
        replicas = model.spec.get("replicas", 0)
        basis = ReportBasis(
            valid=False, message="; ".join(str(f) for f in checked.errors), compiled=None,
            replicas=replicas if isinstance(replicas, int) else 0, plan_hash=None,
            plan=_last_plan(previous), selector=previous.get("selector"),
        )  # fmt: skip
        return Decision([], [], basis, status.report(o, now, basis))

    m = checked.model
    compile_ = _Compile.of(m, o)
    compiles = m.spec.compile.image is not None
    job_name = children.compile_job_name(m) if compiles else None
    compiled = compile_.condition

    # The plan ConfigMap and Service always; the compile Job when there is one; the
    # Deployment only once the plan is compiled (else the previous one keeps serving).
    # Autoscaling: the ScaledObject when the operator knows where Prometheus is; the
    # Deployment follows spec.replicas within the range once it exists, else minReplicas.
    scaling = m.spec.autoscaling is not None and bool(o.prometheus.address)
    # A model that scales to zero stays at one replica at least until it has an artefact.
    has_artefact = compiled.status == "True" or o.deployment is not None
    scaled_object = children.scaled_object(m, o.prometheus, has_artefact) if scaling else None
    # While the cluster serves no ScaledObjects (KEDA not installed) none is written.
    scaler = scaled_object if o.scaled_objects_served else None
    live_scaler = o.live(SCALED_OBJECT_KIND, name)
    ours = live_scaler is not None and holder_of(live_scaler, uid, name) is None
    replicas = desired_replicas(m.spec, scaled=scaling and ours, has_artefact=has_artefact)
    zero = _ScaleToZero.of(m, o, replicas) if scaling and scales_to_zero(m.spec) else None
    deployment_replicas = zero.deployment_replicas if zero else replicas

    desired = [children.plan_configmap(m), zero.service if zero else children.service(m)]
    if compile_.job is not None:
        desired.append(compile_.job)
    claim_template = children.resource_claim_template(m)
    if claim_template is not None:
        desired.append(claim_template)  # before the Deployment whose pods claim from it
    if compiled.status == "True":
        desired.append(children.serving_deployment(m, deployment_replicas))
    if scaler is not None:
        desired.append(scaler)
    if zero is not None:
        desired += zero.children
    else:
        # A model that no longer scales to zero: its holder is parked at no replica, not
        # deleted (the operator may delete no Deployment); its owner's deletion removes it.
        parked = o.live("Deployment", (name or "") + children.HOLDER_SUFFIX)
        if parked is not None and holder_of(parked, uid, name) is None and Obj(parked).spec.get("replicas") != 0:
            desired.append(children.parked_holder(m))

    to_apply: list[dict[str, Any]] = []
    conflicts: list[Conflict] = []
    for body in desired:
        kind, child = body["kind"], Obj(body).name
        live = o.live(kind, child)
        if live is None:
            to_apply.append(body)
        elif (holder := holder_of(live, uid, name)) is not None:
            conflicts.append(Conflict(kind, child or "", holder))
        elif kind in ("Job", "ConfigMap", "ResourceClaimTemplate"):
            continue  # immutable and named after their content: found by name, never rewritten
        elif not applied(body, live):
            to_apply.append(body)
    conflicts = list(dict.fromkeys(conflicts))

    in_use = _plan_configmaps_in_use(o) | {children.plan_configmap_name(m)}
    to_delete = [("Job", j) for j in _superseded_jobs(o, job_name)]
    plans = [c for c in map(Obj, o.configmaps) if c.labels.get(COMPONENT_LABEL) != COMPILE_RECORD_COMPONENT]
    to_delete += [("ConfigMap", c.name) for c in plans if c.name is not None and c.name not in in_use]
    # A claim template only makes new claims: once the Deployment's pods no longer name it, it
    # can go (the claims already made from it belong to their pods).
    named = {c.get("resourceClaimTemplateName") for c in Obj(Obj(o.deployment).spec.get("template")).spec.get("resourceClaims") or ()}
    keep = named | {Obj(claim_template).name}
    to_delete += [("ResourceClaimTemplate", t.name) for t in map(Obj, o.claim_templates) if t.name and t.name not in keep]
    if ours and scaled_object is None:
        to_delete.append((SCALED_OBJECT_KIND, name or ""))  # autoscaling was turned off

    autoscaling = None
    if m.spec.autoscaling is not None:
        autoscaling = api.AutoscalingStatus(
            min_replicas=m.spec.autoscaling.min_replicas, max_replicas=m.spec.autoscaling.max_replicas,
            target_in_flight=target_in_flight(m.spec), desired_replicas=deployment_replicas,
            query=in_flight_query(m.spec, namespace or "", name or "", o.prometheus) if scaling else None,
        )  # fmt: skip

    basis = ReportBasis(
        valid=True, message="", compiled=compiled, replicas=deployment_replicas, plan_hash=children.plan_hash(m.plan),
        conflicts=tuple(conflicts), plan=m.plan, selector=children.selector_string(m),
        compile_job=job_name if compiles and not compile_.hit else None,
        compiled_uri=children.compiled_uri(m) if compiles else None,
        compile_key=children.compile_hash(m) if compiles else None, compile_cache_hit=compile_.hit,
        changed_compile_inputs=tuple(compile_.changed),
        scaling_spec=m.spec if m.spec.autoscaling is not None else None, autoscaling=autoscaling,
    )  # fmt: skip
    return Decision(to_apply, to_delete, basis, status.report(o, now, basis), compile_.record)


def _last_plan(previous: Mapping[str, Any]) -> api.Plan | None:
    """The plan the status showed before the spec became invalid, if it still reads as one
    (a plan written by an older operator may lack fields this one requires)."""
    try:
        return api.Plan.model_validate(previous["plan"]) if previous.get("plan") else None
    except ValueError:
        return None
