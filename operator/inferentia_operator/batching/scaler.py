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

Bounded, since anyone in the cluster can reach the port: a request larger than
``MAX_MESSAGE`` bytes and more than ``MAX_CALLS`` calls at once (``MAX_STREAMS`` of them
streams; KEDA keeps one per ScaledObject) are refused with RESOURCE_EXHAUSTED, each alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

log = logging.getLogger(__name__)

SERVICE = "externalscaler.ExternalScaler"
METRIC = "held-requests"
MAX_MESSAGE = 16 * 1024  # a ScaledObjectRef is a name, a namespace and the trigger's metadata
MAX_STREAMS = 8
MAX_CALLS = MAX_STREAMS + 8

_STRING, _BOOL, _INT64, _DOUBLE, _MESSAGE = (
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
)
_ONE, _MANY = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


def _proto() -> descriptor_pool.DescriptorPool:
    f = descriptor_pb2.FileDescriptorProto(name="externalscaler.proto", package="externalscaler", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
        m = f.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            added = m.field.add(name=field, number=number, type=kind, label=label, json_name=field)
            if type_name:
                added.type_name = type_name
        return m

    ref = message(
        "ScaledObjectRef",
        ("name", 1, _STRING, _ONE, ""),
        ("namespace", 2, _STRING, _ONE, ""),
        ("scalerMetadata", 3, _MESSAGE, _MANY, ".externalscaler.ScaledObjectRef.ScalerMetadataEntry"),
    )
    entry = ref.nested_type.add(name="ScalerMetadataEntry")
    entry.field.add(name="key", number=1, type=_STRING, label=_ONE, json_name="key")
    entry.field.add(name="value", number=2, type=_STRING, label=_ONE, json_name="value")
    entry.options.map_entry = True
    message("IsActiveResponse", ("result", 1, _BOOL, _ONE, ""))
    message("GetMetricSpecResponse", ("metricSpecs", 1, _MESSAGE, _MANY, ".externalscaler.MetricSpec"))
    message(
        "MetricSpec", ("metricName", 1, _STRING, _ONE, ""), ("targetSize", 2, _INT64, _ONE, ""), ("targetSizeFloat", 3, _DOUBLE, _ONE, "")
    )
    message(
        "GetMetricsRequest", ("scaledObjectRef", 1, _MESSAGE, _ONE, ".externalscaler.ScaledObjectRef"), ("metricName", 2, _STRING, _ONE, "")
    )
    message("GetMetricsResponse", ("metricValues", 1, _MESSAGE, _MANY, ".externalscaler.MetricValue"))
    message(
        "MetricValue",
        ("metricName", 1, _STRING, _ONE, ""),
        ("metricValue", 2, _INT64, _ONE, ""),
        ("metricValueFloat", 3, _DOUBLE, _ONE, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return pool


_POOL = _proto()


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"externalscaler.{name}"))


ScaledObjectRef = _message("ScaledObjectRef")
IsActiveResponse = _message("IsActiveResponse")
GetMetricSpecResponse = _message("GetMetricSpecResponse")
MetricSpec = _message("MetricSpec")
GetMetricsRequest = _message("GetMetricsRequest")
GetMetricsResponse = _message("GetMetricsResponse")
MetricValue = _message("MetricValue")


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
        def unary(fn: Any, request: Any, response: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString
            )

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


async def start(scaler: ExternalScaler, host: str, port: int) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)],
        maximum_concurrent_rpcs=MAX_CALLS,
    )
    server.add_generic_rpc_handlers((scaler.handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"the external scaler cannot listen on {host}:{port}")
    await server.start()
    return server
