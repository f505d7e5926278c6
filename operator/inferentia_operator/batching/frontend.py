"""The batching front end: one HTTP server in front of a pod's model processes.

The contract with clients: ``POST /`` (or ``/predict``) with one JSON input; the answer
is that input's JSON output. ``413`` when the input fits no bucket (the body lists
them), ``503`` with ``Retry-After`` when it cannot be answered within ``maxLatencyMs``.

The contract with a model process (``batching.model_server`` follows it): ``POST /``
with a JSON list of inputs, answered by a JSON list of outputs of the same length and
order; ``GET /healthz`` answers 200 once the model is loaded.

Also: ``GET /metrics`` (Prometheus), ``GET /healthz`` (the front end runs), ``GET
/readyz`` (every model process answers its ``/healthz``).

What a hostile or broken client can cost is bounded by ``Limits`` (docs/serving-pod.md,
"What a client can cost"): a deadline for the headers and one for the body, a cap on open
connections, and a budget of body bytes held at once, so the batcher stays inside its
container's memory limit whatever arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .dispatch import Dispatch, Dispatcher, Reject, Request
from .limits import DEFAULT_LIMITS, Limits
from .padding import Shape, TooLarge, bucket_for, pad, shape_of, unpad

log = logging.getLogger(__name__)
_BUSY_BODY = b'{"error": "too many connections; retry later"}'
CLOSE_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)


class BadInput(ValueError):
    pass


def _not_json(constant: str) -> Any:
    raise BadInput(f"{constant} is not a JSON number")


def parse_input(body: bytes) -> Any:
    """One JSON input, or BadInput. Bounded: nesting deeper than the decoder's recursion limit
    ends the C decoder there (RecursionError) rather than exhausting anything, and NaN and
    Infinity, which Python's decoder would take, are not JSON and are refused."""
    try:
        return json.loads(body, parse_constant=_not_json)
    except RecursionError:
        raise BadInput("the body is nested too deeply") from None
    except BadInput:
        raise
    except (ValueError, UnicodeDecodeError):
        raise BadInput("the body must be one JSON input") from None


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
        self._held_bytes = 0  # bodies read and not yet answered: Limits.body_budget
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
        app.router.add_get("/healthz", _healthy)
        app.router.add_get("/readyz", self.ready)
        app.router.add_get("/metrics", self.scrape)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._session:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        return self._session

    async def predict(self, request: web.Request) -> web.Response:
        # A body of unknown length (chunked) is charged as the largest one allowed.
        size = min(request.content_length or self.limits.max_body, self.limits.max_body)
        if self._held_bytes + size > self.limits.budget_for(size):
            return self._refuse(503, {"error": "too many request bytes in flight; retry later"}, retry_after=1)
        self._held_bytes += size
        try:
            return await self._predict(request)
        finally:
            self._held_bytes -= size

    async def _predict(self, request: web.Request) -> web.Response:
        arrived = self.clock()
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                body = await request.read()
        except TimeoutError:
            # The rest of the body is not waited for: the connection closes with the answer.
            response = self._refuse(408, {"error": f"the body did not arrive within {self.limits.body_timeout:g} s"})
            response.force_close()
            return response
        except ConnectionError:
            # The client left mid-body: nobody to answer, and nothing worth a traceback in the log.
            # Counted as nginx counts it, 499 (client closed request).
            self.metrics.rejected.labels("499").inc()
            raise web.HTTPBadRequest() from None
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
            except (ValueError, RecursionError) as exc:
                return self._refuse(400, {"error": str(exc) if isinstance(exc, ValueError) else "the input is nested too deeply"})
            payload = pad(payload, bucket)
        job = Request(arrived, bucket, payload)
        refused = self.dispatcher.arrive(job)
        if refused is not None:
            return self._busy(refused)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[job.id] = answer
        self._decide()
        outcome = await answer
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
        async def answers(url: str) -> bool:
            try:
                async with self._client().get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    return r.status == 200
            except (TimeoutError, aiohttp.ClientError, OSError):
                return False

        results = await asyncio.gather(*(answers(b) for b in self.backends))
        status = 200 if all(results) else 503
        return web.json_response({"processes": dict(zip(self.backends, results, strict=True))}, status=status)

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
        try:
            async with self._client().post(self.backends[batch.process] + "/", json=[r.payload for r in batch.requests]) as response:
                body = await response.read()
                if response.status != 200:
                    raise ValueError(f"the model process answered {response.status}")
                outputs = json.loads(body)
                if not isinstance(outputs, list) or len(outputs) != n:
                    raise ValueError(f"the model process answered {type(outputs).__name__}, not a list of {n}")
            for r, out in zip(batch.requests, outputs, strict=True):
                self._resolve(r, out)
        except aiohttp.ClientConnectorError as exc:
            # The process is not listening (it died, or is restarting with its pod): the batch
            # never reached it, so a retry is safe. 503 with Retry-After says so to clients and
            # to proxies that retry on 503 (Envoy's retry_on, nginx's proxy_next_upstream),
            # which send it to another replica; 502 would read as a failure of the model.
            log.warning("batch of %d not sent: process %d is not listening: %s", n, batch.process, exc)
            for r in batch.requests:
                self._resolve(r, self._refuse(503, {"error": "the model process is not running; retry"}, retry_after=1))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("batch of %d to process %d failed: %s", n, batch.process, exc)
            for r in batch.requests:
                self._resolve(r, self._refuse(502, {"error": f"the model process failed: {exc}"}))
        finally:
            self.metrics.inflight.labels(str(batch.process)).dec()
            self._sent.difference_update(r.id for r in batch.requests)
            self.dispatcher.done(batch.process, n, self.clock() - sent)
            self._decide()

    def _resolve(self, request: Request, outcome: Any) -> None:
        future = self._answers.pop(request.id, None)
        if future is not None and not future.done():
            future.set_result(outcome)


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


class LimitedSite(web.BaseSite):
    """A TCP site that hands aiohttp at most ``limit`` connections at once."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limit: int, refused: Callable[[], None]):
        super().__init__(runner)
        self._host, self._port, self._limit, self._refused = host, port, limit, refused

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
            return server()

        self._server = await asyncio.get_running_loop().create_server(connection, self._host, self._port, reuse_address=True)


async def run(front: FrontEnd, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever), inside ``front.limits``."""
    limits = front.limits
    runner = web.AppRunner(
        front.app(),
        access_log=None,
        keepalive_timeout=limits.header_timeout,
        # After an answer that closes the connection, unread body is drained for this long at most.
        lingering_time=1.0,
    )
    await runner.setup()
    logging.getLogger("aiohttp.server").addFilter(_MalformedRequests(front.metrics.rejected))
    server = runner.server
    assert server is not None
    front.metrics.connections.set_function(lambda: len(server.connections))
    site = LimitedSite(runner, host, port, limits.max_connections, front.metrics.rejected.labels("503").inc)
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


async def _healthy(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})
