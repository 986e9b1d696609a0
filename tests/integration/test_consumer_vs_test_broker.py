"""Our consumer engine (service.consumer / service.fetch) against the protocol-level test broker, for
the Kafka behaviour Tansu lacks: fetch sessions (and their errors), the aborted-transaction index,
ListOffsets(latest, read_committed) = LSO, out-of-range resets and leader moves.

Every test checks what the consumer delivers *and* what it put on the wire (``cluster.requests``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig, ConsumerRecord
from service.consumer.subscription import NoOffsetForPartitionError, TopicPartition
from service.protocol import error_codes as EC
from service.protocol.messages import ApiKey
from service.protocol.records import Compression, decode_records
from tests.fakes.broker import RequestLogEntry, TestCluster

TP = TopicPartition
REPO = Path(__file__).resolve().parents[2]


# -- helpers ---------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def consumer_for(cluster: TestCluster, **config: Any) -> AsyncIterator[Consumer]:
    settings: dict[str, Any] = {"auto_offset_reset": "earliest", "fetch_max_wait_ms": 50}
    settings.update(config)
    client = KafkaClient(cluster.bootstrap_servers)
    consumer = Consumer(client, ConsumerConfig(group_id=None, **settings))
    try:
        yield consumer
    finally:
        await consumer.close()
        await client.close()


async def consume(consumer: Consumer, n: int, timeout: float = 10.0) -> list[ConsumerRecord]:
    """Poll until ``n`` records arrived (fails on timeout); returns them."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(out)} of {n} records within {timeout}s: {[(r.partition, r.offset) for r in out]}"
        out += await consumer.poll(timeout=left)
    return out


async def wait_position(consumer: Consumer, tp: TopicPartition, offset: int, timeout: float = 10.0) -> None:
    """Poll (delivering nothing) until the consumer's position reaches ``offset``."""
    deadline = time.monotonic() + timeout
    while consumer.subs.position(tp) != offset:
        left = deadline - time.monotonic()
        assert left > 0, f"{tp} stuck at {consumer.subs.position(tp)}, expected {offset}"
        assert await consumer.poll(timeout=min(left, 0.2)) == []


def fetches(cluster: TestCluster, node_id: int | None = None, since: int = 0) -> list[RequestLogEntry]:
    return [e for e in cluster.requests(ApiKey.FETCH, node_id=node_id, since=since) if e.request is not None]


def sent(e: RequestLogEntry) -> dict[int, int]:
    """partition -> fetch offset of a Fetch request (single-topic tests)."""
    return {p.partition: p.fetch_offset for t in e.request.topics for p in t.partitions}


def forgotten(e: RequestLogEntry) -> list[int]:
    return sorted(p for f in e.request.forgotten_topics_data for p in f.partitions)


def meta(e: RequestLogEntry) -> tuple[int, int]:
    return e.request.session_id, e.request.session_epoch


def response_parts(e: RequestLogEntry) -> list[Any]:
    return [p for t in (e.response.responses if e.response is not None else []) for p in t.partitions]


def by_partition(records: Iterable[ConsumerRecord]) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.value)
    return out


def fill(cluster: TestCluster, topic: str, partition: int, n: int, tag: str = "") -> list[bytes]:
    vals = [f"{tag}{partition}-{cluster.high_watermark(topic, partition) + i}".encode() for i in range(n)]
    for v in vals:
        cluster.append(topic, partition, [v])
    return vals


# -- (a) the session's request sequence -----------------------------------------------------------
async def test_fetch_session_request_sequence() -> None:
    async with TestCluster(topics={"t": 4}) as cluster, consumer_for(cluster) as consumer:
        v0, v1 = fill(cluster, "t", 0, 3), fill(cluster, "t", 1, 2)
        await consumer.assign([TP("t", p) for p in range(4)])
        got = await consume(consumer, 5)
        assert by_partition(got) == {0: v0, 1: v1}
        steady = await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch == 2)
        first, second, third = fetches(cluster)[:3]
        # 1. full, asks for a session, every partition
        assert meta(first) == (0, 0) and first.api_version == 17
        assert sent(first) == {0: 0, 1: 0, 2: 0, 3: 0} and forgotten(first) == []
        sid = first.response.session_id
        assert sid != 0 and [s.id for s in cluster.fetch_sessions()] == [sid]
        # 2. incremental, epoch 1: only the partitions whose fetch offset moved
        assert meta(second) == (sid, 1) and sent(second) == {0: 3, 1: 2} and forgotten(second) == []
        # 3. nothing changed: an empty incremental request
        assert third is steady[0] and meta(third) == (sid, 2) and sent(third) == {} and forgotten(third) == []
        # new data on partition 2 only → the next request after it carries partition 2 alone
        mark = cluster.log.mark()
        v2 = fill(cluster, "t", 2, 1)
        assert by_partition(await consume(consumer, 1)) == {2: v2}
        after = await cluster.wait_for_requests(ApiKey.FETCH, since=mark, where=lambda e: 2 in sent(e))
        assert sent(after[0]) == {2: 1}
        # re-assign fewer partitions: the dropped ones are forgotten
        mark = cluster.log.mark()
        await consumer.assign([TP("t", 0), TP("t", 1)])
        [forget] = await cluster.wait_for_requests(ApiKey.FETCH, since=mark, where=lambda e: bool(forgotten(e)))
        assert forgotten(forget) == [2, 3] and sent(forget) == {} and meta(forget)[0] == sid
        session = cluster.fetch_session(sid)
        assert session is not None and sorted(k[1] for k in session.keys()) == [0, 1]
        all_fetches = fetches(cluster)
        # one session, consecutive epochs; a still-assigned partition is never forgotten
        assert [meta(e) for e in all_fetches[1:]] == [(sid, i) for i in range(1, len(all_fetches))]
        for e in all_fetches:
            if e.seq < forget.seq:
                assert forgotten(e) == [], e
    # close() frees the session on the broker (epoch -1)
    last = fetches(cluster)[-1]
    assert last.request.session_epoch == -1 and last.request.session_id == sid
    assert cluster.fetch_sessions() == []


async def test_buffered_partitions_stay_in_the_session() -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        cluster.append("t", 0, [b"buffered"])
        await consumer.assign([TP("t", 0), TP("t", 1)])
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.outcome == "answered")
        # no poll yet: partition 0's record sits in the consumer's buffer
        try:
            await cluster.wait_for_requests(ApiKey.FETCH, count=2, timeout=1.0)
        except TimeoutError:
            pass  # not fetching from that broker while data is buffered is fine too
        assert [forgotten(e) for e in fetches(cluster)] == [[] for _ in fetches(cluster)]
        assert [r.value for r in await consume(consumer, 1)] == [b"buffered"]


async def test_polling_consumer_fetches_ahead_of_its_buffer() -> None:
    """Pipelining: right after a poll left records buffered, the next fetch of that partition starts at the
    end of the buffer (not at the position, and without waiting for the buffer to drain), inside the same
    session; polls then deliver every record once, in order, across the chained buffers."""
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        cluster.append("t", 0, [b"a0", b"a1", b"a2"])  # one batch: offsets 0-2
        await consumer.assign([TP("t", 0), TP("t", 1)])
        got = [r.value for r in await consumer.poll(max_records=1, timeout=10)]
        assert got == [b"a0"]  # a1, a2 stay buffered
        cluster.append("t", 0, [b"b3", b"b4"])  # offsets 3-4, written after the first fetch
        cluster.append("t", 0, [b"c5"])  # offset 5: control-free, own batch
        e = await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request is not None and sent(e).get(0) == 3,
                                          timeout=5.0)
        assert e  # fetched from the buffer's end (3) while a1, a2 (1-2) were still buffered
        assert await consumer.position(TP("t", 0)) == 1  # nothing more was delivered meanwhile
        while len(got) < 6:
            got += [r.value for r in await consumer.poll(max_records=1, timeout=10)]
        assert got == [b"a0", b"a1", b"a2", b"b3", b"b4", b"c5"]
        assert await consumer.position(TP("t", 0)) == 6
        assert all(forgotten(x) == [] for x in fetches(cluster))  # the session never dropped a partition
        assert cluster.fetch_session_stats().created == 1


async def test_fetching_ahead_past_an_aborted_transaction_extends_the_buffered_chain() -> None:
    """A fetch ahead of the buffer that brings only an aborted transaction and its marker moves the end of
    the buffered chain (not the position, which still points at undelivered records), so the next fetch
    starts after the marker and the position later steps over the transaction."""
    async with (TestCluster(topics={"t": 1}) as cluster,
                consumer_for(cluster, isolation_level="read_committed") as consumer):
        cluster.append("t", 0, [b"a0", b"a1", b"a2"])
        await consumer.assign([TP("t", 0)])
        assert [r.value for r in await consumer.poll(max_records=1, timeout=10)] == [b"a0"]
        cluster.append_txn("t", 0, [b"aborted"], producer_id=5)  # offset 3
        cluster.end_txn("t", 0, 5, commit=False)  # marker at 4
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request is not None and sent(e).get(0) == 5,
                                        timeout=5.0)
        assert await consumer.position(TP("t", 0)) == 1
        cluster.append("t", 0, [b"d5"])
        got: list[bytes] = []
        while len(got) < 3:
            got += [r.value for r in await consumer.poll(max_records=1, timeout=10)]
        assert got == [b"a1", b"a2", b"d5"] and await consumer.position(TP("t", 0)) == 6


async def test_consumer_stays_on_full_fetches_without_sessions() -> None:
    async with TestCluster(topics={"t": 2}, fetch_sessions=False) as cluster, consumer_for(cluster) as consumer:
        vals = fill(cluster, "t", 1, 3)
        await consumer.assign([TP("t", 0), TP("t", 1)])
        assert by_partition(await consume(consumer, 3)) == {1: vals}
        await cluster.wait_for_requests(ApiKey.FETCH, count=3)
        for e in fetches(cluster)[:3]:
            assert meta(e) == (0, 0) and set(sent(e)) == {0, 1}


async def test_consumer_works_when_the_session_cache_is_full() -> None:
    async with TestCluster(topics={"t": 1}, fetch_session_cache_slots=0) as cluster, consumer_for(cluster) as consumer:
        vals = fill(cluster, "t", 0, 4)
        await consumer.assign([TP("t", 0)])
        assert by_partition(await consume(consumer, 4)) == {0: vals}
        await cluster.wait_for_requests(ApiKey.FETCH, count=3, where=lambda e: e.outcome == "answered")
        assert {meta(e) for e in fetches(cluster)[:3]} == {(0, 0)}
        assert cluster.fetch_session_stats().not_created >= 3


# -- (b) recovery from session errors -------------------------------------------------------------
def _inject_70(cluster: TestCluster) -> None:
    cluster.error(ApiKey.FETCH, EC.FETCH_SESSION_ID_NOT_FOUND, depth=0)


def _inject_71(cluster: TestCluster) -> None:
    cluster.error(ApiKey.FETCH, EC.INVALID_FETCH_SESSION_EPOCH, depth=0)


def _expire(cluster: TestCluster) -> None:
    assert cluster.expire_fetch_sessions() == 1  # the broker forgets it: a real 70


def _desync_epoch(cluster: TestCluster) -> None:
    [session] = cluster.fetch_sessions()
    session.epoch += 5  # the broker expects another epoch: a real 71


@pytest.mark.parametrize(("cause", "code", "next_meta"), [
    (_inject_70, EC.FETCH_SESSION_ID_NOT_FOUND, "initial"),
    (_inject_71, EC.INVALID_FETCH_SESSION_EPOCH, "close-existing"),
    (_expire, EC.FETCH_SESSION_ID_NOT_FOUND, "initial"),
    (_desync_epoch, EC.INVALID_FETCH_SESSION_EPOCH, "close-existing"),
], ids=["injected-70", "injected-71", "expired-70", "desync-71"])
async def test_recovery_from_session_errors(cause: Callable[[TestCluster], None], code: int, next_meta: str) -> None:
    async with TestCluster(topics={"t": 3}) as cluster, consumer_for(cluster) as consumer:
        expected = {p: fill(cluster, "t", p, 4) for p in range(3)}
        await consumer.assign([TP("t", p) for p in range(3)])
        got = await consume(consumer, 12)
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch >= 2)
        sid = fetches(cluster)[0].response.session_id
        cause(cluster)
        # (a Fetch already waiting at the broker may be the one that fails)
        [failed] = await cluster.wait_for_requests(
            ApiKey.FETCH, where=lambda e: e.response is not None and e.response.error_code != 0)
        assert failed.response.error_code == code and failed.response.responses == []
        # more data while recovering, on every partition
        for p in range(3):
            expected[p] += fill(cluster, "t", p, 3)
        got += await consume(consumer, 9)
        assert by_partition(got) == expected  # every record exactly once, in order
        [retry] = [e for e in fetches(cluster, since=failed.seq)][:1]
        if next_meta == "initial":
            assert meta(retry) == (0, 0)
        else:
            assert meta(retry) == (sid, 0)  # names the old session so the broker frees it
            assert cluster.fetch_session(sid) is None
        assert set(sent(retry)) == {0, 1, 2}  # a full request
        new_sid = retry.response.session_id
        assert new_sid not in (0, sid)
        later = await cluster.wait_for_requests(ApiKey.FETCH, since=retry.seq,
                                                where=lambda e: e.request.session_id == new_sid)
        assert later[0].request.session_epoch == 1


# -- (c) request size of the steady state with 1,000 partitions -----------------------------------
async def test_steady_state_incremental_fetch_with_1000_partitions_is_tiny() -> None:
    async with TestCluster(topics={"big": 1000}) as cluster, consumer_for(cluster) as consumer:
        await consumer.assign([TP("big", p) for p in range(1000)])
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch == 3, timeout=20)
        full, *incremental = fetches(cluster)[:4]
        assert meta(full) == (0, 0) and len(sent(full)) == 1000
        assert len(response_parts(full)) == 1000
        sid = full.response.session_id
        assert [meta(e) for e in incremental] == [(sid, 1), (sid, 2), (sid, 3)]
        for e in incremental:
            assert sent(e) == {} and forgotten(e) == [] and response_parts(e) == []
        print(f"\nFetch v{full.api_version} with 1,000 partitions: full request {full.frame_size} bytes "
              f"(size field {full.size}); empty incremental request {incremental[-1].frame_size} bytes "
              f"(size field {incremental[-1].size})")
        assert full.frame_size > 20_000
        assert all(e.frame_size < 100 for e in incremental)
        assert consumer.fetcher.stats.request_bytes > 0


# -- (d) read_committed against the aborted-transaction index --------------------------------------
P1, P2 = 1001, 1002


def write_interleaved_transactions(cluster: TestCluster) -> None:
    """Two transactional producers and a plain one on partition 0 (offsets in comments)."""
    t = "t"
    cluster.append_txn(t, 0, [b"a0"], producer_id=P1)   # 0  P1 txn A (aborted at 7)
    cluster.append_txn(t, 0, [b"x0"], producer_id=P2)   # 1  P2 txn X (aborted at 5)
    cluster.append_txn(t, 0, [b"a1"], producer_id=P1)   # 2
    cluster.append_txn(t, 0, [b"x1"], producer_id=P2)   # 3
    cluster.append(t, 0, [b"n0"])                        # 4  plain
    cluster.end_txn(t, 0, P2, commit=False)              # 5  ABORT X
    cluster.append_txn(t, 0, [b"a2"], producer_id=P1)   # 6
    cluster.end_txn(t, 0, P1, commit=False)              # 7  ABORT A: index (P2, 1), (P1, 0): unsorted
    cluster.append_txn(t, 0, [b"y0"], producer_id=P2)   # 8  P2 txn Y (committed at 11)
    cluster.append_txn(t, 0, [b"b0"], producer_id=P1)   # 9  P1 txn B (aborted at 13)
    cluster.append_txn(t, 0, [b"y1"], producer_id=P2)   # 10
    cluster.end_txn(t, 0, P2, commit=True)               # 11 COMMIT Y
    cluster.append_txn(t, 0, [b"b1"], producer_id=P1)   # 12
    cluster.end_txn(t, 0, P1, commit=False)              # 13 ABORT B: P1's second index entry
    cluster.append_txn(t, 0, [b"c0", b"c1"], producer_id=P1, compression=Compression.LZ4)  # 14-15 txn C
    cluster.append(t, 0, [b"n1"])                        # 16 plain
    cluster.end_txn(t, 0, P1, commit=True)               # 17 COMMIT C
    assert cluster.high_watermark(t, 0) == cluster.last_stable_offset(t, 0) == 18


COMMITTED = [b"n0", b"y0", b"y1", b"c0", b"c1", b"n1"]
EVERYTHING = [b"a0", b"x0", b"a1", b"x1", b"n0", b"a2", b"y0", b"b0", b"y1", b"b1", b"c0", b"c1", b"n1"]


@pytest.mark.parametrize("fetch_size", ["two-batches", "whole-log"])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
async def test_interleaved_transactions(isolation: str, fetch_size: str) -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        write_interleaved_transactions(cluster)
        limit = 1024 * 1024
        if fetch_size == "two-batches":  # transactions span several fetch responses
            limit = 2 * cluster.partition_log("t", 0).batches[0].size + 10
        async with consumer_for(cluster, isolation_level=isolation, max_partition_fetch_bytes=limit,
                                fetch_max_bytes=limit) as consumer:
            await consumer.assign([TP("t", 0)])
            want = COMMITTED if isolation == "read_committed" else EVERYTHING
            got = await consume(consumer, len(want))
            assert [r.value for r in got] == want  # exactly these, in order, no control records
            await wait_position(consumer, TP("t", 0), 18)  # past the trailing COMMIT marker
            assert await consumer.poll(timeout=0.05) == []
        answered = [p for e in fetches(cluster) for p in response_parts(e) if p.records]
        ranges = [[b.base_offset for b in decode_records(p.records).batches] for p in answered]
        aborted = [[(a.producer_id, a.first_offset) for a in p.aborted_transactions or []] for p in answered]
        if isolation == "read_uncommitted":
            assert all(p.aborted_transactions is None for p in answered)
        if fetch_size == "two-batches":
            assert len([r for r in ranges if r[0] <= 7]) >= 3  # transaction A (offsets 0-7) in 3+ responses
            if isolation == "read_committed":
                assert [(P2, 1), (P1, 0)] in aborted  # the index's order, not sorted by first offset
        else:
            assert ranges[0] == list(range(18)) or ranges[0] == [b for b in range(18) if b != 15]
            if isolation == "read_committed":
                assert aborted[0] == [(P2, 1), (P1, 0), (P1, 9)]  # unsorted, two entries for P1


async def test_read_committed_waits_for_open_transactions() -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        cluster.append("t", 0, [b"before"])
        async with consumer_for(cluster, isolation_level="read_committed") as consumer:
            await consumer.assign([TP("t", 0)])
            assert [r.value for r in await consume(consumer, 1)] == [b"before"]
            cluster.append_txn("t", 0, [b"open"], producer_id=P1)       # 1: the LSO stays at 1
            cluster.append("t", 0, [b"after-open"])                        # 2: beyond the LSO
            mark = cluster.log.mark()
            await cluster.wait_for_requests(ApiKey.FETCH, since=mark, count=2)  # fetched, nothing readable
            assert await consumer.poll(timeout=0.1) == []
            assert consumer.subs.position(TP("t", 0)) == 1
            cluster.end_txn("t", 0, P1, commit=False)                      # 3
            assert [r.value for r in await consume(consumer, 1)] == [b"after-open"]
            await wait_position(consumer, TP("t", 0), 4)
            # ListOffsets(latest, read_committed) is the LSO on this broker
            cluster.append_txn("t", 0, [b"open2"], producer_id=P2)      # 4
            assert await consumer.end_offsets([TP("t", 0)]) == {TP("t", 0): 4}


# -- (e) out of range ---------------------------------------------------------------------------------
async def wait_for_out_of_range(cluster: TestCluster, since: int) -> RequestLogEntry:
    [e] = (await cluster.wait_for_requests(
        ApiKey.FETCH, since=since,
        where=lambda e: any(p.error_code == EC.OFFSET_OUT_OF_RANGE for p in response_parts(e))))[:1]
    # the consumer's next Fetch is built after it handled that answer
    await cluster.wait_for_requests(ApiKey.FETCH, since=e.seq)
    return e


async def test_out_of_range_resets_to_earliest() -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster, auto_offset_reset="earliest") as consumer:
        vals = fill(cluster, "t", 0, 10)
        await consumer.assign([TP("t", 0), TP("t", 1)])
        assert [r.value for r in await consume(consumer, 10)] == vals
        cluster.truncate_start("t", 0, 6)
        mark = cluster.log.mark()
        consumer.seek(TP("t", 0), 2)  # below the new log start
        await wait_for_out_of_range(cluster, mark)
        # position() resolves the pending reset
        assert await consumer.position(TP("t", 0)) == 6
        got = await consume(consumer, 4)
        assert [r.value for r in got] == vals[6:] and [r.offset for r in got] == [6, 7, 8, 9]


async def test_out_of_range_resets_to_latest() -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster, auto_offset_reset="latest") as consumer:
        fill(cluster, "t", 0, 5)
        await consumer.assign([TP("t", 0), TP("t", 1)])
        assert await consumer.position(TP("t", 0)) == 5
        mark = cluster.log.mark()
        consumer.seek(TP("t", 0), 50)  # beyond the high watermark
        await wait_for_out_of_range(cluster, mark)
        assert await consumer.position(TP("t", 0)) == 5
        vals = fill(cluster, "t", 0, 2)
        got = await consume(consumer, 2)
        assert [r.value for r in got] == vals and [r.offset for r in got] == [5, 6]


async def test_out_of_range_with_reset_none_surfaces_from_poll() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(cluster, auto_offset_reset="none") as consumer:
        vals = fill(cluster, "t", 0, 6)
        await consumer.assign([TP("t", 0)])
        consumer.seek(TP("t", 0), 0)
        assert [r.value for r in await consume(consumer, 6)] == vals
        cluster.truncate_start("t", 0, 4)
        consumer.seek(TP("t", 0), 1)
        with pytest.raises(NoOffsetForPartitionError, match="t-0"):
            await consume(consumer, 1)
        consumer.seek(TP("t", 0), 4)  # the owner decides where to go on
        assert [r.value for r in await consume(consumer, 2)] == vals[4:]


NO_POSITION_SCRIPT = """
import asyncio, sys
from service.client.client import KafkaClient
from service.client.errors import KafkaError
from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import NoOffsetForPartitionError, TopicPartition
from tests.fakes.broker import TestCluster

async def main():
    async with TestCluster(topics={"t": 1}) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        consumer = Consumer(client, ConsumerConfig(group_id=None, auto_offset_reset="none"))
        await consumer.assign([TopicPartition("t", 0)])
        try:
            await consumer.poll(timeout=2.0)
        except NoOffsetForPartitionError:
            print("raised")
        await consumer.close()
        await client.close()

asyncio.run(main())
"""


async def test_reset_none_without_position_raises() -> None:
    """auto_offset_reset=none without a committed offset: poll raises. Run in a subprocess because the
    failure mode found here was a positions loop spinning without awaiting (a frozen event loop cannot
    time itself out); fixed in Consumer._positions_loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", NO_POSITION_SCRIPT, cwd=str(REPO), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 5.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail("the consumer froze the event loop (no answer within 5 s)")
    assert out.decode().strip() == "raised"


async def test_position_without_offset_and_reset_none_raises() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(cluster, auto_offset_reset="none") as consumer:
        await consumer.assign([TP("t", 0)])
        # the positions loop finds no committed offset and parks the error for poll()
        await asyncio.wait_for(consumer.fetcher.data_event.wait(), 5.0)
        assert TP("t", 0) in consumer.fetcher.errors
        # raised from the parked error, not after waiting out the call's own (60 s) timeout
        with pytest.raises(NoOffsetForPartitionError):
            await asyncio.wait_for(consumer.position(TP("t", 0), timeout=60.0), 10.0)


async def test_out_of_range_reset_is_prompt() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(cluster, auto_offset_reset="earliest") as consumer:
        vals = fill(cluster, "t", 0, 8)
        await consumer.assign([TP("t", 0)])
        assert len(await consume(consumer, 8)) == 8
        cluster.truncate_start("t", 0, 5)
        consumer.seek(TP("t", 0), 1)
        got = await consume(consumer, 3, timeout=2.0)  # a reset needs one ListOffsets round trip, not seconds
        assert [r.value for r in got] == vals[5:]


async def test_steady_state_fetching_does_not_refresh_metadata() -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        await consumer.assign([TP("t", 0), TP("t", 1)])
        await cluster.wait_for_requests(ApiKey.FETCH, count=10)
        metadata = cluster.requests(ApiKey.METADATA)
        assert len(metadata) <= 3, f"{len(metadata)} Metadata requests for 10 Fetch requests"


# -- (f) leader moves ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("max_fetch_version", "code"), [
    (17, EC.FENCED_LEADER_EPOCH),  # the request carries the (now stale) current leader epoch
    (8, EC.NOT_LEADER_OR_FOLLOWER),  # before v9 there is no current leader epoch
])
async def test_leader_move_refreshes_metadata_and_continues(max_fetch_version: int, code: int) -> None:
    async with TestCluster(3, topics={"t": 3}, api_versions={ApiKey.FETCH: (4, max_fetch_version)}) as cluster, \
            consumer_for(cluster) as consumer:
        assert cluster.leaders("t") == {0: 0, 1: 1, 2: 2}
        expected = {p: fill(cluster, "t", p, 3) for p in range(3)}
        await consumer.assign([TP("t", p) for p in range(3)])
        got = await consume(consumer, 9)
        # while a Fetch waits at broker 0 (long poll), partition 0 moves: that Fetch is answered at once
        await cluster.wait_for_requests(ApiKey.FETCH, node_id=0,
                                        where=lambda e: e.request.session_epoch >= 1 and e.outcome == "pending")
        cluster.move_leader("t", 0, to=1)
        [err] = (await cluster.wait_for_requests(
            ApiKey.FETCH, node_id=0, where=lambda e: any(p.error_code for p in response_parts(e))))[:1]
        assert [p.error_code for p in response_parts(err)] == [code]
        expected[0] += fill(cluster, "t", 0, 3)
        expected[1] += fill(cluster, "t", 1, 1)
        got += await consume(consumer, 4)
        assert by_partition(got) == expected
        assert any(e.seq > err.seq for e in cluster.requests(ApiKey.METADATA))
        on_new_leader = [e for e in fetches(cluster, node_id=1, since=err.seq) if 0 in sent(e)]
        # partition 0 joins the consumer's existing session on broker 1 (an incremental request adds it)
        assert on_new_leader and on_new_leader[0].request.session_epoch >= 1
        [session] = cluster.fetch_sessions(node_id=1)
        assert sorted(k[1] for k in session.keys()) == [0, 1]
        if max_fetch_version >= 9:
            [p0] = [p for t in on_new_leader[0].request.topics for p in t.partitions if p.partition == 0]
            assert p0.current_leader_epoch == 1


async def test_broker_failover_moves_fetching() -> None:
    async with TestCluster(2, topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        expected = {p: fill(cluster, "t", p, 2) for p in range(2)}
        await consumer.assign([TP("t", 0), TP("t", 1)])
        got = await consume(consumer, 4)
        await cluster.stop_broker(0)  # partition 0 fails over to broker 1
        assert cluster.leaders("t") == {0: 1, 1: 1}
        expected[0] += fill(cluster, "t", 0, 2)
        got += await consume(consumer, 2)
        assert by_partition(got) == expected


# -- more of Kafka's data path ------------------------------------------------------------------------
async def test_partial_trailing_batches_and_seek_into_a_compressed_batch() -> None:
    async with TestCluster(topics={"t": 1}, fetch_partial_batches=True) as cluster:
        for i in range(0, 30, 5):
            cluster.append("t", 0, [f"v{i + j}".encode() * 20 for j in range(5)], compression=Compression.ZSTD)
        size = max(b.size for b in cluster.partition_log("t", 0).batches)
        async with consumer_for(cluster, max_partition_fetch_bytes=size + size // 2) as consumer:
            await consumer.assign([TP("t", 0)])
            got = await consume(consumer, 30)
            assert [r.offset for r in got] == list(range(30))
            partial = [e for e in fetches(cluster) for p in response_parts(e)
                       if p.records and decode_records(p.records).partial_bytes]
            assert partial, "the broker should have cut some responses inside a batch"
            consumer.seek(TP("t", 0), 12)  # inside the batch 10-14
            got = await consume(consumer, 18)
            assert [r.offset for r in got] == list(range(12, 30))


async def test_seek_to_timestamp_uses_list_offsets() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(cluster) as consumer:
        for i in range(6):
            cluster.append("t", 0, [(None, f"v{i}".encode(), (), 1_000 * (i + 1))])
        await consumer.assign([TP("t", 0)])
        assert len(await consume(consumer, 6)) == 6
        consumer.seek_to_timestamp({TP("t", 0): 3_500})
        got = await consume(consumer, 3)
        assert [r.offset for r in got] == [3, 4, 5]
        assert await consumer.beginning_offsets([TP("t", 0)]) == {TP("t", 0): 0}
        assert await consumer.end_offsets([TP("t", 0)]) == {TP("t", 0): 6}


# -- broker-side wait while the owner polls ----------------------------------------------------------
async def test_fetch_wait_is_short_only_while_polled() -> None:
    """With fetch_active_max_wait_ms, fetches sent while records flow to a polling owner ask the broker
    for the short wait; a quiet partition, or an instance nobody polls, goes back to the long one."""
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(
            cluster, fetch_max_wait_ms=300, fetch_active_max_wait_ms=10, fetch_idle_pause_ms=0) as consumer:
        consumer.fetcher.config = dataclasses.replace(consumer.fetcher.config, active_linger_s=0.3,
                                                      active_quiet_s=0.6)
        await consumer.assign([TP("t", 0)])
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request is not None
                                        and e.request.max_wait_ms == 300)
        assert await consumer.poll(timeout=0.4) == []  # polled, but no records flow: long waits only
        assert {e.request.max_wait_ms for e in fetches(cluster)} == {300}
        cluster.append("t", 0, [b"x"])
        assert [r.value for r in await consume(consumer, 1)] == [b"x"]
        before = cluster.requests(ApiKey.FETCH)[-1].seq
        assert await consumer.poll(timeout=1.2) == []  # records flowed: brisk, until quiet for 0.6 s
        during = [e.request.max_wait_ms for e in fetches(cluster, since=before + 1)]
        assert during.count(10) >= 5, during
        assert during[-1] == 300, during
        last_short = max(e.seq for e in fetches(cluster) if e.request.max_wait_ms == 10)
        cluster.append("t", 0, [b"y"])
        assert [r.value for r in await consume(consumer, 1)] == [b"y"]
        # nobody polls: after the linger, long waits although records just flowed
        await cluster.wait_for_requests(ApiKey.FETCH, since=last_short + 1,
                                        where=lambda e: e.request is not None and e.request.max_wait_ms == 300)


async def test_fetch_wait_without_active_setting_is_constant() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(
            cluster, fetch_max_wait_ms=50, fetch_idle_pause_ms=0) as consumer:
        await consumer.assign([TP("t", 0)])
        assert await consumer.poll(timeout=0.3) == []
        waits = {e.request.max_wait_ms for e in fetches(cluster)}
        assert waits == {50}
