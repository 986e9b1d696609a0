"""service/producer/_cproduce.c against the Python produce path, on hypothesis-generated input: the records
section encoder, the binary body/record parsers (base64 decoding included: valid, corrupted and escaped
text), the answer renderers and the small helpers. Equal answers; a parser's None (declined) is always
allowed, the Python path then decides."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from api.v2 import produce as route
from service.producer import encoding
from service.producer.errors import ProduceFailure, RecordMetadata
from tests.fuzz import strategies as S
from tests.fuzz.twins import covers, fuzz

C: Any = encoding._cproduce
INT64 = st.integers(-(2**63), 2**63 - 1)


def _python(fn: Any, *args: Any) -> Any:
    """fn(*args) on the Python path (the C helpers switched off): its result or its error text."""
    saved = encoding.native
    encoding.native = None
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # compared, not swallowed
        return ("error", f"{type(exc).__name__}: {exc}")
    finally:
        encoding.native = saved


# -- encode_runs ---------------------------------------------------------------------------------------------
bytes_like = st.one_of(st.none(), st.binary(max_size=40), st.binary(max_size=20).map(bytearray),
                       st.binary(max_size=20).map(memoryview), st.integers(0, 9000).map(bytes))
run_headers = st.one_of(st.sampled_from([(), [], None]),
                        st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)), max_size=3),
                        st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=10)),
                                 max_size=3).map(tuple))
# HTTP produce takes timestamps 0..2**63-1 (api/v2/produce.py _int_field): every delta fits an int64
timestamps = st.one_of(st.none(), st.integers(0, 2**41), st.integers(0, 2**63 - 1))
runs = st.lists(st.tuples(st.lists(st.tuples(bytes_like, bytes_like, run_headers, st.none(), timestamps),
                                   min_size=1, max_size=8), st.integers(0, 2**41)), min_size=1, max_size=3)


def _encoded(fn: Any, rs: Any) -> Any:
    try:
        return fn(rs)
    except (ValueError, OverflowError) as exc:
        return type(exc).__name__


@covers("_cproduce.encode_runs")
@fuzz()
@given(runs)
def test_encode_runs_is_the_python_encoder(rs: list[Any]) -> None:
    assert _encoded(C.encode_runs, rs) == _encoded(encoding._encode_runs_py, rs)


# -- parse_binary / parse_body_binary ------------------------------------------------------------------------
b64_json = st.one_of(S.b64_text.map(json.dumps), S.b64_text.map(lambda t: '"' + t + '"'), st.just("null"),
                     st.sampled_from(["1", "[]", "{}", "true", '"\\u0041AAA"', '"QUJD\\n"', '"\\/w=="']))
member_names = st.sampled_from(["key", "value", "key", "value", "partition", "headers", "timestamp", "Key",
                                "valu", "value\\u0000", "k\\u0065y"])
members = st.lists(st.tuples(member_names, b64_json), max_size=3)
spaces = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])


@st.composite
def bodies(draw: Any) -> bytes:
    recs = []
    for ms in draw(st.lists(members, max_size=4)):
        parts = [f'{draw(spaces)}"{name}"{draw(spaces)}:{draw(spaces)}{value}{draw(spaces)}' for name, value in ms]
        recs.append(draw(spaces) + "{" + ",".join(parts) + "}" + draw(spaces))
    extra = draw(st.sampled_from(["", "", "", ',"key_schema":null', ',"other":1']))
    body = "{" + draw(spaces) + '"records"' + draw(spaces) + ":" + draw(spaces) + "[" + ",".join(recs) + "]" + \
        extra + "}" + draw(spaces)
    return S.mutate(body.encode(), draw(S.mutations) if draw(st.integers(0, 4)) == 0 else [])


@covers("_cproduce.parse_body_binary")
@fuzz(scale=3)
@given(bodies(), st.sampled_from([None, 0, 2, 2**31 - 1]))
@example(b'{"records":[{"value":"QQ=="}]}', None)
def test_parse_body_binary_is_orjson_and_parse_records(body: bytes, partition: int | None) -> None:
    got = C.parse_body_binary(body, partition)
    if got is not None:
        assert ("ok", got) == _python(lambda: route.parse_records(route._parse_body(body, "binary"), "binary",
                                                                   partition))


plain_values = st.one_of(S.b64_text, st.none(), st.sampled_from([1, ["x"], {"a": 1}, 2.5, True]))
record_objects = st.one_of(
    st.dictionaries(st.sampled_from(["key", "value"]), plain_values, max_size=2),
    st.dictionaries(st.sampled_from(["key", "value", "partition", "headers", "timestamp", "extra"]),
                    st.one_of(plain_values, st.integers(-1, 2**31), st.just([{"key": "h", "value": "QQ=="}])),
                    max_size=3),
    st.sampled_from(["not an object", None, 3, []]))


@covers("_cproduce.parse_binary")
@fuzz(scale=3)
@given(st.lists(record_objects, min_size=1, max_size=5), st.sampled_from([None, 0, 2]))
def test_parse_binary_is_the_python_parse(recs: list[Any], partition: int | None) -> None:
    got = C.parse_binary(recs, partition)
    want = _python(route.parse_records, {"records": recs}, "binary", partition)
    if got is not None:
        assert ("ok", got) == want
    saved = encoding.native
    try:  # the route with the C helpers answers as the route without, errors included
        with_c = ("ok", route.parse_records({"records": recs}, "binary", partition))
    except Exception as exc:
        with_c = ("error", f"{type(exc).__name__}: {exc}")
    finally:
        encoding.native = saved
    assert with_c == want


# -- metas / plain_sizes ------------------------------------------------------------------------------------
@covers("_cproduce.metas")
@fuzz()
@given(st.integers(0, 2**31 - 1), st.integers(-(2**62), 2**62), st.integers(0, 60))
def test_metas_are_the_python_metas(partition: int, base: int, n: int) -> None:
    got = C.metas(RecordMetadata, partition, base, n)
    assert got == encoding._metas_py(RecordMetadata, partition, base, n)
    assert all(type(m) is RecordMetadata for m in got)


shapes = st.one_of(
    st.tuples(st.none(), bytes_like, st.sampled_from([(), [], None]), st.none(), st.none()),
    st.tuples(bytes_like, bytes_like, run_headers, st.one_of(st.none(), st.integers(0, 5)), timestamps),
    st.lists(st.none(), max_size=6).map(tuple), st.lists(st.none(), min_size=5, max_size=5),
    st.sampled_from(["x", None, 1]))


@covers("_cproduce.plain_sizes")
@fuzz()
@given(st.lists(shapes, max_size=6), st.integers(0, 100))
def test_plain_sizes_is_the_python_check(recs: list[Any], overhead: int) -> None:
    def outcome(fn: Any) -> Any:
        try:
            return fn(recs, overhead)
        except TypeError:
            return "TypeError"
    assert outcome(C.plain_sizes) == outcome(encoding._plain_sizes_py)


# -- render_offsets / render_offset_runs ---------------------------------------------------------------------
results = st.lists(st.one_of(
    st.builds(RecordMetadata, st.integers(0, 2**31 - 1), INT64),
    st.builds(ProduceFailure, st.sampled_from([1, 2, 6, 10, 29, 87, -1, 999]), st.text(max_size=8), st.booleans(),
              st.one_of(st.none(), st.integers(0, 5)))), max_size=8)
schema_ids = st.one_of(st.none(), st.integers(0, 2**31 - 1))


@covers("_cproduce.render_offsets")
@fuzz()
@given(results, schema_ids, schema_ids)
def test_render_offsets_is_the_python_render(rs: list[Any], ksid: int | None, vsid: int | None) -> None:
    got = C.render_offsets(rs, RecordMetadata, ksid, vsid)
    want = _python(route.render, rs, ksid, vsid)
    assert want[0] == "ok"
    if got is not None:
        assert got == want[1][0] and want[1][1:] == (200, 0, [True] * len(rs))
    else:
        assert any(type(r) is not RecordMetadata for r in rs)


runs_of_offsets = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62), st.integers(0, 12)),
                           max_size=5)


@covers("_cproduce.render_offset_runs")
@fuzz()
@given(runs_of_offsets, st.integers(-2, 2), st.booleans())
def test_render_offset_runs_is_render_offsets(rs: list[Any], n_delta: int, shuffle: bool) -> None:
    runs, metas, first = [], [], 0
    for p, off, count in rs:
        runs.append((first, p, off, count))
        metas += [RecordMetadata(p, off + i) for i in range(count)]
        first += count
    if shuffle:
        runs.reverse()
    n = first + n_delta
    if n < 0:  # not a count: refused (tests/fuzz/test_index_arguments.py, "render_offset_runs n<0")
        with pytest.raises(ValueError, match="is not a count"):
            C.render_offset_runs(runs, n)
        return
    got = C.render_offset_runs(runs, n)
    at = 0
    in_order = True
    for start, _, _, count in runs:
        in_order = in_order and start == at
        at += count
    covering = n_delta == 0 and in_order
    if covering:
        assert got == C.render_offsets(metas, RecordMetadata, None, None)
    else:  # runs that do not cover 0..n-1 in order are declined
        assert got is None
