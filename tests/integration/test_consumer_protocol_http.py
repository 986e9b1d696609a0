"""Consumer instances on the consumer group protocol (KIP-848, ``group.protocol: consumer``) through a real gateway
process on Apache Kafka, beside classic instances on the same gateway.

The acceptance scenario runs both protocols at once, on the same topic (12 partitions) fed continuously: ten
instances per group consume; two more join; then three of the first leave. Under ``consumer`` the members keep
receiving through both changes (the broker moves only the partitions that must move); under ``classic`` every
member pauses (eager rebalances: all give up everything, rejoin, wait for the leader's assignment). The measure is
the same for both: the longest time a surviving first member went without records during the changes. Every
record is counted: nothing lost, duplicates only on partitions that changed owner (delivered, then redelivered
after the last commit).

The broker is this module's own, with a 300 ms heartbeat interval under the consumer protocol (the session broker
keeps Kafka's 5 s minimum); classic instances heartbeat every second (GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import itertools
import json
import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.embedded.kafka import EmbeddedKafka
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = {"Accept": "application/vnd.kafka.binary.v2+json"}
PARTITIONS = 12
FIRST = 10  # instances per group before the changes: two more join, then three of the first leave
HEARTBEAT_S = 0.3  # the broker's group.consumer.heartbeat.interval.ms below
CLASSIC_HEARTBEAT_MS = 1000


@pytest.fixture(scope="module")
def fast_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka(log_file=tmp_path_factory.mktemp("kip848-http") / "kafka.log", overrides={
        "group.consumer.heartbeat.interval.ms": str(int(HEARTBEAT_S * 1000)),
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.session.timeout.ms": "3000",
    })
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def gw(fast_kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("kip848-gw") / "gw.log"
    g = GatewayProcess(fast_kafka.bootstrap, log_file=log, env={
        "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": str(CLASSIC_HEARTBEAT_MS),
        "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "10000", "GATEWAY_LOG_LEVEL": "info",
        "GATEWAY_DENIED_TOPICS": "*-secret"})
    g.start()
    try:
        yield g
    finally:
        g.stop()


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({topic: partitions})
    finally:
        await client.close()


class Feed:
    """Produces one record to every partition every ``interval`` seconds until stopped; remembers what the broker
    acknowledged ((partition, offset) pairs)."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.05) -> None:
        self.topic, self.interval = topic, interval
        self.producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self.acked: set[tuple[int, int]] = set()
        self.failed: list[str] = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, err: object, msg: object) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked.add((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        n = 0
        while not self.stop_flag.is_set():
            for p in range(PARTITIONS):
                self.producer.produce(self.topic, value=b"%d" % n, partition=p, on_delivery=self._done)
            n += 1
            self.producer.poll(0)
            self.stop_flag.wait(self.interval)
        assert self.producer.flush(30) == 0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(60)


@dataclass
class Instance:
    group: str
    name: str
    base: str
    deliveries: list[tuple[float, int, int]] = field(default_factory=list)  # (received at, partition, offset)
    running: bool = True
    task: asyncio.Task[None] | None = None


class Group:
    def __init__(self, http: httpx.AsyncClient, gw: GatewayProcess, topic: str, protocol: str) -> None:
        self.http, self.gw, self.topic, self.protocol = http, gw, topic, protocol
        self.name = f"kip848-http-{protocol}-{uuid.uuid4().hex[:6]}"
        self.members: list[Instance] = []
        self.gone: list[Instance] = []

    async def add(self, count: int) -> list[Instance]:
        added: list[Instance] = []
        for _ in range(count):
            name = f"m{len(self.members) + len(self.gone) + len(added)}"
            r = await self.http.post(f"{self.gw.url}/consumers/{self.name}", headers=V2, json={
                "name": name, "format": "binary", "auto.offset.reset": "earliest", "group.protocol": self.protocol,
                "group.remote.assignor": "uniform", "auto.commit.interval.ms": "200"})
            assert r.status_code == 200, r.text
            inst = Instance(self.name, name, r.json()["base_uri"])
            r = await self.http.post(f"{inst.base}/subscription", headers=V2, json={"topics": [self.topic]})
            assert r.status_code == 204, r.text
            inst.task = asyncio.create_task(self._poll(inst))
            added.append(inst)
        self.members += added
        return added

    async def _poll(self, inst: Instance) -> None:
        while inst.running:
            r = await self.http.get(f"{inst.base}/records", params={"timeout": 200}, headers=BINARY)
            assert r.status_code == 200, r.text
            now = time.monotonic()
            records = r.json()
            inst.deliveries += [(now, rec["partition"], rec["offset"]) for rec in records]
            if records:
                await asyncio.sleep(0.1)  # (fewer requests on a 2-core machine: the gap resolution is ~0.1 s)

    async def remove(self, count: int) -> None:
        leaving, self.members = self.members[:count], self.members[count:]
        for inst in leaving:  # its last answered poll is counted; its close commits what it delivered
            inst.running = False
            assert inst.task is not None
            await inst.task
            r = await self.http.delete(inst.base, headers=V2)
            assert r.status_code == 204, r.text
        self.gone += leaving

    async def assignments(self) -> list[set[int]]:
        out = []
        for inst in self.members:
            r = await self.http.get(f"{inst.base}/assignments")
            assert r.status_code == 200, r.text
            out.append({p["partition"] for p in r.json()["partitions"]})
        return out

    async def converged(self, since: float) -> bool:
        """Every partition assigned once, balanced, and every member received records after ``since``."""
        owned = await self.assignments()
        return (sum(map(len, owned)) == PARTITIONS and len(set().union(*owned)) == PARTITIONS
                and max(map(len, owned)) - min(map(len, owned)) <= 1
                and all(any(t > since for t, _, _ in m.deliveries) for m in self.members))

    def delivered(self) -> list[tuple[float, int, int, str]]:
        return sorted((t, p, o, m.name) for m in [*self.members, *self.gone] for t, p, o in m.deliveries)


async def wait_converged(groups: list[Group], since: float, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not all([await g.converged(since) for g in groups]):
        assert time.monotonic() < deadline, {g.protocol: await g.assignments() for g in groups}
        await asyncio.sleep(0.1)


async def revoked_by_protocol(http: httpx.AsyncClient, gw: GatewayProcess) -> dict[str, float]:
    text = (await http.get(f"{gw.url}/metrics")).text
    out = {"classic": 0.0, "consumer": 0.0}
    for m in re.finditer(r'^kcg_group_partitions_revoked_total\{protocol="(\w+)",tenant="default"\} (\S+)$', text,
                         re.MULTILINE):
        out[m.group(1)] = float(m.group(2))
    return out


def longest_silence(inst: Instance, start: float, end: float) -> float:
    """The longest time between two deliveries to ``inst`` (or the window's ends) within [start, end]."""
    times = [start, *(t for t, _, _ in inst.deliveries if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(times))


async def test_a_join_and_a_leave_pause_classic_members_and_not_consumer_members(
        fast_kafka: EmbeddedKafka, gw: GatewayProcess) -> None:
    topic = f"kip848-http-{uuid.uuid4().hex[:6]}"
    await create_topic(fast_kafka.bootstrap, topic, PARTITIONS)
    feed = Feed(fast_kafka.bootstrap, topic)
    feed.start()
    async with httpx.AsyncClient(timeout=30) as http:
        groups = [Group(http, gw, topic, "classic"), Group(http, gw, topic, "consumer")]
        try:
            for g in groups:
                await g.add(FIRST)
            await wait_converged(groups, time.monotonic())
            first = {g.protocol: list(g.members) for g in groups}
            revoked_before = await revoked_by_protocol(http, gw)
            changes_start = time.monotonic()
            await asyncio.gather(*(g.add(2) for g in groups))
            await wait_converged(groups, time.monotonic())
            joined = time.monotonic()
            revoked_mid = await revoked_by_protocol(http, gw)
            await asyncio.gather(*(g.remove(3) for g in groups))
            await wait_converged(groups, time.monotonic())
            changes_end = time.monotonic()
            revoked_after = await revoked_by_protocol(http, gw)
            metrics = (await http.get(f"{gw.url}/metrics")).text
            # steady again: the silence of survivors spans the changes only
            feed.stop()
            want = feed.acked
            assert not feed.failed and len(want) > 0, feed.failed[:3]
            deadline = time.monotonic() + 30
            while not all({(p, o) for _, p, o, _ in g.delivered()} >= want for g in groups):
                assert time.monotonic() < deadline, {g.protocol: len(want - {(p, o) for _, p, o, _ in g.delivered()})
                                                     for g in groups}
                await asyncio.sleep(0.1)
        finally:
            feed.stop_flag.set()
            for g in groups:
                for m in g.members:
                    m.running = False
                await asyncio.gather(*(m.task for m in g.members if m.task is not None), return_exceptions=True)
                for m in g.members:
                    await http.delete(m.base, headers=V2)

    silence: dict[str, list[float]] = {}
    for g in groups:
        survivors = [m for m in first[g.protocol] if m in g.members]
        assert len(survivors) == FIRST - 3
        silences = sorted(longest_silence(m, changes_start, changes_end) for m in survivors)
        silence[g.protocol] = silences
        # every record delivered; a record twice only on a partition that changed owner (uncommitted when it moved)
        seen: dict[tuple[int, int], list[str]] = defaultdict(list)
        owners: dict[int, set[str]] = defaultdict(set)
        for _, p, o, name in g.delivered():
            seen[(p, o)].append(name)
            owners[p].add(name)
        assert set(seen) >= want
        dup_partitions = {p for (p, _), names in seen.items() if len(names) > 1}
        assert all(len(owners[p]) > 1 for p in dup_partitions), (g.protocol, dup_partitions)
        print(f"{g.protocol}: longest silences of the surviving members {[round(x, 2) for x in silences]} s; "
              f"{sum(len(n) - 1 for n in seen.values())} redelivered; join phase {joined - changes_start:.1f} s, "
              f"leave phase {changes_end - joined:.1f} s")
    # What the changes cost, counted by the gateway (kcg_group_partitions_revoked_total; an instance's count is
    # kept as of the last scrape before its delete, so the leavers' own revocations at their delete are not in
    # it). The join: under classic all ten first members gave up everything (12); under consumer only what the
    # two newcomers took (at most 2 each). The leave: under classic the nine who stay gave up everything they
    # held (at least the 9 the leavers did not hold); under consumer nobody who stayed gave up anything.
    join = {p: revoked_mid[p] - revoked_before[p] for p in revoked_mid}
    leave = {p: revoked_after[p] - revoked_mid[p] for p in revoked_mid}
    print(f"partitions revoked: join {join}, leave {leave}")
    assert join["classic"] >= PARTITIONS and leave["classic"] >= PARTITIONS - 3, (join, leave)
    # (at most 2 per newcomer in the end; 6 leaves room for a partition handed on between the two joins)
    assert join["consumer"] <= 6 and leave["consumer"] == 0, (join, leave)
    assert 'kcg_group_member_epoch{group="' in metrics and 'kcg_group_converge_seconds{protocol="consumer"' in metrics
    # consumer: nobody waited more than ~2 heartbeat intervals (plus the poll cadence of a loaded machine): the
    # partitions that did not move flowed on. Classic: the rebalances stopped every member. In one gateway a
    # classic round is short (its members' heartbeats are aligned by the heartbeat wheel, so all learn of a
    # rebalance at once and rejoin together): each survivor's silence is ~0.15-0.45 s here against ~0.1-0.35 s
    # under consumer (the poll cadence), so the difference is asserted on the survivors' mean, which the noise of
    # a loaded machine moves for both protocols alike (7 runs: classic/consumer 1.3-2.3x).
    assert max(silence["consumer"]) < 2 * HEARTBEAT_S + 1.5, silence
    mean = {p: sum(v) / len(v) for p, v in silence.items()}
    assert mean["classic"] > mean["consumer"], silence


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, value=b"%d" % i, partition=part)
    assert p.flush(30) == 0


async def test_pattern_commit_committed_and_seek_on_a_consumer_instance(fast_kafka: EmbeddedKafka,
                                                                         gw: GatewayProcess) -> None:
    """A consumer-protocol instance subscribed by pattern: the broker evaluates the regex (sent in RE2 syntax) and
    assigns every matching topic, the gateway never fetches one the tenant may not read (here the operator's
    deny-list) and logs it; commits carry the member epoch, committed offsets read back, seek rewinds (read on a
    stream); v3 describes the group as a consumer-protocol group."""
    uid = uuid.uuid4().hex[:6]
    prefix = f"kip848-p-{uid}"
    for name, parts in ((f"{prefix}-a", 2), (f"{prefix}-b", 1), (f"{prefix}-secret", 1)):
        await create_topic(fast_kafka.bootstrap, name, parts)
        await asyncio.to_thread(produce, fast_kafka.bootstrap, name, parts, 5)
    group = f"kip848-pattern-{uid}"
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{gw.url}/consumers/{group}", headers=V2, json={
            "name": "c", "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false",
            "group.protocol": "consumer", "group.remote.assignor": "range"})
        assert r.status_code == 200, r.text
        base = r.json()["base_uri"]
        # Java syntax: \p{Alnum} is rewritten for RE2 (the broker runs RE2/J)
        r = await http.post(f"{base}/subscription", headers=V2, json={"topic_pattern": prefix + "-\\p{Alnum}+"})
        assert r.status_code == 204, r.text
        got: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + 30
        while len(got) < 15:
            assert time.monotonic() < deadline, got
            r = await http.get(f"{base}/records", params={"timeout": 500}, headers=BINARY)
            assert r.status_code == 200, r.text
            got += [(rec["topic"], rec["partition"], rec["offset"]) for rec in r.json()]
        r = await http.get(f"{base}/records", params={"timeout": 300}, headers=BINARY)
        got += [(rec["topic"], rec["partition"], rec["offset"]) for rec in r.json()]
        assert sorted(got) == sorted((f"{prefix}-{t}", p, o) for t, ps in (("a", 2), ("b", 1))
                                     for p in range(ps) for o in range(5)), got
        r = await http.get(f"{base}/subscription")
        assert r.json() == {"topics": [f"{prefix}-a", f"{prefix}-b"]}, r.text
        r = await http.get(f"{base}/assignments")
        assert sorted((p["topic"], p["partition"]) for p in r.json()["partitions"]) == [
            (f"{prefix}-a", 0), (f"{prefix}-a", 1), (f"{prefix}-b", 0)]

        # commit one partition (offset 2: 3 is committed, as Confluent), then everything consumed
        a0 = {"topic": f"{prefix}-a", "partition": 0}
        r = await http.post(f"{base}/offsets", headers=V2, json={"offsets": [{**a0, "offset": 2}]})
        assert r.status_code == 200, r.text
        r = await http.request("GET", f"{base}/offsets", headers=V2, json={"partitions": [a0]})
        assert r.status_code == 200 and r.json()["offsets"] == [{**a0, "offset": 3, "metadata": ""}], r.text
        r = await http.post(f"{base}/offsets", headers=V2, json={})
        assert r.status_code == 200, r.text
        r = await http.get(f"{base}/offsets")
        assert sorted((o["topic"], o["partition"], o["offset"]) for o in r.json()["offsets"]) == [
            (f"{prefix}-a", 0, 5), (f"{prefix}-a", 1, 5), (f"{prefix}-b", 0, 5)], r.text
        # seek back: the partition's records again, here through an NDJSON stream
        r = await http.post(f"{base}/positions", headers=V2, json={"offsets": [{**a0, "offset": 1}]})
        assert r.status_code == 204, r.text
        again: list[int] = []
        async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"},
                               params={"max_records": 10}) as resp:
            assert resp.status_code == 200, (await resp.aread()).decode()
            async for line in resp.aiter_lines():
                assert time.monotonic() < deadline, again
                rec = json.loads(line) if line else {}
                assert "error_code" not in rec, rec
                if rec.get("topic") == a0["topic"] and rec.get("partition") == 0:
                    again.append(rec["offset"])
                if len(again) >= 4:
                    break
        assert again == [1, 2, 3, 4]
        metrics = (await http.get(f"{gw.url}/metrics")).text
        assert re.search(rf'^kcg_group_member_epoch{{group="{group}",tenant="default"}} [1-9]', metrics, re.M), metrics
        # v3: the group is a consumer-protocol group (ConsumerGroupDescribe), with the broker's assignor
        cid = (await http.get(f"{gw.url}/v3/clusters")).json()["data"][0]["cluster_id"]
        r = await http.get(f"{gw.url}/v3/clusters/{cid}/consumer-groups/{group}")
        assert r.status_code == 200, r.text
        g = r.json()
        assert (g["group_type"], g["partition_assignor"], g["state"], g["is_simple"]) == (
            "consumer", "range", "STABLE", False), g
        r = await http.get(f"{gw.url}/v3/clusters/{cid}/consumer-groups/{group}/consumers")
        (member,) = r.json()["data"]
        r = await http.get(f"{gw.url}/v3/clusters/{cid}/consumer-groups/{group}/consumers/{member['consumer_id']}"
                           "/assignments")
        assert sorted((a["topic_name"], a["partition_id"]) for a in r.json()["data"]) == [
            (f"{prefix}-a", 0), (f"{prefix}-a", 1), (f"{prefix}-b", 0)], r.text  # not the denied topic
        assert (await http.delete(base, headers=V2)).status_code == 204
    assert gw.log_file is not None
    log = gw.log_file.read_text()
    assert f"the broker assigned topics this consumer may not read; ignored (never fetched): ['{prefix}-secret']" in log


def test_a_consumer_instance_is_refused_on_tansu(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    """Tansu has no ConsumerGroupHeartbeat: a consumer-protocol instance is refused when it is created (409/40913),
    whether the body asks for it or the gateway's default (GATEWAY_GROUP_PROTOCOL) gives it; classic works."""
    env = {"GATEWAY_GROUP_PROTOCOL": "consumer"}
    with GatewayProcess(tansu.bootstrap, env=env, log_file=tmp_path / "gw.log") as g, httpx.Client(timeout=30) as http:
        for body in ({"group.protocol": "consumer"}, {}):
            r = http.post(f"{g.url}/consumers/kip848-tansu", headers=V2, json=body)
            assert r.status_code == 409, r.text
            err = r.json()
            assert err["error_code"] == 40913 and "group.protocol 'classic'" in err["message"], err
            assert "ConsumerGroupHeartbeat" in err["message"], err
        r = http.post(f"{g.url}/consumers/kip848-tansu", headers=V2, json={"group.protocol": "classic"})
        assert r.status_code == 200, r.text
        r = http.post(f"{g.url}/consumers/kip848-tansu", headers=V2, json={"group.protocol": "eager"})
        assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text


async def test_a_durable_consumer_instance_survives_kill_9_of_its_gateway(fast_kafka: EmbeddedKafka,
                                                                          tmp_path: Path) -> None:
    """A durable, static consumer-protocol instance (the protocol from GATEWAY_GROUP_PROTOCOL) whose gateway is
    killed with -9: the restarted gateway re-creates it from its descriptor under the same group.instance.id and it
    takes the partitions over (Kafka 4.4 lets it replace the killed member at once; a broker that answers
    UNRELEASED_INSTANCE_ID until it expires that one is retried, see wait_for_instance_release). No 404; everything
    after the last commit is delivered again, nothing is lost."""
    uid = uuid.uuid4().hex[:6]
    topic, group = f"kip848-durable-{uid}", f"kip848-durable-{uid}"
    await create_topic(fast_kafka.bootstrap, topic, 2)
    env = {"GATEWAY_DURABLE_INSTANCES": "true", "GATEWAY_STATIC_MEMBERSHIP": "true", "GATEWAY_REPLICA_ID": "k848",
           "GATEWAY_GROUP_PROTOCOL": "consumer", "GATEWAY_LOG_LEVEL": "info"}

    def feed(start: int, n: int) -> None:
        p = CKProducer({"bootstrap.servers": fast_kafka.bootstrap, "linger.ms": 5})
        for i in range(start, start + n):
            p.produce(topic, value=b"%d" % i, partition=i % 2)
        assert p.flush(30) == 0

    async def poll_until(http: httpx.AsyncClient, base: str, want: int) -> list[int]:
        got: list[int] = []
        deadline = time.monotonic() + 40
        while len(got) < want:
            assert time.monotonic() < deadline, got
            r = await http.get(f"{base}/records", params={"timeout": 1000}, headers=BINARY)
            assert r.status_code == 200, r.text  # never a 404: the instance is re-created on demand
            got += [int(base64.b64decode(rec["value"])) for rec in r.json()]
        return got

    g1 = GatewayProcess(fast_kafka.bootstrap, env=env, log_file=tmp_path / "gw1.log")
    g1.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{g1.url}/consumers/{group}", headers=V2, json={
                "name": "c", "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
            assert r.status_code == 200, r.text
            base = f"{g1.url}/consumers/{group}/instances/c"
            assert (await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic]})).status_code == 204
            await asyncio.to_thread(feed, 0, 20)
            assert sorted(await poll_until(http, base, 20)) == list(range(20))
            assert (await http.post(f"{base}/offsets", headers=V2, json={})).status_code == 200
            await asyncio.to_thread(feed, 20, 10)
            assert sorted(await poll_until(http, base, 10)) == list(range(20, 30))  # delivered, not committed
    finally:
        g1.kill()
    g2 = GatewayProcess(fast_kafka.bootstrap, env=env, log_file=tmp_path / "gw2.log")
    g2.start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            base = f"{g2.url}/consumers/{group}/instances/c"
            await asyncio.to_thread(feed, 30, 10)
            again = await poll_until(http, base, 20)
            assert sorted(again) == list(range(20, 40)), again  # the uncommitted 10 again, then the new ones
            cid = (await http.get(f"{g2.url}/v3/clusters")).json()["data"][0]["cluster_id"]
            r = await http.get(f"{g2.url}/v3/clusters/{cid}/consumer-groups/{group}/consumers")
            (member,) = r.json()["data"]
            assert member["instance_id"] == "k848.default.c", member
            assert (await http.delete(base, headers=V2)).status_code == 204
    finally:
        g2.stop()
    log = (tmp_path / "gw2.log").read_text()
    assert "re-created consumer instance c" in log and "coordinator_consumer" in log


async def test_rolling_restart_of_two_replicas_with_durable_consumer_instances(
        fast_kafka: EmbeddedKafka, tmp_path: Path, cleanup: list[GatewayProcess]) -> None:
    """Two replicas with durable, static consumer-protocol instances (one owned by each), a client per instance
    polling through one replica and committing through the other after every batch; SIGTERM of one replica,
    started again, then the other, each while records are produced. Every record counted: nothing lost, nothing
    below a 2xx commit delivered again, no 404 (the instance is handed off and re-created under the same
    group.instance.id), and the group ends stable with both members and every partition assigned once."""
    from tests.integration.replicas import (  # the replica helpers of the classic rolling restart
        Ledger,
        commit,
        converged,
        name_owned_by,
        produce,
        replica_set,
        start,
    )

    uid = uuid.uuid4().hex[:6]
    topic, group, parts = f"kip848-rolling-{uid}", f"kip848-rolling-{uid}", 4
    await create_topic(fast_kafka.bootstrap, topic, parts)
    produced = await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 0, 400, parts)
    procs = replica_set(fast_kafka, tmp_path, ["a", "b"], env={
        "GATEWAY_DURABLE_INSTANCES": "true", "GATEWAY_STATIC_MEMBERSHIP": "true", "GATEWAY_GROUP_PROTOCOL": "consumer",
        "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "10000"})
    cleanup += procs.values()
    start(*procs.values())
    await converged(list(procs.values()), {"a", "b"})
    names = [name_owned_by("a", ["a", "b"], group, prefix="x"), name_owned_by("b", ["a", "b"], group, prefix="y")]
    ledgers = {n: Ledger() for n in names}
    statuses: collections.Counter[int] = collections.Counter()
    bad: list[str] = []
    stop = asyncio.Event()
    group_committed: dict[int, int] = {}  # partition -> next offset covered by a 2xx commit of either instance
    below_commit: list[tuple[str, int, int]] = []  # delivered again though a 2xx commit covered it

    def everything() -> set[bytes]:
        return set().union(*(lg.values() for lg in ledgers.values()))

    async with contextlib.AsyncExitStack() as stack:
        via = [await stack.enter_async_context(httpx.AsyncClient(base_url=p.url, timeout=60))
               for p in procs.values()]
        for n in names:
            r = await via[0].post(f"/consumers/{group}", headers=V2, json={
                "name": n, "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
            assert r.status_code == 200, r.text
            r = await via[1].post(f"/consumers/{group}/instances/{n}/subscription", headers=V2,
                                  json={"topics": [topic]})
            assert r.status_code == 204, r.text

        async def client(n: str, k: int) -> None:
            base, ledger, i = f"/consumers/{group}/instances/{n}", ledgers[n], k
            while not stop.is_set():
                poller, committer = via[i % 2], via[(i + 1) % 2]
                i += 1
                try:
                    r = await poller.get(f"{base}/records", params={"timeout": 300, "max_records": 100},
                                         headers=BINARY)
                except httpx.TransportError as exc:  # a replica stopping: the client tries the other one
                    statuses[-1] += 1
                    bad.append(f"transport {type(exc).__name__}")
                    continue
                statuses[r.status_code] += 1
                if r.status_code == 503:  # draining, or the instance being re-created: Retry-After
                    assert "retry-after" in r.headers, r.text
                    continue
                if r.status_code != 200:
                    bad.append(f"{r.status_code} {r.text[:200]}")
                    continue
                below_commit.extend((n, rec["partition"], rec["offset"]) for rec in r.json()
                                    if rec["offset"] < group_committed.get(rec["partition"], 0))
                ledger.add(r.json())
                if r.json():
                    try:
                        c = await commit(committer, base, topic, ledger)
                    except httpx.TransportError:
                        statuses[-1] += 1
                        continue
                    statuses[c.status_code] += 1
                    for part, nxt_offset in ledger.committed.items():
                        group_committed[part] = max(group_committed.get(part, 0), nxt_offset)
                    if c.status_code not in (200, 409, 503):
                        bad.append(f"commit {c.status_code} {c.text[:200]}")

        tasks = [asyncio.create_task(client(n, k)) for k, n in enumerate(names)]
        try:
            nxt = 400
            for rid in ("a", "b"):
                produced |= await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, nxt, 200, parts)
                procs[rid].stop()  # SIGTERM: drain, hand the instance off, leave, exit
                produced |= await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, nxt + 200, 200, parts)
                nxt += 400
                # the other replica takes the instance over (re-created from its descriptor at the first request
                # that reaches it) before this one comes back: otherwise a quick restart could re-create it here
                # first, and the hand-off this test is about would not happen
                other, mine = ("b", names[0]) if rid == "a" else ("a", names[1])
                deadline = time.monotonic() + 40
                while f"re-created consumer instance {mine} " not in (tmp_path / f"gw-{other}.log").read_text():
                    assert time.monotonic() < deadline, f"{other} never took {mine} over; {dict(statuses)}; {bad[:5]}"
                    await asyncio.sleep(0.1)  # the client tasks poll; this watches the other replica's log
                procs[rid].start()
                await converged(list(procs.values()), {"a", "b"})
                deadline = time.monotonic() + 40
                while not produced <= everything():
                    assert time.monotonic() < deadline, (f"after restarting {rid}: missing "
                                                         f"{len(produced - everything())}; {dict(statuses)}; {bad[:5]}")
                    await asyncio.sleep(0.1)  # the client tasks consume; this only watches their ledgers
        finally:
            stop.set()
            await asyncio.gather(*tasks)

        # the group is not stuck: stable, both members (under their static ids), each partition assigned once
        cid = (await via[0].get("/v3/clusters")).json()["data"][0]["cluster_id"]
        deadline = time.monotonic() + 20
        while True:
            g = (await via[0].get(f"/v3/clusters/{cid}/consumer-groups/{group}")).json()
            members = (await via[0].get(f"/v3/clusters/{cid}/consumer-groups/{group}/consumers")).json()["data"]
            owned = [a["partition_id"] for m in members for a in (await via[0].get(
                f"/v3/clusters/{cid}/consumer-groups/{group}/consumers/{m['consumer_id']}/assignments")
            ).json()["data"]]
            if (g["state"], g["group_type"], len(members), sorted(owned)) == ("STABLE", "consumer", 2,
                                                                               list(range(parts))):
                break
            assert time.monotonic() < deadline, (g, members, owned)
            await asyncio.sleep(0.2)  # polling the group's description while its members settle
        ids = sorted(m["instance_id"] for m in members)  # static: the ids the instances were created with
        assert [i.rsplit(".", 1)[1] for i in ids] == sorted(names), ids
        for n in names:
            r = await via[0].delete(f"/consumers/{group}/instances/{n}", headers=V2)
            assert r.status_code == 204, r.text

    assert everything() == produced  # nothing lost
    assert statuses[404] == 0 and statuses[410] == 0, (dict(statuses), bad[:5])
    assert not [b for b in bad if not b.startswith("transport")], bad[:10]
    # duplicates only inside the uncommitted window: nothing a 2xx commit (of either instance) covered came back
    assert below_commit == [], below_commit[:10]
    # each instance was handed off to the other replica and back, re-created there from its descriptor
    logs = {rid: (tmp_path / f"gw-{rid}.log").read_text() for rid in procs}
    recreated = {rid: len(re.findall(r"re-created consumer instance \S+ .* static member", t))
                 for rid, t in logs.items()}
    assert recreated["a"] >= 1 and recreated["b"] >= 1, recreated
    delivered = sum(len(lg.received) for lg in ledgers.values())
    print(f"rolling restart, consumer protocol: statuses {dict(statuses)}; delivered {delivered} for "
          f"{len(produced)} produced; re-created per replica {recreated}")
