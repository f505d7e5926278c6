"""The reconcile loop: observe from watch caches, decide, write only what differs, report.

- **Observe.** :class:`cache.Cache`: the watch caches, with what the operator just
  wrote laid over them. No GET or LIST runs in the hot path.
- **Decide.** :func:`inferentia_operator.core.decide.decide`, a pure function.
- **Act.** :class:`act.Actor`: server-side apply of what differs, deletes of
  superseded plans; a refused write is recorded and the others still go ahead.
- **Report.** The status is patched only when it changed, and the events that its
  condition transitions call for are posted then.

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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inferentia_operator.core import status
from inferentia_operator.core.autoscaling import NOT_SERVED
from inferentia_operator.core.decide import decide
from inferentia_operator.core.holds import NODE_CACHE_POD_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.projection import (
    Key,
    compile_uri,
    owner_key,
    pod_signature,
    project,
    project_neuron_node,
    project_node_cache_pod,
)
from inferentia_operator.core.settings import DEFAULT_SETTINGS, Settings

from . import memory, metrics
from .act import Outcome, act, calls_in_flight
from .cache import Cache
from .kube import ApiError, Kube
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

# A child's or a pod's change is reconciled after this delay, so that the changes of one
# rollout step (a ReplicaSet scaling, its pods starting, the Deployment's status) make one
# reconcile and one status patch, not one each. Created models and changed specs go at once.
SETTLE_SECONDS = 1.0


def _namespace_going(code: int, message: str) -> bool:
    """The API server's refusal of any create in a namespace being deleted (the model goes
    with it): no news worth a warning."""
    return code == 403 and "because it is being terminated" in message


class RetryLater(Exception):
    """Some writes failed for reasons that may pass (the API server overloaded or restarting):
    the reconcile goes back in the queue after its backoff, the operator's one retry layer."""


class Reconciler:
    def __init__(
        self,
        kube: Callable[[], Kube],
        workers: int,
        resync_seconds: float,
        is_active: Callable[[], bool],
        settings: Settings = DEFAULT_SETTINGS,
    ):
        self.kube = kube
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.is_active = is_active  # False while peering keeps this replica on standby
        self.settings = settings
        self.cache = Cache()
        self._queue: WorkQueue[Key] | None = None  # made on the operator's event loop, at start
        # The one pool of blocking API calls (shell/transport.py is synchronous), so that the
        # event loop never blocks on one.
        self._executor = ThreadPoolExecutor(max_workers=calls_in_flight(workers), thread_name_prefix="api")
        # Trigger state: what status last saw of each pod, each model's generation, and the
        # resourceVersion of the operator's own last status patch (its echo is not news).
        self._pods: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._generations: dict[Key, int | None] = {}
        self._own_status: dict[Key, str | None] = {}
        self._held_since: dict[Key, float] = {}  # models whose status patch is held back (status.hold_seconds)
        # The model of each of the operator's Jobs, by (namespace, Job name): whom a Job's event concerns.
        self._job_models: dict[tuple[str, str], Key] = {}
        # The models with a pod on each node, by node and pod, and what each node's fault was
        # last seen as: whom a node's Neuron fault (or its end) concerns.
        self._node_models: dict[str, dict[tuple[str, str], Key]] = {}
        self._node_faults: dict[str, tuple[Any, ...]] = {}
        # The models that fill the node cache ahead (fill_ahead/part.py), and what of each Neuron
        # node decides whether a replica may go there: a node that comes, goes or changes that
        # reconciles them, since it may change which nodes they fill.
        self._filling: set[Key] = set()
        self._node_openings: dict[str, tuple[Any, ...]] = {}
        self._cache_pods: dict[tuple[str, str], tuple[Any, ...]] = {}  # what each node cache's pod says
        self.settler = memory.Settler()  # when a drained queue gives memory back (shell/memory.py)

    @property
    def queue(self) -> WorkQueue[Key]:
        if self._queue is None:
            self._queue = WorkQueue(observe_wait=lambda lane, seconds: metrics.QUEUE_WAIT_SECONDS.labels(lane).observe(seconds))
        return self._queue

    # --- the loop ------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> str:
        observed = self.cache.observe(key)
        if observed is None:
            self._forget(key)
            return "noop"
        now = status.now()
        # One decision a reconcile: what to write, and the basis of the model's status.
        decision = decide(observed, now, self.settings)
        if decision.basis is None or decision.report is None:
            self._filling.discard(key)
            return "noop"
        if decision.basis.fill_ahead is not None:
            self._filling.add(key)
        else:
            self._filling.discard(key)
        loop = asyncio.get_running_loop()
        outcome = Outcome()
        reported = decision.report
        if decision.apply or decision.delete or decision.evict or decision.traffic:
            outcome = await act(self._executor, self.kube(), observed, decision, self.settings.prover)
            self.cache.remember(key, outcome.written)
            if outcome.record is not None:
                self.cache.remember_record(key[0], outcome.record["data"]["uri"], outcome.record)
            # The status of the objects as written, from the same decision, with what writing found.
            observed = self.cache.observe(key) or observed
            reported = status.report(observed, now, decision.basis, outcome.failures, outcome.conflicts)
            for failure in outcome.failures:
                if failure.code == 404 and failure.message == NOT_SERVED:
                    # A kind the cluster does not serve (KEDA's, not installed): asked again at the next resync.
                    self.cache.unserved(failure.kind, self.resync_seconds)
        previous = Obj(observed.model).status
        patch = status.status_patch(previous, reported.status)
        if patch is None:
            self._held_since.pop(key, None)  # nothing to report: nothing held
        else:
            held = time.monotonic() - self._held_since.setdefault(key, time.monotonic())
            hold = status.hold_seconds(previous, reported.status, held)
            if hold > 0:
                self.queue.add_after(key, hold)  # the rollout's own events usually come first
                patch = None
            else:
                self._held_since.pop(key, None)
        if patch is not None:
            # Refusals are logged when they change what status says, not at every retry.
            for failure in outcome.failures:
                (log.debug if _namespace_going(failure.code, failure.message) else log.warning)(
                    "%s/%s: the API server refused %s", *key, failure
                )
            kube = self.kube()
            stored = await loop.run_in_executor(self._executor, kube.patch_status, key[0], key[1], patch)
            if stored and self.cache.has_model(key):  # a model deleted meanwhile is not remembered again
                self.cache.remember(key, {(observed.model["kind"], key[1]): project(stored)})
                self._own_status[key] = Obj(stored).metadata.get("resourceVersion")
            for event in reported.events:
                try:
                    await loop.run_in_executor(self._executor, kube.post_event, observed.model, event.type, event.reason, event.message)
                except ApiError as exc:
                    # Events restate the status, which is written: like client-go's event recorder,
                    # a refused event never fails the reconcile. A namespace being deleted refuses
                    # every create, its models' events too; that is no news.
                    (log.debug if _namespace_going(exc.code, exc.message) else log.warning)(
                        "%s/%s: event %s not posted: %s", *key, event.reason, exc
                    )
        if any(not f.permanent for f in outcome.failures):
            raise RetryLater(f"{len(outcome.failures)} writes refused for now")
        return "changed" if outcome.changed or patch is not None else "noop"

    async def worker(self, urgent_only: bool = False) -> None:
        """Reconciles queued models until cancelled; ``urgent_only``: only created models and
        changed specs, so that one never waits while every worker patches others' status."""
        while True:
            key = await self.queue.get(urgent_only)
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
            self.settler.reconciled()

    async def settle(self) -> None:
        """A burst has drained: its memory goes back to the system, and what is alive leaves
        the collector's full collections (shell/memory.py)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, memory.trim)
        self.settler.freeze_survivors()

    async def settle_when_due(self) -> None:
        """Settles the queue once it has drained and a settle is due (memory.Settler.due): the
        one place that decides, at most a poll after the drain."""
        while True:
            await asyncio.sleep(self.settler.poll)
            if self.settler.due(queue_empty=len(self.queue) == 0):
                await self.settle()

    async def resync(self) -> None:
        """Every ``resync_seconds``: every model reconciled against the caches (no reads, and
        writes only where something differs), and the models-by-Ready gauge refreshed."""
        while True:
            await asyncio.sleep(self.resync_seconds)
            if not self.cache.ready:
                continue
            active = await asyncio.get_running_loop().run_in_executor(self._executor, self.is_active)
            if not active:
                continue  # a standby's caches are frozen by kopf's pause: it must not act on them
            for key in self.cache.models():
                self.queue.add(key)
            self.count_models()

    def count_models(self) -> None:
        counts = {"True": 0, "False": 0, "Unknown": 0}
        for model in self.cache.all_models():
            ready = Obj(model).condition("Ready").get("status")
            counts[ready if ready in counts else "Unknown"] += 1
        for ready, n in counts.items():
            metrics.MODELS.labels(ready).set(n)

    # --- triggers ------------------------------------------------------------------------

    def _forget(self, key: Key) -> None:
        self._filling.discard(key)
        self._generations.pop(key, None)
        self._own_status.pop(key, None)
        self._held_since.pop(key, None)
        self.cache.forget(key)

    def on_model(self, body: Mapping[str, Any], event_type: str | None, kwargs: Mapping[str, Any]) -> None:
        self.cache.capture(kwargs)
        model = Obj(body)
        key = model.key
        if key is None:
            return
        if event_type == "DELETED":
            self._forget(key)
            return
        generation = model.metadata.get("generation")
        # A new model or a changed spec goes ahead of status-only reconciles of others.
        urgent = self._generations.get(key) != generation
        self._generations[key] = generation
        if not urgent and self._own_status.get(key) == model.metadata.get("resourceVersion"):
            return  # the echo of the operator's own status patch: nothing new to decide
        self.queue.add(key, urgent=urgent)

    def on_child(self, body: Mapping[str, Any], event_type: str | None, kwargs: Mapping[str, Any]) -> None:
        self.cache.capture(kwargs)
        key = owner_key(body)
        if body.get("kind") == "Job" and (job := Obj(body).key) is not None:
            if event_type == "DELETED" or key is None:
                self._job_models.pop(job, None)
            else:
                self._job_models[job] = key
        if key is not None and event_type == "DELETED":
            self.cache.deleted(key, body)
        if key is not None and self.cache.has_model(key):
            self.queue.add_after(key, SETTLE_SECONDS)
        uri = compile_uri(body)
        namespace = Obj(body).namespace
        if uri and namespace:
            # A compile Job or record concerns every model of its artefact, not only its maker:
            # those waiting for another model's compile, or able to start from its record.
            for other in self.cache.models_of_artefact(namespace, uri):
                if other != key:
                    self.queue.add_after(other, SETTLE_SECONDS)

    def on_pod(self, body: Mapping[str, Any], event_type: str | None, kwargs: Mapping[str, Any]) -> None:
        self.cache.capture(kwargs)
        name = Obj(body).key
        if name is None:
            return
        if name[0] == self.settings.node_cache_namespace and (
            Obj(body).labels.get(NODE_CACHE_POD_LABEL) == "true" or name in self._cache_pods
        ):
            # A node cache's pod (only in the cache's namespace, as the index reads them), or one that was.
            self._on_cache_pod(name, None if event_type == "DELETED" else project_node_cache_pod(body))
            return
        node, key = Obj(body).spec.get("nodeName"), owner_key(body)
        if event_type == "DELETED":
            self._pods.pop(name, None)
            self._forget_pod(node, name)
        else:
            if node and key is not None:
                self._node_models.setdefault(node, {})[name] = key
            signature = pod_signature(body)
            if self._pods.get(name) == signature:
                return  # nothing status reports has changed
            self._pods[name] = signature
        if key is not None and self.cache.has_model(key):
            self.queue.add_after(key, SETTLE_SECONDS)

    def on_node(self, body: Mapping[str, Any], event_type: str | None, kwargs: Mapping[str, Any]) -> None:
        """A node's Neuron fault appearing, changing or ending: the models with a pod there report it.
        A Neuron node added, deleted, or changed in what decides whether a replica may go there:
        the models that fill ahead are decided again."""
        self.cache.capture(kwargs)
        name = Obj(body).name
        if not name:
            return
        if event_type == "DELETED":
            self._node_faults.pop(name, None)
            self._node_models.pop(name, None)  # its pods' models hear of it from their pods
            if self._node_openings.pop(name, None) is not None:
                self._refill()
            return
        node = project_neuron_node(body)
        opening = None if node is None else _opening(node)
        if _changed(self._node_openings, name, opening):
            self._refill()
        # What the decision reads of a faulted node: its fault, and whether a replacement may go
        # there. A healthy node is kept no trace of; a model left on a faulted node for want of
        # another (device_faults/part.py) is decided again at its resync.
        state = None if node is None or node["fault"] is None else (node["fault"], node["unschedulable"], node["taints"], node["ready"])
        if not _changed(self._node_faults, name, state):
            return
        for key in set(self._node_models.get(name, {}).values()):
            if self.cache.has_model(key):
                self.queue.add_after(key, SETTLE_SECONDS)

    def _on_cache_pod(self, name: tuple[str, str], found: tuple[str, dict[str, Any]] | None) -> None:
        """A node cache's pod made, replaced, or holding other artefacts: the models that fill
        ahead are decided again (fill_ahead/part.py fills a node again whose cache lost theirs)."""
        said = None if found is None else (found[0], found[1]["created"], found[1]["ready"], tuple(found[1]["held"]))
        if _changed(self._cache_pods, name, said):
            self._refill()

    def _refill(self) -> None:
        """The models that fill ahead, decided again: the nodes open to their replicas changed."""
        for key in self._filling:
            if self.cache.has_model(key):
                self.queue.add_after(key, SETTLE_SECONDS)

    def _forget_pod(self, node: Any, pod: tuple[str, str]) -> None:
        """A pod gone from its node; a node with none of the models' pods left is forgotten."""
        on_node = self._node_models.get(node) if isinstance(node, str) else None
        if on_node is not None:
            on_node.pop(pod, None)
            if not on_node:
                del self._node_models[node]

    def on_job_event(self, body: Mapping[str, Any], event_type: str | None, kwargs: Mapping[str, Any]) -> None:
        """A Job's FailedCreate event: its model, if the Job is one of the operator's, reports it."""
        self.cache.capture(kwargs)
        involved = body.get("involvedObject")
        namespace = Obj(body).namespace
        if event_type == "DELETED" or not isinstance(involved, Mapping) or not namespace:
            return
        key = self._job_models.get((namespace, str(involved.get("name"))))
        if key is not None and self.cache.has_model(key):
            self.queue.add_after(key, SETTLE_SECONDS)


def _changed(seen: dict[Any, tuple[Any, ...]], key: Any, value: tuple[Any, ...] | None) -> bool:
    """Whether ``value`` is news for ``key`` in ``seen``, which keeps it (None: forgets the key)."""
    if seen.get(key) == value:
        return False
    if value is None:
        seen.pop(key, None)
    else:
        seen[key] = value
    return True


def _opening(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a Neuron node (projection.project_neuron_node) decides whether a model's replica
    may go there, and so whether its cache is filled ahead: not its heartbeats."""
    taints = tuple(tuple(sorted(t.items())) for t in node.get("taints") or ())
    labels = tuple(sorted((node.get("labels") or {}).items()))
    return (node.get("ready"), node.get("fault") is None, node.get("unschedulable"), node.get("cut"), taints, labels)
