"""The producer engine against the protocol-level test broker: batching, leaders, retries, idempotence.

The test broker (``tests.fakes.broker``) keeps Apache Kafka's idempotent-producer semantics that matter here (a
batch resent with the same producer id, epoch and sequence is answered with its original offset and not
stored again) and lets the tests inject what Tansu cannot: dropped connections, lost answers, error codes,
leader moves, a broker that never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from service.client.client import KafkaClient
from service.producer import (
    ProduceFailure,
    Producer,
    ProducerClosedError,
    ProducerConfig,
    RecordMetadata,
    UnknownTopicError,
)
from service.protocol import messages as M
from tests.fakes.broker import TestCluster
from tests.fakes.broker.handlers import default_registry
from tests.fakes.broker.handlers import produce as produce_handler
from tests.fakes.broker.registry import CloseConnection

pytestmark = pytest.mark.integration
PRODUCE = M.ApiKey.PRODUCE
INIT_PID = M.ApiKey.INIT_PRODUCER_ID


@contextlib.asynccontextmanager
async def running(cluster: TestCluster, **cfg: Any) -> AsyncIterator[Producer]:
    client = KafkaClient(cluster.bootstrap_servers)
    producer = Producer(client, ProducerConfig(**cfg))
    try:
        yield producer
    finally:
        await producer.close(timeout=5)
        await client.close()


def recs(n: int, partition: int | None = None, tag: str = "v", key: bytes | None = None) -> list[tuple[Any, ...]]:
    return [(key, f"{tag}{i}".encode(), [("h", b"%d" % i)], partition, None) for i in range(n)]


def stored(cluster: TestCluster, topic: str, partition: int) -> list[bytes | None]:
    return [r.value for r in cluster.partition_log(topic, partition).records()]


def produce_requests(cluster: TestCluster, since: int = 0) -> list[Any]:
    return [e.request for e in cluster.requests(PRODUCE, since=since)]


def batches_of(req: Any) -> list[tuple[str, int, Any]]:
    from service.protocol.records import decode_records
    out = []
    for t in req.topic_data:
        for pd in t.partition_data:
            (b,) = decode_records(pd.records).batches
            out.append((t.name, pd.index, b))
    return out


class ProduceGate:
    """A Produce handler in front of the test broker's. ``plan`` entries apply to the next requests: an error
    code rejects the request without writing anything (Kafka's behaviour for an error answer; the test
    broker's own error injection writes first and then overwrites the code), ``"lose"`` writes and then
    closes the connection without answering (a lost answer)."""

    def __init__(self) -> None:
        self.plan: list[int | str] = []
        self.registry = default_registry(transactions=True)
        self.registry.register(PRODUCE, self.handle)

    async def handle(self, ctx: Any, req: Any) -> Any:
        if not self.plan:
            return await produce_handler.handle(ctx, req)
        action = self.plan.pop(0)
        if action == "lose":
            await produce_handler.handle(ctx, req)
            raise CloseConnection
        return M.ProduceResponse(throttle_time_ms=0, responses=[
            produce_handler.TopicResponse(name=t.name, partition_responses=[
                produce_handler.PartitionResponse(index=pd.index, error_code=action, base_offset=-1,
                                                  log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                                                  error_message=f"injected {action}")
                for pd in t.partition_data])
            for t in req.topic_data])


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the event loop until ``cond()`` holds (in-process state only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0)


def ok(results: list[Any]) -> list[RecordMetadata]:
    assert all(isinstance(r, RecordMetadata) for r in results), results
    return results


async def test_batches_form_while_a_request_is_in_flight_and_keep_order() -> None:
    async with TestCluster(topics={"t": 3}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        release = asyncio.Event()
        cluster.delay(PRODUCE, until=release)
        first = asyncio.create_task(p.send_many("t", recs(3, partition=0, tag="a")))
        await cluster.wait_for_requests(PRODUCE)
        calls = [asyncio.create_task(p.send_many("t", recs(10, partition=0, tag=f"c{j}-"))) for j in range(20)]
        await until(lambda: p.acc.queued_records == 200)
        release.set()
        r0 = ok(await first)
        results = [ok(await c) for c in calls]
        assert [r.offset for r in r0] == [0, 1, 2]
        # one batch for all 200 records of the 20 callers, in call order, right after the first
        offsets = [r.offset for res in results for r in res]
        assert offsets == list(range(3, 203))
        reqs = produce_requests(cluster)
        assert len(reqs) == 2
        (_, _, b1), = batches_of(reqs[0])
        (_, _, b2), = batches_of(reqs[1])
        assert (b1.records_count, b1.base_sequence) == (3, 0)
        assert (b2.records_count, b2.base_sequence) == (200, 3)
        assert b1.producer_id == b2.producer_id >= 0 and b1.producer_epoch == 0
        assert stored(cluster, "t", 0) == [b"a0", b"a1", b"a2"] + [f"c{j}-{i}".encode() for j in range(20)
                                                                    for i in range(10)]
        headers = [r.headers for r in cluster.partition_log("t", 0).records()]
        assert headers[:2] == [(("h", b"0"),), (("h", b"1"),)]
        assert len(cluster.requests(INIT_PID)) == 1


async def test_one_request_per_leader_and_keyed_partitions() -> None:
    async with TestCluster(2, topics={"t": 6}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        records = [(b"key-%d" % i, b"v%d" % i, (), None, None) for i in range(60)]
        res = ok(await p.send_many("t", records))
        from service.producer import partition_for_key
        assert [r.partition for r in res] == [partition_for_key(b"key-%d" % i, 6) for i in range(60)]
        reqs = produce_requests(cluster)
        leaders = set(cluster.leaders("t").values())
        assert len(reqs) == len(leaders) == 2  # every partition of a leader in one request
        assert sorted(idx for req in reqs for _, idx, _ in batches_of(req)) == sorted({r.partition for r in res})
        for part in range(6):
            want = [b"v%d" % i for i in range(60) if res[i].partition == part]
            assert stored(cluster, "t", part) == want
            assert [r.offset for r in res if r.partition == part] == list(range(len(want)))


async def test_leader_move_is_followed_with_the_same_batch() -> None:
    async with TestCluster(2, topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        ok(await p.send_many("t", recs(2, tag="x")))
        old = cluster.leader_of("t", 0)
        cluster.move_leader("t", 0)
        assert cluster.leader_of("t", 0) != old
        since = len(cluster.requests())
        res = ok(await p.send_many("t", recs(3, tag="y")))
        assert [r.offset for r in res] == [2, 3, 4]
        attempts = [e for e in cluster.requests(PRODUCE, since=since)]
        assert [e.node_id for e in attempts] == [old, cluster.leader_of("t", 0)]
        seqs = {batches_of(e.request)[0][2].base_sequence for e in attempts}
        assert seqs == {2}  # the retry is the same batch
        assert len(cluster.requests(M.ApiKey.METADATA, since=since)) >= 1
        assert stored(cluster, "t", 0) == [b"x0", b"x1", b"y0", b"y1", b"y2"]


async def test_dropped_connection_is_retried_once_stored() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        cluster.drop_connection(PRODUCE)
        res = ok(await p.send_many("t", recs(4)))
        assert [r.offset for r in res] == [0, 1, 2, 3]
        assert [e.outcome for e in cluster.requests(PRODUCE)] == ["dropped", "answered"]
        assert stored(cluster, "t", 0) == [b"v0", b"v1", b"v2", b"v3"]


async def test_answer_lost_after_the_write_is_not_stored_twice() -> None:
    gate = ProduceGate()
    async with TestCluster(topics={"t": 1}, registry=gate.registry) as cluster, running(cluster) as p:
        ok(await p.send_many("t", recs(1, tag="before")))
        gate.plan = ["lose"]
        res = ok(await p.send_many("t", recs(3)))
        assert [r.offset for r in res] == [1, 2, 3]  # the broker's original offsets for the duplicate
        attempts = produce_requests(cluster)[1:]
        assert len(attempts) == 2
        assert batches_of(attempts[0])[0][2].base_sequence == batches_of(attempts[1])[0][2].base_sequence == 1
        assert stored(cluster, "t", 0) == [b"before0", b"v0", b"v1", b"v2"]
        assert len(cluster.requests(INIT_PID)) == 1  # a retry, not a reset


@pytest.mark.parametrize("code", [59, 45])  # UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER
async def test_producer_state_errors_resend_under_a_new_producer_id(code: int) -> None:
    gate = ProduceGate()
    async with TestCluster(topics={"t": 1}, registry=gate.registry) as cluster, running(cluster) as p:
        ok(await p.send_many("t", recs(2, tag="a")))
        gate.plan = [code]
        res = ok(await p.send_many("t", recs(2, tag="b")))
        assert [r.offset for r in res] == [2, 3]
        assert len(cluster.requests(INIT_PID)) == 2
        reqs = produce_requests(cluster)
        first_pid = batches_of(reqs[0])[0][2].producer_id
        last = batches_of(reqs[-1])[0][2]
        assert last.producer_id != first_pid and last.base_sequence == 0
        assert stored(cluster, "t", 0) == [b"a0", b"a1", b"b0", b"b1"]


async def test_message_too_large_splits_the_batch() -> None:
    gate = ProduceGate()
    async with TestCluster(topics={"t": 1}, registry=gate.registry) as cluster, running(cluster) as p:
        gate.plan = [10]  # MESSAGE_TOO_LARGE, once
        res = ok(await p.send_many("t", recs(10)))
        assert [r.offset for r in res] == list(range(10))
        counts = [batches_of(r)[0][2].records_count for r in produce_requests(cluster)]
        assert counts == [10, 5, 5]
        assert stored(cluster, "t", 0) == [b"v%d" % i for i in range(10)]


async def test_non_retriable_error_fails_those_records_only() -> None:
    gate = ProduceGate()
    async with TestCluster(topics={"t": 1}, registry=gate.registry) as cluster, running(cluster) as p:
        gate.plan = [87]  # INVALID_RECORD, once
        failed = await p.send_many("t", recs(3))
        for r in failed:
            assert isinstance(r, ProduceFailure) and r.code == 87 and not r.retriable
            assert "INVALID_RECORD" in r.message and r.partition == 0
        res = ok(await p.send_many("t", recs(2, tag="next")))
        assert [r.offset for r in res] == [0, 1]
        assert batches_of(produce_requests(cluster)[-1])[0][2].base_sequence == 0  # no sequence gap
        assert stored(cluster, "t", 0) == [b"next0", b"next1"]


async def test_broker_that_never_answers_fails_records_retriably_then_recovers() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster, request_timeout_ms=300, delivery_timeout_ms=1000) as p:
        cluster.delay(PRODUCE, math.inf, count=1000)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        res = await p.send_many("t", recs(2))
        assert 0.9 < loop.time() - t0 < 5
        for r in res:
            assert isinstance(r, ProduceFailure) and r.retriable and r.code in (7, 13)
            assert "may have been written" in r.message
        cluster.clear_faults()
        res = ok(await p.send_many("t", recs(2, tag="w")))
        assert len(cluster.requests(INIT_PID)) == 2  # outcome unknown: a new producer id
        assert stored(cluster, "t", 0)[-2:] == [b"w0", b"w1"]
        assert res[-1].offset == len(stored(cluster, "t", 0)) - 1


async def test_a_bug_while_handling_an_answer_fails_those_records_only() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        real = p.acc.on_response

        def broken(*args: Any, **kw: Any) -> Any:
            p.acc.on_response = real  # type: ignore[method-assign]
            raise RuntimeError("boom")

        p.acc.on_response = broken  # type: ignore[method-assign]
        res = await p.send_many("t", recs(2))
        for r in res:
            assert isinstance(r, ProduceFailure) and not r.retriable and "internal error" in r.message
        ok(await p.send_many("t", recs(1, tag="after")))
        assert len(cluster.requests(INIT_PID)) == 2  # the failed batch may have been written: new id


async def test_unknown_topic_and_partition() -> None:
    async with TestCluster(topics={"t": 2}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        with pytest.raises(UnknownTopicError):
            await p.send_many("nope", recs(1))
        assert "nope" not in p.client._interest  # an unknown name leaves no trace in the metadata interest
        res = await p.send_many("t", recs(1, partition=0) + recs(1, partition=7) + recs(1, partition=1))
        assert isinstance(res[0], RecordMetadata) and isinstance(res[2], RecordMetadata)
        bad = res[1]
        assert isinstance(bad, ProduceFailure) and bad.code == 3 and not bad.retriable and bad.partition == 7
        assert await p.partitions("t") == [0, 1]
        cluster.create_topic("later", 3)
        assert await p.partition_count("later") == 3  # a topic created after a miss is found


async def test_init_producer_id_refused_fails_records_then_recovers() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        cluster.error(INIT_PID, 31)  # CLUSTER_AUTHORIZATION_FAILED
        res = await p.send_many("t", recs(2))
        for r in res:
            assert isinstance(r, ProduceFailure) and r.code == 31 and not r.retriable
            assert "producer id" in r.message
        ok(await p.send_many("t", recs(1)))
        assert len(cluster.requests(INIT_PID)) == 2


async def test_broker_without_idempotence_support() -> None:
    # the default registry has no InitProducerId handler: the broker does not advertise it
    async with TestCluster(topics={"t": 1}) as cluster:
        async with running(cluster) as p:
            res = await p.send_many("t", recs(1))
            assert isinstance(res[0], ProduceFailure) and not res[0].retriable
        async with running(cluster, idempotent=False) as p:
            res = ok(await p.send_many("t", recs(2)))
            assert [r.offset for r in res] == [0, 1]
            (_, _, b), = batches_of(produce_requests(cluster)[-1])
            assert (b.producer_id, b.base_sequence) == (-1, -1)


async def test_close_sends_what_is_queued_and_is_bounded() -> None:
    async with TestCluster(topics={"t": 1}, registry=default_registry(transactions=True)) as cluster:
        client = KafkaClient(cluster.bootstrap_servers)
        p = Producer(client)
        try:
            release = asyncio.Event()
            cluster.delay(PRODUCE, until=release)
            task = asyncio.create_task(p.send_many("t", recs(2)))
            await cluster.wait_for_requests(PRODUCE)
            closing = asyncio.create_task(p.close(timeout=10))
            await until(lambda: p.closed)
            with pytest.raises(ProducerClosedError):
                await p.send_many("t", recs(1))
            release.set()
            await closing
            assert [r.offset for r in ok(await task)] == [0, 1]  # flushed before close returned
            # a close that cannot flush gives up after its timeout, failing the records retriably
            p2 = Producer(client)
            cluster.delay(PRODUCE, math.inf, count=10)
            since = len(cluster.requests())
            task = asyncio.create_task(p2.send_many("t", recs(2)))
            await cluster.wait_for_requests(PRODUCE, since=since)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await p2.close(timeout=0.3)
            assert loop.time() - t0 < 2
            for r in await task:
                assert isinstance(r, ProduceFailure) and r.retriable and "closed" in r.message
        finally:
            await client.close()


async def test_submit_queues_without_awaiting_once_metadata_is_fresh() -> None:
    """Producer.submit (the protocol-level produce path): False and nothing queued while the topic is not in
    fresh metadata or the producer is closed; else the records are queued at once and on_done gets their
    delivery exactly once (also when every record failed while being queued); acknowledged runs of plain
    records are kept as (first index, partition, base offset, count), per-record results on demand."""
    from service.producer.accumulator import ACKED, Delivery

    async with TestCluster(topics={"t": 2}, registry=default_registry(transactions=True)) as cluster, \
            running(cluster) as p:
        answers: list[Delivery] = []
        assert p.submit("t", recs(2), answers.append) is False  # metadata not fetched yet
        assert p.acc.queued_records == 0 and answers == []
        ok(await p.send_many("t", recs(1, partition=0)))  # fetches it
        assert p.submit("t", recs(3, partition=1, tag="s"), answers.append) is True
        await until(lambda: len(answers) == 1)
        assert [r.offset for r in ok(answers[0].metadata())] == [0, 1, 2]
        assert stored(cluster, "t", 1) == [b"s0", b"s1", b"s2"]
        # plain records (no key, partition or headers): one run, no RecordMetadata until asked for
        plain = [(None, b"p%d" % i, (), None, None) for i in range(5)]
        assert p.submit("t", plain, answers.append) is True
        await until(lambda: len(answers) == 2)
        d = answers[1]
        assert d.failed == 0 and len(d.offsets) == 1 and d.results == [ACKED] * 5
        first, partition, base, count = d.offsets[0]
        assert (first, count) == (0, 5)
        assert [(r.partition, r.offset) for r in ok(d.metadata())] == [(partition, base + i) for i in range(5)]
        assert stored(cluster, "t", partition)[base:] == [b"p%d" % i for i in range(5)]
        # every record asks for a partition that does not exist: failed while queued, answered once, at once
        assert p.submit("t", recs(2, partition=7), answers.append) is True
        assert len(answers) == 3 and all(isinstance(r, ProduceFailure) for r in answers[2].metadata())
        assert p.submit("t", [], answers.append) is False

        # a callback that fails does not keep the other callers of the same batch waiting
        def broken(delivery: Delivery) -> None:
            raise RuntimeError("a bug in a caller")

        before = len(produce_requests(cluster))
        assert p.submit("t", recs(1, partition=0, tag="x"), broken) is True
        assert p.submit("t", recs(1, partition=0, tag="y"), answers.append) is True  # (the same batch)
        await until(lambda: len(answers) == 4)
        assert len(produce_requests(cluster)) == before + 1
        assert ok(answers[3].metadata())[0].offset == stored(cluster, "t", 0).index(b"y0")
        await p.close()
        assert p.submit("t", recs(1), answers.append) is False
        assert len(answers) == 4 and p.records_acked == 11 and p.records_failed == 2
