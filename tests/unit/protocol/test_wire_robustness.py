"""Wire robustness against Apache Kafka's behaviour (pure, no sockets):

1. an empty control batch (records count 0, as Kafka's log cleaner leaves a removed transaction marker on a
   compacted topic) is skipped like the Java consumer does, with both record decoders and in the
   read_committed filter;
2. a Fetch version below 7 (ApiVersions renegotiated after a reconnect) drops the fetch session: the
   handler builds full, sessionless requests instead of wedging;
3. the all-zero topic id in a v13+ Fetch response is no topic id: it is matched by name when the entry
   carries one, never reported as an unknown id, and otherwise makes the handler fall back to names (v12).
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest

from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED, TxnTracker, filter_batches
from service.fetch.session import (
    INITIAL,
    ZERO_UUID,
    FetchMetadata,
    FetchPartitionData,
    FetchRequestData,
    FetchSessionHandler,
    FetchSessionStateError,
    choose_version,
    to_fetch_request,
)
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M
from service.protocol import records as R
from service.protocol.records import Compression, ControlType

REQUIRE_CEXT = os.environ.get("KCG_REQUIRE_CEXT") == "1"
PID = 4242


@pytest.fixture(params=["c", "py"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    before = R.using_c_extension()
    if request.param == "c":
        if not R.C_EXTENSION_AVAILABLE:
            msg = f"C record decoder not importable: {R._C_IMPORT_ERROR}"
            if REQUIRE_CEXT:
                pytest.fail(msg + " (KCG_REQUIRE_CEXT=1)")
            pytest.skip(msg)
        R.use_c_extension(True)
    else:
        R.use_c_extension(False)
    try:
        yield request.param
    finally:
        R.use_c_extension(before)


# -- 1. empty control batches ---------------------------------------------------------------------------
def empty_control_batch(base_offset: int, *, offsets: int = 1, compression: int = 0, producer_id: int = PID,
                        section: bytes = b"") -> bytes:
    """A header-only control batch as Kafka's cleaner writes it (DefaultRecordBatch.writeEmptyHeader):
    records count 0, the original base offset and last offset delta, control + transactional."""
    raw = bytearray(R.build_batch([], base_offset=base_offset, control=True, transactional=True,
                                  producer_id=producer_id, producer_epoch=0, last_offset_delta=offsets - 1,
                                  base_timestamp=1_700_000_000_000))
    raw += section
    struct.pack_into(">i", raw, 8, len(raw) - R.LOG_OVERHEAD)
    attrs = struct.unpack_from(">h", raw, 21)[0]
    struct.pack_into(">h", raw, 21, attrs | compression)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(memoryview(raw)[21:]))
    return bytes(raw)


def data_batch(base_offset: int, values: list[bytes], *, producer_id: int = -1, transactional: bool = False) -> bytes:
    return R.build_batch([(None, v) for v in values], base_offset=base_offset, producer_id=producer_id,
                         producer_epoch=0 if producer_id >= 0 else -1, transactional=transactional,
                         base_timestamp=1_700_000_000_000)


def test_both_section_decoders_agree_on_an_empty_section(impl: str) -> None:
    buf = b"\x00" * 8
    for dec in (R._decode_section_py, *((R._crecords.decode_records,) if R._crecords is not None else ())):
        assert dec(buf, 8, 8, 0, 5, 0, None, R.Record) == []
        assert dec(buf, 0, 0, 0, 5, 0, 1, tuple) == []


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP, Compression.ZSTD])
def test_empty_control_batch_decodes_to_nothing(impl: str, compression: int) -> None:
    # A compression attribute with an empty section (nothing to decompress) is still an empty batch.
    blob = data_batch(0, [b"a", b"b"]) + empty_control_batch(2, compression=compression) + data_batch(3, [b"c"])
    rs = R.decode_records(blob, topic="t", partition=0)
    assert rs.error is None and len(rs.batches) == 3
    empty = rs.batches[1]
    assert empty.is_control and empty.records_count == 0 and empty.records == []
    assert empty.control_type is None  # no marker: not ABORT, not COMMIT, and no CorruptRecordError
    assert [r.value for r in rs.records()] == [b"a", b"b", b"c"]
    assert rs.next_offset == 4


def test_empty_batch_ignores_a_stray_section_like_java(impl: str) -> None:
    # DefaultRecordBatch.iterator() returns nothing for count 0 without looking at the records section.
    rs = R.decode_records(empty_control_batch(7, section=b"\x01\x02\x03"))
    assert rs.batches[0].records == [] and rs.batches[0].control_type is None and rs.next_offset == 8


@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_filter_skips_an_empty_control_batch(impl: str, isolation: int) -> None:
    # A transaction of PID is open (its first batch was delivered) when the empty batch comes by.
    blob = (data_batch(0, [b"t0", b"t1"], producer_id=PID, transactional=True)
            + empty_control_batch(2, offsets=3)
            + data_batch(5, [b"t5"], producer_id=PID, transactional=True)
            + R.build_control_batch(ControlType.COMMIT, base_offset=6, producer_id=PID, producer_epoch=0)
            + data_batch(7, [b"x7"]))
    batches = R.decode_records(blob).batches
    tracker = TxnTracker()
    res = filter_batches(batches, 0, isolation_level=isolation, aborted_transactions=[], last_stable_offset=8,
                         tracker=tracker)
    assert [r.value for r in res.records] == [b"t0", b"t1", b"t5", b"x7"]
    assert res.next_offset == 8 and res.control_batches == 2
    assert tracker.delivered_open == {} and tracker.aborted_after_delivery == 0


def test_filter_empty_control_batch_does_not_end_an_aborted_transaction(impl: str) -> None:
    blob = (data_batch(0, [b"a0"], producer_id=PID, transactional=True)
            + empty_control_batch(1)
            + data_batch(2, [b"a2"], producer_id=PID, transactional=True)
            + R.build_control_batch(ControlType.ABORT, base_offset=3, producer_id=PID, producer_epoch=0)
            + data_batch(4, [b"ok"]))
    batches = R.decode_records(blob).batches
    res = filter_batches(batches, 0, isolation_level=READ_COMMITTED, aborted_transactions=[(PID, 0)],
                         last_stable_offset=5, tracker=TxnTracker())
    assert [r.value for r in res.records] == [b"ok"] and res.next_offset == 5 and res.aborted_batches == 2


@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_filter_only_an_empty_control_batch_moves_the_position(impl: str, isolation: int) -> None:
    batches = R.decode_records(empty_control_batch(10, offsets=2)).batches
    res = filter_batches(batches, 10, isolation_level=isolation, aborted_transactions=[], last_stable_offset=12,
                         tracker=TxnTracker(delivered_open={PID: 3}))
    assert res.records == [] and res.next_offset == 12


# -- 2. Fetch below v7 mid-session ----------------------------------------------------------------------
_TopicResp = M.struct("FetchResponse", "FetchableTopicResponse")
_PartResp = M.struct("FetchResponse", "PartitionData")
ID_A = uuid.UUID("11111111-1111-1111-1111-111111111111")


def pd(partition: int, offset: int, topic_id: uuid.UUID = ID_A) -> FetchPartitionData:
    return FetchPartitionData(topic="a", topic_id=topic_id, partition=partition, fetch_offset=offset)


def build(h: FetchSessionHandler, parts: list[FetchPartitionData], max_version: int | None = None) -> FetchRequestData:
    b = h.builder()
    for p in parts:
        b.add(p)
    return b.build() if max_version is None else b.build(max_version=max_version)


def response(version: int, parts: list[int], *, session_id: int = 0, topic_id: uuid.UUID = ID_A,
             name: str = "a", wire: bool = True) -> Any:
    topic = _TopicResp(topic=name, topic_id=topic_id, partitions=[
        _PartResp(partition_index=p, error_code=0, high_watermark=9, last_stable_offset=9, log_start_offset=0,
                  records=None) for p in parts])
    resp = M.FetchResponse(throttle_time_ms=0, error_code=0, session_id=session_id, responses=[topic])
    if not wire:
        return resp
    frame = frames.encode_response(resp, version, correlation_id=1)
    return frames.decode_response(M.ApiKey.FETCH, version, frame[4:])


def encodes(data: FetchRequestData, version: int) -> Any:
    req = to_fetch_request(data, version=version, max_wait_ms=10, min_bytes=1)
    frame = frames.encode_request(req, version, correlation_id=3, client_id="c")
    return frames.decode_request(frame[4:])[1]


@pytest.mark.parametrize("low", [4, 5, 6])
def test_fetch_version_below_7_mid_session_goes_sessionless(low: int) -> None:
    h = FetchSessionHandler(node_id=1)
    build(h, [pd(0, 0), pd(1, 0)], max_version=17)
    assert h.handle_response(response(17, [0, 1], session_id=77), 17)
    assert h.metadata == FetchMetadata(77, 1)
    # Reconnected: ApiVersions now caps Fetch below 7. The request must be full (every partition) and
    # sendable at that version.
    data = build(h, [pd(0, 5), pd(1, 0)], max_version=low)
    assert data.is_full and data.metadata == INITIAL and set(data.to_send) == set(data.session_partitions)
    version = choose_version(low, data)
    assert version == low
    decoded = encodes(data, version)
    assert [(p.partition, p.fetch_offset) for t in decoded.topics for p in t.partitions] == [(0, 5), (1, 0)]
    assert h.handle_response(response(version, [0, 1]), version)
    assert h.metadata == INITIAL and not h.in_flight
    # Stays on full requests while the version is low; a session comes back once v7+ is negotiated again.
    assert build(h, [pd(0, 6), pd(1, 0)], max_version=low).is_full
    assert h.handle_response(response(low, [0, 1]), low)
    data = build(h, [pd(0, 6), pd(1, 0)], max_version=12)
    assert data.metadata == INITIAL
    assert h.handle_response(response(12, [0, 1], session_id=78), 12)
    assert h.metadata == FetchMetadata(78, 1)


def test_drop_session_refuses_while_in_flight() -> None:
    h = FetchSessionHandler()
    build(h, [pd(0, 0)])
    with pytest.raises(FetchSessionStateError):
        h.drop_session("test")


# -- 3. zero topic ids in v13+ responses ------------------------------------------------------------------
def established(version: int = 17) -> FetchSessionHandler:
    h = FetchSessionHandler(node_id=1)
    build(h, [pd(0, 0), pd(1, 0)])
    assert h.handle_response(response(version, [0, 1], session_id=77), version)
    return h


def test_zero_topic_id_is_matched_by_name_and_not_an_unknown_id() -> None:
    h = FetchSessionHandler(node_id=1)
    build(h, [pd(0, 0), pd(1, 0)])
    resp = response(17, [0, 1], session_id=77, topic_id=ZERO_UUID, wire=False)  # entry still has its name
    assert h.handle_response(resp, 17), h.last_problem
    assert set(h.response_partitions(resp, 17)) == {("a", 0), ("a", 1)}
    assert h.names_only  # and from now on the handler names topics
    data = build(h, [pd(0, 3), pd(1, 0)])
    assert not data.can_use_topic_ids and choose_version(17, data) == 12


def test_zero_topic_id_without_a_name_falls_back_to_names_v12() -> None:
    h = FetchSessionHandler(node_id=1)
    build(h, [pd(0, 0), pd(1, 0)])
    resp = response(17, [0, 1], session_id=77, topic_id=ZERO_UUID)  # from the wire: no name at v13+
    assert not h.handle_response(resp, 17)
    assert "zero topic id" in (h.last_problem or "") and "unknown topic ids" not in (h.last_problem or "")
    assert h.metadata == INITIAL and h.names_only
    data = build(h, [pd(0, 0), pd(1, 0)])
    assert data.is_full and choose_version(17, data) == 12
    assert h.handle_response(response(12, [0, 1], session_id=78), 12)
    assert h.metadata == FetchMetadata(78, 1)


def test_zero_topic_id_in_an_incremental_response_resets_the_session() -> None:
    h = established()
    build(h, [pd(0, 1), pd(1, 0)])
    assert not h.handle_response(response(17, [0], session_id=77, topic_id=ZERO_UUID), 17)
    assert h.metadata == FetchMetadata(77, 0)  # full request naming the old session, by names now
    assert choose_version(17, build(h, [pd(0, 1), pd(1, 0)])) == 12


def test_nonzero_unknown_topic_id_is_still_an_error() -> None:
    h = FetchSessionHandler(node_id=1)
    build(h, [pd(0, 0), pd(1, 0)])
    other = uuid.UUID("99999999-9999-9999-9999-999999999999")
    assert not h.handle_response(response(17, [0, 1], session_id=77, topic_id=other), 17)
    assert "unknown topic ids" in (h.last_problem or "") and not h.names_only


def test_top_level_106_is_a_session_error() -> None:
    h = established()
    build(h, [pd(0, 0), pd(1, 0)])
    resp = M.FetchResponse(throttle_time_ms=0, error_code=EC.FETCH_SESSION_TOPIC_ID_ERROR, session_id=0,
                           responses=[])
    assert not h.handle_response(resp, 17)
    assert h.metadata == FetchMetadata(77, 0)
