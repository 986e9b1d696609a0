"""Limits are on by default. Against gateway processes whose tenants set no quotas (and one in
open mode), over real sockets: a tenant creating instances as fast as it can gets exactly the shipped 1,000 and
then 429/42901 with Retry-After; a 60,000-topic subscription is refused with 422/42206 (open mode too); a tenant
opening streams gets the shipped 100 and then 429; a flood of requests past a configured rate gets 429 with
Retry-After. Meanwhile another tenant keeps being served.

The shipped defaults protect without throttling: one heavy client (eight connections, produce
requests of 100 records and reads, as fast as the gateway answers) in open mode meets no 429 at all (the
default request rate is off; the caps on what requests hold stay on)."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from service.tenants.quotas import DEFAULT_QUOTAS
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
KEYS = {t: f"default-limits-key-of-{t}-0123456789" for t in ("mallory", "eve", "trudy", "alice")}


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


def auth(tenant: str) -> dict[str, str]:
    return {"X-API-Key": KEYS[tenant], "Content-Type": V2}


def start(bootstrap: str, log: Path, env: dict[str, str]) -> GatewayProcess:
    p = GatewayProcess(bootstrap, env=env, log_file=log)
    for name in [k for k in p.env if k.startswith("GATEWAY_DEFAULT_") or k == "GATEWAY_TENANTS_FILE"]:
        if name not in env:
            del p.env[name]  # the shipped defaults, whatever the environment running the tests says
    p.start()
    return p


@pytest.fixture(scope="module")
def gateway(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Tenants without a quotas section: every limit is the gateway's shipped default."""
    d = tmp_path_factory.mktemp("default-limits")
    tenants = "version: 1\ntenants:\n" + "".join(
        f"  - id: {t}\n    api_keys: [\"{sha(k)}\"]\n" for t, k in KEYS.items())
    (d / "tenants.yaml").write_text(tenants)
    p = start(tansu.bootstrap, d / "gw.log", {"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml")})
    yield p
    p.stop()


@pytest.fixture
async def http(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, limits=limits) as client:
        yield client


class Bystander:
    """Another tenant using the gateway while an attack runs: every one of its requests must succeed."""

    def __init__(self, http: httpx.AsyncClient, tenant: str = "alice") -> None:
        self.http, self.tenant = http, tenant
        self.stop = asyncio.Event()
        self.statuses: list[int] = []

    async def run(self) -> None:
        group = f"bystander-{uuid.uuid4().hex[:8]}"
        while not self.stop.is_set():
            name = uuid.uuid4().hex[:12]
            r = await self.http.post(f"/consumers/{group}", json={"name": name}, headers=auth(self.tenant))
            self.statuses.append(r.status_code)
            base = f"/consumers/{group}/instances/{name}"
            r = await self.http.get(f"{base}/subscription", headers=auth(self.tenant))
            self.statuses.append(r.status_code)
            r = await self.http.delete(base, headers=auth(self.tenant))
            self.statuses.append(r.status_code)

    def check(self) -> None:
        assert len(self.statuses) >= 3, "the other tenant was not served during the attack"
        assert set(self.statuses) <= {200, 204}, self.statuses


async def test_a_thousand_instances_then_429(http: httpx.AsyncClient) -> None:
    limit = DEFAULT_QUOTAS.max_instances
    assert limit == 1000
    group = "flood-" + uuid.uuid4().hex[:8]
    bystander = Bystander(http)
    task = asyncio.create_task(bystander.run())
    statuses: list[int] = []
    names = iter(range(limit + 50))

    async def worker() -> None:
        for i in names:
            r = await http.post(f"/consumers/{group}", json={"name": f"i{i}"}, headers=auth("mallory"))
            statuses.append(r.status_code)
            if r.status_code == 429:
                body = r.json()
                assert body["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1, r.text
                assert "1000" in body["message"], body

    await asyncio.gather(*(worker() for _ in range(32)))
    bystander.stop.set()
    await task
    assert statuses.count(200) == limit, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) == 50
    bystander.check()
    # still refused, still the other tenant's own instances are fine
    r = await http.post(f"/consumers/{group}", json={"name": "one-more"}, headers=auth("mallory"))
    assert r.status_code == 429 and r.json()["error_code"] == 42901
    r = await http.post(f"/consumers/{group}", json={"name": "alice-1"}, headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert (await http.delete(f"/consumers/{group}/instances/alice-1", headers=auth("alice"))).status_code == 204
    # deleting one gives its slot back
    assert (await http.delete(f"/consumers/{group}/instances/i0", headers=auth("mallory"))).status_code == 204
    r = await http.post(f"/consumers/{group}", json={"name": "i0-again"}, headers=auth("mallory"))
    assert r.status_code == 200, r.text


async def subscribe_huge(http: httpx.AsyncClient, tenant: str | None) -> None:
    headers = auth(tenant) if tenant else {"Content-Type": V2}
    group = "huge-" + uuid.uuid4().hex[:8]
    r = await http.post(f"/consumers/{group}", json={"name": "s"}, headers=headers)
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/s"
    topics = [f"t{i:05d}" for i in range(60_000)]
    r = await http.post(f"{base}/subscription", json={"topics": topics}, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == 42206 and "at most 1000" in r.json()["message"], r.text
    r = await http.post(f"{base}/assignments", headers=headers,
                        json={"partitions": [{"topic": t, "partition": 0} for t in topics[:5000]]})
    assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text
    r = await http.get(f"{base}/subscription", headers=headers)
    assert r.status_code == 200 and r.json() == {"topics": []}, r.text  # nothing was subscribed
    # names Kafka forbids (longer than 249) are refused before the broker too
    r = await http.post(f"{base}/subscription", json={"topics": ["x" * 250]}, headers=headers)
    assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text
    assert (await http.delete(base, headers=headers)).status_code == 204


async def test_sixty_thousand_topics_are_refused(http: httpx.AsyncClient) -> None:
    bystander = Bystander(http)
    task = asyncio.create_task(bystander.run())
    await subscribe_huge(http, "eve")
    bystander.stop.set()
    await task
    bystander.check()


async def test_streams_past_the_default_are_refused(http: httpx.AsyncClient, kclient: KafkaClient) -> None:
    limit = DEFAULT_QUOTAS.max_streams
    assert limit == 100
    group = "streams-" + uuid.uuid4().hex[:8]
    topic = "streams-" + uuid.uuid4().hex[:8]
    await kclient.create_topics({topic: 1})
    assignment = {"partitions": [{"topic": topic, "partition": 0}]}
    stream_headers = {**auth("trudy"), "Accept": "application/x-ndjson"}
    bases = []
    for i in range(10):  # ten instances, ten streams each
        r = await http.post(f"/consumers/{group}", json={"name": f"s{i}", "format": "binary"}, headers=auth("trudy"))
        assert r.status_code == 200, r.text
        bases.append(f"/consumers/{group}/instances/s{i}")
        r = await http.post(f"{bases[-1]}/assignments", json=assignment, headers=auth("trudy"))
        assert r.status_code == 204, r.text
    async with AsyncExitStack() as stack:
        opened = await asyncio.gather(*(
            stack.enter_async_context(http.stream("GET", f"{bases[i % 10]}/records", headers=stream_headers))
            for i in range(limit)))
        assert [s.status_code for s in opened] == [200] * limit
        r = await http.get(f"{bases[0]}/records", headers=stream_headers)
        assert r.status_code == 429, r.text
        assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
        assert "concurrent streams (limit 100)" in r.json()["message"]
        # another tenant streams meanwhile
        r = await http.post(f"/consumers/{group}", json={"name": "a", "format": "binary"}, headers=auth("alice"))
        assert r.status_code == 200, r.text
        r = await http.post(f"/consumers/{group}/instances/a/assignments", json=assignment, headers=auth("alice"))
        assert r.status_code == 204, r.text
        async with http.stream("GET", f"/consumers/{group}/instances/a/records",
                               headers={**auth("alice"), "Accept": "application/x-ndjson"}) as mine:
            assert mine.status_code == 200
        assert (await http.delete(f"/consumers/{group}/instances/a", headers=auth("alice"))).status_code == 204


@pytest.fixture(scope="module")
def open_gateway(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Open mode (no tenants file): the 'default' tenant gets the same shipped defaults."""
    p = start(tansu.bootstrap, tmp_path_factory.mktemp("default-limits-open") / "gw.log", {})
    assert "GATEWAY_TENANTS_FILE" not in p.env and not any(k.startswith("GATEWAY_DEFAULT_") for k in p.env)
    yield p
    p.stop()


async def test_open_mode_has_the_limits_too(open_gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=open_gateway.url, timeout=60) as http:
        await subscribe_huge(http, None)


async def pipelined(url: str, requests: list[bytes]) -> list[int]:
    """Send ``requests`` on one keep-alive connection at once (HTTP/1.1 pipelining: a client as fast as the
    gateway answers, costing little CPU itself) and return the statuses of the answers, in order."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"".join(requests))
        await writer.drain()
        statuses = []
        for _ in requests:
            head = await reader.readuntil(b"\r\n\r\n")
            statuses.append(int(head.split(b" ", 2)[1]))
            length = re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)
            assert length is not None, head
            await reader.readexactly(int(length[1]))
        return statuses
    finally:
        writer.close()


async def test_one_heavy_client_is_not_throttled_by_the_defaults(open_gateway: GatewayProcess,
                                                                  kclient: KafkaClient) -> None:
    """Eight connections in open mode with the shipped defaults: four produce 750 requests of 100 records each,
    four read (a charged request each) 2,250 times, all pipelined. Not one 429: before, the default bucket
    (1,000/s, burst 2,000) refused thousands of these 12,000 requests."""
    topic = "heavy-" + uuid.uuid4().hex[:8]
    await kclient.create_topics({topic: 1})
    body = b'{"records":[' + b",".join([b'{"value":"eA=="}'] * 100) + b"]}"
    host = open_gateway.url.removeprefix("http://")
    produce = (f"POST /topics/{topic} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {BIN}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    read = f"GET /consumers/g/instances/none/subscription HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    results = await asyncio.gather(*([pipelined(open_gateway.url, [produce] * 750) for _ in range(4)]
                                     + [pipelined(open_gateway.url, [read] * 2250) for _ in range(4)]))
    statuses = collections.Counter(s for r in results for s in r)
    assert statuses == {200: 3000, 404: 9000}, statuses
    async with httpx.AsyncClient(base_url=open_gateway.url, timeout=60) as http:
        r = await http.get(f"/topics/{topic}/partitions/0/offsets")
        assert r.status_code == 200 and r.json()["end_offset"] == 300_000, r.text


async def test_request_flood_is_rate_limited(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    """No request rate is shipped, but GATEWAY_DEFAULT_REQUESTS_PER_SECOND / _BURST set one for every tenant
    (low here so that a Python client can outrun it): past the burst, 429/42901 with Retry-After; in open
    mode."""
    env = {"GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "20", "GATEWAY_DEFAULT_BURST": "40"}
    p = start(tansu.bootstrap, tmp_path / "gw.log", env)
    try:
        async with httpx.AsyncClient(base_url=p.url, timeout=60) as http:
            statuses = []
            for _ in range(120):
                r = await http.get("/consumers/g/instances/none/subscription")
                statuses.append(r.status_code)
                if r.status_code == 429:
                    assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
            assert statuses[:40] == [404] * 40 and statuses.count(429) >= 40, statuses
    finally:
        p.stop()
