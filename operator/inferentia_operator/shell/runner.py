"""`inferentia-operator run`: kopf, configured for this operator."""

from __future__ import annotations

import asyncio
import base64
import datetime
import functools
import logging
import os
import random
import sys
import time
import weakref
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import kopf

from inferentia_operator.core.names import FIELD_MANAGER, MANAGED_BY_LABEL
from inferentia_operator.core.objects import Obj
from inferentia_operator.core.proof import KEY_BYTES, Prover
from inferentia_operator.core.settings import Settings

from . import memory, metrics, wiring
from .act import calls_in_flight
from .kube import ApiError, Kube
from .reconciler import Reconciler
from .transport import Transport, login_info

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RunOptions:
    """How `run` runs (cli.py has each flag's help); what it decides with is :class:`Settings`."""

    namespaces: tuple[str, ...] = ()  # none: every namespace
    liveness: str = ""
    peering: str = "inferentia-operator"
    standalone: bool = False
    priority: int | None = None  # None: a random one, drawn at start
    resync_seconds: float = 300.0
    workers: int = 4
    metrics_port: int = 0
    key_secret: str = "inferentia-operator-proof-key"
    key_namespace: str = "default"
    verbose: bool = False
    node_faults: bool = True  # watch nodes for the node problem detector's Neuron faults


def proof_key(kube: Kube, namespace: str, name: str) -> bytes:
    """The key the operator proves its compile records and Jobs with (core/proof.py), from the
    Secret ``namespace/name``, which the first replica to start creates with 32 random bytes.
    Model users have no access to the operator's namespace; deleting the Secret makes a new key
    at the next start, and every artefact compiles again once (docs/design.md)."""
    secret = kube.get("Secret", namespace, name)
    if secret is None:
        body = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: FIELD_MANAGER}},
            "data": {"key": base64.b64encode(os.urandom(KEY_BYTES)).decode()},
        }  # fmt: skip
        if kube.create(body) is not None:
            log.info("created the proof key Secret %s/%s", namespace, name)
        secret = kube.get("Secret", namespace, name)  # another replica's, if it created it first
    raw = ((secret or {}).get("data") or {}).get("key") or ""
    key = base64.b64decode(raw, validate=True) if raw else b""
    if len(key) < KEY_BYTES:
        raise ValueError(f"Secret {namespace}/{name} has no key of at least {KEY_BYTES} bytes in data.key; delete it to make a new one")
    return key


def configure(settings: kopf.OperatorSettings, options: RunOptions) -> None:
    # No finalizer or progress storage to name: the operator registers indexes and event
    # handlers only (wiring.py), for which kopf writes nothing into a model
    # (tests/test_registration.py, and the audit log in tests/e2e/test_operator.py).
    settings.peering.name = options.peering
    if options.priority is not None:
        settings.peering.priority = options.priority
    settings.peering.stealth = True  # keep-alives every minute would drown the log
    settings.posting.level = logging.WARNING  # kopf's own progress events; ours are posted explicitly
    # No watch timeout of our own: the API server ends each watch after its
    # --min-request-timeout (30 to 60 minutes), and kopf resumes it; at rest that is the
    # only request besides peering.
    # Watching every namespace, kopf also watches CRDs (its ClusterRole may list them), so
    # that KEDA installed after the operator is watched at once. Watching chosen namespaces,
    # the operator has no cluster-wide access at all: no CRD watch and no namespace listing,
    # and a KEDA installed later is watched from the operator's next start (its ScaledObjects
    # are written meanwhile; only their status is not read).
    settings.scanning.disabled = bool(options.namespaces)
    wiring.configure_watches(settings)


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf's per-object log says "Handler 'on_pod' succeeded." at INFO for every watch event:
    # a line per pod change at 1,000 models, and 2% of the operator's CPU at 20 creates a
    # second. Its warnings and errors (a handler's exception) still show.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if verbose else logging.WARNING)


def peering_paused(bodies: list[dict[str, Any] | None], priority: int, now: datetime.datetime) -> bool:
    """kopf's own rule, read from the peering objects: a replica stands by while a live peer
    has a higher priority, or another has the same one.

    The periodic resync must know this, and kopf does not expose its pause state: its
    watches stop while paused (so the caches freeze and no event triggers a reconcile),
    but a loop of the operator's own keeps running. This reads what kopf writes, the
    keep-alives in the peering objects' status: {peer id: {priority, lifetime, lastseen}}."""
    same = 0
    for body in bodies:
        for peer in Obj(body).status.values():
            if not isinstance(peer, dict):
                continue
            try:
                seen = datetime.datetime.fromisoformat(str(peer["lastseen"]))
                lifetime = datetime.timedelta(seconds=int(peer["lifetime"]))
                peer_priority = int(peer["priority"])
            except (KeyError, TypeError, ValueError):
                continue
            alive = (seen if seen.tzinfo else seen.replace(tzinfo=datetime.UTC)) + lifetime > now
            if alive and peer_priority > priority:
                return True
            same += alive and peer_priority == priority
    return same > 1  # ourselves, and another replica with our priority


def peering_objects(name: str, namespaces: list[str]) -> list[dict[str, Any]]:
    """kopf peers through a ClusterKopfPeering when watching all namespaces, else a KopfPeering in each."""
    if not namespaces:
        return [{"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}]
    return [{"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name, "namespace": ns}} for ns in namespaces]


def start_priority(now_ns: int) -> int:
    """A replica's peering priority when --priority is not given: the millisecond it started,
    with three random digits below it.

    kopf lets the live replica of the highest priority act, pauses every replica that shares
    one, and keeps a replica that died without stopping (kill -9, its node gone) live until
    its keep-alive's lifetime (60 s) runs out. Ranked by start, a replacement under another
    peer id (a new pod, a process outside the cluster) ranks above it and acts at once; a
    random rank would make it wait out that minute half the time. The random digits keep two
    replicas started in the same millisecond apart, as kopf needs. About 1.8e15: held exactly
    by every JSON reader of the peering object's status (below 2**53)."""
    return now_ns // 1_000_000 * 1000 + random.SystemRandom().randrange(1000)


def run(options: RunOptions, settings: Settings) -> int:
    if options.priority is None:
        options = replace(options, priority=start_priority(time.time_ns()))
    configure_logging(options.verbose)
    memory.limit_arenas()  # before any API thread allocates (shell/memory.py)
    memory.tune_collector()
    memory.time_collections(metrics.observe_gc_pause)
    registry = kopf.OperatorRegistry()
    # One API client for the whole operator, with a connection for every call in flight.
    kube = functools.cache(lambda: Kube(Transport(pool_size=calls_in_flight(options.workers))))
    namespaces = list(options.namespaces)

    def active() -> bool:
        if options.standalone:
            return True
        try:
            bodies = [
                kube().get(b["kind"], b["metadata"].get("namespace"), b["metadata"]["name"])
                for b in peering_objects(options.peering, namespaces)
            ]
        except ApiError:
            return False  # cannot tell: standing by is the safe side
        assert options.priority is not None
        return not peering_paused(bodies, options.priority, datetime.datetime.now(datetime.UTC))

    try:
        settings = replace(settings, prover=Prover(proof_key(kube(), options.key_namespace, options.key_secret)))
    except (ApiError, ValueError) as exc:
        log.error("the proof key: %s", exc)
        return 1
    reconciler = Reconciler(kube, options.workers, options.resync_seconds, active, settings)
    wiring.register(registry, reconciler, node_faults=options.node_faults)
    if options.metrics_port:
        metrics.serve(options.metrics_port)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
        configure(settings, options)
        if not options.standalone:
            # Without its peering object kopf only logs "not found" at debug level and every
            # replica acts: make sure it exists (the chart and manifests also create it).
            for body in peering_objects(options.peering, namespaces):
                if kube().create_if_missing(body):
                    logger.info("created %s %s", body["kind"], body["metadata"])

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as the operator's own calls (shell/transport.py).
        return login_info(settings)

    operator = kopf.operator(
        registry=registry,
        standalone=options.standalone,
        peering_name=None if options.standalone else options.peering,
        priority=options.priority,
        liveness_endpoint=options.liveness or None,
        clusterwide=not namespaces,
        namespaces=namespaces,
    )
    # What kopf.run does, with the watch streams kopf leaves open closed in order on the way out.
    try:
        asyncio.run(closing_generators_outermost_first(operator))
    except asyncio.CancelledError:
        pass
    return 0


async def closing_generators_outermost_first(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro``, then closes the async generators it left open, oldest first.

    kopf's watcher does not close its watch stream (an async generator holding kopf's
    ``streaming_block`` and the continuous watch, themselves async generators) when it is
    cancelled between two events. asyncio.run then closes every generator still open at
    once (``loop.shutdown_asyncgens``), the held ones beside their holder, and the holder's
    ``async with`` fails with "generator didn't stop after athrow()". A generator starts
    before the ones it holds, so closing in the order they started closes each holder while
    what it holds is still open, as an ``async with`` expects.
    """
    firstiter, finalizer = sys.get_asyncgen_hooks()
    started: weakref.WeakKeyDictionary[AsyncGenerator[Any, Any], None] = weakref.WeakKeyDictionary()

    def first_iteration(generator: AsyncGenerator[Any, Any]) -> None:
        started[generator] = None  # a dict: kept in the order they started; gone once collected
        if firstiter is not None:
            firstiter(generator)  # asyncio's own hook: the loop still finalizes what is collected

    sys.set_asyncgen_hooks(firstiter=first_iteration, finalizer=finalizer)
    try:
        return await coro
    finally:
        for generator in list(started):
            try:
                await generator.aclose()
            except Exception as exc:  # noqa: BLE001 - whatever a generator raises: reported as asyncio.run reports it
                asyncio.get_running_loop().call_exception_handler(
                    {
                        "message": f"an error occurred during closing of asynchronous generator {generator!r}",
                        "exception": exc,
                        "asyncgen": generator,
                    }
                )
