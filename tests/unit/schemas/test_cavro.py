"""service/schemas/_cavro.c (the C Avro -> JSON renderer) against the Python reference, byte for byte:
``orjson.dumps(AvroCodec(schema, rendering=...).decode(payload), option=OPT_NON_STR_KEYS)`` per value, and
api/v2/render.py's render_decoded_chunk per chunk. Random values of many schemas (every type, nesting, recursion,
unions, logical types, odd map keys, unicode, control characters, float edge cases), mutated and garbage
payloads (the C code must hand them to the Python fallback or agree with it, never crash). No sockets: the
registry is an httpx MockTransport."""

from __future__ import annotations

import json
import math
import os
import random
import struct
from typing import Any
from urllib.parse import unquote

import httpx
import orjson
import pytest

from api.v2 import render as render_mod
from api.v2.render import (
    NDJSON_SEP,
    SSE_SEP,
    _head,
    chunk_schema_ids,
    render_avro,
    render_decoded,
    render_decoded_chunk,
    render_schema_chunks,
)
from service.consumer.subscription import TopicPartition
from service.protocol.records import Record
from service.schemas import avro_fast, avro_limits
from service.schemas.avro import AvroCodec, _Node
from service.schemas.formats import SchemaResolver
from service.schemas.registry import RegistryClient, RegistryConfig
from service.schemas.wire import frame

REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"
RENDERINGS = ("confluent", "karapace")


@pytest.fixture(autouse=True)
def _need_c() -> None:
    if avro_fast._cavro is None:
        if REQUIRE_CEXT:
            pytest.fail(f"service.schemas._cavro not importable (KCG_REQUIRE_CEXT=1): {avro_fast.C_IMPORT_ERROR}")
        pytest.skip(f"service.schemas._cavro not built: {avro_fast.C_IMPORT_ERROR}")


# ---------------------------------------------------------------------------------------------- schemas
def rec(name: str, *fields: tuple[str, Any], ns: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}
    if ns:
        out["namespace"] = ns
    return out


ENUM = {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS", "_x9", "DIAMONDS"]}
FIXED = {"type": "fixed", "name": "MD5", "size": 4}
DECIMAL_BYTES = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
DECIMAL_FIXED = {"type": "fixed", "name": "Dec", "size": 6, "logicalType": "decimal", "precision": 12, "scale": 3}

SCHEMAS: list[Any] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ENUM, FIXED,
    {"type": "array", "items": "string"},
    {"type": "map", "values": "long"},
    {"type": "map", "values": {"type": "array", "items": ["null", "bytes", "double"]}},
    ["null", "string"], ["string", "null"], ["int", "long", "float", "double"],
    ["null", "int", "long", "float", "double", "boolean", "string", "bytes",
     {"type": "array", "items": "int"}, {"type": "map", "values": "string"}, ENUM, FIXED,
     rec("InUnion", ("x", "int"), ns="com.acme")],
    ["bytes"], [FIXED, "string"],
    rec("Everything",
        ("n", "null"), ("b", "boolean"), ("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"),
        ("by", "bytes"), ("s", "string"), ("e", ENUM), ("fx", FIXED), ("a", {"type": "array", "items": "Suit"}),
        ("m", {"type": "map", "values": "MD5"}), ("u", ["null", "Suit", "MD5", "string"]),
        ("date", {"type": "int", "logicalType": "date"}),
        ("tm", {"type": "int", "logicalType": "time-millis"}),
        ("tu", {"type": "long", "logicalType": "time-micros"}),
        ("ts", {"type": "long", "logicalType": "timestamp-millis"}),
        ("tsu", {"type": "long", "logicalType": "timestamp-micros"}),
        ("lts", {"type": "long", "logicalType": "local-timestamp-millis"}),
        ("uuid", {"type": "string", "logicalType": "uuid"}),
        ("dec", DECIMAL_BYTES), ("decf", DECIMAL_FIXED),
        ("dur", {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}),
        ("opt_ts", ["null", {"type": "long", "logicalType": "timestamp-millis"}]),
        ns="com.acme.all"),
    # recursion: a linked list and a tree, through unions
    rec("LinkedList", ("value", "int"), ("next", ["null", "LinkedList"])),
    rec("Tree", ("label", "string"), ("kids", {"type": "array", "items": "Tree"}),
        ("attrs", {"type": "map", "values": ["null", "Tree", "bytes"]})),
    # nested namespaces and names that need escaping
    rec("Outer", ("inner", rec("Inner", ("x", "string"), ns="other.ns")),
        ("more", ["null", "other.ns.Inner", rec("Inner2", ("y", ["null", "bytes"]))]),
        ("we\"ird\\name", "int"), ("ünï", "string"), ns="top"),
    {"type": "array", "items": {"type": "map", "values": {"type": "array", "items": ["null", "float"]}}},
    rec("Empty"),
    rec("Holder", ("empty", rec("Nothing")), ("list", {"type": "array", "items": "Nothing"})),
    # karapace-safe union of a record and a map (no bytes inside)
    ["null", rec("KV", ("k", "string")), {"type": "map", "values": "string"}],
    {"type": "record", "name": "Err", "fields": [{"name": "x", "type": {"type": "error", "name": "E2",
                                                                            "fields": [{"name": "m",
                                                                                        "type": "string"}]}}]},
]

STRINGS = ["", "a", "plain ascii", "\"quoted\" \\ back\\slash /", "\x00\x01\x07\x08\t\n\x0b\x0c\r\x0e\x1f\x7f",
           "é", "日本語", "\u2028\u2029", "\U0001F600 emoji", "\ufeffbom", "mixed \x00 é 日 \U0001F600 \"",
           "\ud7ff\ue000\uffff", "\U0010ffff"]
KEYS = ["", "k", "with space", "quo\"te", "back\\slash", "nl\n", "\x00", "ünï", "日本", "\U0001F600", "1", "null"]
DOUBLES = [0.0, -0.0, 1.0, -1.0, 0.1, 1e300, -1e300, 1e-300, 5e-324, 1.7976931348623157e308, 1e16, 1e15,
           9999999999999998.0, 1e-5, 1.2345e-5, 1e-6, 1e-7, 123456.789, 2.0**53, 1e21, 1e22,
           float("nan"), float("inf"), float("-inf")]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


FLOATS = [_f32(x) for x in (0.0, -0.0, 1.0, 0.1, 3.4028234663852886e38, 1e-45, 1.17549435e-38, 16777216.0,
                            1e-5, 1e-7, 1e16)] + [float("nan"), float("inf"), float("-inf")]


def _random_double(rng: random.Random) -> float:
    k = rng.random()
    if k < 0.3:
        return rng.choice(DOUBLES)
    if k < 0.5:
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    if k < 0.8:  # short decimals (the C fast path), also at its bounds
        return rng.randint(-(10**rng.randint(1, 16)), 10**rng.randint(1, 16)) / 10 ** rng.randint(0, 9)
    return rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30)


def _random_float(rng: random.Random) -> float:
    if rng.random() < 0.4:
        return rng.choice(FLOATS)
    if rng.random() < 0.5:
        return _f32(rng.randint(-10**6, 10**6) / 10 ** rng.randint(0, 6))
    return struct.unpack("<f", rng.getrandbits(32).to_bytes(4, "little"))[0]


def _random_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(STRINGS)
    return "".join(rng.choice(STRINGS[1:]) for _ in range(rng.randint(1, 4)))


def _random_bytes(rng: random.Random, n: int | None = None) -> str:
    n = rng.randint(0, 12) if n is None else n
    return bytes(rng.getrandbits(8) for _ in range(n)).decode("latin-1")


def _tag(node: _Node) -> str:
    return node.fullname if node.kind in ("record", "enum", "fixed") else node.kind


def random_value(node: _Node, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value for AvroCodec.encode (tagged unions, bytes as ISO-8859-1 strings)."""
    kind = node.kind
    deep = depth > 5
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)])
    if kind == "long":
        return rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000)])
    if kind == "float":
        return _random_float(rng)
    if kind == "double":
        return _random_double(rng)
    if kind == "string":
        return _random_text(rng)
    if kind == "bytes":
        return _random_bytes(rng)
    if kind == "fixed":
        return _random_bytes(rng, node.size)
    if kind == "enum":
        return rng.choice(node.symbols)
    if kind == "array":
        return [random_value(node.items[0], rng, depth + 1) for _ in range(0 if deep else rng.randint(0, 4))]
    if kind == "map":
        return {rng.choice(KEYS): random_value(node.items[0], rng, depth + 1)
                for _ in range(0 if deep else rng.randint(0, 4))}
    if kind == "record":
        return {name: random_value(ftype, rng, depth + 1) for name, ftype, _, _ in node.fields}
    # union: deep down, prefer null (ends recursion)
    branches = node.items
    nulls = [b for b in branches if b.kind == "null"]
    branch = nulls[0] if deep and nulls else rng.choice(branches)
    if branch.kind == "null":
        return None
    return {_tag(branch): random_value(branch, rng, depth + 1)}


def reference(codec: AvroCodec, payload: bytes) -> bytes | None:
    """The Python path's JSON of a payload, or None when it does not decode."""
    try:
        value = codec.decode(payload)
    except Exception:
        return None
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return None


def check(codec: AvroCodec, program: Any, payload: bytes) -> str:
    """The C result agrees with the reference: equal when C renders; a bail is always allowed; a refusal
    (over the decode limits, or a block count the payload cannot hold) is an error on the Python path too."""
    got = avro_fast.render_value(program, payload)
    if got is None:
        return "bail"
    if isinstance(got, int):
        assert reference(codec, payload) is None, (payload, got)
        return "refused"
    want = reference(codec, payload)
    assert got == want, (payload, got, want)
    return "ok"


@pytest.mark.parametrize("rendering", RENDERINGS)
@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_random_values_render_as_the_python_path(schema: Any, rendering: str) -> None:
    codec = AvroCodec(schema, rendering=rendering)
    writer = AvroCodec(schema)
    program = avro_fast.compile_program(codec)
    assert program is not None
    rng = random.Random(hash((json.dumps(schema), rendering)) & 0xFFFF)
    outcomes = []
    for _ in range(150):
        payload = writer.encode(random_value(writer._root, rng))
        outcomes.append(check(codec, program, payload))
    # valid payloads only bail for a repeated map key (Python keeps one)
    assert outcomes.count("ok") >= len(outcomes) * 0.8


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_floats_and_doubles_as_orjson_writes_them(rendering: str) -> None:
    rng = random.Random(7)
    for schema, values in (("double", DOUBLES + [_random_double(rng) for _ in range(30000)]),
                           ("float", FLOATS + [_random_float(rng) for _ in range(30000)])):
        codec = AvroCodec(schema, rendering=rendering)
        program = avro_fast.compile_program(codec)
        for v in values:
            payload = AvroCodec(schema).encode(v)
            got = avro_fast.render_value(program, payload)
            assert got == reference(codec, payload), v
            if math.isnan(v) or math.isinf(v):
                assert got == b"null"
    assert avro_fast.render_value(avro_fast.compile_program(AvroCodec("double")), struct.pack("<d", -0.0)) == b"-0.0"


def test_strings_escape_as_orjson_and_invalid_utf8_bails() -> None:
    codec = AvroCodec("string")
    program = avro_fast.compile_program(codec)
    for cp in [*range(0x800), 0xFFFF, 0x10000, 0x10FFFF, 0x2028, 0xFEFF]:
        payload = codec.encode(chr(cp) + "x")
        assert avro_fast.render_value(program, payload) == reference(codec, payload), hex(cp)
    bad = [b"\xff", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf0\x80\x80\x80",
           b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\x80", b"a\xc3", b"\xe2\x82", b"\xf0\x9f\x98"]
    for raw in bad:
        payload = bytes([len(raw) * 2]) + raw
        assert reference(codec, payload) is None
        assert avro_fast.render_value(program, payload) is None, raw


def test_malformed_payloads_bail_never_crash() -> None:
    rng = random.Random(11)
    cases = 0
    for schema in SCHEMAS:
        for rendering in RENDERINGS:
            codec = AvroCodec(schema, rendering=rendering)
            writer = AvroCodec(schema)
            program = avro_fast.compile_program(codec)
            for _ in range(60):
                payload = bytearray(writer.encode(random_value(writer._root, rng)))
                k = rng.random()
                if k < 0.3 and payload:
                    del payload[rng.randrange(len(payload)):]  # truncated
                elif k < 0.6 and payload:
                    for _ in range(rng.randint(1, 3)):
                        payload[rng.randrange(len(payload))] = rng.getrandbits(8)
                elif k < 0.8:
                    payload = bytearray(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))  # garbage
                else:
                    payload += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 5)))  # trailing bytes
                check(codec, program, bytes(payload))
                cases += 1
    # hand-made: huge lengths and counts, negative lengths, overlong varints, bad indexes
    long_varint = b"\xff" * 10 + b"\x01"
    specials = {
        "string": [b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x01", b"\x02", long_varint, b"\x80\x80"],
        "bytes": [b"\x01abc", b"\xfe\xff\xff\xff\x0f", b""],
        "long": [long_varint, b"\xff" * 9 + b"\x7f", b"\xff" * 9 + b"\x01", b""],
        "boolean": [b"\x02", b"\xff", b""],
        "double": [b"\x00" * 7], "float": [b"\x00" * 3],
        json.dumps({"type": "array", "items": "null"}): [b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                                                        b"\x01\x00", b"\x06\x00"],
        json.dumps({"type": "array", "items": "int"}): [b"\x03\x04\x02\x04\x00", b"\x01\x01\x02\x00",
                                                       b"\x02\x02", b"\x80"],
        json.dumps({"type": "map", "values": "int"}): [b"\x04\x02a\x02\x02a\x04\x00", b"\x02\x03a\x02\x00",
                                                      b"\xfe\xff\xff\xff\x0f"],
        json.dumps(ENUM): [b"\x08", b"\x01", b"\x06"],
        json.dumps(["null", "string"]): [b"\x04", b"\x01", b"\x02\x02a"],
        json.dumps(FIXED): [b"abc", b"abcd"],
    }
    for schema_text, payloads in specials.items():
        codec = AvroCodec(schema_text)
        program = avro_fast.compile_program(codec)
        for payload in payloads:
            check(codec, program, payload)
            cases += 1
    assert cases > 3000


def test_repeated_map_keys_bail_to_python() -> None:
    codec = AvroCodec({"type": "map", "values": "int"})
    program = avro_fast.compile_program(codec)
    payload = b"\x04\x02a\x02\x02a\x04\x00"  # {"a": 1, "a": 2}
    assert reference(codec, payload) == b'{"a":2}'
    assert avro_fast.render_value(program, payload) is None
    many = b"\x82\x01" + b"".join(b"\x04k" + bytes([i]) + b"\x00" for i in range(65)) + b"\x04k\x00\x00\x00"
    assert avro_fast.render_value(program, many) is None  # 66 keys, one repeated: the sorted check


def test_deep_nesting_bails() -> None:
    schema = rec("L", ("next", ["null", "L"]))
    codec = AvroCodec(schema)
    program = avro_fast.compile_program(codec)
    shallow = b"\x02" * 20 + b"\x00"
    assert avro_fast.render_value(program, shallow) == reference(codec, shallow)
    assert avro_fast.render_value(program, b"\x02" * 400 + b"\x00") == avro_limits.R_DEPTH  # refused, no bail


def test_unsupported_shapes_have_no_program() -> None:
    bytes_rec = rec("A", ("a", "bytes"))
    union = ["null", bytes_rec, {"type": "map", "values": "bytes"}]
    assert avro_fast.compile_program(AvroCodec(union, rendering="karapace")) is None
    assert avro_fast.compile_program(AvroCodec(union, rendering="confluent")) is not None
    assert avro_fast.compile_program(AvroCodec(rec("D", ("x", "int"), ("x", "long")))) is None


# ---------------------------------------------------------------------------------------------- chunks
USER = rec("User", ("name", "string"), ("n", ["null", "int"]), ("tags", {"type": "map", "values": "bytes"}),
           ns="com.acme")
KEY = {"type": "string"}


class FakeRegistry:
    def __init__(self) -> None:
        self.by_id: dict[int, dict[str, Any]] = {}

    def add(self, sid: int, schema: Any, schema_type: str = "AVRO") -> None:
        doc: dict[str, Any] = {"schema": schema if isinstance(schema, str) else json.dumps(schema)}
        if schema_type != "AVRO":
            doc["schemaType"] = schema_type
        self.by_id[sid] = doc

    def handler(self, request: httpx.Request) -> httpx.Response:
        parts = [unquote(x) for x in request.url.raw_path.decode().split("?")[0].strip("/").split("/")]
        doc = self.by_id.get(int(parts[2])) if parts[:2] == ["schemas", "ids"] else None
        if doc is None:
            return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"})
        return httpx.Response(200, json=doc)

    def resolver(self, **kwargs: Any) -> SchemaResolver:
        client = RegistryClient(RegistryConfig("http://registry.test"), transport=httpx.MockTransport(self.handler))
        return SchemaResolver(client, **kwargs)


def _records(rng: random.Random, n: int) -> list[Record]:
    user, key = AvroCodec(USER), AvroCodec(KEY)
    out = []
    for i in range(n):
        k = rng.random()
        if k < 0.5:
            value: bytes | None = frame(1, user.encode(random_value(user._root, rng)))
        elif k < 0.6:
            value = None
        elif k < 0.7:
            value = b"not framed"
        elif k < 0.75:
            value = frame(99, b"\x02")  # unknown id
        elif k < 0.8:
            value = frame(3, b'{"a":1}')  # a JSON schema id
        elif k < 0.85:
            value = frame(1, b"\x06ab")  # truncated
        elif k < 0.9:
            value = frame(4, b"\x00")  # an id whose schema does not compile
        else:
            value = frame(1, b"\x02a\x00\x04\x02k\x00\x02k\x00\x00")  # a repeated map key
        kk = rng.random()
        keyb = None if kk < 0.3 else frame(2, key.encode(_random_text(rng))) if kk < 0.8 else b"\x00\x00"
        headers = () if rng.random() < 0.5 else (("h\u00e9\"", b"\x00\xff"), ("empty", None), ("", b""))
        out.append(Record(1000 + i, 1_700_000_000_000 + i, keyb, value, headers))
    return out


@pytest.mark.parametrize("rendering", [None, *RENDERINGS])
async def test_chunks_render_as_render_decoded(rendering: str | None) -> None:
    reg = FakeRegistry()
    reg.add(1, USER)
    reg.add(2, KEY)
    reg.add(3, {"type": "object"}, "JSON")
    reg.add(4, "{not a schema")
    resolver = reg.resolver()
    rng = random.Random(3)
    chunks = [(TopicPartition("t\u00e9\"", 0), _records(rng, 300)), (TopicPartition("t2", 7), []),
              (TopicPartition("t2", 3), _records(rng, 50))]
    ids = chunk_schema_ids(chunks)
    assert ids == {1, 2, 3, 4, 99}
    await resolver.prepare(ids)
    # the reference: resolver.decode + render_decoded (what api/v2/schema_records.py does)
    for sep in (b",", NDJSON_SEP, SSE_SEP):
        render_mod.use_c_avro(False)
        try:
            want = render_schema_chunks(resolver, "avro", rendering, chunks, sep)
        finally:
            render_mod.use_c_avro(True)
        got = render_schema_chunks(resolver, "avro", rendering, chunks, sep)
        assert got == want
        assert got.count == 350 and got.parts and got.array()
    # the same through render_decoded_chunk directly, for one chunk
    recs = chunks[0][1]
    keys = resolver.decode("avro", [r.key for r in recs], rendering=rendering)
    values = resolver.decode("avro", [r.value for r in recs], rendering=rendering)
    want_chunk = render_decoded_chunk(recs, keys, values, _head(chunks[0][0]), b",")
    programs = {1: resolver.avro_program(1, rendering), 2: resolver.avro_program(2, rendering)}
    assert all(programs.values())
    fallback_calls: list[bytes] = []

    def fallback(field: bytes, raw: bytes) -> bytes:
        fallback_calls.append(raw)
        (v,) = resolver.decode("avro", [raw], rendering=rendering)
        return render_mod._decoded_field(v, raw, field)

    got_chunk = render_avro([chunks[0]], b",", programs, fallback)
    assert got_chunk.parts == [want_chunk[0]] and got_chunk.payload == want_chunk[1]
    # only what C cannot do goes to Python: a User payload only when it does not decode or repeats a map key
    user = AvroCodec(USER)
    assert fallback_calls
    for raw in fallback_calls:
        if raw[:5] == frame(1, b""):
            assert reference(user, raw[5:]) is None or raw.endswith(b"\x02k\x00\x02k\x00\x00"), raw


async def test_a_schema_without_program_uses_the_python_path() -> None:
    bytes_rec = rec("A", ("a", "bytes"))
    union = ["null", bytes_rec, {"type": "map", "values": "bytes"}]
    reg = FakeRegistry()
    reg.add(5, union)
    resolver = reg.resolver()
    codec = AvroCodec(union)
    recs = [Record(0, 0, None, frame(5, codec.encode({"A": {"a": "\x01"}})), ()),
            Record(1, 0, None, frame(5, codec.encode({"map": {"a": "x", "b": "y"}})), ())]
    chunks = [(TopicPartition("t", 0), recs)]
    await resolver.prepare(chunk_schema_ids(chunks))
    assert resolver.avro_program(5, "karapace") is None and resolver.avro_program(5, "confluent") is not None
    got = render_schema_chunks(resolver, "avro", "karapace", chunks)
    keys = resolver.decode("avro", [None, None], rendering="karapace")
    values = resolver.decode("avro", [r.value for r in recs], rendering="karapace")
    assert got == render_decoded(chunks, [(keys, values)])


def test_schema_ids_in_c_and_python_agree() -> None:
    rng = random.Random(5)
    chunks = [(TopicPartition("t", 0), _records(rng, 200))]
    c_ids = chunk_schema_ids(chunks)
    py = SchemaResolver.schema_ids([r.key for r in chunks[0][1]]) | SchemaResolver.schema_ids(
        [r.value for r in chunks[0][1]])
    assert c_ids == py and 1 in c_ids
