"""The consumer engine against real brokers: groups, rebalances, static membership, offsets, seeks.

Every test runs on Tansu and on Apache Kafka (``broker``). Session timeouts are small (Tansu holds a JoinGroup for about
half the session timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig, ConsumerRecord
from service.consumer.subscription import NoOffsetForPartitionError, TopicPartition
from service.group.coordinator import OffsetAndMetadata
from tests.conftest import AnyBroker

pytestmark = pytest.mark.integration
FAST = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 300, "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100}


def produce(bootstrap: str, topic: str, n: int, partitions: int, codec: str = "none", start: int = 0,
            timestamp: Callable[[int], int] | None = None) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 2})
    errors: list[object] = []
    for i in range(start, start + n):
        kw = {"timestamp": timestamp(i)} if timestamp else {}
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions,
                  on_delivery=lambda err, _msg: errors.append(err) if err is not None else None, **kw)
    assert p.flush(30) == 0
    assert errors == [], errors[:3]


class Group:
    """Consumers of one group with helpers to wait for convergence on events (no sleeps)."""

    def __init__(self, client: KafkaClient, group: str) -> None:
        self.client = client
        self.group = group
        self.members: list[Consumer] = []

    def add(self, **cfg: object) -> Consumer:
        c = Consumer(self.client, ConsumerConfig(group_id=self.group, **{**FAST, **cfg}))  # type: ignore[arg-type]
        self.members.append(c)
        return c

    async def converge(self, members: Sequence[Consumer], partitions: int, timeout: float = 20.0) -> None:
        """Wait until ``members`` own disjoint assignments covering every partition, each stable."""
        deadline = time.monotonic() + timeout
        while True:
            for c in members:
                c.assignment_changed.clear()
            owned = [set(c.assignment()) for c in members]
            total = sum(len(o) for o in owned)
            union = set().union(*owned)
            if (total == partitions and len(union) == partitions and all(o for o in owned)
                    and all(c.coordinator and c.coordinator.stable for c in members)):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"group did not converge: {[sorted(o) for o in owned]}")
            waits = [asyncio.ensure_future(c.assignment_changed.wait()) for c in members]
            # an idle poll keeps the members' max-poll-interval clocks fresh
            _done, pending = await asyncio.wait(waits, timeout=min(remaining, 0.5))
            for w in pending:
                w.cancel()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.members), return_exceptions=True)


@pytest.fixture
async def group(bclient: KafkaClient, topic_name: str) -> AsyncIterator[Group]:
    """Consumers of one group on ``broker`` (each test using it runs on Tansu and on Kafka)."""
    g = Group(bclient, f"g-{topic_name}")
    try:
        yield g
    finally:
        await g.close()


async def drain(consumers: Sequence[Consumer], want: int, timeout: float = 30.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout

    async def one(c: Consumer) -> None:
        while len(got) < want and time.monotonic() < deadline:
            got.extend(await c.poll(max_records=200, timeout=0.3))

    await asyncio.gather(*(one(c) for c in consumers))
    return got


async def test_three_members_share_six_partitions_and_deliver_each_record_once(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    await bclient.create_topics({topic_name: 6})
    members = [group.add() for _ in range(3)]
    for c in members:
        await c.subscribe([topic_name])
    await drain(members, 1, timeout=0.5)  # first polls: wait for assignment
    await group.converge(members, 6)
    assert all(len(c.assignment()) == 2 for c in members)
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 600, 6)
    got = await drain(members, 600)
    keys = [(r.partition, r.offset) for r in got]
    assert len(keys) == 600 and len(set(keys)) == 600
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(600))
    for c in members:  # each member only saw its own partitions
        mine = {tp.partition for tp in c.assignment()}
        assert mine


async def test_rebalance_with_auto_commit_loses_and_repeats_nothing(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    """Records produced up front; a second member joins mid-stream (eager rebalance, commit on revoke)."""
    await bclient.create_topics({topic_name: 6})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 3000, 6)
    a = group.add(max_partition_fetch_bytes=2048)
    await a.subscribe([topic_name])
    first = await drain([a], 300)
    b = group.add(max_partition_fetch_bytes=2048)
    await b.subscribe([topic_name])
    rest = await drain([a, b], 3000 - len(first))
    got = first + rest
    keys = [(r.partition, r.offset) for r in got]
    assert len(set(keys)) == 3000, "records lost"
    assert len(keys) == 3000, f"{len(keys) - len(set(keys))} records delivered twice"
    await group.converge([a, b], 6)


async def test_crashed_member_partitions_move_after_session_timeout(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    await bclient.create_topics({topic_name: 6})
    members = [group.add() for _ in range(3)]
    for c in members:
        await c.subscribe([topic_name])
    await drain(members, 1, timeout=0.5)
    await group.converge(members, 6)
    victim = members.pop()
    await victim.close(leave_group=False, commit=False)  # no LeaveGroup: like a crash
    started = time.monotonic()
    await group.converge(members, 6, timeout=30)
    elapsed = time.monotonic() - started
    print(f"partitions of a crashed member moved after {elapsed:.2f}s (session timeout 2s)")
    assert elapsed >= 1.0  # the coordinator had to wait for the session to expire


async def test_graceful_leave_rebalances_without_waiting_for_the_session(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    await bclient.create_topics({topic_name: 4})
    session_ms = 8000
    members = [group.add(session_timeout_ms=session_ms) for _ in range(2)]
    for c in members:
        await c.subscribe([topic_name])
    await drain(members, 1, timeout=0.5)
    await group.converge(members, 4, timeout=40)
    leaver = members.pop()
    started = time.monotonic()
    await leaver.close()  # LeaveGroup
    await group.converge(members, 4, timeout=40)
    elapsed = time.monotonic() - started
    print(f"rebalance after LeaveGroup took {elapsed:.2f}s (session timeout {session_ms / 1000:.0f}s)")
    assert elapsed < session_ms / 1000 * 0.75


async def test_static_member_restart_keeps_partitions_without_rebalancing_others(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    await bclient.create_topics({topic_name: 4})
    # Tansu holds a static member's JoinGroup and SyncGroup 3 s each and does not count the restarted
    # member's JoinGroup as contact: the session timeout must be well above those 6 s, or the broker expires
    # the restarted member's slot before its first heartbeat and b rebalances (docs/groups.md)
    a = group.add(group_instance_id="instance-a", session_timeout_ms=12000)
    b = group.add(group_instance_id="instance-b", session_timeout_ms=12000)
    for c in (a, b):
        await c.subscribe([topic_name])
    await drain([a, b], 1, timeout=0.5)
    await group.converge([a, b], 4, timeout=30)
    a_parts = set(a.assignment())
    b_rebalances = b.stats.rebalances
    await a.close()  # static member: no LeaveGroup by default
    a2 = group.add(group_instance_id="instance-a", session_timeout_ms=12000)
    await a2.subscribe([topic_name])
    await a2.wait_for_assignment(10)
    await group.converge([a2, b], 4, timeout=30)
    assert set(a2.assignment()) == a_parts
    assert b.stats.rebalances == b_rebalances, "the other member should not have rebalanced"
    assert b.revoked_history == [] or all(not r for r in b.revoked_history[-1:])


async def test_cooperative_sticky_revokes_only_what_moves(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, group: Group) -> None:
    await bclient.create_topics({topic_name: 6})
    a = group.add(assignment_strategies=("cooperative-sticky",))
    await a.subscribe([topic_name])
    await drain([a], 1, timeout=3)
    await group.converge([a], 6)
    before = set(a.assignment())
    b = group.add(assignment_strategies=("cooperative-sticky",))
    await b.subscribe([topic_name])
    await group.converge([a, b], 6, timeout=30)
    after = set(a.assignment())
    assert len(after) == 3 and after <= before, "a kept a subset of what it owned"
    revoked = {tp for r in a.revoked_history for tp in r}
    assert revoked == before - after, "only the moved partitions were revoked"
    assert b.revoked_history == []


async def test_commit_and_committed_round_trip(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    c = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", enable_auto_commit=False, **FAST))  # type: ignore[arg-type]
    try:
        tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
        await c.assign([tp0, tp1])
        assert await c.committed([tp0, tp1]) == {tp0: None, tp1: None}
        await c.commit({tp0: OffsetAndMetadata(5, "five"), tp1: 7})
        got = await c.committed([tp0, tp1])
        # Kafka keeps the commit's metadata; Tansu 0.6 does not (answers "" or null: docs/brokers.md)
        assert got[tp0] is not None and got[tp0].offset == 5
        assert got[tp0].metadata == "five" if broker.name == "kafka" else got[tp0].metadata in ("five", "", None)
        assert got[tp1] is not None and got[tp1].offset == 7
        # a fresh consumer of the group starts at the committed offsets
        c2 = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", enable_auto_commit=False, **FAST))  # type: ignore[arg-type]
        await c2.assign([tp0, tp1])
        assert await c2.position(tp0) == 5 and await c2.position(tp1) == 7
        await c2.close()
    finally:
        await c.close()


async def test_seek_beginning_end_and_timestamp(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    # Kafka: a day ago, as it refuses records more than an hour in the future (log.message.timestamp.after.max.ms).
    # Tansu: in the future, as its ListOffsets by timestamp answers a time in the past with offset 0 and the current
    # time, which the consumer takes at its word (docs/brokers.md); a future one it answers with timestamp -1, and
    # the consumer searches by fetching.
    now = time.time_ns() // 1_000_000
    base = (now - 86_400_000 if broker.name == "kafka" else now + 86_400_000) // 1000 * 1000
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 20, 1, "none", 0, lambda i: base + 1000 * i)
    tp = TopicPartition(topic_name, 0)
    c = Consumer(bclient, ConsumerConfig(group_id=None, auto_offset_reset="latest"))
    try:
        await c.assign([tp])
        assert await c.position(tp) == 20
        assert await c.poll(timeout=0.2) == []
        c.seek_to_beginning([tp])
        recs = await c.poll(max_records=3, timeout=5)
        assert [r.offset for r in recs] == [0, 1, 2]
        c.seek_to_timestamp({tp: base + 12_500})
        recs = await c.poll(max_records=1, timeout=5)
        assert [r.offset for r in recs] == [13] and recs[0].timestamp == base + 13_000
        c.seek_to_end([tp])
        assert await c.position(tp) == 20
        c.seek(tp, 17)
        recs = await c.poll(timeout=5)
        assert [r.offset for r in recs] == [17, 18, 19]
        c.seek_to_timestamp({tp: base + 10_000_000})  # beyond the last record: the end
        assert await c.position(tp) == 20
        assert (await c.end_offsets([tp]))[tp] == 20 and (await c.beginning_offsets([tp]))[tp] == 0
    finally:
        await c.close()


async def test_auto_offset_reset_none_surfaces_an_error(bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    c = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", auto_offset_reset="none", **{
        k: v for k, v in FAST.items() if k != "auto_offset_reset"}))  # type: ignore[arg-type]
    try:
        await c.assign([TopicPartition(topic_name, 0)])
        with pytest.raises(NoOffsetForPartitionError, match=r"auto\.offset\.reset is none"):
            for _ in range(20):
                await c.poll(timeout=0.5)
    finally:
        await c.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_consume_every_codec(broker: AnyBroker, bclient: KafkaClient, topic_name: str, codec: str) -> None:
    await bclient.create_topics({topic_name: 3})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 900, 3, codec)
    c = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", **FAST))  # type: ignore[arg-type]
    try:
        await c.subscribe([topic_name])
        got = await drain([c], 900)
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(900))
    finally:
        await c.close()


async def test_thousand_partition_topic(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1000})
    await asyncio.to_thread(produce, broker.bootstrap, topic_name, 2000, 1000)
    c = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", **FAST))  # type: ignore[arg-type]
    try:
        await c.subscribe([topic_name])
        got = await drain([c], 2000, timeout=60)
        assert len(c.assignment()) == 1000
        assert len({(r.partition, r.offset) for r in got}) == 2000 and len(got) == 2000
        await c.commit()
        committed = await c.committed(c.assignment())
        assert all(om is not None and om.offset == 2 for om in committed.values())
    finally:
        await c.close()


async def test_pattern_subscription_picks_up_new_topics(broker: AnyBroker, bclient: KafkaClient,
                                                        topic_name: str) -> None:
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    await bclient.create_topics({first: 1, f"other-{topic_name}": 1})
    c = Consumer(bclient, ConsumerConfig(group_id=f"g-{topic_name}", metadata_max_age_ms=200, **FAST))  # type: ignore[arg-type]
    try:
        await c.subscribe(pattern=rf"{topic_name}-.*")
        await c.poll(timeout=5)
        assert {tp.topic for tp in c.assignment()} == {first}
        await bclient.create_topics({second: 2})
        deadline = time.monotonic() + 20
        while {tp.topic for tp in c.assignment()} != {first, second}:
            c.assignment_changed.clear()
            assert time.monotonic() < deadline, f"new topic not picked up: {c.assignment()}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.assignment_changed.wait(), 1.0)
            await c.poll(timeout=0)
        assert sorted(c.assignment()) == [TopicPartition(first, 0), TopicPartition(second, 0),
                                          TopicPartition(second, 1)]
    finally:
        await c.close()


async def test_idle_consumer_stops_fetching_and_resumes_on_poll(broker: AnyBroker, bclient: KafkaClient,
                                                                topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    c = Consumer(bclient, ConsumerConfig(group_id=None, fetch_idle_pause_ms=300, fetch_max_wait_ms=100,
                                         auto_offset_reset="earliest"))
    try:
        await c.assign([TopicPartition(topic_name, 0)])
        assert await c.poll(timeout=0.2) == []
        fetches = c.fetcher.stats.fetches
        await asyncio.sleep(1.0)  # deliberately idle: no poll for longer than the idle pause
        assert c.fetcher.idle
        idle_fetches = c.fetcher.stats.fetches
        assert idle_fetches - fetches <= 5  # at most the rounds before the pause took effect
        await asyncio.to_thread(produce, broker.bootstrap, topic_name, 3, 1)
        recs = await c.poll(timeout=5)  # wakes the fetcher
        assert [r.value for r in recs] == [b"v0", b"v1", b"v2"]
    finally:
        await c.close()
