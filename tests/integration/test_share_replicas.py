"""Share consumer instances across gateway replicas (two ``python -m gateway`` processes, Apache Kafka 4.4):
any replica serves any share instance (forwarded to the replica holding it, created on the ring owner of its
name), and a kill -9 of the replica holding acquired, unacknowledged records loses none of them: once their
acquisition lock runs out the broker hands them to a worker on the surviving replica, one delivery later.
Every record produced is counted: accepted once, none lost."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.embedded.kafka import EmbeddedKafka
from service.ring import SHARE_PREFIX
from tests.integration.replicas import clients, converged, name_owned_by, replica_set, start
from tests.integration.test_share_http import EARLIEST, JSON, ack, new_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
SERVED_BY = "x-kcg-served-by"


async def poll(http: httpx.AsyncClient, path: str, max_records: int = 50,
               timeout: int = 300) -> tuple[list[dict[str, Any]], str | None]:
    r = await http.get(f"{path}/records", params={"max_records": max_records, "timeout": timeout})
    assert r.status_code == 200, r.text
    return r.json(), r.headers.get(SERVED_BY)


async def create(http: httpx.AsyncClient, group: str, name: str, topic: str, configs: dict[str, str]) -> str:
    r = await http.post(f"/share-groups/{group}", json={"name": name, "configs": configs}, headers=JSON)
    assert r.status_code == 200, r.text
    path = f"/share-groups/{group}/instances/{name}"
    r = await http.post(f"{path}/subscription", json={"topics": [topic]}, headers=JSON)
    assert r.status_code == 204, r.text
    return path


async def test_share_instances_forwarded_and_a_killed_holder_loses_nothing(kafka: EmbeddedKafka,
                                                                          tmp_path: Path) -> None:
    ids = ["s1", "s2"]
    procs = replica_set(kafka, tmp_path, ids)
    g1, g2 = procs["s1"], procs["s2"]
    start(g1, g2)
    try:
        await converged([g1, g2], set(ids))
        async with clients(g1, g2) as (h1, h2):
            # 1. forwarding: a worker held by each replica, created through s1, polled and acknowledged through
            # s2 (the one held by s1 is forwarded there; the create of the other went to its ring owner s2)
            topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 2)
            group = f"sgr-{uuid.uuid4().hex[:8]}"
            key = SHARE_PREFIX + group
            names = {rid: name_owned_by(rid, ids, key, prefix="w") for rid in ids}
            paths = {rid: await create(h1, group, names[rid], topic, EARLIEST) for rid in ids}
            n = 120
            await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 2)
            accepted: Counter[tuple[int, int]] = Counter()
            served: dict[str, set[str | None]] = {rid: set() for rid in ids}

            async def worker(rid: str) -> None:
                while sum(accepted.values()) < n:
                    got, by = await poll(h2, paths[rid], max_records=10)
                    served[rid].add(by)
                    if got:
                        answers = await ack(h2, paths[rid], [
                            {"topic": topic, "partition": r["partition"], "offset": r["offset"]} for r in got])
                        assert all(a["applied"] for a in answers), answers
                        accepted.update((r["partition"], r["offset"]) for r in got)

            await asyncio.wait_for(asyncio.gather(*(worker(rid) for rid in ids)), 60)
            assert len(accepted) == n and set(accepted.values()) == {1}, "every record accepted once, 0 lost"
            assert served["s1"] == {"s1"}, served  # forwarded by s2 to s1
            assert served["s2"] == {None}, served  # s2 holds it: served in place
            # a stream is forwarded too (SSE through s2 from s1), acknowledged alongside; s2's worker polls
            await asyncio.to_thread(produce, kafka.bootstrap, topic, 20, 2)  # offsets 60..69 on each partition
            streamed: Counter[tuple[int, int]] = Counter()

            async def stream_worker() -> None:
                async with h2.stream("GET", f"{paths['s1']}/records", params={"max_records": 5},
                                     headers={"accept": "text/event-stream"}) as r:
                    assert r.status_code == 200 and r.headers[SERVED_BY] == "s1"
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            rec = json.loads(line[6:])
                            [a] = await ack(h1, paths["s1"], [{"topic": topic, "partition": rec["partition"],
                                                               "offset": rec["offset"]}])
                            assert a["applied"], a
                            streamed[(rec["partition"], rec["offset"])] += 1
                        if sum(streamed.values()) + sum(accepted.values()) >= n + 20:
                            return

            async def poll_worker() -> None:
                while sum(streamed.values()) + sum(accepted.values()) < n + 20:
                    got, _ = await poll(h2, paths["s2"], max_records=5, timeout=200)
                    if got:
                        answers = await ack(h2, paths["s2"], [
                            {"topic": topic, "partition": r["partition"], "offset": r["offset"]} for r in got])
                        assert all(a["applied"] for a in answers), answers
                        accepted.update((r["partition"], r["offset"]) for r in got)

            await asyncio.wait_for(asyncio.gather(stream_worker(), poll_worker()), 60)
            both = accepted + streamed
            assert len(both) == n + 20 and set(both.values()) == {1}, "every record accepted once, 0 lost"
            assert streamed, "the forwarded stream delivered records"
            # the other replica serves the instance too, and deletes it
            r = await h1.get(f"{paths['s2']}/subscription")
            assert r.status_code == 200 and r.json() == {"topics": [topic]} and r.headers[SERVED_BY] == "s2"
            for rid in ids:
                assert (await h1.delete(paths[rid])).status_code == 204
            r = await h2.get(f"{paths['s1']}/subscription")
            assert r.status_code == 404 and r.json()["error_code"] == 40410, r.text
            # a create without a name is placed on the replica that received it (a generated name it owns)
            r = await h2.post(f"/share-groups/{group}", json={}, headers=JSON)
            assert r.status_code == 200 and SERVED_BY not in r.headers, r.text
            gen = r.json()["instance_id"]
            r = await h1.get(f"/share-groups/{group}/instances/{gen}/subscription")
            assert r.status_code == 200 and r.headers[SERVED_BY] == "s2", r.text
            assert (await h1.delete(f"/share-groups/{group}/instances/{gen}")).status_code == 204

            # 2. kill -9 of the replica holding acquired records: after the 1 s lock they go to the worker on
            # the surviving replica with delivery_count 2; every record accepted once
            topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
            group = f"sgk-{uuid.uuid4().hex[:8]}"
            key = SHARE_PREFIX + group
            configs = {**EARLIEST, "share.record.lock.duration.ms": "1000"}
            victim = await create(h2, group, name_owned_by("s1", ids, key, prefix="v"), topic, configs)
            survivor = await create(h2, group, name_owned_by("s2", ids, key, prefix="s"), topic, configs)
            m = 40
            await asyncio.to_thread(produce, kafka.bootstrap, topic, m, 1)
            held: list[dict[str, Any]] = []
            while not held:  # the victim acquires some (the survivor has not polled yet)
                held, by = await poll(h2, victim, max_records=10)
                assert by == "s1"
            assert {r["delivery_count"] for r in held} == {1}
            g1.kill()
            r = await h2.get(f"{victim}/records")  # its holder is gone: 404 naming the unreachable replica
            assert r.status_code == 404 and r.json()["error_code"] == 40410 and "'s1'" in r.json()["message"]
            got_by_offset: dict[int, int] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(got_by_offset) < m:
                assert loop.time() < deadline, sorted(got_by_offset)
                got, _ = await poll(h2, survivor, max_records=20)
                for rec in got:
                    assert rec["offset"] not in got_by_offset, f"offset {rec['offset']} accepted twice"
                    got_by_offset[rec["offset"]] = rec["delivery_count"]
                if got:
                    answers = await ack(h2, survivor, [{"topic": topic, "partition": 0, "offset": r["offset"]}
                                                       for r in got])
                    assert all(a["applied"] for a in answers), answers
            assert sorted(got_by_offset) == list(range(m)), "0 lost"
            again = {o for o, c in got_by_offset.items() if c > 1}
            assert again == {r["offset"] for r in held}, (again, held)  # redelivered: exactly what s1 held
            assert all(got_by_offset[r["offset"]] == 2 for r in held)
            got, _ = await poll(h2, survivor, timeout=300)
            assert got == []
            assert (await h2.delete(survivor)).status_code == 204
    finally:
        for p in procs.values():
            p.stop()
    text = (tmp_path / "gw-s2.log").read_text(errors="replace")
    assert "Traceback" not in text, f"the surviving replica logged an unexpected exception:\n{text[-4000:]}"
