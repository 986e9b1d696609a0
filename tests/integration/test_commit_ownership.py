"""Commits against the test broker's group coordinator: a commit never moves what this consumer does not own,
an acknowledged commit stops redelivery, commits during a rebalance are refused at once, and background
tasks survive unexpected errors (counted in ConsumerStats.task_failures)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig, ConsumerRecord
from service.consumer.subscription import TopicPartition
from service.fetch.fetcher import Fetcher
from service.group.coordinator import (
    COMMIT_BEING_REVOKED,
    COMMIT_NOT_ASSIGNED,
    COMMIT_REBALANCING,
    CommitFailedError,
    OffsetAndMetadata,
)
from service.group.member import GroupMember
from service.protocol import error_codes as EC
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster, default_registry
from tests.fakes.broker.group_coordinator import GroupPhase, group_coordinator

pytestmark = pytest.mark.fault  # against the test broker: stale commits, rebalances, dying tasks

TP = TopicPartition
FAST: dict[str, Any] = {
    "session_timeout_ms": 3000, "heartbeat_interval_ms": 100, "auto_offset_reset": "earliest",
    "fetch_max_wait_ms": 50, "retry_backoff_ms": 20, "enable_auto_commit": False,
}


def group_cluster(n_brokers: int = 1, **kwargs: Any) -> TestCluster:
    return TestCluster(n_brokers, registry=default_registry(groups=True), **kwargs)


@contextlib.asynccontextmanager
async def group_consumer(cluster: TestCluster, group: str | None = "g", on_revoke: Any = None,
                         **config: Any) -> AsyncIterator[Consumer]:
    client = KafkaClient(cluster.bootstrap_servers)
    consumer = Consumer(client, ConsumerConfig(group_id=group, **{**FAST, **config}), on_revoke=on_revoke)
    try:
        yield consumer
    finally:
        await consumer.close()
        await client.close()


async def subscribed(consumer: Consumer, topics: Sequence[str] = ("t",), timeout: float = 10.0) -> None:
    await consumer.subscribe(list(topics))
    assert await consumer.wait_for_assignment(timeout), "no stable assignment"


async def consume(consumer: Consumer, n: int, timeout: float = 10.0, poll_timeout: float = 0.5
                  ) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(out)} of {n} records within {timeout}s"
        out += await consumer.poll(timeout=min(left, poll_timeout))
    return out


async def eventually(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def commits_since(cluster: TestCluster, mark: int) -> list[Any]:
    return cluster.requests(ApiKey.OFFSET_COMMIT, since=mark)


# -- 1. a commit never moves what this instance does not own ----------------------------------------------------------
async def test_commit_of_another_members_partition_is_refused_and_nothing_is_sent() -> None:
    async with group_cluster(topics={"t": 2}) as cluster, group_consumer(cluster) as c1, \
            group_consumer(cluster) as c2:
        gc = group_coordinator(cluster)
        await subscribed(c1)
        await c2.subscribe(["t"])
        await gc.wait_until(lambda: gc.group("g").generation_id == 2 and gc.group("g").phase is GroupPhase.STABLE)
        assert await c1.wait_for_assignment(5) and await c2.wait_for_assignment(5)
        [theirs] = c2.assignment()
        [mine] = c1.assignment()
        await c2.commit({theirs: 7})  # the owner's progress
        mark = cluster.log.mark()
        for _ in range(2):  # a client retrying after the 409 is refused again
            with pytest.raises(CommitFailedError) as info:
                await c1.commit({theirs: 1})
            assert info.value.reason == COMMIT_NOT_ASSIGNED and str(theirs) in str(info.value)
        with pytest.raises(CommitFailedError):  # one foreign partition refuses the whole commit
            await c1.commit({mine: 1, theirs: 1})
        assert commits_since(cluster, mark) == []
        assert gc.committed("g")[(theirs.topic, theirs.partition)].offset == 7
        await c1.commit({mine: 1})  # its own partition is fine
        assert gc.committed("g")[(mine.topic, mine.partition)].offset == 1


async def test_manual_assignment_commits_only_assigned_partitions() -> None:
    async with group_cluster(topics={"t": 2}) as cluster, group_consumer(cluster, group="manual") as c:
        gc = group_coordinator(cluster)
        await c.assign([TP("t", 0)])
        mark = cluster.log.mark()
        with pytest.raises(CommitFailedError) as info:
            await c.commit({TP("t", 1): 3})
        assert info.value.reason == COMMIT_NOT_ASSIGNED
        assert commits_since(cluster, mark) == []
        await c.commit({TP("t", 0): 3})
        assert gc.committed("manual") == {("t", 0): gc.committed("manual")[("t", 0)]}


async def test_commit_of_a_partition_being_revoked_is_refused() -> None:
    in_hook = asyncio.Event()
    release = asyncio.Event()

    async def hook(partitions: list[TopicPartition]) -> None:
        in_hook.set()
        await release.wait()

    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster, on_revoke=hook) as c:
        gc = group_coordinator(cluster)
        await subscribed(c)
        await c.commit({TP("t", 0): 2})
        assert c.member is not None and c.coordinator is not None
        c.member.request_rejoin("test")  # eager: everything is revoked first
        c.coordinator.wake()
        await asyncio.wait_for(in_hook.wait(), 5)
        mark = cluster.log.mark()
        try:
            # refused at once: the rebalance is frozen in the revoke hook until ``release``, so a commit that
            # waited for it would hit this wait_for (TimeoutError, not CommitFailedError)
            with pytest.raises(CommitFailedError) as info:
                await asyncio.wait_for(c.commit({TP("t", 0): 1}), 5)
            assert info.value.reason in (COMMIT_REBALANCING, COMMIT_BEING_REVOKED)
            assert "retried after the next poll" in str(info.value) or COMMIT_BEING_REVOKED in str(info.value)
            assert commits_since(cluster, mark) == []
        finally:
            release.set()
        assert await c.wait_for_assignment(5)
        assert gc.committed("g")[("t", 0)].offset == 2


# -- 2. an acknowledged commit stops redelivery -------------------------------------------------------------------
async def test_a_commit_in_flight_when_a_rebalance_starts_is_not_rolled_back() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, \
            group_consumer(cluster, enable_auto_commit=True, auto_commit_interval_ms=60_000) as c:
        gc = group_coordinator(cluster)
        gc.group_join_delay_ms = 0
        cluster.append("t", 0, [b"r%d" % i for i in range(20)])
        await subscribed(c)
        first = await c.poll(max_records=5, timeout=5)
        assert [r.offset for r in first] == [0, 1, 2, 3, 4]
        release = asyncio.Event()
        cluster.delay(ApiKey.OFFSET_COMMIT, until=release)  # hold the client's commit at the broker
        mark = cluster.log.mark()
        committing = asyncio.create_task(c.commit({TP("t", 0): 15}))
        await cluster.wait_for_requests(ApiKey.OFFSET_COMMIT, since=mark)
        assert c.member is not None and c.coordinator is not None
        c.member.request_rejoin("test")  # a rebalance starts while the commit is in flight
        c.coordinator.wake()
        await asyncio.sleep(0.2)
        release.set()
        await committing  # acknowledged
        assert await c.wait_for_assignment(10)
        assert gc.committed("g")[("t", 0)].offset == 15
        rest = await consume(c, 5)
        assert [r.offset for r in rest] == list(range(15, 20))


async def test_a_committed_offset_lookup_finishing_after_a_commit_does_not_move_the_position_back() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        cluster.append("t", 0, [b"r%d" % i for i in range(10)])
        assert c.coordinator is not None
        coord = c.coordinator
        looked_up = asyncio.Event()
        release = asyncio.Event()
        real = coord.committed

        async def slow_committed(partitions: Sequence[TopicPartition], timeout: float = 30.0
                                 ) -> dict[TopicPartition, OffsetAndMetadata | None]:
            out = await real(partitions, timeout)  # answered before the commit below
            looked_up.set()
            await release.wait()
            return out

        coord.committed = slow_committed  # type: ignore[method-assign]
        await subscribed(c)
        await asyncio.wait_for(looked_up.wait(), 5)
        await c.commit({TP("t", 0): 7})  # acknowledged while the lookup's answer is still on its way
        release.set()
        got = await consume(c, 3)
        assert got[0].offset == 7 and [r.offset for r in got] == [7, 8, 9]


# -- 3. commits during a rebalance / without a coordinator are refused quickly -------------------------------------
async def test_commit_while_the_coordinator_is_being_rediscovered_is_refused_quickly() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        await subscribed(c)
        assert c.coordinator is not None
        cluster.error(ApiKey.FIND_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE, count=10_000)
        c.coordinator.coordinator_dead("test: broker restarted")
        mark = cluster.log.mark()
        with pytest.raises(CommitFailedError) as info:  # refused, not held until a coordinator is back
            await asyncio.wait_for(c.commit({TP("t", 0): 1}, timeout=30.0), 3.0)
        assert info.value.reason == COMMIT_REBALANCING
        assert "rebalancing" in str(info.value) and "retried after the next poll" in str(info.value)
        assert commits_since(cluster, mark) == []


async def test_commit_to_a_stopped_coordinator_is_refused_quickly() -> None:
    async with group_cluster(2, topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        await subscribed(c)
        assert c.coordinator is not None and c.coordinator.coordinator_id is not None
        await cluster.stop_broker(c.coordinator.coordinator_id, failover=False)
        with pytest.raises(CommitFailedError) as info:  # refused, not held for the commit's own 30 s
            await asyncio.wait_for(c.commit({TP("t", 0): 1}, timeout=30.0), 5.0)
        assert info.value.reason == COMMIT_REBALANCING


async def test_commit_while_rejoining_is_refused_quickly() -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        await subscribed(c)
        release = asyncio.Event()
        cluster.delay(ApiKey.JOIN_GROUP, until=release)
        mark = cluster.log.mark()
        assert c.member is not None and c.coordinator is not None
        c.member.request_rejoin("test")
        c.coordinator.wake()
        try:
            await cluster.wait_for_requests(ApiKey.JOIN_GROUP, since=mark)
            # refused at once: JoinGroup is held until ``release``, so a commit that waited for the rebalance
            # would hit this wait_for (TimeoutError, not CommitFailedError)
            with pytest.raises(CommitFailedError) as info:
                await asyncio.wait_for(c.commit({TP("t", 0): 1}), 5)
            assert info.value.reason == COMMIT_REBALANCING and "retried after the next poll" in str(info.value)
            assert commits_since(cluster, mark) == []
        finally:
            release.set()


# -- 4. background tasks never die silently ------------------------------------------------------------------------
def raise_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    real = getattr(owner, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"injected failure in {name}")
        return real(*args, **kwargs)

    async def awrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"injected failure in {name}")
        return await real(*args, **kwargs)

    monkeypatch.setattr(owner, name, awrapper if asyncio.iscoroutinefunction(real) else wrapper)
    return calls


@pytest.mark.parametrize("task, owner, name", [
    ("fetcher", Fetcher, "_send_fetches"),
    ("fetcher", Fetcher, "_fetch_on"),
    ("positions", Consumer, "_update_positions"),
    ("membership", GroupMember, "heartbeat_request"),
])
async def test_a_failing_background_task_is_counted_and_recovers(monkeypatch: pytest.MonkeyPatch, task: str,
                                                                  owner: Any, name: str) -> None:
    async with group_cluster(topics={"t": 1}) as cluster, group_consumer(cluster) as c:
        cluster.append("t", 0, [b"a", b"b"])
        calls = raise_once(monkeypatch, owner, name)
        await c.subscribe(["t"])
        assert [r.offset for r in await consume(c, 2)] == [0, 1]
        if task == "membership":
            await cluster.wait_for_requests(ApiKey.HEARTBEAT, count=2)
        assert calls[0] >= 2
        assert c.stats.task_failures == {task: 1}
        cluster.append("t", 0, [b"c"])
        assert [r.offset for r in await consume(c, 1)] == [2]


async def test_a_failing_auto_commit_is_counted_and_the_task_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    async with group_cluster(topics={"t": 1}) as cluster, \
            group_consumer(cluster, enable_auto_commit=True, auto_commit_interval_ms=50) as c:
        gc = group_coordinator(cluster)
        cluster.append("t", 0, [b"a", b"b"])
        raise_once(monkeypatch, Consumer, "commit_consumed")
        await c.subscribe(["t"])
        await consume(c, 2)
        await eventually(lambda: c.stats.task_failures.get("autocommit") == 1)
        cluster.append("t", 0, [b"c"])
        await consume(c, 1)  # records delivered again wake the restarted loop
        await eventually(lambda: ("t", 0) in gc.committed("g") and gc.committed("g")[("t", 0)].offset == 3)
        assert c.stats.task_failures == {"autocommit": 1}
