"""A poll's whole JSON array rendered in one C buffer (``_crecords.render_framed`` via
``api.v2.render.render_array``) gives the same bytes as the per-chunk renderer joined by ``Rendered.array``,
and the pure-Python path; the decoder's shared timestamp objects and the pair-table base64 change no value."""

from __future__ import annotations

import base64
import os

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v2 import render as Rd
from service.consumer.subscription import TopicPartition
from service.protocol import records as R
from service.protocol.records import Record

REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"


def _need_c() -> None:
    if not R.C_EXTENSION_AVAILABLE or not hasattr(R._crecords, "render_framed"):
        if REQUIRE_CEXT:
            pytest.fail("C renderer not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C renderer not importable")


_bytes = st.one_of(st.none(), st.binary(max_size=40))
# header keys without control characters: there the C and the Python renderers write the same bytes
_records = st.lists(st.builds(Record, st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1), _bytes, _bytes,
                              st.lists(st.tuples(st.text(st.characters(min_codepoint=32, blacklist_categories=("Cs",)),
                                                         max_size=8),
                                                 _bytes), max_size=3).map(tuple)), max_size=6)
_chunks = st.lists(st.tuples(st.sampled_from([TopicPartition("a", 0), TopicPartition('q"t', 7)]), _records),
                   max_size=4)
_json_values = st.one_of(st.none(), st.sampled_from([b"{}", b'{"a": [1, 2.5e3, "x\\n"]}', b"not json", b"\xff",
                                                    b"  true ", b"[1,\n2]", b""]))


def _json_records(draw_values: list[tuple[bytes | None, bytes | None]]) -> list[Record]:
    return [Record(i, 5, k, v, ()) for i, (k, v) in enumerate(draw_values)]


@settings(max_examples=200, deadline=None)
@given(_chunks)
def test_framed_binary_equals_joined_chunks_and_python(chunks: list[tuple[TopicPartition, list[Record]]]) -> None:
    _need_c()
    before = (Rd.render_binary_chunk, Rd.render_json_chunk)
    try:
        Rd.use_c_renderer(True)
        joined = Rd.render_binary(chunks)
        body, count, payload = Rd.render_array(chunks, False)
        assert body == joined.array()
        assert (count, payload) == (joined.count, joined.payload)
        Rd.use_c_renderer(False)
        assert Rd.render_array(chunks, False) == (body, count, payload)
    finally:
        Rd.render_binary_chunk, Rd.render_json_chunk = before
    expected = [{"topic": tp.topic, "partition": tp.partition, "offset": r.offset, "timestamp": r.timestamp,
                 "key": None if r.key is None else base64.b64encode(r.key).decode(),
                 "value": None if r.value is None else base64.b64encode(r.value).decode(),
                 "headers": [{"key": k, "value": None if v is None else base64.b64encode(v).decode()}
                             for k, v in r.headers]}
                for tp, recs in chunks for r in recs]
    assert orjson.loads(body) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(_json_values, _json_values), max_size=5), max_size=3))
def test_framed_json_equals_joined_chunks(values: list[list[tuple[bytes | None, bytes | None]]]) -> None:
    _need_c()
    chunks = [(TopicPartition("j", p), _json_records(v)) for p, v in enumerate(values)]
    before = (Rd.render_binary_chunk, Rd.render_json_chunk)
    try:
        Rd.use_c_renderer(True)
        joined = Rd.render_json(chunks)
        out = Rd.render_array(chunks, True)
        assert out == (joined.array(), joined.count, joined.payload)
        orjson.loads(out[0])
    finally:
        Rd.render_binary_chunk, Rd.render_json_chunk = before


def test_framed_empty_and_wrong_types() -> None:
    _need_c()
    c = R._crecords
    assert c.render_framed([], b",", False, b"[", b"]") == (b"[]", 0, 0)  # type: ignore[union-attr]
    assert c.render_framed([([], b"{")], b",", False, b"[", b"]") == (b"[]", 0, 0)  # type: ignore[union-attr]
    for bad in ([([], "str")], [((), b"{")], [[[], b"{"]], [([(1, 2, "s", None, ())], b"{")]):
        with pytest.raises(TypeError):
            c.render_framed(bad, b",", False, b"[", b"]")  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        c.render_framed((), b",", False, b"[", b"]")  # type: ignore[union-attr]


def test_base64_every_length_and_byte() -> None:
    _need_c()
    data = bytes(range(256)) * 3
    for n in range(0, 70):
        for start in (0, 1, 100, 250):
            v = data[start:start + n]
            body, _ = R._crecords.render([Record(0, 0, v, None, ())], b'{"offset":', b",",  # type: ignore[union-attr]
                                         False)
            assert orjson.loads(body)["key"] == base64.b64encode(v).decode()


def test_decoded_timestamps_shared_or_not_keep_their_values() -> None:
    _need_c()
    # runs of equal timestamps (shared int objects in C) between different ones, in one batch and across batches
    stamps = [1000, 1000, 1000, 1005, 1000, 2**40, 2**40, -1, -1, 0, 0, 1000]
    batch = R.build_batch([(b"k%d" % i, b"v", (), ts) for i, ts in enumerate(stamps)], base_offset=3)
    data = batch + R.build_batch([(b"k", b"v", (), 1000)] * 3, base_offset=3 + len(stamps))
    before = R.using_c_extension()
    try:
        R.use_c_extension(True)
        c_recs = [r for b in R.decode_records(data).batches for r in b.decode()]
        R.use_c_extension(False)
        py_recs = [r for b in R.decode_records(data).batches for r in b.decode()]
    finally:
        R.use_c_extension(before)
    assert [r.timestamp for r in c_recs] == stamps + [1000] * 3
    assert c_recs == py_recs
    assert c_recs[0].timestamp is c_recs[1].timestamp  # one object for a run


@settings(max_examples=150, deadline=None)
@given(_chunks, st.one_of(st.none(), st.binary(min_size=1, max_size=20).map(base64.urlsafe_b64encode)),
       st.booleans())
def test_ndjson_with_resume_equals_python(chunks: list[tuple[TopicPartition, list[Record]]], resume: bytes | None,
                                          json: bool) -> None:
    _need_c()
    before = (Rd.render_binary_chunk, Rd.render_json_chunk)
    try:
        Rd.use_c_renderer(True)
        c = Rd.render_ndjson(chunks, json, resume)
        py_on_c = Rd.render_ndjson_py(chunks, json, resume)  # the per-chunk C renderer, framed in Python
        Rd.use_c_renderer(False)
        py = Rd.render_ndjson(chunks, json, resume)
    finally:
        Rd.render_binary_chunk, Rd.render_json_chunk = before
    assert c == py_on_c
    if not json:
        assert c == py
    lines = c[0].split(b"\n")
    n = sum(len(recs) for _, recs in chunks)
    assert lines[-1] == b"" and len(lines) == max(1, n) + 1
    if n:
        objs = [orjson.loads(x) for x in lines[:-1]]
        assert [o["offset"] for o in objs] == [r.offset for _, recs in chunks for r in recs]
        if resume is not None:
            assert objs[-1]["resume"] == resume.decode()
            assert all("resume" not in o for o in objs[:-1])
