"""What classic instances do, on consumer-protocol (KIP-848) members, against Apache Kafka 4.4: pause/resume across
an assignment change (the consumer engine's API; the HTTP API has no pause), the assignment and positions endpoints
of an instance forwarded between two gateway replicas, and a member fenced by the broker (its gateway stalled past
the session timeout) recovering by itself while an HTTP client polls, without an error. Every record is counted.

The broker is this module's own: 300 ms heartbeats and a 3 s session timeout under the consumer protocol (the
session broker keeps Kafka's 5 s / 45 s).
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.consumer.consumer import Consumer
from service.consumer.subscription import TopicPartition
from service.embedded.kafka import EmbeddedKafka
from service.group.coordinator import HEARTBEAT_TICK_S
from service.group.heartbeats import heartbeat_wheel
from tests.integration.gateway_proc import GatewayProcess, start_replicas
from tests.integration.kip848 import kip848_consumer, settled
from tests.integration.replicas import BIN, SERVED_BY, TOKEN, V2, name_owned_by

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
SESSION_S = 3.0


@pytest.fixture(scope="module")
def fast_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka(log_file=tmp_path_factory.mktemp("kip848-more") / "kafka.log", overrides={
        "group.consumer.heartbeat.interval.ms": "300",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.session.timeout.ms": str(int(SESSION_S * 1000)),
        "group.consumer.min.session.timeout.ms": str(int(SESSION_S * 1000)),
    })
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def produce(bootstrap: str, topic: str, start: int, n: int, partitions: int) -> dict[bytes, tuple[int, int]]:
    """Values ``start``..``start+n-1``, round robin over the partitions; value -> (partition, offset)."""
    out: dict[bytes, tuple[int, int]] = {}

    def done(err: object, msg: object) -> None:
        assert err is None, err
        out[msg.value()] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions, on_delivery=done)
    assert p.flush(30) == 0
    return out


async def test_pause_and_resume_survive_an_assignment_change(fast_kafka: EmbeddedKafka) -> None:
    """A consumer-protocol consumer pauses three of its four partitions: nothing of them is returned while the
    rest is; a second member joins and takes half (commit on revocation, paused or not); what the first still owns
    of its paused partitions (one at least) stays paused through the reconciliation while the second member reads
    what it took; resumed, they continue where they stopped. Every record is delivered exactly once."""
    uid = uuid.uuid4().hex[:6]
    topic, group, parts = f"kip848-pause-{uid}", f"kip848-pause-{uid}", 4
    client = KafkaClient(fast_kafka.bootstrap)
    consumers: list[Consumer] = []
    seen: dict[str, list[tuple[int, int]]] = {"first": [], "second": []}

    async def poll(c: Consumer, who: str, until: float = 0.3) -> None:
        for r in await c.poll(max_records=100, timeout=until):
            seen[who].append((r.partition, r.offset))

    try:
        await client.create_topics({topic: parts})
        produced = await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 0, 80, parts)
        first = kip848_consumer(client, group)
        consumers.append(first)
        await first.subscribe([topic])
        await settled(consumers, parts)
        wheel = heartbeat_wheel(asyncio.get_running_loop(), HEARTBEAT_TICK_S)
        wheel_sent = wheel.sent
        paused = {TopicPartition(topic, p) for p in (0, 1, 2)}
        first.pause(paused)
        assert first.paused() == paused
        deadline = time.monotonic() + 20
        while len(seen["first"]) < 20:  # everything of partition 3
            assert time.monotonic() < deadline, len(seen["first"])
            await poll(first, "first")
        await poll(first, "first", 0.2)
        assert {p for p, _ in seen["first"]} == {3} and len(seen["first"]) == 20

        second = kip848_consumer(client, group)
        consumers.append(second)
        await second.subscribe([topic])
        stop = asyncio.Event()

        async def keep_polling(c: Consumer, who: str) -> None:
            while not stop.is_set():
                await poll(c, who, 0.2)

        polls = [asyncio.create_task(keep_polling(first, "first")), asyncio.create_task(keep_polling(second, "second"))]
        try:
            await settled(consumers, parts)
            still_paused = paused & set(first.assignment())
            assert still_paused and first.paused() == still_paused, "what the first member kept stays paused"
            produced |= await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 80, 40, parts)
            unpaused_want = {produced[v] for v in produced if TopicPartition(topic, produced[v][0]) not in still_paused}
            deadline = time.monotonic() + 20
            while not unpaused_want <= set(seen["first"]) | set(seen["second"]):
                assert time.monotonic() < deadline, len(unpaused_want - set(seen["first"]) - set(seen["second"]))
                await asyncio.sleep(0.05)  # the poll tasks deliver; this watches their counts
            assert not [x for x in seen["first"] if TopicPartition(topic, x[0]) in still_paused], "paused: nothing"
            first.resume(still_paused)
            assert first.paused() == set()
            everything = set(produced.values())
            deadline = time.monotonic() + 20
            while not everything <= set(seen["first"]) | set(seen["second"]):
                assert time.monotonic() < deadline, len(everything - set(seen["first"]) - set(seen["second"]))
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*polls)
        delivered = seen["first"] + seen["second"]
        assert set(delivered) == set(produced.values())  # nothing lost
        assert len(delivered) == len(produced), Counter(delivered).most_common(3)  # and nothing twice
        assert seen["second"], "the second member consumed its share"
        assert wheel.sent > wheel_sent, "the stable members' heartbeats went from the shared heartbeat wheel"
    finally:
        for c in consumers:
            await c.close()
        await client.close()


async def test_assignment_and_positions_of_a_consumer_instance_forwarded_between_replicas(
        fast_kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """Two replicas; a consumer-protocol instance whose name the ring gives to b, created, subscribed, polled,
    sought and committed through a (forwarded) and through b: the assignment answers the same on both, seeking to
    the beginning, to the end and to an offset delivers exactly what follows the new position, commits read back
    through the other replica, and the instance is gone from both once deleted through a."""
    uid = uuid.uuid4().hex[:6]
    topic, group = f"kip848-fwd-{uid}", f"kip848-fwd-{uid}"
    client = KafkaClient(fast_kafka.bootstrap)
    try:
        await client.create_topics({topic: 2})
    finally:
        await client.close()
    produced = await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 0, 40, 2)
    a, b = start_replicas(fast_kafka.bootstrap, tmp_path, TOKEN, env={"GATEWAY_LOG_LEVEL": "info"})
    try:
        name = name_owned_by("b", ["a", "b"], group)
        base = f"/consumers/{group}/instances/{name}"
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as via_a, \
                httpx.AsyncClient(base_url=b.url, timeout=30) as via_b:
            r = await via_a.post(f"/consumers/{group}", headers=V2, json={
                "name": name, "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false",
                "group.protocol": "consumer"})
            assert r.status_code == 200 and r.headers[SERVED_BY] == "b", (r.status_code, r.headers, r.text)
            r = await via_a.post(f"{base}/subscription", headers=V2, json={"topics": [topic]})
            assert r.status_code == 204 and r.headers[SERVED_BY] == "b", r.text

            async def records(via: httpx.AsyncClient, want: int | set[bytes]) -> list[tuple[int, int, bytes]]:
                """Until ``want`` records (or these values) arrived, then one poll that must bring nothing."""
                got: list[tuple[int, int, bytes]] = []
                deadline = time.monotonic() + 30
                while len(got) < want if isinstance(want, int) else not want <= {v for _, _, v in got}:
                    assert time.monotonic() < deadline, got
                    r = await via.get(f"{base}/records", params={"timeout": 500}, headers=BIN)
                    assert r.status_code == 200, r.text
                    got += [(x["partition"], x["offset"], base64.b64decode(x["value"])) for x in r.json()]
                r = await via.get(f"{base}/records", params={"timeout": 200}, headers=BIN)
                assert r.status_code == 200 and r.json() == [], "nothing more than wanted"
                return got

            first = await records(via_a, 40)
            assert {v: (p, o) for p, o, v in first} == produced  # each once, at its offset
            for via in (via_a, via_b):
                r = await via.get(f"{base}/assignments")
                assert r.status_code == 200, r.text
                assert sorted((x["topic"], x["partition"]) for x in r.json()["partitions"]) == [(topic, 0), (topic, 1)]

            # seek partition 0 to its beginning: its 20 records again, nothing of partition 1
            r = await via_a.post(f"{base}/positions/beginning", headers=V2,
                                 json={"partitions": [{"topic": topic, "partition": 0}]})
            assert r.status_code == 204, r.text
            again = await records(via_b, 20)
            assert sorted((p, o) for p, o, _ in again) == [(0, o) for o in range(20)]
            # to the end (resolved lazily, as Java's seekToEnd: at offset 20, or at 25 if the five records each
            # partition gets next were there first): nothing older, everything from there on
            r = await via_b.post(f"{base}/positions/end", headers=V2, json={"partitions": [
                {"topic": topic, "partition": 0}, {"topic": topic, "partition": 1}]})
            assert r.status_code == 204, r.text
            later = await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 40, 10, 2)
            later |= await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, 50, 10, 2)
            from_end = await records(via_a, {b"%d" % i for i in range(50, 60)})
            for part in (0, 1):
                offsets = [o for p, o, _ in from_end if p == part]
                assert offsets in (list(range(20, 30)), list(range(25, 30))), offsets
            assert all(later[v] == (p, o) for p, o, v in from_end)
            # to an offset of partition 1: from there on
            r = await via_a.post(f"{base}/positions", headers=V2,
                                 json={"offsets": [{"topic": topic, "partition": 1, "offset": 15}]})
            assert r.status_code == 204, r.text
            tail = await records(via_b, 15)
            assert sorted((p, o) for p, o, _ in tail) == [(1, o) for o in range(15, 30)]

            # a commit through one replica reads back through the other
            r = await via_b.post(f"{base}/offsets", headers=V2, json={"offsets": [
                {"topic": topic, "partition": 0, "offset": 29}, {"topic": topic, "partition": 1, "offset": 29}]})
            assert r.status_code == 200, r.text
            r = await via_a.request("GET", f"{base}/offsets", headers=V2, json={"partitions": [
                {"topic": topic, "partition": 0}, {"topic": topic, "partition": 1}]})
            assert r.status_code == 200, r.text
            assert sorted((x["partition"], x["offset"]) for x in r.json()["offsets"]) == [(0, 30), (1, 30)]

            r = await via_a.delete(base, headers=V2)
            assert r.status_code == 204 and r.headers[SERVED_BY] == "b", r.text
            for via in (via_a, via_b):
                r = await via.get(f"{base}/assignments")
                assert r.status_code == 404 and r.json()["error_code"] == 40403, r.text
    finally:
        a.stop()
        b.stop()
    log = (tmp_path / "gw-b.log").read_text()
    assert "coordinator_consumer" in log  # b ran the member on the consumer protocol


async def test_a_fenced_member_recovers_by_itself_while_a_client_polls(fast_kafka: EmbeddedKafka,
                                                                      tmp_path: Path) -> None:
    """The gateway holding a consumer-protocol instance stalls (SIGSTOP) for longer than the group's session
    timeout while records are produced and an HTTP client polls: the broker expires the member; when the gateway
    runs again its next heartbeat is answered UNKNOWN_MEMBER_ID, the member drops its partitions (uncommitted) and
    rejoins with epoch 0 by itself. The client sees only 200s, records keep flowing, nothing is lost, and what is
    delivered twice lies after the last commit made before the stall."""
    uid = uuid.uuid4().hex[:6]
    topic, group, parts = f"kip848-fence-{uid}", f"kip848-fence-{uid}", 2
    client = KafkaClient(fast_kafka.bootstrap)
    try:
        await client.create_topics({topic: parts})
    finally:
        await client.close()
    g = GatewayProcess(fast_kafka.bootstrap, log_file=tmp_path / "gw.log", env={"GATEWAY_LOG_LEVEL": "info"})
    g.start()
    produced: dict[bytes, tuple[int, int]] = {}
    delivered: list[tuple[float, int, int]] = []
    statuses: Counter[int] = Counter()
    try:
        async with httpx.AsyncClient(base_url=g.url, timeout=60) as http:
            r = await http.post(f"/consumers/{group}", headers=V2, json={
                "name": "c", "format": "binary", "auto.offset.reset": "earliest", "group.protocol": "consumer",
                "auto.commit.interval.ms": "200"})
            assert r.status_code == 200, r.text
            base = f"/consumers/{group}/instances/c"
            assert (await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic]})).status_code == 204
            stop = asyncio.Event()

            async def poll() -> None:
                while not stop.is_set():
                    r = await http.get(f"{base}/records", params={"timeout": 300}, headers=BIN)
                    statuses[r.status_code] += 1
                    if r.status_code == 200:
                        now = time.monotonic()
                        delivered.extend((now, x["partition"], x["offset"]) for x in r.json())

            async def feed() -> None:
                n = 0
                while not stop.is_set():
                    produced.update(await asyncio.to_thread(produce, fast_kafka.bootstrap, topic, n, 20, parts))
                    n += 20
                    await asyncio.sleep(0.1)  # a steady trickle of records

            tasks = [asyncio.create_task(poll()), asyncio.create_task(feed())]
            try:
                deadline = time.monotonic() + 30
                while len(delivered) < 100:
                    assert time.monotonic() < deadline, (len(delivered), dict(statuses))
                    await asyncio.sleep(0.05)  # the poll task delivers
                await asyncio.sleep(0.5)  # an auto commit covers most of it
                r = await http.request("GET", f"{base}/offsets", headers=V2, json={"partitions": [
                    {"topic": topic, "partition": p} for p in range(parts)]})
                assert r.status_code == 200, r.text
                committed = {x["partition"]: x["offset"] for x in r.json()["offsets"]}  # the next to read
                assert g.proc is not None
                os.kill(g.proc.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(SESSION_S + 2.0)  # the broker expires the member (no event to await)
                finally:
                    os.kill(g.proc.pid, signal.SIGCONT)
                resumed = time.monotonic()
                deadline = resumed + 30
                log = tmp_path / "gw.log"
                while not ("fenced (UNKNOWN_MEMBER_ID)" in log.read_text()
                           and sum(t > resumed + 1.0 for t, _, _ in delivered) >= 40):
                    assert time.monotonic() < deadline, (dict(statuses), log.read_text()[-3000:])
                    await asyncio.sleep(0.05)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            want = set(produced.values())
            deadline = time.monotonic() + 30
            while not want <= {(p, o) for _, p, o in delivered}:  # the rest of what was produced
                assert time.monotonic() < deadline, len(want - {(p, o) for _, p, o in delivered})
                r = await http.get(f"{base}/records", params={"timeout": 300}, headers=BIN)
                statuses[r.status_code] += 1
                delivered.extend((0.0, x["partition"], x["offset"]) for x in r.json())
            r = await http.get(f"{base}/assignments")
            assert len(r.json()["partitions"]) == parts, r.text
            assert (await http.delete(base, headers=V2)).status_code == 204
    finally:
        g.stop()
    assert set(statuses) == {200}, dict(statuses)  # no client-visible error
    got = Counter((p, o) for _, p, o in delivered)
    assert set(got) == set(produced.values())  # nothing lost
    again = [(p, o) for (p, o), k in got.items() if k > 1]
    assert all(o >= committed.get(p, 0) for p, o in again), (committed, sorted(again)[:10])
