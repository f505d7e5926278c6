"""The holder: what answers a model's Service while the model is scaled to zero.

A Service with no ready endpoints refuses connections, so a request sent to a model at
zero replicas would be lost. While the model has no replica, the operator points the
model's Service at this small CPU-only server instead (``inferentia-operator hold``, run by
the ``<model>-holder`` Deployment). It accepts each request and holds it, and counts it in
``inferentia_num_requests_waiting``, the gauge the model's ScaledObject sums: KEDA sees
demand and scales the model from zero. Once a replica answers on the upstream Service
(``<model>-replicas``, which selects only the serving pods), the holder forwards each held
request to it and passes the answer back. The operator then points the model's Service at
the replicas again, so a warm model's requests never pass through here.

Bounded like the batching front end (``Limits``): a request held longer than ``hold_seconds``,
or one beyond ``max_held`` held at once, is answered 503 with ``Retry-After``.
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

from .frontend import LimitedSite, _healthy, _MalformedRequests, until_signalled
from .limits import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)

# Headers that belong to one connection, not to the request (RFC 9110, section 7.6.1), and
# the ones aiohttp sets itself for the body it sends.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
    "upgrade", "host", "content-length",
}  # fmt: skip
# How often a holder with requests waiting asks whether the upstream answers.
PROBE_SECONDS = 0.2
# A connection to the upstream Service: immediate when a replica is behind it.
CONNECT_SECONDS = 1.0


def _end_to_end(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers that travel on: hop-by-hop ones stay behind."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


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


class Holder:
    def __init__(self, upstream_host: str, hold_seconds: float, max_held: int, limits: Limits = DEFAULT_LIMITS):
        self.upstream_host = upstream_host
        self.hold_seconds, self.max_held, self.limits = hold_seconds, max_held, limits
        self.metrics = Metrics()
        self._waiting = 0
        self._held_bytes = 0
        self.metrics.waiting.set_function(lambda: self._waiting)
        self._session: aiohttp.ClientSession | None = None
        self._up: dict[int, asyncio.Event] = {}  # per upstream port: set once it accepts a connection
        self._probes: dict[int, asyncio.Task[None]] = {}

    def app(self, upstream_port: int) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body)
        app["upstream_port"] = upstream_port
        app.router.add_get("/healthz", _healthy)
        app.router.add_get("/readyz", _healthy)
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
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_SECONDS), auto_decompress=False)
        return self._session

    async def scrape(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    def _refuse(self, code: int, why: str) -> web.Response:
        self.metrics.rejected.labels(str(code)).inc()
        return web.json_response({"error": why}, status=code, headers={"Retry-After": "1"})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await asyncio.wait_for(request.read(), self.limits.body_timeout)
        except TimeoutError:
            return self._refuse(408, "the body was not sent in time")
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, f"the body is larger than {self.limits.max_body} bytes")
        if self._waiting >= self.max_held:
            return self._refuse(503, f"{self.max_held} requests are held already; retry later")
        if self._held_bytes + len(body) > self.limits.body_budget:
            # Held bodies stay in memory until a replica answers: the budget bounds them.
            return self._refuse(503, "the bodies held already fill the holder's budget; retry later")
        started = time.monotonic()
        upstream = await self._held_until_sent(request, body, started)
        if isinstance(upstream, web.Response):
            return upstream
        self.metrics.held.observe(time.monotonic() - started)
        async with upstream:
            answer = web.StreamResponse(status=upstream.status, headers=_end_to_end(upstream.headers))
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    async def _held_until_sent(self, request: web.Request, body: bytes, started: float) -> aiohttp.ClientResponse | web.Response:
        """Sends the request upstream once a replica accepts it: its answer, or the refusal
        when none did within the hold. Counted as held (and its body as held bytes) meanwhile."""
        port = request.app["upstream_port"]
        url = f"http://{self.upstream_host}:{port}{request.rel_url}"
        self._waiting += 1
        self._held_bytes += len(body)
        try:
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
                except aiohttp.ClientError as exc:
                    # Sent, and the replica failed it (it went away mid-request): not retried,
                    # since the request may have been received.
                    return self._refuse(502, f"the replica did not answer: {type(exc).__name__}")
        finally:
            self._waiting -= 1
            self._held_bytes -= len(body)

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
        while not event.is_set() and self._waiting > 0:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.upstream_host, port), CONNECT_SECONDS)
                writer.close()
                event.set()
            except (OSError, TimeoutError):
                await asyncio.sleep(PROBE_SECONDS)


async def run(holder: Holder, host: str, ports: list[tuple[int, int]], stop: asyncio.Event | None = None) -> None:
    """One site per port of the model's Service, (listen, upstream): each forwards to its upstream port."""
    runners = []
    logging.getLogger("aiohttp.server").addFilter(_MalformedRequests(holder.metrics.rejected))
    try:
        for port, upstream_port in ports:
            runner = web.AppRunner(
                holder.app(upstream_port), access_log=None, keepalive_timeout=holder.limits.header_timeout, lingering_time=1.0
            )
            await runner.setup()
            runners.append(runner)
            site = LimitedSite(runner, host, port, holder.limits.max_connections, holder.metrics.rejected.labels("503").inc)
            await site.start()
        holder.metrics.connections.set_function(lambda: sum(len(r.server.connections) for r in runners if r.server is not None))
        await (stop or asyncio.Event()).wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def serve(
    upstream_host: str,
    ports: list[tuple[int, int]],
    hold_seconds: float,
    max_held: int,
    limits: Limits = DEFAULT_LIMITS,
    host: str = "0.0.0.0",
) -> None:
    holder = Holder(upstream_host, hold_seconds, max_held, limits)
    until_signalled(lambda stop: run(holder, host, ports, stop))
