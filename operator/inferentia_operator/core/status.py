"""Status from what the operator observed: pure functions, no API calls.

Conditions follow the Kubernetes conventions (metav1.Condition) that kubectl wait,
Helm, Argo CD and Flux's kstatus read: ``Ready=True`` means the current
generation is fully rolled out and available, and ``observedGeneration`` says
which generation the status describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .names import PLAN_HASH_ANNOTATION

# Flux's kstatus reads only observedGeneration and the "abnormal-true" Reconciling and
# Stalled conditions of a custom resource (anything else counts as Current), so they
# restate Progressing and the failures in its terms.
STALLED_REASONS = {"InvalidSpec", "CompileFailed", "NameConflict", "FailedCreate"}
WARNING_REASONS = {"InvalidSpec", "CompileFailed", "Unschedulable", "NameConflict", "ApplyFailed", "FailedCreate"}
# Progressing and Available restate Ready in finer steps; events for them would be noise.
EVENT_TYPES = ("Validated", "Compiled", "Scheduled", "Ready")
# Normal events only where something happened that a person watching `kubectl describe`
# would want told: the model became Ready (or stopped being), a compile Job finished.
# The routine steps in between (validated, scheduled) are in the conditions.
NORMAL_EVENTS = {("Ready", "Ready"), ("Compiled", "Compiled")}


@dataclass
class Observed:
    """The children as they are now; dicts are the live objects, None when absent."""

    deployment: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Cond:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Blocked:
    """Why the operator could not write a child: NameConflict (someone else's object has
    the name) or ApplyFailed (the API server refused it, with its message)."""

    reason: str
    message: str
    permanent: bool  # retrying the same write cannot help: Stalled=True


def _conditions_of(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def compile_state(job_required: bool, job_name: str | None, job: dict[str, Any] | None, uri: str, changed: list[str] | None = None) -> Cond:
    """The Compiled condition. ``changed``: the compile inputs that differ from the last
    successful compile's, named in the message while a new compile runs."""
    if not job_required:
        return Cond("Compiled", "True", "CompiledAtLoad", "no compile image: the serving pods compile at load time from NEURON_CC_FLAGS")
    conds = _conditions_of(job)
    if conds.get("Complete", {}).get("status") == "True":
        return Cond(
            "Compiled", "True", "Compiled",
            f"Job {job_name} compiled the model to {uri}; the serving pods fetch it and load it without compiling",
        )  # fmt: skip
    failed = conds.get("Failed", {})
    if failed.get("status") == "True":
        why = ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x)
        return Cond("Compiled", "False", "CompileFailed", f"Job {job_name} failed: {why or 'no reason given'}")
    why = f" ({', '.join(changed)} changed since the last compile)" if changed else ""
    return Cond("Compiled", "False", "Compiling", f"Job {job_name} is compiling the model for the new plan{why}")


def _unschedulable(pods: list[dict[str, Any]]) -> list[str]:
    messages = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        scheduled = _conditions_of(pod).get("PodScheduled", {})
        if scheduled.get("status") == "False":
            messages.append(scheduled.get("message") or scheduled.get("reason") or "unschedulable")
    return messages


@dataclass(frozen=True)
class Rollout:
    desired: int
    current: bool  # the Deployment carries the current plan
    complete: bool
    replicas: int
    ready: int
    updated: int
    available: int


def rollout_of(deployment: dict[str, Any] | None, desired_replicas: int, plan_hash: str | None) -> Rollout:
    if deployment is None:
        return Rollout(desired_replicas, False, False, 0, 0, 0, 0)
    meta, spec, status = deployment.get("metadata") or {}, deployment.get("spec") or {}, deployment.get("status") or {}
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    current = plan_hash is not None and annotations.get(PLAN_HASH_ANNOTATION) == plan_hash
    replicas, ready = status.get("replicas", 0), status.get("readyReplicas", 0)
    updated, available = status.get("updatedReplicas", 0), status.get("availableReplicas", 0)
    complete = (
        current
        and status.get("observedGeneration", 0) >= meta.get("generation", 0)
        and spec.get("replicas") == desired_replicas
        and updated == desired_replicas
        and replicas == desired_replicas  # no pod of an older plan is left
        and available == desired_replicas
    )
    return Rollout(desired_replicas, current, complete, replicas, ready, updated if current else 0, available)


def conditions(
    *,
    valid: bool,
    invalid_message: str,
    compiled: Cond | None,
    rollout: Rollout,
    observed: Observed,
    blocked: Blocked | None = None,
) -> list[Cond]:
    """The conditions, in a fixed order."""
    if not valid:
        validated = Cond("Validated", "False", "InvalidSpec", invalid_message)
    else:
        validated = Cond("Validated", "True", "Valid", "the spec satisfies every rule")

    unschedulable = _unschedulable(observed.pods)
    if unschedulable:
        n = len(unschedulable)
        scheduled = Cond("Scheduled", "False", "Unschedulable", f"{n} pod{'s' if n > 1 else ''} cannot be placed: {unschedulable[0]}")
    elif rollout.desired == 0:
        scheduled = Cond("Scheduled", "True", "NoReplicas", "spec.replicas is 0")
    elif observed.pods and all(_conditions_of(p).get("PodScheduled", {}).get("status") == "True" for p in observed.pods):
        scheduled = Cond("Scheduled", "True", "Scheduled", f"{len(observed.pods)} pods placed on Neuron nodes")
    else:
        scheduled = Cond("Scheduled", "Unknown", "Pending", "no serving pod has been placed yet")

    dep_conditions = _conditions_of(observed.deployment)
    dep_available = dep_conditions.get("Available", {})
    # The ReplicaSet could not create pods (a Pod Security refusal, a quota, a missing
    # ServiceAccount): the Deployment controller restates it as ReplicaFailure.
    replica_failure = dep_conditions.get("ReplicaFailure", {})
    failed_create = replica_failure.get("status") == "True"
    if observed.deployment is None:
        available = Cond("Available", "False", "NoDeployment", "the serving Deployment does not exist yet")
    elif dep_available.get("status") == "True" and (rollout.available > 0 or rollout.desired == 0):
        # The Deployment counts itself available within maxUnavailable, which with one
        # replica and the default maxUnavailable 1 is true of zero pods: not here.
        available = Cond("Available", "True", "MinimumReplicasAvailable", f"{rollout.available} of {rollout.desired} replicas available")
    else:
        available = Cond("Available", "False", "MinimumReplicasUnavailable", f"{rollout.available} of {rollout.desired} replicas available")

    compile_cond = compiled or Cond("Compiled", "Unknown", "InvalidSpec", "no plan to compile while the spec is invalid")
    if not valid:
        progressing = Cond("Progressing", "False", "InvalidSpec", "fix the spec; the running Deployment is left as it was")
        ready = Cond("Ready", "False", "InvalidSpec", invalid_message)
    elif blocked is not None:
        progressing = Cond("Progressing", "False" if blocked.permanent else "True", blocked.reason, blocked.message)
        ready = Cond("Ready", "False", blocked.reason, blocked.message)
    elif failed_create and not rollout.complete:
        message = f"pods cannot be created: {replica_failure.get('message') or replica_failure.get('reason') or 'no reason given'}"
        progressing = Cond("Progressing", "False", "FailedCreate", message)
        ready = Cond("Ready", "False", "FailedCreate", message)
    elif compile_cond.reason == "CompileFailed":
        progressing = Cond("Progressing", "False", "CompileFailed", compile_cond.message + "; the previous Deployment keeps serving")
        ready = Cond("Ready", "False", "CompileFailed", compile_cond.message)
    elif compile_cond.status != "True":
        progressing = Cond("Progressing", "True", "Compiling", compile_cond.message)
        ready = Cond("Ready", "False", "Compiling", compile_cond.message)
    elif rollout.complete:
        progressing = Cond("Progressing", "False", "RolloutComplete", f"{rollout.desired} replicas run the current plan")
        ready = Cond("Ready", "True", "Ready", f"{rollout.ready} of {rollout.desired} replicas ready with the current plan")
    elif unschedulable:
        progressing = Cond("Progressing", "True", "WaitingForCapacity", scheduled.message)
        ready = Cond("Ready", "False", "Unschedulable", scheduled.message)
    else:
        message = f"{rollout.updated} of {rollout.desired} replicas updated, {rollout.available} available"
        progressing = Cond("Progressing", "True", "RollingOut", message)
        ready = Cond("Ready", "False", "RollingOut", message)
    stalled = ready.reason in STALLED_REASONS or (blocked is not None and blocked.permanent and ready.reason == blocked.reason)
    reconciling = Cond("Reconciling", "True" if progressing.status == "True" else "False", progressing.reason, progressing.message)
    stalled_cond = Cond("Stalled", "True" if stalled else "False", ready.reason if stalled else "NotStalled", ready.message if stalled else "")
    return [validated, compile_cond, scheduled, progressing, available, ready, reconciling, stalled_cond]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_times(new: list[Cond], previous: list[dict[str, Any]], generation: int, at: str) -> list[dict[str, Any]]:
    """metav1.Condition dicts; a condition whose status did not change keeps its transition time."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for c in new:
        old = before.get(c.type) or {}
        changed = old.get("status") != c.status
        out.append(
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": at if changed or "lastTransitionTime" not in old else old["lastTransitionTime"],
                "observedGeneration": generation,
            }
        )
    return out


def transitions(new: list[dict[str, Any]], previous: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for every condition whose status or reason changed."""
    before = {c.get("type"): c for c in previous or []}
    events = []
    for c in new:
        old = before.get(c["type"]) or {}
        if c["type"] in EVENT_TYPES and (old.get("status"), old.get("reason")) != (c["status"], c["reason"]):
            if c["reason"] in WARNING_REASONS:
                events.append(("Warning", c["reason"], f"{c['type']}={c['status']}: {c['message']}"))
            elif (c["type"], c["reason"]) in NORMAL_EVENTS or (c["type"] == "Ready" and old.get("reason") == "Ready"):
                events.append(("Normal", c["reason"], f"{c['type']}={c['status']}: {c['message']}"))
    return events
