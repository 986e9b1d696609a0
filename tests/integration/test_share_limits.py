"""Share consumer instances within the gateway's limits, against Apache Kafka 4.4 (real gateway processes):

- the memory budget: what a share instance acquires is charged to ``GATEWAY_MEMORY_BUDGET_BYTES`` (each ShareFetch's
  ``max_bytes`` a grant, then the records until the answer was sent). With the budget taken by a request body, a
  share poll sends no ShareFetch (nothing is acquired that could not be held) and waits, as a consumer instance's
  poll does: an empty answer at its timeout, the records as soon as memory is released. Every charge is given back
  after polls, streams and deletes;
- ``max_instances`` across two replicas: a tenant's share instances are counted by its owner of record, apart from
  its consumer instances, so the cap holds whichever replica creates or holds them (429/42901, then a slot freed by
  a delete).

Every record produced is counted: delivered once, accepted once."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from service.embedded.kafka import EmbeddedKafka
from service.instances.budget import MIN_GRANT
from service.ring import SHARE_PREFIX, owner, routing_key
from tests.integration.gateway_proc import GatewayProcess, tenants_replicas
from tests.integration.test_share_http import EARLIEST, JSON, ack, new_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MiB = 1024 * 1024
BUDGET = 2 * MiB
#: a produce body declared this long is charged twice its size: the budget then has less room than a fetch grant
BODY = MiB - 16 * 1024


def budget_metrics(url: str) -> dict[str, float]:
    """``kcg_memory_budget_used_bytes`` by kind, and ``refusals:<kind>`` for the refusals counter."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        for name, prefix in (("kcg_memory_budget_used_bytes{kind=", ""),
                             ("kcg_memory_budget_refusals_total{kind=", "refusals:")):
            if line.startswith(name):
                kind = line[len(name) + 1:line.index('"', len(name) + 1)]
                out[prefix + kind] = float(line.rsplit(" ", 1)[1])
    return out


async def settled(url: str) -> dict[str, float]:
    """The budget once nothing is charged any more (a release runs just after the answer was sent)."""
    deadline = time.monotonic() + 10
    while True:
        got = await asyncio.to_thread(budget_metrics, url)
        if all(v == 0 for k, v in got.items() if not k.startswith("refusals:")):
            return got
        assert time.monotonic() < deadline, f"the memory budget was not given back: {got}"
        await asyncio.sleep(0.05)  # polling another process's gauge


@pytest.fixture(scope="module")
def small(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("share-budget") / "gw.log"
    with GatewayProcess(kafka.bootstrap, env={"GATEWAY_MEMORY_BUDGET_BYTES": str(BUDGET),
                                              "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"}, log_file=log) as g:
        yield g
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, f"the gateway logged an unexpected exception:\n{text[-4000:]}"


def open_slow_produce(g: GatewayProcess, topic: str) -> tuple[socket.socket, bytes]:
    """A produce request whose body (``BODY`` bytes, declared) is only begun: the gateway charges it to the budget
    until it is answered. Returns the socket and the rest of the body."""
    value = base64.b64encode(b"x" * ((BODY - 40) * 3 // 4)).decode()
    body = orjson.dumps({"records": [{"value": value}]})
    body += b" " * (BODY - len(body))
    assert len(body) == BODY
    s = socket.create_connection(("127.0.0.1", g.port), timeout=30)
    head = (f"POST /topics/{topic} HTTP/1.1\r\nHost: 127.0.0.1:{g.port}\r\n"
            f"Content-Type: application/vnd.kafka.binary.v2+json\r\nContent-Length: {BODY}\r\n\r\n")
    s.sendall(head.encode() + body[:1000])
    return s, body[1000:]


def finish_slow_produce(s: socket.socket, rest: bytes) -> int:
    try:
        s.sendall(rest)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(65536)
            assert chunk, "the gateway closed the produce connection"
            answer += chunk
        return int(answer.split(b" ", 2)[1])
    finally:
        s.close()


async def test_share_records_are_charged_to_the_memory_budget(kafka: EmbeddedKafka, small: GatewayProcess) -> None:
    assert BUDGET - 2 * BODY < MIN_GRANT  # while the body is held, no fetch grant fits
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    other = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    n = 30
    await asyncio.to_thread(produce, kafka.bootstrap, topic, n, 1)
    group = f"sgb-{uuid.uuid4().hex[:8]}"
    accepted: list[int] = []
    async with httpx.AsyncClient(base_url=small.url, timeout=60) as http:
        r = await http.post(f"/share-groups/{group}", json={"name": "w", "configs": EARLIEST}, headers=JSON)
        assert r.status_code == 200, r.text
        path = f"/share-groups/{group}/instances/w"
        r = await http.post(f"{path}/subscription", json={"topics": [topic]}, headers=JSON)
        assert r.status_code == 204, r.text

        async def take(recs: list[dict[str, Any]]) -> None:
            answers = await ack(http, path, [{"topic": topic, "partition": 0, "offset": x["offset"]} for x in recs])
            assert all(a["applied"] for a in answers), answers
            accepted.extend(x["offset"] for x in recs)

        # 0. with room: records at once (the instance is assigned its partition)
        deadline = time.monotonic() + 20
        while not accepted:
            assert time.monotonic() < deadline, "no records"
            r = await http.get(f"{path}/records", params={"timeout": 1000, "max_records": 5})
            assert r.status_code == 200, r.text
            await take(r.json())
        await settled(small.url)
        # 1. the budget taken by a request body: no ShareFetch goes out (the refusals counter says why), the poll
        # answers [] at its timeout, as a consumer poll does, though the topic has records
        sock, rest = await asyncio.to_thread(open_slow_produce, small, other)
        deadline = time.monotonic() + 10
        while (await asyncio.to_thread(budget_metrics, small.url)).get("body", 0) < 2 * BODY:
            assert time.monotonic() < deadline, "the produce body was never charged"
            await asyncio.sleep(0.05)  # polling another process's gauge
        before = (await asyncio.to_thread(budget_metrics, small.url))["refusals:fetch"]
        r = await http.get(f"{path}/records", params={"timeout": 1500, "max_records": 10})
        assert r.status_code == 200 and r.json() == [], r.text
        got = await asyncio.to_thread(budget_metrics, small.url)
        assert got["refusals:fetch"] > before and got["share"] == 0, got
        # 2. a long poll waiting for memory is answered as soon as the body is done with
        waiting = asyncio.ensure_future(http.get(f"{path}/records", params={"timeout": 20000, "max_records": 10}))
        deadline = time.monotonic() + 10
        while (await asyncio.to_thread(budget_metrics, small.url))["refusals:fetch"] <= got["refusals:fetch"]:
            assert time.monotonic() < deadline, "the long poll never asked for memory"
            await asyncio.sleep(0.05)  # polling another process's counter: the poll is waiting for memory now
        assert not waiting.done()
        assert await asyncio.to_thread(finish_slow_produce, sock, rest) == 200
        r = await waiting
        assert r.status_code == 200, r.text
        first = r.json()
        assert first and all(x["delivery_count"] == 1 for x in first), first
        await take(first)
        await settled(small.url)
        # 3. a stream: each chunk is charged until written, nothing stays charged once it ends
        async with http.stream("GET", f"{path}/records", params={"max_records": 7},
                               headers={"Accept": "application/x-ndjson"}) as s:
            assert s.status_code == 200
            batch: list[dict[str, Any]] = []
            async for line in s.aiter_lines():
                if line:
                    batch.append(json.loads(line))
                    if len(accepted) + len(batch) == n:
                        break
            await take(batch)
        await settled(small.url)
        # 4. with room again, polls are answered at once; the delete gives everything back
        r = await http.get(f"{path}/records", params={"timeout": 300})
        assert r.status_code == 200 and r.json() == [], r.text
        assert (await http.delete(path)).status_code == 204
    assert sorted(accepted) == list(range(n))  # each record delivered and accepted once
    got = await settled(small.url)
    assert got["share"] == 0 and got["fetch"] == 0, got


# -- max_instances across replicas ---------------------------------------------------------------------------------
TOKEN = "share-limits-peer-token-0123456789"
KEY_CAPPED, KEY_OTHER = "share-limits-key-capped-0123456789", "share-limits-key-other-0123456789"


def _sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: capped
    api_keys: ["{_sha(KEY_CAPPED)}"]
    quotas: {{max_instances: 2}}
  - id: other
    api_keys: ["{_sha(KEY_OTHER)}"]
"""


def names_on(group: str, replica: str, n: int) -> list[str]:
    """Share instance names whose ring owner (where a create places them) is ``replica``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"w-{i}"
        if owner(["a", "b"], routing_key(SHARE_PREFIX + group, name)) == replica:
            out.append(name)
        i += 1
    return out


async def test_max_instances_holds_for_share_instances_across_replicas(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    a, b = await asyncio.to_thread(tenants_replicas, kafka.bootstrap, TENANTS, tmp_path, TOKEN)
    group = f"sgq-{uuid.uuid4().hex[:8]}"
    on_a, on_b = names_on(group, "a", 2), names_on(group, "b", 2)

    def headers(key: str) -> dict[str, str]:
        return {**JSON, "X-API-Key": key}

    async def create(http: httpx.AsyncClient, name: str, key: str = KEY_CAPPED) -> httpx.Response:
        return await http.post(f"/share-groups/{group}", json={"name": name}, headers=headers(key))

    def refused(r: httpx.Response) -> None:
        assert r.status_code == 429, r.text
        assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1, r.text
        assert "share consumer instances" in r.json()["message"] and "limit 2" in r.json()["message"], r.text

    try:
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as ha, \
                httpx.AsyncClient(base_url=b.url, timeout=30) as hb:
            # two share instances, one held by each replica, both created through a: the tenant's cap
            for name in (on_a[0], on_b[0]):
                r = await create(ha, name)
                assert r.status_code == 200, r.text
            # a third is refused wherever it would live and whichever replica receives it (each replica alone
            # holds one: only the count across the set refuses it)
            for http, name in ((ha, on_a[1]), (hb, on_a[1]), (ha, on_b[1]), (hb, on_b[1])):
                refused(await create(http, name))
            # consumer instances are counted apart (as on one replica): the tenant still gets its two
            for http in (ha, hb):
                r = await http.post(f"/consumers/{group}", json={}, headers=headers(KEY_CAPPED))
                assert r.status_code == 200, r.text
            # another tenant is not affected
            r = await create(hb, on_a[1], KEY_OTHER)
            assert r.status_code == 200, r.text
            # a delete (of the instance held by b, through a) frees exactly one slot
            r = await ha.delete(f"/share-groups/{group}/instances/{on_b[0]}", headers=headers(KEY_CAPPED))
            assert r.status_code == 204, r.text
            r = await create(hb, on_b[1])
            assert r.status_code == 200, r.text
            refused(await create(ha, on_a[1]))
    finally:
        for p in (a, b):
            p.stop()
