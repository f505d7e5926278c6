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
from .names import COMPILE_INPUTS_ANNOTATION, FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_LABEL
from .objects import Obj
from .status import Conflict, Observed, Report, ReportBasis, job_state


@dataclass(frozen=True)
class Decision:
    apply: list[dict[str, Any]]  # bodies to server-side apply, in order
    delete: list[tuple[str, str]]  # (kind, name)
    basis: ReportBasis | None  # None: the model is going away, report nothing
    report: Report | None  # the status from basis, before any write


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
    """The newest compile Job of an earlier plan that succeeded, if any."""
    succeeded = [j for j in map(Obj, o.jobs) if j.name != current and job_state(j.raw).phase == "Complete"]
    return max(succeeded, key=lambda j: j.created, default=None)


def _superseded_jobs(o: Observed, current: str | None) -> list[str]:
    """Compile Jobs of earlier plans, less the newest that succeeded (kept for a rollback to reuse)."""
    kept = _newest_earlier_success(o, current)
    keep = {current, kept.name if kept is not None else None}
    return [name for name in (Obj(j).name for j in o.jobs) if name is not None and name not in keep]


def _changed_compile_inputs(o: Observed, current: str | None, inputs: dict[str, Any]) -> list[str]:
    """The compile inputs that differ from those of the newest earlier compile that succeeded."""
    earlier = _newest_earlier_success(o, current)
    if earlier is None:
        return []
    try:
        before = json.loads(earlier.annotations.get(COMPILE_INPUTS_ANNOTATION, ""))
    except ValueError:
        return []  # a Job of an operator that did not record its inputs
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

    checked = check_model(name, namespace, o.model.get("spec"), uid=uid or "", operator_image=o.operator_image)
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
    job_body = children.compile_job(m)
    job_name = Obj(job_body).name
    live_job = o.live("Job", job_name) if job_name else None
    changed = _changed_compile_inputs(o, job_name, children.compile_inputs(m)) if job_body is not None else None
    failure = status.compile_failure(job_name, o.pods) if job_name else ""
    compiled = status.compiled_condition(job_body is not None, job_name, live_job, children.compiled_uri(m), changed, failure)

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
    if job_body is not None:
        desired.append(job_body)
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
        elif kind in ("Job", "ConfigMap"):
            continue  # immutable and named after their content: found by name, never rewritten
        elif not applied(body, live):
            to_apply.append(body)
    conflicts = list(dict.fromkeys(conflicts))

    in_use = _plan_configmaps_in_use(o) | {children.plan_configmap_name(m)}
    to_delete = [("Job", j) for j in _superseded_jobs(o, job_name)]
    to_delete += [("ConfigMap", c) for c in (Obj(c).name for c in o.configmaps) if c is not None and c not in in_use]
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
        conflicts=tuple(conflicts), plan=m.plan, selector=children.selector_string(m), compile_job=job_name,
        compiled_uri=children.compiled_uri(m) if job_body else None,
        scaling_spec=m.spec if m.spec.autoscaling is not None else None, autoscaling=autoscaling,
    )  # fmt: skip
    return Decision(to_apply, to_delete, basis, status.report(o, now, basis))


def _last_plan(previous: Mapping[str, Any]) -> api.Plan | None:
    """The plan the status showed before the spec became invalid, if it still reads as one
    (a plan written by an older operator may lack fields this one requires)."""
    try:
        return api.Plan.model_validate(previous["plan"]) if previous.get("plan") else None
    except ValueError:
        return None
