"""service/schemas/produce.py (schema'd produce) without sockets: subject-name strategies,
the body's schema fields, batch validation (all or nothing, errors naming record index and path), framing;
resolution through a real SchemaResolver + RegistryClient over an in-memory httpx transport."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import orjson
import pytest
from google.protobuf import descriptor_pb2

from api.v2.produce import parse_records, render
from service.producer import RecordMetadata
from service.schemas.codecs import Codecs, SchemaError
from service.schemas.formats import ResolvedSchema, SchemaResolver
from service.schemas.produce import (
    KEY_SCHEMA_MISSING,
    MAX_REPORTED,
    RECORD_INVALID,
    RECORD_NAME,
    SCHEMA_INVALID,
    TOPIC_NAME,
    TOPIC_RECORD_NAME,
    VALUE_SCHEMA_MISSING,
    ProduceSchemaError,
    SchemaEncoder,
    SchemaSpec,
    encode_batch,
    proto_record_name,
    record_name,
    require_schemas,
    resolve_encoder,
    schema_specs,
    subject_name,
)
from service.schemas.protobuf import ProtobufCodec
from service.schemas.registry import (
    RegistryClient,
    RegistryConfig,
    RegistryRequestError,
    Schema,
    SchemaNotFound,
)
from service.schemas.wire import unframe

USER = json.dumps({"type": "record", "name": "User", "namespace": "acme",
                   "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})
JSONS = json.dumps({"type": "object", "title": "Order", "properties": {"id": {"type": "integer"}},
                    "required": ["id"]})


def _user_descriptor() -> bytes:
    fdp = descriptor_pb2.FileDescriptorProto(name="user.proto", package="acme", syntax="proto3")
    msg = fdp.message_type.add(name="User")
    msg.field.add(name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    msg.field.add(name="age", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return fdp.SerializeToString()


# -- subject names ---------------------------------------------------------------------------------------------
def test_subject_name_strategies() -> None:
    assert subject_name(TOPIC_NAME, "orders", False, "acme.User") == "orders-value"
    assert subject_name(TOPIC_NAME, "orders", True, None) == "orders-key"
    assert subject_name(RECORD_NAME, "orders", False, "acme.User") == "acme.User"
    assert subject_name(RECORD_NAME, "orders", True, "acme.Id") == "acme.Id"
    assert subject_name(TOPIC_RECORD_NAME, "orders", False, "acme.User") == "orders-acme.User"
    with pytest.raises(ProduceSchemaError) as ei:
        subject_name(RECORD_NAME, "orders", True, None)
    assert ei.value.code == SCHEMA_INVALID and "key schema has no record name" in ei.value.message
    with pytest.raises(ValueError, match="unknown subject-name strategy"):
        subject_name("Nope", "orders", True, "x")


def test_proto_record_name_is_the_first_top_level_message() -> None:
    assert proto_record_name('syntax="proto3"; message User { string name = 1; }') == "User"
    text = ('// message Commented {}\nsyntax = "proto3";\npackage acme.v1;\n/* message Block {} */\n'
            'import "other.proto";\noption java_package = "message NotThis { }";\n'
            'enum Kind { A = 0; }\nmessage Outer {\n  message Inner { int32 x = 1; }\n  Inner i = 1;\n}\n'
            'message Second {}\n')
    assert proto_record_name(text) == "acme.v1.Outer"
    assert proto_record_name('syntax = "proto3"; enum E { A = 0; }') is None


def test_record_name_per_format_and_local_validation() -> None:
    codecs = Codecs()
    assert record_name("avro", USER, codecs) == "acme.User"
    assert record_name("avro", '"string"', codecs) is None
    assert record_name("jsonschema", JSONS, codecs) == "Order"
    assert record_name("jsonschema", '{"type": "object"}', codecs) is None
    assert record_name("protobuf", "package p; message M {}", codecs) == "p.M"
    with pytest.raises(ProduceSchemaError) as ei:
        record_name("avro", '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}', codecs)
    assert ei.value.code == SCHEMA_INVALID and ei.value.message.startswith("invalid schema: avro schema")
    with pytest.raises(ProduceSchemaError) as ei:
        record_name("jsonschema", '{"type": 12}', codecs)
    assert ei.value.code == SCHEMA_INVALID


# -- the body's schema fields ----------------------------------------------------------------------------------
def test_schema_specs() -> None:
    assert schema_specs({"records": []}) == (None, None)
    key, value = schema_specs({"key_schema": '"string"', "value_schema_id": 7})
    assert key == SchemaSpec("key", schema='"string"') and key.is_key
    assert value == SchemaSpec("value", schema_id=7) and not value.is_key
    # the id wins over the text; ids as Jackson binds them ("5", 5.0)
    assert schema_specs({"value_schema": USER, "value_schema_id": "5"})[1] == SchemaSpec("value", schema_id=5)
    assert schema_specs({"key_schema_id": 5.0})[0] == SchemaSpec("key", schema_id=5)
    for bad in ({"value_schema_id": -1}, {"value_schema_id": "x"}, {"value_schema_id": True},
                {"value_schema_id": 2**32}, {"value_schema": {"type": "string"}}):
        with pytest.raises(ProduceSchemaError) as ei:
            schema_specs(bad)
        assert ei.value.code == 42206
    with pytest.raises(ProduceSchemaError) as ei:
        schema_specs({"key_schema": "  "})
    assert ei.value.code == SCHEMA_INVALID


def test_require_schemas() -> None:
    value = SchemaSpec("value", schema_id=1)
    require_schemas([None, None], [{"a": 1}, None], None, value)  # null keys need no key schema
    require_schemas([None], [None], None, None)  # all null: nothing to encode
    with pytest.raises(ProduceSchemaError) as ei:
        require_schemas([None, 5], [1, 2], None, value)
    assert ei.value.code == KEY_SCHEMA_MISSING == 42201
    with pytest.raises(ProduceSchemaError) as ei:
        require_schemas([1], [{"a": 1}], SchemaSpec("key", schema_id=1), None)
    assert ei.value.code == VALUE_SCHEMA_MISSING == 42202


# -- encoders and framing ----------------------------------------------------------------------------------------
def _resolved(fmt: str, sid: int, schema: Any, codecs: Codecs) -> ResolvedSchema:
    stype = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}[fmt]
    return ResolvedSchema(sid, stype, Schema(schema if isinstance(schema, str) else "", stype), {},
                          codecs.codec(fmt, sid, schema))


def test_avro_and_jsonschema_framing() -> None:
    codecs = Codecs()
    enc = SchemaEncoder.of("avro", _resolved("avro", 42, USER, codecs), SchemaSpec("value", schema_id=42))
    framed = enc.encode({"name": "ann", "age": 7})
    fr = unframe(framed)
    assert framed[:5] == b"\x00\x00\x00\x00\x2a" and fr.schema_id == 42
    assert codecs.decode_many("avro", 42, USER, [bytes(fr.payload)]) == [{"name": "ann", "age": 7}]

    jenc = SchemaEncoder.of("jsonschema", _resolved("jsonschema", 70000, JSONS, codecs), SchemaSpec("value", 1))
    framed = jenc.encode({"id": 3})
    assert framed == b"\x00" + (70000).to_bytes(4, "big") + b'{"id":3}'


def test_protobuf_framing_has_the_first_message_index() -> None:
    desc = _user_descriptor()
    codec = ProtobufCodec(desc)
    resolved = ResolvedSchema(9, "PROTOBUF", Schema(base64.b64encode(desc).decode(), "PROTOBUF"), {}, codec)
    enc = SchemaEncoder.of("protobuf", resolved, SchemaSpec("value", schema_id=9))
    framed = enc.encode({"name": "ann", "age": 7})
    assert framed[:6] == b"\x00\x00\x00\x00\x09\x00"  # magic, id 9, message indexes [0] as one 0 byte
    fr = unframe(framed, protobuf=True)
    assert fr.message_indexes == (0,)
    assert codec.decode(fr.payload, fr.message_indexes) == {"name": "ann", "age": 7}


def test_encoder_refuses_another_type_or_a_broken_schema() -> None:
    codecs = Codecs()
    avro = _resolved("avro", 3, USER, codecs)
    with pytest.raises(ProduceSchemaError) as ei:
        SchemaEncoder.of("jsonschema", avro, SchemaSpec("value", schema_id=3))
    assert ei.value.code == SCHEMA_INVALID
    assert ei.value.message == ("value_schema_id 3 is a AVRO schema, not JSON (the content type's format is "
                                "jsonschema)")
    broken = ResolvedSchema(4, "AVRO", Schema("{"), {}, SchemaError("avro", "schema is not JSON"))
    with pytest.raises(ProduceSchemaError) as ei:
        SchemaEncoder.of("avro", broken, SchemaSpec("key", schema="{"))
    assert ei.value.code == SCHEMA_INVALID and ei.value.message == "key_schema (id 4): avro schema: schema is not JSON"


def test_encode_batch_all_or_nothing() -> None:
    codecs = Codecs()
    value = SchemaEncoder.of("avro", _resolved("avro", 5, USER, codecs), SchemaSpec("value", schema_id=5))
    key = SchemaEncoder.of("avro", _resolved("avro", 6, '"long"', codecs), SchemaSpec("key", schema_id=6))
    ok = encode_batch([1, None, 3], [{"name": "a", "age": 1}, None, {"name": "c", "age": 3}], key, value)
    assert [(k is None, v is None) for k, v in ok] == [(False, False), (True, True), (False, False)]
    assert ok[0][0] == b"\x00\x00\x00\x00\x06\x02" and unframe(ok[2][1]).schema_id == 5

    with pytest.raises(ProduceSchemaError) as ei:
        encode_batch([None] * 3, [{"name": "a", "age": 1}, {"name": "b", "age": 2}, {"name": "c", "age": "x"}],
                     None, value)
    assert ei.value.code == RECORD_INVALID == 42203
    assert ei.value.message == ("1 record(s) do not match the avro schema, nothing was produced: "
                                "records[2].value.$.age: expected int, got string")

    # every bad record is named (key and value of one record both), up to MAX_REPORTED
    with pytest.raises(ProduceSchemaError) as ei:
        encode_batch(["k", 1], [{"name": "a"}, {"name": "b", "age": 2}], key, value)
    assert "records[0].key.$: expected long, got string" in ei.value.message
    assert "records[0].value.$.age:" in ei.value.message and ei.value.message.startswith("1 record(s)")
    n = MAX_REPORTED + 5
    with pytest.raises(ProduceSchemaError) as ei:
        encode_batch([None] * n, [{"name": i, "age": 1} for i in range(n)], None, value)
    assert ei.value.message.count("records[") == MAX_REPORTED and ei.value.message.endswith("(and 5 more)")
    assert ei.value.message.startswith(f"{n} record(s)")


def test_encode_batch_jsonschema_path() -> None:
    codecs = Codecs()
    enc = SchemaEncoder.of("jsonschema", _resolved("jsonschema", 8, JSONS, codecs), SchemaSpec("value", 8))
    with pytest.raises(ProduceSchemaError) as ei:
        encode_batch([None, None], [{"id": 1}, {"id": "two"}], None, enc)
    assert "records[1].value.$.id: 'two' is not of type 'integer'" in ei.value.message


# -- resolution through SchemaResolver + RegistryClient (in-memory transport) -----------------------------------
class FakeRegistry:
    """The few registry endpoints produce uses, in memory; ``refuse`` maps a subject to an error answer."""

    def __init__(self) -> None:
        self.schemas: dict[int, dict[str, Any]] = {}
        self.subjects: dict[str, list[int]] = {}
        self.refuse: dict[str, tuple[int, dict[str, Any]]] = {}
        self.calls: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(f"{request.method} {path}")
        if request.method == "POST" and path.startswith("/subjects/") and path.endswith("/versions"):
            subject = path.split("/")[2]
            if subject in self.refuse:
                status, body = self.refuse[subject]
                return httpx.Response(status, json=body)
            doc = orjson.loads(request.content)
            sid = next((i for i, known in self.schemas.items() if known == doc), None)
            if sid is None:
                sid = len(self.schemas) + 1
                self.schemas[sid] = doc
            self.subjects.setdefault(subject, []).append(sid)
            return httpx.Response(200, json={"id": sid})
        if request.method == "GET" and path.startswith("/schemas/ids/"):
            sid = int(path.rsplit("/", 1)[1])
            if sid not in self.schemas:
                return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"})
            return httpx.Response(200, json=self.schemas[sid])
        return httpx.Response(404, json={"error_code": 404, "message": "no route"})


@pytest.fixture
def registry() -> FakeRegistry:
    return FakeRegistry()


@pytest.fixture
async def resolver(registry: FakeRegistry) -> Any:
    client = RegistryClient(RegistryConfig("http://registry.test"), transport=httpx.MockTransport(registry.handler))
    r = SchemaResolver(client)
    yield r
    await r.close()


async def test_resolve_schema_text_registers_under_the_strategy_subject(resolver: SchemaResolver,
                                                                        registry: FakeRegistry) -> None:
    enc = await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=USER), "orders")
    assert registry.subjects == {"orders-value": [enc.schema_id]}
    key = await resolve_encoder(resolver, "avro", SchemaSpec("key", schema='"string"'), "orders")
    assert registry.subjects["orders-key"] == [key.schema_id] and key.schema_id != enc.schema_id
    await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=USER), "orders", RECORD_NAME)
    await resolve_encoder(resolver, "jsonschema", SchemaSpec("value", schema=JSONS), "orders", TOPIC_RECORD_NAME)
    assert set(registry.subjects) == {"orders-value", "orders-key", "acme.User", "orders-Order"}
    assert registry.schemas[enc.schema_id] == {"schema": USER}  # Avro: no schemaType, as Confluent's clients
    assert {"schema": JSONS, "schemaType": "JSON"} in registry.schemas.values()
    # the same text again: the client's cache answers, no second register
    posts = sum(c.startswith("POST") for c in registry.calls)
    again = await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=USER), "orders")
    assert again.schema_id == enc.schema_id and sum(c.startswith("POST") for c in registry.calls) == posts
    assert unframe(again.encode({"name": "x", "age": 1})).schema_id == enc.schema_id


async def test_resolve_by_id(resolver: SchemaResolver, registry: FakeRegistry) -> None:
    registry.schemas[12] = {"schema": USER}
    enc = await resolve_encoder(resolver, "avro", SchemaSpec("value", schema_id=12), "t")
    assert enc.schema_id == 12 and not any(c.startswith("POST") for c in registry.calls)
    with pytest.raises(SchemaNotFound) as ei:
        await resolve_encoder(resolver, "avro", SchemaSpec("value", schema_id=99), "t")
    assert "value_schema_id 99" in str(ei.value)
    with pytest.raises(ProduceSchemaError) as ei2:  # an Avro id with the jsonschema content type
        await resolve_encoder(resolver, "jsonschema", SchemaSpec("key", schema_id=12), "t")
    assert ei2.value.code == SCHEMA_INVALID and "key_schema_id 12 is a AVRO schema" in ei2.value.message


async def test_registry_refusals(resolver: SchemaResolver, registry: FakeRegistry) -> None:
    # an invalid Avro schema never reaches the registry
    with pytest.raises(ProduceSchemaError) as ei:
        await resolve_encoder(resolver, "avro", SchemaSpec("value", schema='{"type": "nope"}'), "t")
    assert ei.value.code == SCHEMA_INVALID and registry.calls == []
    # the registry's "invalid schema" (422) is 42205; an incompatible schema (409) stays the registry's error
    registry.refuse["t-value"] = (422, {"error_code": 42201, "message": "Invalid PROTOBUF schema"})
    with pytest.raises(ProduceSchemaError) as ei:
        await resolve_encoder(resolver, "protobuf", SchemaSpec("value", schema="message {"), "t")
    assert ei.value.code == SCHEMA_INVALID and "(42201): Invalid PROTOBUF schema" in ei.value.message
    registry.refuse["t-value"] = (409, {"error_code": 409, "message": "Incompatible schema"})
    with pytest.raises(RegistryRequestError) as er:
        await resolve_encoder(resolver, "avro", SchemaSpec("value", schema=USER), "t")
    assert er.value.status == 409 and not isinstance(er.value, ProduceSchemaError)
    # a record-name strategy needs a name: refused before the registry
    calls = len(registry.calls)
    with pytest.raises(ProduceSchemaError) as ei:
        await resolve_encoder(resolver, "avro", SchemaSpec("key", schema='"long"'), "t", RECORD_NAME)
    assert ei.value.code == SCHEMA_INVALID and len(registry.calls) == calls


# -- the HTTP layer's pure parts ---------------------------------------------------------------------------------
def test_parse_records_keeps_json_data_for_schema_formats() -> None:
    body = {"records": [{"key": 1, "value": {"name": "a"}, "partition": 0}, {"value": None, "timestamp": 5}]}
    out, sizes = parse_records(body, "avro", None)
    assert out == [(1, {"name": "a"}, (), 0, None), (None, None, (), None, 5)] and sizes == [0, 0]
    out, _ = parse_records(body, "protobuf", 3)
    assert [r[3] for r in out] == [3, 3]


def test_render_carries_the_schema_ids() -> None:
    body, status, failed, oks = render([RecordMetadata(0, 4)], None, 21)
    assert orjson.loads(body) == {"offsets": [{"partition": 0, "offset": 4, "error_code": None, "error": None}],
                                  "key_schema_id": None, "value_schema_id": 21}
    assert (status, failed, oks) == (200, 0, None)  # None: every record succeeded
    assert orjson.loads(render([RecordMetadata(1, 0)], 3, 4)[0])["key_schema_id"] == 3
