"""The producer engine against real brokers (Tansu and Apache Kafka: the ``broker`` fixture), read back with
confluent-kafka (librdkafka). Also pins down what each broker does with idempotent produce (the engine relies on
it). Both hand out producer ids (epoch 0; a fresh Kafka first answers COORDINATOR_LOAD_IN_PROGRESS) and answer a
sequence gap with OUT_OF_ORDER_SEQUENCE_NUMBER (45). A batch resent with the same producer id and sequence is not
stored again: Kafka answers NONE with the original offset (while the batch is among the producer's last five),
Tansu DUPLICATE_SEQUENCE_NUMBER (46, base offset -1). A producer id the broker never handed out: Kafka 4.4 takes its
batch, Tansu answers UNKNOWN_PRODUCER_ID (59). A higher epoch: Kafka wants sequence 0 (else 45), Tansu answers
PRODUCER_FENCED (90).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.producer import Producer, ProducerConfig, RecordMetadata, partition_for_key
from service.producer.encoding import encode_batch
from service.protocol import messages as M
from service.protocol.records import Compression
from tests.conftest import AnyBroker

pytestmark = pytest.mark.integration
_TopicData = M.struct("ProduceRequest", "TopicProduceData")
_PartitionData = M.struct("ProduceRequest", "PartitionProduceData")


@pytest.fixture
async def producer(bclient: KafkaClient) -> AsyncIterator[Producer]:
    p = Producer(bclient)
    try:
        yield p
    finally:
        await p.close(timeout=10)


def read_back(bootstrap: str, topic: str, partitions: int, n: int, timeout: float = 30.0) -> list[Any]:
    """Every record of the topic (at least ``n``) as (partition, offset, key, value, headers)."""
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"rb-{time.time_ns()}", "enable.auto.commit": False})
    try:
        c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is None:
                    got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers() or []))
        return sorted(got)
    finally:
        c.close()


def ok(results: list[Any]) -> list[RecordMetadata]:
    assert all(isinstance(r, RecordMetadata) for r in results), results
    return results


async def test_round_trip_keys_values_headers_partitions_offsets(broker: AnyBroker, bclient: KafkaClient,
                                                                 producer: Producer, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 4})
    records: list[tuple[Any, ...]] = []
    for i in range(40):
        key = None if i % 5 == 0 else b"key-%d" % (i % 7)
        value = None if i == 13 else b"value-%d" % i
        headers = [("n", b"%d" % i), ("empty", b""), ("null", None)] if i % 2 else []
        partition = 3 if i % 10 == 9 else None
        records.append((key, value, headers, partition, 1_600_000_000_000 + i))
    res = ok(await producer.send_many(topic_name, records))
    for (key, _, _, partition, _), r in zip(records, res, strict=True):
        if partition is not None:
            assert r.partition == partition
        elif key is not None:
            assert r.partition == partition_for_key(key, 4)
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 4, 40)
    want = sorted((r.partition, r.offset, rec[0], rec[1], [(k, v) for k, v in rec[2]])
                  for rec, r in zip(records, res, strict=True))
    assert got == want
    # offsets per partition are dense from 0, in send order
    for part in range(4):
        offs = [r.offset for r in res if r.partition == part]
        assert offs == list(range(len(offs)))


async def test_key_partitioning_matches_librdkafka_murmur2(broker: AnyBroker, bclient: KafkaClient,
                                                           producer: Producer, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 7})
    keys = [b"user-%d" % i for i in range(200)] + [b"", b"\xff\x00\x10", "clé-ü".encode()]
    delivered: dict[bytes, int] = {}

    def ck_produce() -> None:
        p = CKProducer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random", "linger.ms": 5})

        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            delivered[msg.key()] = msg.partition()

        for k in keys:
            p.produce(topic_name, key=k, value=b"ck", on_delivery=cb)
        assert p.flush(30) == 0

    await asyncio.to_thread(ck_produce)
    assert len(delivered) == len(keys)
    res = ok(await producer.send_many(topic_name, [(k, b"ours", (), None, None) for k in keys]))
    assert {k: r.partition for k, r in zip(keys, res, strict=True)} == delivered
    assert len(set(delivered.values())) == 7  # the keys cover every partition: a real comparison


async def test_concurrent_callers_share_batches(broker: AnyBroker, bclient: KafkaClient, producer: Producer,
                                                topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    calls = 50
    results = await asyncio.gather(*[
        producer.send_many(topic_name, [(None, b"c%d-%d" % (j, i), (), 0, None) for i in range(20)])
        for j in range(calls)])
    offsets = sorted(r.offset for res in results for r in ok(res))
    assert offsets == list(range(calls * 20))
    for res in results:  # each caller's records are contiguous and in order
        offs = [r.offset for r in res]
        assert offs == list(range(offs[0], offs[0] + 20))
    assert producer.requests_sent < calls / 2  # batched across callers
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 1, calls * 20)
    assert len(got) == calls * 20


@pytest.mark.parametrize("codec", list(Compression))
async def test_compression_round_trip(broker: AnyBroker, bclient: KafkaClient, topic_name: str,
                                      codec: Compression) -> None:
    await bclient.create_topics({topic_name: 2})
    p = Producer(bclient, ProducerConfig(compression=codec))
    try:
        values = [(b"%d-" % i) * (i % 50 + 1) for i in range(300)]
        res = ok(await p.send_many(topic_name, [(b"k%d" % i, v, [("i", b"%d" % i)], i % 2, None)
                                                for i, v in enumerate(values)]))
    finally:
        await p.close()
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 2, 300)
    assert sorted((g[2], g[3], g[4]) for g in got) == sorted(
        (b"k%d" % i, v, [("i", b"%d" % i)]) for i, v in enumerate(values))
    assert {(g[0], g[1]) for g in got} == {(r.partition, r.offset) for r in res}


async def test_large_send_is_split_into_batches_under_the_cap(broker: AnyBroker, bclient: KafkaClient,
                                                              topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    p = Producer(bclient, ProducerConfig(max_batch_bytes=64 * 1024))
    try:
        res = ok(await p.send_many(topic_name, [(None, b"x" * 1000, (), 0, None) for _ in range(1000)]))
    finally:
        await p.close()
    assert [r.offset for r in res] == list(range(1000))
    assert p.acc.batches_sent >= 1000 * 1024 // (64 * 1024)


async def _raw_produce(client: KafkaClient, topic: str, payload: bytes) -> tuple[int, int]:
    req = M.ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000,
                           topic_data=[_TopicData(name=topic,
                                                  partition_data=[_PartitionData(index=0, records=payload)])])
    leader = client.metadata.leader(topic, 0)
    assert leader is not None
    resp = await client.send(leader, req)
    pr = resp.responses[0].partition_responses[0]
    return pr.error_code, pr.base_offset


async def test_idempotent_produce_semantics(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    kafka = broker.name == "kafka"
    await bclient.create_topics({topic_name: 1})
    init = M.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=2**31 - 1, producer_id=-1,
                                   producer_epoch=-1)
    deadline = time.monotonic() + 30
    while (r := await bclient.send_any(init)).error_code == 14:  # COORDINATOR_LOAD_IN_PROGRESS (a fresh Kafka)
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)  # the broker's producer-id block is on its way: nothing to await
    assert r.error_code == 0 and r.producer_id >= 0 and r.producer_epoch == 0
    pid = r.producer_id

    def batch(n: int, seq: int, tag: bytes, producer_id: int = pid, epoch: int = 0) -> bytes:
        return encode_batch([(None, tag + b"%d" % i, (), 1) for i in range(n)], producer_id=producer_id,
                            producer_epoch=epoch, base_sequence=seq)

    first = batch(3, 0, b"a")
    assert await _raw_produce(bclient, topic_name, first) == (0, 0)
    # a retry: not stored again
    assert await _raw_produce(bclient, topic_name, first) == ((0, 0) if kafka else (46, -1))
    assert await _raw_produce(bclient, topic_name, batch(2, 3, b"b")) == (0, 3)
    assert (await _raw_produce(bclient, topic_name, batch(1, 9, b"gap")))[0] == 45
    assert await _raw_produce(bclient, topic_name, batch(1, 0, b"who", producer_id=10**9)) == (
        (0, 5) if kafka else (59, -1))
    assert (await _raw_produce(bclient, topic_name, batch(1, 5, b"epoch", epoch=3)))[0] == (45 if kafka else 90)
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 1, 5 + kafka, 5.0)
    assert [g[3] for g in got] == [b"a0", b"a1", b"a2", b"b0", b"b1"] + ([b"who0"] if kafka else [])


async def test_engine_recovers_when_the_broker_forgets_the_producer(broker: AnyBroker, bclient: KafkaClient,
                                                                    producer: Producer, topic_name: str) -> None:
    """A producer id the broker does not know (as after a Tansu restart on memory:// storage): Tansu answers
    UNKNOWN_PRODUCER_ID and the engine takes a new id and resends; Kafka 4.4 takes the batches as they are. Nothing
    lost or doubled either way."""
    await bclient.create_topics({topic_name: 1})
    ok(await producer.send_many(topic_name, [(None, b"one", (), 0, None)]))
    producer.acc.producer_id = 10**9  # as if the broker had lost our id
    res = ok(await producer.send_many(topic_name, [(None, b"two", (), 0, None), (None, b"three", (), 0, None)]))
    assert [r.offset for r in res] == [1, 2]
    if broker.name == "kafka":
        assert producer.acc.producer_id_resets == 0 and producer.acc.producer_id == 10**9
    else:
        assert producer.acc.producer_id_resets == 1 and producer.acc.producer_id != 10**9
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 1, 3)
    assert [g[3] for g in got] == [b"one", b"two", b"three"]
