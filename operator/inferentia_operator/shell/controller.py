"""The reconcile loop: observe from watch caches, decide, write only what differs, report.

- **Observe.** kopf indexes are the caches: every InferentiaModel and every child and
  pod the operator manages (server-side filtered by its managed-by label) are kept in
  memory as the watches deliver them, as :mod:`observe` projects them. kopf starts no
  other handler until every index is fully populated, so nothing is decided from a
  half-filled cache. What the operator wrote itself is kept beside the caches until
  the watch delivers it (``_written``), so a reconcile right after a write does not
  repeat it. No GET or LIST runs in the hot path; the one read left is a GET before
  creating a child the caches do not hold: its name may be taken by an object the
  label-filtered watch cannot see, and the operator never writes over someone else's.
- **Decide.** :func:`decide.decide`, a pure function.
- **Act.** Server-side apply of the children that differ, deletes of superseded plans;
  a write the API server refuses is recorded, and the others still go ahead.
- **Report.** The status is patched only when it changed, and events are posted only
  for condition transitions.

Triggers are coalesced in a :class:`workqueue.WorkQueue`: an event only enqueues its
model's key, a burst becomes one reconcile, and a pod event counts only when it changes
what status reports. A fixed pool of workers (``--workers``) runs the reconciles; the
API round trips are their cost, so more workers than the API server has cores to
answer them only queue inside the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from inferentia_operator.core import api
from inferentia_operator.core import status as conditions
from inferentia_operator.core.decide import Conflict, Decision, Observed, WriteFailure, decide, holder_of, status_document, status_patch
from inferentia_operator.core.names import DEFAULT_BATCHING_IMAGE, FIELD_MANAGER, MANAGED_BY_LABEL

from . import metrics
from .kube import ApiError, Kube
from .observe import Key, owner_key, pod_signature, project, project_pod, resource_version

log = logging.getLogger(__name__)

# The children's kinds, as kopf names their resources, and the index that caches each.
CHILD_RESOURCES = {
    "Deployment": ("apps", "v1", "deployments"),
    "Job": ("batch", "v1", "jobs"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Pod": ("", "v1", "pods"),
}
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={FIELD_MANAGER}"
# Children one reconcile may write at once: plan ConfigMap, Service, compile Job, Deployment.
WRITES_PER_RECONCILE = 4
# A child's or a pod's change is reconciled after this delay, so that the changes of one
# rollout step (a ReplicaSet scaling, its pods starting, the Deployment's status) make one
# reconcile and one status patch, not one each. Created models and changed specs go at once.
SETTLE_SECONDS = 1.0
# Children named after their content and never written again (a ConfigMap is immutable,
# a Job's template too): created, not applied, so no field of theirs is ever left owned
# by a create that a later apply would have to remove.
WRITTEN_ONCE = {"ConfigMap", "Job"}
_GONE = {"metadata": {"resourceVersion": "-1"}, "gone": True}


@dataclass
class Outcome:
    """What the act step wrote and what it could not."""

    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) -> object
    failures: list[WriteFailure] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.written)


class Reconciler:
    def __init__(
        self,
        kube: Callable[[], Kube],
        workers: int,
        resync_seconds: float,
        is_active: Callable[[], bool],
        batching_image: str = DEFAULT_BATCHING_IMAGE,
    ):
        self.batching_image = batching_image
        self.kube = kube
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.is_active = is_active  # False while peering keeps this replica on standby
        self.queue: Any = None  # a WorkQueue, made on the operator's event loop
        self.indexes: dict[str, Any] | None = None  # kopf's, captured when they are populated
        # Per model: what the operator wrote, (kind, name) -> object, until the watch delivers it.
        self._written: dict[Key, dict[tuple[str, str], dict[str, Any]]] = {}
        self._pods: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._generations: dict[Key, int] = {}
        self._own_status: dict[Key, str] = {}  # the resourceVersion the last status patch made
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._writes = ThreadPoolExecutor(max_workers=workers * WRITES_PER_RECONCILE, thread_name_prefix="write")

    # --- observe -------------------------------------------------------------------------

    def _cached(self, index: str, key: Key) -> list[dict[str, Any]]:
        assert self.indexes is not None
        return list(self.indexes[index].get(key, ()))

    def _resolve(self, key: Key, kind: str, cached: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The cached objects, each replaced by what the operator wrote when that is newer,
        plus objects it created that the watch has not delivered yet."""
        by_name = {o["metadata"]["name"]: o for o in cached}
        written_here = self._written.get(key, {})
        for (k, name), written in list(written_here.items()):
            if k != kind:
                continue
            current = by_name.get(name)
            if written.get("gone"):
                if current is None:
                    del written_here[(k, name)]  # the watch has seen the delete
                else:
                    by_name.pop(name)  # deleted, though the watch has not said so yet
            elif current is not None and resource_version(current) >= resource_version(written):
                del written_here[(k, name)]  # the watch has caught up
            else:
                by_name[name] = written
        return list(by_name.values())

    def observe(self, key: Key) -> Observed | None:
        models = self._resolve(key, api.KIND, self._cached("model_index", key))
        model = next((m for m in models if m["metadata"]["name"] == key[1]), None)
        if model is None:
            return None

        def children(kind: str, index: str) -> list[dict[str, Any]]:
            return self._resolve(key, kind, self._cached(index, key))

        deployments = [d for d in children("Deployment", "deployment_index") if d["metadata"]["name"] == key[1]]
        services = [s for s in children("Service", "service_index") if s["metadata"]["name"] == key[1]]
        return Observed(
            model=model,
            deployment=deployments[0] if deployments else None,
            service=services[0] if services else None,
            configmaps=children("ConfigMap", "configmap_index"),
            jobs=children("Job", "job_index"),
            pods=self._cached("pod_index", key),
            batching_image=self.batching_image,
        )

    # --- act -----------------------------------------------------------------------------

    def act(self, observed: Observed, decision: Decision) -> Outcome:
        """Runs in a worker thread: the decision's writes, each failure recorded, none stopping
        the rest. The children are independent (a pod waits for its plan ConfigMap by itself),
        so they are written at once: a reconcile takes one or two round trips, not six."""
        kube, out = self.kube(), Outcome()
        meta = observed.model["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]

        def taken(kind: str, name: str) -> bool:
            """Whether an object the model does not control has the name (recorded as a conflict)."""
            existing = kube.get(kind, namespace, name)
            holder = holder_of(existing, uid, meta["name"]) if existing is not None else None
            if holder is not None:
                out.conflicts.append(Conflict(kind, name, holder))
            return holder is not None

        def write(body: dict[str, Any]) -> None:
            kind, name = body["kind"], body["metadata"]["name"]
            try:
                if observed.live(kind, name) is None:
                    if kind in WRITTEN_ONCE:
                        # Named after their content and never updated: a plain create, which
                        # the API server refuses (409) if the name is taken, needs no check first.
                        created = kube.create(body)
                        if created is not None:
                            out.written[(kind, name)] = project(created)
                            return
                    # Not in the caches (or the create found the name taken): it may be an
                    # object the label-filtered watch cannot see. Never write over someone else's.
                    if taken(kind, name):
                        return
                out.written[(kind, name)] = project(self._apply(kube, body, observed.live(kind, name)))
            except ApiError as exc:
                out.failures.append(WriteFailure(kind, name, exc.code, exc.message))

        list(self._writes.map(write, decision.apply))
        for kind, name in decision.delete:
            try:
                kube.delete(kind, namespace, name)
                out.written[(kind, name)] = _GONE
            except ApiError as exc:
                log.warning("could not delete superseded %s %s/%s: %s", kind, namespace, name, exc)
        return out

    @staticmethod
    def _apply(kube: Kube, body: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
        """Server-side apply; for a Service of ours whose ports someone edited by hand, the
        ports are first replaced whole.

        Service ports are a list keyed by port and protocol: an entry someone else changed
        (``kubectl patch`` of a port) belongs to them, so applying the planned entry beside
        it makes two ports of one name, which the API server refuses (422, Duplicate value)
        on every apply after. Replacing the list takes the entries back."""
        try:
            return kube.apply(body)
        except ApiError as exc:
            if exc.code != 422 or body["kind"] != "Service" or live is None:
                raise
            meta = body["metadata"]
            log.info("Service %s/%s: ports edited by someone else; replacing them with the planned ones", meta["namespace"], meta["name"])
            kube.replace_field("Service", meta["namespace"], meta["name"], "/spec/ports", body["spec"]["ports"])
            return kube.apply(body)

    # --- the loop ------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> str:
        observed = self.observe(key)
        if observed is None:
            self._forget(key)
            return "noop"
        now = conditions.now()
        decision = decide(observed, now)
        if decision.status is None:
            return "noop"
        loop = asyncio.get_running_loop()
        outcome = Outcome()
        if decision.apply or decision.delete:
            outcome = await loop.run_in_executor(self._executor, self.act, observed, decision)
            self._written.setdefault(key, {}).update(outcome.written)
            observed = self.observe(key) or observed
            observed.failures, observed.conflicts = outcome.failures, outcome.conflicts
            decision = decide(observed, now)
        for failure in outcome.failures:
            log.warning("%s/%s: the API server refused %s", *key, failure)
        assert decision.status is not None
        patch = status_patch(observed.model.get("status") or {}, decision.status)
        if patch is not None:
            kube = self.kube()
            stored = await loop.run_in_executor(self._executor, kube.patch_status, key[0], key[1], patch)
            if stored:
                self._written.setdefault(key, {})[(api.KIND, key[1])] = project(stored)
                self._own_status[key] = (stored.get("metadata") or {}).get("resourceVersion")
            old = (observed.model.get("status") or {}).get("conditions") or []
            new = status_document(decision.status).get("conditions") or []
            for kind, reason, message in conditions.transitions(new, old):
                await loop.run_in_executor(self._executor, kube.post_event, observed.model, kind, reason, message)
        if any(not f.permanent for f in outcome.failures):
            raise RetryLater(f"{len(outcome.failures)} writes refused for now")
        return "changed" if outcome.changed or patch is not None else "noop"

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            started = time.monotonic()
            try:
                result = await self.reconcile(key)
                self.queue.forget(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the worker
                result = "failed"
                delay = self.queue.retry_delay(key)
                log.warning("reconcile of %s/%s failed, retrying in %.0fs: %s", *key, delay, exc)
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)
                metrics.QUEUE_DEPTH.set(len(self.queue))
            metrics.RECONCILES.labels(result).inc()
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    async def resync(self) -> None:
        """Every ``resync_seconds``: every model reconciled against the caches (no reads, and
        writes only where something differs), and the models-by-Ready gauge refreshed."""
        while True:
            await asyncio.sleep(self.resync_seconds)
            if self.indexes is None:
                continue
            active = await asyncio.get_running_loop().run_in_executor(self._executor, self.is_active)
            if not active:
                continue  # a standby's caches are frozen by kopf's pause: it must not act on them
            for key in list(self.indexes["model_index"].keys()):
                self.queue.add(key)
            self.count_models()

    def count_models(self) -> None:
        if self.indexes is None:
            return
        counts = {"True": 0, "False": 0, "Unknown": 0}
        for store in self.indexes["model_index"].values():
            for model in store:
                ready = next((c for c in (model.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
                counts[ready.get("status", "Unknown") if ready.get("status") in counts else "Unknown"] += 1
        for status, n in counts.items():
            metrics.MODELS.labels(status).set(n)

    # --- triggers ------------------------------------------------------------------------

    def _capture(self, kwargs: dict[str, Any]) -> None:
        if self.indexes is None:
            self.indexes = {k: v for k, v in kwargs.items() if k.endswith("_index")}

    def _forget(self, key: Key) -> None:
        self._generations.pop(key, None)
        self._written.pop(key, None)
        self._own_status.pop(key, None)

    def on_model(self, body: dict[str, Any], event_type: str | None, kwargs: dict[str, Any]) -> None:
        self._capture(kwargs)
        meta = body.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        if event_type == "DELETED":
            self._forget(key)  # type: ignore[arg-type]
            return
        generation = meta.get("generation")
        # A new model or a changed spec goes ahead of status-only reconciles of others.
        urgent = self._generations.get(key) != generation  # type: ignore[arg-type]
        self._generations[key] = generation  # type: ignore[index]
        if not urgent and self._own_status.get(key) == meta.get("resourceVersion"):  # type: ignore[arg-type]
            return  # the echo of the operator's own status patch: nothing new to decide
        self.queue.add(key, urgent=urgent)

    def on_child(self, body: dict[str, Any], event_type: str | None, kwargs: dict[str, Any]) -> None:
        self._capture(kwargs)
        key = owner_key(body)
        if key is not None and key in self.indexes["model_index"]:  # type: ignore[index]
            self.queue.add_after(key, SETTLE_SECONDS)

    def on_pod(self, body: dict[str, Any], event_type: str | None, kwargs: dict[str, Any]) -> None:
        self._capture(kwargs)
        key = owner_key(body)
        meta = body.get("metadata") or {}
        pod = (meta.get("namespace"), meta.get("name"))
        if event_type == "DELETED":
            self._pods.pop(pod, None)  # type: ignore[arg-type]
            signature: Any = None
        else:
            signature = pod_signature(body)
            if self._pods.get(pod) == signature:  # type: ignore[arg-type]
                return  # nothing status reports has changed
            self._pods[pod] = signature  # type: ignore[index]
        if key is not None and key in self.indexes["model_index"]:  # type: ignore[index]
            self.queue.add_after(key, SETTLE_SECONDS)


class RetryLater(Exception):
    """Some writes failed for reasons that may pass (the API server overloaded or restarting)."""


# --- kopf wiring ------------------------------------------------------------------------------


def configure_watches(settings: kopf.OperatorSettings) -> None:
    """The children and pods are filtered on the server: the operator is sent only its own.

    An object whose managed-by label someone removes leaves these watches: the API
    server sends a DELETED event for it. Its model is then reconciled, finds the child
    missing from the cache, GETs it before writing, recognises it as its own by its
    owner reference, and applies it again, which puts the labels back."""
    for group, version, plural in CHILD_RESOURCES.values():
        settings.watching.label_selectors[group, version, plural] = MANAGED_SELECTOR


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> None:
    """Registers the indexes (the caches), the triggers and the worker pool."""
    model = dict(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, registry=registry)

    # Async, so that kopf runs them on its event loop, where the queue lives, not in threads.
    # kopf passes each index to handlers under its id.
    @kopf.index(**model, id="model_index")
    async def model_index(namespace, name, body, **_):
        return {(namespace, name): project(body)}

    def child_index(kind: str, projection: Callable[[Any], dict[str, Any]]):
        async def index(body, **_):
            key = owner_key(body)
            return {key: projection(body)} if key else None

        group, version, plural = CHILD_RESOURCES[kind]
        kopf.index(group, version, plural, registry=registry, id=f"{kind.lower()}_index")(index)

    for kind in CHILD_RESOURCES:
        child_index(kind, project_pod if kind == "Pod" else project)

    @kopf.on.event(**model, id="on_model")
    async def on_model(body, type, **kwargs):
        reconciler.on_model(body, type, kwargs)

    for kind, (group, version, plural) in CHILD_RESOURCES.items():
        handler = reconciler.on_pod if kind == "Pod" else reconciler.on_child

        async def on_child(body, type, _handler=handler, **kwargs):
            _handler(body, type, kwargs)

        kopf.on.event(group, version, plural, registry=registry, id=f"on_{kind.lower()}")(on_child)

    @kopf.on.startup(registry=registry)
    async def start_workers(memo: kopf.Memo, **_):
        from .workqueue import WorkQueue

        reconciler.queue = WorkQueue()
        loop = asyncio.get_running_loop()
        memo["reconcile_tasks"] = [loop.create_task(reconciler.worker()) for _ in range(reconciler.workers)]
        memo["reconcile_tasks"].append(loop.create_task(reconciler.resync()))

    @kopf.on.cleanup(registry=registry)
    async def stop_workers(memo: kopf.Memo, **_):
        for task in memo.get("reconcile_tasks", []):
            task.cancel()
