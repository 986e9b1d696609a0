"""One poll returns what is waiting across the whole assignment (Consumer.poll_batches' gather), against
the protocol-level test broker: records waiting on several brokers or partitions come back from a single
poll; the linger is bounded (a broker that never answers does not hold a poll past it, and a full poll
does not linger at all); Confluent's ``fetch.min.bytes`` / ``consumer.request.timeout.ms`` semantics."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.v2.consumer_config import poll_timeout_ms
from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig, ConsumerRecord
from service.consumer.subscription import TopicPartition
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster

TP = TopicPartition


@contextlib.asynccontextmanager
async def consumer_for(cluster: TestCluster, **config: Any) -> AsyncIterator[Consumer]:
    settings: dict[str, Any] = {"auto_offset_reset": "earliest", "fetch_max_wait_ms": 500}
    settings.update(config)
    client = KafkaClient(cluster.bootstrap_servers)
    consumer = Consumer(client, ConsumerConfig(group_id=None, **settings))
    try:
        yield consumer
    finally:
        await consumer.close()
        await client.close()


def fill(cluster: TestCluster, topic: str, partition: int, n: int, size: int = 10) -> None:
    for i in range(n):
        cluster.append(topic, partition, [f"{topic}-{partition}-{i}".encode().ljust(size, b".")[:size]])


def where(records: list[ConsumerRecord]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for r in records:
        out[(r.topic, r.partition)] = out.get((r.topic, r.partition), 0) + 1
    return out


def counts(chunks: list[tuple[TopicPartition, list[Any]]]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for tp, recs in chunks:
        out[tp] = out.get(tp, 0) + len(recs)
    return out


def check_count(consumer: Consumer) -> None:
    """The fetcher's running count of buffered records agrees with its buffer."""
    f = consumer.fetcher
    assert f.buffered_records == sum(len(cf.records) - cf.index for q in f.buffer.values() for cf in q)


def buffered_event(consumer: Consumer, n: int) -> asyncio.Event:
    """Set once the consumer's fetcher holds at least ``n`` records."""
    ev = asyncio.Event()
    fetcher = consumer.fetcher
    handle = fetcher._handle_partition

    def hooked(*args: Any) -> None:
        handle(*args)
        if fetcher.buffered_records >= n:
            ev.set()

    fetcher._handle_partition = hooked  # type: ignore[method-assign]
    return ev


# -- gathering ---------------------------------------------------------------------------------------
async def test_one_poll_returns_the_records_waiting_on_every_broker() -> None:
    async with TestCluster(3, topics={"t": 6}) as cluster, consumer_for(cluster, poll_linger_ms=1000) as consumer:
        leaders = cluster.leaders("t")
        assert sorted(set(leaders.values())) == [0, 1, 2]
        for p in range(6):
            fill(cluster, "t", p, 2)
        # brokers 1 and 2 answer their first fetch 50 ms after broker 0: a poll that returned the first
        # answer alone (the old behaviour) gets broker 0's partitions only
        cluster.delay(ApiKey.FETCH, 0.05, node_id=1)
        cluster.delay(ApiKey.FETCH, 0.05, node_id=2)
        await consumer.assign([TP("t", p) for p in range(6)])
        started = time.monotonic()
        got = await consumer.poll(timeout=10)
        assert where(got) == {("t", p): 2 for p in range(6)}
        assert time.monotonic() - started < 1.0  # it stopped gathering once no fetch was outstanding
        check_count(consumer)


async def test_one_poll_returns_every_partition_of_one_fetch_response() -> None:
    # Karapace's test_subscription on one broker: 3 records in each of three topics, one answer carries all
    async with TestCluster(1, topics={"a": 1, "b": 1, "c": 1}, fetch_sessions=False) as cluster, \
            consumer_for(cluster, poll_linger_ms=200) as consumer:
        for t in "abc":
            fill(cluster, t, 0, 3)
        await consumer.assign([TP(t, 0) for t in "abc"])
        got = await consumer.poll(timeout=5)
        assert where(got) == {("a", 0): 3, ("b", 0): 3, ("c", 0): 3}


async def test_the_linger_is_bounded_when_a_broker_never_answers() -> None:
    linger = 0.2
    async with (TestCluster(3, topics={"t": 6}) as cluster,
                consumer_for(cluster, poll_linger_ms=linger * 1000) as consumer):
        leaders = cluster.leaders("t")
        for p in range(6):
            fill(cluster, "t", p, 2)
        cluster.delay(ApiKey.FETCH, math.inf, count=100, node_id=1)  # never answered
        await consumer.assign([TP("t", p) for p in range(6)])
        started = time.monotonic()
        got = await consumer.poll(timeout=10)
        elapsed = time.monotonic() - started
        assert where(got) == {("t", p): 2 for p, node in leaders.items() if node != 1}
        assert linger <= elapsed < linger + 1.0, elapsed  # it waited for broker 1, but only the linger


async def test_no_linger_once_max_records_are_buffered() -> None:
    async with TestCluster(3, topics={"t": 6}) as cluster, consumer_for(cluster, poll_linger_ms=5000) as consumer:
        leaders = cluster.leaders("t")
        p0 = next(p for p, node in leaders.items() if node == 0)
        fill(cluster, "t", p0, 5)
        cluster.delay(ApiKey.FETCH, math.inf, count=100, node_id=1)
        cluster.delay(ApiKey.FETCH, math.inf, count=100, node_id=2)
        await consumer.assign([TP("t", p) for p in range(6)])
        started = time.monotonic()
        got = await consumer.poll(max_records=5, timeout=10)
        assert where(got) == {("t", p0): 5}
        check_count(consumer)
        assert time.monotonic() - started < 2.0  # not the 5 s linger
        # linger=0 (what streams use) returns at once as well
        fill(cluster, "t", p0, 1)
        started = time.monotonic()
        chunks = await consumer.poll_batches(timeout=10, linger=0)
        assert counts(chunks) == {TP("t", p0): 1}
        assert time.monotonic() - started < 2.0


# -- Confluent's fetch.min.bytes ------------------------------------------------------------------------
async def test_fetch_min_bytes_waits_for_more_than_that_many_bytes() -> None:
    async with TestCluster(1, topics={"t": 1}) as cluster, consumer_for(cluster, poll_linger_ms=0) as consumer:
        await consumer.assign([TP("t", 0)])
        two = buffered_event(consumer, 2)
        task = asyncio.create_task(consumer.poll_batches(timeout=10, min_bytes=20))
        fill(cluster, "t", 0, 2, size=10)  # 20 bytes of values: not more than 20
        await asyncio.wait_for(two.wait(), 5)
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done, "returned with only fetch.min.bytes bytes buffered (Confluent waits for more)"
        fill(cluster, "t", 0, 1, size=10)  # 30 bytes > 20
        got = await asyncio.wait_for(task, 5)
        assert counts(got) == {TP("t", 0): 3}
        check_count(consumer)


async def test_fetch_min_bytes_returns_what_is_buffered_at_the_timeout() -> None:
    async with TestCluster(1, topics={"t": 1}) as cluster, consumer_for(cluster) as consumer:
        await consumer.assign([TP("t", 0)])
        fill(cluster, "t", 0, 2, size=10)
        started = time.monotonic()
        got = await consumer.poll_batches(timeout=0.4, min_bytes=1000)
        assert time.monotonic() - started >= 0.4
        assert counts(got) == {TP("t", 0): 2}
        # max_records reached ends the wait as well
        fill(cluster, "t", 0, 3, size=10)
        started = time.monotonic()
        got = await consumer.poll_batches(max_records=3, timeout=5, min_bytes=1000)
        assert counts(got) == {TP("t", 0): 3}
        assert time.monotonic() - started < 2.0
        check_count(consumer)


# -- Confluent's consumer.request.timeout.ms ------------------------------------------------------------
@pytest.mark.parametrize(("timeout", "configured", "expected"), [
    (None, None, 1000),   # neither: 1 s
    (5000, None, 5000),   # the request's own timeout
    (0, None, 0),         # 0: answer at once
    (None, 300, 300),     # set: the default of a request without timeout ...
    (0, 300, 300),        # ... or with timeout <= 0 (kafka-rest's read task)
    (5000, 300, 300),     # and the cap of any other
    (100, 300, 100),
])
def test_poll_timeout_follows_confluent(timeout: int | None, configured: int | None, expected: int) -> None:
    assert poll_timeout_ms(timeout, configured) == expected


async def test_the_buffered_record_count_follows_partial_polls_and_seeks() -> None:
    async with TestCluster(1, topics={"t": 1}) as cluster, consumer_for(cluster, poll_linger_ms=0) as consumer:
        fill(cluster, "t", 0, 6)
        six = buffered_event(consumer, 6)
        await consumer.assign([TP("t", 0)])
        await asyncio.wait_for(six.wait(), 5)
        assert counts(await consumer.poll_batches(max_records=2, timeout=1)) == {TP("t", 0): 2}
        assert consumer.fetcher.buffered_records == 4
        check_count(consumer)
        consumer.seek(TP("t", 0), 0)  # drops what is buffered
        assert consumer.fetcher.buffered_records == 0
        check_count(consumer)
