"""Scale-out with durable instances: replicas a and b hold four instances of one group, clients
poll and commit round robin over the live replicas while records are produced; replica c starts. The two
instances whose ring owner becomes c are handed off by their holders (between requests) and re-created on c at
their next request; the two others never move. No client-visible 404, every record consumed, duplicates only
from the uncommitted window (no record a 2xx commit covered is delivered again)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client.client import KafkaClient
from service.ring import owner, routing_key
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.replicas import (
    BIN,
    SERVED_BY,
    TOKEN,
    V2,
    Ledger,
    converged,
    create,
    metric,
    name_owned_by,
    produce,
    replica_set,
    start,
)
from tests.integration.test_durable_replicas import DURABLE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AB, ABC = ["a", "b"], ["a", "b", "c"]
MOVE_AFTER_S = 1.0  # GATEWAY_INSTANCE_MOVE_AFTER_S: five probe intervals of 0.2 s
MOVED = '{reason="moved"}'


async def held_by(procs: dict[str, GatewayProcess], group: str, name: str) -> set[str]:
    """The replicas whose /internal/lookup says they hold (group, name)."""
    out = set()
    async with httpx.AsyncClient(timeout=10, headers={"x-kcg-peer-token": TOKEN}) as c:
        for rid, g in procs.items():
            r = await c.get(f"{g.url}/internal/lookup", params={"group": group, "name": name})
            assert r.status_code == 200, r.text
            if r.json()["held"]:
                out.add(rid)
    return out


async def test_scale_out_moves_only_the_instances_the_new_replica_owns(
        broker: AnyBroker, bclient: KafkaClient, topic_name: str, tmp_path: Path,
        cleanup: list[GatewayProcess]) -> None:
    parts = 4
    await bclient.create_topics({topic_name: parts})
    produced = await asyncio.to_thread(produce, broker.bootstrap, topic_name, 0, 1000, parts)
    procs = replica_set(broker, tmp_path, ABC, env={**DURABLE, "GATEWAY_INSTANCE_MOVE_AFTER_S": str(MOVE_AFTER_S)})
    cleanup += procs.values()
    start(procs["a"], procs["b"])  # c is listed as a peer but starts later
    await converged([procs["a"], procs["b"]], set(AB))
    group = f"g-{topic_name}"
    # two instances c will own (one from a, one from b) and two whose owner stays (one on a, one on b)
    movers = [name_owned_by(r, AB, group, prefix=f"m{r}-", also=ABC, also_owner="c") for r in AB]
    stayers = [name_owned_by(r, AB, group, prefix=f"s{r}-", also=ABC, also_owner=r) for r in AB]
    # stayers subscribe first: the group's first member, its leader, is one that stays (when a leader leaves
    # and comes back under the same static id, Tansu keeps naming the departed member as leader and the group
    # stalls until the coordinator's recovery: docs/groups.md)
    names = stayers + movers
    first_holder = {n: owner(AB, routing_key(group, n)) for n in names}
    assert all(owner(ABC, routing_key(group, n)) == "c" for n in movers)
    assert all(owner(ABC, routing_key(group, n)) == first_holder[n] for n in stayers)

    ledger = Ledger()
    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    served: dict[str, list[str]] = {n: [] for n in names}
    live = ["a", "b"]
    http: dict[str, httpx.AsyncClient] = {}
    done = asyncio.Event()  # the clients stop
    fed = asyncio.Event()  # the producer stops

    async def client(i: int, name: str) -> None:
        """Poll through one live replica and commit that batch through the next one, round robin."""
        base = f"/consumers/{group}/instances/{name}"
        k = i
        while not done.is_set():
            via, by = live[k % len(live)], live[(k + 1) % len(live)]
            poller, committer = http[via], http[by]
            k += 1
            r = await poller.get(f"{base}/records", params={"timeout": 500, "max_records": 200}, headers=BIN)
            statuses[("poll", r.status_code)] += 1
            if r.status_code != 200:
                continue
            served[name].append(r.headers.get(SERVED_BY, via))
            recs: list[dict[str, Any]] = r.json()
            ledger.add(recs)
            if not recs:
                continue
            last: dict[int, int] = {}
            for x in recs:
                last[int(x["partition"])] = max(last.get(int(x["partition"]), -1), int(x["offset"]))
            cr = await committer.post(f"{base}/offsets", headers=V2, json={"offsets": [
                {"topic": topic_name, "partition": p, "offset": o} for p, o in last.items()]})
            statuses[("commit", cr.status_code)] += 1
            if cr.status_code == 200:
                for p, o in last.items():
                    ledger.committed[p] = max(ledger.committed.get(p, 0), o + 1)

    async def producer() -> None:
        n = 1000
        while not fed.is_set():
            produced.update(await asyncio.to_thread(produce, broker.bootstrap, topic_name, n, 100, parts))
            n += 100
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fed.wait(), 0.3)

    async with contextlib.AsyncExitStack() as stack:
        for rid, g in procs.items():
            http[rid] = await stack.enter_async_context(httpx.AsyncClient(base_url=g.url, timeout=60))
        for i, n in enumerate(names):
            r = await create(http[live[i % 2]], group, n)
            assert r.status_code == 200 and r.headers.get(SERVED_BY, live[i % 2]) == first_holder[n], r.text
            r = await http[live[(i + 1) % 2]].post(f"/consumers/{group}/instances/{n}/subscription", headers=V2,
                                                   json={"topics": [topic_name]})
            assert r.status_code == 204, r.text
        t0 = time.monotonic()
        tasks = [asyncio.create_task(client(i, n)) for i, n in enumerate(names)]
        feeding = asyncio.create_task(producer())
        try:
            # the group is consuming through a and b
            deadline = time.monotonic() + 60
            while len(ledger.values()) < 1000:
                assert time.monotonic() < deadline, f"only {len(ledger.values())} records consumed before scaling"
                await asyncio.sleep(0.1)  # polling the clients' progress (no event to await)
            consuming_after = time.monotonic() - t0
            ab = {r: procs[r] for r in AB}
            assert [await held_by(ab, group, n) for n in names] == [{first_holder[n]} for n in names]

            # scale out: c starts; the clients send to it too once every replica sees it
            await asyncio.to_thread(start, procs["c"])
            await converged(list(procs.values()), set(ABC))
            live.append("c")
            scaled_at = time.monotonic()
            started_after = scaled_at - t0
            deadline = scaled_at + 45
            while not all([await held_by(procs, group, n) == {"c"} for n in movers]):
                assert time.monotonic() < deadline, {n: await held_by(procs, group, n) for n in names}
                await asyncio.sleep(0.2)  # polling other processes' state
            moved_after = time.monotonic() - scaled_at
            # the group goes on with the moved instances on c: a few more waves, then every record consumed
            wave_end = len(produced)
            deadline = time.monotonic() + 75  # one Tansu group stall and its recovery fit (docs/groups.md)
            while len(produced) < wave_end + 300:
                assert time.monotonic() < deadline and not feeding.done()
                await asyncio.sleep(0.1)
            fed.set()
            await feeding
            while not produced <= ledger.values():
                missing = produced - ledger.values()
                assert time.monotonic() < deadline, f"missing {len(missing)} records: {sorted(missing)[:20]}"
                await asyncio.sleep(0.1)  # polling the clients' progress
        finally:
            fed.set()
            done.set()
            await asyncio.gather(feeding, *tasks)

        holders = {n: await held_by(procs, group, n) for n in names}
        moved = {r: await metric(procs[r], "kcg_instances_handed_off_total", MOVED) for r in ABC}
        recreated = {r: await metric(procs[r], "kcg_instances_recreated_total") for r in ABC}

    print(f"consuming after {consuming_after:.1f} s, c in the ring after {started_after:.1f} s, "
          f"finished after {time.monotonic() - t0:.1f} s; "
          f"moved within {moved_after:.1f} s of c joining; holders {holders}; statuses {dict(statuses)}; "
          f"produced {len(produced)}, delivered {len(ledger.received)}")
    assert all(holders[n] == {"c"} for n in movers), holders
    assert all(holders[n] == {first_holder[n]} for n in stayers), holders  # never moved
    assert moved == {"a": 1.0, "b": 1.0, "c": 0.0}, moved  # exactly the instances c owns now, once each
    assert recreated == {"a": 0.0, "b": 0.0, "c": 2.0}, recreated
    for n in stayers:
        assert set(served[n]) == {first_holder[n]}, (n, collections.Counter(served[n]))
    for n in movers:
        assert served[n][-1] == "c" and set(served[n]) == {first_holder[n], "c"}, (n, collections.Counter(served[n]))
    assert statuses[("poll", 404)] == 0 and statuses[("commit", 404)] == 0, statuses
    assert {s for _, s in statuses} <= {200, 409}, statuses  # 409: a commit while the group rebalances
    assert ledger.values() == produced  # nothing lost
    assert ledger.committed_again == []  # duplicates only from the uncommitted window
    for rid in AB:
        log = (tmp_path / f"gw-{rid}.log").read_text()
        mover = movers[AB.index(rid)]
        assert f"consumer instance {mover} (tenant default, group {group}) moves to replica c" in log, rid
        assert all(f"consumer instance {s} (tenant default, group {group}) moves" not in log for s in stayers)
