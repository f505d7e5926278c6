"""Protocol Buffers messages built from a table, field for field as the upstream ``.proto`` file
declares them, with protobuf's descriptor API rather than generated code: the programs that speak
gRPC (the holder's KEDA scaler, the node plugin) need a handful of messages each, and no build
step. A field an upstream message has and the table leaves out is kept as an unknown field and
ignored, as proto3 does with any field it does not know.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

STRING, BOOL, INT64, DOUBLE, MESSAGE = (
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
)
ONE, MANY = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
# A map<string, string> field: a repeated message of key and value, as protoc writes one.
STRING_MAP = "map<string, string>"

# name, number, type, label, the type name of a message field (".package.Message") or STRING_MAP
Field = tuple[str, int, int, int, str]


def messages(file: str, package: str, table: dict[str, tuple[Field, ...]]) -> dict[str, Any]:
    """The message classes of ``table`` (message name -> its fields), by name."""
    f = descriptor_pb2.FileDescriptorProto(name=file, package=package, syntax="proto3")
    for name, fields in table.items():
        m = f.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            added = m.field.add(name=field, number=number, type=kind, label=label, json_name=field)
            if type_name == STRING_MAP:
                entry = m.nested_type.add(name="".join(p[:1].upper() + p[1:] for p in field.split("_")) + "Entry")  # as protoc names it
                entry.field.add(name="key", number=1, type=STRING, label=ONE, json_name="key")
                entry.field.add(name="value", number=2, type=STRING, label=ONE, json_name="value")
                entry.options.map_entry = True
                added.type, added.label, added.type_name = MESSAGE, MANY, f".{package}.{name}.{entry.name}"
            elif type_name:
                added.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in table}


def unary(fn: Any, request: Any, response: Any) -> grpc.RpcMethodHandler[Any, Any]:
    """A unary method's handler: ``fn`` takes the ``request`` message and returns a ``response``."""
    return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=request.FromString, response_serializer=response.SerializeToString)
