"""service.schemas.arrow: Avro / Protobuf / JSON Schema -> Arrow types, decoded records -> one typed Arrow
column, and schema evolution across a set of records (one reader schema; other writers resolved into it or
error rows). No sockets: schemas are given as the registry's ResolvedSchema values."""

from __future__ import annotations

import datetime
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from google.protobuf import descriptor_pb2

from service.schemas.arrow import ReaderCache, decode_column, pick_reader_id
from service.schemas.arrow_types import ArrowMappingError, avro_mapping, jsonschema_mapping
from service.schemas.codecs import Codecs
from service.schemas.formats import ResolvedSchema
from service.schemas.registry import Schema
from service.schemas.wire import frame

F = descriptor_pb2.FieldDescriptorProto
CODECS = Codecs()


def resolved(sid: int, fmt: str, schema: Any, references: dict[str, str] | None = None) -> ResolvedSchema:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    stype = {"avro": "AVRO", "jsonschema": "JSON", "protobuf": "PROTOBUF"}[fmt]
    codec = CODECS.codec(fmt, sid + 10_000 * len(text), text, references or None)
    return ResolvedSchema(sid, stype, Schema(text, stype), references or {}, codec)


def avro_bytes(schema: Any, sid: int, value: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), value)
    return frame(sid, out.getvalue())


# -------------------------------------------------------------------------------------------- the mappings
def test_avro_mapping_of_every_kind() -> None:
    schema = {"type": "record", "name": "All", "namespace": "t", "fields": [
        {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"}, {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "opt", "type": ["null", "string"]}, {"name": "opt2", "type": ["long", "null"]},
        {"name": "u", "type": ["null", "int", "string", "Color"]},
        {"name": "arr", "type": {"type": "array", "items": "F4"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
        {"name": "again", "type": "Inner"},
    ]}
    t = avro_mapping(schema).type
    want = {
        "b": pa.bool_(), "i": pa.int32(), "l": pa.int64(), "f": pa.float32(), "d": pa.float64(), "s": pa.string(),
        "raw": pa.binary(), "fx": pa.binary(), "e": pa.string(), "opt": pa.string(), "opt2": pa.int64(),
        "u": pa.struct([("member0", pa.int32()), ("member1", pa.string()), ("member2", pa.string())]),
        "arr": pa.list_(pa.binary()), "m": pa.map_(pa.string(), pa.float64()), "day": pa.date32(),
        "tm": pa.time64("us"), "tu": pa.time64("us"), "ts": pa.timestamp("ms", "UTC"),
        "tsu": pa.timestamp("us", "UTC"), "lts": pa.timestamp("ms"), "dec": pa.decimal128(12, 3), "id": pa.string(),
        "inner": pa.struct([("x", pa.int32())]), "again": pa.struct([("x", pa.int32())]),
    }
    assert {f.name: f.type for f in t} == want
    assert [f.name for f in t] == list(want)


def test_avro_recursive_type_becomes_json_text() -> None:
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    t = avro_mapping(node).type
    assert t == pa.struct([("v", pa.int32()), ("next", pa.string())])
    payload = avro_bytes(node, 1, {"v": 1, "next": {"v": 2, "next": None}})
    col = decode_column("avro", [payload], {1: resolved(1, "avro", node)}.get)
    assert col.array.to_pylist() == [{"v": 1, "next": '{"v":2,"next":null}'}]


def test_jsonschema_mapping() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}, "s": {"type": ["string", "null"]},
        "color": {"enum": ["r", "g"]}, "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "who": {"$ref": "#/definitions/who"}, "ext": {"$ref": "other.json"},
        "maybe": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
        "mixed": {"type": ["string", "integer"]}, "free": {}, "all": {"allOf": [{"type": "object"}]},
        "tree": {"$ref": "#"}},
        "definitions": {"who": {"type": "object", "properties": {"name": {"type": "string"}}}}}
    refs = {"other.json": json.dumps({"type": "object", "properties": {"z": {"type": "number"}}})}
    t = jsonschema_mapping(schema, refs).type
    assert {f.name: f.type for f in t} == {
        "n": pa.int64(), "x": pa.float64(), "ok": pa.bool_(), "s": pa.string(), "color": pa.string(),
        "tags": pa.list_(pa.string()), "attrs": pa.map_(pa.string(), pa.int64()),
        "who": pa.struct([("name", pa.string())]), "ext": pa.struct([("z", pa.float64())]), "maybe": pa.int64(),
        "mixed": pa.string(), "free": pa.string(), "all": pa.string(), "tree": pa.string()}


def _proto() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3", dependency=[
        "google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto", "google/protobuf/struct.proto",
        "google/protobuf/duration.proto"])
    m = f.message_type.add(name="Evt")
    add = m.field.add
    add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add(name="big", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    add(name="small", number=3, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
    add(name="kind", number=4, type=F.TYPE_ENUM, type_name=".t.Kind", label=F.LABEL_OPTIONAL)
    add(name="names", number=5, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    entry = m.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    add(name="attrs", number=6, type=F.TYPE_MESSAGE, type_name=".t.Evt.AttrsEntry", label=F.LABEL_REPEATED)
    add(name="at", number=7, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)
    add(name="maybe", number=8, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Int32Value",
        label=F.LABEL_OPTIONAL)
    add(name="doc", number=9, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Struct", label=F.LABEL_OPTIONAL)
    add(name="child", number=10, type=F.TYPE_MESSAGE, type_name=".t.Evt", label=F.LABEL_OPTIONAL)
    add(name="took", number=11, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Duration", label=F.LABEL_OPTIONAL)
    add(name="blob", number=12, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    other = f.message_type.add(name="Other")
    other.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    kind = f.enum_type.add(name="Kind")
    kind.value.add(name="NONE", number=0)
    kind.value.add(name="BIG", number=1)
    return f


def test_protobuf_mapping_and_values() -> None:
    fdp = _proto()
    r = resolved(5, "protobuf", _b64(fdp))
    cls = r.codec.message_class((0,))
    msg = cls(id=-3, big=2**64 - 1, small=7, kind=1, names=["a", "b"], attrs={"k": 2}, blob=b"\x00\xff")
    msg.at.seconds, msg.at.nanos = 1_700_000_000, 123_456_000
    msg.maybe.value = 0
    msg.doc.update({"x": [1, "y"]})
    msg.child.id = 9
    msg.took.seconds = 2
    payloads = [frame(5, msg.SerializeToString(), [0]), frame(5, cls(id=1).SerializeToString(), [0]),
                frame(5, b"", [1]), frame(5, b"", [0])]  # the reader's message: that of the last record
    col = decode_column("protobuf", payloads, {5: r}.get)
    t = col.array.type
    assert {f.name: f.type for f in t if f.name != "child"} == {
        "id": pa.int64(), "big": pa.decimal128(20, 0), "small": pa.int64(), "kind": pa.string(),
        "names": pa.list_(pa.string()), "attrs": pa.map_(pa.string(), pa.int32()),
        "at": pa.timestamp("us", "UTC"), "maybe": pa.int32(), "doc": pa.string(), "took": pa.duration("us"),
        "blob": pa.binary()}
    assert t.field("child").type == pa.string()  # a recursive message: its canonical JSON text
    first, second, third, _ = col.array.to_pylist()
    assert first["big"] == Decimal(2**64 - 1) and first["kind"] == "BIG" and first["attrs"] == [("k", 2)]
    assert first["at"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=datetime.UTC)
    assert first["maybe"] == 0 and json.loads(first["doc"]) == {"x": [1, "y"]}
    assert json.loads(first["child"]) == {"id": "9"}
    assert first["took"] == datetime.timedelta(seconds=2) and first["blob"] == b"\x00\xff"
    # unset message fields are null; proto3 scalars their default
    assert second["at"] is None and second["maybe"] is None and second["child"] is None and second["kind"] == "NONE"
    # a record of another message type than the reader's: an error row
    assert third is None and "t.Other" in col.errors[2] and col.errors[:2] == [None, None] and col.errors[3] is None


def _b64(fdp: descriptor_pb2.FileDescriptorProto) -> str:
    import base64

    return base64.b64encode(fdp.SerializeToString()).decode()


# ---------------------------------------------------------------------------------------------- evolution
V1 = {"type": "record", "name": "User", "namespace": "t", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
V2 = {"type": "record", "name": "User", "namespace": "t", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "long"},
    {"name": "email", "type": ["null", "string"], "default": None}]}
BAD = {"type": "record", "name": "User", "namespace": "t", "fields": [{"name": "name", "type": "int"}]}
SCHEMAS = {1: resolved(1, "avro", V1), 2: resolved(2, "avro", V2), 3: resolved(3, "avro", BAD),
           4: resolved(4, "jsonschema", {"type": "object"})}


def _mixed(n: int = 12) -> list[bytes | None]:
    """n records written with v1, n with v2 (the latest), then odd ones."""
    out: list[bytes | None] = [avro_bytes(V1, 1, {"name": f"a{i}", "age": i}) for i in range(n)]
    out += [avro_bytes(V2, 2, {"name": f"b{i}", "age": 2**40 + i, "email": f"e{i}"}) for i in range(n)]
    return out


def test_default_reader_is_the_latest_writer_and_older_rows_are_resolved_into_it() -> None:
    payloads = _mixed()
    col = decode_column("avro", payloads, SCHEMAS.get)
    assert col.reader_id == 2 and col.array.type == avro_mapping(V2).type
    rows = col.array.to_pylist()
    assert rows[0] == {"name": "a0", "age": 0, "email": None}  # int promoted to long, the default filled in
    assert rows[12] == {"name": "b0", "age": 2**40, "email": "e0"}
    assert col.schema_ids == [1] * 12 + [2] * 12 and col.errors == [None] * 24


def test_pinned_older_reader_drops_new_fields_and_unresolvable_rows_are_errors() -> None:
    payloads = [*_mixed(3), avro_bytes(BAD, 3, {"name": 5})]
    col = decode_column("avro", payloads, SCHEMAS.get, reader_id=1)
    rows = col.array.to_pylist()
    assert col.array.type == pa.struct([("name", pa.string()), ("age", pa.int32())])
    assert rows[:3] == [{"name": f"a{i}", "age": i} for i in range(3)]
    # long -> int is no Avro promotion: v2 rows cannot be read as v1
    assert rows[3:] == [None] * 4
    assert all("schema id 2 cannot be read as schema id 1" in e for e in col.errors[3:6])  # type: ignore[operator]
    assert "schema id 3 cannot be read as schema id 1" in col.errors[6]  # type: ignore[operator]


def test_bad_rows_never_fail_the_column() -> None:
    good = _mixed(10)
    payloads = [*good[:5], b"\x00\x00\x00\x00\x02\xff\xff", None, b"text", b"\x00\x00\x00\x00\x09xx",
                frame(4, b"{}"), *good[5:]]
    col = decode_column("avro", payloads, SCHEMAS.get)
    errors = col.errors
    assert col.reader_id == 2 and col.array.null_count == 5
    assert "not Avro of schema id 2" in errors[5] and errors[6] is None  # type: ignore[operator]
    assert "magic byte" in errors[7] and "schema id 9 not found" in errors[8]  # type: ignore[operator]
    assert "is a JSON schema, not AVRO" in errors[9]  # type: ignore[operator]
    assert [r["name"] for r in col.array.to_pylist() if r] == [f"a{i}" for i in range(10)] + [
        f"b{i}" for i in range(10)]


def test_batched_read_falls_back_to_record_by_record_on_trailing_bytes() -> None:
    payloads = _mixed(10)
    payloads[3] = payloads[3] + b"\x02"  # type: ignore[operator]  # trailing byte: only this row is odd
    col = decode_column("avro", payloads, SCHEMAS.get, reader_id=2)
    assert col.errors == [None] * 20
    assert [r["name"] for r in col.array.to_pylist()][:4] == ["a0", "a1", "a2", "a3"]


def test_logical_values_and_unions() -> None:
    schema = {"type": "record", "name": "L", "fields": [
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "u", "type": ["null", "long", "string", {"type": "record", "name": "P", "fields": [
            {"name": "x", "type": "int"}]}]},
        {"name": "m", "type": {"type": "map", "values": "string"}}]}
    u = uuid.UUID(int=7)
    values = [{"day": datetime.date(2024, 2, 29), "tm": datetime.time(1, 2, 3, 4000),
               "ts": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "dec": Decimal("12.34"), "id": u,
               "u": 5, "m": {"a": "b"}},
              {"day": 0, "tm": 0, "ts": 0, "dec": Decimal("-0.01"), "id": u, "u": "s", "m": {}},
              {"day": 0, "tm": 0, "ts": 0, "dec": Decimal(0), "id": u, "u": {"x": 3}, "m": {}},
              {"day": 0, "tm": 0, "ts": 0, "dec": Decimal(0), "id": u, "u": None, "m": {}}]
    col = decode_column("avro", [avro_bytes(schema, 7, v) for v in values], {7: resolved(7, "avro", schema)}.get)
    rows = col.array.to_pylist()
    assert rows[0]["day"] == datetime.date(2024, 2, 29) and rows[0]["tm"] == datetime.time(1, 2, 3, 4000)
    assert rows[0]["ts"] == datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    assert rows[0]["dec"] == Decimal("12.34") and rows[1]["dec"] == Decimal("-0.01") and rows[0]["id"] == str(u)
    assert [r["u"] for r in rows] == [{"member0": 5, "member1": None, "member2": None},
                                      {"member0": None, "member1": "s", "member2": None},
                                      {"member0": None, "member1": None, "member2": {"x": 3}}, None]
    assert rows[0]["m"] == [("a", "b")]


def test_jsonschema_values_fit_the_reader_or_become_error_rows() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                                               "free": {"type": ["string", "integer"]}}}
    r = {8: resolved(8, "jsonschema", schema)}
    payloads = [frame(8, b'{"n": 1, "x": 2, "free": "a", "extra": true}'), frame(8, b'{"n": "one"}'),
                frame(8, b"{not json"), frame(8, b'{"free": 3}')]
    col = decode_column("jsonschema", payloads, r.get)
    rows = col.array.to_pylist()
    assert rows[0] == {"n": 1, "x": 2.0, "free": '"a"'} and rows[3] == {"n": None, "x": None, "free": "3"}
    assert rows[1] is None and "does not fit" in col.errors[1]  # type: ignore[operator]
    assert rows[2] is None and "not valid JSON" in col.errors[2]  # type: ignore[operator]


def test_reader_choice_and_unusable_readers() -> None:
    assert pick_reader_id([1, None, 2, 9, 4], SCHEMAS.get, "avro") == 2  # 9 unknown, 4 is JSON Schema
    assert pick_reader_id([None, 4], SCHEMAS.get, "avro") is None
    col = decode_column("avro", [None, b"x"], SCHEMAS.get)
    assert col.reader_id is None and col.array.type == pa.null() and col.errors[0] is None
    with pytest.raises(ArrowMappingError, match="not in the schema registry"):
        decode_column("avro", [], SCHEMAS.get, reader_id=99)
    with pytest.raises(ArrowMappingError, match="is a JSON schema"):
        decode_column("avro", [], SCHEMAS.get, reader_id=4)
    cache = ReaderCache(size=2)
    a = decode_column("avro", _mixed(1), SCHEMAS.get, cache=cache)
    b = decode_column("avro", _mixed(1), SCHEMAS.get, cache=cache)
    assert a.array.equals(b.array) and cache.get("avro", SCHEMAS[2]) is cache.get("avro", SCHEMAS[2])


# ------------------------------------------------------------------ the columnar reader agrees with fastavro's
RICH = {"type": "record", "name": "Rich", "namespace": "t", "fields": [
    {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
    {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "s", "type": "string"},
    {"name": "raw", "type": "bytes"}, {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
    {"name": "opt", "type": ["null", "string"]}, {"name": "optl", "type": ["long", "null"]},
    {"name": "u", "type": ["null", "int", "string", {"type": "record", "name": "P", "fields": [
        {"name": "x", "type": "double"}]}]},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "nested", "type": {"type": "array", "items": {"type": "map", "values": ["null", "P"]}}},
    {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "long"}}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}}]}


def _rich(i: int) -> dict[str, Any]:
    return {"b": i % 2 == 0, "i": -(2**31) if i == 3 else i * 7, "l": -(2**63) if i == 5 else i * 2**40,
            "f": i / 4, "d": -i / 3, "s": "ü" * (i % 4) + str(i), "raw": bytes(range(i % 5)), "fx": b"abc",
            "e": "ABC"[i % 3], "opt": None if i % 3 == 0 else f"o{i}", "optl": None if i % 2 else i,
            "u": [None, i, f"s{i}", {"x": i / 2}][i % 4], "tags": [f"t{j}" for j in range(i % 4)],
            "nested": [{"k": None, "q": {"x": 1.5}}] * (i % 3), "m": {f"k{j}": list(range(j)) for j in range(i % 3)},
            "day": datetime.date(2024, 1, 1) + datetime.timedelta(days=i), "tm": datetime.time(0, 0, i % 60),
            "ts": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=i),
            "lts": datetime.datetime(2024, 1, 1) + datetime.timedelta(microseconds=i),
            "id": str(uuid.UUID(int=i))}


def _by_fastavro(payloads: list[bytes | None], schemas: dict[int, Any]) -> Any:
    cache = ReaderCache()
    reader = cache.get("avro", schemas[1])
    assert reader.columns is not None  # the rich schema is one the columnar reader takes
    reader.columns = None
    return decode_column("avro", payloads, schemas.get, cache=cache)


def test_columnar_reader_matches_fastavro_on_every_kind() -> None:
    schemas = {1: resolved(1, "avro", RICH)}
    payloads: list[bytes | None] = [avro_bytes(RICH, 1, _rich(i)) for i in range(40)]
    fast = decode_column("avro", payloads, schemas.get)
    slow = _by_fastavro(payloads, schemas)
    assert fast.array.type == slow.array.type == avro_mapping(RICH).type
    assert fast.array.to_pylist() == slow.array.to_pylist()
    assert fast.array.equals(slow.array) and fast.errors == slow.errors == [None] * 40


def test_columnar_reader_reads_blocked_arrays_and_hands_odd_payloads_to_fastavro() -> None:
    schema = {"type": "record", "name": "T", "fields": [{"name": "tags", "type": {"type": "array", "items": "string"}},
                                                       {"name": "n", "type": "int"}]}
    schemas = {1: resolved(1, "avro", schema)}
    # [a, b] in a block with a byte size (count -2), then [c], then the end; n = 1
    blocked = frame(1, b"\x03\x04\x02a\x02b" + b"\x02\x02c" + b"\x00" + b"\x02")
    payloads = [avro_bytes(schema, 1, {"tags": ["x"], "n": 5}), blocked]
    col = decode_column("avro", payloads, schemas.get)
    assert col.array.to_pylist() == [{"tags": ["x"], "n": 5}, {"tags": ["a", "b", "c"], "n": 1}]
    odd = [*payloads, frame(1, b"\x00\x02" + b"\xff"), frame(1, b"\x02\x04\xc3\x28\x02")]  # trailing byte, bad UTF-8
    col = decode_column("avro", odd, schemas.get)
    assert col.array.to_pylist()[:3] == [{"tags": ["x"], "n": 5}, {"tags": ["a", "b", "c"], "n": 1},
                                         {"tags": [], "n": 1}]
    assert col.errors[:3] == [None, None, None] and "not Avro" in col.errors[3]  # type: ignore[operator]


EV_W = {"type": "record", "name": "Ev", "namespace": "w", "fields": [
    {"name": "id", "type": "int"}, {"name": "gone", "type": "string"},
    {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["R", "G"]}},
    {"name": "opt", "type": ["null", "int"]},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "It", "fields": [
        {"name": "q", "type": "float"}]}}},
    {"name": "m", "type": {"type": "map", "values": "int"}},
    {"name": "inner", "type": {"type": "record", "name": "In", "fields": [{"name": "a", "type": "long"}]}}]}
EV_R = {"type": "record", "name": "Ev", "namespace": "r", "fields": [
    {"name": "id", "type": "long"},
    {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["R", "G", "B"]}},
    {"name": "opt", "type": ["null", "long"], "default": None},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "It", "fields": [
        {"name": "q", "type": "double"}, {"name": "unit", "type": "string", "default": "kg"}]}}},
    {"name": "m", "type": {"type": "map", "values": "double"}},
    {"name": "inner", "type": {"type": "record", "name": "In", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"], "default": None}]}},
    {"name": "added", "type": "int", "default": 7}]}


def test_columnar_resolution_matches_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.schemas import arrow

    schemas = {1: resolved(1, "avro", EV_W), 2: resolved(2, "avro", EV_R)}
    payloads: list[bytes | None] = [avro_bytes(EV_W, 1, {
        "id": i, "gone": "x", "color": "RG"[i % 2], "opt": None if i % 3 else i,
        "items": [{"q": j / 2} for j in range(i % 3)], "m": {"k": i}, "inner": {"a": i}}) for i in range(20)]
    payloads[5] = None  # a tombstone among them
    bodies = [p[5:] for p in payloads if p is not None]
    assert ReaderCache().get("avro", schemas[2]).read_columns(bodies, schemas[1]) is not None  # column-wise
    fast = decode_column("avro", payloads, schemas.get, reader_id=2)
    monkeypatch.setattr(arrow.Reader, "read_columns", lambda self, p, r: None)
    slow = decode_column("avro", payloads, schemas.get, reader_id=2, cache=ReaderCache())
    assert fast.array.type == slow.array.type == avro_mapping(EV_R).type
    assert fast.array.to_pylist() == slow.array.to_pylist()
    assert fast.errors == slow.errors == [None] * 20
    assert fast.array.to_pylist()[1]["items"] == [{"q": 0.0, "unit": "kg"}] and fast.array.to_pylist()[0]["added"] == 7


def test_mixed_writers_keep_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    payloads: list[bytes | None] = []
    for i in range(30):  # v1 and v2 records interleaved, with a bad one and a tombstone
        payloads.append(avro_bytes(V1, 1, {"name": f"a{i}", "age": i}) if i % 2 else
                        avro_bytes(V2, 2, {"name": f"b{i}", "age": i, "email": None}))
    payloads[7], payloads[8] = b"junk", None
    col = decode_column("avro", payloads, SCHEMAS.get, reader_id=2)
    names = [r["name"] if r else None for r in col.array.to_pylist()]
    assert names == [None if i in (7, 8) else (f"a{i}" if i % 2 else f"b{i}") for i in range(30)]
    assert col.errors[7] is not None and [e for i, e in enumerate(col.errors) if i != 7] == [None] * 29


def test_columnar_reader_refuses_what_arrow_would_hold_invalid() -> None:
    from service.schemas.avro_columns import compile_schema

    schema = {"type": "record", "name": "T", "fields": [
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}}, {"name": "ok", "type": "boolean"}]}
    reader = compile_schema(schema)
    assert reader is not None
    good = [avro_bytes(schema, 1, {"tm": 1000, "ok": True})[5:]] * 9
    assert reader.read(good) is not None
    assert reader.read([*good, b"\x01\x01"]) is None  # a negative time of day
    assert reader.read([*good, b"\x02\x02"]) is None  # a boolean byte of 2
    assert compile_schema({"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 1}) is None


def test_columnar_strings_larger_than_a_gather_step() -> None:
    from service.schemas.avro_columns import compile_schema

    schema = {"type": "record", "name": "S",
              "fields": [{"name": "s", "type": "string"}, {"name": "b", "type": "bytes"}]}
    reader = compile_schema(schema)
    assert reader is not None
    values = [{"s": "x" * (3 << 20) if i == 4 else f"s{i}" * (i * 1000), "b": bytes([i]) * (i * 50_000)}
              for i in range(40)]
    arr = reader.read([avro_bytes(schema, 1, v)[5:] for v in values])
    assert arr is not None and arr.to_pylist() == values
