"""The holder: what answers a model's Service while the model is scaled to zero.

A Service with no ready endpoints refuses connections, so a request sent to a model at
zero replicas would be lost. While the model has no replica, the operator points the
model's Service at this small CPU-only server instead (``inferentia-operator hold``, run by
the ``<model>-holder`` Deployment). It accepts each request and holds it, tells KEDA at
once through KEDA's external scaler API (:mod:`.scaler`, the ScaledObject's external-push
trigger), and counts it in ``inferentia_num_requests_waiting``, the gauge the ScaledObject's
Prometheus trigger sums: KEDA scales the model from zero. Once a replica answers on the upstream Service
(``<model>-replicas``, which selects only the serving pods), the holder forwards each held
request to it and passes the answer back. The operator then points the model's Service at
the replicas again, so a warm model's requests never pass through here.

Bounded like the batching front end (``Limits``, docs/security.md): a request held longer
than ``hold_seconds``, or one beyond ``max_held`` held at once, is answered 503 with
``Retry-After``, and held bodies are charged against the body budget before they are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from . import scaler
from .frontend import LimitedSite, _MalformedRequests, until_signalled
from .intake import Charge, Refusal, read_body, stall, taken_in_time
from .limits import DEFAULT_LIMITS, Budget, Limits

log = logging.getLogger(__name__)

# Headers that belong to one connection, not to the request (RFC 9110, section 7.6.1), and
# the ones aiohttp sets itself for the body it sends.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
    "upgrade", "host", "content-length",
}  # fmt: skip
# How soon a holder with requests waiting asks again whether the upstream answers: after
# FIRST_PROBE_SECONDS, doubling up to PROBE_SECONDS. A replica that comes up just after a
# refused try is found within tens of milliseconds, and a long wait costs at most one try per
# PROBE_SECONDS a port (a refused connection to a Service without endpoints: no more).
FIRST_PROBE_SECONDS = 0.01
PROBE_SECONDS = 0.2
# A connection to the upstream Service: immediate when a replica is behind it.
CONNECT_SECONDS = 1.0


def upstream_host(service: str, environ: Mapping[str, str]) -> str:
    """The address of the Service ``service`` in the pod's own namespace: the variable the
    kubelet sets for every Service that existed when the pod was created, ``{NAME}_SERVICE_HOST``
    with the name upper-cased and dashes made underscores (Kubernetes, Concepts > Services >
    Discovering services > Environment variables,
    https://kubernetes.io/docs/concepts/services-networking/service/#environment-variables).
    The operator creates the holder only once that Service exists, so the variable is there;
    without it (a pod with enableServiceLinks false), the name, for the cluster's DNS."""
    return environ.get(service.upper().replace("-", "_") + "_SERVICE_HOST") or service


def _end_to_end(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers that travel on: hop-by-hop ones stay behind, and so do those the
    ``Connection`` header names as hop-by-hop for this connection (RFC 9110, section 7.6.1)."""
    named = {token.strip().lower() for value in _all(headers, "Connection") for token in value.split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named}


def _all(headers: Mapping[str, str], name: str) -> list[str]:
    getall = getattr(headers, "getall", None)  # a multidict: every Connection header, not the first
    return list(getall(name, ())) if getall is not None else [v for k, v in headers.items() if k.lower() == name.lower()]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The batching front end's gauge: the model's ScaledObject sums it over the model's pods.
        self.waiting = Gauge("inferentia_num_requests_waiting", "Requests held until a replica answers: TotalQueuedRequests.", registry=r)
        self.held = Histogram(
            "inferentia_hold_seconds", "Time a request was held before it was forwarded.",
            buckets=(0.01, 0.1, 1, 5, 10, 30, 60, 120, 300, 600), registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "inferentia_hold_rejected", "Requests answered without reaching a replica, by status code.", ["code"], registry=r
        )
        self.connections = Gauge("inferentia_hold_connections", "Open client connections.", registry=r)
        self.probes = Counter("inferentia_hold_probes", "Tries to connect to the replicas while requests are held.", registry=r)
        self.unread = Counter(
            "inferentia_hold_answers_unread", "Answers a client stopped reading for the body deadline: its connection cut.", registry=r
        )
        self.scaler_streams = Gauge(
            "inferentia_hold_scaler_streams", "Open StreamIsActive calls of KEDA's external scaler API.", registry=r
        )


class Holder:
    def __init__(self, upstream_host: str, hold_seconds: float, max_held: int, limits: Limits = DEFAULT_LIMITS):
        self.upstream_host = upstream_host
        self.hold_seconds, self.max_held, self.limits = hold_seconds, max_held, limits
        self.metrics = Metrics()
        self._waiting = 0
        self.budget = Budget(limits)  # held bodies: Limits.body_budget
        self.metrics.waiting.set_function(lambda: self._waiting)
        self._session: aiohttp.ClientSession | None = None
        self._up: dict[int, asyncio.Event] = {}  # per upstream port: set once it accepts a connection
        self._probes: dict[int, asyncio.Task[None]] = {}
        self._changed: asyncio.Event | None = None  # set at the next change of the held count

    def held(self) -> int:
        """Requests in the holder now: held, or being forwarded."""
        return self._waiting

    def changed(self) -> asyncio.Event:
        """An event set when the number of held requests next changes (the external scaler waits on it)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _count(self, step: int) -> None:
        self._waiting += step
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def app(self, upstream_port: int) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body)
        app["upstream_port"] = upstream_port
        app.router.add_get("/healthz", self.live)
        app.router.add_get("/readyz", self.ready)
        app.router.add_get("/metrics", self.scrape)
        app.router.add_route("*", "/{path:.*}", self.forward)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No total timeout: a model may take minutes to answer; the hold is bounded below.
            # No total timeout: a model may stream its answer for minutes; a replica silent for
            # process_timeout is given up on. The hold itself is bounded below.
            timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_SECONDS, sock_read=self.limits.process_timeout)
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self._session

    async def scrape(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    async def ready(self, _request: web.Request) -> web.Response:
        stalled = stall(self.budget, self.hold_seconds)
        return web.json_response(stalled or {"ok": True}, status=503 if stalled else 200)

    async def live(self, _request: web.Request) -> web.Response:
        stalled = stall(self.budget, self.limits.body_timeout + self.hold_seconds + self.limits.process_timeout)
        return web.json_response(stalled or {"ok": True}, status=503 if stalled else 200)

    def _refuse(self, code: int, why: str, counted_as: int | None = None) -> web.Response:
        self.metrics.rejected.labels(str(counted_as or code)).inc()
        return web.json_response({"error": why}, status=code, headers={"Retry-After": "1"})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self._waiting >= self.max_held:
            # Refused before a byte of the body is read; the connection closes with the answer.
            answer = self._refuse(503, f"{self.max_held} requests are held already; retry later")
            answer.force_close()
            return answer
        charge = Charge.of(self.budget, request)
        self._count(+1)
        try:
            return await self._forward(request, charge)
        except Refusal as refusal:
            self.metrics.rejected.labels(str(refusal.counted_as)).inc()
            return refusal.response()
        except ConnectionError:
            # The client left before its answer began: nobody to tell.
            return self._refuse(400, "the client closed the connection", counted_as=499)
        except Exception as exc:  # noqa: BLE001 - a fault of the holder's: this request is answered, the rest go on
            log.warning("request failed in the holder: %s: %s", type(exc).__name__, exc)
            return self._refuse(500, f"the holder failed on this request: {type(exc).__name__}")
        finally:
            self._count(-1)
            charge.release()

    async def _forward(self, request: web.Request, charge: Charge) -> web.StreamResponse:
        body = await read_body(request, charge, self.limits)
        started = time.monotonic()
        upstream = await self._held_until_sent(request, body, started)
        if isinstance(upstream, web.Response):
            return upstream
        self.metrics.held.observe(time.monotonic() - started)
        async with upstream:
            answer = web.StreamResponse(status=upstream.status, headers=_end_to_end(upstream.headers))
            await answer.prepare(request)
            try:
                # Each piece of the answer is taken by the client within the body deadline, as its
                # request had to arrive within it: a client that stops reading is cut off, which
                # frees its connection and the replica's stream (aiohttp would wait for ever once
                # 64 KiB are unread). A long stream that the client reads runs as long as it runs.
                async for chunk in upstream.content.iter_any():
                    if not await taken_in_time(request, answer.write(chunk), self.limits, self.metrics.unread.inc):
                        return answer
                await taken_in_time(request, answer.write_eof(), self.limits, self.metrics.unread.inc)
            except ConnectionError:
                # The client left while its answer was being written: nobody to tell, and the
                # answer already begun is the one aiohttp closes.
                self.metrics.rejected.labels("499").inc()
            return answer

    async def _held_until_sent(self, request: web.Request, body: bytes, started: float) -> aiohttp.ClientResponse | web.Response:
        """Sends the request upstream once a replica accepts it: its answer, or the refusal
        when none did within the hold."""
        port = request.app["upstream_port"]
        url = f"http://{self.upstream_host}:{port}{request.rel_url}"
        while True:
            try:
                return await self._client().request(
                    request.method, url, data=body, headers=_end_to_end(request.headers), allow_redirects=False
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
                # No replica behind the upstream Service yet: the connection was refused (or,
                # where a Service without endpoints drops packets, never made), so the request
                # was never received and sending it again is safe.
                left = started + self.hold_seconds - time.monotonic()
                if left <= 0:
                    return self._refuse(503, f"no replica answered within {self.hold_seconds:g} s; retry later")
                await self._upstream_answers(port, left)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Sent, and the replica failed it (it went away mid-request): not retried,
                # since the request may have been received.
                return self._refuse(502, f"the replica did not answer: {type(exc).__name__}")

    async def _upstream_answers(self, port: int, within: float) -> None:
        """Waits (at most ``within`` seconds) until the upstream port accepts a connection.
        One probe per port, however many requests wait: held requests do not each knock."""
        event = self._up.get(port)
        if event is None or event.is_set():
            event = self._up[port] = asyncio.Event()
        probe = self._probes.get(port)
        if probe is None or probe.done():
            self._probes[port] = asyncio.create_task(self._probe(port, event))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), within)

    async def _probe(self, port: int, event: asyncio.Event) -> None:
        delay = FIRST_PROBE_SECONDS
        while not event.is_set() and self._waiting > 0:
            self.metrics.probes.inc()
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.upstream_host, port), CONNECT_SECONDS)
                writer.close()
                event.set()
            except (OSError, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(2 * delay, PROBE_SECONDS)


async def run(
    holder: Holder,
    host: str,
    ports: list[tuple[int, int]],
    stop: asyncio.Event | None = None,
    scaler_port: int | None = None,
    target: int = 1,
) -> None:
    """One site per port of the model's Service, (listen, upstream): each forwards to its upstream
    port; with ``scaler_port``, KEDA's external scaler API on it (:mod:`.scaler`)."""
    runners = []
    logging.getLogger("aiohttp.server").addFilter(_MalformedRequests(holder.metrics.rejected))
    external: scaler.Listening | None = None
    try:
        if scaler_port is not None:
            demand = scaler.Demand(holder.held, holder.changed)
            external = await scaler.start(
                scaler.ExternalScaler(demand, target, holder.metrics.scaler_streams.set),
                host,
                scaler_port,
                holder.metrics.rejected.labels("scaler").inc,
            )
        for port, upstream_port in ports:
            # lingering_time: a body left unread after an early answer (a 503) is read and thrown
            # away for as long as an admitted body is waited for, as the front end does: closed
            # with bytes unread, the connection is reset and a client still sending loses the answer.
            runner = web.AppRunner(
                holder.app(upstream_port), access_log=None, keepalive_timeout=holder.limits.header_timeout,
                lingering_time=holder.limits.body_timeout,
            )  # fmt: skip
            await runner.setup()
            runners.append(runner)
            site = LimitedSite(
                runner, host, port, holder.limits.max_connections, holder.metrics.rejected.labels("503").inc,
                per_peer=holder.limits.max_peer_connections,
            )  # fmt: skip
            await site.start()
        holder.metrics.connections.set_function(lambda: sum(len(r.server.connections) for r in runners if r.server is not None))
        await (stop or asyncio.Event()).wait()
    finally:
        if external is not None:
            await external.stop(grace=1)
        for runner in runners:
            await runner.cleanup()


def serve(
    upstream_host: str,
    ports: list[tuple[int, int]],
    hold_seconds: float,
    max_held: int,
    limits: Limits = DEFAULT_LIMITS,
    host: str = "0.0.0.0",
    scaler_port: int | None = None,
    target: int = 1,
) -> None:
    holder = Holder(upstream_host, hold_seconds, max_held, limits)
    until_signalled(lambda stop: run(holder, host, ports, stop, scaler_port, target))
