"""service/schemas/_cavro.c against the Python Avro path, on hypothesis-generated schemas (records, unions,
recursion, enums, fixed, logical types, arrays and maps nested), values, mutated and garbage payloads.

render_value: equal to ``orjson.dumps(AvroCodec(schema, rendering).decode(payload))`` whenever it renders (a
bail, None, hands the payload to the Python path; a refusal code of service/schemas/avro_limits.py only where
the Python path refuses too); scan and scan_many: the refusal codes of avro_limits.scan_py; render_chunk: byte for byte
what render_decoded_chunk writes for the same records decoded in Python; compile: any node list is refused or compiles
into a program that renders or bails, never crashes; schema_ids: SchemaResolver.schema_ids."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from api.v2 import render as Rd
from service.consumer.subscription import TopicPartition
from service.protocol.records import Record
from service.schemas import avro_fast, avro_limits
from service.schemas.avro import AvroCodec, _Node
from service.schemas.avro_limits import R_BYTES, R_DEPTH, R_ITEMS, R_MALFORMED, R_NONE, DecodeLimits, scan_py
from service.schemas.codecs import DecodeError
from service.schemas.formats import SchemaResolver
from service.schemas.wire import frame
from tests.fuzz import strategies as S
from tests.fuzz.twins import covers, fuzz

C: Any = avro_fast._cavro
RENDERINGS = ("confluent", "karapace")
REFUSALS = (R_DEPTH, R_ITEMS, R_BYTES, R_MALFORMED)
PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
LOGICAL = [{"type": "int", "logicalType": "date"}, {"type": "long", "logicalType": "timestamp-millis"},
           {"type": "long", "logicalType": "timestamp-micros"}, {"type": "int", "logicalType": "time-millis"},
           {"type": "string", "logicalType": "uuid"},
           {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}]
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


def _schema(data: st.DataObject, depth: int, counter: Any, enclosing: list[str]) -> Any:
    """One random schema; named types get fresh names; records may refer to an enclosing record (recursion)."""
    kinds = ["primitive", "primitive", "logical", "enum", "fixed"]
    if depth < 4:
        kinds += ["array", "map", "record", "record", "union", "union"]
    if enclosing:
        kinds.append("recursive")
    kind = data.draw(st.sampled_from(kinds))
    if kind == "primitive":
        return data.draw(st.sampled_from(PRIMITIVES))
    if kind == "logical":
        return data.draw(st.sampled_from(LOGICAL))
    if kind == "recursive":  # through a union with null, so that a value can end
        return ["null", data.draw(st.sampled_from(enclosing))]
    if kind == "enum":
        symbols = data.draw(st.lists(names, min_size=1, max_size=4, unique=True))
        return {"type": "enum", "name": f"E{next(counter)}", "symbols": symbols}
    if kind == "fixed":
        return {"type": "fixed", "name": f"F{next(counter)}", "size": data.draw(st.integers(0, 9))}
    if kind == "array":
        return {"type": "array", "items": _schema(data, depth + 1, counter, enclosing)}
    if kind == "map":
        return {"type": "map", "values": _schema(data, depth + 1, counter, enclosing)}
    if kind == "record":
        name = f"R{next(counter)}"
        fields = data.draw(st.lists(names, max_size=5, unique=True))
        inner = [*enclosing, name]
        return {"type": "record", "name": name,
                "fields": [{"name": f, "type": _schema(data, depth + 1, counter, inner)} for f in fields]}
    # a union: distinct primitives, at most one array and one map, any named types
    branches: list[Any] = data.draw(st.lists(st.sampled_from(PRIMITIVES), min_size=1, max_size=3, unique=True))
    if branches == ["null"]:
        branches.append("string")  # ["null"] alone: AvroCodec refuses it in the confluent rendering
    for extra in data.draw(st.lists(st.sampled_from(["array", "map", "record", "enum", "fixed"]), max_size=2,
                                    unique=True)):
        if extra in ("array", "map"):
            branches.append({"type": extra, ("items" if extra == "array" else "values"):
                             _schema(data, depth + 1, counter, enclosing)})
        elif extra == "record":
            name = f"R{next(counter)}"
            branches.append({"type": "record", "name": name, "fields": [
                {"name": "x", "type": _schema(data, depth + 1, counter, [*enclosing, name])}]})
        else:
            branches.append(_schema_named(extra, counter))
    return data.draw(st.permutations(branches))


def _schema_named(kind: str, counter: Any) -> Any:
    if kind == "enum":
        return {"type": "enum", "name": f"E{next(counter)}", "symbols": ["A", "B"]}
    return {"type": "fixed", "name": f"F{next(counter)}", "size": 3}


@st.composite
def schemas(draw: Any) -> Any:
    data = draw(st.data())
    return _schema(data, 0, itertools.count(), [])


def _tag(node: _Node) -> str:
    return node.fullname if node.kind in ("record", "enum", "fixed") else node.kind


def _value(data: st.DataObject, node: _Node, depth: int = 0) -> Any:
    """A value for AvroCodec.encode (tagged unions, bytes as ISO-8859-1 text)."""
    kind = node.kind
    deep = depth > 6
    if kind == "null":
        return None
    if kind == "boolean":
        return data.draw(st.booleans())
    if kind == "int":
        return data.draw(st.integers(-(2**31), 2**31 - 1))
    if kind == "long":
        return data.draw(st.integers(-(2**63), 2**63 - 1))
    if kind == "float":
        return data.draw(st.floats(width=32))
    if kind == "double":
        return data.draw(st.floats())
    if kind == "string":
        return data.draw(st.text(max_size=10))
    if kind == "bytes":
        return data.draw(st.binary(max_size=10)).decode("latin-1")
    if kind == "fixed":
        return data.draw(st.binary(min_size=node.size, max_size=node.size)).decode("latin-1")
    if kind == "enum":
        return data.draw(st.sampled_from(node.symbols))
    if kind == "array":
        n = 0 if deep else data.draw(st.integers(0, 3))
        return [_value(data, node.items[0], depth + 1) for _ in range(n)]
    if kind == "map":
        keys = [] if deep else data.draw(st.lists(st.text(max_size=4), max_size=3, unique=True))
        return {k: _value(data, node.items[0], depth + 1) for k in keys}
    if kind == "record":
        return {name: _value(data, ftype, depth + 1) for name, ftype, _, _ in node.fields}
    nulls = [b for b in node.items if b.kind == "null"]
    branch = nulls[0] if deep and nulls else data.draw(st.sampled_from(node.items))
    if branch.kind == "null":
        return None
    return {_tag(branch): _value(data, branch, depth + 1)}


def _reference(codec: AvroCodec, payload: bytes) -> bytes | None:
    """What the Python path renders, or None where it refuses: a decode error (its scan of the limits first,
    then fastavro), or a rendering longer than the byte limit of a payload that long."""
    try:
        text = orjson.dumps(codec.decode(payload), option=orjson.OPT_NON_STR_KEYS)
    except Exception:
        return None
    return None if len(text) > avro_limits.LIMITS.max_out(len(payload)) else text


def _same_verdict(got: bytes | int | None, codec: AvroCodec, payload: bytes) -> None:
    """render_value's answer against the Python path: a bail (None) leaves the payload to it; a refusal code
    only where the Python path refuses too; bytes only where it renders the same bytes."""
    if got is None:
        return
    want = _reference(codec, payload)
    if isinstance(got, int):
        assert got in REFUSALS and want is None, (payload, got, want)
    else:
        assert got == want, (payload, got, want)


@covers("_cavro.render_value", "_cavro.compile")
@fuzz(scale=0.5)
@given(schemas(), st.data(), S.mutations)
def test_render_value_is_the_python_decoder(schema: Any, data: st.DataObject, muts: list[Any]) -> None:
    writer = AvroCodec(schema)
    payload = writer.encode(_value(data, writer._root))
    mutated = S.mutate(payload, muts)
    for rendering in RENDERINGS:
        codec = AvroCodec(schema, rendering=rendering)
        program = avro_fast.compile_program(codec)
        if program is None:  # a shape the C renderer leaves to Python (karapace look-alike unions)
            continue
        for p in (payload, mutated):
            _same_verdict(C.render_value(program, p), codec, p)


@covers("_cavro.render_value")
@fuzz(scale=0.5)
@given(schemas(), st.binary(max_size=40))
def test_render_value_on_garbage_payloads(schema: Any, payload: bytes) -> None:
    for rendering in RENDERINGS:
        codec = AvroCodec(schema, rendering=rendering)
        program = avro_fast.compile_program(codec)
        if program is not None:
            _same_verdict(C.render_value(program, payload), codec, payload)


_LIMITS = st.builds(DecodeLimits, max_depth=st.integers(0, 12), items_per_byte=st.integers(0, 4),
                    items_base=st.integers(0, 64), expansion=st.integers(0, 8), floor=st.integers(0, 300),
                    cap=st.integers(0, 2000)) | st.just(DecodeLimits())


@covers("_cavro.scan", "_cavro.scan_many")
@fuzz(scale=0.5)
@given(schemas(), st.data(), st.lists(S.mutations, min_size=1, max_size=4), st.binary(max_size=40), _LIMITS)
def test_scan_is_the_python_scan(schema: Any, data: st.DataObject, muts: list[Any], garbage: bytes,
                                 lim: DecodeLimits) -> None:
    """The limits' scan in C and scan_py, on valid, mutated and garbage payloads, under random limits: the
    same refusal code; scan_many of a list is scan of each (index -> code of the refused ones)."""
    codec = AvroCodec(schema)
    if codec._scan_program is None:  # a node list the C module refuses: the Python twin alone scans
        return
    payload = codec.encode(_value(data, codec._root))
    payloads = [payload, garbage, b"", *(S.mutate(payload, m) for m in muts)]
    want = {i: code for i, p in enumerate(payloads) if (code := scan_py(codec._scan_nodes, p, lim))}
    for i, p in enumerate(payloads):
        assert C.scan(codec._scan_program, p, lim.as_tuple()) == want.get(i, R_NONE), (json.dumps(schema), p)
    assert C.scan_many(codec._scan_program, payloads, lim.as_tuple()) == want
    assert C.scan_many(codec._scan_program, [memoryview(p) for p in payloads], lim.as_tuple()) == want
    default = {i: code for i, p in enumerate(payloads) if (code := scan_py(codec._scan_nodes, p))}
    assert C.scan_many(codec._scan_program, payloads) == default


nodes = st.lists(st.tuples(st.integers(-2, 16), st.integers(-2, 12), st.integers(-3, 8),
                           st.lists(st.integers(-2, 8), max_size=4).map(tuple),
                           st.lists(st.sampled_from([b"", b",", b'"a":', b'{"x":', b"\x00", b"\xff"]),
                                    max_size=4).map(tuple)), min_size=1, max_size=6)


@covers("_cavro.compile", "_cavro.render_value")
@fuzz()
@given(nodes, st.lists(st.binary(max_size=24), min_size=1, max_size=4))
def test_compile_refuses_or_renders_any_node_list(node_list: list[Any], payloads: list[bytes]) -> None:
    try:
        program = C.compile(node_list)
    except (TypeError, ValueError):
        return
    for p in payloads:
        got = C.render_value(program, p)
        # bytes (rendered), None (the Python path decides) or an int: the refusal code (1 depth .. 4 not Avro)
        assert got is None or type(got) is bytes or (type(got) is int and 1 <= got <= 4), got


# -- render_chunk and schema_ids -----------------------------------------------------------------------------
def _python_field(codec: AvroCodec, sid: int, raw: bytes | None) -> Any:
    """What SchemaResolver.decode gives for a key or value: its JSON value, None, or a DecodeError."""
    if raw is None:
        return None
    if len(raw) < 5 or raw[0] != 0:
        return DecodeError("avro", None, "not framed")
    if int.from_bytes(raw[1:5], "big") != sid:
        return DecodeError("avro", None, "unknown schema id")
    try:
        return codec.decode(raw[5:])
    except Exception as exc:
        return DecodeError("avro", sid, str(exc))


@covers("_cavro.render_chunk", "_cavro.schema_ids")
@fuzz(scale=0.5)
@given(schemas(), st.sampled_from(RENDERINGS), st.data(), st.sampled_from([b",", b"\n", b"\n\ndata: "]))
def test_render_chunk_is_render_decoded_chunk(schema: Any, rendering: str, data: st.DataObject, sep: bytes) -> None:
    writer = AvroCodec(schema)
    codec = AvroCodec(schema, rendering=rendering)
    program = avro_fast.compile_program(codec)
    sid = data.draw(st.integers(0, 2**32 - 1))

    def field() -> bytes | None:
        kind = data.draw(st.sampled_from(["good", "good", "mutated", "none", "garbage", "other id"]))
        if kind == "none":
            return None
        if kind == "garbage":
            return data.draw(st.binary(max_size=12))
        body = writer.encode(_value(data, writer._root))
        if kind == "mutated":
            body = S.mutate(body, data.draw(S.mutations))
        return frame(sid if kind != "other id" else (sid + 1) % 2**32, body)

    recs = [Record(data.draw(st.integers(0, 2**63 - 1)), data.draw(st.integers(-(2**63), 2**63 - 1)), field(),
                   field(), data.draw(S.headers)) for _ in range(data.draw(st.integers(0, 6)))]
    assert C.schema_ids(recs) == SchemaResolver.schema_ids([r.key for r in recs]) | SchemaResolver.schema_ids(
        [r.value for r in recs])
    if program is None:
        return
    head = Rd._head(TopicPartition("t", 2))

    def fallback(name: bytes, raw: bytes) -> bytes:
        return Rd._decoded_field(_python_field(codec, sid, raw), raw, name)

    got = C.render_chunk(recs, head, sep, {sid: program}, fallback)
    want = Rd.render_decoded_chunk(recs, [_python_field(codec, sid, r.key) for r in recs],
                                   [_python_field(codec, sid, r.value) for r in recs], head, sep)
    assert got == want
