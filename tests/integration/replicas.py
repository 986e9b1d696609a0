"""What the replica tests share: replica sets of gateway processes, the record ledger of a client, the round-robin
poll-and-commit loop across replicas, and waiting for a peer view or a metric of another process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer as CKProducer

from service.ring import owner, routing_key
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}
NDJSON = {"Accept": "application/x-ndjson"}
SERVED_BY = "x-kcg-served-by"
TOKEN = "s3cret-peer-token"
IN_FLIGHT = "kcg_forwarded_requests_in_flight"


def produce(bootstrap: str, topic: str, start: int, n: int, partitions: int) -> set[bytes]:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = {b"%d" % i for i in range(start, start + n)}
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return values


class Ledger:
    """Every record a client received and what 2xx commits covered."""

    def __init__(self) -> None:
        self.received: list[tuple[int, int, bytes]] = []
        self.committed: dict[int, int] = {}  # partition -> next offset covered by a 2xx commit
        self.committed_again: list[tuple[int, int]] = []
        self.session = 0  # index in received where the current instance's deliveries start

    def new_instance(self) -> None:
        """The instance was recreated: commits cover only what the new one delivered."""
        self.session = len(self.received)

    def add(self, recs: list[dict[str, Any]]) -> None:
        for r in recs:
            p, o = int(r["partition"]), int(r["offset"])
            if o < self.committed.get(p, 0):
                self.committed_again.append((p, o))
            self.received.append((p, o, base64.b64decode(r["value"])))

    def values(self) -> set[bytes]:
        return {v for _, _, v in self.received}

    def last(self) -> dict[int, int]:
        """What a commit covers: the last offset per partition the current instance delivered."""
        out: dict[int, int] = {}
        for p, o, _ in self.received[self.session:]:
            out[p] = max(out.get(p, -1), o)
        return out


async def commit(http: httpx.AsyncClient, base: str, topic: str, ledger: Ledger) -> httpx.Response:
    last = ledger.last()
    r = await http.post(f"{base}/offsets", headers=V2, json={"offsets": [
        {"topic": topic, "partition": p, "offset": o} for p, o in last.items()]})
    if r.status_code == 200:
        for p, o in last.items():
            ledger.committed[p] = max(ledger.committed.get(p, 0), o + 1)
    return r


def replica_set(broker: AnyBroker, tmp_path: Path, ids: list[str], env: dict[str, str] | None = None,
                per_replica: dict[str, dict[str, str]] | None = None) -> dict[str, GatewayProcess]:
    """Gateway processes (not started) named by ``ids``, each knowing all of them as peers."""
    procs = {rid: GatewayProcess(broker.bootstrap, log_file=tmp_path / f"gw-{rid}.log") for rid in ids}
    peers = ",".join(p.url for p in procs.values())
    for rid, p in procs.items():
        p.env.update({"GATEWAY_REPLICA_ID": rid, "GATEWAY_PEERS": peers, "GATEWAY_PEER_REFRESH_S": "0.2",
                      "GATEWAY_LOG_LEVEL": "info", "GATEWAY_PEER_TOKEN": TOKEN, **(env or {}),
                      **(per_replica or {}).get(rid, {})})
    return procs


def start(*procs: GatewayProcess) -> None:
    for p in procs:
        p.launch()
    for p in procs:
        p.wait_healthy()


async def peers_view(g: GatewayProcess, token: str | None = TOKEN) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"{g.url}/internal/peers", headers={"x-kcg-peer-token": token} if token else {})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


async def converged(procs: list[GatewayProcess], ids: set[str], token: str | None = TOKEN,
                    timeout: float = 60) -> None:
    """Until every replica in ``procs`` places new instances on exactly ``ids``."""
    deadline = time.monotonic() + timeout
    for g in procs:
        while set((view := await peers_view(g, token))["placement"]) != ids:
            assert time.monotonic() < deadline, f"{g.url} sees {view}, want {sorted(ids)}"
            await asyncio.sleep(0.05)  # polling a condition: the peer refresh runs every 0.2 s


def name_owned_by(rid: str, ring: list[str], group: str, prefix: str = "c", also: list[str] | None = None,
                  also_owner: str | None = None) -> str:
    """A client-chosen name the ring places on ``rid`` (and, if given, ring ``also`` on ``also_owner``)."""
    for i in range(100_000):
        name = f"{prefix}{i}"
        if owner(ring, routing_key(group, name)) != rid:
            continue
        if also is not None and owner(also, routing_key(group, name)) != also_owner:
            continue
        return name
    raise AssertionError("no such name")


@contextlib.asynccontextmanager
async def clients(*procs: GatewayProcess) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(httpx.AsyncClient(base_url=g.url, timeout=60)) for g in procs]


async def create(http: httpx.AsyncClient, group: str, name: str) -> httpx.Response:
    return await http.post(f"/consumers/{group}", headers=V2, json={
        "name": name, "format": "binary", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})


async def consume(via: list[httpx.AsyncClient], base: str, topic: str, ledger: Ledger, want: set[bytes],
                  holder: str | None, timeout: float = 90) -> None:
    """Poll through one replica and commit through the next, round robin, until ``want`` was received.
    ``holder``: the replica every answer must come from (checked on forwarded answers)."""
    deadline = time.monotonic() + timeout
    i = 0
    while not want <= ledger.values():
        missing = want - ledger.values()
        assert time.monotonic() < deadline, f"missing {len(missing)} records: {sorted(missing)[:50]}"
        poller, committer = via[i % len(via)], via[(i + 1) % len(via)]
        i += 1
        r = await poller.get(f"{base}/records", params={"timeout": 1000, "max_records": 1000}, headers=BIN)
        assert r.status_code == 200, r.text
        if SERVED_BY in r.headers:
            assert r.headers[SERVED_BY] == holder
        ledger.add(r.json())
        if r.json():
            c = await commit(committer, base, topic, ledger)
            assert c.status_code in (200, 409), c.text  # 409/40903 while the group rebalances


async def metric(g: GatewayProcess, name: str, labels: str = "") -> float:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{g.url}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until(probe: Callable[[], Awaitable[float]], ok: Callable[[float], bool], what: str,
                timeout: float = 30) -> None:
    """Poll a condition (a metric of another process: there is no event to await across processes)."""
    deadline = time.monotonic() + timeout
    while not ok(await probe()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)
