"""The producer's own connections: Produce requests are written on connections the producer keeps
open per broker (at most ``max_in_flight_per_broker``), never on the client's control connections or its
lease pool, without a task per request; a timed-out request closes its connection."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from service.client.client import KafkaClient
from service.producer import Producer, RecordMetadata
from service.protocol import messages as M
from tests.fakes.broker import TestCluster
from tests.fakes.broker.handlers import default_registry
from tests.integration.test_produce_vs_test_broker import running, until

pytestmark = pytest.mark.integration
PRODUCE = M.ApiKey.PRODUCE


def recs(n: int, partition: int, tag: str = "v") -> list[tuple[Any, ...]]:
    return [(None, f"{tag}{i}".encode(), (), partition, None) for i in range(n)]


async def test_requests_use_the_producers_own_connections_and_reuse_them() -> None:
    async with TestCluster(topics={"t": 3}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster, max_in_flight_per_broker=2) as p:
        release = asyncio.Event()
        cluster.delay(PRODUCE, until=release, count=2)
        first = [asyncio.create_task(p.send_many("t", recs(2, 0)))]
        await cluster.wait_for_requests(PRODUCE, count=1)
        first.append(asyncio.create_task(p.send_many("t", recs(2, 1))))  # partition 0 is busy: a request of its own
        await cluster.wait_for_requests(PRODUCE, count=2)
        third = asyncio.create_task(p.send_many("t", recs(2, 2)))
        await until(lambda: p.acc.queued_records == 2)
        for _ in range(20):  # let the sender run its steps: it must not send a third request
            await asyncio.sleep(0)
        assert p.requests_sent == 2 and p.acc.queued_records == 2  # max_in_flight_per_broker
        release.set()
        for t in [*first, third]:
            assert all(isinstance(r, RecordMetadata) for r in await t)
        entries = cluster.requests(PRODUCE)
        assert len(entries) == 3
        produce_conns = {e.connection_id for e in entries[:2]}
        assert len(produce_conns) == 2  # two in flight at once: two connections, one request each
        assert entries[2].connection_id in produce_conns  # reused, not a new connection
        others = {e.connection_id for e in cluster.requests() if e.api_key not in (PRODUCE, M.ApiKey.API_VERSIONS)}
        assert not produce_conns & others  # never the control connection (metadata, InitProducerId)
        assert p.client.leased == 0 and p.client.pooled_connections() == 0
        assert not p._requests  # no task left behind
        for _ in range(5):  # answered requests leave no task either: they are written and answered in callbacks
            await p.send_many("t", recs(1, 0))
            assert not p._requests
        assert {e.connection_id for e in cluster.requests(PRODUCE)} == produce_conns


async def test_a_timed_out_request_closes_its_connection() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster, request_timeout_ms=300, delivery_timeout_ms=5000, max_in_flight_per_broker=1) as p:
        assert all(isinstance(r, RecordMetadata) for r in await p.send_many("t", recs(1, 0, "a")))
        (before,) = {e.connection_id for e in cluster.requests(PRODUCE)}
        ((mc,),) = p._conns.values()
        first_conn = mc.current
        assert first_conn is not None
        cluster.delay(PRODUCE, math.inf, count=1)
        res = await p.send_many("t", recs(2, 0, "b"))  # times out once, then retried on a new connection
        assert all(isinstance(r, RecordMetadata) for r in res), res
        entries = cluster.requests(PRODUCE)
        assert entries[1].connection_id == before and entries[-1].connection_id != before
        assert not first_conn.connected and mc.current is not first_conn  # closed at the timeout, replaced
        log = [r.value for r in cluster.partition_log("t", 0).records()]
        assert log == [b"a0", b"b0", b"b1"]  # the timed-out attempt was never written (it was held)


async def test_closing_the_producer_closes_its_connections() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        try:
            p = Producer(client)
            assert isinstance((await p.send_many("t", recs(1, 0)))[0], RecordMetadata)
            (conn_id,) = {e.connection_id for e in cluster.requests(PRODUCE)}
            await p.close()
            assert not p._conns
            await until(lambda: conn_id not in {c.id for c in cluster.connections()})
            assert any(c.id != conn_id for c in cluster.connections())  # the client's own connection stays
        finally:
            await client.close()


async def test_by_default_the_next_request_waits_for_the_answer_and_carries_every_partition() -> None:
    from service.protocol.records import decode_records

    async with TestCluster(topics={"t": 3}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        assert p.config.max_in_flight_per_broker == 1
        release = asyncio.Event()
        cluster.delay(PRODUCE, until=release)
        calls = [asyncio.create_task(p.send_many("t", recs(2, 0, "a")))]
        await cluster.wait_for_requests(PRODUCE)
        calls += [asyncio.create_task(p.send_many("t", recs(3, part, f"p{part}-"))) for part in (0, 1, 2)]
        await until(lambda: p.acc.queued_records == 9)
        for _ in range(20):  # let the sender run its steps: nothing leaves while the first request is out
            await asyncio.sleep(0)
        assert p.requests_sent == 1
        release.set()
        for c in calls:
            assert all(isinstance(r, RecordMetadata) for r in await c)
        reqs = [e.request for e in cluster.requests(PRODUCE)]
        assert len(reqs) == 2
        second = sorted((pd.index, decode_records(pd.records).batches[0].records_count)
                        for t in reqs[1].topic_data for pd in t.partition_data)
        assert second == [(0, 3), (1, 3), (2, 3)]  # one request, a batch per partition


async def test_a_cancelled_caller_leaves_the_others_and_the_producer_working() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        release = asyncio.Event()
        cluster.delay(PRODUCE, until=release)
        first = asyncio.create_task(p.send_many("t", recs(2, 0, "a")))
        await cluster.wait_for_requests(PRODUCE)
        cancelled = asyncio.create_task(p.send_many("t", recs(2, 0, "b")))
        other = asyncio.create_task(p.send_many("t", recs(2, 0, "c")))
        await until(lambda: p.acc.queued_records == 4)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        release.set()
        assert [r.offset for r in await first] == [0, 1]
        assert [r.offset for r in await other] == [4, 5]  # the cancelled caller's records were still sent
        assert [r.offset for r in await p.send_many("t", recs(1, 0, "d"))] == [6]
        assert [r.value for r in cluster.partition_log("t", 0).records()] == [b"a0", b"a1", b"b0", b"b1", b"c0",
                                                                              b"c1", b"d0"]


async def test_the_next_request_leaves_before_the_answered_records_are_called_back() -> None:
    """One request in flight per broker: when its answer arrives, the records queued meanwhile are sent before
    the answered deliveries' callbacks run (they write the HTTP answers), so the broker works on them meanwhile;
    the callbacks still see their records acknowledged, and the next answer calls back the second delivery."""
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster, max_in_flight_per_broker=1) as p:
        assert all(isinstance(r, RecordMetadata) for r in await p.send_many("t", recs(1, 0, "w")))
        release = asyncio.Event()
        cluster.delay(PRODUCE, until=release, count=1)
        seen: list[tuple[str, int, int]] = []
        done = asyncio.Event()

        def on_done(tag: str) -> Any:
            def cb(delivery: Any) -> None:
                seen.append((tag, p.requests_sent, len(cluster.requests(PRODUCE))))
                assert not delivery.failed and delivery.metadata()[0].offset >= 1
                if tag == "b":
                    done.set()
            return cb

        assert p.submit("t", recs(2, 0, "a"), on_done("a"))
        await cluster.wait_for_requests(PRODUCE, count=2)
        assert p.submit("t", recs(3, 0, "b"), on_done("b"))  # queued behind the request in flight
        await until(lambda: p.acc.queued_records == 3)
        sent = p.requests_sent
        release.set()
        await asyncio.wait_for(done.wait(), 10)
        assert seen[0][:2] == ("a", sent + 1)  # b's request was written before a's callback ran
        assert [s[0] for s in seen] == ["a", "b"]
        log = [r.value for r in cluster.partition_log("t", 0).records()]
        assert log == [b"w0", b"a0", b"a1", b"b0", b"b1", b"b2"]
