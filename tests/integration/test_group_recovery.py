"""Groups recover, always: real brokers (Tansu and Apache Kafka), engine-level members over real sockets.

A "kill -9" of a member is simulated by stopping its membership task and closing its connections without a
LeaveGroup (what the broker sees of a killed process). Tansu 0.6 keeps a departed member as the group's
leader (docs/groups.md): without the gateway's stall recovery the survivors sit with no partitions for ever.
Kafka expires a killed static member at its session timeout and rebalances: no stall recovery is needed there, and
the tests assert that none happened.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer, ConsumerConfig
from tests.conftest import AnyBroker
from tests.fakes.broker import TestCluster, default_registry
from tests.fakes.broker.group_coordinator import group_coordinator
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.replicas import (
    BIN,
    V2,
    clients,
    converged,
    create,
    name_owned_by,
    produce,
    replica_set,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SESSION_MS = 6000  # above Tansu's 3 s hold of a static member's JoinGroup / SyncGroup
CFG = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 300, "auto_offset_reset": "earliest",
       "fetch_max_wait_ms": 100}
PARTITIONS = 4


class Members:
    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.live: list[Consumer] = []

    def add(self, instance_id: str | None) -> Consumer:
        c = Consumer(KafkaClient(self.bootstrap), ConsumerConfig(group_id=self.group, group_instance_id=instance_id,
                                                                 client_id=instance_id or "dyn", **CFG))
        self.live.append(c)
        return c

    async def kill(self, c: Consumer) -> None:
        """What the broker sees of kill -9: heartbeats stop, connections close, no LeaveGroup."""
        self.live.remove(c)
        coord = c.coordinator
        assert coord is not None and coord._task is not None
        coord._closing = True
        coord._task.cancel()
        await asyncio.gather(coord._task, return_exceptions=True)
        await c.client.close()

    async def converge(self, timeout: float) -> float:
        """Poll every live member until their assignments cover all partitions disjointly; the seconds it
        took. Fails with the assignments seen if that does not happen within ``timeout``."""
        started = time.monotonic()
        while True:
            await asyncio.gather(*(c.poll(timeout=0.2) for c in self.live))
            owned = [set(c.assignment()) for c in self.live]
            if (sum(len(o) for o in owned) == PARTITIONS and len(set().union(*owned)) == PARTITIONS
                    and all(o for o in owned)):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"group stuck: assignments {[sorted(o) for o in owned]}")

    async def close(self) -> None:
        for c in self.live:
            await c.close()
            await c.client.close()


@pytest.fixture
async def members(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> AsyncIterator[Members]:
    await bclient.create_topics({topic_name: PARTITIONS})
    m = Members(broker.bootstrap, f"g-{topic_name}")
    try:
        yield m
    finally:
        await m.close()


async def _two(members: Members, topic: str, static: bool) -> tuple[Consumer, Consumer]:
    a = members.add("inst-a" if static else None)
    await a.subscribe([topic])
    await members.converge(20)  # a alone first: a is the leader
    b = members.add("inst-b" if static else None)
    await b.subscribe([topic])
    await members.converge(30)
    assert a.member is not None and a.member.is_leader
    return a, b


@pytest.mark.parametrize("victim", ["leader", "follower"])
async def test_kill_of_a_static_member_the_survivor_takes_every_partition(
        broker: AnyBroker, members: Members, topic_name: str, victim: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="service.group.coordinator")
    a, b = await _two(members, topic_name, static=True)
    dead, survivor = (a, b) if victim == "leader" else (b, a)
    await members.kill(dead)
    # expiry after the session timeout, then at most a stall recovery (one more session timeout) and a
    # rebalance (Tansu holds a static member's JoinGroup and SyncGroup 3 s each)
    took = await members.converge(4 * SESSION_MS / 1000 + 8)
    assert len(set(survivor.assignment())) == PARTITIONS
    assert took < 4 * SESSION_MS / 1000 + 8
    assert survivor.coordinator is not None
    if broker.name == "kafka":  # the dead member expired at its session timeout: a plain rebalance
        assert survivor.coordinator.stall_recoveries == 0
    elif victim == "leader":  # Tansu kept the dead leader: the survivor's stall recovery took over
        assert survivor.coordinator.stall_recoveries >= 1
        assert any("not a member of the group" in r.getMessage() for r in caplog.records)
    # transitions are logged at INFO with group, member and generation
    joined = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and ": synced; assignment" in
              r.getMessage()]
    assert any(f"group {members.group} member " in m and " generation " in m for m in joined)


async def test_graceful_restarts_in_a_row_leave_no_member_without_partitions(
        members: Members, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """A rolling restart: each member in turn leaves (LeaveGroup) and a new one joins at once, the next
    restart before the group settled."""
    caplog.set_level(logging.INFO, logger="service.group.coordinator")
    await _two(members, topic_name, static=False)
    for _ in range(2):
        # the follower first: the leader then leaves while the group is forming (where groups used to stall)
        for old in list(reversed(members.live)):
            members.live.remove(old)
            await old.close()
            await old.client.close()
            new = members.add(None)
            await new.subscribe([topic_name])
            # the next restart comes before the group settled (a JoinGroup takes Tansu 3 s)
            await asyncio.gather(*(c.poll(timeout=0.5) for c in members.live))
        await members.converge(4 * SESSION_MS / 1000 + 8)
    # the stalls met on the way were logged (Tansu keeps members that left; docs/groups.md)
    stalls = [r.getMessage() for r in caplog.records if "no stable generation" in r.getMessage()]
    assert all("rejoining" in m for m in stalls)


async def test_on_kafka_semantics_a_killed_static_leader_is_replaced_without_stall_recovery() -> None:
    """The protocol-level test broker coordinates groups as Apache Kafka does: when the leader's session
    expires it is removed and the next JoinGroup elects a live leader. The survivor gets every partition
    through an ordinary rebalance; the stall recovery (a Tansu workaround) never fires."""
    async with TestCluster(1, registry=default_registry(groups=True), topics={"t": PARTITIONS}) as cluster:
        gc = group_coordinator(cluster)
        members = Members(cluster.bootstrap_servers, "g")
        cfg = {**CFG, "session_timeout_ms": 1500, "heartbeat_interval_ms": 100}
        try:
            a = Consumer(KafkaClient(members.bootstrap),
                         ConsumerConfig(group_id="g", group_instance_id="inst-a", **cfg))
            members.live.append(a)
            await a.subscribe(["t"])
            await members.converge(10)
            b = Consumer(KafkaClient(members.bootstrap),
                         ConsumerConfig(group_id="g", group_instance_id="inst-b", **cfg))
            members.live.append(b)
            await b.subscribe(["t"])
            await members.converge(10)
            assert a.member is not None and a.member.is_leader
            await members.kill(a)
            await members.converge(10)
            assert sorted(tp.partition for tp in b.assignment()) == list(range(PARTITIONS))
            assert b.coordinator is not None and b.coordinator.stall_recoveries == 0
            assert b.member is not None and gc.group("g").leader_id == b.member.member_id
        finally:
            await members.close()


# -- the gateway: replicas with static membership (the chart's default) -------------------------------------

async def _poll(http: httpx.AsyncClient, base: str, seen: set[bytes]) -> None:
    r = await http.get(f"{base}/records", params={"timeout": 500, "max_records": 1000}, headers=BIN)
    assert r.status_code == 200, r.text
    seen.update(base64.b64decode(rec["value"]) for rec in r.json())


async def _partitions(http: httpx.AsyncClient, base: str) -> int:
    r = await http.get(f"{base}/assignments", headers=V2)
    assert r.status_code == 200, r.text
    return len(r.json()["partitions"])


async def test_gateway_kill_9_of_the_replica_holding_the_static_leader(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, tmp_path: Path,
        cleanup: list[GatewayProcess]) -> None:
    """Two replicas, static membership, one instance on each; kill -9 of the replica holding the group's
    leader: the instance on the other replica gets every partition and reads every record (it commits
    nothing, so it reads them all)."""
    await bclient.create_topics({topic_name: PARTITIONS})
    values = await asyncio.to_thread(produce, broker.bootstrap, topic_name, 0, 2000, PARTITIONS)
    procs = replica_set(broker, tmp_path, ["a", "b"], env={
        "GATEWAY_STATIC_MEMBERSHIP": "true", "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS)})
    start(*procs.values())
    cleanup.extend(procs.values())
    await converged(list(procs.values()), {"a", "b"})
    group = f"g-{topic_name}"
    n1, n2 = name_owned_by("a", ["a", "b"], group, "c"), name_owned_by("b", ["a", "b"], group, "d")
    b1, b2 = f"/consumers/{group}/instances/{n1}", f"/consumers/{group}/instances/{n2}"
    async with clients(procs["a"], procs["b"]) as (ha, hb):
        for http, name in ((ha, n1), (hb, n2)):
            assert (await create(http, group, name)).status_code == 200
        seen1: set[bytes] = set()
        seen2: set[bytes] = set()
        assert (await ha.post(f"{b1}/subscription", headers=V2, json={"topics": [topic_name]})).status_code == 204
        deadline = time.monotonic() + 30
        while await _partitions(ha, b1) != PARTITIONS:  # n1 alone first: it leads the group
            assert time.monotonic() < deadline
            await _poll(ha, b1, seen1)
        assert (await hb.post(f"{b2}/subscription", headers=V2, json={"topics": [topic_name]})).status_code == 204
        deadline = time.monotonic() + 40
        while await _partitions(hb, b2) == 0 or await _partitions(ha, b1) == PARTITIONS:
            assert time.monotonic() < deadline, "the second instance got no partitions"
            await asyncio.gather(_poll(ha, b1, seen1), _poll(hb, b2, seen2))
        procs["a"].kill()
        # expiry at the session timeout, recovery after two failed rounds, then a rebalance
        deadline = time.monotonic() + 5 * SESSION_MS / 1000 + 15
        while not values <= seen2:
            assert time.monotonic() < deadline, (
                f"instance on b has {await _partitions(hb, b2)} partitions, missing {len(values - seen2)} records")
            await _poll(hb, b2, seen2)
        assert await _partitions(hb, b2) == PARTITIONS
    log_b = (tmp_path / "gw-b.log").read_text()
    # Tansu kept the dead leader and b's member took over (stall recovery); Kafka expired it: a plain rebalance
    assert ("not a member of the group" in log_b) == (broker.name == "tansu")


@pytest.mark.timeout(240)
async def test_gateway_rolling_restart_with_static_membership(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, tmp_path: Path,
        cleanup: list[GatewayProcess]) -> None:
    """Two replicas, static membership, one instance on each, records flowing; each replica in turn gets
    SIGTERM, restarts, and its client recreates its instance (same name, so the same group.instance.id):
    after each restart both instances own partitions again and together read every record."""
    await bclient.create_topics({topic_name: PARTITIONS})
    procs = replica_set(broker, tmp_path, ["a", "b"], env={
        "GATEWAY_STATIC_MEMBERSHIP": "true", "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_MS)})
    start(*procs.values())
    cleanup.extend(procs.values())
    await converged(list(procs.values()), {"a", "b"})
    group = f"g-{topic_name}"
    names = {"a": name_owned_by("a", ["a", "b"], group, "c"), "b": name_owned_by("b", ["a", "b"], group, "d")}
    bases = {rid: f"/consumers/{group}/instances/{n}" for rid, n in names.items()}
    seen: set[bytes] = set()
    produced: set[bytes] = set()

    async def setup(http: httpx.AsyncClient, rid: str) -> None:
        assert (await create(http, group, names[rid])).status_code == 200
        r = await http.post(f"{bases[rid]}/subscription", headers=V2, json={"topics": [topic_name]})
        assert r.status_code == 204, r.text

    async def settle(https: dict[str, httpx.AsyncClient], batch: int) -> None:
        """Produce a batch, then poll both instances until both own partitions and every record was read."""
        start_at = len(produced)
        produced.update(await asyncio.to_thread(produce, broker.bootstrap, topic_name, start_at, batch, PARTITIONS))
        deadline = time.monotonic() + 5 * SESSION_MS / 1000 + 15
        while True:
            owned = {rid: await _partitions(https[rid], bases[rid]) for rid in https}
            if produced <= seen and all(owned.values()) and sum(owned.values()) == PARTITIONS:
                return
            assert time.monotonic() < deadline, f"owned {owned}, missing {len(produced - seen)} records"
            await asyncio.gather(*(_poll(https[rid], bases[rid], seen) for rid in https))

    async with clients(procs["a"], procs["b"]) as (ha, hb):
        https = {"a": ha, "b": hb}
        await setup(ha, "a")
        await setup(hb, "b")
        await settle(https, 400)
        for rid in ("a", "b"):
            procs[rid].stop()  # SIGTERM: a static member sends no LeaveGroup
            procs[rid].start()
            await converged(list(procs.values()), {"a", "b"})
            await setup(https[rid], rid)  # the client recreates its instance, which rejoins under its id
            await settle(https, 400)
