"""Every 429 carries ``Retry-After``, and a producer that honours it loses and duplicates nothing.

Against real gateway processes over real sockets: each place that answers 429 is provoked in turn — the
request-rate bucket on the full app, the lean produce path (topic and partition), the lean records path, v3
produce and a range read; the tenant's instance cap and the replica's; the concurrent stream, poll and range-read slots;
the failed-authentication limiter (API keys and the admin token); a 429 a replica relays from the replica it
forwarded to — and every one must be 429/42901 with ``Retry-After`` in whole seconds, at least 1. Then
producers whose tenant has a small rate get 429s, wait ``Retry-After``, retry, and every record they sent is
in the topic exactly once.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from service.ring import SERVED_BY_HEADER
from tests.integration.gateway_proc import GatewayProcess, tenants_gateway
from tests.security.test_quotas_replicas import PEER, names_on, start_pair

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
NDJSON = "application/x-ndjson"
ADMIN = "retry-after-admin-token-0123456789"
KEYS = {t: f"retry-after-key-of-{t}-0123456789" for t in ("rate", "caps", "many", "backoff", "reader")}
QUOTAS = {
    "rate": "{requests_per_second: 0.05, burst: 1}",  # one request, then 20 s to the next token
    "caps": "{max_instances: 2, max_concurrent_polls: 1, max_streams: 1}",
    "many": "{max_instances: null}",
    "backoff": "{requests_per_second: 4, burst: 2}",
    "reader": "{}",
}


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


def tenants_file() -> str:
    return "version: 1\ntenants:\n" + "".join(
        f"  - id: {t}\n    api_keys: [\"{sha(KEYS[t])}\"]\n    quotas: {QUOTAS[t]}\n" for t in KEYS)


def auth(tenant: str, content_type: str = V2) -> dict[str, str]:
    return {"X-API-Key": KEYS[tenant], "Content-Type": content_type}


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def assert_backs_off(what: str, r: httpx.Response) -> None:
    assert r.status_code == 429, (what, r.status_code, r.text)
    assert r.json()["error_code"] == 42901, (what, r.text)
    value = r.headers.get("Retry-After")
    assert value is not None and re.fullmatch(r"[0-9]+", value) and int(value) >= 1, (what, r.headers)


@pytest.fixture(scope="module")
def gateway(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("retry-after")
    p = tenants_gateway(tansu.bootstrap, tenants_file(), d, env={
        "GATEWAY_MAX_INSTANCES": "4", "GATEWAY_AUTH_FAILURES_PER_MINUTE": "3", "GATEWAY_ADMIN_TOKEN": ADMIN})
    p.start()
    yield p
    p.stop()


@pytest.fixture
async def http(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
        yield client


async def test_every_429_carries_retry_after(http: httpx.AsyncClient, kclient: KafkaClient) -> None:
    topic = "retry-after-" + uuid.uuid4().hex[:8]
    await kclient.create_topics({topic: 1})
    r = await http.post(f"/topics/{topic}", json={"records": [{"value": b64(b"x")}]}, headers=auth("caps", BIN))
    assert r.status_code == 200, r.text
    r = await http.get("/v3/clusters", headers=auth("reader"))
    assert r.status_code == 200, r.text
    cluster = r.json()["data"][0]["cluster_id"]
    refusals: dict[str, httpx.Response] = {}

    # the request-rate bucket: one token, then every route refuses
    r = await http.get("/consumers/g/instances/none/subscription", headers=auth("rate"))
    assert r.status_code == 404, r.text
    refusals["rate, full app"] = await http.get("/consumers/g/instances/none/subscription", headers=auth("rate"))
    refusals["rate, lean produce"] = await http.post(
        f"/topics/{topic}", json={"records": [{"value": b64(b"r")}]}, headers=auth("rate", BIN))
    refusals["rate, lean produce to a partition"] = await http.post(
        f"/topics/{topic}/partitions/0", json={"records": [{"value": b64(b"r")}]}, headers=auth("rate", BIN))
    refusals["rate, v3 produce"] = await http.post(
        f"/v3/clusters/{cluster}/topics/{topic}/records", content=orjson.dumps({"value": {"type": "STRING",
                                                                                          "data": "r"}}),
        headers=auth("rate", "application/json"))
    refusals["rate, lean records"] = await http.get("/consumers/g/instances/none/records",
                                                    headers={**auth("rate"), "Accept": BIN})
    refusals["rate, range read"] = await http.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0},
                                                  headers=auth("rate"))

    # the tenant's instance cap, then the concurrent slots while a stream holds the only poll slot
    group = "ra-" + uuid.uuid4().hex[:8]
    for name in ("i1", "i2"):
        r = await http.post(f"/consumers/{group}", json={"name": name, "format": "binary"}, headers=auth("caps"))
        assert r.status_code == 200, r.text
        r = await http.post(f"/consumers/{group}/instances/{name}/assignments",
                            json={"partitions": [{"topic": topic, "partition": 0}]}, headers=auth("caps"))
        assert r.status_code == 204, r.text
    refusals["tenant instance cap"] = await http.post(f"/consumers/{group}", json={"name": "i3"},
                                                      headers=auth("caps"))
    stream_headers = {**auth("caps"), "Accept": NDJSON}
    async with http.stream("GET", f"/consumers/{group}/instances/i1/records", headers=stream_headers) as held:
        assert held.status_code == 200
        refusals["concurrent streams"] = await http.get(f"/consumers/{group}/instances/i2/records",
                                                        headers=stream_headers)
        refusals["concurrent polls"] = await http.get(f"/consumers/{group}/instances/i2/records",
                                                      headers={**auth("caps"), "Accept": BIN})
        refusals["concurrent range reads (poll slot)"] = await http.get(
            f"/topics/{topic}/partitions/0/records", params={"offset": 0}, headers=auth("caps"))

    # the replica's own instance cap (GATEWAY_MAX_INSTANCES=4: caps holds 2)
    for name in ("m1", "m2"):
        r = await http.post(f"/consumers/{group}", json={"name": name}, headers=auth("many"))
        assert r.status_code == 200, r.text
    refusals["replica instance cap"] = await http.post(f"/consumers/{group}", json={"name": "m3"},
                                                       headers=auth("many"))

    # failed authentication: three wrong keys per minute, then 429 (API keys and the admin token alike)
    for _ in range(3):
        r = await http.get("/topics", headers={"X-API-Key": "wrong-" + uuid.uuid4().hex})
        assert r.status_code == 401, r.text
    refusals["failed authentication, API key"] = await http.get("/topics", headers={"X-API-Key": "wrong-again"})
    refusals["failed authentication, admin token"] = await http.get(
        "/metrics", headers={"Authorization": "Bearer wrong-admin-token"})

    assert len(refusals) == 13
    for what, r in refusals.items():
        assert_backs_off(what, r)
    assert "rate limit" in refusals["rate, full app"].json()["message"]
    assert int(refusals["rate, lean produce"].headers["Retry-After"]) >= 10  # a token every 20 s
    assert "concurrent streams" in refusals["concurrent streams"].json()["message"]
    assert "concurrent polls" in refusals["concurrent polls"].json()["message"]
    assert "this gateway replica" in refusals["replica instance cap"].json()["message"]
    for name in ("i1", "i2", "m1", "m2"):
        tenant = "caps" if name.startswith("i") else "many"
        r = await http.delete(f"/consumers/{group}/instances/{name}", headers=auth(tenant))
        assert r.status_code == 204, r.text


async def produce_with_backoff(http: httpx.AsyncClient, cluster: str, topic: str, worker: int, requests: int,
                               per_request: int, v3: bool) -> tuple[list[str], int]:
    """Send ``requests`` produce requests of ``per_request`` records; on 429 wait Retry-After and send the same
    request again. Returns the values sent and the number of 429s met."""
    sent: list[str] = []
    refused = 0
    for i in range(requests):
        values = [f"w{worker}-r{i}-{j}" for j in range(per_request)]
        while True:
            if v3:
                body = b"".join(orjson.dumps({"value": {"type": "STRING", "data": v}}) for v in values)
                r = await http.post(f"/v3/clusters/{cluster}/topics/{topic}/records", content=body,
                                    headers=auth("backoff", "application/json"))
            else:
                r = await http.post(f"/topics/{topic}", headers=auth("backoff", BIN),
                                    json={"records": [{"value": b64(v.encode())} for v in values]})
            if r.status_code != 429:
                break
            assert_backs_off("produce", r)
            refused += 1
            await asyncio.sleep(int(r.headers["Retry-After"]))  # the client's back-off, as told
        assert r.status_code == 200, r.text
        if v3:
            results = [orjson.loads(line) for line in r.content.splitlines() if line.strip()]
            assert [x["error_code"] for x in results] == [200] * per_request, r.text
        else:
            offsets = r.json()["offsets"]
            assert len(offsets) == per_request and all(o.get("error") is None for o in offsets), r.text
        sent += values
    return sent, refused


async def test_producers_backing_off_lose_and_duplicate_nothing(http: httpx.AsyncClient,
                                                                kclient: KafkaClient) -> None:
    topic = "backoff-" + uuid.uuid4().hex[:8]
    await kclient.create_topics({topic: 1})
    r = await http.get("/v3/clusters", headers=auth("reader"))
    cluster = r.json()["data"][0]["cluster_id"]
    # four producers (one on v3) against 4 requests/s, burst 2: about 24 requests, most of them refused once
    done = await asyncio.gather(*(produce_with_backoff(http, cluster, topic, w, 6, 10, v3=w == 3) for w in range(4)))
    sent = [v for values, _ in done for v in values]
    refused = sum(n for _, n in done)
    assert refused >= 4, f"the producers met only {refused} refusals: the back-off was not exercised"
    stored: list[str] = []
    offset = 0
    while True:
        r = await http.get(f"/topics/{topic}/partitions/0/records", params={"offset": offset},
                           headers={**auth("reader"), "Accept": BIN})
        assert r.status_code == 200, r.text
        body = r.json()
        stored += [base64.b64decode(rec["value"]).decode() for rec in body["records"]]
        offset = body["next_offset"]
        if offset >= body["end_offset"]:
            break
    counts = collections.Counter(stored)
    assert len(sent) == 240 and set(counts) == set(sent), set(sent) ^ set(counts)
    assert [v for v, n in counts.items() if n != 1] == [], "records stored more than once"


REPLICA_TENANTS = f"""
version: 1
tenants:
  - id: slow
    api_keys: ["{sha(KEYS['rate'])}"]
    quotas: {{requests_per_second: 0.02, burst: 2}}
"""


def test_a_forwarded_429_keeps_retry_after(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    """Two replicas: an instance held by b, asked through a; b's rate refusal reaches the client through a with
    its Retry-After (each replica's bucket: ceil(2 / 2) = 1 token)."""
    a, b = start_pair(tansu.bootstrap, tmp_path, REPLICA_TENANTS)
    try:
        group = "fw-" + uuid.uuid4().hex[:8]
        (name,) = names_on(group, "b", 1)
        r = httpx.post(f"{a.url}/consumers/{group}", json={"name": name}, headers=auth("rate"), timeout=30)
        assert r.status_code == 200, r.text  # created on b, which took its one token
        r = httpx.get(f"{b.url}/internal/lookup", params={"group": group, "name": name}, headers=PEER)
        assert r.json()["held"], r.text
        r = httpx.get(f"{a.url}/consumers/{group}/instances/{name}/subscription", headers=auth("rate"), timeout=30)
        assert_backs_off("forwarded", r)
        assert r.headers.get(SERVED_BY_HEADER) == "b", r.headers
        assert int(r.headers["Retry-After"]) >= 10, r.headers  # 0.01 token/s on b
    finally:
        a.stop()
        b.stop()
