"""The kopf wiring: the watches, the indexes that cache them, and the triggers of the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from inferentia_operator.core import api
from inferentia_operator.core.holds import NODE_CACHE_POD_LABEL
from inferentia_operator.core.kinds import CHILD_KINDS, ChildKind
from inferentia_operator.core.names import FIELD_MANAGER, MANAGED_BY_LABEL
from inferentia_operator.core.projection import (
    JOB_EVENT_SELECTOR,
    Packed,
    compile_uri,
    owner_key,
    project,
    project_job_event,
    project_neuron_node,
    project_node_cache_pod,
    project_pod_spec,
    project_record,
)

from .reconciler import Reconciler

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={FIELD_MANAGER}"
# kopf lists every kind before it watches it, at start and whenever a watch must start again.
# Unchunked, the list of 1,000 models' pods is one answer of megabytes, read and decoded in one
# piece; in pages of this many (settings.watching.chunk_size) each answer is bounded, at the
# cost of a request a page. It bounds the answer, not the process: kopf still holds every
# listed object until every kind is listed (see slim).
LIST_CHUNK = 250
KOPF_WORKER_IDLE_SECONDS = 0.5


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, for an operator without change handlers: nothing.

    At every watch event kopf builds the object's "essence" (a deep copy of the whole object)
    to diff it for create/update handlers. The operator registers none (tests/
    test_registration.py), so the diff is never read; building it was 9% of the operator's
    samples at 20 creates a second (py-spy, benchmark-scale --profile)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure_watches(settings: kopf.OperatorSettings) -> None:
    """The children and pods are filtered on the server: the operator is sent only its own.

    An object whose managed-by label someone removes leaves these watches: the API
    server sends a DELETED event for it. Its model is then reconciled, finds the child
    missing from the cache, and creates it; the create's 409 makes it GET the object,
    recognise it as its own by its owner reference, and apply it again, which puts the
    labels back."""
    for child in CHILD_KINDS:
        settings.watching.label_selectors[child.group, child.version, child.plural] = MANAGED_SELECTOR
    # Of events, the Job controller's FailedCreate alone (reconciler.on_job_event).
    settings.watching.field_selectors["", "v1", "events"] = JOB_EVENT_SELECTOR
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.chunk_size = LIST_CHUNK
    # kopf keeps a worker per object for this long after its last event, and the worker keeps
    # that event's body: 5 s by default. The operator's handlers only index and enqueue, so a
    # worker made again costs little, and one that lingers over a freeze of the collector
    # (shell/memory.py) holds its body until the next thaw.
    settings.queueing.idle_timeout = KOPF_WORKER_IDLE_SECONDS


def slim(body: Mapping[str, Any]) -> None:
    """Cuts a delivered object, in place, down to what the event handlers read of it
    (Reconciler.on_model, on_child, on_pod): its metadata without managedFields; a compile
    Job's or record's artefact URI (each names one artefact, and is kept whole); a pod's node,
    plan volumes and status. The indexes have projected it whole by then (it runs last).

    Why: kopf holds every listed object, in a worker of its own, until every kind has been
    listed and indexed (the wait on ``operator_indexed`` in kopf/_core/reactor/processing.py).
    A restart over 1,000 models so held every model, Deployment, Service and ConfigMap at once,
    and the process kept that peak: 340 MB right after it, where converging had left 148 MB;
    cut down, 190 MB (make benchmark-scale, docs/benchmarks.md). ``body`` is kopf's view of the
    object, whose fields are the parsed objects themselves, so clearing them frees what they held."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    if compile_uri(body) is not None:
        return
    pod = body.get("kind") == "Pod"
    for field, value in body.items():
        if field in ("apiVersion", "kind", "metadata") or not isinstance(value, (dict, list)) or (pod and field == "status"):
            continue
        if pod and field == "spec" and isinstance(value, dict):
            kept = project_pod_spec(value)  # what pod_signature reads back, in the form it reads
            value.clear()
            value.update(kept)
        else:
            value.clear()


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, node_faults: bool = True) -> None:
    """Registers the indexes (the caches), the triggers and the worker pool."""
    model: dict[str, Any] = dict(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, registry=registry)

    # Async, so that kopf runs them on its event loop, where the queue lives, not in threads.
    # kopf passes each index to handlers under its id.
    @kopf.index(**model, id="model_index")
    async def model_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(namespace, name): Packed(project(body))}

    @kopf.index(**model, id="compiled_uri_index")
    async def compiled_uri_index(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> dict[Any, Any] | None:
        uri = status.get("compiledUri")
        return {(namespace, uri): name} if uri else None

    # The namespace's compile Jobs and records of completed compiles, by the artefact they
    # concern, whichever model made them (the child indexes file them under their maker).
    @kopf.index("batch", "v1", "jobs", registry=registry, id="compile_job_index")
    async def compile_job_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
        uri = compile_uri(body)
        return {(namespace, uri): Packed(project(body))} if uri else None

    @kopf.index("", "v1", "configmaps", registry=registry, id="compile_record_index")
    async def compile_record_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
        uri = compile_uri(body)
        return {(namespace, uri): Packed(project_record(body))} if uri else None

    # The FailedCreate events of Jobs, by (namespace, Job name): why a compile Job has no pod.
    @kopf.index("", "v1", "events", registry=registry, id="job_event_index")
    async def job_event_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
        said = project_job_event(body)
        involved = body.get("involvedObject") or {}
        return {(namespace, involved.get("name")): said} if said is not None and namespace else None

    @kopf.on.event("", "v1", "events", registry=registry, id="on_job_event")
    async def on_job_event(body: kopf.Body, type: str | None, **kwargs: Any) -> None:
        reconciler.on_job_event(body, type, kwargs)

    # The Neuron nodes, by name (their instance type, readiness, taints and Neuron fault): where a
    # model's pods fail (the node problem detector's NeuronHealth) and where a replacement could go.
    if node_faults:

        @kopf.index("", "v1", "nodes", registry=registry, id="neuron_node_index")
        async def neuron_node_index(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
            node = project_neuron_node(body)
            return {name: node} if node is not None else None

        @kopf.on.event("", "v1", "nodes", registry=registry, id="on_node")
        async def on_node(body: kopf.Body, type: str | None, **kwargs: Any) -> None:
            reconciler.on_node(body, type, kwargs)

        # The node caches' pods, by node: what each says it holds (fill-ahead fills a node again
        # whose cache lost an artefact). Only in the cache's own namespace: a pod elsewhere that
        # wears the label says nothing.
        @kopf.index("", "v1", "pods", registry=registry, id="node_cache_index", labels={NODE_CACHE_POD_LABEL: "true"})
        async def node_cache_index(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
            if not reconciler.settings.node_cache_namespace or namespace != reconciler.settings.node_cache_namespace:
                return None
            found = project_node_cache_pod(body)
            return {found[0]: found[1]} if found is not None else None

    def child_index(child: ChildKind) -> None:
        async def index(body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
            key = owner_key(body)
            return {key: Packed(child.projection(body))} if key else None

        kopf.index(child.group, child.version, child.plural, registry=registry, id=child.index)(index)

    for child in CHILD_KINDS:
        child_index(child)

    # Last of each kind's index handlers: kopf runs them in the order registered.
    async def slim_handler(body: kopf.Body, **_: Any) -> None:
        slim(body)

    kopf.index(**model, id=f"slim_{api.PLURAL}")(slim_handler)
    for child in CHILD_KINDS:
        kopf.index(child.group, child.version, child.plural, registry=registry, id=f"slim_{child.plural}")(slim_handler)

    @kopf.on.event(**model, id="on_model")
    async def on_model(body: kopf.Body, type: str | None, **kwargs: Any) -> None:
        reconciler.on_model(body, type, kwargs)

    for child in CHILD_KINDS:
        handler = reconciler.on_pod if child.kind == "Pod" else reconciler.on_child

        async def on_child(body: kopf.Body, type: str | None, _handler: Any = handler, **kwargs: Any) -> None:
            _handler(body, type, kwargs)

        kopf.on.event(child.group, child.version, child.plural, registry=registry, id=f"on_{child.kind.lower()}")(on_child)

    @kopf.on.startup(registry=registry)
    async def start_workers(memo: kopf.Memo, **_: Any) -> None:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(reconciler.worker()) for _ in range(reconciler.workers)]
        tasks.append(loop.create_task(reconciler.worker(urgent_only=True)))
        memo["reconcile_tasks"] = [*tasks, loop.create_task(reconciler.resync()), loop.create_task(reconciler.settle_when_due())]

    @kopf.on.cleanup(registry=registry)
    async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
        for task in memo.get("reconcile_tasks", []):
            task.cancel()
