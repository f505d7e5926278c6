"""What a decision observes: one model and what the caches hold of it (:class:`Observed`), what
writing it found (:class:`WriteFailure`, :class:`Conflict`, :class:`Blocked`), and how a Job, a
Deployment, a LeaderWorkerSet and the serving pods are read, each in one function. Pure, no API
calls; below the features, which read their inputs from it, and below the report (core/status.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import api
from .autoscaling import NOT_SERVED
from .names import COMPONENT_LABEL, GROUP_KIND, JOB_NAME_LABEL, PLAN_HASH_ANNOTATION, WORKER_INDEX_LABEL
from .objects import Obj

# API status codes for which retrying the same write cannot help.
PERMANENT_CODES = {400, 403, 404, 405, 409, 410, 413, 415, 422}


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


def rollout_of_all(rollouts: Sequence[Rollout]) -> Rollout:
    """Several Deployments read as one (a disaggregated model's proxy and pools): rolled out,
    available and settled when each is, their pods counted together, the first one's trouble.
    Each is available only with a pod available where it should run one: a one-replica
    Deployment counts itself Available with none (maxUnavailable 1), and the others' pods would
    carry the sum (status.py's Available reads the sum)."""
    return Rollout(
        sum(r.desired for r in rollouts), all(r.current for r in rollouts), all(r.complete for r in rollouts),
        sum(r.replicas for r in rollouts), sum(r.ready for r in rollouts), sum(r.updated for r in rollouts),
        sum(r.available for r in rollouts), exists=all(r.exists for r in rollouts),
        available_condition=all(r.available_condition and (r.available > 0 or r.desired == 0) for r in rollouts),
        failed_create=next((r.failed_create for r in rollouts if r.failed_create), None),
        stuck=next((r.stuck for r in rollouts if r.stuck), None), settled=all(r.settled for r in rollouts),
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


# --- what writing found, summed up ----------------------------------------------------------


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
