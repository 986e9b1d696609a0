"""service.schemas.avro against independent peers: fastavro's own writer and JSON encoder (the Avro JSON
encoding Confluent's REST Proxy returns) and confluent-kafka's AvroSerializer / AvroDeserializer (offline,
with its in-memory mock registry)."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import struct
import uuid

import fastavro
import pytest
from fastavro.json_write import json_writer

from service.schemas.avro import AvroCodec, AvroDecodeError, AvroEncodeError, AvroSchemaError

UTC = datetime.UTC

# every type and logical type, unions of every kind of branch, named types in namespaces, a reused named type
EVERYTHING = {
    "type": "record",
    "name": "Everything",
    "namespace": "com.acme",
    "fields": [
        {"name": "s", "type": "string"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "t", "type": "boolean"},
        {"name": "n", "type": "null"},
        {"name": "b", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Token", "namespace": "com.acme.types", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "string"]}},
        {
            "name": "u",
            "type": [
                "null",
                "string",
                "int",
                "long",
                "float",
                "double",
                "bytes",
                {"type": "record", "name": "Payload", "namespace": "com.acme.v1",
                 "fields": [{"name": "amount", "type": "float"}]},
                {"type": "array", "items": "int"},
                {"type": "map", "values": "int"},
                "com.acme.Color",
                "com.acme.types.Token",
            ],
        },
        {"name": "again", "type": ["null", "com.acme.v1.Payload"], "default": None},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "fdec", "type": {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal",
                                  "precision": 12, "scale": 3}},
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tus", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ltsm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "optts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
    ],
}


def _python_record(i: int, u: object) -> dict:
    """A record as Python data (fastavro's and confluent-kafka's input: logical types as Python objects)."""
    return {
        "s": f"héllo {i}", "i": -i, "l": 2**40 + i, "f": 1.5, "d": -2.25, "t": i % 2 == 0, "n": None,
        "b": bytes([0, 1, 127, 128, 255, i % 256]), "fx": b"\x00\xffAB", "e": "GREEN",
        "arr": [1, -2, 2**50], "m": {"a": "x", "b": None},
        "u": u, "again": {"amount": 0.5} if i % 2 else None,
        "dec": decimal.Decimal("-14.36"), "fdec": decimal.Decimal("123456.789"),
        "date": datetime.date(2024, 2, 29), "tms": datetime.time(13, 14, 15, 16000),
        "tus": datetime.time(1, 2, 3, 456789),
        "tsm": datetime.datetime(2025, 5, 5, 12, 29, 0, 123000, tzinfo=UTC),
        "tsu": datetime.datetime(2025, 5, 5, 12, 29, 0, 123456, tzinfo=UTC),
        "ltsm": datetime.datetime(2025, 5, 5, 16, 29, 0, 123000),
        "uid": uuid.UUID("123e4567-e89b-12d3-a456-426614174000"),
        "optts": datetime.datetime(2001, 1, 1, tzinfo=UTC) if i % 2 else None,
    }


# one record per union branch, in fastavro's tuple notation where Python types would be ambiguous
UNION_VALUES = [
    None, "text", ("int", 7), ("long", 2**40), ("float", 0.5), ("double", 1e100), b"\x00\x80\xff",
    {"amount": 2.5}, [1, 2, 3], {"k": 1}, ("com.acme.Color", "RED"), ("com.acme.types.Token", b"ABCD"),
]


def _fastavro_payloads() -> tuple[list[bytes], list[dict]]:
    parsed = fastavro.parse_schema(EVERYTHING)
    payloads, expected = [], []
    for i, u in enumerate(UNION_VALUES):
        rec = _python_record(i, u)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, rec)
        payloads.append(buf.getvalue())
        out = io.StringIO()
        json_writer(out, parsed, [rec])  # fastavro's own implementation of the Avro JSON encoding
        expected.append(json.loads(out.getvalue()))
    return payloads, expected


def test_decode_renders_the_avro_json_encoding_like_fastavros_json_writer() -> None:
    payloads, expected = _fastavro_payloads()
    codec = AvroCodec(json.dumps(EVERYTHING))
    decoded = codec.decode_many(payloads)
    assert decoded == expected
    # spot-check the rules the module documents, so a change in the peer cannot hide a change here
    first = decoded[1]
    assert first["u"] == {"string": "text"}
    assert decoded[2]["u"] == {"int": 7} and decoded[3]["u"] == {"long": 2**40}
    assert decoded[7]["u"] == {"com.acme.v1.Payload": {"amount": 2.5}}
    assert decoded[8]["u"] == {"array": [1, 2, 3]} and decoded[9]["u"] == {"map": {"k": 1}}
    assert decoded[10]["u"] == {"com.acme.Color": "RED"}
    assert decoded[11]["u"] == {"com.acme.types.Token": "ABCD"}
    assert decoded[0]["u"] is None
    assert first["b"] == "\x00\x01\x7f\x80\xff\x01"  # one code point per byte
    assert first["m"] == {"a": {"string": "x"}, "b": None}
    assert first["again"] == {"com.acme.v1.Payload": {"amount": 0.5}}
    assert first["dec"] == "\xfa\x64"  # -1436 as two's-complement bytes
    assert first["date"] == 19782 and first["tms"] == 47655016 and first["tus"] == 3723456789
    assert first["tsm"] == 1746448140123 and first["tsu"] == 1746448140123456 and first["ltsm"] == 1746462540123
    assert first["uid"] == "123e4567-e89b-12d3-a456-426614174000"
    assert first["optts"] == {"long": 978307200000}
    assert first["e"] == "GREEN" and list(first) == [f["name"] for f in EVERYTHING["fields"]]


def test_encode_then_decode_round_trips_every_rendered_value_and_matches_fastavro_bytes() -> None:
    payloads, expected = _fastavro_payloads()
    codec = AvroCodec(EVERYTHING)
    for payload, value in zip(payloads, expected, strict=True):
        assert codec.encode(value) == payload  # byte-identical to fastavro's writer
        assert codec.decode(codec.encode(value)) == value


@pytest.fixture()
def confluent():
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = MockSchemaRegistryClient({"url": "mock://avro-tests"})
    ctx = SerializationContext("orders", MessageField.VALUE)
    return client, ctx, AvroSerializer, AvroDeserializer


def test_records_from_confluent_kafkas_serializer_decode_to_the_confluent_rendering(confluent) -> None:
    client, ctx, serializer_cls, deserializer_cls = confluent
    serialize = serializer_cls(client, json.dumps(EVERYTHING))
    deserialize = deserializer_cls(client)
    codec = AvroCodec(json.dumps(EVERYTHING))
    for i, u in enumerate(UNION_VALUES):
        rec = _python_record(i, u)
        framed = serialize(rec, ctx)
        magic, schema_id = struct.unpack(">bI", framed[:5])
        assert magic == 0 and client.get_schema(schema_id) is not None
        ours = codec.decode(framed[5:])
        theirs = deserialize(framed, ctx)  # Python objects: logical types converted, unions untagged
        # the same record, field by field, under the documented rendering rules
        assert ours["s"] == theirs["s"] and ours["i"] == theirs["i"] and ours["l"] == theirs["l"]
        assert ours["b"].encode("latin-1") == theirs["b"] and ours["fx"].encode("latin-1") == theirs["fx"]
        assert ours["e"] == theirs["e"] and ours["arr"] == theirs["arr"]
        assert ours["m"] == {k: None if v is None else {"string": v} for k, v in theirs["m"].items()}
        assert _unscaled(ours["dec"], 2) == theirs["dec"] and _unscaled(ours["fdec"], 3) == theirs["fdec"]
        assert datetime.date(1970, 1, 1) + datetime.timedelta(days=ours["date"]) == theirs["date"]
        assert datetime.datetime.fromtimestamp(ours["tsm"] / 1000, UTC) == theirs["tsm"]
        epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
        assert epoch + datetime.timedelta(microseconds=ours["tsu"]) == theirs["tsu"]
        assert datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ours["ltsm"]) == theirs["ltsm"]
        assert _time(ours["tms"] * 1000) == theirs["tms"] and _time(ours["tus"]) == theirs["tus"]
        assert ours["uid"] == str(theirs["uid"])
        if theirs["optts"] is None:
            assert ours["optts"] is None
        else:
            assert datetime.datetime.fromtimestamp(ours["optts"]["long"] / 1000, UTC) == theirs["optts"]
        if theirs["u"] is None:
            assert ours["u"] is None
        else:
            ((tag, inner),) = ours["u"].items()
            want = u[1] if isinstance(u, tuple) else u
            assert theirs["u"] == want
            assert (inner.encode("latin-1") if isinstance(want, bytes) else inner) == want
            assert tag == (u[0] if isinstance(u, tuple) else _expected_tag(u))


def _expected_tag(u: object) -> str:
    return {str: "string", bytes: "bytes", dict: "map", list: "array"}[type(u)] if not (
        isinstance(u, dict) and "amount" in u) else "com.acme.v1.Payload"


def _unscaled(latin1: str, scale: int) -> decimal.Decimal:
    return decimal.Decimal(int.from_bytes(latin1.encode("latin-1"), "big", signed=True)).scaleb(-scale)


def _time(micros: int) -> datetime.time:
    return (datetime.datetime(2000, 1, 1) + datetime.timedelta(microseconds=micros)).time()


def test_our_payloads_are_read_back_by_confluent_kafkas_deserializer(confluent) -> None:
    client, ctx, _serializer_cls, deserializer_cls = confluent
    from confluent_kafka.schema_registry import Schema

    schema_id = client.register_schema("orders-value", Schema(json.dumps(EVERYTHING), "AVRO"))
    deserialize = deserializer_cls(client)
    _payloads, rendered = _fastavro_payloads()
    codec = AvroCodec(EVERYTHING)
    for i, (u, value) in enumerate(zip(UNION_VALUES, rendered, strict=True)):
        framed = struct.pack(">bI", 0, schema_id) + codec.encode(value)
        theirs = deserialize(framed, ctx)
        want = _python_record(i, u[1] if isinstance(u, tuple) else u)
        want["tms"] = datetime.time(13, 14, 15, 16000)
        assert theirs == want


# Karapace's REST consumer tests: union values untagged, bytes as base64 (its complex-union and Debezium cases)
COMPLEX_UNION = {
    "namespace": "io.aiven.minimal", "name": "MinimalUnionTest", "type": "record",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "attrs", "type": {"type": "array", "items": {
            "type": "record", "name": "Attr",
            "fields": [{"name": "k", "type": "string"},
                       {"name": "v", "type": ["null", "string", "long", "double", "boolean"]}]}}},
        {"name": "props", "type": {"type": "map", "values": ["null", "string"]}},
    ],
}
COMPLEX_UNION_RECORD = {
    "id": "one",
    "attrs": [{"k": "text", "v": "value"}, {"k": "count", "v": 5}, {"k": "ratio", "v": 1.5},
              {"k": "flag", "v": True}, {"k": "empty", "v": None}],
    "props": {"present": "yes", "missing": None},
}


def test_karapace_rendering_untagged_unions_round_trip_and_bytes_are_base64() -> None:
    codec = AvroCodec(json.dumps(COMPLEX_UNION), rendering="karapace")
    payload = codec.encode(COMPLEX_UNION_RECORD)  # untagged input, as Karapace's test produces it
    assert codec.decode(payload) == COMPLEX_UNION_RECORD
    # the same bytes rendered the Confluent way carry the branch tags
    confluent = AvroCodec(json.dumps(COMPLEX_UNION)).decode(payload)
    assert [a["v"] for a in confluent["attrs"]] == [
        {"string": "value"}, {"long": 5}, {"double": 1.5}, {"boolean": True}, None]
    assert confluent["props"] == {"present": {"string": "yes"}, "missing": None}

    schema = {"type": "record", "name": "Env", "fields": [
        {"name": "after", "type": ["null", {"type": "record", "name": "Dec", "fields": [
            {"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]}]}]}
    karapace = AvroCodec(schema, rendering="karapace")
    payload = karapace.encode({"after": {"Dec": {"scale": 2, "value": "\x01\x02"}}})
    assert karapace.decode(payload) == {"after": {"scale": 2, "value": base64.b64encode(b"\x01\x02").decode()}}


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"s": 1}, "$.s", "expected string, got number"),
        ({"s": "x", "n": {"int": "7"}}, "$.n.int", "expected int, got string"),
        ({"s": "x", "n": 2**31}, "$.n", "matches no branch"),
        ({"s": "x", "p": {"Payload": {"amount": 1}}}, "$.p", "matches no branch"),  # short name of a namespaced type
        ({"s": "x", "p": {"com.ex.v1.Payload": {}}}, '$.p["com.ex.v1.Payload"].amount', "missing field"),
        ({"s": "x", "e": "BLUE"}, "$.e", "not a symbol of enum com.ex.Color"),
        ({"s": "x", "fx": "ABC"}, "$.fx", "needs 4 bytes, got 3"),
        ({"s": "x", "b": "\u0100"}, "$.b", "above U+00FF"),
        ({"s": "x", "tags": ["a", 3]}, "$.tags[1]", "expected string"),
        ({"s": "x", "attrs": {"ok": 1, "bad key": "x"}}, '$.attrs["bad key"]', "expected long"),
        ({}, "$.s", "missing field (it has no default)"),
        ([], "$", "expected record com.ex.Outer (object), got array"),
    ],
)
def test_encode_validates_first_and_names_the_path(value: dict, path: str, reason: str) -> None:
    schema = {"type": "record", "name": "Outer", "namespace": "com.ex", "fields": [
        {"name": "s", "type": "string"},
        {"name": "n", "type": ["null", "int"], "default": None},
        {"name": "p", "type": ["null", {"type": "record", "name": "Payload", "namespace": "com.ex.v1",
                                         "fields": [{"name": "amount", "type": "float"}]}], "default": None},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED"]}, "default": "RED"},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}, "default": "\u0000\u0000\u0000\u0000"},
        {"name": "b", "type": "bytes", "default": ""},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "attrs", "type": {"type": "map", "values": "long"}, "default": {}},
    ]}
    codec = AvroCodec(schema)
    with pytest.raises(AvroEncodeError) as info:
        codec.encode(value)
    assert info.value.path == path
    assert reason in info.value.reason
    # defaults fill every field left out
    assert codec.decode(codec.encode({"s": "ok"})) == {
        "s": "ok", "n": None, "p": None, "e": "RED", "fx": "\x00\x00\x00\x00", "b": "", "tags": [], "attrs": {}}


def test_strict_unions_reject_untagged_values_and_unknown_tags() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "v", "type": ["null", "string", "int"]}]}
    lenient, strict = AvroCodec(schema), AvroCodec(schema, strict_unions=True)
    assert lenient.decode(lenient.encode({"v": 3})) == {"v": {"int": 3}}
    assert strict.decode(strict.encode({"v": {"int": 3}})) == {"v": {"int": 3}}
    assert strict.encode({"v": None}) == b"\x00"
    with pytest.raises(AvroEncodeError, match=r"\$\.v: a union value must be tagged"):
        strict.encode({"v": 3})
    with pytest.raises(AvroEncodeError, match=r"\$\.v: a union value must be tagged"):
        strict.encode({"v": {"long": 3}})


def test_int_and_long_branches_are_told_apart_on_decode() -> None:
    codec = AvroCodec(["int", "long", "float", "double"])
    assert codec.decode(b"\x00\x02") == {"int": 1}
    assert codec.decode(b"\x02\x02") == {"long": 1}
    assert codec.decode(codec.encode({"double": 0.5})) == {"double": 0.5}
    assert codec.decode(codec.encode({"float": 0.5})) == {"float": 0.5}


def test_decode_many_puts_an_error_in_place_of_each_bad_payload() -> None:
    codec = AvroCodec({"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "u", "type": ["null", "int"]}]})
    good = codec.encode({"s": "ok", "u": {"int": 1}})
    out = codec.decode_many([good, good[:2], b"\x04\xff\xfe\x00", b"\x02x\x08", good])
    assert out[0] == out[4] == {"s": "ok", "u": {"int": 1}}
    assert all(isinstance(e, AvroDecodeError) for e in out[1:4])  # truncated, bad UTF-8, union index 4


def test_recursive_and_primitive_schemas() -> None:
    linked = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "bytes"}, {"name": "next", "type": ["null", "Node"]}]}
    codec = AvroCodec(linked)
    value = {"v": "\x01", "next": {"Node": {"v": "\x02", "next": {"Node": {"v": "", "next": None}}}}}
    assert codec.decode(codec.encode(value)) == value
    assert AvroCodec("string").decode(b"\x04hi") == "hi"
    assert AvroCodec('"bytes"').decode(b"\x04\x00\xff") == "\x00\xff"
    assert AvroCodec({"type": "int", "logicalType": "date"}).encode(19782) == fastavro_int(19782)


def fastavro_int(n: int) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, "int", n)
    return buf.getvalue()


@pytest.mark.parametrize("schema", ["{not json", '{"type": "record", "name": "R", "fields": [{"name": "a"}]}',
                                    '["null", ["int"]]', '{"type": "nope"}', '["int", "int"]'])
def test_invalid_schemas_are_rejected(schema: str) -> None:
    with pytest.raises(AvroSchemaError):
        AvroCodec(schema)


def test_codecs_registry_caches_per_id_and_never_raises_on_decode() -> None:
    from service.schemas.codecs import Codecs, DecodeError, EncodeError, SchemaError

    codecs = Codecs(max_cached=2)
    schema = json.dumps(COMPLEX_UNION)
    payload = codecs.encode("avro", schema, COMPLEX_UNION_RECORD, schema_id=1)
    out = codecs.decode_many("avro", 1, schema, [payload, b"\x02", memoryview(payload)])
    assert out[0] == out[2] and out[0]["attrs"][1]["v"] == {"long": 5}
    assert out[1] == DecodeError("avro", 1, out[1].message) and "ends early" in out[1].message
    assert codecs.codec("avro", 1, "ignored: cached by id") is codecs.codec("avro", 1, schema)
    # a schema that does not compile: every record an error in place, the error cached (one compile)
    bad = codecs.decode_many("avro", 2, '{"type": "nope"}', [b"", b"\x00"])
    assert [type(e) for e in bad] == [DecodeError, DecodeError] and "avro schema" in bad[0].message
    with pytest.raises(SchemaError):
        codecs.codec("avro", 2, schema)
    codecs.codec("avro", 3, schema)  # max_cached=2: id 1 is evicted, compiled again from the text given
    with pytest.raises(SchemaError):
        codecs.codec("avro", 1, '{"type": "nope"}')
    with pytest.raises(EncodeError) as info:
        codecs.encode("avro", schema, {"id": 1})
    assert info.value.path == "$.id" and info.value.format == "avro"
    karapace = Codecs(avro_rendering="karapace")
    assert karapace.decode_many("avro", 1, schema, [payload]) == [COMPLEX_UNION_RECORD]
    assert isinstance(Codecs().decode_many("xml", 1, "", [b""])[0], DecodeError)
    js = Codecs(validate_json_on_decode=True).decode_many("jsonschema", 5, '{"type": "integer"}', [b"1", b'"a"'])
    assert js[0] == 1 and isinstance(js[1], DecodeError)
