"""A model's status, from what a decision concluded: pure functions, no API calls.

The report sits above the features, as core/decide.py does: from the facts each part
concluded (:class:`ReportBasis`) and what was observed (core/observed.py) it says the
conditions, their transition times, the status document, when to write it, and the events,
which follow from the condition transitions. No feature imports this module.

Conditions follow the Kubernetes conventions (metav1.Condition) that kubectl wait,
Helm, Argo CD and Flux's kstatus read: ``Ready=True`` means the current generation is
fully rolled out and available, and ``observedGeneration`` says which generation the
status describes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from . import api
from .autoscaling import NOT_SERVED, SCALED_OBJECT_KIND, Engine, pools_condition, target_in_flight
from .autoscaling import condition as autoscaling_condition
from .compile.facts import CompileFacts
from .conditions import cond
from .device_faults.part import DEVICE_FAULT, DEVICE_FAULT_REASON
from .fill_ahead.part import FILLED_AHEAD, fill_ahead_said
from .names import GROUP_KIND, INFERENCE_POOL_KIND
from .objects import Obj
from .observed import (
    Blocked,
    Conflict,
    Observed,
    Rollout,
    WriteFailure,
    blocked_by,
    groups_unserved,
    placement_of,
    pod_counts,
    rollout_of,
    rollout_of_groups,
    unready_because,
)
from .routing.part import RoutingFacts
from .routing.pool import EPP_SUFFIX, routing_child, routing_condition
from .scaling.part import ScalingFacts
from .serving.part import ServingFacts, pools_rollout

# Flux's kstatus reads only observedGeneration and the "abnormal-true" Reconciling and
# Stalled conditions of a custom resource (anything else counts as Current), so they
# restate Progressing and the failures in its terms.
STALLED_REASONS = {"InvalidSpec", "CompileFailed", "CompileJobUnverified", "NameConflict", "FailedCreate", "ProgressDeadlineExceeded"}
WARNING_REASONS = {
    "InvalidSpec",
    "FillFailed",
    "CompileFailed",
    "CompileJobUnverified",
    "Unschedulable",
    "NameConflict",
    "ApplyFailed",
    "FailedCreate",
    "ProgressDeadlineExceeded",
    "ReplicasUnavailable",
    # The model cannot autoscale: it serves at minReplicas until this is mended.
    "PrometheusNotConfigured",
    "KEDANotInstalled",
    "ScaledObjectRefused",
    "ScaledObjectNotReady",
    "ScaledObjectConflict",
    # The model cannot be routed by queue: it serves through its Service alone meanwhile.
    "InferencePoolNotInstalled",
    "RoutingRefused",
    "RoutingConflict",
    "EndpointPickerUnavailable",
    # A serving pod's node reports a Neuron hardware error.
    DEVICE_FAULT_REASON,
}
# Progressing and Available restate Ready in finer steps; events for them would be noise.
EVENT_TYPES = ("Validated", "Compiled", "Scheduled", "Ready", "Autoscaling", "Routing", DEVICE_FAULT, FILLED_AHEAD)
# Normal events only where something happened that a person watching `kubectl describe`
# would want told: the model became Ready (or stopped being), a compile Job finished.
# The routine steps in between (validated, scheduled) are in the conditions.
NORMAL_EVENTS = {("Ready", "Ready"), ("Compiled", "Compiled")}


# --- conditions ---------------------------------------------------------------------------


def conditions(
    *,
    valid: bool,
    invalid_message: str,
    compiled: api.Condition | None,
    rollout: Rollout,
    pods: Sequence[Mapping[str, Any]],
    blocked: Blocked | None = None,
) -> list[api.Condition]:
    """The conditions, in a fixed order, without their times (:func:`stamped` adds them)."""
    if not valid:
        validated = cond("Validated", "False", "InvalidSpec", invalid_message)
    else:
        validated = cond("Validated", "True", "Valid", "the spec satisfies every rule")

    placement = placement_of(pods)
    if placement.unschedulable:
        n = len(placement.unschedulable)
        message = f"{n} pod{'s' if n > 1 else ''} cannot be placed: {placement.unschedulable[0]}"
        scheduled = cond("Scheduled", "False", "Unschedulable", message)
    elif rollout.desired == 0:
        scheduled = cond("Scheduled", "True", "NoReplicas", "spec.replicas is 0")
    elif placement.pods and placement.placed == placement.pods:
        scheduled = cond("Scheduled", "True", "Scheduled", f"{placement.pods} pods placed on Neuron nodes")
    else:
        scheduled = cond("Scheduled", "Unknown", "Pending", "no serving pod has been placed yet")

    counts = f"{rollout.available} of {rollout.desired} replicas available"
    if not rollout.exists:
        available = cond("Available", "False", "NoDeployment", "the serving Deployment does not exist yet")
    elif rollout.available_condition and (rollout.available > 0 or rollout.desired == 0):
        # The Deployment counts itself available within maxUnavailable, which with one
        # replica and the default maxUnavailable 1 is true of zero pods: not here.
        available = cond("Available", "True", "MinimumReplicasAvailable", counts)
    else:
        available = cond("Available", "False", "MinimumReplicasUnavailable", counts)

    compile_cond = compiled or cond("Compiled", "Unknown", "InvalidSpec", "no plan to compile while the spec is invalid")
    progressing, ready = _progress(valid, invalid_message, compile_cond, rollout, scheduled, blocked, pods)
    stalled = ready.reason in STALLED_REASONS or (blocked is not None and blocked.permanent and ready.reason == blocked.reason)
    reconciling = cond("Reconciling", "True" if progressing.status == "True" else "False", progressing.reason, progressing.message)
    stalled_cond = cond(
        "Stalled", "True" if stalled else "False", ready.reason if stalled else "NotStalled", ready.message if stalled else ""
    )
    return [validated, compile_cond, scheduled, progressing, available, ready, reconciling, stalled_cond]


def _progress(
    valid: bool,
    invalid_message: str,
    compiled: api.Condition,
    rollout: Rollout,
    scheduled: api.Condition,
    blocked: Blocked | None,
    pods: Sequence[Mapping[str, Any]],
) -> tuple[api.Condition, api.Condition]:
    """Progressing and Ready: the first of these that holds decides both."""
    if not valid:
        return (
            cond("Progressing", "False", "InvalidSpec", "fix the spec; the running Deployment is left as it was"),
            cond("Ready", "False", "InvalidSpec", invalid_message),
        )
    if blocked is not None:
        return (
            cond("Progressing", "False" if blocked.permanent else "True", blocked.reason, blocked.message),
            cond("Ready", "False", blocked.reason, blocked.message),
        )
    if rollout.failed_create is not None and not rollout.complete:
        message = f"pods cannot be created: {rollout.failed_create}"
        return cond("Progressing", "False", "FailedCreate", message), cond("Ready", "False", "FailedCreate", message)
    if rollout.stuck is not None and rollout.current and not rollout.complete:
        message = f"the rollout made no progress within the Deployment's deadline: {rollout.stuck}"
        return cond("Progressing", "False", "ProgressDeadlineExceeded", message), cond(
            "Ready", "False", "ProgressDeadlineExceeded", message
        )
    if compiled.reason in ("CompileFailed", "CompileJobUnverified"):
        return (
            cond("Progressing", "False", compiled.reason, compiled.message + "; the previous Deployment keeps serving"),
            cond("Ready", "False", compiled.reason, compiled.message),
        )
    if compiled.reason == "FailedCreate":
        # Nothing changes until someone mends what refuses the pod (the Job controller retries).
        return cond("Progressing", "False", "FailedCreate", compiled.message), cond("Ready", "False", "FailedCreate", compiled.message)
    if compiled.reason == "Unschedulable":
        # A cluster autoscaler may yet add a node that takes it.
        return cond("Progressing", "True", "WaitingForCapacity", compiled.message), cond(
            "Ready", "False", "Unschedulable", compiled.message
        )
    if compiled.status != "True":
        return cond("Progressing", "True", "Compiling", compiled.message), cond("Ready", "False", "Compiling", compiled.message)
    if rollout.complete and rollout.desired == 0:
        # Nothing runs, as asked (spec.replicas 0, or an idle model scaled to zero whose
        # holder starts a replica for the next request).
        return (
            cond("Progressing", "False", "ScaledToZero", "no replica runs"),
            cond("Ready", "True", "ScaledToZero", "no replica runs; with minReplicas 0, a request starts one"),
        )
    if rollout.complete:
        return (
            cond("Progressing", "False", "RolloutComplete", f"{rollout.desired} replicas run the current plan"),
            cond("Ready", "True", "Ready", f"{rollout.ready} of {rollout.desired} replicas ready with the current plan"),
        )
    if scheduled.reason == "Unschedulable":
        return cond("Progressing", "True", "WaitingForCapacity", scheduled.message), cond(
            "Ready", "False", "Unschedulable", scheduled.message
        )
    why = unready_because(pods)
    if rollout.settled:
        # Every pod has the current plan and none is being replaced: not a rollout, but pods
        # that stopped serving (a crash, a node gone NotReady, an artefact that cannot be fetched).
        message = f"{rollout.available} of {rollout.desired} replicas available" + (f"; {why}" if why else "")
        return cond("Progressing", "True", "ReplicasUnavailable", message), cond("Ready", "False", "ReplicasUnavailable", message)
    message = f"{rollout.updated} of {rollout.desired} replicas updated, {rollout.available} available" + (f"; {why}" if why else "")
    return cond("Progressing", "True", "RollingOut", message), cond("Ready", "False", "RollingOut", message)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamped(new: Sequence[api.Condition], previous: Sequence[Mapping[str, Any]], generation: int, at: str) -> list[api.Condition]:
    """The conditions with their times: one whose status did not change keeps its transition time."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in new:
        old = before.get(c.type) or {}
        changed = old.get("status") != c.status
        since = at if changed or "lastTransitionTime" not in old else old["lastTransitionTime"]
        out.append(c.model_copy(update={"last_transition_time": since, "observed_generation": generation}))
    return out


# --- when to write it ---------------------------------------------------------------------

# Ready reasons of a rollout step under way with nothing wrong: the operator has not
# reported yet (the CRD's default status), or the Deployment is rolling out.
IN_FLIGHT = {"Pending", "RollingOut"}
# The longest a rollout's progress is held back: the Deployment's default progress
# deadline, after which the Deployment itself says whether the rollout is stuck.
MAX_HOLD_SECONDS = 600.0
# Conditions of the engines beside the rollout: never held with its progress.
SIDE_CONDITIONS = ("Autoscaling", "Routing", DEVICE_FAULT, FILLED_AHEAD)


def hold_seconds(previous: Mapping[str, Any], new: api.InferentiaModelStatus, held_for: float) -> float:
    """How long to hold back the patch from ``previous`` to ``new``; 0 writes it now.

    Progress within a rollout (pods being created and becoming ready one by one) is held
    until the rollout completes, so that it costs one status write rather than one per
    step: the model already says it is in progress (the CRD's default status, or the
    last status written). Everything else is written at once: completion, a problem, a
    change of step (a compile that finished), and leaving Ready. ``held_for``: how long
    this model's status has been held so far; past MAX_HOLD_SECONDS it is written."""
    new_ready = next((c for c in new.conditions or () if c.type == "Ready"), None)
    old_ready = Obj({"status": previous}).condition("Ready")
    if new_ready is None or new_ready.reason != "RollingOut" or old_ready.get("reason") not in IN_FLIGHT:
        return 0.0
    if old_ready.get("reason") == "RollingOut" and previous.get("observedGeneration") != new.observed_generation:
        return 0.0  # a new generation mid-rollout: say it is seen
    before = {c.get("type"): (c.get("status"), c.get("reason")) for c in previous.get("conditions") or ()}
    after = {c.type: (c.status, c.reason) for c in new.conditions or ()}
    if any(before.get(t) != after.get(t) for t in SIDE_CONDITIONS):
        return 0.0  # what autoscaling, routing or a node's devices met (or no longer meet) is no step of the rollout
    return max(0.0, MAX_HOLD_SECONDS - held_for)


# --- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def events(new: Sequence[api.Condition], previous: Sequence[Mapping[str, Any]]) -> list[Event]:
    """An event for every reported condition whose status or reason changed, and only those."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in new:
        old = before.get(c.type) or {}
        if c.type not in EVENT_TYPES or (old.get("status"), old.get("reason")) == (c.status, c.reason):
            continue
        message = f"{c.type}={c.status}: {c.message}"
        if c.reason in WARNING_REASONS:
            out.append(Event("Warning", c.reason, message))
        elif (c.type, c.reason) in NORMAL_EVENTS or (c.type == "Ready" and old.get("reason") == "Ready"):
            out.append(Event("Normal", c.reason, message))
    return out


# --- the status as reported ---------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    status: api.InferentiaModelStatus
    events: list[Event]  # to post once the status is stored


@dataclass(frozen=True)
class ReportBasis:
    """What a decision concluded about a model, from which its status is reported: once
    before any write, and, where there were writes, once after them with what they found.
    Writing changes the objects and may meet refusals or conflicts; it never changes this."""

    valid: bool
    message: str  # why the spec is invalid, when it is
    serving: ServingFacts
    compile: CompileFacts | None  # None while the spec is invalid
    scaling: ScalingFacts | None  # None without spec.autoscaling or a pool's
    conflicts: tuple[Conflict, ...] = ()  # children someone else holds, found before writing
    routing: RoutingFacts | None = None  # None without spec.routing.inferencePool
    device_fault: api.Condition | None = None  # DeviceFault, while a serving pod's node reports one
    fill_ahead: api.Condition | None = None  # FilledAhead, while the model fills the node cache ahead
    fill_jobs: frozenset[str] = frozenset()  # the fill Jobs the decision writes or deletes


_Found = TypeVar("_Found", Conflict, WriteFailure)


def _split_scaling(found: Sequence[_Found]) -> tuple[list[_Found], list[_Found]]:
    """What concerns the ScaledObject, and the rest."""
    return [f for f in found if f.kind == SCALED_OBJECT_KIND], [f for f in found if f.kind != SCALED_OBJECT_KIND]


def _split_routing(found: Sequence[_Found], model: str) -> tuple[list[_Found], list[_Found]]:
    """What concerns the InferencePool and its endpoint picker, and the rest."""
    mine = [f for f in found if routing_child(f.kind, f.name, model)]
    return mine, [f for f in found if f not in mine]


def _split_fill(found: Sequence[_Found], jobs: frozenset[str]) -> tuple[list[_Found], list[_Found]]:
    """What concerns the fill Jobs (a refused one costs a read of the store, never serving), and the rest."""
    mine = [f for f in found if f.kind == "Job" and f.name in jobs]
    return mine, [f for f in found if f not in mine]


def _autoscaling(
    observed: Observed, scaling: ScalingFacts, replicas: int, found: Sequence[Conflict], failures: Sequence[WriteFailure]
) -> tuple[api.Condition | None, api.AutoscalingStatus]:
    """The Autoscaling condition and status.autoscaling, from what writing the ScaledObject found."""
    model, scaled_object = Obj(observed.model), observed.own(SCALED_OBJECT_KIND)
    refused = (failures[0].code, failures[0].message) if failures else None
    if refused is None and not observed.served(SCALED_OBJECT_KIND):
        refused = (404, NOT_SERVED)
    live = scaled_object if not found else None
    engine = Engine(configured=scaling.configured, live=live, refused=refused, conflict=str(found[0]) if found else None)
    said = autoscaling_condition(scaling.spec, model.name or "", engine)
    # The ScaledObject as it stands after the writes: named once it exists.
    ours = scaled_object is not None and not found and not failures
    assert scaling.spec.autoscaling is not None
    scaling_status = api.AutoscalingStatus(
        min_replicas=scaling.spec.autoscaling.min_replicas, max_replicas=scaling.spec.autoscaling.max_replicas,
        target_in_flight=target_in_flight(scaling.spec), desired_replicas=replicas, query=scaling.query,
        scaled_object=Obj(scaled_object).name if ours else None,
    )  # fmt: skip
    return said, scaling_status


def _pools_autoscaling(
    observed: Observed, scaling: ScalingFacts, pools: api.PoolsStatus | None, found: Sequence[Conflict], failures: Sequence[WriteFailure]
) -> tuple[api.Condition | None, api.PoolsStatus | None]:
    """The Autoscaling condition of a model whose pools scale, and each such pool's status, from
    what writing each pool's ScaledObject found."""
    each, statuses = [], {}
    for pool in scaling.pools:
        mine = [f for f in found if f.name == pool.name]
        refusals = [f for f in failures if f.name == pool.name]
        refused = (refusals[0].code, refusals[0].message) if refusals else None
        if refused is None and not observed.served(SCALED_OBJECT_KIND):
            refused = (404, NOT_SERVED)
        live = observed.live(SCALED_OBJECT_KIND, pool.name)
        engine = Engine(scaling.configured, live if not mine else None, refused, str(mine[0]) if mine else None)
        each.append((pool, engine))
        # The ScaledObject as it stands after the writes: named once it exists.
        statuses[pool.role] = api.PoolAutoscalingStatus(
            min_replicas=pool.autoscaling.min_replicas, max_replicas=pool.autoscaling.max_replicas,
            scaled_object=pool.name if live is not None and not mine and not refusals else None,
            queries=[signal.query for signal in pool.signals] or None,
        )  # fmt: skip
    if pools is not None:
        pools = pools.model_copy(
            update={role: getattr(pools, role).model_copy(update={"autoscaling": status}) for role, status in statuses.items()}
        )
    return pools_condition(tuple(each)), pools


def _routing(observed: Observed, routing: RoutingFacts, found: Sequence[Conflict], failures: Sequence[WriteFailure]) -> api.Condition:
    """The Routing condition, from what writing the InferencePool and its endpoint picker found."""
    model = Obj(observed.model)
    # The pool's write answered that the cluster serves no InferencePools: as not installed.
    unserved = any((f.kind, f.code, f.message) == (INFERENCE_POOL_KIND, 404, NOT_SERVED) for f in failures)
    return routing_condition(
        model.name or "",
        served=routing.served and not unserved,
        conflict=str(found[0]) if found else None,
        refused=str(failures[0]) if failures and not unserved else None,
        picker=observed.live("Deployment", (model.name or "") + EPP_SUFFIX),
        pool=routing.pool,
    )


def report(
    observed: Observed, at: str, basis: ReportBasis, failures: Sequence[WriteFailure] = (), conflicts: Sequence[Conflict] = ()
) -> Report:
    """The status of ``o`` and the events its transitions call for, from a decision's
    ``basis``; ``failures`` and ``conflicts``: what writing found, when there were writes."""
    model = Obj(observed.model)
    previous = list(model.status.get("conditions") or ())
    serving, compiled, scaling = basis.serving, basis.compile, basis.scaling
    pools = None
    if serving.plan is not None and serving.plan.nodes:
        rollout = counted = rollout_of_groups(observed.own(GROUP_KIND), serving.replicas, serving.plan_hash)
    else:
        # The model's own Deployment: the serving pods', or with pools the proxy's. Its pods are
        # what status.replicas counts; with pools the conditions read the pools' with it.
        counted = rollout_of(observed.own("Deployment"), serving.replicas, serving.plan_hash)
        rollout, pools = pools_rollout(observed, serving, counted) if serving.pools else (counted, None)
    found = list(dict.fromkeys([*basis.conflicts, *conflicts]))
    # What autoscaling meets is reported in its own condition: the model serves at
    # minReplicas meanwhile, so it never holds back Ready.
    scaling_found, other_found = _split_scaling(found)
    scaling_failures, other_failures = _split_scaling(failures)
    # So is what routing meets: the model serves through its Service meanwhile.
    routing_found, other_found = _split_routing(other_found, model.name or "")
    routing_failures, other_failures = _split_routing(other_failures, model.name or "")
    fill_found, other_found = _split_fill(other_found, basis.fill_jobs)
    fill_failures, other_failures = _split_fill(other_failures, basis.fill_jobs)
    blocked = blocked_by(other_found, other_failures)
    if serving.plan is not None and serving.plan.nodes and blocked is None:
        blocked = groups_unserved(observed, other_failures)
    if blocked is None and serving.replacing is not None:
        # Not a refusal: the Deployment comes back on a later pass, once its delete is seen.
        blocked = Blocked("ReplacingDeployment", serving.replacing, permanent=False)
    new = conditions(
        valid=basis.valid, invalid_message=basis.message, compiled=compiled.condition if compiled else None, rollout=rollout,
        pods=observed.serving_pods, blocked=blocked,
    )  # fmt: skip
    scaling_status = None
    if scaling is not None and scaling.spec.autoscaling is not None:
        said, scaling_status = _autoscaling(observed, scaling, serving.replicas, scaling_found, scaling_failures)
        if said is not None:
            new.append(said)
    elif scaling is not None and scaling.pools:
        said, pools = _pools_autoscaling(observed, scaling, pools, scaling_found, scaling_failures)
        if said is not None:
            new.append(said)
    if basis.device_fault is not None:
        new.append(basis.device_fault)
    if (fill_said := fill_ahead_said(basis.fill_ahead, fill_found, fill_failures)) is not None:
        new.append(fill_said)
    if basis.routing is not None:
        new.append(_routing(observed, basis.routing, routing_found, routing_failures))
    generation = model.generation or 1
    status = api.InferentiaModelStatus(
        observed_generation=generation,
        conditions=stamped(new, previous, generation, at),
        replicas=counted.replicas,
        ready_replicas=counted.ready,
        updated_replicas=counted.updated,
        autoscaling=scaling_status,
        pools=pools,
        pods=pod_counts(observed.serving_pods),
        plan=serving.plan,
        selector=serving.selector,
        compile_job=compiled.job if compiled else None,
        compiled_uri=compiled.uri if compiled else None,
        compile_key=compiled.key if compiled else None,
        compile_cache_hit=compiled.hit if compiled else None,
        changed_compile_inputs=list(compiled.changed) or None if compiled else None,
        neuron_placement_percent=compiled.on_neuron if compiled else None,
        hub_revision=compiled.revision if compiled else None,
    )
    return Report(status, events(new, previous))


def status_document(status: api.InferentiaModelStatus) -> dict[str, Any]:
    """The status as the API server stores it: camelCase, absent fields left out."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def status_patch(previous: Mapping[str, Any], status: api.InferentiaModelStatus) -> dict[str, Any] | None:
    """The merge patch that makes ``previous`` the new status, or None when nothing changed.

    Keys the operator no longer reports are nulled; ``status.kopf`` (kopf's own
    bookkeeping from earlier versions of the operator) is left to kopf."""
    wanted = status_document(status)
    current = {k: v for k, v in previous.items() if k != "kopf"}
    if current == wanted:
        return None
    return {**{k: None for k in current if k not in wanted}, **wanted}
