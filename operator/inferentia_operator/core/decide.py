"""The reconcile's decision: from what the caches hold to what to write. Pure, no API client.

``decide(observed, now)`` returns the children to apply, the objects to delete and the
status to report. Every branch of a reconcile is here: the invalid spec (leave the
running Deployment alone), the compile gate (hold the rollout until the compile Job of
the current plan completed), objects that belong to someone else (write nothing, report
NameConflict), writes the API server refused (report its message), and the clean-up of
superseded plans (only when no pod, Job or Deployment still uses them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import api, children
from . import status as conditions
from .api import InferentiaModelStatus
from .children import Model
from .drift import applied
from .findings import errors
from .names import COMPILE_INPUTS_ANNOTATION, COMPONENT_LABEL, DEFAULT_BATCHING_IMAGE, FIELD_MANAGER, MANAGED_BY_LABEL, MODEL_LABEL
from .parsing import parse_spec
from .planner import plan as make_plan
from .rules import check_name

# API status codes for which retrying the same write cannot help.
PERMANENT_CODES = {400, 403, 404, 405, 409, 410, 413, 415, 422}


@dataclass(frozen=True)
class WriteFailure:
    """A write the API server refused, with its own words."""

    kind: str
    name: str
    code: int
    message: str

    @property
    def permanent(self) -> bool:
        return self.code in PERMANENT_CODES

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.code} {self.message}"


@dataclass(frozen=True)
class Conflict:
    """A child's name is taken by an object the model does not own."""

    kind: str
    name: str
    holder: str  # who has it, as a phrase: "controlled by Deployment web", "not managed by this model"

    def __str__(self) -> str:
        return f"{self.kind} {self.name} already exists and is {self.holder}; the operator leaves it alone (rename the model or remove that object)"


@dataclass
class Observed:
    """One model and its children as the caches hold them (None or empty when absent)."""

    model: dict[str, Any]
    deployment: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    configmaps: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # What the last attempt to write found; empty before the act step.
    failures: list[WriteFailure] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    # Configuration, not state: the operator's --batching-image.
    batching_image: str = DEFAULT_BATCHING_IMAGE

    def live(self, kind: str, name: str) -> dict[str, Any] | None:
        if kind == "Deployment":
            return self.deployment if _name(self.deployment) == name else None
        if kind == "Service":
            return self.service if _name(self.service) == name else None
        pool = self.configmaps if kind == "ConfigMap" else self.jobs if kind == "Job" else []
        return next((o for o in pool if _name(o) == name), None)


@dataclass(frozen=True)
class Decision:
    apply: list[dict[str, Any]]  # bodies to server-side apply, in order
    delete: list[tuple[str, str]]  # (kind, name)
    status: InferentiaModelStatus | None  # None: the model is going away, report nothing


def _name(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("name")


def _meta(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("metadata") or {}


def holder_of(live: dict[str, Any], uid: str, model: str) -> str | None:
    """Why ``live`` is not this model's to write, or None when it is: another controller
    owns it, or it has no controller and does not carry this model's labels either (an
    object of someone else's with the child's name). A child of this model whose owner
    reference someone removed still has its labels, and is taken back."""
    meta = _meta(live)
    controller = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if controller is None:
        labels = meta.get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == FIELD_MANAGER and labels.get(MODEL_LABEL) == model:
            return None
        return "not managed by this model (it has no controller)"
    if controller.get("uid") != uid:
        return f"controlled by {controller.get('kind')} {controller.get('name')}"
    return None


def _finished(job: dict[str, Any]) -> bool:
    conds = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)


def _plan_configmaps_in_use(o: Observed) -> set[str]:
    """Plan ConfigMaps that a running pod, an unfinished Job or the Deployment of the
    model still mounts (a finished pod or Job never reads its plan again)."""
    templates = [((o.deployment or {}).get("spec") or {}).get("template") or {}]
    templates += [((j.get("spec") or {}).get("template") or {}) for j in o.jobs if not _finished(j)]
    volumes = [v for t in templates for v in ((t.get("spec") or {}).get("volumes") or [])]
    running = [p for p in o.pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    volumes += [v for p in running for v in ((p.get("spec") or {}).get("volumes") or [])]
    return {v["configMap"]["name"] for v in volumes if isinstance(v.get("configMap"), dict) and "name" in v["configMap"]}


def _job_succeeded(job: dict[str, Any]) -> bool:
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or [])


def _newest_earlier_success(o: Observed, current: str | None) -> dict[str, Any] | None:
    """The newest compile Job of an earlier plan that succeeded, if any."""
    succeeded = [j for j in o.jobs if _name(j) != current and _job_succeeded(j)]
    return max(succeeded, key=lambda j: _meta(j).get("creationTimestamp") or "", default=None)


def _superseded_jobs(o: Observed, current: str | None) -> list[str]:
    """Compile Jobs of earlier plans, less the newest that succeeded (kept for a rollback to reuse)."""
    kept = _newest_earlier_success(o, current)
    keep = {_name(kept)} if kept is not None else set()
    return [_name(j) for j in o.jobs if _name(j) != current and _name(j) not in keep]  # type: ignore[misc]


def _changed_compile_inputs(o: Observed, current: str | None, inputs: dict[str, Any]) -> list[str]:
    """The compile inputs that differ from those of the newest earlier compile that succeeded."""
    earlier = _newest_earlier_success(o, current)
    if earlier is None:
        return []
    try:
        before = json.loads((_meta(earlier).get("annotations") or {}).get(COMPILE_INPUTS_ANNOTATION, ""))
    except ValueError:
        return []  # a Job of an operator that did not record its inputs
    if not isinstance(before, dict):
        return []
    return sorted(k for k in inputs.keys() | before.keys() if inputs.get(k) != before.get(k))


def _counts(rollout: conditions.Rollout) -> dict[str, int]:
    return {"replicas": rollout.replicas, "ready_replicas": rollout.ready, "updated_replicas": rollout.updated}


def _blocked(conflicts: list[Conflict], failures: list[WriteFailure]) -> conditions.Blocked | None:
    if conflicts:
        return conditions.Blocked("NameConflict", "; ".join(str(c) for c in conflicts), permanent=True)
    if failures:
        return conditions.Blocked(
            "ApplyFailed",
            "the API server refused " + "; ".join(str(f) for f in failures),
            permanent=all(f.permanent for f in failures),
        )
    return None


def _status(
    o: Observed,
    now: str,
    *,
    valid: bool,
    message: str,
    compiled: conditions.Cond | None,
    rollout: conditions.Rollout,
    extra: dict[str, Any],
    conflicts: list[Conflict],
) -> InferentiaModelStatus:
    meta = o.model["metadata"]
    generation = meta.get("generation", 1)
    previous = (o.model.get("status") or {}).get("conditions") or []
    view = conditions.Observed(deployment=o.deployment, pods=[p for p in o.pods if _is_serving(p)])
    conds = conditions.conditions(
        valid=valid, invalid_message=message, compiled=compiled, rollout=rollout, observed=view,
        blocked=_blocked(conflicts, o.failures),
    )
    stamped = conditions.with_times(conds, previous, generation, now)
    return InferentiaModelStatus(
        observed_generation=generation,
        conditions=[api.Condition.model_validate(c) for c in stamped],
        **_counts(rollout),
        **extra,
    )


def _is_serving(pod: dict[str, Any]) -> bool:
    return (_meta(pod).get("labels") or {}).get(COMPONENT_LABEL) == "serving"


def decide(o: Observed, now: str) -> Decision:
    meta = o.model["metadata"]
    if meta.get("deletionTimestamp"):
        return Decision([], [], None)  # going: the garbage collector removes the children
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    previous = o.model.get("status") or {}

    spec, findings = parse_spec(o.model.get("spec"))
    problems = check_name(name) + errors(findings)
    if spec is not None and not problems:
        m = Model(name, namespace, uid, spec, make_plan(spec), o.batching_image)
        problems = children.plan_size_findings(m)
    if spec is None or problems:
        # Invalid (a cluster without the CRD's CEL rules, or a rule CEL cannot express):
        # report it, and leave every child exactly as it is.
        replicas = (o.model.get("spec") or {}).get("replicas", 0)
        rollout = conditions.rollout_of(o.deployment, replicas if isinstance(replicas, int) else 0, None)
        kept = {"plan": _last_plan(previous), "selector": previous.get("selector")}
        status = _status(
            o, now, valid=False, message="; ".join(str(f) for f in problems), compiled=None, rollout=rollout,
            extra={k: v for k, v in kept.items() if v is not None}, conflicts=list(o.conflicts),
        )  # fmt: skip
        return Decision([], [], status)

    plan = m.plan
    job_body = children.compile_job(m)
    job_name = _name(job_body)
    live_job = o.live("Job", job_name) if job_name else None
    changed = _changed_compile_inputs(o, job_name, children.compile_inputs(m)) if job_body is not None else None
    compiled = conditions.compile_state(job_body is not None, job_name, live_job, children.compiled_uri(m), changed)

    # The plan ConfigMap and Service always; the compile Job when there is one; the
    # Deployment only once the plan is compiled (else the previous one keeps serving).
    desired = [children.plan_configmap(m), children.service(m)]
    if job_body is not None:
        desired.append(job_body)
    if compiled.status == "True":
        desired.append(children.serving_deployment(m))

    to_apply: list[dict[str, Any]] = []
    conflicts = list(o.conflicts)
    for body in desired:
        live = o.live(body["kind"], _name(body))  # type: ignore[arg-type]
        if live is None:
            to_apply.append(body)
        elif (holder := holder_of(live, uid, name)) is not None:
            conflicts.append(Conflict(body["kind"], _name(body), holder))  # type: ignore[arg-type]
        elif body["kind"] in ("Job", "ConfigMap"):
            continue  # immutable and named after their content: found by name, never rewritten
        elif not applied(body, live):
            to_apply.append(body)
    conflicts = list(dict.fromkeys(conflicts))

    current_cm = children.plan_configmap_name(m)
    in_use = _plan_configmaps_in_use(o) | {current_cm}
    stale_jobs = _superseded_jobs(o, job_name)
    to_delete = [("Job", j) for j in stale_jobs]
    to_delete += [("ConfigMap", _name(c)) for c in o.configmaps if _name(c) not in in_use]  # type: ignore[misc]

    rollout = conditions.rollout_of(o.deployment, spec.replicas, children.plan_hash(plan))
    extra = {
        "plan": plan,
        "selector": children.selector_string(m),
        "compile_job": job_name,
        "compiled_uri": children.compiled_uri(m) if job_body else None,
    }
    status = _status(o, now, valid=True, message="", compiled=compiled, rollout=rollout, extra=extra, conflicts=conflicts)
    return Decision(to_apply, to_delete, status)


def _last_plan(previous: dict[str, Any]) -> api.Plan | None:
    """The plan the status showed before the spec became invalid, if it still reads as one
    (a plan written by an older operator may lack fields this one requires)."""
    try:
        return api.Plan.model_validate(previous["plan"]) if previous.get("plan") else None
    except ValueError:
        return None


def status_document(status: InferentiaModelStatus) -> dict[str, Any]:
    """The status as the API server stores it: camelCase, absent fields left out."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def status_patch(previous: dict[str, Any], status: InferentiaModelStatus) -> dict[str, Any] | None:
    """The merge patch that makes ``previous`` the new status, or None when nothing changed.

    Keys the operator no longer reports are nulled; ``status.kopf`` (kopf's own
    bookkeeping from earlier versions of the operator) is left to kopf."""
    wanted = status_document(status)
    current = {k: v for k, v in previous.items() if k != "kopf"}
    if current == wanted:
        return None
    return {**{k: None for k in current if k not in wanted}, **wanted}

