"""The Confluent wire framing (service/schemas/wire.py), cross-checked against confluent-kafka's own
serializers (run offline with its MockSchemaRegistryClient) and its SchemaId reader/writer."""

from __future__ import annotations

import io
import json

import pytest
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.common.serde import SchemaId
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given
from hypothesis import strategies as st

from service.schemas.wire import (
    BadMessageIndexes,
    FrameTooShort,
    NoMagicByte,
    encode_message_indexes,
    frame,
    frame_header,
    schema_id_of,
    unframe,
)

CTX = SerializationContext("t", MessageField.VALUE)


def test_frame_layout() -> None:
    assert frame(1, b"xy") == b"\x00\x00\x00\x00\x01xy"
    assert frame(0x01020304, b"") == b"\x00\x01\x02\x03\x04"
    assert frame(7, b"p", [0]) == b"\x00\x00\x00\x00\x07\x00p"
    # [1, 0]: count 2 -> zigzag 4, then 1 -> 2, 0 -> 0
    assert frame(7, b"p", [1, 0]) == b"\x00\x00\x00\x00\x07\x04\x02\x00p"
    assert frame_header(2**32 - 1) == b"\x00\xff\xff\xff\xff"


def test_unframe_round_trip() -> None:
    u = unframe(frame(42, b"payload"))
    assert (u.schema_id, bytes(u.payload), u.message_indexes) == (42, b"payload", None)
    u = unframe(frame(42, b"pb", [3, 1, 200]), protobuf=True)
    assert (u.schema_id, bytes(u.payload), u.message_indexes) == (42, b"pb", (3, 1, 200))
    u = unframe(frame(42, b"pb", [0]), protobuf=True)
    assert u.message_indexes == (0,) and bytes(u.payload) == b"pb"
    assert schema_id_of(b"\x00\x00\x00\x01\x00") == 256


def test_errors() -> None:
    with pytest.raises(NoMagicByte, match="empty"):
        unframe(b"")
    with pytest.raises(NoMagicByte, match="first byte 123"):
        unframe(b'{"a": 1}')
    with pytest.raises(FrameTooShort):
        unframe(b"\x00\x00\x01")
    with pytest.raises(FrameTooShort):  # no index list after the id
        unframe(b"\x00\x00\x00\x00\x01", protobuf=True)
    with pytest.raises(FrameTooShort):  # count 2, one index
        unframe(b"\x00\x00\x00\x00\x01\x04\x02", protobuf=True)
    with pytest.raises(BadMessageIndexes, match="count -1"):
        unframe(b"\x00\x00\x00\x00\x01\x01", protobuf=True)
    with pytest.raises(BadMessageIndexes, match="negative message index"):
        unframe(b"\x00\x00\x00\x00\x01\x02\x01", protobuf=True)
    with pytest.raises(BadMessageIndexes, match="out of range"):
        unframe(b"\x00\x00\x00\x00\x01" + encode_message_indexes([10**6])[1:], protobuf=True)
    with pytest.raises(BadMessageIndexes, match="varint"):
        unframe(b"\x00\x00\x00\x00\x01" + b"\xff" * 11, protobuf=True)
    with pytest.raises(ValueError):
        frame(-1, b"")
    with pytest.raises(ValueError):
        frame(1, b"", [])
    with pytest.raises(ValueError):
        frame(1, b"", [-1])


@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6), st.binary())
def test_matches_confluent_schema_id(schema_id: int, indexes: list[int], payload: bytes) -> None:
    # confluent-kafka's own writer and reader of the header, as the independent peer
    theirs = SchemaId("PROTOBUF", schema_id, message_indexes=indexes).id_to_bytes()
    assert frame_header(schema_id, indexes) == theirs
    ours = unframe(theirs + payload, protobuf=True)
    assert (ours.schema_id, list(ours.message_indexes or ()), bytes(ours.payload)) == (schema_id, indexes, payload)
    parsed = SchemaId("PROTOBUF")
    rest = parsed.from_bytes(io.BytesIO(frame(schema_id, payload, indexes)))
    assert (parsed.id, parsed.message_indexes, rest.read()) == (schema_id, indexes, payload)
    assert SchemaId("AVRO", schema_id).id_to_bytes() == frame_header(schema_id)


def _registry() -> MockSchemaRegistryClient:
    return MockSchemaRegistryClient({"url": "mock://p23"})


def test_avro_serializer_framing() -> None:
    reg = _registry()
    schema = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
    data = AvroSerializer(reg, schema)({"a": 1}, CTX)
    sid = reg.get_latest_version("t-value").schema_id
    u = unframe(data)
    assert u.schema_id == sid and bytes(u.payload) == b"\x02"  # avro long 1 = zigzag varint 2
    assert frame(sid, b"\x02") == data


def test_json_serializer_framing() -> None:
    reg = _registry()
    reg.register_schema("other", _json_schema('{"type": "string"}'))  # so the id is not 1
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    data = JSONSerializer(schema, reg)({"a": 1}, CTX)
    u = unframe(data)
    assert u.schema_id == reg.get_latest_version("t-value").schema_id != 1
    assert json.loads(bytes(u.payload)) == {"a": 1}


def _json_schema(text: str):  # type: ignore[no-untyped-def]
    from confluent_kafka.schema_registry import Schema

    return Schema(text, "JSON")


def _nested_message_class():  # type: ignore[no-untyped-def]
    """A message type that is the second top-level message's first nested message: indexes [1, 0]."""
    fd = descriptor_pb2.FileDescriptorProto(name="p23_wire.proto", package="p23", syntax="proto3")
    fd.message_type.add(name="First").field.add(name="x", number=1, type=3, label=1)
    outer = fd.message_type.add(name="Second")
    inner = outer.nested_type.add(name="Inner")
    inner.field.add(name="s", number=1, type=9, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("p23.Second.Inner")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("p23.First")))


def test_protobuf_serializer_framing() -> None:
    reg = _registry()
    inner_cls, first_cls = _nested_message_class()
    data = ProtobufSerializer(inner_cls, reg)(inner_cls(s="hi"), CTX)
    u = unframe(data, protobuf=True)
    assert u.message_indexes == (1, 0)
    assert u.schema_id == reg.get_latest_version("t-value").schema_id
    assert inner_cls.FromString(bytes(u.payload)).s == "hi"
    assert frame(u.schema_id, bytes(u.payload), [1, 0]) == data
    # the first message of the file: the single-byte [0] shortcut
    data = ProtobufSerializer(first_cls, reg)(first_cls(x=5), SerializationContext("u", MessageField.VALUE))
    u = unframe(data, protobuf=True)
    assert u.message_indexes == (0,) and data[5] == 0 and first_cls.FromString(bytes(u.payload)).x == 5
