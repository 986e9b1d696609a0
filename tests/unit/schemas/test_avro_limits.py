"""The limits on one decoded Avro value (service/schemas/avro_limits.py) on every Avro path: the C renderer's
refusals, the scan in C and its Python twin (hypothesis: same verdicts), the Python reference path (AvroCodec
never hands a refused payload to fastavro), the poll rendering with and without C (same bytes: the
per-record error shape), typed Arrow pages and the Spark sink's cast of them, and the argument checks of the
C entry points."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.v2 import render
from api.v2.render import render_schema_chunks, use_c_avro
from service.consumer.subscription import TopicPartition
from service.protocol.records import Record
from service.schemas import avro_fast, avro_limits
from service.schemas.arrow import decode_column
from service.schemas.avro import AvroCodec, AvroDecodeError, AvroEncodeError
from service.schemas.avro_limits import R_BYTES, R_DEPTH, R_ITEMS, R_MALFORMED, R_NONE, DecodeLimits, scan_py
from service.schemas.formats import ResolvedSchema
from service.schemas.registry import Schema
from service.schemas.wire import frame

_cavro = avro_fast._cavro
pytestmark = pytest.mark.skipif(_cavro is None, reason="the C extension is built in every test environment")

RECURSIVE = {"type": "record", "name": "N", "fields": [{"name": "n", "type": ["null", "N"]}]}
NULLS = {"type": "array", "items": "null"}
EMPTIES = {"type": "array", "items": {"type": "record", "name": "E", "fields": []}}
WIDE_NAMES = {"type": "array", "items": {"type": "record", "name": "W",
                                         "fields": [{"name": "x" * 1000, "type": "null"}]}}
TREE = {"type": "record", "name": "T", "fields": [
    {"name": "label", "type": "string"},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["LEAF", "NODE", "ROOT"]}},
    {"name": "kids", "type": {"type": "array", "items": "T"}},
    {"name": "attrs", "type": {"type": "map", "values": ["null", "long", "double", "T"]}},
    {"name": "raw", "type": ["null", "bytes", {"type": "fixed", "name": "F", "size": 2}]}]}
SCHEMAS = [RECURSIVE, NULLS, EMPTIES, WIDE_NAMES, TREE, {"type": "map", "values": {"type": "array", "items": "int"}},
           ["null", "boolean", "float", "string"]]


def _long(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def deep(levels: int) -> bytes:
    return b"\x02" * (levels - 1) + b"\x00"


@pytest.fixture
def limits() -> Iterator[Any]:
    """Set the process-wide limits for one test (restored after)."""
    saved = avro_limits.LIMITS, avro_limits._TUPLE

    def set_(lim: DecodeLimits) -> None:
        avro_limits.LIMITS, avro_limits._TUPLE = lim, lim.as_tuple()

    yield set_
    avro_limits.LIMITS, avro_limits._TUPLE = saved


# ------------------------------------------------------------------------------------------ the scan, C and Python
def _both(codec: AvroCodec, payload: bytes, lim: DecodeLimits | None = None) -> int:
    lim = lim or DecodeLimits()
    c = _cavro.scan(codec._scan_program, payload, lim.as_tuple())
    py = scan_py(codec._scan_nodes, payload, lim)
    assert c == py, (payload[:40], c, py)
    return c  # type: ignore[no-any-return]


def test_hostile_values_are_refused_by_both_scans_quickly() -> None:
    rec, nulls, empties = AvroCodec(RECURSIVE), AvroCodec(NULLS), AvroCodec(EMPTIES)
    t0 = time.process_time()
    assert _both(rec, deep(20_000)) == R_DEPTH
    assert _both(rec, deep(64)) == R_NONE and _both(rec, deep(65)) == R_DEPTH
    assert _both(nulls, _long(2**62) + b"\x00") == R_ITEMS
    assert _both(nulls, _long(-(2**62)) + _long(1) + b"\x00") == R_ITEMS  # a negative count and its size
    assert _both(empties, _long(2**62) + b"\x00") == R_ITEMS
    assert _both(nulls, _long(65_536) * 300 + b"\x00") == R_ITEMS  # 906 bytes claiming 19.7M nulls
    assert _both(nulls, _long(4096) + b"\x00") == R_NONE  # within items_base + 8 per byte
    assert _both(AvroCodec(WIDE_NAMES), _long(100) + b"\x00") == R_BYTES  # 100 KB of field names from 2 bytes
    assert _both(AvroCodec({"type": "array", "items": "long"}), _long(2**62) + b"\x00") == R_ITEMS
    assert _both(AvroCodec({"type": "array", "items": "long"}), _long(50) + b"\x02") == R_MALFORMED
    assert _both(AvroCodec({"type": "array", "items": "long"}), _long(-(2**63)) + b"\x00") == R_MALFORMED
    assert time.process_time() - t0 < 5  # a loop over 2**62 items would never end


@st.composite
def _payloads(draw: st.DrawFn) -> tuple[int, bytes]:
    i = draw(st.integers(0, len(SCHEMAS) - 1))
    parts = draw(st.lists(st.one_of(
        st.binary(max_size=12),
        st.integers(-(2**63), 2**63 - 1).map(_long),
        st.sampled_from([b"\x02" * 70, b"\x00", b"\x02", _long(2**62), _long(65_537), _long(-3) + _long(9)])),
        max_size=8))
    return i, b"".join(parts)


_LIMITS = st.builds(DecodeLimits, max_depth=st.integers(0, 12), items_per_byte=st.integers(0, 4),
                    items_base=st.integers(0, 64), expansion=st.integers(0, 8), floor=st.integers(0, 300),
                    cap=st.integers(0, 2000))
_CODECS = [AvroCodec(s) for s in SCHEMAS]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads(), _LIMITS)
def test_the_c_scan_and_its_python_twin_agree(case: tuple[int, bytes], lim: DecodeLimits) -> None:
    i, payload = case
    _both(_CODECS[i], payload, lim)
    _both(_CODECS[i], payload)


@st.composite
def _valid(draw: st.DrawFn) -> tuple[int, bytes]:
    """A valid payload of one of the schemas (so that the renderers do not just bail)."""
    which = draw(st.sampled_from(["rec", "nulls", "empties", "wide", "tree"]))
    if which == "rec":
        return 0, deep(draw(st.integers(1, 30)))
    if which in ("nulls", "empties", "wide"):
        n = draw(st.integers(0, 300))
        return {"nulls": 1, "empties": 2, "wide": 3}[which], (_long(n) + b"\x00" if n else b"\x00")

    def tree(d: int) -> dict[str, Any]:
        kids = [tree(d + 1) for _ in range(draw(st.integers(0, 2 if d < 4 else 0)))]
        return {"label": draw(st.text(max_size=6)), "kind": draw(st.sampled_from(["LEAF", "NODE", "ROOT"])),
                "kids": kids, "attrs": {"a": {"long": draw(st.integers(-(2**40), 2**40))}, "b": None},
                "raw": draw(st.sampled_from([None, {"bytes": "\x01\x02"}, {"F": "ab"}]))}
    return 4, _CODECS[4].encode(tree(0))


@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=_valid(), lim=_LIMITS, rendering=st.sampled_from(["confluent", "karapace"]))
def test_the_c_renderer_refuses_what_the_python_path_refuses(case: tuple[int, bytes], lim: DecodeLimits,
                                                             rendering: str, limits: Any) -> None:
    """C renders -> the Python path renders the same bytes within the limits; C refuses -> the Python path
    gives that value an error (its scan, or the byte bound on what it rendered)."""
    i, payload = case
    codec = AvroCodec(SCHEMAS[i], rendering=rendering)
    program = avro_fast.compile_program(codec)
    if program is None:
        return
    got = avro_fast.render_value(program, payload, lim.as_tuple())
    if got is None:
        return  # a bail: the Python path decides
    limits(lim)
    try:
        text: bytes | None = orjson.dumps(codec.decode(payload), option=orjson.OPT_NON_STR_KEYS)
    except (AvroDecodeError, TypeError):
        text = None
    finally:
        limits(DecodeLimits())  # the next example's values are encoded under the defaults
    py_refused = text is None or len(text) > lim.max_out(len(payload))
    if isinstance(got, int):
        assert py_refused, (payload[:40], got, text)
    else:
        assert not py_refused and got == text


# ------------------------------------------------------------------------------------------ the Python path
def test_python_path_never_hands_a_refused_payload_to_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.schemas.avro as avro_mod

    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("fastavro was called")

    for with_c in (True, False):
        rec, nulls = AvroCodec(RECURSIVE), AvroCodec(NULLS)
        if not with_c:
            rec._cscan = nulls._cscan = rec._cscan_many = nulls._cscan_many = None  # the Python twin (no C)
        monkeypatch.setattr(avro_mod, "schemaless_reader", boom)
        out = rec.decode_many([deep(20_000)]) + nulls.decode_many([_long(2**62) + b"\x00"])
        assert [type(v) for v in out] == [AvroDecodeError, AvroDecodeError]
        assert "nested deeper than 64 levels" in str(out[0]) and "items for a" in str(out[1])
        with pytest.raises(AvroDecodeError, match="nested deeper"):
            rec.decode(deep(100))
        monkeypatch.undo()
        assert rec.decode_many([deep(3)]) == [{"n": {"N": {"n": {"N": {"n": None}}}}}]


class _Resolver:
    def __init__(self, schemas: dict[int, Any]) -> None:
        self._resolved = {sid: ResolvedSchema(sid, "AVRO", Schema(json.dumps(s)), {}, AvroCodec(s), json.dumps(s))
                          for sid, s in schemas.items()}
        self.avro_rendering = "confluent"

    def cached(self, sid: int) -> Any:
        return self._resolved.get(sid)

    def avro_program(self, sid: int, rendering: str | None = None) -> Any:
        codec = self._resolved[sid].codec
        if rendering not in (None, "confluent"):
            codec = AvroCodec(json.loads(self._resolved[sid].source), rendering=rendering)
        return avro_fast.compile_program(codec)

    def decode(self, fmt: str, payloads: list[Any], rendering: str | None = None) -> list[Any]:
        from service.schemas.codecs import DecodeError

        out: list[Any] = []
        for p in payloads:
            if p is None:
                out.append(None)
                continue
            sid = int.from_bytes(p[1:5], "big")
            codec = self._resolved[sid].codec
            if rendering not in (None, "confluent"):
                codec = AvroCodec(json.loads(self._resolved[sid].source), rendering=rendering)
            (v,) = codec.decode_many([p[5:]])
            out.append(DecodeError("avro", sid, str(v)) if isinstance(v, AvroDecodeError) else v)
        return out


def test_poll_rendering_c_and_python_give_the_same_per_record_errors(limits: Any) -> None:
    schemas = {1: RECURSIVE, 2: NULLS, 3: WIDE_NAMES, 4: "string"}
    resolver = _Resolver(schemas)
    values = [frame(1, deep(20_000)), frame(1, deep(3)), frame(2, _long(2**62) + b"\x00"),
              frame(2, _long(65_536) * 300 + b"\x00"), frame(3, _long(100) + b"\x00"), frame(2, _long(2) + b"\x00"),
              frame(4, _long(200) + b"\x01" * 200)]
    chunks = [(TopicPartition("t", 0), [Record(i, 0, None, v, ()) for i, v in enumerate(values)])]
    limits(DecodeLimits(expansion=5, floor=300))  # so that 200 control characters (6 bytes each) are too many
    errors: list[int] = []
    try:
        c_out = render_schema_chunks(resolver, "avro", None, chunks, on_errors=errors.append)
        use_c_avro(False)
        py_out = render_schema_chunks(resolver, "avro", None, chunks, on_errors=errors.append)
    finally:
        use_c_avro(True)
    assert c_out.array() == py_out.array()
    assert errors == [5, 5]  # counted as decode errors on both paths (once per rendering)
    recs = orjson.loads(c_out.array())
    assert [r["value"] for r in recs][1] == {"n": {"N": {"n": {"N": {"n": None}}}}}
    assert recs[5]["value"] == [None, None]
    whys = [r.get("value_error") for r in recs]
    assert "nested deeper than 64 levels" in whys[0]
    assert "items for a" in whys[2] and "items for a" in whys[3]
    assert "renders to more than" in whys[4] and "renders to more than" in whys[6]
    for r, v in zip(recs, values, strict=True):
        if r["value"] is None:
            assert set(r) >= {"value_error", "value_base64"}
            assert render._b64(v, newline=False).decode() == r["value_base64"]


# ------------------------------------------------------------------------------------------ typed pages, the sink
def test_typed_pages_make_refused_values_error_rows() -> None:
    resolver = _Resolver({1: RECURSIVE, 2: NULLS})
    payloads = [frame(1, deep(20_000)), frame(1, deep(2))] + [frame(1, deep(i % 5 + 1)) for i in range(10)]
    col = decode_column("avro", payloads, resolver.cached, 1)
    assert "nested deeper than 64 levels" in (col.errors[0] or "")
    assert col.errors[1:] == [None] * 11 and col.array[0].as_py() is None and col.array[1].as_py() is not None
    many = [frame(2, _long(2**62) + b"\x00")] + [frame(2, _long(3) + b"\x00")] * 9
    col = decode_column("avro", many, resolver.cached, 2)
    assert "items for a" in (col.errors[0] or "") and col.errors[1:] == [None] * 9
    assert col.array.to_pylist() == [None] + [[None, None, None]] * 9


def test_the_sink_gets_the_refused_record_as_an_error_row() -> None:
    pytest.importorskip("pyspark")
    from service.fetch.ranges import RangePage
    from service.fetch.typed import to_ipc, typed_table
    from sink.source import _arrow_page, _target_schema, typed_spark_schema

    resolver = _Resolver({1: RECURSIVE})
    recs = [Record(0, 0, None, frame(1, deep(20_000)), ()), Record(1, 0, None, frame(1, deep(2)), ())]
    page = RangePage("t", 0, 0, recs, next_offset=2, end_offset=2, high_watermark=2, last_stable_offset=2,
                     log_start_offset=0)
    table = typed_table(page, resolver, "avro", 1)
    batches, _, _ = _arrow_page(to_ipc(table), _target_schema(typed_spark_schema(table.schema)))
    rows = pa.Table.from_batches(batches).to_pylist()
    assert rows[0]["value"] is None and "nested deeper" in rows[0]["error"]
    assert rows[0]["value_raw"] == recs[0].value and rows[1]["error"] is None


# ------------------------------------------------------------------------------------------ C argument checks
def test_c_entry_points_check_their_arguments() -> None:
    program = avro_fast.compile_program(AvroCodec(NULLS))
    for bad in ((-1, 8, 4096, 64, 0, 100), (64, 8, 4096, 64, 0, 2**41), (64,), "x"):
        with pytest.raises((TypeError, ValueError)):
            _cavro.scan(program, b"\x00", bad)
        with pytest.raises((TypeError, ValueError)):
            _cavro.render_value(program, b"\x00", bad)
        with pytest.raises((TypeError, ValueError)):
            _cavro.render_chunk([], b"", b",", {}, lambda f, r: b"", None, bad)
    with pytest.raises(TypeError):
        _cavro.render_chunk([], b"", b",", {}, lambda f, r: b"", 5)  # refuse must be callable or None
    with pytest.raises(TypeError):
        _cavro.scan(object(), b"")
    for nodes in ([(11, 0, -2, (), ())], [(11, 0, 1, (), ())], [(13, 0, -1, (-1,), (b"",))], [(10, -1, -1, (), ())],
                  [(14, 0, -1, (), ())], [(15, 0, -1, (), ())]):
        with pytest.raises((TypeError, ValueError)):
            _cavro.compile(nodes)
    assert _cavro.scan(program, b"", (0, 0, 0, 0, 0, 0)) == R_DEPTH  # depth 0: even the root array is too deep
    assert _cavro.render_value(program, b"\x00", (2000, 8, 4096, 64, 0, 100)) == b"[]"  # depth clamped, fine


# ------------------------------------------------------------------------------------------ produce (encode)
def test_encoding_holds_recursive_values_to_the_depth_limit() -> None:
    codec = AvroCodec(RECURSIVE)

    def nested(levels: int) -> Any:
        v = None
        for _ in range(levels):
            v = {"n": None if v is None else {"N": v}}
        return v

    assert codec.decode(codec.encode(nested(64))) == nested(64)
    for levels in (200, 5000):  # 5000: a RecursionError before the check (a 500 then), a clean 422 now
        with pytest.raises(AvroEncodeError, match="nested deeper than 64 levels"):
            codec.encode(nested(levels))
    assert not AvroCodec(TREE["fields"][1]["type"])._may_nest and AvroCodec(TREE)._may_nest


def test_scan_many_is_scan_of_each() -> None:
    codec = AvroCodec(RECURSIVE)
    payloads: list[Any] = [deep(3), deep(20_000), b"", memoryview(b"\x00" + deep(70))[1:], bytearray(deep(2))]
    assert _cavro.scan_many(codec._scan_program, payloads) == {1: R_DEPTH, 2: R_MALFORMED, 3: R_DEPTH}
    codec._cscan_many = None  # the Python twin
    assert codec.refusals(payloads) == {1: R_DEPTH, 2: R_MALFORMED, 3: R_DEPTH}
    with pytest.raises(TypeError):
        _cavro.scan_many(codec._scan_program, [1])
    with pytest.raises(TypeError):
        _cavro.scan_many(codec._scan_program, (b"",))


def test_schemas_bounded_by_themselves_skip_the_scan(limits: Any) -> None:
    flat = AvroCodec({"type": "record", "name": "F", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string", {"type": "record", "name": "G",
                                                                                "fields": [{"name": "c",
                                                                                            "type": "boolean"}]}]},
        {"name": "e", "type": {"type": "enum", "name": "En", "symbols": ["X", "LONGER"]}}]})
    assert flat._static == (2, 5, 2 + len(b'"a":,"b":,"e":') + 2 + 2 + len(b'"c":') + 4 + len(b'"LONGER"'))
    assert flat._always_within() and flat.refusals([b"\xff"]) == {}  # not Avro: fastavro names it
    assert _cavro.scan(flat._scan_program, b"\xff") == R_MALFORMED
    limits(DecodeLimits(max_depth=1))
    assert not flat._always_within() and flat.refusals([b"\x02\x04\x00\x00"]) == {0: R_DEPTH}
    assert AvroCodec(NULLS)._static is None and AvroCodec(RECURSIVE)._static is None
