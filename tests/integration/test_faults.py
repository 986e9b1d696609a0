"""Fault suite: every record is counted — produced, delivered, committed, redelivered.

The bar is not "no 5xx" but "nothing lost, and duplicates only inside the uncommitted window": after a
fault, a record that a 2xx commit covered is never delivered again, and every produced record is
delivered at least once. Run with the rest of the suite (`make test`), or alone with `-m fault`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.fault]
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}
NDJSON = {"Accept": "application/x-ndjson"}
TP = tuple[int, int]  # (partition, offset)


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


class Ledger:
    """What one consumer client saw and what the gateway acknowledged for it."""

    def __init__(self) -> None:
        self.received: list[tuple[int, int, bytes]] = []  # (partition, offset, value) in arrival order
        self.committed: dict[int, int] = {}  # partition -> next offset covered by a 2xx commit
        self.redelivered: list[TP] = []  # received again by this client
        self.committed_again: list[TP] = []  # received again although a 2xx commit already covered it

    def add(self, recs: list[dict[str, object]]) -> None:
        seen = {(p, o) for p, o, _ in self.received}
        for r in recs:
            p, o = int(r["partition"]), int(r["offset"])  # type: ignore[call-overload]
            if (p, o) in seen:
                self.redelivered.append((p, o))
                if self.covered(p, o):
                    self.committed_again.append((p, o))
            self.received.append((p, o, base64.b64decode(str(r["value"]))))

    def pending(self) -> dict[int, int]:
        """The commit that covers everything received: partition -> last offset received."""
        last: dict[int, int] = {}
        for p, o, _ in self.received:
            last[p] = max(last.get(p, -1), o)
        return last

    def covered(self, p: int, o: int) -> bool:
        return o < self.committed.get(p, 0)


async def commit(http: httpx.AsyncClient, base: str, topic: str, ledger: Ledger) -> int:
    last = ledger.pending()
    r = await http.post(f"{base}/offsets", headers=V2, json={"offsets": [
        {"topic": topic, "partition": p, "offset": o} for p, o in last.items()]})
    if r.status_code == 200:
        for p, o in last.items():
            ledger.committed[p] = max(ledger.committed.get(p, 0), o + 1)
    return r.status_code


async def create(http: httpx.AsyncClient, group: str, name: str, **cfg: object) -> str:
    r = await http.post(f"/consumers/{group}", headers=V2, json={
        "name": name, "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false", **cfg})
    assert r.status_code == 200, r.text
    return f"/consumers/{group}/instances/{name}"


def check(produced: int, ledgers: list[Ledger]) -> tuple[int, int]:
    """Nothing lost: every produced value was delivered. Returns (distinct delivered, duplicates)."""
    seen: dict[tuple[int, int], int] = {}
    values: set[bytes] = set()
    for ledger in ledgers:
        for p, o, v in ledger.received:
            seen[(p, o)] = seen.get((p, o), 0) + 1
            values.add(v)
    assert values == {b"%d" % i for i in range(produced)}, f"lost {produced - len(values)} records"
    dups = sum(c - 1 for c in seen.values())
    return len(seen), dups


@pytest.fixture
def gw_factory() -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for g in started:
        g.stop()


def start_gateway(tansu: EmbeddedBroker, started: list[GatewayProcess], tmp_path: Path) -> GatewayProcess:
    g = GatewayProcess(tansu.bootstrap, log_file=tmp_path / f"gw{len(started)}.log")
    g.start()
    started.append(g)
    return g


@contextlib.asynccontextmanager
async def client(g: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        yield c


async def drain(http: httpx.AsyncClient, base: str, topic: str, ledger: Ledger, want: set[bytes],
                timeout: float = 60) -> None:
    """Poll and commit until every value in ``want`` was received by this ledger."""
    deadline = time.monotonic() + timeout
    while not want <= {v for _, _, v in ledger.received}:
        assert time.monotonic() < deadline, f"missing {len(want - {v for _, _, v in ledger.received})} records"
        r = await http.get(f"{base}/records", params={"timeout": 1000, "max_records": 5000}, headers=BIN)
        assert r.status_code == 200, r.text
        ledger.add(r.json())
        if r.json():
            # 409/40903 while the group rebalances (retry after the next poll); the ledger counts only 2xx
            assert await commit(http, base, topic, ledger) in (200, 409)


async def test_kill_9_of_the_gateway_mid_stream(tansu: EmbeddedBroker, kclient: KafkaClient, topic_name: str,
                                                gw_factory: list[GatewayProcess], tmp_path: Path) -> None:
    n, parts = 20_000, 4
    await kclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, tansu.bootstrap, topic_name, n, parts)
    group = f"g-{topic_name}"
    first = Ledger()
    g1 = start_gateway(tansu, gw_factory, tmp_path)
    async with client(g1) as http:
        base = await create(http, group, "c1")
        assert (await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})).status_code == 204
        async with http.stream("GET", f"{base}/records", params={"max_records": 500}, headers=NDJSON) as resp:
            assert resp.status_code == 200
            since_commit = 0
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                rec = orjson.loads(line)
                if "error_code" in rec:
                    continue
                first.add([rec])
                since_commit += 1
                if since_commit >= 1000:
                    assert await commit(http, base, topic_name, first) == 200
                    since_commit = 0
                if len(first.received) >= 8_500:  # 500 received after the last commit
                    break
        committed_at_kill = dict(first.committed)
        assert g1.proc is not None
        g1.proc.kill()  # kill -9: no LeaveGroup, no final commit
        g1.proc.wait(10)
    g2 = start_gateway(tansu, gw_factory, tmp_path)
    second = Ledger()
    async with client(g2) as http:
        base = await create(http, group, "c1")
        await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        await drain(http, base, topic_name, second, {b"%d" % i for i in range(n)} - {v for *_, v in first.received})
        await http.delete(base)
    seen_first = {(a, b) for a, b, _ in first.received}  # built once (per record it took minutes)
    redelivered = [(p, o) for p, o, _ in second.received if (p, o) in seen_first]
    assert not [x for x in redelivered if x[1] < committed_at_kill.get(x[0], 0)], "a committed record came back"
    uncommitted = sum(1 for p, o, _ in first.received if o >= committed_at_kill.get(p, 0))
    distinct, dups = check(n, [first, second])
    assert distinct == n and dups == len(redelivered) <= uncommitted
    print(f"kill -9 mid-stream: {len(first.received)} delivered before, {uncommitted} uncommitted, "
          f"{dups} redelivered after restart")


async def test_a_vanished_member_hands_over_from_its_last_commit(
        tansu: EmbeddedBroker, kclient: KafkaClient, topic_name: str, gw_factory: list[GatewayProcess],
        tmp_path: Path) -> None:
    """Client A stops polling without deleting its instance (the process died): after its max poll
    interval the instance leaves the group, B takes its partitions from A's last commit; A's late commit
    retry for a partition it no longer owns is refused and does not move B's offsets back."""
    n, parts = 6_000, 4
    await kclient.create_topics({topic_name: parts})
    await asyncio.to_thread(produce, tansu.bootstrap, topic_name, n, parts)
    group = f"g-{topic_name}"
    g = start_gateway(tansu, gw_factory, tmp_path)
    a, b = Ledger(), Ledger()
    async with client(g) as http:
        base_a = await create(http, group, "a", **{"max.poll.interval.ms": "3000"})
        base_b = await create(http, group, "b")
        for base in (base_a, base_b):
            await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        # both members get partitions: poll both until each has records
        deadline = time.monotonic() + 30
        while not (a.received and b.received):
            assert time.monotonic() < deadline, "the group did not split the partitions"
            for base, ledger in ((base_a, a), (base_b, b)):
                r = await http.get(f"{base}/records", params={"timeout": 500, "max_records": 200}, headers=BIN)
                assert r.status_code == 200, r.text
                ledger.add(r.json())
        assert await commit(http, base_a, topic_name, a) == 200
        assert await commit(http, base_b, topic_name, b) == 200
        r = await http.get(f"{base_a}/records", params={"timeout": 500, "max_records": 200}, headers=BIN)
        a.add(r.json())  # received, never committed: the window that may come back
        a_committed = dict(a.committed)
        stale = a.pending()
        # A vanishes; B keeps consuming and committing everything
        await drain(http, base_b, topic_name, b, {b"%d" % i for i in range(n)} - {v for *_, v in a.received})
        b_committed = dict(b.committed)
        assert set(b_committed) == set(range(parts)), "B did not take over every partition"
        # A's client comes back and retries its old commit: refused, B's offsets stay
        r = await http.post(f"{base_a}/offsets", headers=V2, json={"offsets": [
            {"topic": topic_name, "partition": p, "offset": o} for p, o in stale.items()]})
        assert r.status_code == 409, r.text
        got = await http.request("GET", f"{base_b}/offsets", headers=V2, json={"partitions": [
            {"topic": topic_name, "partition": p} for p in range(parts)]})
        assert {o["partition"]: o["offset"] for o in got.json()["offsets"]} == b_committed
        for base in (base_a, base_b):
            await http.delete(base)
    a_keys = {(p, o) for p, o, _ in a.received}
    again = [(p, o) for p, o, _ in b.received if (p, o) in a_keys]
    assert not [x for x in again if x[1] < a_committed.get(x[0], 0)], "a committed record came back"
    distinct, dups = check(n, [a, b])
    assert distinct == n and dups == len(again) <= sum(1 for p, o, _ in a.received if o >= a_committed.get(p, 0))


async def test_kill_9_of_an_s3_broker_and_restart_under_an_http_consumer(
        s3_broker: EmbeddedBroker, topic_name: str, gw_factory: list[GatewayProcess], tmp_path: Path) -> None:
    """The broker (Tansu on S3, so log and committed offsets survive) is killed with SIGKILL under one
    gateway and one HTTP consumer instance, and restarted on the same port and bucket. The client keeps
    polling and committing through the same gateway: 503s, 409s (rebalance) and empty polls are fine while
    the broker is away, and a vanished instance may be created again; in the end every record arrived, and
    nothing that a 2xx commit covered was delivered again."""
    n, parts = 3_000, 3
    kc = KafkaClient(s3_broker.bootstrap)
    try:
        await kc.create_topics({topic_name: parts})
    finally:
        await kc.close()
    await asyncio.to_thread(produce, s3_broker.bootstrap, topic_name, n, parts)
    group = f"g-{topic_name}"
    g = start_gateway(s3_broker, gw_factory, tmp_path)
    ledger = Ledger()
    statuses: dict[str, int] = {}  # "GET 503", "POST 409", ... seen after the kill
    async with client(g) as http:
        base = await create(http, group, "c1")
        assert (await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})).status_code == 204
        while len(ledger.received) < n // 2:  # consume part, committing after every poll
            r = await http.get(f"{base}/records", params={"timeout": 1000, "max_records": 250}, headers=BIN)
            assert r.status_code == 200, r.text
            ledger.add(r.json())
            if r.json():
                assert await commit(http, base, topic_name, ledger) == 200
        r = await http.get(f"{base}/records", params={"timeout": 1000, "max_records": 250}, headers=BIN)
        assert r.status_code == 200, r.text
        ledger.add(r.json())  # received, not committed: the window that may come back
        committed_at_kill = dict(ledger.committed)
        received_at_kill = len(ledger.received)
        assert received_at_kill > sum(committed_at_kill.values()), "no uncommitted window before the kill"

        s3_broker.kill()  # kill -9: no clean shutdown, in-flight requests of the gateway fail
        down: list[str] = []
        for _ in range(2):  # while it is down: prefetched records, [] or 503; a commit cannot succeed
            r = await http.get(f"{base}/records", params={"timeout": 500, "max_records": 250}, headers=BIN)
            assert r.status_code in (200, 503), r.text
            down.append(f"GET {r.status_code}")
            if r.status_code == 200:
                ledger.add(r.json())
            status = await commit(http, base, topic_name, ledger)
            down.append(f"POST {status}")
            assert status in (409, 503), f"a commit answered {status} while the broker was down"
        s3_broker.start()  # same port, same bucket

        deadline = time.monotonic() + 90
        while not {b"%d" % i for i in range(n)} <= {v for _, _, v in ledger.received}:
            assert time.monotonic() < deadline, (
                f"missing {n - len({v for _, _, v in ledger.received})} records; statuses {statuses}")
            r = await http.get(f"{base}/records", params={"timeout": 1000, "max_records": 500}, headers=BIN)
            statuses[f"GET {r.status_code}"] = statuses.get(f"GET {r.status_code}", 0) + 1
            if r.status_code in (404, 410):  # the gateway dropped the instance: create it again
                base = await create(http, group, "c1")
                r = await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
                assert r.status_code == 204, r.text
                continue
            assert r.status_code in (200, 409, 503), r.text
            if r.status_code != 200:
                await asyncio.sleep(0.2)  # Retry-After: the broker is not back yet
                continue
            ledger.add(r.json())
            if r.json():
                status = await commit(http, base, topic_name, ledger)
                statuses[f"POST {status}"] = statuses.get(f"POST {status}", 0) + 1
                assert status in (200, 409, 503), status
        # the restarted broker kept every 2xx commit (S3), and holds nothing beyond them
        r = await http.request("GET", f"{base}/offsets", headers=V2, json={"partitions": [
            {"topic": topic_name, "partition": p} for p in range(parts)]})
        assert r.status_code == 200, r.text
        assert {o["partition"]: o["offset"] for o in r.json()["offsets"]} == ledger.committed
        await http.delete(base)

    assert not ledger.committed_again, f"records covered by a 2xx commit came back: {ledger.committed_again[:10]}"
    uncommitted = sum(1 for p, o, _ in ledger.received[:received_at_kill] if o >= committed_at_kill.get(p, 0))
    distinct, dups = check(n, [ledger])
    assert distinct == n and dups == len(ledger.redelivered)
    print(f"broker kill -9 (S3): {received_at_kill} delivered before, {uncommitted} uncommitted at the kill, "
          f"{dups} redelivered after the restart; while down {down}, after the restart {statuses}")
