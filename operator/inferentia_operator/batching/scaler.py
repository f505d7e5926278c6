"""KEDA's external scaler API, served by the holder: demand reaches KEDA the moment a request
is held, not when Prometheus next scrapes the holder's gauge.

KEDA's ``external-push`` trigger connects to ``externalscaler.ExternalScaler`` at the trigger's
``scalerAddress`` and keeps ``StreamIsActive`` open; an ``IsActiveResponse`` with ``result:
true`` on that stream makes KEDA scale the model from zero at once, and ``GetMetrics`` gives its
HPA the held requests against ``GetMetricSpec``'s target (KEDA, "External Scalers",
https://keda.sh/docs/latest/concepts/external-scalers/; the scale handler acts on a push at
once and ignores a push of ``false``, pkg/scaling/scale_handler.go). The model's Prometheus
trigger stays, for scaling between one replica and the maximum.

The messages are those of KEDA's ``externalscaler.proto``
(github.com/kedacore/keda, pkg/scalers/externalscaler/externalscaler.proto), field for field,
built here with protobuf's descriptor API rather than generated code. ``StreamMetricSpec``
is not served: KEDA takes UNIMPLEMENTED as "use GetMetricSpec".

Bounded, since anyone in the cluster can reach the port. gRPC listens on an abstract Unix
socket of the holder's own network namespace; the port is a TCP front (:class:`Front`) that
takes at most ``MAX_CONNECTIONS`` connections, ``MAX_PEER_CONNECTIONS`` of them from one address,
closes one that moves no byte either way for ``IDLE_SECONDS``, and passes bytes through; the
gRPC server closes a connection with no call open for as long (its keepalive pings, which keep
KEDA's open stream moving, would keep an idle one too). Each connection may carry
``STREAMS_PER_CONNECTION`` calls at once (HTTP/2's max concurrent streams), so one address holds
at most the product, and a call that never sends its request holds only its own slot. A
request larger than ``MAX_MESSAGE`` bytes, and more than ``MAX_STREAMS`` open streams (KEDA keeps
one per ScaledObject), are refused with RESOURCE_EXHAUSTED, each alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from . import protos

log = logging.getLogger(__name__)

SERVICE = "externalscaler.ExternalScaler"
METRIC = "held-requests"
MAX_MESSAGE = 16 * 1024  # a ScaledObjectRef is a name, a namespace and the trigger's metadata
MAX_CONNECTIONS = 64
# KEDA's operator keeps one connection a scaler address (getClientForConnectionPool, kedacore/keda
# pkg/scalers/external_scaler.go): its stream and its calls share it.
MAX_PEER_CONNECTIONS = 2
STREAMS_PER_CONNECTION = 4
MAX_STREAMS = 32
MAX_CALLS = MAX_CONNECTIONS * STREAMS_PER_CONNECTION
IDLE_SECONDS = 60.0
KEEPALIVE_SECONDS = 20.0  # the server pings each connection this often; no answer in 10 s closes it

_M = protos.MESSAGE
_MESSAGES = protos.messages(
    "externalscaler.proto",
    "externalscaler",
    {
        "ScaledObjectRef": (
            ("name", 1, protos.STRING, protos.ONE, ""),
            ("namespace", 2, protos.STRING, protos.ONE, ""),
            ("scalerMetadata", 3, _M, protos.MANY, protos.STRING_MAP),
        ),
        "IsActiveResponse": (("result", 1, protos.BOOL, protos.ONE, ""),),
        "GetMetricSpecResponse": (("metricSpecs", 1, _M, protos.MANY, ".externalscaler.MetricSpec"),),
        "MetricSpec": (
            ("metricName", 1, protos.STRING, protos.ONE, ""),
            ("targetSize", 2, protos.INT64, protos.ONE, ""),
            ("targetSizeFloat", 3, protos.DOUBLE, protos.ONE, ""),
        ),
        "GetMetricsRequest": (
            ("scaledObjectRef", 1, _M, protos.ONE, ".externalscaler.ScaledObjectRef"),
            ("metricName", 2, protos.STRING, protos.ONE, ""),
        ),
        "GetMetricsResponse": (("metricValues", 1, _M, protos.MANY, ".externalscaler.MetricValue"),),
        "MetricValue": (
            ("metricName", 1, protos.STRING, protos.ONE, ""),
            ("metricValue", 2, protos.INT64, protos.ONE, ""),
            ("metricValueFloat", 3, protos.DOUBLE, protos.ONE, ""),
        ),
    },
)
ScaledObjectRef = _MESSAGES["ScaledObjectRef"]
IsActiveResponse = _MESSAGES["IsActiveResponse"]
GetMetricSpecResponse = _MESSAGES["GetMetricSpecResponse"]
MetricSpec = _MESSAGES["MetricSpec"]
GetMetricsRequest = _MESSAGES["GetMetricsRequest"]
GetMetricsResponse = _MESSAGES["GetMetricsResponse"]
MetricValue = _MESSAGES["MetricValue"]


class Demand:
    """What the holder tells the scaler: how many requests it holds, and an event set at the
    next change of that count."""

    def __init__(self, held: Callable[[], int], changed: Callable[[], asyncio.Event]) -> None:
        self.held, self.changed = held, changed


class ExternalScaler:
    def __init__(self, demand: Demand, target: int, on_streams: Callable[[int], None] = lambda _n: None) -> None:
        self.demand, self.target = demand, max(1, target)
        self.streams = 0
        self._on_streams = on_streams

    async def is_active(self, _ref: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return IsActiveResponse(result=self.demand.held() > 0)

    async def stream_is_active(self, _ref: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if self.streams >= MAX_STREAMS:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{MAX_STREAMS} streams are open already")
        self.streams += 1
        self._on_streams(self.streams)
        try:
            last = None
            while True:
                changed = self.demand.changed()  # taken before reading, so no change is missed
                active = self.demand.held() > 0
                if active != last:
                    yield IsActiveResponse(result=active)
                    last = active
                await changed.wait()
        finally:
            self.streams -= 1
            self._on_streams(self.streams)

    async def get_metric_spec(self, _ref: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return GetMetricSpecResponse(
            metricSpecs=[MetricSpec(metricName=METRIC, targetSize=self.target, targetSizeFloat=float(self.target))]
        )

    async def get_metrics(self, _request: Any, _context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        held = self.demand.held()
        return GetMetricsResponse(metricValues=[MetricValue(metricName=METRIC, metricValue=held, metricValueFloat=float(held))])

    def handler(self) -> grpc.GenericRpcHandler:
        unary = protos.unary
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "IsActive": unary(self.is_active, ScaledObjectRef, IsActiveResponse),
                "StreamIsActive": grpc.unary_stream_rpc_method_handler(
                    self.stream_is_active,
                    request_deserializer=ScaledObjectRef.FromString,
                    response_serializer=IsActiveResponse.SerializeToString,
                ),
                "GetMetricSpec": unary(self.get_metric_spec, ScaledObjectRef, GetMetricSpecResponse),
                "GetMetrics": unary(self.get_metrics, GetMetricsRequest, GetMetricsResponse),
            },
        )


class Front:
    """The scaler's TCP port: each connection admitted within the bounds is piped to the gRPC
    server's Unix socket, byte for byte, until either side closes or both go quiet."""

    def __init__(self, socket_name: str, refused: Callable[[], None]) -> None:
        self.socket_name, self.refused = socket_name, refused
        self.peers: dict[str, int] = {}  # open connections by address
        self.server: asyncio.Server | None = None
        self.transports: set[asyncio.WriteTransport] = set()  # of the connections open, both sides

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._connection, host, port, backlog=MAX_CONNECTIONS, reuse_address=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (writer.get_extra_info("peername") or ("",))[0]
        if sum(self.peers.values()) >= MAX_CONNECTIONS or self.peers.get(peer, 0) >= MAX_PEER_CONNECTIONS:
            self.refused()
            writer.close()
            return
        self.peers[peer] = self.peers.get(peer, 0) + 1
        self.transports.add(writer.transport)
        inner: asyncio.StreamWriter | None = None
        try:
            inner_reader, inner = await asyncio.open_unix_connection("\0" + self.socket_name)
            self.transports.add(inner.transport)
            await _pipe_both(reader, writer, inner_reader, inner)
        except (OSError, asyncio.CancelledError):
            pass  # the server went away, or the client did, or the holder stops: the connection ends
        finally:
            # Aborted, not closed: a close waits to send what is buffered, which a client that
            # stopped reading never takes, and the socket would outlive its place in the bounds.
            for side in (writer, inner):
                if side is not None:
                    side.transport.abort()
                    self.transports.discard(side.transport)
            self.peers[peer] -= 1
            if not self.peers[peer]:
                del self.peers[peer]

    async def stop(self) -> None:
        """No new connection, and every open one ended at once (their calls end with them)."""
        if self.server is not None:
            self.server.close()
        for transport in list(self.transports):
            transport.abort()
        await asyncio.sleep(0)  # the handlers see their connections end


async def _pipe_both(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, inner_reader: asyncio.StreamReader, inner_writer: asyncio.StreamWriter
) -> None:
    """Bytes both ways until one side closes, or neither has moved a byte for IDLE_SECONDS."""
    loop = asyncio.get_running_loop()
    moved = [loop.time()]

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while block := await source.read(1 << 16):
            moved[0] = loop.time()
            sink.write(block)
            await sink.drain()

    async def watch() -> None:
        while loop.time() - moved[0] < IDLE_SECONDS:
            await asyncio.sleep(max(0.05, moved[0] + IDLE_SECONDS - loop.time()))

    tasks = [asyncio.ensure_future(t) for t in (pipe(reader, inner_writer), pipe(inner_reader, writer), watch())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await task


class Listening:
    """The gRPC server and its TCP front, stopped together."""

    def __init__(self, server: grpc.aio.Server, front: Front) -> None:
        self.server, self.front = server, front

    async def stop(self, grace: float) -> None:
        await self.front.stop()
        await self.server.stop(grace)


async def start(scaler: ExternalScaler, host: str, port: int, refused: Callable[[], None] = lambda: None) -> Listening:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
            ("grpc.keepalive_time_ms", int(KEEPALIVE_SECONDS * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # A connection with no call open for a minute is closed (a GOAWAY): the front's
            # watchdog sees the pings above as traffic, so a client that answers them and calls
            # nothing would keep its slot. KEDA's stream is a call open: its connection stays.
            ("grpc.max_connection_idle_ms", int(IDLE_SECONDS * 1000)),
            # A client may ping every 10 s with no data (the default would allow one in 5 minutes).
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ],
        maximum_concurrent_rpcs=MAX_CALLS,
    )
    server.add_generic_rpc_handlers((scaler.handler(),))
    # Only this process's network namespace sees an abstract socket; the name is the holder's own.
    socket_name = f"inferentia-scaler-{os.getpid()}-{port}"
    if not server.add_insecure_port(f"unix-abstract:{socket_name}"):
        raise OSError(f"the external scaler cannot listen on the abstract socket {socket_name}")
    await server.start()
    front = Front(socket_name, refused)
    try:
        await front.start(host, port)
    except OSError:
        await server.stop(0)
        raise OSError(f"the external scaler cannot listen on {host}:{port}") from None
    return Listening(server, front)
