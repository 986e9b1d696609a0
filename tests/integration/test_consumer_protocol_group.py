"""Members of the consumer group protocol (KIP-848) driven by service.group.coordinator_consumer against Apache
Kafka 4.4: they converge to a full, disjoint assignment; a join moves only the partitions that must move; a leave
revokes nothing from the others; a fenced member drops its partitions and rejoins by itself. Every revoked
partition is committed first, with the member epoch (OffsetCommit v9+), and the commits are read back.

The broker is this module's own: the session broker keeps Kafka's 5 s minimum heartbeat interval under this
protocol (group.consumer.min.heartbeat.interval.ms), which would make each step take seconds; here it is 300 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer
from service.consumer.subscription import TopicPartition
from service.embedded.kafka import EmbeddedKafka
from service.embedded.tansu import EmbeddedBroker
from service.group.coordinator import OffsetAndMetadata
from service.group.coordinator_consumer import ConsumerProtocolCoordinator, consumer_protocol_supported
from service.group.member_consumer import ConsumerGroupMember
from service.protocol import messages as M
from tests.integration.kip848 import kip848_consumer, settled

pytestmark = pytest.mark.integration

TOPIC = "kip848-engine"
PARTS = {TopicPartition(TOPIC, p) for p in range(4)}


@pytest.fixture(scope="module")
def fast_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka(log_file=tmp_path_factory.mktemp("kip848") / "kafka.log", overrides={
        "group.consumer.heartbeat.interval.ms": "300",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.session.timeout.ms": "3000",
    })
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class Member:
    """One member with recording hooks; the revoke hook commits offset 7 for what it gives up (as a consumer
    commits its positions) before releasing it."""

    def __init__(self, client: KafkaClient, group: str, changed: asyncio.Event, instance: str | None = None,
                 topic: str = TOPIC) -> None:
        self.changed = changed
        self.owned: set[TopicPartition] = set()
        self.revoked: list[TopicPartition] = []
        self.lost: list[TopicPartition] = []
        self.member = ConsumerGroupMember(group, server_assignor="uniform", rebalance_timeout_ms=10000,
                                          group_instance_id=instance)
        self.coord = ConsumerProtocolCoordinator(
            client, self.member, retry_backoff_ms=50, on_revoke=self._revoke, on_assign=self._assign,
            on_lost=self._lost, topics=lambda: [topic])

    async def _revoke(self, parts: list[TopicPartition]) -> None:
        await self.coord.commit({tp: OffsetAndMetadata(7) for tp in parts}, revoking=True, timeout=5.0)
        self.revoked += parts
        self.owned -= set(parts)
        self.changed.set()

    async def _assign(self, assigned: list[TopicPartition], added: list[TopicPartition]) -> None:
        self.owned = set(assigned)
        self.changed.set()

    async def _lost(self, parts: list[TopicPartition]) -> None:
        self.lost += parts
        self.owned -= set(parts)
        self.changed.set()


async def converge(members: list[Member], changed: asyncio.Event, timeout: float = 20.0,
                   extra: Callable[[], bool] = lambda: True, parts: set[TopicPartition] = PARTS) -> None:
    """Until every member is stable, owns what its state machine says, and together they own every partition once,
    balanced (a joining member is stable with nothing until the others released its share)."""
    deadline = time.monotonic() + timeout

    def done() -> bool:
        owned = [m.owned for m in members]
        return (all(m.coord.stable and m.owned == set(m.member.owned) for m in members)
                and sum(len(o) for o in owned) == len(parts) and set().union(*owned) == parts
                and max(map(len, owned)) - min(map(len, owned)) <= 1 and extra())

    while not done():
        left = deadline - time.monotonic()
        assert left > 0, [(m.member.state.value, sorted(m.owned)) for m in members]
        changed.clear()
        # the hooks signal assignment changes; a member turning stable does not, hence the short timeout
        try:
            await asyncio.wait_for(changed.wait(), min(0.1, left))
        except TimeoutError:
            pass


async def test_members_converge_join_leave_and_fencing(fast_kafka: EmbeddedKafka) -> None:
    client = KafkaClient(fast_kafka.bootstrap)
    changed = asyncio.Event()
    members: list[Member] = []
    try:
        await client.create_topics({TOPIC: 4})
        conn = await client.any_connection()
        assert conn.version_for(M.ApiKey.CONSUMER_GROUP_HEARTBEAT) == 1  # the client-made member id (KIP-1082)

        members = [Member(client, "kip848-group", changed) for _ in range(3)]
        for m in members:
            m.coord.start()
        await converge(members, changed)
        assert sorted(len(m.owned) for m in members) == [1, 1, 2]
        before = {id(m): set(m.owned) for m in members}
        first_revoked = {id(m): len(m.revoked) for m in members}  # the first member gave up half of its four

        # A fourth member joins: exactly one partition moves (from the member with two); nobody else revokes.
        fourth = Member(client, "kip848-group", changed)
        fourth.coord.start()
        await converge([*members, fourth], changed)
        assert [len(m.owned) for m in [*members, fourth]] == [1, 1, 1, 1]
        moved = [tp for m in members for tp in m.revoked[first_revoked[id(m)]:]]
        assert len(moved) == 1 and fourth.owned == set(moved)
        for m in members:
            assert m.owned <= before[id(m)], "a member kept its partitions and took none"
            assert not m.lost

        # The fourth leaves (epoch -1): its partition goes to another member, nobody revokes anything.
        revoked_before = sum(len(m.revoked) for m in members)
        await fourth.coord.close()
        assert fourth.revoked == sorted(moved) and fourth.member.state.value == "unsubscribed"
        await converge(members, changed)
        assert sum(len(m.revoked) for m in members) == revoked_before

        # Fencing: a heartbeat with an epoch the broker never gave is answered FENCED_MEMBER_EPOCH; the member drops
        # its partitions uncommitted and rejoins with epoch 0 under the same member id, by itself.
        victim = members[0]
        victim_id = victim.member.member_id
        build = victim.member.heartbeat_request

        def stale_epoch_once(now: float) -> Any:
            del victim.member.heartbeat_request  # back to the method
            req = build(now)
            req.member_epoch += 100
            return req

        victim.member.heartbeat_request = stale_epoch_once  # type: ignore[method-assign]
        victim.member.heartbeat_soon()
        victim.coord.wake()
        await converge(members, changed, extra=lambda: victim.member.fencings == 1)
        assert victim.lost and victim.member.member_id == victim_id
        assert victim.member.member_epoch > 0

        # Every partition given up in a hand-over was committed with the member epoch first.
        committed = await members[1].coord.committed(sorted(PARTS))
        assert {tp for tp, om in committed.items() if om is not None and om.offset == 7} == {
            tp for m in [*members, fourth] for tp in m.revoked}

        # A member that stops heartbeating (a stalled process) is expired after the session timeout; the others
        # take its partitions; when it heartbeats again it is told UNKNOWN_MEMBER_ID and rejoins by itself.
        stalled = members[1]
        stalled_owned = set(stalled.owned)
        stalled.member.heartbeat_due = lambda now: False  # type: ignore[method-assign]
        await converge([members[0], members[2]], changed)
        del stalled.member.heartbeat_due
        assert stalled.owned == stalled_owned and not stalled.lost, "nothing happens to it until it hears"
        stalled.coord.wake()
        await converge(members, changed, extra=lambda: stalled.member.fencings == 1)
        assert stalled.lost == sorted(stalled_owned)
    finally:
        for m in members:
            await m.coord.close()
        await client.close()


async def test_static_member_gets_its_partitions_back_after_a_restart(fast_kafka: EmbeddedKafka) -> None:
    """A static member leaves with epoch -2: the broker keeps its assignment; its successor under the same instance
    id (a new member id, as after a process restart) gets the same partitions, and the other member moves nothing."""
    client = KafkaClient(fast_kafka.bootstrap)
    changed = asyncio.Event()
    members: list[Member] = []
    try:
        topic = TOPIC + "-static"
        parts = {TopicPartition(topic, p) for p in range(4)}
        await client.create_topics({topic: 4})
        members = [Member(client, "kip848-static", changed, instance="pod-a", topic=topic),
                   Member(client, "kip848-static", changed, topic=topic)]
        for m in members:
            m.coord.start()
        await converge(members, changed, parts=parts)
        static, other = members
        kept = set(static.owned)
        other_revoked = len(other.revoked)
        await static.coord.close()  # epoch -2
        assert static.member.state.value == "unsubscribed"
        # The broker keeps the departed static member, with its assignment, for its successor (ConsumerGroupDescribe).
        resp = await other.coord._send(M.ConsumerGroupDescribeRequest(group_ids=["kip848-static"],
                                                                      include_authorized_operations=False))
        (group,) = resp.groups
        assert group.error_code == 0 and group.assignor_name == "uniform"
        (held,) = [x for x in group.members if x.instance_id == "pod-a"]
        assert held.member_id == static.member.member_id and held.member_type == 1  # a consumer-protocol member
        assert {TopicPartition(t.topic_name, p) for t in held.assignment.topic_partitions for p in t.partitions} == kept
        successor = Member(client, "kip848-static", changed, instance="pod-a", topic=topic)
        assert successor.member.member_id != static.member.member_id
        members[0] = successor
        successor.coord.start()
        await converge(members, changed, parts=parts)
        assert successor.owned == kept and len(other.revoked) == other_revoked
    finally:
        for m in members:
            await m.coord.close()
        await client.close()


async def test_consumers_on_the_driver_lose_nothing_across_a_join(fast_kafka: EmbeddedKafka) -> None:
    """Two consumers on the driver, a third joins mid-stream: every record is delivered exactly once (each revoked
    partition's position is committed with the member epoch before its new owner starts there), and the group's
    committed offsets end at the end of the topic."""
    topic, n = TOPIC + "-consume", 400
    bootstrap = fast_kafka.bootstrap
    client = KafkaClient(bootstrap)
    consumers: list[Consumer] = []
    seen: list[bytes] = []
    half = asyncio.Event()

    async def drain(c: Consumer) -> None:
        while len(seen) < n:
            for r in await c.poll(max_records=10, timeout=0.5):
                seen.append(r.value)  # type: ignore[arg-type]
            if len(seen) >= n // 4:
                half.set()

    def produce(start: int, count: int) -> None:
        p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(start, start + count):
            p.produce(topic, value=b"v%d" % i, partition=i % 4)
        assert p.flush(30) == 0

    try:
        await client.create_topics({topic: 4})
        consumers = [kip848_consumer(client, "kip848-consume") for _ in range(2)]
        for c in consumers:
            await c.subscribe([topic])
        await settled(consumers, 4, each_some=True)
        await asyncio.to_thread(produce, 0, n // 2)
        tasks = [asyncio.create_task(drain(c)) for c in consumers]
        await asyncio.wait_for(half.wait(), 20)
        third = kip848_consumer(client, "kip848-consume")
        consumers.append(third)
        await third.subscribe([topic])
        tasks.append(asyncio.create_task(drain(third)))
        await settled(consumers, 4, each_some=True)
        await asyncio.to_thread(produce, n // 2, n - n // 2)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert len(seen) == n and len(set(seen)) == n, f"{len(seen)} delivered, {len(set(seen))} distinct"
        # the first member took all four then gave two up; the third's join moved one partition more
        assert sum(c.coordinator.hand_overs for c in consumers) >= 4  # type: ignore[union-attr]
        assert sum(c.stats.commits for c in consumers) >= 1
        for c in consumers:
            await c.close()
        probe = kip848_consumer(client, "kip848-consume")
        committed = await probe.committed([TopicPartition(topic, p) for p in range(4)])
        assert sum(om.offset for om in committed.values() if om is not None) == n
        await probe.close()
    finally:
        for c in consumers:
            await c.close()
        await client.close()


async def test_tansu_is_refused_clearly(tansu: EmbeddedBroker, fast_kafka: EmbeddedKafka) -> None:
    """Tansu has no ConsumerGroupHeartbeat: the probe says so, and a member there fails for good before sending
    anything (with that reason) instead of retrying; Kafka 4.4 passes the probe."""
    kclient = KafkaClient(fast_kafka.bootstrap)
    client = KafkaClient(tansu.bootstrap)
    try:
        assert await consumer_protocol_supported(kclient) is None
        problem = await consumer_protocol_supported(client)
        assert problem is not None and "no ConsumerGroupHeartbeat API" in problem
        fatal = asyncio.get_running_loop().create_future()
        member = Member(client, "kip848-on-tansu", asyncio.Event())
        member.coord._on_fatal = fatal.set_result
        member.coord.start()
        err = await asyncio.wait_for(fatal, 10)
        assert "cannot use the consumer protocol" in str(err) and "no ConsumerGroupHeartbeat API" in str(err)
        assert member.member.member_epoch == 0 and member.coord.heartbeats == 0
        await member.coord.close()
    finally:
        await client.close()
        await kclient.close()
