"""Any replica serves any instance: several gateway processes on one machine, no load balancer.

Each replica gets GATEWAY_REPLICA_ID and GATEWAY_PEERS (every replica's URL); instances are created on the
ring owner of their name and every request reaching another replica is forwarded (or redirected) to the
replica holding the instance. The main test counts every record through a kill -9 of the holder: nothing
lost, and a record a 2xx commit covered is never delivered again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import httpx
import orjson
import pytest

from service.client.client import KafkaClient
from service.ring import owner, routing_key
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.replicas import (
    BIN,
    IN_FLIGHT,
    NDJSON,
    SERVED_BY,
    TOKEN,
    V2,
    Ledger,
    clients,
    commit,
    consume,
    converged,
    create,
    metric,
    name_owned_by,
    peers_view,
    produce,
    replica_set,
    start,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_create_on_a_consume_through_b_and_c_kill_a_recreate_on_b(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, tmp_path: Path,
        cleanup: list[GatewayProcess]) -> None:
    parts = 3
    await bclient.create_topics({topic_name: parts})
    produced = await asyncio.to_thread(produce, broker.bootstrap, topic_name, 0, 3000, parts)
    procs = replica_set(broker, tmp_path, ["a", "b", "c"])
    cleanup += procs.values()
    start(*procs.values())
    await converged(list(procs.values()), {"a", "b", "c"})
    group = f"g-{topic_name}"
    name = name_owned_by("a", ["a", "b", "c"], group)
    ledger = Ledger()
    async with clients(procs["a"], procs["b"], procs["c"]) as (a, b, c):
        r = await create(a, group, name)
        assert r.status_code == 200, r.text
        assert SERVED_BY not in r.headers  # created where it was asked: a owns the name
        base = f"/consumers/{group}/instances/{name}"
        assert r.json()["base_uri"] == f"{procs['a'].url}{base}"
        r = await b.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        assert r.status_code == 204 and r.headers[SERVED_BY] == "a", r.text
        r = await c.get(f"{base}/subscription")
        assert r.json() == {"topics": [topic_name]} and r.headers[SERVED_BY] == "a"

        # polls through C and B, commits through B and C
        await consume([c, b], base, topic_name, ledger, produced, "a")
        r = await c.request("GET", f"{base}/offsets", headers=V2, json={"partitions": [
            {"topic": topic_name, "partition": p} for p in range(parts)]})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a", r.text
        assert {o["partition"]: o["offset"] for o in r.json()["offsets"]} == {
            p: o + 1 for p, o in ledger.last().items()}

        # a long poll through B, waiting on A until records arrive
        poll = asyncio.create_task(b.get(f"{base}/records", params={"timeout": 20000}, headers=BIN))
        await until(lambda: metric(procs["a"], IN_FLIGHT, '{side="in"}'), lambda v: v >= 1 or poll.done(),
                    "the long poll did not reach A")
        assert not poll.done()
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 3000, 300, parts)
        r = await poll
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a" and r.json(), r.text
        ledger.add(r.json())
        assert (await commit(c, base, topic_name, ledger)).status_code == 200

        # an ndjson stream through C
        await consume([b], base, topic_name, ledger, produced, "a")
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 3300, 1500, parts)
        streamed = 0
        async with c.stream("GET", f"{base}/records", params={"max_records": 100}, headers=NDJSON) as s:
            assert s.status_code == 200 and s.headers[SERVED_BY] == "a"
            assert s.headers["content-type"].startswith("application/x-ndjson")
            async for line in s.aiter_lines():
                if line:
                    ledger.add([orjson.loads(line)])
                    streamed += 1
                if streamed >= 500:
                    break  # the client goes away mid-stream: the upstream stream on A is closed too
        assert (await commit(b, base, topic_name, ledger)).status_code == 200
        await until(lambda: metric(procs["a"], IN_FLIGHT, '{side="in"}'), lambda v: v == 0,
                    "the forwarded stream was not closed on A")

        # records received but not committed when A dies: the only ones that may come twice
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 4800, 200, parts)
        r = await c.get(f"{base}/records", params={"timeout": 5000, "max_records": 50}, headers=BIN)
        assert r.status_code == 200 and r.json(), r.text
        ledger.add(r.json())
        uncommitted = {(int(x["partition"]), int(x["offset"])) for x in r.json()}

        # kill -9 of A: the instance is gone; the client is told so, clearly, through B and C
        procs["a"].kill()
        for http in (b, c):
            r = await http.get(f"{base}/records", headers=BIN)
            assert r.status_code == 404, r.text
            assert r.json()["error_code"] == 40403
            assert "create the consumer instance again" in r.json()["message"]
        # it recreates the instance, same name, through B and consumes the rest through B and C
        r = await create(b, group, name)
        assert r.status_code == 200, r.text
        ledger.new_instance()
        holder = r.headers.get(SERVED_BY, "b")
        assert holder == owner(["b", "c"], routing_key(group, name))
        assert r.json()["base_uri"] == f"{procs['b'].url}{base}"  # the replica the client talked to
        r = await b.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        assert r.status_code == 204, r.text
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 5000, 200, parts)
        await consume([b, c], base, topic_name, ledger, produced, holder)
        assert (await commit(c, base, topic_name, ledger)).status_code == 200

    assert ledger.values() == produced  # nothing lost
    assert ledger.committed_again == []  # a record a 2xx commit covered was never delivered again
    delivered = collections.Counter((p, o) for p, o, _ in ledger.received)
    duplicates = {po for po, n in delivered.items() if n > 1}
    assert duplicates == uncommitted  # duplicates only from the uncommitted window, and that window comes back
    print(f"produced {len(produced)}, delivered {delivered.total()}, duplicates {len(duplicates)} "
          f"(the {len(uncommitted)} received but uncommitted when A died)")
    assert await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="forwarded"}') > 0


async def test_redirect_mode(broker: AnyBroker, tmp_path: Path, cleanup: list[GatewayProcess]) -> None:
    procs = replica_set(broker, tmp_path, ["a", "b"], {"GATEWAY_ROUTING": "redirect"})
    cleanup += procs.values()
    start(*procs.values())
    await converged(list(procs.values()), {"a", "b"})
    group = "g-redirect"
    name = name_owned_by("a", ["a", "b"], group)
    async with clients(procs["a"], procs["b"]) as (a, b):
        r = await create(b, group, name)
        assert r.status_code == 307 and r.headers["location"] == f"{procs['a'].url}/consumers/{group}"
        r = await create(a, group, name)  # the client follows the redirect
        assert r.status_code == 200, r.text
        base = f"/consumers/{group}/instances/{name}"
        r = await b.get(f"{base}/subscription")
        assert r.status_code == 307 and r.headers["location"] == f"{procs['a'].url}{base}/subscription"
        async with httpx.AsyncClient(timeout=30, follow_redirects=True) as follower:
            r = await follower.get(f"{procs['b'].url}{base}/subscription", params={"x": "1"})
            assert r.status_code == 200 and r.json() == {"topics": []}
            assert str(r.url) == f"{procs['a'].url}{base}/subscription?x=1"
        # a name b owns is created on b directly; an unknown instance is a plain 404
        mine = name_owned_by("b", ["a", "b"], group)
        assert (await create(b, group, mine)).status_code == 200
        r = await b.get(f"/consumers/{group}/instances/nobody/subscription")
        assert r.status_code == 404 and r.json()["error_code"] == 40403
        assert await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="redirected"}') == 3


async def test_peer_token_and_loop_prevention(broker: AnyBroker, tmp_path: Path,
                                              cleanup: list[GatewayProcess]) -> None:
    procs = replica_set(broker, tmp_path, ["a", "b", "c", "x"], {"GATEWAY_PEER_TOKEN": TOKEN},
                        per_replica={"x": {"GATEWAY_PEER_TOKEN": "another-token"}})
    cleanup += procs.values()
    start(*procs.values())
    abc = [procs["a"], procs["b"], procs["c"]]
    await converged(abc, {"a", "b", "c"}, TOKEN)  # probes carry the token; x, with another token, is refused
    deadline = time.monotonic() + 30
    while (view := await peers_view(procs["x"], "another-token"))["refreshes"] < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert view["placement"] == ["x"]  # and x refuses them
    group = "g-token"
    name = name_owned_by("a", ["a", "b", "c"], group)
    async with clients(*abc) as (a, b, c):
        r = await create(c, group, name)  # forwarded to the owner, with the token
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a", r.text
        base = f"/consumers/{group}/instances/{name}"
        assert (await b.get(f"{base}/subscription")).headers[SERVED_BY] == "a"
        for path in ("/internal/peer", "/internal/peers", "/internal/lookup?group=g&name=n"):
            for headers in ({}, {"x-kcg-peer-token": "wrong"}):
                r = await b.get(path, headers=headers)
                assert r.status_code == 403 and r.json()["error_code"] == 40302, (path, r.text)
        r = await b.get(f"/internal/lookup?group={group}&name={name}", headers={"x-kcg-peer-token": TOKEN})
        assert r.json() == {"replica_id": "b", "held": False}
        r = await a.get(f"/internal/lookup?group={group}&name={name}", headers={"x-kcg-peer-token": TOKEN})
        assert r.json() == {"replica_id": "a", "held": True}
        # a request claiming to be forwarded: refused without the token...
        r = await b.get(f"{base}/subscription", headers={"x-kcg-forwarded-by": "c"})
        assert r.status_code == 403 and r.json()["error_code"] == 40302
        # ...and with it, served by b itself and never forwarded again (b does not hold it)
        before = await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="forwarded"}')
        r = await b.get(f"{base}/subscription", headers={"x-kcg-forwarded-by": "c", "x-kcg-peer-token": TOKEN})
        assert r.status_code == 404 and r.headers["x-kcg-absent"] == "1" and SERVED_BY not in r.headers
        assert await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="forwarded"}') == before
        assert await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="refused"}') >= 7


async def test_scale_up_keeps_every_instance_reachable(broker: AnyBroker, tmp_path: Path,
                                                       cleanup: list[GatewayProcess]) -> None:
    procs = replica_set(broker, tmp_path, ["a", "b", "c", "d"])  # d is listed but starts later
    cleanup += procs.values()
    start(procs["a"], procs["b"], procs["c"])
    await converged([procs["a"], procs["b"], procs["c"]], {"a", "b", "c"})
    group = "g-scale"
    three, four = ["a", "b", "c"], ["a", "b", "c", "d"]
    names = [name_owned_by(r, three, group, prefix=f"{r}{i}-", also=four, also_owner=later)
             for i, (r, later) in enumerate([("a", "d"), ("b", "d"), ("c", "d"), ("a", "a"), ("b", "b"),
                                             ("c", "c")])]
    holders = {n: owner(three, routing_key(group, n)) for n in names}
    async with clients(procs["a"], procs["b"], procs["c"]) as via:
        for i, n in enumerate(names):
            r = await create(via[i % 3], group, n)
            assert r.status_code == 200, r.text
            assert r.headers.get(SERVED_BY, "abc"[i % 3]) == holders[n]
    start(procs["d"])
    await converged(list(procs.values()), set(four))
    async with clients(*procs.values()) as via:
        for n in names:
            for rid, http in zip("abcd", via, strict=True):
                r = await http.get(f"/consumers/{group}/instances/{n}/subscription")
                assert r.status_code == 200, (n, rid, r.text)
                assert r.headers.get(SERVED_BY, rid) == holders[n], (n, rid)
        # new instances go to the new owner
        fresh = name_owned_by("d", four, group, prefix="fresh")
        r = await create(via[0], group, fresh)
        assert r.status_code == 200 and r.headers[SERVED_BY] == "d"
        # creating a name that exists on its old holder reaches that holder (409), not a duplicate on d
        moved = names[0]
        r = await create(via[1], group, moved)
        assert r.status_code == 409 and r.json()["error_code"] == 40902 and r.headers[SERVED_BY] == "a"
        # an instance created without a name stays on the replica it was created on
        for rid, http in zip("abcd", via, strict=True):
            r = await http.post(f"/consumers/{group}", headers=V2, json={"format": "binary"})
            assert r.status_code == 200 and SERVED_BY not in r.headers
            generated = r.json()["instance_id"]
            assert owner(four, routing_key(group, generated)) == rid
    assert await metric(procs["b"], "kcg_forwarded_requests_total", '{outcome="absent"}') > 0
