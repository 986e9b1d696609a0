"""Our consumer engine against the protocol-level test broker where the wire deviates from the happy path,
checked against Apache Kafka's behaviour:

1. empty control batches (records count 0, left by Kafka's log cleaner on compacted topics) between
   normal batches: every record delivered once, the position moves past them;
2. the Fetch version falling below 7 across a reconnect (ApiVersions renegotiated): the fetch session is
   dropped and fetching continues with full, sessionless requests (and sessions return with v7+);
3. topic-id trouble: FETCH_SESSION_TOPIC_ID_ERROR (106) / UNKNOWN_TOPIC_ID (100) trigger a metadata refresh
   and the partition keeps being fetched; a broker answering v13+ fetches with the all-zero topic id is
   fetched by name (v12).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from service.protocol import error_codes as EC
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster
from tests.integration.test_consumer_vs_test_broker import (
    TP,
    by_partition,
    consume,
    consumer_for,
    fetches,
    fill,
    meta,
    sent,
    wait_position,
)

PID = 9


# -- 1. empty control batches ---------------------------------------------------------------------------
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
async def test_empty_control_batches_are_skipped(isolation: str) -> None:
    async with TestCluster(topics={"t": 1}) as cluster:
        vals = fill(cluster, "t", 0, 2)                                       # 0, 1
        assert cluster.append_empty_batch("t", 0, producer_id=1000) == 2      # 2: a cleaned marker
        assert cluster.append_txn("t", 0, [b"txn-3"], producer_id=PID) == 3   # 3: a transaction of PID...
        assert cluster.append_empty_batch("t", 0, producer_id=PID) == 4       # 4: ...an empty batch of PID
        cluster.end_txn("t", 0, PID, commit=True)                             # 5: COMMIT
        vals += [b"txn-3", *fill(cluster, "t", 0, 2)]                         # 6, 7
        assert cluster.append_empty_batch("t", 0, offsets=2) == 8             # 8-9, at the end of the log
        assert cluster.high_watermark("t", 0) == cluster.last_stable_offset("t", 0) == 10
        async with consumer_for(cluster, isolation_level=isolation) as consumer:
            await consumer.assign([TP("t", 0)])
            got = await consume(consumer, 5)
            assert [r.value for r in got] == vals and [r.offset for r in got] == [0, 1, 3, 6, 7]
            await wait_position(consumer, TP("t", 0), 10)  # past the trailing empty batch
            assert consumer.fetcher.errors == {}
            # no refetch loop: once at 10 the consumer asks for 10 only
            mark = cluster.log.mark()
            more = fill(cluster, "t", 0, 1)
            assert [r.value for r in await consume(consumer, 1)] == more
            assert all(min(sent(e).values(), default=10) >= 10 for e in fetches(cluster, since=mark))


# -- 2. Fetch below v7 after a reconnect ------------------------------------------------------------------
async def _quiesce(consumer: object, tps: list[TP], timeout: float = 5.0) -> None:
    """Pause ``tps`` and wait until no fetch is in flight (the session is idle, not failed)."""
    consumer.pause(tps)  # type: ignore[attr-defined]
    fetcher = consumer.fetcher  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while fetcher._in_flight:
        assert time.monotonic() < deadline, "a fetch stayed in flight"
        await asyncio.sleep(0.02)


async def _reconnect_with(cluster: TestCluster, consumer: object, tps: list[TP], fetch_max: int | None) -> int:
    await _quiesce(consumer, tps)
    cluster.set_api_versions({} if fetch_max is None else {ApiKey.FETCH: (4, fetch_max)})
    mark = cluster.log.mark()
    await cluster.close_connections()
    await asyncio.sleep(0.1)  # the client sees the connections close
    consumer.resume(tps)  # type: ignore[attr-defined]
    return mark


async def test_fetch_version_below_7_after_reconnect_goes_sessionless() -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        tps = [TP("t", 0), TP("t", 1)]
        expected = {p: fill(cluster, "t", p, 2) for p in range(2)}
        await consumer.assign(tps)
        got = await consume(consumer, 4)
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch >= 2)
        assert consumer.fetcher.sessions[0].session_id != 0  # an incremental session is established

        mark = await _reconnect_with(cluster, consumer, tps, fetch_max=6)
        for p in range(2):
            expected[p] += fill(cluster, "t", p, 3)
        got += await consume(consumer, 6)
        assert by_partition(got) == expected
        low = fetches(cluster, since=mark)
        assert low and {e.api_version for e in low} == {6}
        assert all(set(sent(e)) == {0, 1} for e in low)  # full requests only
        assert all(e.outcome == "answered" for e in low)
        await cluster.wait_for_requests(ApiKey.FETCH, count=3, since=mark)
        assert consumer.fetcher.sessions[0].metadata.session_id == 0

        # v7+ again: a new session is created and used incrementally
        mark = await _reconnect_with(cluster, consumer, tps, fetch_max=None)
        expected[0] += fill(cluster, "t", 0, 1)
        got += await consume(consumer, 1)
        assert by_partition(got) == expected
        later = await cluster.wait_for_requests(ApiKey.FETCH, since=mark,
                                                where=lambda e: e.request.session_epoch >= 1)
        assert later[0].api_version == 17 and later[0].request.session_id != 0


# -- 3. topic ids -------------------------------------------------------------------------------------------
def _names_partitions(header: object, request: Any) -> bool:
    return any(t.partitions for t in request.topics)


@pytest.mark.parametrize(("code", "depth"), [
    (EC.FETCH_SESSION_TOPIC_ID_ERROR, 0),  # top level: the session's topic ids disagree with the broker's
    (EC.FETCH_SESSION_TOPIC_ID_ERROR, None),  # every level, as a default injection does
    (EC.FETCH_SESSION_TOPIC_ID_ERROR, 2),  # partition level
    (EC.UNKNOWN_TOPIC_ID, 2),
], ids=["106-top", "106-all", "106-partition", "100-partition"])
async def test_topic_id_errors_refresh_metadata_and_fetching_continues(code: int, depth: int | None) -> None:
    async with TestCluster(topics={"t": 2}) as cluster, consumer_for(cluster) as consumer:
        expected = {p: fill(cluster, "t", p, 2) for p in range(2)}
        await consumer.assign([TP("t", 0), TP("t", 1)])
        got = await consume(consumer, 4)
        await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch >= 2)
        # (an injected error answers for the partitions the request names: wait for one that names some)
        cluster.error(ApiKey.FETCH, code, depth=depth, when=_names_partitions)
        for p in range(2):
            expected[p] += fill(cluster, "t", p, 2)
        polling = asyncio.create_task(consume(consumer, 4))  # polls move the fetch offsets
        [failed] = (await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.outcome == "error-injected"))[:1]
        if depth != 0:
            assert {p.error_code for t in failed.response.responses for p in t.partitions} == {code}
        got += await polling
        await cluster.wait_for_requests(ApiKey.METADATA, since=failed.seq, timeout=5.0)  # the refresh
        for p in range(2):  # the partitions are still fetched
            expected[p] += fill(cluster, "t", p, 2)
        got += await consume(consumer, 4)
        assert by_partition(got) == expected  # every record exactly once
        assert consumer.fetcher.errors == {}


async def test_unknown_topic_id_until_the_topic_is_known_again() -> None:
    async with TestCluster(topics={"t": 1}) as cluster, consumer_for(cluster) as consumer:
        vals = fill(cluster, "t", 0, 2)
        await consumer.assign([TP("t", 0)])
        got = await consume(consumer, 2)
        # The broker does not know the id for a while: Fetch says 100, Metadata says the topic is unknown.
        cluster.error(ApiKey.METADATA, EC.UNKNOWN_TOPIC_OR_PARTITION, count=2, depth=1)
        cluster.error(ApiKey.FETCH, EC.UNKNOWN_TOPIC_ID, depth=2, when=_names_partitions)
        vals += fill(cluster, "t", 0, 3)
        polling = asyncio.create_task(consume(consumer, 3))
        [failed] = (await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.outcome == "error-injected"))[:1]
        got += await polling
        await cluster.wait_for_requests(ApiKey.METADATA, since=failed.seq, count=3, timeout=5.0)
        vals += fill(cluster, "t", 0, 2)
        got += await consume(consumer, 2)
        assert [r.value for r in got] == vals
        assert consumer.client.metadata.topic_id("t") == cluster.topic("t").topic_id


async def test_zero_topic_ids_in_v13_responses_fall_back_to_names() -> None:
    async with TestCluster(topics={"t": 2}) as cluster:
        cluster.fetch_zero_topic_ids = True
        expected = {p: fill(cluster, "t", p, 3) for p in range(2)}
        async with consumer_for(cluster) as consumer:
            await consumer.assign([TP("t", 0), TP("t", 1)])
            got = await consume(consumer, 6)
            expected[1] += fill(cluster, "t", 1, 2)
            got += await consume(consumer, 2)
            assert by_partition(got) == expected
            reqs = fetches(cluster)
            assert reqs[0].api_version == 17  # ids were known from Metadata; the answer had zero ids
            assert {e.api_version for e in reqs[1:]} == {12}  # by name from then on
            steady = await cluster.wait_for_requests(ApiKey.FETCH, where=lambda e: e.request.session_epoch >= 2)
            assert steady[0].api_version == 12 and meta(steady[0])[0] != 0  # a session by name works
            assert consumer.fetcher.sessions[0].names_only
