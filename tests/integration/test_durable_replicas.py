"""Durable instances across replicas: kill -9 of the replica holding an instance, clients
keep sending every request round robin to the live replicas, and nothing else: the instance is re-created on
its new ring owner from its descriptor (same static member, same subscription, positions from the committed
offsets). No client-visible 404; every produced record consumed; duplicates only from the uncommitted window;
the restarted replica does not take the instance back (instances stay where they are)."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from service.client.client import KafkaClient
from service.ring import owner, routing_key
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.replicas import (
    BIN,
    SERVED_BY,
    V2,
    Ledger,
    clients,
    commit,
    consume,
    converged,
    create,
    name_owned_by,
    produce,
    replica_set,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# static members on Tansu need a session timeout above its ~3 s hold of their JoinGroup / SyncGroup: with
# GatewayProcess's 2 s one they are expired while held and the group rebalances for ever (docs/groups.md)
DURABLE = {"GATEWAY_DURABLE_INSTANCES": "true", "GATEWAY_STATIC_MEMBERSHIP": "true",
           "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "10000"}


async def test_kill_9_of_the_holder_is_invisible_to_clients(broker: AnyBroker, bclient: KafkaClient,
                                                            topic_name: str, tmp_path: Path,
                                                            cleanup: list[GatewayProcess]) -> None:
    parts = 3
    await bclient.create_topics({topic_name: parts})
    produced = await asyncio.to_thread(produce, broker.bootstrap, topic_name, 0, 2000, parts)
    procs = replica_set(broker, tmp_path, ["a", "b", "c"], env=DURABLE)
    cleanup += procs.values()
    start(*procs.values())
    await converged(list(procs.values()), {"a", "b", "c"})
    group = f"g-{topic_name}"
    name = name_owned_by("a", ["a", "b", "c"], group)
    new_owner = owner(["b", "c"], routing_key(group, name))
    ledger = Ledger()
    statuses: collections.Counter[int] = collections.Counter()
    async with clients(procs["b"], procs["c"]) as (b, c):
        r = await create(b, group, name)
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a", r.text
        base = f"/consumers/{group}/instances/{name}"
        r = await c.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        assert r.status_code == 204 and r.headers[SERVED_BY] == "a", r.text
        await consume([b, c], base, topic_name, ledger, produced, "a")

        # received but not committed when A dies: the only records that may come twice
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 2000, 200, parts)
        r = await c.get(f"{base}/records", params={"timeout": 5000, "max_records": 50}, headers=BIN)
        assert r.status_code == 200 and r.json(), r.text
        ledger.add(r.json())
        uncommitted = {(int(x["partition"]), int(x["offset"])) for x in r.json()}

        procs["a"].kill()
        produced |= await asyncio.to_thread(produce, broker.bootstrap, topic_name, 2200, 300, parts)
        # the same client code goes on: polls and commits round robin through B and C, no recreation
        ledger.new_instance()
        deadline = asyncio.get_running_loop().time() + 120
        i = 0
        while not produced <= ledger.values():
            assert asyncio.get_running_loop().time() < deadline, f"missing {len(produced - ledger.values())}"
            poller, committer = (b, c) if i % 2 == 0 else (c, b)
            i += 1
            r = await poller.get(f"{base}/records", params={"timeout": 1000, "max_records": 500}, headers=BIN)
            statuses[r.status_code] += 1
            if r.status_code != 200:
                continue
            ledger.add(r.json())
            if r.json():
                cr = await commit(committer, base, topic_name, ledger)
                statuses[cr.status_code] += 1
        # the holder now is the new ring owner among B and C
        r = await b.get(f"{base}/subscription")
        assert r.status_code == 200 and r.json() == {"topics": [topic_name]}
        assert r.headers.get(SERVED_BY, "b") == new_owner

        # A comes back: it stays where it is until A has been up GATEWAY_INSTANCE_MOVE_AFTER_S (10 s; then it
        # moves back to its ring owner between requests: tests/integration/test_durable_scale.py)
        procs["a"].start()
        await converged([procs["a"], procs["b"], procs["c"]], {"a", "b", "c"})
        r = await c.get(f"{base}/subscription")
        assert r.status_code == 200 and r.headers.get(SERVED_BY, "c") == new_owner, r.headers

    assert statuses[404] == 0 and statuses[410] == 0, statuses
    assert set(statuses) <= {200, 409}, statuses  # 409: a commit while the group settles
    assert ledger.values() == produced  # nothing lost
    assert ledger.committed_again == []
    delivered = collections.Counter((p, o) for p, o, _ in ledger.received)
    duplicates = {po for po, n in delivered.items() if n > 1}
    assert duplicates <= uncommitted, duplicates - uncommitted
    log = (tmp_path / f"gw-{new_owner}.log").read_text()
    assert f"re-created consumer instance {name}" in log

