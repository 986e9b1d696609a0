"""service/fetch/ranges.py without sockets: paging cuts (end, max_bytes) and Arrow building."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.fetch.ranges import RangePage, arrow_schema, arrow_table, cut_page, effective_end, to_arrow_ipc
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED, filter_batches
from service.protocol.records import ControlType, Record, build_batch, build_control_batch, decode_records


def recs(offsets: list[int], size: int = 10) -> list[Record]:
    return [Record(o, 1_700_000_000_000 + o, None, b"v" * size, ()) for o in offsets]


def test_cut_at_end_moves_next_offset_to_end() -> None:
    got, nxt = cut_page(recs([5, 6, 8, 9, 12]), 13, end=9)
    assert [r.offset for r in got] == [5, 6, 8] and nxt == 9


def test_cut_keeps_a_gap_before_end() -> None:
    # a batch ending at 20 (compacted: only 5 and 6 left) with end 30: read on from 21
    got, nxt = cut_page(recs([5, 6]), 21, end=30)
    assert [r.offset for r in got] == [5, 6] and nxt == 21
    # the filter's next offset past the end (a control batch straddles it) is clamped
    got, nxt = cut_page(recs([5, 6]), 40, end=30)
    assert nxt == 30


def test_max_bytes_trims_but_returns_at_least_one_record() -> None:
    rs = recs(list(range(10)), size=100)
    got, nxt = cut_page(rs, 10, end=100, max_bytes=250, fetched_bytes=5000)
    assert [r.offset for r in got] == [0, 1] and nxt == 2
    got, nxt = cut_page(rs, 10, end=100, max_bytes=1, fetched_bytes=5000)
    assert [r.offset for r in got] == [0] and nxt == 1
    # the fetch itself was within max_bytes: nothing to trim
    got, nxt = cut_page(rs, 10, end=100, max_bytes=250, fetched_bytes=200)
    assert len(got) == 10 and nxt == 10


@pytest.mark.parametrize(("requested", "iso", "want"), [
    (None, READ_COMMITTED, 7), (None, READ_UNCOMMITTED, 10), (5, READ_COMMITTED, 5), (9, READ_COMMITTED, 7),
    (12, READ_UNCOMMITTED, 10)])
def test_effective_end(requested: int | None, iso: int, want: int) -> None:
    assert effective_end(requested, iso, high_watermark=10, last_stable_offset=7) == want


def test_paging_loop_over_an_aborted_transaction_spanning_pages() -> None:
    """The loop a client runs, on a log held in memory: each 'fetch' returns two batches from the position
    with the aborted-transaction entries overlapping them, as a Kafka broker would."""
    pid = 7
    batches = [
        build_batch([(None, b"n0")], base_offset=0),
        build_batch([(None, b"a0")], base_offset=1, producer_id=pid, producer_epoch=0, transactional=True),
        build_batch([(None, b"a1")], base_offset=2, producer_id=pid, producer_epoch=0, transactional=True),
        build_batch([(None, b"a2")], base_offset=3, producer_id=pid, producer_epoch=0, transactional=True),
        build_control_batch(ControlType.ABORT, base_offset=4, producer_id=pid, producer_epoch=0),
        build_batch([(None, b"n1"), (None, b"n2")], base_offset=5),
    ]
    aborted = [(pid, 1)]  # (producer id, first offset); last offset 4
    hw = 7
    pos, got, pages = 0, [], 0
    while pos < hw:
        decoded = [b for raw in batches for b in decode_records(raw).batches if b.next_offset > pos][:2]
        overlapping = [a for a in aborted if a[1] <= decoded[-1].last_offset and 4 >= pos]
        res = filter_batches(decoded, pos, isolation_level=READ_COMMITTED, aborted_transactions=overlapping,
                             last_stable_offset=hw)
        page, nxt = cut_page(res.records, res.next_offset, hw)
        got += [r.value for r in page]
        assert nxt > pos
        pos, pages = nxt, pages + 1
    assert got == [b"n0", b"n1", b"n2"] and pages == 3  # [0, 2), [2, 4), [4, 7): the transaction spans all three


def test_arrow_table_columns_and_types() -> None:
    rs = [Record(3, 1000, b"k", b"v1", ()), Record(5, 2000, None, None, (("h", b"x"), ("n", None))),
          Record(6, 3000, b"", b"", ())]
    t = arrow_table("orders", 2, rs, {"next_offset": "7"})
    assert t.schema.equals(arrow_schema(), check_metadata=False)
    assert t.schema.metadata[b"next_offset"] == b"7"
    d = t.to_pydict()
    assert d["topic"] == ["orders"] * 3 and d["partition"] == [2, 2, 2] and d["offset"] == [3, 5, 6]
    assert [ts.timestamp() for ts in d["timestamp"]] == [1.0, 2.0, 3.0]
    assert d["key"] == [b"k", None, b""] and d["value"] == [b"v1", None, b""]
    assert d["headers"] == [[], [{"key": "h", "value": b"x"}, {"key": "n", "value": None}], []]


def test_arrow_table_without_headers_uses_empty_lists() -> None:
    t = arrow_table("t", 0, recs(list(range(1000))), None)
    h = t.column("headers").combine_chunks()
    assert h.null_count == 0 and pc.sum(pc.list_value_length(h)).as_py() == 0
    assert t.column("topic").combine_chunks().dictionary.to_pylist() == ["t"]


def test_arrow_ipc_stream_roundtrip_and_empty_page() -> None:
    page = RangePage("t", 1, 10, recs([10, 11]), next_offset=14, end_offset=20, high_watermark=20,
                     last_stable_offset=20, log_start_offset=0)
    reader = pa.ipc.open_stream(to_arrow_ipc(page))
    table = reader.read_all()
    assert table.column("offset").to_pylist() == [10, 11]
    assert reader.schema.metadata[b"next_offset"] == b"14" and reader.schema.metadata[b"end_offset"] == b"20"
    empty = RangePage("t", 1, 20, [], next_offset=20, end_offset=20, high_watermark=20, last_stable_offset=20,
                      log_start_offset=0)
    reader = pa.ipc.open_stream(to_arrow_ipc(empty))
    assert reader.read_all().num_rows == 0 and reader.schema.metadata[b"next_offset"] == b"20"


_headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=3)


@settings(deadline=None)  # the first example pays pyarrow's lazy initialisation (317 ms once in CI)
@given(st.lists(_headers, min_size=1, max_size=30))
def test_headers_column_equals_pyarrows_own_conversion(hs: list[list[tuple[str, bytes | None]]]) -> None:
    rs = [Record(i, 1000 + i, None, b"v", tuple(h)) for i, h in enumerate(hs)]
    t = arrow_table("t", 0, rs)
    htype = arrow_schema().field("headers").type
    want = pa.array([[{"key": k, "value": v} for k, v in h] for h in hs], htype)
    got = t.column("headers").combine_chunks()
    got.validate(full=True)
    assert got.equals(want)


async def test_an_empty_fetch_below_the_end_is_asked_again_with_a_longer_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy broker (Tansu) may answer before it has read the log: no batches although the offset is below
    the high watermark. The page asks again with a longer wait; only MAX_ROUNDS empty answers are an error."""
    from types import SimpleNamespace

    from service.client.errors import KafkaError
    from service.consumer.subscription import TopicPartition
    from service.fetch import ranges

    data = build_batch([(None, b"v0"), (None, b"v1")], base_offset=0)
    answers: list[bytes] = []
    waits: list[int] = []

    async def fake_fetch(client: object, tp: object, offset: int, isolation: int, max_bytes: int,
                         max_wait_ms: int = ranges.FETCH_WAIT_MS) -> SimpleNamespace:
        waits.append(max_wait_ms)
        return SimpleNamespace(error_code=0, high_watermark=2, last_stable_offset=2, log_start_offset=0,
                               records=answers.pop(0) if answers else b"", aborted_transactions=None)

    monkeypatch.setattr(ranges, "_fetch_with_leader", fake_fetch)
    answers[:] = [b"", b"", data]
    page = await ranges.read_page(object(), TopicPartition("t", 0), 0)  # type: ignore[arg-type]
    assert [r.value for r in page.records] == [b"v0", b"v1"] and page.next_offset == 2 and page.fetches == 3
    assert waits == [ranges.FETCH_WAIT_MS, ranges.FETCH_WAIT_MS * 4, ranges.FETCH_WAIT_MS * 16]
    waits.clear()
    with pytest.raises(KafkaError, match="returned nothing below 2"):
        await ranges.read_page(object(), TopicPartition("t", 0), 0)  # type: ignore[arg-type]
    assert len(waits) == ranges.MAX_ROUNDS and max(waits) == ranges.MAX_RETRY_WAIT_MS
