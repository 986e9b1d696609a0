"""The test broker's data path alone: partition logs, Fetch (sessions, read_committed, KIP-74, errors,
long polls), ListOffsets and Produce, driven with raw frames of our own codecs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol.messages import ApiKey
from service.protocol.records import ControlType, build_batch, decode_records
from tests.fakes.broker import TestCluster, default_registry
from tests.fakes.broker.fetch_sessions import FetchSessionCache, ManualClock
from tests.fakes.broker.partition_log import AbortedTxn, InvalidBatchError, PartitionLog
from tests.unit.fakes.test_test_broker import RawClient

FetchTopic = M.struct("FetchRequest", "FetchTopic")
FetchPartition = M.struct("FetchRequest", "FetchPartition")
ForgottenTopic = M.struct("FetchRequest", "ForgottenTopic")
ListTopic = M.struct("ListOffsetsRequest", "ListOffsetsTopic")
ListPartition = M.struct("ListOffsetsRequest", "ListOffsetsPartition")
ProduceTopic = M.struct("ProduceRequest", "TopicProduceData")
ProducePartition = M.struct("ProduceRequest", "PartitionProduceData")

V = 17  # topic ids
V_NAMES = 12  # topic names

Part = tuple[int, int] | tuple[int, int, int] | tuple[int, int, int, int]  # partition, offset[, max bytes[, epoch]]


def fetch_request(cluster: TestCluster, version: int, topics: dict[str, Sequence[Part]], *, session_id: int = 0,
                  epoch: int = -1, forgotten: dict[str, list[int]] | None = None, isolation: int = 0,
                  max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 50 * 1024 * 1024,
                  topic_ids: dict[str, uuid.UUID] | None = None) -> Any:
    def tid(name: str) -> uuid.UUID:
        if topic_ids and name in topic_ids:
            return topic_ids[name]
        return cluster.topic(name).topic_id if name in cluster.state.topics else uuid.UUID(int=0)

    reqs = []
    for name, parts in topics.items():
        fps = []
        for part in parts:
            p, off = part[0], part[1]
            mb = part[2] if len(part) > 2 else 1024 * 1024  # type: ignore[misc]
            le = part[3] if len(part) > 3 else -1  # type: ignore[misc]
            fps.append(FetchPartition(partition=p, fetch_offset=off, partition_max_bytes=mb, current_leader_epoch=le))
        reqs.append(FetchTopic(topic=name, topic_id=tid(name), partitions=fps))
    forg = [ForgottenTopic(topic=n, topic_id=tid(n), partitions=ps) for n, ps in (forgotten or {}).items()]
    return M.FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                          isolation_level=isolation, session_id=session_id, session_epoch=epoch, topics=reqs,
                          forgotten_topics_data=forg)


def parts_of(resp: Any, cluster: TestCluster | None = None) -> dict[tuple[str, int], Any]:
    out = {}
    for t in resp.responses:
        name = t.topic
        if cluster is not None and t.topic_id is not None and t.topic_id.int != 0:
            name = cluster.state.topics_by_id[t.topic_id].name
        for p in t.partitions:
            out[(name, p.partition_index)] = p
    return out


def values(records: bytes | None) -> list[bytes | None]:
    return [r.value for r in decode_records(records or b"").records()]


async def connect(cluster: TestCluster, node_id: int = 0) -> RawClient:
    return await RawClient.connect(cluster.broker(node_id).address)


async def fetch(c: RawClient, req: Any, version: int = V) -> Any:
    return await c.request(req, version)


# -- partition log ---------------------------------------------------------------------------------
def test_partition_log_offsets_transactions_and_index() -> None:
    log = PartitionLog()
    assert log.append_records([b"a", b"b"]).base_offset == 0
    assert log.append_records([b"t1"], producer_id=7, transactional=True).base_offset == 2
    assert (log.high_watermark, log.last_stable_offset) == (3, 2)
    log.append_records([b"t2"], producer_id=8, transactional=True)
    log.append_records([b"t1b"], producer_id=7, transactional=True)
    assert log.ongoing == {7: 2, 8: 3}
    assert log.end_txn(8, commit=False).base_offset == 5
    assert log.last_stable_offset == 2
    assert log.end_txn(7, commit=False).base_offset == 6
    assert log.last_stable_offset == log.high_watermark == 7
    # index order is marker order: not sorted by first offset
    assert log.aborted == [AbortedTxn(8, 3, 5), AbortedTxn(7, 2, 6)]
    assert log.aborted_between(6, 7) == [AbortedTxn(7, 2, 6)]
    assert log.aborted_between(3, 4) == [AbortedTxn(8, 3, 5), AbortedTxn(7, 2, 6)]
    assert log.aborted_between(0, 3) == [AbortedTxn(7, 2, 6)]
    assert log.aborted_between(7, 8) == []
    # an abort without data still enters the index, first offset = the marker's
    assert log.end_txn(9, commit=False).base_offset == 7
    assert log.aborted[-1] == AbortedTxn(9, 7, 7)
    markers = [b for b in log.batches if b.control]
    assert [b.control_type for b in markers] == [ControlType.ABORT] * 3
    log.truncate_start(6)
    assert log.log_start_offset == 6 and log.batches[0].base_offset == 6
    assert log.aborted == [AbortedTxn(7, 2, 6), AbortedTxn(9, 7, 7)]
    with pytest.raises(ValueError):
        log.truncate_start(99)


def test_partition_log_read_limits_and_rejects() -> None:
    log = PartitionLog()
    big = log.append_records([b"x" * 500])
    small = log.append_records([b"y"])
    got, data = log.read(0, 100, log.high_watermark)
    assert got == [] and data == b""
    got, data = log.read(0, 100, log.high_watermark, min_one=True)  # KIP-74
    assert got == [big] and len(data) == big.size
    got, data = log.read(0, 100, log.high_watermark, partial=True)
    assert got == [] and data == big.data[:100]
    got, _ = log.read(1, 10_000, log.high_watermark)
    assert got == [small]
    got, _ = log.read(0, 10_000, 1)  # upper bound
    assert got == [big]
    with pytest.raises(InvalidBatchError):
        log.append_batch(build_batch([(None, b"a")]) * 2)  # two batches
    corrupt = bytearray(build_batch([(None, b"a")]))
    corrupt[-1] ^= 0xFF
    with pytest.raises(InvalidBatchError) as info:
        log.append_batch(bytes(corrupt))
    assert info.value.error_code == 2


def test_timestamp_lookup() -> None:
    log = PartitionLog()
    log.append_records([(None, b"a", (), 1000), (None, b"b", (), 2000)])
    log.append_records([(None, b"c", (), 3000)])
    assert log.offset_for_timestamp(1500) is not None and log.offset_for_timestamp(1500).offset == 1  # type: ignore[union-attr]
    assert log.offset_for_timestamp(3000).offset == 2  # type: ignore[union-attr]
    assert log.offset_for_timestamp(3001) is None
    assert log.offset_for_timestamp(2500, upper_bound=2) is None
    assert log.max_timestamp_offset() == (3000, 2, 0)


# -- fetch sessions --------------------------------------------------------------------------------
async def test_full_fetch_creates_a_session_and_incremental_sends_only_changes() -> None:
    async with TestCluster(topics={"t": 3}) as cluster:
        for p in range(3):
            cluster.append("t", p, [b"a", b"b"])
        c = await connect(cluster)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0), (2, 0)]}, epoch=0))
        assert resp.error_code == 0 and resp.session_id != 0
        sid = resp.session_id
        assert {k: values(p.records) for k, p in parts_of(resp, cluster).items()} == {
            ("t", 0): [b"a", b"b"], ("t", 1): [b"a", b"b"], ("t", 2): [b"a", b"b"]}
        [session] = cluster.fetch_sessions()
        assert (session.id, session.epoch, session.size) == (sid, 1, 3)
        # incremental with new offsets for all: nothing new → no partitions at all
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 2), (1, 2), (2, 2)]}, session_id=sid, epoch=1))
        assert resp.error_code == 0 and resp.session_id == sid and resp.responses == []
        # data on partition 1 only; the request names nothing (the session remembers the offsets)
        cluster.append("t", 1, [b"c"])
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=2))
        got = parts_of(resp, cluster)
        assert list(got) == [("t", 1)] and values(got[("t", 1)].records) == [b"c"]
        assert got[("t", 1)].high_watermark == 3
        # a partition that returned records moves to the end of the session's read order
        assert [k[1] for k in session.keys()] == [0, 2, 1]
        # a log start change alone is reported (no records)
        cluster.truncate_start("t", 2, 1)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(1, 3)]}, session_id=sid, epoch=3))
        got = parts_of(resp, cluster)
        assert list(got) == [("t", 2)] and got[("t", 2)].log_start_offset == 1 and not got[("t", 2)].records
        # an error is always reported, and again until it is gone
        for ep in (4, 5):
            resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 10)]} if ep == 4 else {}, session_id=sid,
                                                epoch=ep))
            got = parts_of(resp, cluster)
            assert list(got) == [("t", 0)] and got[("t", 0)].error_code == EC.OFFSET_OUT_OF_RANGE
            assert got[("t", 0)].high_watermark == -1
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 2)]}, session_id=sid, epoch=6))
        got = parts_of(resp, cluster)
        assert list(got) == [("t", 0)] and got[("t", 0)].error_code == 0 and got[("t", 0)].high_watermark == 2
        stats = cluster.fetch_session_stats()
        assert (stats.created, stats.full, stats.incremental, stats.evicted) == (1, 1, 6, 0)
        await c.close()


async def test_incremental_reports_a_high_watermark_change_without_records() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        c = await connect(cluster)
        sid = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0)]}, isolation=1, epoch=0))).session_id
        cluster.append_txn("t", 1, [b"open"], producer_id=9)  # HW 1, LSO 0: nothing readable
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=1, isolation=1))
        [(key, p)] = parts_of(resp, cluster).items()
        assert key == ("t", 1) and p.records == b""
        assert (p.high_watermark, p.last_stable_offset) == (1, 0)
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=2, isolation=1))
        assert resp.responses == []  # reported once
        cluster.end_txn("t", 0, 9, commit=True)  # a marker alone on partition 0: HW 1
        cluster.end_txn("t", 1, 9, commit=False)
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=3, isolation=1))
        got = parts_of(resp, cluster)
        assert sorted(got) == [("t", 0), ("t", 1)]
        assert [(p.high_watermark, p.last_stable_offset) for p in got.values()] == [(1, 1), (2, 2)]
        assert [(a.producer_id, a.first_offset) for a in got[("t", 1)].aborted_transactions] == [(9, 0)]
        await c.close()


async def test_forgotten_partitions_and_emptied_session() -> None:
    async with TestCluster(topics={"t": 2, "u": 1}) as cluster:
        c = await connect(cluster)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0)], "u": [(0, 0)]}, epoch=0))
        sid = resp.session_id
        session = cluster.fetch_session(sid)
        assert session is not None and session.size == 3
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=1, forgotten={"t": [0, 1]}))
        assert resp.session_id == sid and session.size == 1
        cluster.append("t", 0, [b"x"])  # forgotten: not read any more
        cluster.append("u", 0, [b"y"])
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=2))
        assert list(parts_of(resp, cluster)) == [("u", 0)]
        # forgetting the last partition closes the session; the answer is sessionless
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=3, forgotten={"u": [0]}))
        assert resp.error_code == 0 and resp.session_id == 0 and resp.responses == []
        assert cluster.fetch_sessions() == [] and cluster.fetch_session_stats().closed == 1
        await c.close()


async def test_session_errors_70_71_and_topic_id_mismatch() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        c = await connect(cluster)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, session_id=12345, epoch=3))
        assert (resp.error_code, resp.session_id, resp.responses) == (EC.FETCH_SESSION_ID_NOT_FOUND, 0, [])
        sid = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))).session_id
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=2))
        assert (resp.error_code, resp.session_id, resp.responses) == (EC.INVALID_FETCH_SESSION_EPOCH, 0, [])
        session = cluster.fetch_session(sid)
        assert session is not None and session.epoch == 1  # untouched by the bad request
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=1))
        assert resp.error_code == 0 and session.epoch == 2
        # a session created with topic ids cannot go on with topic names
        resp = await fetch(c, fetch_request(cluster, V_NAMES, {}, session_id=sid, epoch=2), V_NAMES)
        assert resp.error_code == EC.FETCH_SESSION_TOPIC_ID_ERROR
        assert cluster.fetch_session_stats().errors == {70: 1, 71: 1, 106: 1}
        await c.close()


async def test_final_epoch_and_close_existing() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        cluster.append("t", 0, [b"a"])
        c = await connect(cluster)
        # epoch -1, id 0: sessionless, full data
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=-1))
        assert resp.session_id == 0 and values(parts_of(resp, cluster)[("t", 0)].records) == [b"a"]
        assert cluster.fetch_sessions() == []
        sid = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))).session_id
        # epoch 0 naming a session: it is closed and a new one created
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 1)]}, session_id=sid, epoch=0))
        sid2 = resp.session_id
        assert sid2 not in (0, sid) and [s.id for s in cluster.fetch_sessions()] == [sid2]
        # epoch -1 naming a session: closed, answered sessionless
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, session_id=sid2, epoch=-1))
        assert resp.session_id == 0 and values(parts_of(resp, cluster)[("t", 0)].records) == [b"a"]
        assert cluster.fetch_sessions() == []
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid2, epoch=1))
        assert resp.error_code == EC.FETCH_SESSION_ID_NOT_FOUND
        # versions without sessions are always sessionless
        resp = await fetch(c, fetch_request(cluster, 6, {"t": [(0, 0)]}), 6)
        assert values(parts_of(resp)[("t", 0)].records) == [b"a"] and cluster.fetch_sessions() == []
        await c.close()


async def test_sessions_with_topic_names_v12() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        cluster.append("t", 1, [b"a"])
        c = await connect(cluster)
        resp = await fetch(c, fetch_request(cluster, V_NAMES, {"t": [(0, 0), (1, 0)]}, epoch=0), V_NAMES)
        sid = resp.session_id
        assert sid and parts_of(resp)[("t", 1)].records
        cluster.append("t", 0, [b"b"])
        resp = await fetch(c, fetch_request(cluster, V_NAMES, {"t": [(1, 1)]}, session_id=sid, epoch=1,
                                            forgotten={}), V_NAMES)
        assert list(parts_of(resp)) == [("t", 0)]
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=2))
        assert resp.error_code == EC.FETCH_SESSION_TOPIC_ID_ERROR
        await c.close()


async def test_cache_full_answers_session_id_zero() -> None:
    async with TestCluster(topics={"t": 2}, fetch_session_cache_slots=1) as cluster:
        c = await connect(cluster)
        first = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))
        assert first.session_id != 0
        second = await fetch(c, fetch_request(cluster, V, {"t": [(1, 0)]}, epoch=0))  # same size: no eviction
        assert second.error_code == 0 and second.session_id == 0 and list(parts_of(second, cluster)) == [("t", 1)]
        stats = cluster.fetch_session_stats()
        assert (stats.created, stats.not_created, stats.evicted) == (1, 1, 0)
        await c.close()


async def test_sessions_disabled_like_tansu() -> None:
    async with TestCluster(topics={"t": 1}, fetch_sessions=False) as cluster:
        c = await connect(cluster)
        for _ in range(2):
            resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))
            assert resp.error_code == 0 and resp.session_id == 0 and list(parts_of(resp, cluster)) == [("t", 0)]
        assert cluster.fetch_sessions() == []
        await c.close()


async def test_lru_eviction_of_an_idle_session() -> None:
    clock = ManualClock()
    async with TestCluster(topics={"t": 3}, fetch_session_cache_slots=1, fetch_session_clock=clock) as cluster:
        c = await connect(cluster)
        old = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0), (2, 0)]}, epoch=0))).session_id
        clock.advance(120_000)  # idle exactly 120 s: not yet stale, and a smaller newcomer cannot evict it
        assert (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))).session_id == 0
        clock.advance(1)
        new = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))).session_id
        assert new not in (0, old)
        assert [s.id for s in cluster.fetch_sessions()] == [new]
        stats = cluster.fetch_session_stats()
        assert (stats.evicted, stats.evicted_stale) == (1, 1)
        resp = await fetch(c, fetch_request(cluster, V, {}, session_id=old, epoch=1))
        assert resp.error_code == EC.FETCH_SESSION_ID_NOT_FOUND
        await c.close()


async def test_a_bigger_newcomer_evicts_the_least_valuable_session() -> None:
    clock = ManualClock()
    async with TestCluster(topics={"t": 4}, fetch_session_cache_slots=2, fetch_session_clock=clock) as cluster:
        c = await connect(cluster)
        one = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))).session_id
        two = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0)]}, epoch=0))).session_id
        # young sessions are not evictable by size, even by a bigger newcomer
        assert (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0), (2, 0)]}, epoch=0))).session_id == 0
        # both sessions stay in use beyond the eviction time: they become evictable by size
        for step in range(3):
            clock.advance(50_000)
            for sid in (one, two):
                session = cluster.fetch_session(sid)
                assert session is not None
                resp = await fetch(c, fetch_request(cluster, V, {}, session_id=sid, epoch=session.epoch))
                assert resp.error_code == 0, step
        # a newcomer no bigger than the smallest session cannot evict it
        assert (await fetch(c, fetch_request(cluster, V, {"t": [(3, 0)]}, epoch=0))).session_id == 0
        # strictly more partitions than the smallest: that one goes
        big = (await fetch(c, fetch_request(cluster, V, {"t": [(0, 0), (1, 0)]}, epoch=0))).session_id
        assert big != 0
        assert sorted(s.id for s in cluster.fetch_sessions()) == sorted([two, big])
        stats = cluster.fetch_session_stats()
        assert (stats.evicted, stats.evicted_by_size, stats.not_created) == (1, 1, 2)
        await c.close()


def test_session_cache_privileged_rules() -> None:
    clock = ManualClock()
    cache = FetchSessionCache(1, 1000, clock=clock)
    consumer = cache.maybe_create(clock(), False, {}, True)
    assert consumer
    # a follower (privileged) session may evict a young consumer session
    follower = cache.maybe_create(clock(), True, {}, True)
    assert follower and cache.get(consumer) is None
    # but a consumer may not evict a young follower session
    assert cache.maybe_create(clock(), False, {}, True) == 0


# -- reading ---------------------------------------------------------------------------------------
async def test_kip74_oversized_first_batch_and_byte_limits() -> None:
    async with TestCluster(topics={"t": 3}) as cluster:
        cluster.append("t", 0, [b"x" * 1000])
        cluster.append("t", 0, [b"y"])
        cluster.append("t", 1, [b"z" * 1000])
        cluster.append("t", 2, [b"w"])
        c = await connect(cluster)
        # partition 0 first: its first batch comes whole despite 100-byte limits; the others get nothing
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0, 100), (1, 0, 100), (2, 0, 100)]}, max_bytes=100))
        got = parts_of(resp, cluster)
        assert values(got[("t", 0)].records) == [b"x" * 1000]
        assert got[("t", 1)].records == b"" and got[("t", 2)].records == b""
        # an empty partition first does not use up the "at least one batch" allowance
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(2, 1, 100), (1, 0, 100)]}))
        got = parts_of(resp, cluster)
        assert got[("t", 2)].records == b"" and values(got[("t", 1)].records) == [b"z" * 1000]
        # partition max bytes: whole batches only
        size0 = len(cluster.partition_log("t", 0).batches[0].data)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0, size0 + 10)]}))
        assert values(parts_of(resp, cluster)[("t", 0)].records) == [b"x" * 1000]
        # request max bytes shared across partitions
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(2, 0), (0, 0)]}, max_bytes=200))
        got = parts_of(resp, cluster)
        assert values(got[("t", 2)].records) == [b"w"] and got[("t", 0)].records == b""
        # Kafka's byte-range reads: the leading bytes of the batch that did not fit
        cluster.fetch_partial_batches = True
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(2, 0), (0, 0)]}, max_bytes=200))
        got = parts_of(resp, cluster)
        w_size = len(got[("t", 2)].records)
        assert len(got[("t", 0)].records) == 200 - w_size
        rs = decode_records(got[("t", 0)].records)
        assert rs.batches == [] and rs.partial_bytes == 200 - w_size
        await c.close()


async def test_fetch_errors_and_offsets() -> None:
    async with TestCluster(2, topics={"t": 2}) as cluster:
        for _ in range(3):
            cluster.append("t", 0, [b"a"])
        assert cluster.leaders("t") == {0: 0, 1: 1}
        c = await connect(cluster, 0)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 4), (0, 3)]}))
        assert list(parts_of(resp, cluster)) == [("t", 0)]  # repeated: the last entry counts
        p = parts_of(resp, cluster)[("t", 0)]
        assert (p.error_code, p.high_watermark, p.log_start_offset, p.last_stable_offset) == (0, 3, 0, 3)
        assert p.aborted_transactions is None and p.records == b""
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 4)]}))
        p = parts_of(resp, cluster)[("t", 0)]
        assert (p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset) == (
            EC.OFFSET_OUT_OF_RANGE, -1, -1, -1)
        cluster.truncate_start("t", 0, 2)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 1), (1, 0)]}))
        got = parts_of(resp, cluster)
        assert got[("t", 0)].error_code == EC.OFFSET_OUT_OF_RANGE
        assert got[("t", 1)].error_code == EC.NOT_LEADER_OR_FOLLOWER  # led by broker 1
        assert got[("t", 1)].current_leader.leader_id == 1  # KIP-951 (v16+)
        assert [n.node_id for n in resp.node_endpoints] == [1]
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 2)]}))
        assert values(parts_of(resp, cluster)[("t", 0)].records) == [b"a"]
        # unknown topics
        resp = await fetch(c, fetch_request(cluster, V, {"nope": [(0, 0)]}, topic_ids={"nope": uuid.uuid4()}))
        assert [p.error_code for p in resp.responses[0].partitions] == [EC.UNKNOWN_TOPIC_ID]
        resp = await fetch(c, fetch_request(cluster, V_NAMES, {"nope": [(0, 0)], "t": [(7, 0)]}), V_NAMES)
        assert {k: p.error_code for k, p in parts_of(resp).items()} == {
            ("nope", 0): EC.UNKNOWN_TOPIC_OR_PARTITION, ("t", 7): EC.UNKNOWN_TOPIC_OR_PARTITION}
        await c.close()


async def test_leader_epochs_fenced_and_unknown() -> None:
    async with TestCluster(2, topics={"t": 1}) as cluster:
        cluster.append("t", 0, [b"a"])
        cluster.move_leader("t", 0, to=0)  # epoch 0 -> 1, same leader
        c0 = await connect(cluster, 0)
        codes = {}
        for epoch in (-1, 0, 1, 2):
            resp = await fetch(c0, fetch_request(cluster, V, {"t": [(0, 0, 1024, epoch)]}))
            codes[epoch] = parts_of(resp, cluster)[("t", 0)].error_code
        assert codes == {-1: 0, 0: EC.FENCED_LEADER_EPOCH, 1: 0, 2: EC.UNKNOWN_LEADER_EPOCH}
        cluster.move_leader("t", 0, to=1)  # epoch 2, leader 1
        resp = await fetch(c0, fetch_request(cluster, V, {"t": [(0, 0, 1024, 2)]}))
        assert parts_of(resp, cluster)[("t", 0)].error_code == EC.NOT_LEADER_OR_FOLLOWER
        resp = await fetch(c0, fetch_request(cluster, V, {"t": [(0, 0, 1024, 1)]}))
        p = parts_of(resp, cluster)[("t", 0)]
        assert p.error_code == EC.FENCED_LEADER_EPOCH
        assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (1, 2)
        c1 = await connect(cluster, 1)
        resp = await fetch(c1, fetch_request(cluster, V, {"t": [(0, 0, 1024, 2)]}))
        assert values(parts_of(resp, cluster)[("t", 0)].records) == [b"a"]
        await c0.close()
        await c1.close()


async def test_read_committed_lso_aborted_index_and_markers() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        cluster.append("t", 0, [b"plain"])                                # 0
        cluster.append_txn("t", 0, [b"p1-a"], producer_id=1)              # 1  (P1 txn #1)
        cluster.append_txn("t", 0, [b"p2-a"], producer_id=2)              # 2  (P2 txn)
        c = await connect(cluster)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, isolation=1))
        p = parts_of(resp, cluster)[("t", 0)]
        assert (p.high_watermark, p.last_stable_offset) == (3, 1)
        assert values(p.records) == [b"plain"] and p.aborted_transactions == []
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, isolation=0))
        p = parts_of(resp, cluster)[("t", 0)]
        assert values(p.records) == [b"plain", b"p1-a", b"p2-a"] and p.aborted_transactions is None
        assert p.last_stable_offset == 1
        assert cluster.end_txn("t", 0, 2, commit=False) == 3              # 3  ABORT P2
        assert cluster.last_stable_offset("t", 0) == 1
        assert cluster.end_txn("t", 0, 1, commit=False) == 4              # 4  ABORT P1
        cluster.append_txn("t", 0, [b"p1-b"], producer_id=1)              # 5  (P1 txn #2)
        assert cluster.end_txn("t", 0, 1, commit=True) == 6               # 6  COMMIT P1
        cluster.append_txn("t", 0, [b"p1-c"], producer_id=1)              # 7  (P1 txn #3)
        cluster.end_txn("t", 0, 1, commit=False)                          # 8  ABORT P1
        assert cluster.last_stable_offset("t", 0) == cluster.high_watermark("t", 0) == 9
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, isolation=1))
        p = parts_of(resp, cluster)[("t", 0)]
        # the index's order (markers' order), several entries for producer 1, unsorted by first offset
        assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(2, 2), (1, 1), (1, 7)]
        rs = decode_records(p.records)
        assert [(b.base_offset, b.control_type) for b in rs.batches if b.is_control] == [
            (3, ControlType.ABORT), (4, ControlType.ABORT), (6, ControlType.COMMIT), (8, ControlType.ABORT)]
        # only the transactions overlapping the fetched range
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 5)]}, isolation=1))
        p = parts_of(resp, cluster)[("t", 0)]
        assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(1, 7)]
        size5 = cluster.partition_log("t", 0).batches[5].size
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 5, size5)]}, max_bytes=size5, isolation=1))
        p = parts_of(resp, cluster)[("t", 0)]
        assert [b.base_offset for b in decode_records(p.records).batches] == [5]
        assert p.aborted_transactions == []
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 4)]}, isolation=1))
        assert [(a.producer_id, a.first_offset) for a in parts_of(resp, cluster)[("t", 0)].aborted_transactions] == [
            (1, 1), (1, 7)]
        await c.close()


# -- long polls ------------------------------------------------------------------------------------
async def round_trip(cluster: TestCluster) -> None:
    """A Metadata request over another connection: the event loop goes round many times meanwhile, so
    a Fetch woken before it has re-read its partitions by the time this returns."""
    probe = await connect(cluster)
    await probe.request(M.MetadataRequest(topics=[]), 9)
    await probe.close()


async def test_long_poll_wakes_on_append() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        c = await connect(cluster)
        mark = cluster.log.mark()
        started = time.monotonic()
        corr = c.send(fetch_request(cluster, V, {"t": [(0, 0), (1, 0)]}, max_wait_ms=10_000, min_bytes=1), V)
        await cluster.wait_for_requests(ApiKey.FETCH, since=mark)
        cluster.append("t", 1, [b"wake"])
        resp = await c.recv(ApiKey.FETCH, V, corr)
        assert time.monotonic() - started < 5.0
        got = parts_of(resp, cluster)
        assert values(got[("t", 1)].records) == [b"wake"] and got[("t", 0)].records == b""
        await c.close()


async def test_long_poll_min_bytes_and_timeout() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        c = await connect(cluster)
        started = time.monotonic()
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, max_wait_ms=150))
        assert time.monotonic() - started >= 0.14
        assert parts_of(resp, cluster)[("t", 0)].records == b""
        # min_bytes not reached by a small append: keeps waiting; a second append completes it
        mark = cluster.log.mark()
        corr = c.send(fetch_request(cluster, V, {"t": [(0, 0)]}, max_wait_ms=10_000, min_bytes=150), V)
        [entry] = await cluster.wait_for_requests(ApiKey.FETCH, since=mark)
        cluster.append("t", 0, [b"x" * 10])
        await round_trip(cluster)  # the woken fetch has re-read meanwhile
        assert entry.outcome == "pending"
        cluster.append("t", 0, [b"y" * 200])
        resp = await c.recv(ApiKey.FETCH, V, corr)
        assert values(parts_of(resp, cluster)[("t", 0)].records) == [b"x" * 10, b"y" * 200]
        await c.close()


async def test_read_committed_long_poll_waits_for_the_commit() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        c = await connect(cluster)
        mark = cluster.log.mark()
        started = time.monotonic()
        corr = c.send(fetch_request(cluster, V, {"t": [(0, 0)]}, isolation=1, max_wait_ms=10_000), V)
        [entry] = await cluster.wait_for_requests(ApiKey.FETCH, since=mark)
        cluster.append_txn("t", 0, [b"t"], producer_id=5)  # above the LSO: not readable yet
        await round_trip(cluster)
        assert entry.outcome == "pending"
        cluster.end_txn("t", 0, 5, commit=True)
        resp = await c.recv(ApiKey.FETCH, V, corr)
        assert time.monotonic() - started < 5.0
        p = parts_of(resp, cluster)[("t", 0)]
        assert values(p.records) == [b"t"] and p.last_stable_offset == 2
        await c.close()


async def test_leader_move_completes_a_waiting_fetch() -> None:
    async with TestCluster(2, topics={"t": 1}) as cluster:
        c = await connect(cluster, 0)
        mark = cluster.log.mark()
        corr = c.send(fetch_request(cluster, V, {"t": [(0, 0, 1024, 0)]}, max_wait_ms=10_000), V)
        await cluster.wait_for_requests(ApiKey.FETCH, since=mark)
        cluster.move_leader("t", 0, to=1)
        resp = await c.recv(ApiKey.FETCH, V, corr)
        assert parts_of(resp, cluster)[("t", 0)].error_code == EC.FENCED_LEADER_EPOCH
        await c.close()


async def test_injected_top_level_error_leaves_sessions_alone() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        c = await connect(cluster)
        cluster.error(ApiKey.FETCH, EC.FETCH_SESSION_ID_NOT_FOUND, depth=0)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))
        assert (resp.error_code, resp.session_id, resp.responses) == (EC.FETCH_SESSION_ID_NOT_FOUND, 0, [])
        assert cluster.fetch_sessions() == []
        cluster.error(ApiKey.FETCH, EC.NOT_LEADER_OR_FOLLOWER, depth=2)
        resp = await fetch(c, fetch_request(cluster, V, {"t": [(0, 0)]}, epoch=0))
        assert resp.error_code == 0 and parts_of(resp, cluster)[("t", 0)].error_code == EC.NOT_LEADER_OR_FOLLOWER
        assert cluster.fetch_sessions() == []
        await c.close()


# -- ListOffsets -----------------------------------------------------------------------------------
def list_request(name: str, targets: dict[int, int], isolation: int = 0, epoch: int = -1) -> Any:
    return M.ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[ListTopic(name=name, partitions=[
        ListPartition(partition_index=p, timestamp=ts, current_leader_epoch=epoch) for p, ts in targets.items()])])


async def test_list_offsets() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        cluster.append("t", 0, [(None, b"a", (), 1000), (None, b"b", (), 2000)])
        cluster.append("t", 0, [(None, b"c", (), 3000)])
        cluster.append_txn("t", 0, [(None, b"d", (), 4000)], producer_id=3)
        cluster.truncate_start("t", 0, 1)
        c = await connect(cluster)

        async def ask(ts: int, isolation: int = 0, version: int = 9, epoch: int = -1) -> tuple[int, int, int]:
            resp = await c.request(list_request("t", {0: ts}, isolation, epoch), version)
            p = resp.topics[0].partitions[0]
            return p.error_code, p.offset, p.timestamp

        assert await ask(-2) == (0, 1, -1)
        assert await ask(-1) == (0, 4, -1)
        assert await ask(-1, isolation=1) == (0, 3, -1)  # the LSO, Kafka's answer (Tansu says 0)
        assert await ask(0) == (0, 1, 2000)  # below the log start: the first remaining record
        assert await ask(2500) == (0, 2, 3000)
        assert await ask(3500) == (0, 3, 4000)
        assert await ask(3500, isolation=1) == (0, -1, -1)  # beyond the LSO
        assert await ask(9999) == (0, -1, -1)
        assert await ask(-3) == (0, 3, 4000)
        assert await ask(-1, version=1) == (0, 4, -1)
        assert await ask(-1, epoch=5) == (EC.UNKNOWN_LEADER_EPOCH, -1, -1)
        resp = await c.request(list_request("nope", {0: -1}), 9)
        assert resp.topics[0].partitions[0].error_code == EC.UNKNOWN_TOPIC_OR_PARTITION
        await c.close()


# -- Produce ---------------------------------------------------------------------------------------
def produce_request(name: str, batches: dict[int, bytes | None], acks: int = -1, txn_id: str | None = None) -> Any:
    return M.ProduceRequest(transactional_id=txn_id, acks=acks, timeout_ms=5000, topic_data=[ProduceTopic(
        name=name, partition_data=[ProducePartition(index=p, records=b) for p, b in batches.items()])])


async def test_produce_appends_and_answers_base_offsets() -> None:
    async with TestCluster(2, topics={"t": 2}) as cluster:
        c = await connect(cluster, 0)
        for version in (3, 9, 11):
            resp = await c.request(produce_request("t", {0: build_batch([(b"k", b"v1"), (b"k", b"v2")])}), version)
            p = resp.responses[0].partition_responses[0]
            assert p.error_code == 0 and p.base_offset == cluster.high_watermark("t", 0) - 2
        assert [r.value for r in cluster.partition_log("t", 0).records()] == [b"v1", b"v2"] * 3
        # acks=0: no answer; the next request's answer proves it was handled in order
        c.send(produce_request("t", {0: build_batch([(None, b"quiet")])}, acks=0), 9)
        resp = await c.request(M.ListOffsetsRequest(replica_id=-1, topics=[ListTopic(name="t", partitions=[
            ListPartition(partition_index=0, timestamp=-1)])]), 9)
        assert resp.topics[0].partitions[0].offset == 7
        # errors: not the leader (with the new leader, v10+), corrupt batch, bad acks, two batches
        corrupt = bytearray(build_batch([(None, b"x")]))
        corrupt[-1] ^= 1
        resp = await c.request(produce_request("t", {1: build_batch([(None, b"x")]), 0: bytes(corrupt)}), 11)
        codes = {p.index: p.error_code for p in resp.responses[0].partition_responses}
        assert codes == {1: EC.NOT_LEADER_OR_FOLLOWER, 0: 2}
        assert resp.responses[0].partition_responses[0].current_leader.leader_id == 1
        resp = await c.request(produce_request("t", {0: build_batch([(None, b"x")])}, acks=2), 9)
        assert resp.responses[0].partition_responses[0].error_code == 21
        resp = await c.request(produce_request("t", {0: build_batch([(None, b"x")]) * 2}), 9)
        assert resp.responses[0].partition_responses[0].error_code == 87
        resp = await c.request(produce_request("nope", {0: build_batch([(None, b"x")])}), 9)
        assert resp.responses[0].partition_responses[0].error_code == EC.UNKNOWN_TOPIC_OR_PARTITION
        await c.close()


async def test_produce_transactional_and_idempotent_batches() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        c = await connect(cluster)
        txn = build_batch([(None, b"t1")], producer_id=42, producer_epoch=3, base_sequence=0, transactional=True)
        resp = await c.request(produce_request("t", {0: txn}, txn_id="tx"), 9)
        assert resp.responses[0].partition_responses[0].base_offset == 0
        assert cluster.last_stable_offset("t", 0) == 0 and cluster.high_watermark("t", 0) == 1
        # a retried batch is not written twice
        resp = await c.request(produce_request("t", {0: txn}, txn_id="tx"), 9)
        assert resp.responses[0].partition_responses[0].base_offset == 0 and cluster.high_watermark("t", 0) == 1
        # an older producer epoch is fenced
        old = build_batch([(None, b"old")], producer_id=42, producer_epoch=2, base_sequence=1, transactional=True)
        resp = await c.request(produce_request("t", {0: old}, txn_id="tx"), 9)
        assert resp.responses[0].partition_responses[0].error_code == 47
        cluster.end_txn("t", 0, 42, commit=True)
        assert cluster.last_stable_offset("t", 0) == 2
        assert cluster.partition_log("t", 0).batches[-1].producer_epoch == 3
        await c.close()


async def test_log_append_time_topics() -> None:
    async with TestCluster() as cluster:
        cluster.create_topic("lat", 1, configs={"message.timestamp.type": "LogAppendTime"})
        before = int(time.time() * 1000)
        cluster.append("lat", 0, [(None, b"a", (), 5)])
        [rec] = cluster.partition_log("lat", 0).records()
        assert rec.timestamp >= before  # the append time replaced the create time, CRC still valid


# -- transactions ----------------------------------------------------------------------------------
AddTopic = M.struct("AddPartitionsToTxnRequest", "AddPartitionsToTxnTopic")


async def test_transaction_coordinator_writes_markers() -> None:
    async with TestCluster(topics={"t": 2}, registry=default_registry(transactions=True)) as cluster:
        c = await connect(cluster)
        idem = await c.request(M.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1000), 4)
        assert idem.error_code == 0 and idem.producer_id >= 0
        init = await c.request(M.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=1000), 4)
        pid, epoch = init.producer_id, init.producer_epoch
        assert pid != idem.producer_id

        async def add(parts: list[int], ep: int) -> list[int]:
            resp = await c.request(M.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id="tx", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=ep,
                v3_and_below_topics=[AddTopic(name="t", partitions=parts)]), 3)
            return [p.partition_error_code for p in resp.results_by_topic_v3_and_below[0].results_by_partition]

        async def end(commit: bool, ep: int) -> int:
            resp = await c.request(M.EndTxnRequest(transactional_id="tx", producer_id=pid, producer_epoch=ep,
                                                   committed=commit), 3)
            return resp.error_code

        assert await add([0, 1, 9], epoch) == [0, 0, EC.UNKNOWN_TOPIC_OR_PARTITION]
        for p in (0, 1):
            batch = build_batch([(None, f"txn-{p}".encode())], producer_id=pid, producer_epoch=epoch,
                                base_sequence=0, transactional=True)
            resp = await c.request(produce_request("t", {p: batch}, txn_id="tx"), 9)
            assert resp.responses[0].partition_responses[0].error_code == 0
        assert cluster.last_stable_offset("t", 0) == 0
        assert await end(True, epoch) == 0
        for p in (0, 1):
            log = cluster.partition_log("t", p)
            assert log.last_stable_offset == log.high_watermark == 2
            assert log.batches[-1].control_type == ControlType.COMMIT
        # a second InitProducerId fences the first and aborts its open transaction
        assert await add([0], epoch) == [0]
        cluster.append_txn("t", 0, [b"doomed"], producer_id=pid, producer_epoch=epoch)
        again = await c.request(M.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=1000), 4)
        assert (again.producer_id, again.producer_epoch) == (pid, epoch + 1)
        assert cluster.partition_log("t", 0).aborted[-1].first_offset == 2
        assert await end(True, epoch) == 47
        await c.close()


async def test_confluent_kafka_producer_writes_to_the_test_broker() -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")

    def produce(bootstrap: str) -> int:
        p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5,
                                      "enable.idempotence": True, "acks": "all"})
        for i in range(20):
            p.produce("t", key=b"k", value=f"v{i}".encode(), partition=i % 2)
        return int(p.flush(10))

    async with TestCluster(topics={"t": 2}, registry=default_registry(transactions=True)) as cluster:
        assert await asyncio.to_thread(produce, cluster.bootstrap_servers) == 0
        for p in range(2):
            assert [r.value for r in cluster.partition_log("t", p).records()] == [
                f"v{i}".encode() for i in range(p, 20, 2)]
        assert {ApiKey.INIT_PRODUCER_ID, ApiKey.PRODUCE} <= set(cluster.api_keys())
