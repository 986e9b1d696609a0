"""Produce → Fetch against real brokers (Tansu and Apache Kafka): batches written by librdkafka (confluent-kafka) in
every compression codec are fetched with Fetch v12 (topic names) and v13+ (topic ids) and decoded by us;
batches we encode with our Produce codec are read back by librdkafka."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.fetch.session import FetchPartitionData, FetchSessionHandler, to_fetch_request
from service.protocol import messages as M
from service.protocol.records import Compression, Record, build_batch, decode_records
from tests.conftest import AnyBroker

pytestmark = pytest.mark.integration
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def produce_with_librdkafka(bootstrap: str, topic: str, n: int, codec: str, partition: int = 0) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                    "enable.idempotence": False, "acks": "all"})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=(f"v{i}-" + "x" * 100).encode(), partition=partition,
                  headers=[("h", f"{i}".encode()), ("null", None)] if i % 2 == 0 else None,
                  timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0


async def fetch_all(client: KafkaClient, topic: str, partition: int, version: int, expect: int) -> list[Record]:
    md = client.metadata
    node = md.leader(topic, partition)
    assert node is not None
    conn = await client.connection(node).get()
    out: list[Record] = []
    offset = 0
    for _ in range(50):
        h = FetchSessionHandler(node)
        b = h.builder()
        b.add(FetchPartitionData(topic=topic, topic_id=md.topic_id(topic), partition=partition, fetch_offset=offset,
                                 partition_max_bytes=64 * 1024))
        data = b.build()
        req = to_fetch_request(data, version=version, max_wait_ms=100, min_bytes=1)
        resp = await conn.send(req, version)
        assert h.handle_response(resp, version)
        parts = h.response_partitions(resp, version)
        p = parts[(topic, partition)]
        assert p.error_code == 0
        rs = decode_records(p.records or b"", topic=topic, partition=partition)
        recs = [r for r in rs.records() if r.offset >= offset]
        out += recs
        if rs.next_offset is not None:
            offset = rs.next_offset
        if len(out) >= expect:
            break
    return out


@pytest.mark.parametrize("codec", CODECS)
async def test_fetch_librdkafka_batches_in_every_codec(broker: AnyBroker, bclient: KafkaClient,
                                                       topic_name: str, codec: str) -> None:
    await bclient.create_topics({topic_name: 1})
    n = 300
    await asyncio.to_thread(produce_with_librdkafka, broker.bootstrap, topic_name, n, codec)
    conn = await bclient.any_connection()
    top = conn.version_for(M.ApiKey.FETCH)
    assert top >= 13
    for version in (12, top):
        recs = await fetch_all(bclient, topic_name, 0, version, n)
        assert [r.offset for r in recs] == list(range(n)), f"v{version}"
        assert recs[7].key == b"k7" and recs[7].value == b"v7-" + b"x" * 100
        assert recs[8].headers == (("h", b"8"), ("null", None))
        assert recs[7].headers == ()
        assert recs[5].timestamp == 1_700_000_000_005


async def test_batches_carry_the_producer_codec(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    """Tansu stores batches as sent: the codec attribute survives (so each decoder path really ran)."""
    await bclient.create_topics({topic_name: 1})
    await asyncio.to_thread(produce_with_librdkafka, broker.bootstrap, topic_name, 50, "zstd")
    md = bclient.metadata
    conn = await bclient.connection(md.leader(topic_name, 0)).get()  # type: ignore[arg-type]
    h = FetchSessionHandler()
    b = h.builder()
    b.add(FetchPartitionData(topic=topic_name, topic_id=md.topic_id(topic_name), partition=0, fetch_offset=0))
    resp = await conn.send(to_fetch_request(b.build(), version=12, max_wait_ms=100, min_bytes=1), 12)
    blob = resp.responses[0].partitions[0].records
    rs = decode_records(blob)
    assert rs.batches and all(bt.compression == Compression.ZSTD for bt in rs.batches)


def _produce_request(topic: str, partition: int, batch: bytes) -> Any:
    TopicData = M.struct("ProduceRequest", "TopicProduceData")
    PartData = M.struct("ProduceRequest", "PartitionProduceData")
    return M.ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
        TopicData(name=topic, partition_data=[PartData(index=partition, records=batch)])])


@pytest.mark.parametrize("version", [3, 9, 11])
@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
async def test_our_produce_is_read_by_librdkafka(broker: AnyBroker, bclient: KafkaClient, topic_name: str,
                                                 version: int, codec: Compression) -> None:
    await bclient.create_topics({topic_name: 1})
    # Kafka may list a new topic before its leader is elected (LEADER_NOT_AVAILABLE): ask again until there is one
    deadline = asyncio.get_running_loop().time() + 10
    while (leader := bclient.metadata.leader(topic_name, 0)) is None:
        assert asyncio.get_running_loop().time() < deadline, "no leader"
        await asyncio.sleep(0.02)  # the controller elects the leader: no event to await from here
        await bclient.refresh_metadata([topic_name])
    conn = await bclient.connection(leader).get()
    batch = build_batch([(b"key", b"value-0", [("a", b"1")]), (None, b"value-1"), (b"k2", None)], compression=codec)
    resp = await conn.send(_produce_request(topic_name, 0, batch), version)
    part = resp.responses[0].partition_responses[0]
    if codec == Compression.ZSTD and version < 7 and broker.name == "kafka":
        # zstd needs Produce v7+ (KIP-110): Kafka refuses it before (Tansu stores it)
        assert (part.error_code, part.base_offset) == (76, -1)  # UNSUPPORTED_COMPRESSION_TYPE
        return
    assert part.error_code == 0 and part.base_offset == 0

    def consume() -> list[Any]:
        c = CKConsumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}",
                        "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
        c.assign([CKTopicPartition(topic_name, 0, 0)])
        got = []
        for _ in range(50):
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m)
            if len(got) == 3:
                break
        c.close()
        return got

    got = await asyncio.to_thread(consume)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (0, b"key", b"value-0"), (1, None, b"value-1"), (2, b"k2", None)]
    assert got[0].headers() == [("a", b"1")]
