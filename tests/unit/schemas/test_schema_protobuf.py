"""service.schemas.protobuf: dynamic messages from file descriptors (the registry's ``format=serialized``),
message indexes, imports as references, the canonical JSON rendering, and confluent-kafka's
ProtobufSerializer / ProtobufDeserializer (offline, in-memory mock registry) as the peer both ways."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool

from service.schemas.protobuf import (
    ProtobufCodec,
    ProtobufDecodeError,
    ProtobufEncodeError,
    ProtobufSchemaError,
)

F = descriptor_pb2.FieldDescriptorProto


def _common() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="acme/common.proto", package="acme.common", syntax="proto3")
    money = f.message_type.add(name="Money")
    money.field.add(name="currency", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    money.field.add(name="units", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    return f


def _orders() -> descriptor_pb2.FileDescriptorProto:
    """package acme; Ping {}; Order {id, customer_name, at, items (nested Item), status, tags map, blob,
    total (imported Money), oneof contact {email, phone}}; enum Status."""
    f = descriptor_pb2.FileDescriptorProto(
        name="acme/orders.proto", package="acme", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "acme/common.proto"])
    ping = f.message_type.add(name="Ping")
    ping.field.add(name="n", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    m = f.message_type.add(name="Order")
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="customer_name", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    m.field.add(name="at", number=3, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                label=F.LABEL_OPTIONAL)
    item = m.nested_type.add(name="Item")
    item.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    item.field.add(name="price", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    m.field.add(name="items", number=4, type=F.TYPE_MESSAGE, type_name=".acme.Order.Item", label=F.LABEL_REPEATED)
    m.field.add(name="status", number=5, type=F.TYPE_ENUM, type_name=".acme.Status", label=F.LABEL_OPTIONAL)
    entry = m.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    m.field.add(name="tags", number=6, type=F.TYPE_MESSAGE, type_name=".acme.Order.TagsEntry",
                label=F.LABEL_REPEATED)
    m.field.add(name="blob", number=7, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    m.field.add(name="total", number=8, type=F.TYPE_MESSAGE, type_name=".acme.common.Money",
                label=F.LABEL_OPTIONAL)
    m.oneof_decl.add(name="contact")
    m.field.add(name="email", number=9, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    m.field.add(name="phone", number=10, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    status = f.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    return f


ORDER_JSON = {
    "id": "9007199254740993",  # 64-bit integers render as strings
    "customerName": "Zoë",
    "at": "2025-05-05T12:29:00.123Z",
    "items": [{"sku": "a-1", "price": 2.5}, {"sku": "b", "price": 0.0}],
    "status": "PAID",
    "tags": {"x": 1},
    "blob": base64.b64encode(b"\x00\xff").decode(),
    "total": {"currency": "EUR", "units": "12"},
    "email": "z@example.com",
}
DEPS = {"acme/common.proto": _common().SerializeToString()}


def _codec() -> ProtobufCodec:
    return ProtobufCodec(base64.b64encode(_orders().SerializeToString()).decode(), dependencies=DEPS)


def test_round_trip_renders_the_canonical_json_with_defaults() -> None:
    codec = _codec()
    payload = codec.encode(ORDER_JSON, [1])
    assert codec.decode(payload, [1]) == ORDER_JSON
    # defaults are printed (includingDefaultValueFields), unset message fields and the unset oneof are not
    assert codec.decode(b"", [1]) == {"id": "0", "customerName": "", "items": [], "status": "NEW", "tags": {},
                                      "blob": ""}
    assert codec.decode(b"", None) == codec.decode(b"", [0]) == {"n": 0}
    assert codec.decode(codec.encode({"sku": "q"}, [1, 0]), [1, 0]) == {"sku": "q", "price": 0.0}
    assert codec.record_name == "acme.Ping"


def test_payload_bytes_match_protobufs_own_serializer() -> None:
    pool = DescriptorPool()
    from google.protobuf import timestamp_pb2

    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_common())
    pool.Add(_orders())
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Order"))
    theirs = json_format.ParseDict(ORDER_JSON, cls()).SerializeToString()
    assert _codec().encode(ORDER_JSON, [1]) == theirs
    assert _codec().decode(memoryview(theirs), [1]) == ORDER_JSON


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"customerName": 3}, "$.customerName", "expected string"),
        ({"items": [{"sku": "a", "price": "cheap"}]}, "$.items.price", "Couldn't parse float"),
        ({"status": "LOST"}, "$.status", "Invalid enum value LOST"),
        ({"nope": 1}, "$.nope", 'has no field named "nope"'),
        ({"total": {"units": "x"}}, "$.total.units", "invalid literal for int()"),
    ],
)
def test_encode_errors_name_the_field_chain(value: dict, path: str, reason: str) -> None:
    with pytest.raises(ProtobufEncodeError) as info:
        _codec().encode(value, [1])
    assert info.value.path == path
    assert reason in info.value.reason


def test_decode_many_puts_errors_in_place() -> None:
    codec = _codec()
    good = codec.encode(ORDER_JSON, [1])
    out = codec.decode_many([([1], good), b"\xff\xff", ([7], b""), ([1, 0], b"\x0a\x01z"), b"\x08\x05"])
    assert out[0] == ORDER_JSON
    assert isinstance(out[1], ProtobufDecodeError) and isinstance(out[2], ProtobufDecodeError)
    assert out[3] == {"sku": "z", "price": 0.0}
    assert out[4] == {"n": 5}


def test_schema_errors() -> None:
    with pytest.raises(ProtobufSchemaError, match="not among the schema's references"):
        ProtobufCodec(_orders().SerializeToString())  # acme/common.proto not given
    with pytest.raises(ProtobufSchemaError, match="format=serialized"):
        ProtobufCodec('syntax = "proto3"; message A { int32 a = 1; }')
    with pytest.raises(ProtobufSchemaError):
        ProtobufCodec(b"\xff\xff\xff")
    with pytest.raises(ProtobufSchemaError, match="no message"):
        ProtobufCodec(descriptor_pb2.FileDescriptorProto(name="empty.proto"))


def _unframe(framed: bytes) -> tuple[int, list[int], bytes]:
    """Confluent framing, written here independently of service.schemas.wire: magic, id, zigzag indexes."""
    assert framed[0] == 0
    schema_id = int.from_bytes(framed[1:5], "big")
    pos = 5

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            b = framed[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)

    count = varint()
    indexes = [varint() for _ in range(count)] or [0]
    return schema_id, indexes, framed[pos:]


def test_confluent_kafka_protobuf_serde_agrees_both_ways_with_references() -> None:
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    pool = DescriptorPool()
    from google.protobuf import timestamp_pb2

    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_common())
    pool.Add(_orders())
    order_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Order"))
    client = MockSchemaRegistryClient({"url": "mock://protobuf-tests"})
    ctx = SerializationContext("orders", MessageField.VALUE)
    serializer = ProtobufSerializer(order_cls, client, {"use.deprecated.format": False})
    framed = serializer(json_format.ParseDict(ORDER_JSON, order_cls()), ctx)

    schema_id, indexes, payload = _unframe(framed)
    assert indexes == [1]
    registered = client.get_schema(schema_id)  # what the registry hands out: the descriptor, base64
    references = {ref.name: client.get_version(ref.subject, ref.version).schema.schema_str
                  for ref in registered.references}
    assert "acme/common.proto" in references
    codec = ProtobufCodec(registered.schema_str, dependencies=references)
    assert codec.decode(payload, indexes) == ORDER_JSON  # theirs -> ours

    ours = framed[: len(framed) - len(payload)] + codec.encode(ORDER_JSON, indexes)
    theirs = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})(ours, ctx)  # ours -> theirs
    assert json_format.MessageToDict(theirs, always_print_fields_with_no_presence=True) == ORDER_JSON


def test_through_the_codecs_registry() -> None:
    from service.schemas.codecs import Codecs, DecodeError, EncodeError

    codecs = Codecs()
    schema = base64.b64encode(_orders().SerializeToString()).decode()
    payload = codecs.encode("protobuf", schema, ORDER_JSON, schema_id=3, references=DEPS, message_indexes=[1])
    out = codecs.decode_many("protobuf", 3, schema, [([1], payload), ([9], b"")], references=DEPS)
    assert out[0] == ORDER_JSON
    assert isinstance(out[1], DecodeError) and out[1].schema_id == 3 and "name no message" in out[1].message
    with pytest.raises(EncodeError) as info:
        codecs.encode("protobuf", schema, {"status": "LOST"}, schema_id=3, message_indexes=[1])
    assert info.value.path == "$.status" and info.value.format == "protobuf"


# What Karapace 5.0.3's registry answers for GET /schemas/ids/{id}?format=serialized of this .proto (made by its
# own serializer from ../shared/registry's tarball):
#   syntax = "proto3"; package acme; import "google/protobuf/timestamp.proto";
#   message Order { int64 id = 1; optional string note = 2; repeated Item items = 3; Status status = 4;
#     google.protobuf.Timestamp at = 5; map<string, int32> tags = 6; oneof contact { string email = 7;
#     string phone = 8; } message Item { string sku = 1; double price = 2; } }
#   enum Status { NEW = 0; PAID = 1; }
# It is not compiled: relative type names without a field type, the map as a type name "map<string, int32>",
# the optional field without its synthetic oneof, no file name.
KARAPACE_SERIALIZED = (
    "EgRhY21lGh9nb29nbGUvcHJvdG9idWYvdGltZXN0YW1wLnByb3RvIuMBCgVPcmRlchIKCgJpZBgBIAEoAxIPCgRub3RlGAIgASgJiAEBEhEKBWl0ZW1zGAMgAzIESXRlbRIUCgZzdGF0dXMYBCABMgZTdGF0dXMSIwoCYXQYBSABMhlnb29nbGUucHJvdG9idWYuVGltZXN0YW1wEh4KBHRhZ3MYBiABMhJtYXA8c3RyaW5nLCBpbnQzMj4SDwoFZW1haWwYByABKAlIABIPCgVwaG9uZRgIIAEoCUgAGiIKBEl0ZW0SCwoDc2t1GAEgASgJEg0KBXByaWNlGAIgASgBQgkKB2NvbnRhY3QqIwoGU3RhdHVzEgsKA05FVxAAGgIIABIMCgRQQUlEEAEaAggAYgZwcm90bzM="
)


def test_karapace_serialized_descriptors_are_normalized() -> None:
    codec = ProtobufCodec(KARAPACE_SERIALIZED)
    value = {"id": "5", "note": "n", "items": [{"sku": "a", "price": 1.5}], "status": "PAID",
             "at": "2024-01-01T00:00:00Z", "tags": {"k": 2}, "email": "e"}
    payload = codec.encode(value)
    assert codec.decode(payload) == value
    # the unset optional field is absent (it has presence), the map renders as an object
    assert codec.decode(b"") == {"id": "0", "items": [], "status": "NEW", "tags": {}}
    assert codec.decode(codec.encode({"sku": "z"}, [0, 0]), [0, 0]) == {"sku": "z", "price": 0.0}


def test_karapace_normalized_descriptor_writes_what_a_compiled_descriptor_reads() -> None:
    """The same file as KARAPACE_SERIALIZED, built as protoc would (fully-qualified, map entry, synthetic
    oneof): payloads cross between the two codecs unchanged."""
    f = descriptor_pb2.FileDescriptorProto(name="order.proto", package="acme", syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    m = f.message_type.add(name="Order")
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="note", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, proto3_optional=True,
                oneof_index=1)
    m.field.add(name="items", number=3, type=F.TYPE_MESSAGE, type_name=".acme.Order.Item", label=F.LABEL_REPEATED)
    m.field.add(name="status", number=4, type=F.TYPE_ENUM, type_name=".acme.Status", label=F.LABEL_OPTIONAL)
    m.field.add(name="at", number=5, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                label=F.LABEL_OPTIONAL)
    m.field.add(name="tags", number=6, type=F.TYPE_MESSAGE, type_name=".acme.Order.TagsEntry",
                label=F.LABEL_REPEATED)
    m.field.add(name="email", number=7, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    m.field.add(name="phone", number=8, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    item = m.nested_type.add(name="Item")
    item.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    item.field.add(name="price", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    entry = m.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    m.oneof_decl.add(name="contact")
    m.oneof_decl.add(name="_note")
    status = f.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    compiled, karapace = ProtobufCodec(f), ProtobufCodec(KARAPACE_SERIALIZED)
    value = {"id": "-3", "note": "", "items": [{"sku": "a", "price": -1.5}], "status": "PAID",
             "at": "1999-12-31T23:59:59.500Z", "tags": {"k": 2, "j": -1}, "phone": "p"}
    assert karapace.encode(value) == compiled.encode(value)
    assert karapace.decode(compiled.encode(value)) == compiled.decode(karapace.encode(value)) == value
