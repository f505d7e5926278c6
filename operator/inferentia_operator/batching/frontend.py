"""The batching front end: one HTTP server in front of a pod's model processes.

The contract with clients: ``POST /`` (or ``/predict``) with one JSON input; the answer
is that input's JSON output. ``413`` when the input fits no bucket (the body lists
them), ``503`` with ``Retry-After`` when it cannot be answered within ``maxLatencyMs``.

The contract with a model process (``programs/neuron_serve.py`` follows it): ``POST /``
with a JSON list of inputs, answered by a JSON list of outputs of the same length and
order; ``GET /healthz`` answers 200 once the model is loaded. A batch refused with a 4xx
(an input the process will not take) is split in halves and sent again, down to each
request alone, so one client's input fails only its own request; a 5xx fails the batch.

Also: ``GET /metrics`` (Prometheus), ``GET /healthz`` (the front end runs), ``GET
/readyz`` (every model process answers its ``/healthz``).

What a hostile or broken client can cost is bounded by ``Limits`` (docs/security.md): a
deadline for the headers and one for the body, a cap on open connections, and a budget of
body bytes held at once (charged before a body is read, and an input's padded size before it
is padded), so the batcher stays inside its container's memory limit whatever arrives; and
one client address holds at most its share of the connections and of the budget. Every
exception on a request's path answers that request and releases what it held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .dispatch import Dispatch, Dispatcher, Reject, Request
from .intake import Charge, Refusal, over_budget, read_body, stall, taken_in_time
from .limits import DEFAULT_LIMITS, PADDED_ELEMENT_BYTES, BadInput, Budget, Limits, parse_input
from .padding import Shape, TooLarge, bucket_for, pad, shape_of, unpad

log = logging.getLogger(__name__)
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
CLOSE_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)


class Metrics:
    def __init__(self, processes: int):
        self.registry = CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram(
            "inferentia_batch_size", "Inputs per batch sent to a model process.", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.queue_wait = Histogram("inferentia_batch_queue_wait_seconds", "Time a request waited before its batch was sent.", registry=r)
        self.latency = Histogram("inferentia_batch_request_seconds", "Time from a request's arrival to its answer.", registry=r)
        self.rejected = Counter(
            "inferentia_batch_rejected", "Requests answered without a model call, by status code.", ["code"], registry=r
        )
        self.inflight = Gauge("inferentia_batch_inflight", "Batches in flight, per model process.", ["process"], registry=r)
        self.connections = Gauge("inferentia_batch_connections", "Open client connections.", registry=r)
        self.unread = Counter(
            "inferentia_batch_answers_unread", "Answers a client did not read within the body deadline: its connection cut.", registry=r
        )
        # What an autoscaler and an inference gateway read: the Gateway API Inference
        # Extension's model-server protocol asks for TotalQueuedRequests and
        # TotalRunningRequests gauges (vLLM's vllm:num_requests_waiting and
        # vllm:num_requests_running), with names of the server's own choosing
        # (gateway-api-inference-extension, docs/proposals/003-model-server-protocol).
        self.waiting = Gauge("inferentia_num_requests_waiting", "Requests queued for a batch: TotalQueuedRequests.", registry=r)
        self.running = Gauge(
            "inferentia_num_requests_running", "Requests in a batch a process is running: TotalRunningRequests.", registry=r
        )
        for p in range(processes):
            self.inflight.labels(str(p)).set(0)


class FrontEnd:
    def __init__(
        self,
        backends: list[str],
        max_batch: int,
        max_latency: float,
        buckets: list[list[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        dispatcher: Dispatcher | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.backends = backends
        self.limits = limits
        self.budget = Budget(limits, clock)  # bodies read and not yet answered: Limits.body_budget
        # Another policy can be put in (the benchmark compares a fixed window and none).
        self.dispatcher = dispatcher or Dispatcher(len(backends), max_batch, max_latency)
        self.buckets: list[Shape] = [tuple(b) for b in buckets or []]
        self.clock = clock
        self.metrics = Metrics(len(backends))
        self._answers: dict[int, asyncio.Future[Any]] = {}  # every request not yet answered
        self._sent: set[int] = set()  # requests in batches sent to a process, until the batch ends
        self.metrics.running.set_function(self._count_running)
        self.metrics.waiting.set_function(lambda: len(self._answers) - self._count_running())
        self._timer: asyncio.TimerHandle | None = None
        self._session: aiohttp.ClientSession | None = None

    # --- HTTP ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body)
        app.router.add_post("/", self.predict)
        app.router.add_post("/predict", self.predict)
        app.router.add_get("/healthz", self.live)
        app.router.add_get("/readyz", self.ready)
        app.router.add_get("/metrics", self.scrape)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._session:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.limits.process_timeout))
        return self._session

    async def predict(self, request: web.Request) -> web.Response:
        charge = Charge.of(self.budget, request)
        try:
            response = await self._predict(request, charge)
        except Refusal as refusal:
            self.metrics.rejected.labels(str(refusal.counted_as)).inc()
            response = refusal.response()
        except Exception as exc:  # noqa: BLE001 - a fault of the front end's: this request is answered, the rest go on
            log.warning("request failed in the front end: %s: %s", type(exc).__name__, exc)
            response = self._refuse(500, {"error": f"the front end failed on this request: {type(exc).__name__}"})
        finally:
            charge.release()
        return await self._write_answer(request, response)

    async def _write_answer(self, request: web.Request, response: web.Response) -> web.Response:
        """Writes the answer within the body deadline (intake.taken_in_time); aiohttp then finds it
        sent, or the connection gone, and writes nothing more."""

        async def write() -> None:
            await response.prepare(request)
            await response.write_eof()

        try:
            await taken_in_time(request, write(), self.limits, self.metrics.unread.inc)
        except ConnectionError:
            pass  # the client left: aiohttp's own writing of the answer finds it gone too
        return response

    async def _predict(self, request: web.Request, charge: Charge) -> web.Response:
        arrived = self.clock()
        body = await read_body(request, charge, self.limits)
        try:
            payload = parse_input(body)
        except BadInput as exc:
            return self._refuse(400, {"error": str(exc)})
        del body
        shape: Shape | None = None
        bucket: Shape | None = None
        if self.buckets:
            try:
                shape = shape_of(payload)
                bucket = bucket_for(shape, self.buckets)
            except TooLarge as exc:
                return self._refuse(413, {"error": str(exc), "buckets": [list(b) for b in self.buckets]})
            except ValueError as exc:
                return self._refuse(400, {"error": str(exc)})
            # The padded input is charged before it exists: a small body padded to a large
            # bucket costs what the bucket holds.
            padded = math.prod(bucket) * PADDED_ELEMENT_BYTES
            if padded > charge.bytes and not charge.to(padded):
                if padded > self.limits.budget_for(padded):
                    raise Refusal(
                        413, f"padded to bucket {list(bucket)}, the input needs {padded} bytes, more than the front end's body budget"
                    )
                raise over_budget()
            payload = pad(payload, bucket)
        job = Request(arrived, bucket, payload)
        refused = self.dispatcher.arrive(job)
        if refused is not None:
            return self._busy(refused)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[job.id] = answer
        try:
            self._decide()
            outcome = await answer
        finally:
            # However the wait ended, the request no longer counts as waiting or running.
            self._answers.pop(job.id, None)
        if isinstance(outcome, Reject):
            return self._busy(outcome)
        if isinstance(outcome, web.Response):
            return outcome
        self.metrics.latency.observe(self.clock() - arrived)
        if bucket is not None and shape is not None and _shape_or_none(outcome) == bucket:
            outcome = unpad(outcome, shape)
        return web.json_response(outcome)

    def _refuse(self, code: int, body: dict[str, Any], retry_after: int | None = None) -> web.Response:
        """An answer without a model call, counted by its code; ``retry_after`` (seconds) says when to retry."""
        self.metrics.rejected.labels(str(code)).inc()
        return web.json_response(body, status=code, headers={"Retry-After": str(retry_after)} if retry_after else None)

    def _busy(self, reject: Reject) -> web.Response:
        retry = max(1, round(reject.retry_after + 0.5))
        return self._refuse(503, {"error": "cannot be answered within the latency budget; retry later"}, retry_after=retry)

    async def ready(self, _request: web.Request) -> web.Response:
        stalled = stall(self.budget, self.dispatcher.max_latency)
        if stalled is not None:
            return web.json_response(stalled, status=503)
        if self.dispatcher.shedding:
            # Nothing would be admitted: the replica leaves its Service until a probe shows its
            # model answers in time again (batching/dispatch.py).
            return web.json_response({"shedding": "no model process is estimated to answer within the latency budget"}, status=503)

        async def answers(url: str) -> bool:
            try:
                async with self._client().get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    return r.status == 200
            except (TimeoutError, aiohttp.ClientError, OSError):
                return False

        results = await asyncio.gather(*(answers(b) for b in self.backends))
        status = 200 if all(results) else 503
        return web.json_response({"processes": dict(zip(self.backends, results, strict=True))}, status=status)

    async def live(self, _request: web.Request) -> web.Response:
        """200 unless admission has stalled past every bound a request has: its body's
        deadline, its wait for a batch and its batch's call."""
        limits = self.limits
        stalled = stall(self.budget, limits.body_timeout + self.dispatcher.max_latency + limits.process_timeout)
        return web.json_response(stalled or {"ok": True}, status=503 if stalled else 200)

    async def scrape(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": "text/plain; version=0.0.4"})

    def _count_running(self) -> int:
        """Requests a process is working on: sent, and not answered yet."""
        return sum(1 for i in self._sent if i in self._answers)

    # --- dispatch ----------------------------------------------------------------------------

    def _decide(self) -> None:
        actions, wake = self.dispatcher.decide(self.clock())
        for action in actions:
            if isinstance(action, Dispatch):
                asyncio.get_running_loop().create_task(self._send(action))
            else:
                self._resolve(action.request, action)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake is not None:
            delay = max(0.0, wake - self.clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._decide)

    async def _send(self, batch: Dispatch) -> None:
        sent = self.clock()
        n = len(batch.requests)
        self.metrics.batch_size.observe(n)
        self.metrics.inflight.labels(str(batch.process)).inc()
        self._sent.update(r.id for r in batch.requests)
        for r in batch.requests:
            self.metrics.queue_wait.observe(sent - r.arrived)
        answered = False
        try:
            answered = await self._call(batch.process, batch.requests)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, each request of the batch is answered
            log.warning("batch of %d to process %d failed in the front end: %s: %s", n, batch.process, type(exc).__name__, exc)
            for r in batch.requests:
                self._resolve(r, self._refuse(500, {"error": f"the front end failed on this batch: {type(exc).__name__}"}))
        finally:
            self.metrics.inflight.labels(str(batch.process)).dec()
            self._sent.difference_update(r.id for r in batch.requests)
            self.dispatcher.done(batch.process, n, self.clock() - sent, probe=batch.requests[0].probe, answered=answered)
            self._decide()

    async def _call(self, process: int, requests: list[Request]) -> bool:
        """Sends ``requests`` to ``process`` as one batch and answers each. A batch the process
        refuses with a 4xx holds an input it will not take: it is split in halves, each sent
        again, so that each request is answered alone or refused alone (at most 2n - 1 calls
        for n requests, and only when one of them is refused)."""
        n = len(requests)
        # Inputs were admitted finite and at most MAX_DEPTH deep, so this encoding cannot fail
        # on them; allow_nan=False says so.
        data = json.dumps([r.payload for r in requests], allow_nan=False, separators=(",", ":")).encode()
        try:
            async with self._client().post(self.backends[process] + "/", data=data, headers=_JSON) as response:
                status, body = response.status, await response.read()
        except aiohttp.ClientConnectorError as exc:
            # The process is not listening (it died, or is restarting with its pod): the batch
            # never reached it, so a retry is safe. 503 with Retry-After says so to clients and
            # to proxies that retry on 503 (Envoy's retry_on, nginx's proxy_next_upstream),
            # which send it to another replica; 502 would read as a failure of the model.
            log.warning("batch of %d not sent: process %d is not listening: %s", n, process, exc)
            for r in requests:
                self._resolve(r, self._refuse(503, {"error": "the model process is not running; retry"}, retry_after=1))
            return False
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._failed(process, requests, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return False
        if 400 <= status < 500:
            if n > 1:
                first = await self._call(process, requests[: n // 2])
                return await self._call(process, requests[n // 2 :]) and first
            self._resolve(requests[0], self._refuse(status, _model_refusal(status, body)))
            return True  # the model answered, and judged the input
        if status != 200:
            self._failed(process, requests, f"the model process answered {status}")
            return False
        try:
            outputs = json.loads(body)
        except ValueError:
            outputs = None
        if not isinstance(outputs, list) or len(outputs) != n:
            self._failed(process, requests, f"the model process answered {type(outputs).__name__}, not a list of {n}")
            return False
        for r, out in zip(requests, outputs, strict=True):
            self._resolve(r, out)
        return True

    def _failed(self, process: int, requests: list[Request], why: str) -> None:
        log.warning("batch of %d to process %d failed: %s", len(requests), process, why)
        for r in requests:
            self._resolve(r, self._refuse(502, {"error": f"the model process failed: {why}"}))

    def _resolve(self, request: Request, outcome: Any) -> None:
        future = self._answers.pop(request.id, None)
        if future is not None and not future.done():
            future.set_result(outcome)


_JSON = {"Content-Type": "application/json"}


def _model_refusal(status: int, body: bytes) -> dict[str, Any]:
    """The model process's own reason for refusing one input, passed on to its client."""
    try:
        said = json.loads(body)
    except ValueError:
        said = None
    if isinstance(said, dict) and isinstance(said.get("error"), str):
        return {"error": said["error"][:1000]}
    return {"error": f"the model process refused this input ({status})"}


def _shape_or_none(value: Any) -> Shape | None:
    try:
        return shape_of(value)
    except ValueError:
        return None


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request it cannot parse (a header over 8190 bytes, more than 128
    headers) with 400 and logs a traceback at ERROR. A hostile client would write the log at
    will, so these are counted instead, with the 400s the front end sends itself."""

    def __init__(self, rejected: Counter):
        super().__init__()
        self.rejected = rejected

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            self.rejected.labels("400").inc()
            return False
        return True


class _Refused(asyncio.Protocol):
    """A connection over Limits.max_connections: one canned 503, then closed, costing no task."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(CLOSE_BUSY)
        transport.close()


class _PeerGate(asyncio.Protocol):
    """A new connection's first protocol: it hands the transport to aiohttp's handler unless its
    peer (one address: one pod) already holds ``per_peer`` of the site's connections, in which
    case it answers one canned 503 and closes, as _Refused does."""

    def __init__(
        self, handler: Callable[[], asyncio.Protocol], held_by: Callable[[str], int], per_peer: int, refused: Callable[[], None]
    ) -> None:
        self._handler, self._held_by, self._per_peer, self._refused = handler, held_by, per_peer, refused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        if peer and self._held_by(peer[0]) >= self._per_peer:
            self._refused()
            transport.write(CLOSE_BUSY)
            transport.close()
            return
        handler = self._handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)


class LimitedSite(web.BaseSite):
    """A TCP site that hands aiohttp at most ``limit`` connections at once, and with
    ``per_peer`` at most that many from one address."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limit: int,
        refused: Callable[[], None],
        per_peer: int = 0,
        peer_refused: Callable[[], None] | None = None,
    ):
        super().__init__(runner)
        self._host, self._port, self._limit, self._refused = host, port, limit, refused
        self._per_peer, self._peer_refused = per_peer, peer_refused or refused

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # Connections accepted together (a burst in the listen backlog) get their handlers
        # before any of them is registered in server.connections, which happens in
        # connection_made, a callback the transport schedules after this factory returns. So
        # each new handler counts as pending until a callback queued behind its
        # connection_made has run: without it, a burst passed the cap whole.
        pending = [0]

        def registered() -> None:
            pending[0] -= 1

        def connection() -> asyncio.BaseProtocol:
            if len(server.connections) + pending[0] >= self._limit:
                self._refused()
                return _Refused()
            pending[0] += 1
            loop.call_soon(loop.call_soon, registered)
            if self._per_peer:
                return _PeerGate(server, held_by, self._per_peer, self._peer_refused)
            return server()

        def held_by(host: str) -> int:
            """The site's connections from ``host``."""
            held = 0
            for handler in server.connections:
                transport = handler.transport
                peer = transport.get_extra_info("peername") if transport is not None else None
                held += bool(peer and peer[0] == host)
            return held

        # The listen backlog holds what the cap admits: asyncio's default of 100 reset some of 400
        # clients that connected at once, well under a cap of 1,024 (the kernel bounds it by
        # net.core.somaxconn).
        self._server = await asyncio.get_running_loop().create_server(
            connection, self._host, self._port, reuse_address=True, backlog=self._limit
        )


async def run(front: FrontEnd, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever), inside ``front.limits``."""
    limits = front.limits
    runner = web.AppRunner(
        front.app(),
        access_log=None,
        keepalive_timeout=limits.header_timeout,
        # After an answer that leaves a body unread (a 503 of the body budget, sent before the
        # body is read), the rest is read and thrown away, for as long as an admitted body is
        # waited for: closed with bytes unread, the connection is reset, and a client still
        # sending loses the answer it was sent. A second was too short for a 4 MiB body on a
        # busy machine, where the front end's event loop is itself held by decoding a large
        # body for about that long.
        lingering_time=limits.body_timeout,
    )
    await runner.setup()
    logging.getLogger("aiohttp.server").addFilter(_MalformedRequests(front.metrics.rejected))
    server = runner.server
    assert server is not None
    front.metrics.connections.set_function(lambda: len(server.connections))
    refused = front.metrics.rejected.labels("503").inc
    site = LimitedSite(runner, host, port, limits.max_connections, refused, per_peer=limits.max_peer_connections)
    await site.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()


def serve(
    port: int,
    backends: list[str],
    max_batch: int,
    max_latency: float,
    buckets: list[list[int]] | None,
    limits: Limits = DEFAULT_LIMITS,
    host: str = "0.0.0.0",
) -> None:
    front = FrontEnd(backends, max_batch, max_latency, buckets, limits=limits)
    until_signalled(lambda stop: run(front, host, port, stop))


def until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Runs ``serve`` until SIGTERM or SIGINT sets its stop event. SIGTERM (the kubelet
    stopping the pod) lets requests in flight finish, as web.run_app did."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve(stop)

    asyncio.run(main())
