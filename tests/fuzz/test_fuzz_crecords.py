"""service/protocol/_crecords.c against its Python twins, on hypothesis-generated (and mutated) input: the
records-section decoder, the RecordRun index, the take budget, the binary/json renderers (base64 of keys, values
and header values included) and the JSON validator. Equal answers, or the same refusal (ValueError)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from api.v2 import render as Rd
from service.consumer.subscription import TopicPartition
from service.fetch import fetcher as F
from service.protocol import records as R
from service.protocol.records import Record, build_batch, decode_records
from tests.fuzz import strategies as S
from tests.fuzz.twins import covers, fuzz

C: Any = R._crecords
TP = TopicPartition("t\u00e9\"", 3)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ValueError:  # the decoders' refusal (UnicodeDecodeError of a header key included)
        return "refused"


def _blob(batches: list[list[tuple[Any, ...]]], base: int = 0, log_append: bool = False) -> bytes:
    out = b""
    off = base
    for recs in batches:
        rows = [Record(off + i, 1_700_000_000_000 + ts, k, v, tuple(h)) for i, (k, v, h, ts) in enumerate(recs)]
        out += build_batch(rows, base_offset=off, log_append_time=log_append, partition_leader_epoch=3)
        off += len(recs)
    return out


# -- decode_records ------------------------------------------------------------------------------------------
@covers("_crecords.decode_records")
@fuzz()
@given(S.rows, S.mutations, st.integers(-2, 2), st.one_of(st.none(), st.integers(0, 2**62)),
       st.integers(0, 2**62), st.binary(max_size=8), st.booleans())
def test_decode_records_is_the_python_decoder(rows: list[Any], muts: list[Any], count_delta: int,
                                              append_ts: int | None, base_offset: int, tail: bytes,
                                              as_memoryview: bool) -> None:
    blob = build_batch([Record(i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(rows)])
    (b,) = list(R.iter_batches(blob))
    section = S.mutate(bytes(b.raw_records), muts)
    head = blob[:b._start]
    buf: Any = head + section + tail
    if as_memoryview:
        buf = memoryview(bytearray(buf))
    args = (buf, len(head), len(head) + len(section), len(rows) + count_delta, base_offset, 1_700_000_000_000,
            append_ts)
    c = _outcome(C.decode_records, *args, Record)
    py = _outcome(R._decode_section_py, *args, Record)
    assert c == py
    if not muts and count_delta == 0:
        assert c != "refused" and [r[2:] for r in c] == [(k, v, h) for k, v, h, _ in rows]


@covers("_crecords.decode_records")
@fuzz()
@given(st.binary(max_size=64), st.integers(-2, 12), st.integers(-(2**63), 2**63 - 1))
def test_decode_records_garbage_sections(section: bytes, count: int, base: int) -> None:
    args = (section, 0, len(section), count, base, 0, None)
    assert _outcome(C.decode_records, *args, tuple) == _outcome(R._decode_section_py, *args, tuple)


# -- RecordRun -----------------------------------------------------------------------------------------------
batches = st.lists(S.rows, min_size=1, max_size=3)


def _run(blob: bytes) -> Any:
    run = C.RecordRun(blob, Record)
    for b in R.iter_batches(blob):
        run.add(b._start, b._end, b.records_count, b.base_offset, b.base_timestamp,
                b.max_timestamp if b.attributes & 0x08 else None)
    return run


@covers("_crecords.RecordRun", "_crecords.RecordRun.add", "_crecords.RecordRun.offset",
        "_crecords.RecordRun.payload", "_crecords.take_budget")
@fuzz()
@given(batches, st.booleans(), st.data())
def test_record_run_is_the_decoded_list(bs: list[Any], log_append: bool, data: st.DataObject) -> None:
    blob = _blob(bs, base=7, log_append=log_append)
    run, recs = _run(blob), list(decode_records(blob).records())
    n = len(recs)
    assert len(run) == n and run == recs and list(run) == recs
    i = data.draw(st.integers(-n, n - 1))
    assert run[i] == recs[i] and run.offset(i) == recs[i].offset
    start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1, 3]))
    assert list(run[start:stop:step]) == recs[start:stop:step]
    p = data.draw(st.integers(-2, n + 2))
    if 0 <= p <= n:  # payload(n) is 0: the records from n on
        assert run.payload(p) == F._payload_from(recs, p)
    else:  # outside 0..n: refused by the run and by the twin on a list alike
        with pytest.raises(IndexError):
            run.payload(p)
        with pytest.raises(IndexError):
            F._payload_from(recs, p)
    budget, started = data.draw(st.integers(-3, 3000)), data.draw(st.booleans())
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n + 3))
    want = F._take_budget_py(recs, lo, min(hi, n), budget, started)
    assert C.take_budget(run, lo, hi, budget, started) == want == C.take_budget(recs, lo, hi, budget, started)


@covers("_crecords.RecordRun.add")
@fuzz()
@given(S.rows, S.mutations, st.integers(-1, 1))
def test_record_run_add_refuses_what_decode_records_refuses(rows: list[Any], muts: list[Any], delta: int) -> None:
    blob = build_batch([Record(i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(rows)])
    (b,) = list(R.iter_batches(blob))
    section = S.mutate(bytes(b.raw_records), muts)
    buf = blob[:b._start] + section
    end, count = b._start + len(section), len(rows) + delta
    want = _outcome(R._decode_section_py, buf, b._start, end, count, 5, 10, None, Record)
    run = C.RecordRun(buf, Record)
    got = _outcome(run.add, b._start, end, count, 5, 10, None)
    if want == "refused" or count == 0:
        assert got == "refused" or (count == 0 and want == [])
        assert len(run) == 0
    else:
        assert got == (want[0].offset, want[-1].offset) and run == want


# -- take_budget on lists ------------------------------------------------------------------------------------
@covers("_crecords.take_budget")
@fuzz()
@given(S.record_lists, st.data())
def test_take_budget_is_the_python_budget(recs: list[Record], data: st.DataObject) -> None:
    n = len(recs)
    i = data.draw(st.integers(0, n))
    j = data.draw(st.integers(i, n + 3))
    budget = data.draw(st.one_of(st.integers(-5, 400), st.integers(0, 2**62)))
    started = data.draw(st.booleans())
    assert C.take_budget(recs, i, j, budget, started) == F._take_budget_py(recs, i, min(j, n), budget, started)


# -- render / render_framed ----------------------------------------------------------------------------------
def _parsed(body: bytes) -> Any:
    return orjson.loads(b"[" + body + b"]")


@covers("_crecords.render")
@fuzz()
@given(S.record_lists, st.sampled_from([b",", b"\n", b"\n\ndata: "]), st.binary(max_size=6))
@example([Record(0, 0, b"1e400", b"[1E309]", ())], b",", b"")  # a number no double holds: not JSON
@example([Record(0, 0, None, b'{"a":-1e400}', ())], b",", b"")
def test_render_is_the_python_renderer(recs: list[Record], sep: bytes, topic: bytes) -> None:
    head = Rd._head(TopicPartition(topic.decode("latin-1"), 1))
    assert C.render(recs, head, sep, False) == Rd.render_binary_chunk_py(recs, head, sep)
    body, payload = C.render(recs, head, sep, True)
    want, want_payload = Rd.render_json_chunk_py(recs, head, sep)
    assert payload == want_payload
    assert b"\n" not in body.replace(sep, b"")  # one record per line
    if sep == b",":  # the C path drops insignificant whitespace: compare what a strict parser reads
        assert _parsed(body) == _parsed(want)
    else:
        assert body.count(sep) == want.count(sep)
        assert [orjson.loads(x) for x in body.split(sep)] == [orjson.loads(x) for x in want.split(sep)] if recs \
            else body == want == b""


chunks = st.lists(st.tuples(st.builds(TopicPartition, st.text(max_size=5), st.integers(0, 2**31 - 1)),
                            S.record_lists), max_size=4)


@covers("_crecords.render_framed")
@fuzz()
@given(chunks, st.booleans(), st.one_of(st.none(), st.binary(min_size=1, max_size=12)))
def test_render_framed_is_the_python_framing(cs: list[Any], json_fmt: bool, resume: bytes | None) -> None:
    items = [(recs, Rd._head(tp)) for tp, recs in cs if recs]
    body, n, payload = C.render_framed(items, Rd.ARRAY_SEP, json_fmt, b"[", b"]")
    want = Rd.render_array_py(cs, json_fmt)
    assert (n, payload) == want[1:]
    assert body == want[0] if not json_fmt else orjson.loads(body) == orjson.loads(want[0])
    res = None if not items else resume
    trail = b"\n" if res is None else b',"resume":"' + res.hex().encode() + b'"}\n'
    body, n, payload = C.render_framed(items, Rd.NDJSON_SEP, json_fmt, b"", trail, res is not None)
    want = Rd.render_ndjson_py(cs, json_fmt, None if res is None else res.hex().encode())
    assert (n, payload) == want[1:]
    if not json_fmt:
        assert body == want[0]
    else:
        assert [orjson.loads(x) for x in body.splitlines() if x] == \
            [orjson.loads(x) for x in want[0].splitlines() if x]


# -- json_valid ----------------------------------------------------------------------------------------------
def _orjson_accepts(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


@covers("_crecords.json_valid")
@fuzz(scale=5)
@given(S.json_bytes)
@example(b"1e400")
@example(b"[0, -1E309]")
@example(b'{"a": 2e308}')
def test_json_valid_is_what_the_python_path_parses(data: bytes) -> None:
    assert C.json_valid(data) is _orjson_accepts(data), data


# -- frame_buffer --------------------------------------------------------------------------------------------
@covers("_crecords.frame_buffer")
@fuzz()
@given(st.integers(-(2**40), 1 << 20))
def test_frame_buffer_is_a_bytearray_of_n(n: int) -> None:
    if n < 0:
        assert _outcome(C.frame_buffer, n) == "refused"
        return
    buf = C.frame_buffer(n)
    assert type(buf) is bytearray and len(buf) == n
    buf[:] = bytes(n)
    assert buf == bytearray(n)
