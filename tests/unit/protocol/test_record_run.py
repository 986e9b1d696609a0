"""RecordRun: a partition's records indexed in one bytes object, rendered by C straight from it.

Differential: a run built from batches holds exactly the records decode_records makes of them (item by item,
slices, payload, take_budget), renders byte-identical to the list path (binary and json, array and ndjson
framings), and the fetcher's run path buffers the same records with the same next offset and epoch as the
decode_records + filter_batches path, which it leaves every unusual case to."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v2 import render as Rd
from service.consumer.subscription import TopicPartition
from service.fetch import fetcher as F
from service.fetch.read_committed import filter_batches
from service.protocol import records as R
from service.protocol.records import Record, build_batch, decode_records

C = R._crecords
pytestmark = pytest.mark.skipif(C is None or not hasattr(C, "RecordRun"), reason="C accelerator not built")
TP = TopicPartition("t", 0)

payload = st.one_of(st.none(), st.binary(max_size=40),
                    st.sampled_from([b'{"a": 1}', b"[1,\n2]", b'"x"', b"not json", b"", b'{"k":"\\u00e9"}']))
header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=12)))
record = st.tuples(payload, payload, st.lists(header, max_size=3), st.integers(0, 10**6))


def _blob(batches: list[list[tuple[Any, ...]]], base: int = 0, log_append: bool = False) -> bytes:
    """Batches of (key, value, headers, timestamp delta) records, offsets from ``base``."""
    out = b""
    off = base
    for recs in batches:
        rows = [Record(off + i, 1_700_000_000_000 + ts, k, v, tuple(h)) for i, (k, v, h, ts) in enumerate(recs)]
        out += build_batch(rows, base_offset=off, log_append_time=log_append, partition_leader_epoch=3)
        off += len(recs)
    return out


def _run(blob: bytes) -> Any:
    run = C.RecordRun(blob, Record)
    for b in R.iter_batches(blob):
        run.add(b._start, b._end, b.records_count, b.base_offset, b.base_timestamp,
                b.max_timestamp if b.attributes & 0x08 else None)
    return run


def _listed(blob: bytes) -> list[Record]:
    return list(decode_records(blob).records())


batches = st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(batches, st.booleans())
def test_run_holds_the_decoded_records_and_renders_the_same_bytes(bs: list[list[tuple[Any, ...]]],
                                                                  log_append: bool) -> None:
    blob = _blob(bs, base=5, log_append=log_append)
    run, recs = _run(blob), _listed(blob)
    assert len(run) == len(recs) and list(run) == recs and run == recs
    assert [run[i] for i in range(-len(recs), len(recs))] == recs + recs
    assert all(type(r) is Record for r in run)
    for i in range(len(recs) + 1):
        for j in range(i, len(recs) + 1):
            assert run[i:j] == recs[i:j]
            assert run[i:j].payload() == F._payload_from(recs[i:j], 0)
    assert run[::2] == recs[::2]
    assert run.payload(1) == F._payload_from(recs, 1)
    assert run.offset(-1) == recs[-1].offset
    for budget in (0, 1, 10, 50, 10**6):
        for started in (False, True):
            assert C.take_budget(run, 0, len(recs), budget, started) == \
                C.take_budget(recs, 0, len(recs), budget, started)
    half = len(recs) // 2
    for json_fmt in (False, True):
        for a, b in ((run, recs), (run[half:], recs[half:])):
            assert C.render(a, b"H", b",", json_fmt) == C.render(b, b"H", b",", json_fmt)
            assert C.render_framed([(a, b"H"), (b, b"G")], b"\n", json_fmt, b"[", b"]", True) == \
                C.render_framed([(b, b"H"), (b, b"G")], b"\n", json_fmt, b"[", b"]", True)
        body, n, pay = Rd.render_array([(TP, run)], json_fmt)
        assert (body, n, pay) == Rd.render_array_py([(TP, recs)], json_fmt)
        json.loads(body)


def test_run_refuses_corrupt_sections_and_growth_after_slicing() -> None:
    blob = _blob([[(None, b"v", [], 0)] * 3])
    (b,) = list(R.iter_batches(blob))
    run = C.RecordRun(blob, Record)
    with pytest.raises(ValueError):
        run.add(b._start, b._end - 1, b.records_count, 0, 0, None)
    with pytest.raises(ValueError):
        run.add(b._start, b._end, b.records_count + 1, 0, 0, None)
    assert len(run) == 0  # a failed add leaves nothing behind
    run.add(b._start, b._end, b.records_count, 0, 0, None)
    view = run[1:]
    assert len(view) == 2 and view[0].offset == 1
    with pytest.raises(TypeError):
        run.add(b._start, b._end, b.records_count, 0, 0, None)
    with pytest.raises(IndexError):
        run[3]
    # a header key that is not UTF-8 is refused like decode_records refuses it
    rows = [Record(0, 0, None, b"v", (("k", b"x"),))]
    hb = bytearray(build_batch(rows))
    i = hb.index(b"kx" if b"kx" in hb else b"k")
    hb[i] = 0xFF
    (hbatch,) = list(R.iter_batches(bytes(hb), verify_crc=False))
    with pytest.raises(ValueError):
        C.RecordRun(bytes(hb), Record).add(hbatch._start, hbatch._end, 1, 0, 0, None)


class _Part:
    def __init__(self, raw: bytes, lso: int = -1) -> None:
        self.records = raw
        self.error_code = 0
        self.high_watermark = 10**9
        self.last_stable_offset = lso
        self.log_start_offset = 0
        self.aborted_transactions = None


def _slow(raw: bytes, fetch_offset: int, limit: int | None) -> tuple[list[Record], int]:
    rs = decode_records(raw, defer_errors=True)
    res = filter_batches(rs.batches, fetch_offset, isolation_level=1 if limit is not None else 0,
                         last_stable_offset=limit if limit is not None else -1)
    return res.records, res.next_offset


@settings(max_examples=100, deadline=None)
@given(batches, st.integers(0, 30), st.one_of(st.none(), st.integers(0, 30)), st.integers(0, 200))
def test_run_path_agrees_with_decode_and_filter(bs: list[list[tuple[Any, ...]]], fetch_offset: int,
                                                limit: int | None, cut: int) -> None:
    blob = _blob(bs)
    raw = blob[:len(blob) - cut] if cut < len(blob) else blob
    fast = F._run_of(raw, TP, fetch_offset, limit, 64 << 20)
    recs, nxt = _slow(raw, fetch_offset, limit)
    if fast is not None:  # whenever the run path answers, it answers what the slow path does
        run, fnxt, epoch = fast
        assert run == recs and fnxt == nxt and len(run) > 0 and epoch == 3


def test_run_path_takes_the_common_case_and_leaves_the_unusual_ones() -> None:
    blob = _blob([[(None, b"v%d" % i, [], 0) for i in range(5)]] * 3)
    assert F._run_of(blob, TP, 0, None, 64 << 20) is not None
    assert F._run_of(blob, TP, 0, 15, 64 << 20) is not None
    assert F._run_of(blob, TP, 2, None, 64 << 20) is None  # positioned inside the first batch
    assert F._run_of(blob, TP, 0, 12, 64 << 20) is None  # the LSO cuts a batch
    assert F._run_of(blob[:40], TP, 0, None, 64 << 20) is None  # no whole batch
    run, nxt, _ = F._run_of(blob, TP, 0, None, 1)  # the inflated budget stops after the first batch
    assert len(run) == 5 and nxt == 5
    gz = build_batch([Record(0, 0, None, b"v", ())], compression=1)
    assert F._run_of(gz, TP, 0, None, 64 << 20) is None
    ctl = R.build_control_batch(R.ControlType.COMMIT, base_offset=0, producer_id=1, producer_epoch=0)
    assert F._run_of(ctl, TP, 0, None, 64 << 20) is None
    txn = build_batch([Record(0, 0, None, b"v", ())], producer_id=1, producer_epoch=0, base_sequence=0,
                      transactional=True)
    assert F._run_of(txn, TP, 0, None, 64 << 20) is None
    corrupt = bytearray(blob)
    corrupt[-1] ^= 1
    assert F._run_of(bytes(corrupt), TP, 0, None, 64 << 20) is None  # CRC: the slow path reports it


def test_an_unusual_first_batch_is_declined_before_any_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compressed or transactional partition goes the decode_records way without the run's copy and walk."""
    def no_run(*_: Any) -> Any:
        raise AssertionError("the partition was copied into a run")

    monkeypatch.setattr(F, "_RecordRun", no_run)
    gz = build_batch([Record(0, 0, None, b"v", ())] * 3, compression=1)
    txn = build_batch([Record(0, 0, None, b"v", ())], producer_id=1, producer_epoch=0, base_sequence=0,
                      transactional=True)
    plain = _blob([[(None, b"v", [], 0)]])
    for data in (gz, txn, gz + plain, memoryview(txn + plain)):
        assert F._run_of(data, TP, 0, None, 64 << 20) is None
    with pytest.raises(AssertionError, match="copied"):
        F._run_of(plain, TP, 0, None, 64 << 20)  # the common case still takes the run
