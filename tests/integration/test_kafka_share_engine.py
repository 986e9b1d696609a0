"""Share groups (KIP-932) through our own engine (service/share/) against Apache Kafka 4.4 (Tansu has no share
groups: docs/brokers.md). Every record produced is counted: delivered exactly once overall when all are accepted,
released ones come back with their delivery count one higher, rejected ones never, and a consumer that closes
while holding records releases them at once (not after the 30 s lock).

Share groups start at the latest offset (``share.auto.offset.reset``), so records are produced only once every
partition had a ShareFetch from a member."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError
from service.embedded.kafka import EmbeddedKafka
from service.protocol import error_codes as EC
from service.share.admin import (
    alter_group_config,
    alter_share_group_offsets,
    delete_share_group_offsets,
    describe_share_group,
    list_share_groups,
    share_group_offsets,
)
from service.share.consumer import ShareConsumer, ShareRecord
from service.share.session import AckType

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=i % partitions)
    assert p.flush(15) == 0


@pytest.fixture
async def client(kafka: EmbeddedKafka) -> AsyncIterator[KafkaClient]:
    c = KafkaClient(kafka.bootstrap)
    yield c
    await c.close()


async def new_topic(client: KafkaClient, partitions: int) -> str:
    topic = f"share-{uuid.uuid4().hex[:8]}"
    await client.create_topics({topic: partitions})
    await client.refresh_metadata([topic])
    return topic


async def ready(consumers: list[ShareConsumer], topic: str, partitions: int, timeout: float = 20.0) -> None:
    """Until the members hold every partition between them and each member fetched once since (the share
    partitions then exist on the broker, at the latest offset)."""
    deadline = time.monotonic() + timeout
    while True:
        held = {(tid, p) for c in consumers for tid, p in c.member.assigned()}
        if len(held) == partitions:
            break
        assert time.monotonic() < deadline, f"assignment incomplete: {held}"
        await asyncio.gather(*(c.poll(0.1) for c in consumers))
    got = await asyncio.gather(*(c.poll(0.1) for c in consumers))
    assert not any(got), "nothing was produced yet"


async def drain(consumers: list[ShareConsumer], want: int, timeout: float = 20.0,
                ack: AckType | None = AckType.ACCEPT, limit: int | None = None) -> list[tuple[int, ShareRecord]]:
    """Poll all consumers until ``want`` records arrived (acknowledging each with ``ack``; each poll returning at
    most ``limit``): (consumer, record)."""
    out: list[tuple[int, ShareRecord]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want:
        assert time.monotonic() < deadline, f"{len(out)} of {want} records"
        batches = await asyncio.gather(*(c.poll(0.3) for c in consumers))
        for i, (c, batch) in enumerate(zip(consumers, batches, strict=True)):
            assert limit is None or len(batch) <= limit, len(batch)
            for r in batch:
                out.append((i, r))
                if ack is not None:
                    assert c.acknowledge(r.topic, r.partition, r.offset, ack) is None
    return out


async def test_three_members_two_partitions_each_record_exactly_once(kafka: EmbeddedKafka,
                                                                      client: KafkaClient) -> None:
    topic = await new_topic(client, 2)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    # record-limit mode: at most 10 records per ShareFetch, so the members share each partition's batches
    consumers = [ShareConsumer(client, group, [topic], max_wait_ms=300, max_records=10, record_limit=True)
                 for _ in range(3)]
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        await ready(consumers, topic, 2)
        # more members than partitions: the partitions are shared, every member has some
        assert all(c.member.assigned() for c in consumers)
        n = 120
        await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 2)
        got = await drain(consumers, n, limit=10)
        keys = Counter((r.partition, r.offset) for _, r in got)
        assert len(keys) == n and set(keys.values()) == {1}, "each record delivered exactly once"
        assert {r.delivery_count for _, r in got} == {1}
        assert sorted(r.value for _, r in got) == sorted(f"v{i}".encode() for i in range(n))
        assert len({i for i, _ in got}) == 3, Counter(i for i, _ in got)  # records spread over every member
        results = [r for c in consumers for r in await c.commit()]
        # (results come as runs of offsets)
        assert sum(len(r.offsets) for r in results) == n and all(r.applied for r in results), \
            Counter(r.error_code for r in results)
        # all accepted: nothing comes back
        again = await asyncio.gather(*(c.poll(0.3) for c in consumers))
        assert not any(again)
    finally:
        await asyncio.gather(*(c.close() for c in consumers))
    assert all(c.member.state.value == "left" for c in consumers)


async def test_release_redelivers_reject_archives_close_releases(kafka: EmbeddedKafka, client: KafkaClient) -> None:
    topic = await new_topic(client, 2)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    first = ShareConsumer(client, group, [topic], max_wait_ms=300)
    await first.start()
    try:
        await ready([first], topic, 2)
        n = 20
        await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 2)
        got = [r for _, r in await drain([first], n, ack=None)]
        assert {r.delivery_count for r in got} == {1}
        released = {(r.partition, r.offset) for r in got if r.offset % 2 == 0}
        rejected = {(r.partition, r.offset) for r in got if r.offset % 2 == 1}
        for r in got:
            kind = AckType.RELEASE if (r.partition, r.offset) in released else AckType.REJECT
            assert first.acknowledge(r.topic, r.partition, r.offset, kind) is None
        # acknowledging the same record twice is refused locally, never sent
        dup = first.acknowledge(got[0].topic, got[0].partition, got[0].offset, AckType.ACCEPT)
        assert dup is not None and not dup.applied
        results = await first.commit()
        assert sum(len(r.offsets) for r in results) == n and all(r.applied for r in results)
        # the released come back, one delivery later; the rejected never
        back = [r for _, r in await drain([first], len(released), ack=None)]
        assert {(r.partition, r.offset) for r in back} == released
        assert len(rejected) == n - len(released) and not rejected & {(r.partition, r.offset) for r in back}
        assert {r.delivery_count for r in back} == {2}
        # leave them unacknowledged and close: the next member gets them at once, with delivery count 3
        closing = await first.close()
        assert all(r.applied for r in closing), closing
    finally:
        await first.close()
    second = ShareConsumer(client, group, [topic], max_wait_ms=300)
    await second.start()
    try:
        t0 = time.monotonic()
        third = [r for _, r in await drain([second], len(released), timeout=15.0)]
        assert time.monotonic() - t0 < 15.0  # well inside the broker's 30 s acquisition lock
        assert {(r.partition, r.offset) for r in third} == released  # no rejected record among them
        assert {r.delivery_count for r in third} == {3}
        results = await second.commit()
        assert sum(len(r.offsets) for r in results) == len(released) and all(r.applied for r in results)
        assert not await second.poll(0.5)
    finally:
        await second.close()


async def test_renew_delivery_limit_and_admin(kafka: EmbeddedKafka, client: KafkaClient) -> None:
    topic = await new_topic(client, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    c = ShareConsumer(client, group, [topic], max_wait_ms=300)
    await c.start()
    try:
        await ready([c], topic, 1)
        await asyncio.to_thread(produce, kafka.bootstrap, topic, 3, 1)
        got = {r.offset: r for _, r in await drain([c], 3, ack=None)}
        assert sorted(got) == [0, 1, 2]

        described = await describe_share_group(client, group)
        assert described.group_state == "Stable"
        [member] = described.members
        assert member.member_id == c.member_id and member.subscribed_topic_names == [topic]
        assert [(tp.topic_name, list(tp.partitions)) for tp in member.assignment.topic_partitions] == [(topic, [0])]
        assert (await list_share_groups(client))[group] == "Stable"

        # renew keeps the lock (Kafka 4.4 allows it by default): the deadline moves on, the record stays ours
        [session] = [s for s in c.sessions.values() if s.acquired_count()]
        tp = c.topic_partition(topic, 0)
        await asyncio.sleep(0.05)
        assert c.acknowledge(topic, 0, 0, AckType.RENEW) is None
        [renewed] = await c.commit()
        assert renewed.applied and session.acquired(tp)[0].deadline > got[0].lock_deadline

        # released again and again: after the broker's delivery-count limit (5) it is archived, never redelivered
        counts = [got[1].delivery_count]
        while True:
            assert c.acknowledge(topic, 0, 1, AckType.RELEASE) is None
            [released] = await c.commit()
            assert released.applied
            back = [r for r in await c.poll(0.5) if r.offset == 1]
            if not back:
                break
            counts.append(back[0].delivery_count)
            assert len(counts) <= 5, counts
        assert counts == [1, 2, 3, 4, 5]
        assert not await c.poll(0.5)

        for offset in (0, 2):
            assert c.acknowledge(topic, 0, offset, AckType.ACCEPT) is None
        assert all(r.applied for r in await c.commit())
        # every record settled: no lag (the start offset the broker reports may trail: asserted on reset below)
        assert (await share_group_offsets(client, group))[(topic, 0)].lag == 0
        # a group with members cannot be reset
        with pytest.raises(BrokerResponseError) as refused:
            await alter_share_group_offsets(client, group, {(topic, 0): 0})
        assert refused.value.code == EC.NON_EMPTY_GROUP
    finally:
        await c.close()

    # empty now: the start offset can be set and read back, and the group's share partitions deleted
    assert await alter_share_group_offsets(client, group, {(topic, 0): 1}) == {(topic, 0): 0}
    assert (await share_group_offsets(client, group))[(topic, 0)].start_offset == 1
    assert await delete_share_group_offsets(client, group, [topic]) == {topic: 0}
    assert (topic, 0) not in await share_group_offsets(client, group)


async def test_group_configs_earliest_and_an_expired_lock(kafka: EmbeddedKafka, client: KafkaClient) -> None:
    """share.auto.offset.reset=earliest delivers what was produced before the group existed; a record left
    unacknowledged past the group's 1 s lock comes back with its delivery count one higher."""
    topic = await new_topic(client, 1)
    group = f"sg-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(produce, kafka.bootstrap, topic, 2, 1)
    await alter_group_config(client, group, {"share.auto.offset.reset": "earliest",
                                             "share.record.lock.duration.ms": "1000"})
    c = ShareConsumer(client, group, [topic], max_wait_ms=300)
    await c.start()
    try:
        first = {r.offset: r for _, r in await drain([c], 2, ack=None)}
        assert sorted(first) == [0, 1] and {r.delivery_count for r in first.values()} == {1}
        assert c.acknowledge(topic, 0, 0, AckType.ACCEPT) is None
        assert [r.applied for r in await c.commit()] == [True]
        # offset 1 is left alone: its lock runs out on the broker, which hands it out again
        back = [r for _, r in await drain([c], 1, timeout=10.0, ack=None)]
        assert [(r.offset, r.delivery_count) for r in back] == [(1, 2)]
        assert back[0].lock_deadline > first[1].lock_deadline
        assert c.acknowledge(topic, 0, 1, AckType.ACCEPT) is None
        assert [r.applied for r in await c.commit()] == [True]
    finally:
        await c.close()
