"""service/cluster/topics.py against a real Tansu broker: topic metadata, configs (DescribeConfigs) and partition
offsets (beginning, high watermark, last stable offset) with multi-record batches and an open transaction."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.cluster.topics import PartitionNotFound, TopicCatalog, TopicNotFound, visible_topic_names
from service.consumer.subscription import TopicPartition
from service.fetch.offsets import read_offsets
from service.protocol import messages as M
from tests.conftest import AnyBroker

pytestmark = pytest.mark.integration


def produce_batch(bootstrap: str, topic: str, n: int, partition: int = 0) -> list[int]:
    """``n`` records sent together (one multi-record batch: a long linger, one flush); their offsets."""
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 1000, "batch.num.messages": 10_000})
    offsets: list[int] = []
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=partition,
                  on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
    assert p.flush(30) == 0
    assert len(offsets) == n
    return offsets


@contextlib.contextmanager
def open_transaction(bootstrap: str, topic: str, n: int, txn_id: str) -> Iterator[CKProducer]:
    """A transaction with ``n`` records written (flushed) and left open; aborted on exit if still open."""
    p = CKProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, value=b"t%d" % i, partition=0)
    assert p.flush(30) == 0
    try:
        yield p
    finally:
        with contextlib.suppress(KafkaException):
            p.abort_transaction(30)


async def test_offsets_with_multi_record_batches_and_an_open_transaction(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    tp = TopicPartition(topic_name, 0)
    empty = await read_offsets(bclient, TopicPartition(topic_name, 1))
    assert empty.to_json() == {"beginning_offset": 0, "end_offset": 0, "last_stable_offset": 0}

    first = await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 10)
    second = await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 5)
    assert first == list(range(10)) and second == list(range(10, 15))
    got = await read_offsets(bclient, tp)
    assert (got.beginning_offset, got.end_offset, got.last_stable_offset) == (0, 15, 15)
    # (ListOffsets(latest), which librdkafka's watermark query uses, says 11 here on Tansu 0.6: the base
    # offset of the last batch + 1)

    with open_transaction(broker.bootstrap, topic_name, 3, f"txn-{topic_name}") as txn:
        after = await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 4)
        assert after[-1] == 21  # 15-17 transactional, 18-21 after it
        got = await read_offsets(bclient, tp)
        # the open transaction holds the LSO at its first record; the high watermark is past everything
        assert (got.beginning_offset, got.end_offset, got.last_stable_offset) == (0, 22, 15)
        await asyncio.to_thread(txn.commit_transaction, 30)
    # Kafka writes the COMMIT marker (one offset) after EndTxn is answered: the LSO moves a moment later
    deadline = time.monotonic() + 10
    while (got := await read_offsets(bclient, tp)).last_stable_offset != got.end_offset:
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.02)  # no event tells when the broker has written the marker
    assert got.end_offset == 23 if broker.name == "kafka" else got.end_offset >= 22  # Tansu's marker may take none
    assert got.beginning_offset == 0


async def test_offsets_answer_for_every_partition_from_its_leader(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 3})
    for part, n in ((0, 2), (1, 7), (2, 0)):
        if n:
            await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, n, part)
    results = await asyncio.gather(*(read_offsets(bclient, TopicPartition(topic_name, p)) for p in range(3)))
    assert [(r.end_offset, r.last_stable_offset) for r in results] == [(2, 2), (7, 7), (0, 0)]


async def test_catalog_lists_describes_and_reads_configs(broker: AnyBroker, bclient: KafkaClient,
                                                        topic_name: str) -> None:
    other = topic_name + "-other"
    await bclient.create_topics({topic_name: 3, other: 1},
                                configs={topic_name: {"retention.ms": "123456", "cleanup.policy": "compact"}})
    # a fresh client: the catalog must not depend on what the creating client already knows
    client = KafkaClient(broker.bootstrap)
    try:
        cat = TopicCatalog(client, ttl=60.0)
        listed = await asyncio.gather(*(cat.list_topics() for _ in range(20)))
        assert cat.metadata_requests == 1  # concurrent callers shared one Metadata request
        names = visible_topic_names(listed[0], lambda n: n.startswith(topic_name))
        assert names == sorted([topic_name, other])
        view = await cat.topic(topic_name)
        assert [p.partition for p in view.partitions] == [0, 1, 2]
        broker_ids = set(client.metadata.brokers) or {b for p in view.partitions for b in p.replicas}
        for p in view.partitions:
            assert p.leader in broker_ids and p.leader in p.replicas and p.leader in p.isr
        assert cat.metadata_requests == 1  # answered from the listing
        configs = await cat.configs(topic_name)
        # Tansu answers DescribeConfigs with the configs given at creation (Kafka adds every default)
        assert configs["retention.ms"] == "123456" and configs["cleanup.policy"] == "compact"
        assert (await cat.partition(topic_name, 2)).partition == 2
        with pytest.raises(PartitionNotFound):
            await cat.partition(topic_name, 3)
        with pytest.raises(TopicNotFound):
            await cat.topic(topic_name + "-missing")
        # a topic created after the listing is found at once, and joins the cached listing
        late = topic_name + "-late"
        await bclient.create_topics({late: 2})
        assert len((await cat.topic(late)).partitions) == 2
        assert late in visible_topic_names(await cat.list_topics(), lambda n: True)
        offsets = await cat.offsets(topic_name, 1)
        assert offsets.to_json() == {"beginning_offset": 0, "end_offset": 0, "last_stable_offset": 0}
    finally:
        await client.close()


async def test_describe_configs_codec_against_tansu(bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1}, configs={topic_name: {"max.message.bytes": "65536"}})
    Res = M.struct("DescribeConfigsRequest", "DescribeConfigsResource")
    conn = await bclient.any_connection()
    top = conn.version_for(M.ApiKey.DESCRIBE_CONFIGS)
    assert top == 4  # Tansu advertises DescribeConfigs 0-4; we implement 1-4
    for version in range(1, top + 1):
        resp = await conn.send(M.DescribeConfigsRequest(resources=[Res(resource_type=2, resource_name=topic_name,
                                                                       configuration_keys=None)]), version)
        [result] = resp.results
        assert (result.error_code, result.resource_name) == (0, topic_name)
        assert {c.name: c.value for c in result.configs}["max.message.bytes"] == "65536", version
