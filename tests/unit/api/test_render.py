"""Response rendering (api/v2/render.py): the C and the pure-Python binary renderer give the same JSON, every
framing parses back to the records, and the json format splices valid JSON and never loses a record."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v2 import render as Rd
from service.consumer.subscription import TopicPartition
from service.protocol import records as R
from service.protocol.records import Record

REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"
TP = TopicPartition("t\u00e9st \"q\"", 3)


@pytest.fixture(params=["c", "py"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    before = (Rd.render_binary_chunk, Rd.render_json_chunk)
    if request.param == "c":
        if not R.C_EXTENSION_AVAILABLE:
            if REQUIRE_CEXT:
                pytest.fail("C renderer not importable (KCG_REQUIRE_CEXT=1)")
            pytest.skip("C renderer not importable")
        Rd.use_c_renderer(True)
    else:
        Rd.use_c_renderer(False)
    try:
        yield request.param
    finally:
        Rd.render_binary_chunk, Rd.render_json_chunk = before


def _b(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def expected_binary(tp: TopicPartition, r: Record) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition, "offset": r.offset, "timestamp": r.timestamp,
            "key": _b(r.key), "value": _b(r.value),
            "headers": [{"key": k, "value": _b(v)} for k, v in r.headers]}


RECORDS = [
    Record(0, 1_700_000_000_000, b"k", b"v" * 100, ()),
    Record(1, -1, None, None, ()),
    Record(2**63 - 1, -(2**63), b"", b"", ()),
    Record(7, 5, b"\x00\xff\xfe", b"ab", (("h", b"x"), ("n", None), ("e", b""))),
    Record(8, 5, b"12", b"123", (("quote\" back\\ nl\n tab\t ctl\x01 \u2603 \U0001f600", b"\x00"),)),
]


def test_binary_renders_every_field(impl: str) -> None:
    out = Rd.render_binary([(TP, RECORDS)])
    assert out.count == len(RECORDS)
    assert out.payload == sum(len(r.key or b"") + len(r.value or b"") for r in RECORDS)
    assert orjson.loads(out.array()) == [expected_binary(TP, r) for r in RECORDS]


def test_binary_framings_and_empty_chunks(impl: str) -> None:
    other = TopicPartition("u", 0)
    chunks = [(TP, RECORDS[:2]), (TopicPartition("empty", 1), []), (other, RECORDS[2:])]
    want = [expected_binary(TP, r) for r in RECORDS[:2]] + [expected_binary(other, r) for r in RECORDS[2:]]
    assert orjson.loads(Rd.render_binary(chunks).array()) == want
    nd = Rd.render_binary(chunks, Rd.NDJSON_SEP).ndjson()
    assert nd.endswith(b"\n") and [orjson.loads(x) for x in nd.splitlines()] == want
    sse = Rd.render_binary(chunks, Rd.SSE_SEP).sse()
    events = sse.split(b"\n\n")
    assert events[-1] == b""
    assert [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]] == want
    assert Rd.render_binary([]).array() == b"[]"


def test_c_and_python_give_identical_bytes() -> None:
    if not R.C_EXTENSION_AVAILABLE:
        if REQUIRE_CEXT:
            pytest.fail("C renderer not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C renderer not importable")
    head = b'{"topic":"t","partition":0,"offset":'
    c = R._crecords.render(RECORDS, head, b"\n", False)  # type: ignore[union-attr]
    py = Rd.render_binary_chunk_py(RECORDS, head, b"\n")
    # the same JSON values; the byte forms differ only in how a header key's controls are escaped
    assert c[1] == py[1]
    assert [orjson.loads(x) for x in c[0].split(b"\n")] == [orjson.loads(x) for x in py[0].split(b"\n")]
    assert c[0].split(b"\n")[:4] == py[0].split(b"\n")[:4]


def test_c_renderer_rejects_wrong_types() -> None:
    if not R.C_EXTENSION_AVAILABLE:
        if REQUIRE_CEXT:
            pytest.fail("C renderer not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C renderer not importable")
    def render(recs: Any, head: bytes, sep: bytes) -> Any:
        return R._crecords.render(recs, head, sep, False)  # type: ignore[union-attr]

    for bad in ([(1, 2, "str", None, ())], [(1, 2, None, None)], [(1, 2, None, None, [("k", b"v")])],
                [(1, 2, None, None, ((b"k", b"v"),))], [(1, 2, None, None, (("k", "v"),))], [("x", 2, None, None, ())],
                [(2**64, 2, None, None, ())]):
        with pytest.raises((TypeError, OverflowError)):
            render(bad, b"{", b",")
    with pytest.raises(TypeError):
        render((), b"{", b",")
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8 form
        render([(1, 2, None, None, (("\ud800", None),))], b"{", b",")


_bytes = st.one_of(st.none(), st.binary(max_size=40))
_records = st.lists(st.builds(Record, st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1), _bytes, _bytes,
                              st.lists(st.tuples(st.text(max_size=8),
                                                 _bytes), max_size=3).map(tuple)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(_records)
def test_binary_round_trips(recs: list[Record]) -> None:
    for enabled in ([True, False] if R.C_EXTENSION_AVAILABLE else [False]):
        before = (Rd.render_binary_chunk, Rd.render_json_chunk)
        Rd.use_c_renderer(enabled)
        try:
            assert orjson.loads(Rd.render_binary([(TP, recs)]).array()) == [expected_binary(TP, r) for r in recs]
        finally:
            Rd.render_binary_chunk, Rd.render_json_chunk = before


# -- json format ---------------------------------------------------------------------------------------------
def test_json_splices_valid_json_and_keeps_invalid_records(impl: str) -> None:
    recs = [
        Record(0, 1, b'"k"', b'{"a": [1, 2.5, null], "b": "\\u00e9"}', ()),
        Record(1, 2, None, b"not json", (("h", b"\x01"),)),
        Record(2, 3, b"{bad", None, ()),
        Record(3, 4, None, b'{\n  "pretty": true\r\n}', ()),
        Record(4, 5, None, b"\xff\xfe", ()),
        Record(5, 6, None, b"", ()),
        Record(6, 7, None, b" 42 ", ()),
    ]
    out = Rd.render_json([(TP, recs)], Rd.NDJSON_SEP)
    assert out.count == len(recs)
    lines = out.ndjson().splitlines()
    assert len(lines) == len(recs)  # pretty-printed JSON was compacted: one record per line
    got = [orjson.loads(x) for x in lines]
    base = {"topic": TP.topic, "partition": TP.partition}
    assert got[0] == {**base, "offset": 0, "timestamp": 1, "key": "k", "value": {"a": [1, 2.5, None], "b": "\u00e9"},
                      "headers": []}
    assert got[1] == {**base, "offset": 1, "timestamp": 2, "key": None, "value": None,
                      "value_error": "not valid JSON", "value_base64": base64.b64encode(b"not json").decode(),
                      "headers": [{"key": "h", "value": "AQ=="}]}
    assert got[2]["key"] is None and got[2]["key_error"] == "not valid JSON" and got[2]["value"] is None
    assert base64.b64decode(got[2]["key_base64"]) == b"{bad"
    assert got[3]["value"] == {"pretty": True}
    assert got[4]["value"] is None and base64.b64decode(got[4]["value_base64"]) == b"\xff\xfe"
    assert got[5]["value"] is None and got[5]["value_base64"] == ""
    assert got[6]["value"] == 42
    assert orjson.loads(Rd.render_json([(TP, recs)]).array()) == got


def _need_c() -> Any:
    if not R.C_EXTENSION_AVAILABLE:
        if REQUIRE_CEXT:
            pytest.fail("C renderer not importable (KCG_REQUIRE_CEXT=1)")
        pytest.skip("C renderer not importable")
    return R._crecords


def strict_json(b: bytes) -> bool:
    """The oracle: RFC 8259 JSON text in strict UTF-8, no NaN/Infinity, no lone surrogate escapes, no number
    that overflows a double (orjson refuses those too; underflow reads as 0)."""
    import json
    import math

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    def finite(text: str) -> float:
        v = float(text)  # correctly rounded, as orjson's
        if math.isinf(v):
            raise ValueError(text)
        return v

    def finite_int(text: str) -> Any:
        return int(text) if len(text) < 300 else finite(text)  # orjson reads integers beyond 64 bits as doubles

    try:
        text = b.decode("utf-8")
        if text.startswith("\ufeff"):
            return False
        v = json.loads(text, parse_constant=no_constants, parse_float=finite, parse_int=finite_int)
        json.dumps(v, ensure_ascii=False).encode("utf-8")  # lone surrogates cannot be encoded
    except (ValueError, UnicodeError, RecursionError):
        return False
    return True


VALID = [b"0", b"-0", b"1.5e-3", b"-12E+4", b'""', b'"\\u00e9\\ud83d\\ude00\\/\\b\\f\\n\\r\\t"', b"true", b"false",
         b"null", b"[]", b"{}", b' \t\r\n[1, {"a": [null, true]}, "x"] \n', "\"\u00e9\u2603\U0001f600\"".encode(),
         b"[" * 500 + b"]" * 500, b'{"a":{"b":{"c":[]}}}', b"123456789012345678901234567890",
         # numbers that fit a double (underflow reads as 0, in orjson too)
         b"1e-400", b"-1e-400", b"0e999999999", b"1e308", b"1.7976931348623158e308", b"-1.7976931348623157E+308",
         b"0." + b"0" * 400 + b"1e400", b"1" + b"0" * 308, str(2**1024 - 2**970 - 1).encode(), b"[1e-99999999999999]"]
INVALID = [b"", b" ", b"01", b"1.", b".5", b"-", b"1e", b"+1", b"NaN", b"Infinity", b"tru", b"nul", b"[1,]",
           b'{"a":1,}', b'{"a" 1}', b"{1:2}", b"[1 2]", b'"\x01"', b'"\\x"', b'"\\u12"', b'"\\ud800"', b'"\\udc00"',
           b'"\\ud800\\u0041"', b'"unterminated', b"[", b"]", b"1 2", b'"\xff"', b'"\xc0\xaf"', b'"\xed\xa0\x80"',
           b'"\xf4\x90\x80\x80"', b'"\xe2\x82"', b"\xef\xbb\xbf{}", b"[" * 600 + b"]" * 600, b"'a'", b"[1]x",
           # numbers that do not fit a double (orjson: "number is infinity when parsed as double")
           b"1e400", b"-1e400", b"[1e400]", b'{"a":-1E+400}', b"1.7976931348623159e308", b"1.8e308", b"1" + b"0" * 309,
           b"1e99999999999999999999999", b"0." + b"0" * 400 + b"1e710", str(2**1024 - 2**970).encode(),
           b"0." + str(2**1024 - 2**970).encode() + b"e309", b"12345678901234567890e290"]


def test_json_render_twins_agree_on_depth(impl: str) -> None:
    """512 levels are embedded (pretty-printed ones too, past the 254 orjson writes), 513 are not JSON here."""
    ok, deep = b"[" * 512 + b"]" * 512, b"[" * 513 + b"]" * 513
    recs = [Record(0, 1, None, ok, ()), Record(1, 2, None, deep, ()), Record(2, 3, None, b"[\n" * 300 + b"]" * 300, ())]
    got = [orjson.loads(x) for x in Rd.render_json([(TP, recs)], Rd.NDJSON_SEP).ndjson().splitlines()]
    assert got[0]["value"] == orjson.loads(ok) and "value_error" not in got[0]
    assert got[1]["value"] is None and got[1]["value_error"] == "not valid JSON"
    assert got[2]["value"] == orjson.loads(b"[" * 300 + b"]" * 300)


def test_json_validator_examples() -> None:
    c = _need_c()
    for v in VALID:
        assert c.json_valid(v) is True, v
        assert strict_json(v), v
    for v in INVALID:
        assert c.json_valid(v) is False, v
        if not v.startswith(b"[" * 600):  # the oracle accepts depth 600; ours stops at 512 (orjson at 1024)
            assert not strict_json(v), v


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from([None, 1, 2]))
def test_json_validator_accepts_what_serialisers_write(value: Any, indent: int | None) -> None:
    import json

    c = _need_c()
    text = json.dumps(value, ensure_ascii=False, indent=indent).encode()
    assert c.json_valid(text) is True
    assert c.json_valid(orjson.dumps(value)) is True
    out, _ = c.render([Record(0, 0, None, text, ())], b'{"o":', b",", True)
    assert orjson.loads(out)["value"] == orjson.loads(text)
    assert b"\n" not in out


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.binary(max_size=24), st.builds(lambda a, b: a + b, st.sampled_from(
    [v for v in VALID + INVALID if len(v) < 1000]), st.binary(max_size=3))))
def test_json_validator_agrees_with_a_strict_parser(data: bytes) -> None:
    c = _need_c()
    assert c.json_valid(data) is strict_json(data), data


_OVERFLOW = str(2**1024 - 2**970)  # the smallest decimal that rounds to infinity as a double


@st.composite
def _numbers(draw: st.DrawFn) -> bytes:
    """JSON numbers around the double's overflow threshold, huge exponents, long digit strings and underflow."""
    sign = draw(st.sampled_from(["", "-"]))
    kind = draw(st.integers(0, 3))
    if kind == 0:  # the threshold's digits nudged, trailing zeros, the point anywhere, the exponent to match
        digits = str(int(_OVERFLOW) + draw(st.integers(-3, 3)) * 10 ** draw(st.integers(0, 300)))
        zeros = draw(st.integers(0, 3))
        digits += "0" * zeros  # value: int(digits) * 10**-zeros
        if draw(st.booleans()):
            lead = "0" * draw(st.integers(0, 2))
            mant, exp = f"0.{lead}{digits}", len(lead) + len(digits) - zeros
        else:
            point = draw(st.integers(1, len(digits)))
            frac = digits[point:]
            mant, exp = digits[:point] + (f".{frac}" if frac else ""), len(frac) - zeros
        exp += draw(st.sampled_from([0, 0, 0, -1, 1]))
        return f"{sign}{mant}e{exp}".encode()
    if kind == 1:  # d.ddd with exponents from underflow to overflow
        mant = str(draw(st.integers(1, 9))) + "." + str(draw(st.integers(0, 10**20)))
        exp = draw(st.one_of(st.integers(-400, 400), st.integers(-(10**30), 10**30)))
        return f"{sign}{mant}{draw(st.sampled_from(['e', 'E']))}{exp:+d}".encode()
    if kind == 2:  # long integers and fractions
        return f"{sign}{draw(st.integers(1, 9))}{'0' * draw(st.integers(300, 320))}".encode()
    zeros = "0" * draw(st.integers(0, 400))
    return f"{sign}0.{zeros}{draw(st.integers(1, 99))}e{draw(st.integers(290, 720))}".encode()


@settings(max_examples=2000, deadline=None)
@given(_numbers())
def test_json_validator_numbers_agree_with_orjson(text: bytes) -> None:
    """A number that does not fit a double is invalid in C exactly when the Python twin (orjson) refuses it."""
    c = _need_c()
    try:
        orjson.loads(text)
        twin = True
    except orjson.JSONDecodeError:
        twin = False
    assert c.json_valid(text) is twin, text
    assert c.json_valid(b"[" + text + b"]") is twin, text
    assert strict_json(text) is twin, text


def test_overflowing_numbers_render_as_record_errors(impl: str) -> None:
    """1e400 is not embedded raw (strict parsers would refuse the whole answer): the record's error instead."""
    recs = [Record(0, 1, None, b'{"x": 1e400}', ()), Record(1, 2, b"-1E400", b"1e-400", ())]
    got = [orjson.loads(x) for x in Rd.render_json([(TP, recs)], Rd.NDJSON_SEP).ndjson().splitlines()]
    assert got[0]["value"] is None and got[0]["value_error"] == "not valid JSON"
    assert base64.b64decode(got[0]["value_base64"]) == b'{"x": 1e400}'
    assert got[1]["key"] is None and got[1]["key_error"] == "not valid JSON" and got[1]["value"] == 0.0


def test_c_json_render_never_loses_a_record() -> None:
    c = _need_c()
    recs = [Record(i, i, None if i % 3 == 0 else v, v, ()) for i, v in enumerate(VALID + INVALID)]
    out, payload = c.render(recs, b'{"o":', b"\n", True)
    lines = out.split(b"\n")
    assert len(lines) == len(recs) and payload == sum(len(r.key or b"") + len(r.value or b"") for r in recs)
    for r, line in zip(recs, lines, strict=True):
        obj = orjson.loads(line)
        for field, raw in (("key", r.key), ("value", r.value)):
            if raw is None:
                assert obj[field] is None and f"{field}_error" not in obj
            elif c.json_valid(raw):
                assert obj[field] == orjson.loads(raw)
            else:
                assert obj[field] is None and obj[f"{field}_error"] == "not valid JSON"
                assert base64.b64decode(obj[f"{field}_base64"]) == raw
