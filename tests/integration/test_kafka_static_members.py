"""Static membership (KIP-345) through the gateway on Apache Kafka: HTTP consumer instances whose group member has
a group.instance.id (GATEWAY_STATIC_MEMBERSHIP: ``<replica_id>.<tenant>.<name>``), one per gateway process, two
processes in one group.

- A gateway killed with -9 and started again within the session timeout: its durable instance is re-created with
  the same group.instance.id, Kafka hands it its old partitions under a new member id and the group does not
  rebalance: the other member keeps its member id, its partitions and its rebalance count, and its commits are
  never refused.
- A gateway that stays away: Kafka expires its static member at the session timeout and the remaining member gets
  every partition.

Each test counts every record: nothing lost, redelivered only what was delivered and not committed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.kafka import EmbeddedKafka
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.replicas import BIN, V2, Ledger, commit, metric, produce, start

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PARTS = 4


def gateway(kafka: EmbeddedKafka, tmp_path: Path, rid: str, session_ms: int) -> GatewayProcess:
    return GatewayProcess(kafka.bootstrap, log_file=tmp_path / f"gw-{rid}.log", env={
        "GATEWAY_REPLICA_ID": rid, "GATEWAY_STATIC_MEMBERSHIP": "true", "GATEWAY_DURABLE_INSTANCES": "true",
        "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": str(session_ms), "GATEWAY_LOG_LEVEL": "info"})


async def join(http: httpx.AsyncClient, group: str, name: str, topic: str) -> str:
    r = await http.post(f"/consumers/{group}", headers=V2, json={
        "name": name, "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/{name}"
    r = await http.post(f"{base}/subscription", headers=V2, json={"topics": [topic]})
    assert r.status_code == 204, r.text
    return base


async def assigned(http: httpx.AsyncClient, base: str) -> list[int]:
    r = await http.get(f"{base}/assignments")
    assert r.status_code == 200, r.text
    return sorted(p["partition"] for p in r.json()["partitions"])


async def poll_commit(http: httpx.AsyncClient, base: str, topic: str, ledger: Ledger) -> list[int]:
    """One poll and, if it delivered, a commit of it; the commit statuses."""
    r = await http.get(f"{base}/records", params={"timeout": 300, "max_records": 500}, headers=BIN)
    assert r.status_code == 200, r.text
    ledger.add(r.json())
    if not r.json():
        return []
    c = await commit(http, base, topic, ledger)
    if c.status_code != 200:
        print(f"commit {base}: {c.status_code} {c.text} at {time.time():.3f}")
    return [c.status_code]


async def settle(members: list[tuple[httpx.AsyncClient, str]], want: list[list[int]], topic: str,
                 ledgers: list[Ledger], timeout: float = 40) -> list[int]:
    """Poll (and commit) with every member until their assignments are ``want``; the commit statuses."""
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        got = [await assigned(h, b) for h, b in members]
        if got == want:
            return statuses
        assert time.monotonic() < deadline, f"assignments {got}, want {want}"
        for (h, b), lg in zip(members, ledgers, strict=True):
            statuses += await poll_commit(h, b, topic, lg)


async def drain(members: list[tuple[httpx.AsyncClient, str]], topic: str, ledgers: list[Ledger],
                want: set[bytes], timeout: float = 40) -> list[int]:
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    while not want <= set().union(*(lg.values() for lg in ledgers)):
        assert time.monotonic() < deadline, f"missing {len(want - set().union(*(lg.values() for lg in ledgers)))}"
        for (h, b), lg in zip(members, ledgers, strict=True):
            statuses += await poll_commit(h, b, topic, lg)
    return statuses


async def members_of(http: httpx.AsyncClient, group: str) -> dict[str, dict[str, Any]]:
    """The group's members by group.instance.id (v3 consumers), each with its assigned partitions."""
    cid = (await http.get("/v3/clusters")).json()["data"][0]["cluster_id"]
    r = await http.get(f"/v3/clusters/{cid}/consumer-groups/{group}/consumers")
    assert r.status_code == 200, r.text
    out: dict[str, dict[str, Any]] = {}
    for m in r.json()["data"]:
        a = (await http.get(m["assignments"]["related"])).json()["data"]
        out[m["instance_id"]] = {"consumer_id": m["consumer_id"], "partitions": sorted(x["partition_id"] for x in a)}
    return out


async def create_topic(kafka: EmbeddedKafka, topic: str) -> None:
    client = KafkaClient(kafka.bootstrap)
    try:
        await client.create_topics({topic: PARTS})
    finally:
        await client.close()


async def test_a_static_member_back_within_the_session_timeout_rejoins_without_a_rebalance(
        kafka: EmbeddedKafka, topic_name: str, tmp_path: Path, cleanup: list[GatewayProcess]) -> None:
    """Each gateway in turn (so the group's leader is among them) is killed with -9 after its member delivered
    records it did not commit, and started again."""
    group = f"static-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka, topic_name)
    # a long session: the killed gateway is back well within it, even on a loaded machine
    ga, gb = gateway(kafka, tmp_path, "ra", 15000), gateway(kafka, tmp_path, "rb", 15000)
    cleanup += [ga, gb]
    start(ga, gb)
    la, lb = Ledger(), Ledger()
    want = {"ra.default.a": [0, 1], "rb.default.b": [2, 3]}
    async with httpx.AsyncClient(base_url=ga.url, timeout=60) as ha, \
            httpx.AsyncClient(base_url=gb.url, timeout=60) as hb:
        a = await join(ha, group, "a", topic_name)
        b = await join(hb, group, "b", topic_name)
        # settled before the first record: every delivery below is by the final owner of its partition
        await settle([(ha, a), (hb, b)], [[0, 1], [2, 3]], topic_name, [la, lb])
        assert not la.received and not lb.received
        produced = await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 0, 400, PARTS)
        statuses = await drain([(ha, a), (hb, b)], topic_name, [la, lb], produced)
    uncommitted: list[tuple[int, int, bytes]] = []
    redelivered = 0
    next_value = 400
    for victim, other, base, ledger in ((ga, gb, a, la), (gb, ga, b, lb)):
        async with httpx.AsyncClient(base_url=ga.url, timeout=60) as ha, \
                httpx.AsyncClient(base_url=gb.url, timeout=60) as hb:
            hv = ha if victim is ga else hb
            before = await members_of(hb, group)
            assert {k: v["partitions"] for k, v in before.items()} == want, before
            rebalances_other = await metric(other, "kcg_rebalances_total", '{tenant="default"}')
            assert rebalances_other >= 1
            # more records; the victim polls some of its own and is killed before it commits them
            produced |= await asyncio.to_thread(produce, kafka.bootstrap, topic_name, next_value, 200, PARTS)
            next_value += 200
            mine: list[tuple[int, int, bytes]] = []
            deadline = time.monotonic() + 20
            while not mine:
                assert time.monotonic() < deadline, "the victim got none of the new records"
                r = await hv.get(f"{base}/records", params={"timeout": 500, "max_records": 30}, headers=BIN)
                assert r.status_code == 200, r.text
                n = len(ledger.received)
                ledger.add(r.json())
                mine = ledger.received[n:]
            uncommitted += mine
        victim.kill()
        t_killed = time.monotonic()
        victim.start()  # same port, replica id and static member ids
        ledger.new_instance()
        async with httpx.AsyncClient(base_url=ga.url, timeout=60) as ha, \
                httpx.AsyncClient(base_url=gb.url, timeout=60) as hb:
            # the first request re-creates the instance from its descriptor; Kafka gives it back its partitions
            statuses += await drain([(ha, a), (hb, b)], topic_name, [la, lb], produced)
            back_after = time.monotonic() - t_killed
            redelivered += sum(1 for x in ledger.received[ledger.session:] if x in mine)
            assert await assigned(ha, a) == [0, 1] and await assigned(hb, b) == [2, 3]
            after = await members_of(hb, group)
            assert {k: v["partitions"] for k, v in after.items()} == want, after
            # no rebalance: the other member kept its member id and completed no rebalance; the victim got a new
            # member id and completed one join (its first)
            for iid in want:
                same = after[iid]["consumer_id"] == before[iid]["consumer_id"]
                assert same is (iid[:2] != victim.env["GATEWAY_REPLICA_ID"]), (iid, before, after)
            assert await metric(other, "kcg_rebalances_total", '{tenant="default"}') == rebalances_other
            assert await metric(victim, "kcg_rebalances_total", '{tenant="default"}') == 1
            assert await metric(victim, "kcg_instances_recreated_total") == 1
        print(f"{victim.env['GATEWAY_REPLICA_ID']} back and consuming {back_after:.1f} s after kill -9; "
              f"{len(mine)} redelivered")
    # every commit was taken (a rebalance would have refused some with 409)
    assert statuses and set(statuses) == {200}, statuses
    assert la.values() | lb.values() == produced
    delivered = len(la.received) + len(lb.received)
    assert delivered - len(produced) == redelivered == len(uncommitted), (delivered, len(uncommitted))
    assert not la.committed_again and not lb.committed_again
    # one of the two was the group's leader: back, it was told to keep the current assignment (KIP-814)
    logs = [g.log_file.read_text() for g in (ga, gb) if g.log_file is not None]
    assert sum(text.count("a static leader back in a stable group") for text in logs) == 1


async def test_a_static_member_that_stays_away_expires_and_its_partitions_move(
        kafka: EmbeddedKafka, topic_name: str, tmp_path: Path, cleanup: list[GatewayProcess]) -> None:
    group = f"static-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka, topic_name)
    session_ms = 3000
    ga, gb = gateway(kafka, tmp_path, "ra", session_ms), gateway(kafka, tmp_path, "rb", session_ms)
    cleanup += [ga, gb]
    start(ga, gb)
    la, lb = Ledger(), Ledger()
    async with httpx.AsyncClient(base_url=ga.url, timeout=60) as ha, \
            httpx.AsyncClient(base_url=gb.url, timeout=60) as hb:
        a = await join(ha, group, "a", topic_name)
        b = await join(hb, group, "b", topic_name)
        # settled before the first record: every delivery below is by the final owner of its partition
        await settle([(ha, a), (hb, b)], [[0, 1], [2, 3]], topic_name, [la, lb])
        assert not la.received and not lb.received
        produced = await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 0, 400, PARTS)
        await drain([(ha, a), (hb, b)], topic_name, [la, lb], produced)
        produced |= await asyncio.to_thread(produce, kafka.bootstrap, topic_name, 400, 200, PARTS)
        uncommitted: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 20
        while not uncommitted:
            assert time.monotonic() < deadline, "a got none of the new records"
            r = await ha.get(f"{a}/records", params={"timeout": 500, "max_records": 30}, headers=BIN)
            assert r.status_code == 200, r.text
            n = len(la.received)
            la.add(r.json())
            uncommitted = la.received[n:]
        ga.kill()
        t_killed = time.monotonic()
        # "b" alone: the static member "a" is expired at its session timeout, then b gets all four partitions
        await settle([(hb, b)], [[0, 1, 2, 3]], topic_name, [lb])
        moved_after = time.monotonic() - t_killed
        await drain([(hb, b)], topic_name, [lb], produced - la.values())
        after = await members_of(hb, group)
        assert {k: v["partitions"] for k, v in after.items()} == {"rb.default.b": [0, 1, 2, 3]}, after
        cid = (await hb.get("/v3/clusters")).json()["data"][0]["cluster_id"]
        state = (await hb.get(f"/v3/clusters/{cid}/consumer-groups/{group}")).json()["state"]
        assert state == "STABLE"
        assert await metric(gb, "kcg_group_stall_recoveries_total", '{tenant="default"}') == 0
    # the expiry waits for the session timeout: not sooner
    assert moved_after >= session_ms / 1000 - 1, moved_after
    assert la.values() | lb.values() == produced
    delivered = len(la.received) + len(lb.received)
    # redelivered by b: what a delivered after its last commit
    again = [x for x in lb.received if x in uncommitted]
    assert delivered - len(produced) == len(again) == len(uncommitted), (delivered, len(uncommitted))
    print(f"a's partitions moved {moved_after:.1f} s after kill -9 (session {session_ms} ms)")
