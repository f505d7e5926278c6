"""A model's status, from what the operator observed: pure functions, no API calls.

Everything a reader needs to answer "why is my model not Ready?" is here: what was
observed (:class:`Observed`), how a Job, a Deployment and the serving pods are read
(each in one function), the conditions, their transition times, the status document
and the events, which follow from the condition transitions.

Conditions follow the Kubernetes conventions (metav1.Condition) that kubectl wait,
Helm, Argo CD and Flux's kstatus read: ``Ready=True`` means the current generation is
fully rolled out and available, and ``observedGeneration`` says which generation the
status describes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from . import api
from .autoscaling import NOT_SERVED, SCALED_OBJECT_KIND, Engine, target_in_flight
from .autoscaling import condition as autoscaling_condition
from .names import COMPONENT_LABEL, GROUP_KIND, INFERENCE_POOL_KIND, JOB_NAME_LABEL, PLAN_HASH_ANNOTATION, WORKER_INDEX_LABEL
from .objects import Obj
from .projection import FAILURE_MESSAGE_CHARS
from .routing.pool import EPP_SUFFIX, routing_child, routing_condition

# Flux's kstatus reads only observedGeneration and the "abnormal-true" Reconciling and
# Stalled conditions of a custom resource (anything else counts as Current), so they
# restate Progressing and the failures in its terms.
STALLED_REASONS = {"InvalidSpec", "CompileFailed", "CompileJobUnverified", "NameConflict", "FailedCreate", "ProgressDeadlineExceeded"}
# Shown while a serving pod's node reports a Neuron hardware fault, absent otherwise (device_faults/part.py).
DEVICE_FAULT = "DeviceFault"
DEVICE_FAULT_REASON = "NeuronHardwareError"
# Shown while a model fills the node cache ahead of its replicas, absent otherwise (fill_ahead/part.py).
FILLED_AHEAD = "FilledAhead"
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
# API status codes for which retrying the same write cannot help.
PERMANENT_CODES = {400, 403, 404, 405, 409, 410, 413, 415, 422}

Status = Literal["True", "False", "Unknown"]


# --- what was observed -------------------------------------------------------------------


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
    owner: str  # who has it, as a phrase: "controlled by Deployment web", "not managed by this model"

    def __str__(self) -> str:
        return f"{self.kind} {self.name} already exists and is {self.owner}; the operator leaves it alone (rename the model or remove that object)"


@dataclass(frozen=True)
class Observed:
    """One model and what the caches hold of it (nothing of the operator's configuration:
    that is :class:`settings.Settings`).

    ``children``: the model's objects by kind (core/kinds.py), every one the caches file under
    the model, whatever its name (a model that scales to zero has two Deployments and two
    Services). ``pods``: the pods of its Jobs and Deployments."""

    model: dict[str, Any]
    children: Mapping[str, Sequence[dict[str, Any]]] = field(default_factory=dict)
    pods: Sequence[dict[str, Any]] = ()
    # The namespace's records of completed compiles and its compile Jobs, by the URI of the
    # artefact they are about: how a model learns that another model compiled its key, or
    # is compiling it now. Lookups, not copies: the shell's views read the caches per URI.
    compile_records: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    compile_jobs: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Kinds the API server lately answered it does not serve (KEDA's, before KEDA is
    # installed): nothing is written for them until the operator asks again.
    unserved: frozenset[str] = frozenset()
    # The Job controller's FailedCreate events, by the name of the Job in the model's namespace
    # (each {"reason", "message", "uid"}): the one place Kubernetes says a Job's pod cannot be made.
    job_events: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    # The Neuron nodes by name (projection.project_neuron_node), a view of the shell's index: the
    # faults of the nodes the model's pods run on, and the nodes a replacement could go to.
    nodes: Mapping[str, Iterable[Mapping[str, Any]]] = field(default_factory=dict)
    # The node caches' pods by node (projection.project_node_cache_pod), a view of the shell's
    # index: what each node's cache says it holds, for fill-ahead.
    caches: Mapping[str, Iterable[Mapping[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, model: dict[str, Any], *objects: dict[str, Any] | None, **rest: Any) -> Observed:
        """``model`` with ``objects`` (None for one that is absent), each filed under its kind."""
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            if obj is not None:
                by_kind.setdefault(str(obj.get("kind")), []).append(obj)
        return cls(model, by_kind, **rest)

    def all(self, kind: str) -> Sequence[dict[str, Any]]:
        return self.children.get(kind, ())

    def live(self, kind: str, name: str | None) -> dict[str, Any] | None:
        return next((observed for observed in self.all(kind) if Obj(observed).name == name), None)

    def own(self, kind: str) -> dict[str, Any] | None:
        """The model's object of ``kind`` named after the model: its Deployment, Service, ScaledObject."""
        return self.live(kind, Obj(self.model).name)

    def served(self, kind: str) -> bool:
        return kind not in self.unserved

    @property
    def serving_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if Obj(p).labels.get(COMPONENT_LABEL) == "serving"]


# --- how each kind of object is read, once ----------------------------------------------


@dataclass(frozen=True)
class JobState:
    phase: Literal["Running", "Complete", "Failed"]
    why: str = ""  # the Failed condition's reason and message

    @property
    def finished(self) -> bool:
        return self.phase != "Running"


def job_state(job: Mapping[str, Any] | None) -> JobState:
    j = Obj(job)
    if j.condition_true("Complete"):
        return JobState("Complete")
    failed = j.condition("Failed")
    if failed.get("status") == "True":
        return JobState("Failed", ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x))
    return JobState("Running")


@dataclass(frozen=True)
class Rollout:
    """The serving Deployment, as far as status is concerned."""

    desired: int
    current: bool  # the Deployment carries the current plan
    complete: bool
    replicas: int
    ready: int
    updated: int
    available: int
    exists: bool = False
    available_condition: bool = False  # the Deployment's own Available condition
    failed_create: str | None = None  # why its ReplicaSet cannot create pods, when it cannot
    stuck: str | None = None  # the Deployment's message once it exceeded its progress deadline
    # The Deployment has the current plan in every pod and nothing left to replace: what is
    # not available then is not a rollout under way.
    settled: bool = False


@dataclass(frozen=True)
class _Counted:
    """What a Deployment and a LeaderWorkerSet report alike: replicas (pods or groups) by step,
    and whether the workload runs the current plan at the desired count, no older one left."""

    current: bool
    rolled: bool
    replicas: int
    ready: int
    updated: int


def _counted(workload: Obj, template: Obj, desired_replicas: int, plan_hash: str | None, caught_up: bool = True) -> _Counted:
    current = plan_hash is not None and template.annotations.get(PLAN_HASH_ANNOTATION) == plan_hash
    s = workload.status
    replicas, ready, updated = s.get("replicas", 0), s.get("readyReplicas", 0), s.get("updatedReplicas", 0)
    rolled = (
        current
        and caught_up
        and workload.spec.get("replicas") == desired_replicas
        and updated == desired_replicas
        and replicas == desired_replicas  # no pod (or group) of an older plan is left
    )
    return _Counted(current, rolled, replicas, ready, updated if current else 0)


def rollout_of(deployment: Mapping[str, Any] | None, desired_replicas: int, plan_hash: str | None) -> Rollout:
    d = Obj(deployment)
    if not d:
        return Rollout(desired_replicas, False, False, 0, 0, 0, 0)
    c = _counted(d, Obj(d.spec.get("template")), desired_replicas, plan_hash, d.status.get("observedGeneration", 0) >= d.generation)
    available = d.status.get("availableReplicas", 0)
    # The Deployment controller's word that this ReplicaSet's rollout completed once: pods not
    # ready before that are a rollout's, not pods that stopped serving.
    settled = c.rolled and d.condition("Progressing").get("reason") == "NewReplicaSetAvailable"
    # The ReplicaSet could not create pods (a Pod Security refusal, a quota, a missing
    # ServiceAccount): the Deployment controller restates it as ReplicaFailure.
    failure = d.condition("ReplicaFailure")
    failed_create = (failure.get("message") or failure.get("reason") or "no reason given") if failure.get("status") == "True" else None
    # Pods that never become ready (an image that cannot be pulled, a crash loop): the
    # Deployment controller gives up on the rollout after spec.progressDeadlineSeconds.
    progressing = d.condition("Progressing")
    stuck = (progressing.get("message") or "no reason given") if progressing.get("reason") == "ProgressDeadlineExceeded" else None
    return Rollout(
        desired_replicas, c.current, c.rolled and available == desired_replicas, c.replicas, c.ready, c.updated, available,
        exists=True, available_condition=d.condition_true("Available"), failed_create=failed_create, stuck=stuck,
        settled=settled,
    )  # fmt: skip


def rollout_of_groups(group: Mapping[str, Any] | None, desired_replicas: int, plan_hash: str | None) -> Rollout:
    """The LeaderWorkerSet of a model whose replicas span nodes, read as the Deployment is: it
    counts groups (status.replicas, readyReplicas, updatedReplicas), and a group is ready only
    when every pod of it is. It reports no observedGeneration and no available count: its
    ready groups are the available ones, and UpdateInProgress says whether a rollout is under way
    (api/leaderworkerset/v1/leaderworkerset_types.go, LeaderWorkerSetStatus)."""
    g = Obj(group)
    if not g:
        return Rollout(desired_replicas, False, False, 0, 0, 0, 0)
    templates = g.spec.get("leaderWorkerTemplate")
    c = _counted(g, Obj(templates.get("workerTemplate") if isinstance(templates, Mapping) else None), desired_replicas, plan_hash)
    return Rollout(
        desired_replicas, c.current, c.rolled and c.ready == desired_replicas, c.replicas, c.ready, c.updated, c.ready,
        exists=True, available_condition=g.condition_true("Available"),
        settled=c.rolled and not g.condition_true("UpdateInProgress"),
    )  # fmt: skip


@dataclass(frozen=True)
class Placement:
    """Where the serving pods stand with the scheduler."""

    pods: int
    placed: int
    unschedulable: list[str]  # the scheduler's message for each pod it cannot place


def pod_counts(pods: Sequence[Mapping[str, Any]]) -> api.PodCounts:
    """Each serving pod (not one being deleted) by the first step it has not passed: a node,
    its init containers (the fetch), its readiness (the model loaded)."""
    counts = {"pending": 0, "fetching": 0, "loading": 0, "ready": 0}
    for p in map(Obj, pods):
        if p.deleting:
            continue
        if p.condition("PodScheduled").get("status") != "True":
            counts["pending"] += 1
        elif p.condition("Initialized").get("status") != "True":
            counts["fetching"] += 1
        elif p.condition("Ready").get("status") != "True":
            counts["loading"] += 1
        else:
            counts["ready"] += 1
    return api.PodCounts(**counts)


def placement_of(pods: Sequence[Mapping[str, Any]]) -> Placement:
    unschedulable, placed = [], 0
    for p in map(Obj, pods):
        scheduled = p.condition("PodScheduled")
        if scheduled.get("status") == "True":
            placed += 1
        elif scheduled.get("status") == "False" and not p.deleting:
            unschedulable.append(scheduled.get("message") or scheduled.get("reason") or "unschedulable")
    return Placement(len(pods), placed, unschedulable)


# --- conditions ---------------------------------------------------------------------------


def cond(type_: str, status: Status, reason: str, message: str = "") -> api.Condition:
    return api.Condition(type=type_, status=status, reason=reason, message=message)


@dataclass(frozen=True)
class Blocked:
    """Why the operator could not write a child: NameConflict (someone else's object has
    the name) or ApplyFailed (the API server refused it, with its message)."""

    reason: str
    message: str
    permanent: bool  # retrying the same write cannot help: Stalled=True


def blocked_by(conflicts: Sequence[Conflict], failures: Sequence[WriteFailure]) -> Blocked | None:
    if conflicts:
        return Blocked("NameConflict", "; ".join(str(c) for c in conflicts), permanent=True)
    if failures:
        return Blocked(
            "ApplyFailed",
            "the API server refused " + "; ".join(str(f) for f in failures),
            permanent=all(f.permanent for f in failures),
        )
    return None


def groups_unserved(observed: Observed, failures: Sequence[WriteFailure]) -> Blocked | None:
    """A model whose replicas span nodes, on a cluster that serves no LeaderWorkerSets: said
    until it does (the operator asks again every resync, as for KEDA's kinds)."""
    refused = any((f.kind, f.code, f.message) == (GROUP_KIND, 404, NOT_SERVED) for f in failures)
    if observed.served(GROUP_KIND) and not refused:
        return None
    message = (
        "a replica across nodes (spec.compute.nodes) is a LeaderWorkerSet group, and this cluster serves no "
        "LeaderWorkerSets: install LeaderWorkerSet (docs/install.md), or set compute.nodes to 1"
    )
    return Blocked("LeaderWorkerSetNotInstalled", message, permanent=False)


def compile_failure(job_name: str | None, pods: Sequence[Mapping[str, Any]]) -> str:
    """What the compile Job's failure said: in its last failed pod, the first container that failed
    (its termination message; the containers after it in the pod never ran), or ''."""
    said = [
        f"{failures[0]['container']}: {failures[0]['message']}"
        for p in pods
        if Obj(p).labels.get(JOB_NAME_LABEL) == job_name
        and (failures := [f for f in Obj(p).status.get("failures") or [] if f.get("message")])
    ]
    return said[-1] if said else ""


def compile_pod_trouble(
    job_name: str | None, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = ()
) -> tuple[str, str] | None:
    """Why a running compile Job's pod is not running, as (reason, message), or None: its pod
    cannot be created (the Job controller's FailedCreate event, the one place Kubernetes says so:
    a missing ServiceAccount, a quota, an admission webhook), or it cannot be scheduled (the
    scheduler's PodScheduled condition). A Job that has pods and created them says nothing."""
    if job is None or job_state(job).finished:
        return None
    mine = [p for p in map(Obj, pods) if p.labels.get(JOB_NAME_LABEL) == job_name and not p.deleting]
    uid = Obj(job).uid
    if not mine:
        said = [e for e in events if e.get("reason") == "FailedCreate" and (not uid or e.get("uid") == uid)]
        if said:
            return "FailedCreate", str(said[-1].get("message") or "")  # cut as it was cached (project_job_event)
        return None
    for p in mine:
        placed = p.condition("PodScheduled")
        if placed.get("status") == "False" and placed.get("reason") == "Unschedulable":
            return "Unschedulable", str(placed.get("message") or "")[-FAILURE_MESSAGE_CHARS:]
    return None


def compile_reported(job_name: str | None, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the compile program of the Job's pod reported: one JSON object, the last line of the
    compile step's termination message (programs/neuron_compile.py, programs/hub_snapshot.py), or
    {}. The step runs the user's image: its fields are checked by whoever reads them."""
    for p in pods:
        if Obj(p).labels.get(JOB_NAME_LABEL) != job_name:
            continue
        for said in Obj(p).status.get("reports") or []:
            if said.get("container") == "compile":
                try:
                    found = json.loads(str(said.get("message")).strip().splitlines()[-1], parse_constant=lambda _: None)
                except (ValueError, IndexError):
                    return {}
                return found if isinstance(found, dict) else {}
    return {}


HUB_COMMIT = re.compile(r"[0-9a-f]{40}")


def revision(value: Any) -> str | None:
    """A Hub commit (40 hexadecimal digits), as the compile program reports it and a record keeps it, or None."""
    return value if isinstance(value, str) and HUB_COMMIT.fullmatch(value) else None


def share(value: Any) -> float | None:
    """``value`` as a percentage from 0 to 100 (a number, or its text as a record keeps it), or None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        return None
    return round(float(value), 2)


def with_neuron_share(condition: api.Condition, on_neuron: float | None) -> api.Condition:
    """Below 100%, the Compiled condition says that the rest runs on the CPU: the Cortex docs
    advise near 100% placement, since an operator left on the CPU limits the instance's throughput."""
    if on_neuron is None or on_neuron >= 100:
        return condition
    note = f"{on_neuron}% of the model's operators run on Neuron; the rest run on the CPU, which limits throughput"
    return condition.model_copy(update={"message": f"{condition.message}; {note}" if condition.message else note})


def compiled_condition(
    job_required: bool,
    job_name: str | None,
    job: Mapping[str, Any] | None,
    uri: str,
    changed: Sequence[str] = (),
    failure: str = "",
    *,
    key: str = "",
    compiled_by: str = "",
    hit: Mapping[str, str] | None = None,
    unverified: bool = False,
    trouble: tuple[str, str] | None = None,
) -> api.Condition:
    """The Compiled condition. ``changed``: the compile inputs that differ from the last
    successful compile's, named in the message while a new compile runs; ``failure``: what the
    failed compile step said; ``compiled_by``: the model whose Job compiles this key, when it
    is another model's; ``hit``: the record of a finished compile of this key (job, model,
    completed), when the model starts from it and runs no Job; ``unverified``: the Job under
    the key's name carries no proof that the operator made it (core/proof.py); ``trouble``: why
    the running Job's pod is not running (:func:`compile_pod_trouble`)."""
    if not job_required:
        return cond("Compiled", "True", "CompiledAtLoad", "no compile image: the serving pods compile at load time with the planned flags")
    if hit is not None:
        by = f" of model {hit['model']}" if hit.get("model") else ""
        when = f" at {hit['completed']}" if hit.get("completed") else ""
        return cond(
            "Compiled", "True", "CacheHit",
            f"cache hit: Job {hit.get('job') or '?'}{by} compiled key {key} to {uri}{when}; no compile Job runs, "
            "the serving pods fetch the artefact and load it without compiling",
        )  # fmt: skip
    if unverified:
        return cond(
            "Compiled", "False", "CompileJobUnverified",
            f"Job {job_name} has the name of this model's compile Job but no proof that the operator made it "
            "(annotation inferentia.dev/proof), so it is neither waited for nor trusted as a compile; delete it, "
            "and the operator creates its own",
        )  # fmt: skip
    whose = f" (of model {compiled_by}, which has the same compile inputs)" if compiled_by else ""
    state = job_state(job)
    if state.phase == "Complete":
        return cond(
            "Compiled", "True", "Compiled",
            f"Job {job_name} compiled key {key} to {uri}; the serving pods fetch it and load it without compiling",
        )  # fmt: skip
    if state.phase == "Failed":
        said = f"; {failure}" if failure else ""
        return cond("Compiled", "False", "CompileFailed", f"Job {job_name}{whose} failed: {state.why or 'no reason given'}{said}")
    if trouble is not None:
        reason, said = trouble
        what = "cannot create its pod" if reason == "FailedCreate" else "has a pod no node can take"
        # A Job's template is never written again: a new spec.compile.placement (or
        # serviceAccountName) reaches a new Job only.
        return cond(
            "Compiled", "False", reason,
            f"Job {job_name}{whose} {what}: {said or 'no reason given'} (the Job keeps the placement and ServiceAccount "
            "it was made with: delete it for a changed spec to apply)",
        )  # fmt: skip
    why = f" ({', '.join(changed)} changed since the last compile)" if changed else ""
    return cond("Compiled", "False", "Compiling", f"Job {job_name}{whose} is compiling key {key} for the new plan{why}")


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


def unready_because(pods: Sequence[Mapping[str, Any]]) -> str:
    """Why the first serving pod that is not ready is not: a container's failure (its
    termination message), else what its Ready condition says (the kubelet names the
    containers that are not ready; the node controller marks the pods of a node it lost)."""
    for p in map(Obj, pods):
        if p.deleting or p.condition("Ready").get("status") == "True":
            continue
        name = p.metadata.get("name", "a pod")
        rank = p.labels.get(WORKER_INDEX_LABEL)
        if rank is not None:
            # A pod of a group across nodes: which one of it (LeaderWorkerSet's label).
            name += " (the leader of its group)" if rank == "0" else f" (worker {rank} of its group)"
        failures = [f for f in p.status.get("failures") or [] if f.get("message")]
        if failures:
            # A condition's message is one line: a log's last line says why it ended.
            last = failures[0]["message"].strip().splitlines()[-1]
            return f"pod {name}: {failures[0]['container']} failed: {last}"
        ready = p.condition("Ready")
        said = ready.get("message") or ready.get("reason")
        if said:
            return f"pod {name}: {said}"
        if ready.get("status") == "False" and p.spec.get("nodeName"):
            # The kubelet always says which containers are not ready; a pod marked not ready
            # with nothing said was marked by the node controller, which does so to every pod
            # of a node it has not heard from within node-monitor-grace-period (Kubernetes
            # docs, Concepts > Nodes > Node status). The real-node fault suite stops a kubelet
            # and sees exactly this.
            return f"pod {name}: marked not ready without a reason from its kubelet; node {p.spec['nodeName']} may be NotReady"
    return ""


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
class CompileFacts:
    """What the compile part concluded (compile/part.py)."""

    condition: api.Condition  # Compiled
    job: str | None = None  # the compile Job that makes the artefact, unless it came from the cache
    uri: str | None = None  # the artefact's, when something compiles ahead of serving
    key: str | None = None
    hit: bool | None = None  # the artefact came from a record of an earlier compile
    changed: tuple[str, ...] = ()  # the compile inputs that differ from the last artefact's
    on_neuron: float | None = None  # the share of its operators that runs on Neuron, once compiled
    revision: str | None = None  # the Hub commit the artefact keeps and the replicas serve, once compiled


@dataclass(frozen=True)
class ServingFacts:
    """What the serving part concluded (serving/part.py)."""

    replicas: int  # the Deployment's desired replicas
    plan_hash: str | None  # the current plan's, which an up-to-date Deployment carries
    plan: api.Plan | None
    selector: str | None


@dataclass(frozen=True)
class ScalingFacts:
    """What the autoscaling part concluded (scaling/part.py), for a model with spec.autoscaling."""

    spec: api.InferentiaModelSpec  # the Autoscaling condition is read against it
    configured: bool  # the operator knows where Prometheus is
    query: str | None  # the ScaledObject's query, when there is one


@dataclass(frozen=True)
class RoutingFacts:
    """What the routing part concluded (routing/part.py), for a model with spec.routing.inferencePool."""

    served: bool  # the cluster serves InferencePools (the Extension's CRDs are installed)
    pool: str | None  # the model's InferencePool, once the caches hold it


@dataclass(frozen=True)
class ReportBasis:
    """What a decision concluded about a model, from which its status is reported: once
    before any write, and, where there were writes, once after them with what they found.
    Writing changes the objects and may meet refusals or conflicts; it never changes this."""

    valid: bool
    message: str  # why the spec is invalid, when it is
    serving: ServingFacts
    compile: CompileFacts | None  # None while the spec is invalid
    scaling: ScalingFacts | None  # None without spec.autoscaling
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


def _fill_said(said: api.Condition | None, found: Sequence[Conflict], failures: Sequence[WriteFailure]) -> api.Condition | None:
    if not found and not failures:
        return said
    what = "; ".join(([f"{f.name}: {f.code} {f.message}" for f in failures] + [str(c) for c in found])[:3])
    if said is None:
        # The model fills ahead no more (no node cache, or served otherwise), and a fill Job of
        # before could not be deleted: it holds nothing the model needs, but it is said.
        return cond(
            FILLED_AHEAD, "False", "FillFailed",
            f"a fill Job no longer wanted could not be deleted ({what}); it is tried again at the next reconcile",
        )  # fmt: skip
    return cond(FILLED_AHEAD, "False", "FillFailed", f"a fill Job could not be written ({what}); a replica reads the store where it lands")


def report(
    observed: Observed, at: str, basis: ReportBasis, failures: Sequence[WriteFailure] = (), conflicts: Sequence[Conflict] = ()
) -> Report:
    """The status of ``o`` and the events its transitions call for, from a decision's
    ``basis``; ``failures`` and ``conflicts``: what writing found, when there were writes."""
    model = Obj(observed.model)
    previous = list(model.status.get("conditions") or ())
    serving, compiled, scaling = basis.serving, basis.compile, basis.scaling
    deployment, scaled_object = observed.own("Deployment"), observed.own(SCALED_OBJECT_KIND)
    if serving.plan is not None and serving.plan.nodes:
        rollout = rollout_of_groups(observed.own(GROUP_KIND), serving.replicas, serving.plan_hash)
    else:
        rollout = rollout_of(deployment, serving.replicas, serving.plan_hash)
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
    new = conditions(
        valid=basis.valid, invalid_message=basis.message, compiled=compiled.condition if compiled else None, rollout=rollout,
        pods=observed.serving_pods, blocked=blocked,
    )  # fmt: skip
    scaling_status = None
    if scaling is not None:
        refused = (scaling_failures[0].code, scaling_failures[0].message) if scaling_failures else None
        if refused is None and not observed.served(SCALED_OBJECT_KIND):
            refused = (404, NOT_SERVED)
        live = scaled_object if not scaling_found else None
        engine = Engine(
            configured=scaling.configured, live=live, refused=refused, conflict=str(scaling_found[0]) if scaling_found else None
        )
        said = autoscaling_condition(scaling.spec, model.name or "", engine)
        if said is not None:
            new.append(said)
        # The ScaledObject as it stands after the writes: named once it exists.
        ours = scaled_object is not None and not scaling_found and not scaling_failures
        assert scaling.spec.autoscaling is not None
        scaling_status = api.AutoscalingStatus(
            min_replicas=scaling.spec.autoscaling.min_replicas, max_replicas=scaling.spec.autoscaling.max_replicas,
            target_in_flight=target_in_flight(scaling.spec), desired_replicas=serving.replicas, query=scaling.query,
            scaled_object=Obj(scaled_object).name if ours else None,
        )  # fmt: skip
    if basis.device_fault is not None:
        new.append(basis.device_fault)
    if (fill_said := _fill_said(basis.fill_ahead, fill_found, fill_failures)) is not None:
        new.append(fill_said)
    if basis.routing is not None:
        # The pool's write answered that the cluster serves no InferencePools: as not installed.
        unserved = any((f.kind, f.code, f.message) == (INFERENCE_POOL_KIND, 404, NOT_SERVED) for f in routing_failures)
        new.append(
            routing_condition(
                model.name or "",
                served=basis.routing.served and not unserved,
                conflict=str(routing_found[0]) if routing_found else None,
                refused=str(routing_failures[0]) if routing_failures and not unserved else None,
                picker=observed.live("Deployment", (model.name or "") + EPP_SUFFIX),
                pool=basis.routing.pool,
            )
        )
    generation = model.generation or 1
    status = api.InferentiaModelStatus(
        observed_generation=generation,
        conditions=stamped(new, previous, generation, at),
        replicas=rollout.replicas,
        ready_replicas=rollout.ready,
        updated_replicas=rollout.updated,
        autoscaling=scaling_status,
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
