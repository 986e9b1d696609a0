"""Tenant isolation, authentication and quotas, black-box against a gateway process with a tenants file."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
H = {"Content-Type": "application/vnd.kafka.v2+json"}
KEY_A, KEY_B, KEY_C = "key-of-tenant-a-123", "key-of-tenant-b-456", "key-of-tenant-c-789"
KEY_D = "key-of-tenant-d-012"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: tenant-a
    api_keys: ["{sha(KEY_A)}"]
    topics: ["a-*"]
    groups: ["ga-*"]
    quotas: {{max_instances: 2}}
  - id: tenant-b
    api_keys: ["{sha(KEY_B)}"]
    topics: ["b-*"]
    groups: ["gb-*"]
  - id: tenant-c
    api_keys: ["{sha(KEY_C)}"]
    quotas: {{requests_per_second: 1, burst: 3}}
  - id: tenant-d
    api_keys: ["{sha(KEY_D)}"]
    topics: ["d-*"]
    quotas: {{max_concurrent_polls: 1}}
"""


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("tenants")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f)}, log_file=d / "gw.log") as g:
        yield g
        log = (d / "gw.log").read_text()
        assert KEY_A not in log and KEY_B not in log and KEY_C not in log, "a secret reached the log"



def auth(key: str, header: str = "bearer") -> dict[str, str]:
    return {**H, "Authorization": f"Bearer {key}"} if header == "bearer" else {**H, "X-API-Key": key}


async def test_authentication_required(http: httpx.AsyncClient) -> None:
    r = await http.post("/consumers/ga-1", json={}, headers=H)
    assert r.status_code == 401 and r.json()["error_code"] == 40101
    r = await http.post("/consumers/ga-1", json={}, headers=auth("wrong-key"))
    assert r.status_code == 401 and "wrong-key" not in r.text
    r = await http.get("/healthz")  # ops endpoints stay open
    assert r.status_code == 200


async def test_tenants_are_isolated(http: httpx.AsyncClient, bclient: KafkaClient) -> None:
    await bclient.create_topics({"a-orders": 1, "b-orders": 1})
    r = await http.post("/consumers/ga-1", json={"name": "same-name"}, headers=auth(KEY_A))
    assert r.status_code == 200, r.text
    base_a = "/consumers/ga-1/instances/" + r.json()["instance_id"]
    # tenant B cannot see tenant A's instance, even with the right URL
    r = await http.get(f"{base_a}/subscription", headers=auth(KEY_B, "x-api-key"))
    assert r.status_code == 404 and r.json()["error_code"] == 40403
    # nor create in A's groups, or read A's topics
    r = await http.post("/consumers/ga-1", json={}, headers=auth(KEY_B))
    assert r.status_code == 403 and r.json()["error_code"] == 40301
    r = await http.post(f"{base_a}/subscription", json={"topics": ["b-orders"]}, headers=auth(KEY_A))
    assert r.status_code == 403 and r.json()["error_code"] == 40301
    r = await http.post(f"{base_a}/assignments", json={"partitions": [{"topic": "b-orders", "partition": 0}]},
                        headers=auth(KEY_A))
    assert r.status_code == 403
    r = await http.post(f"{base_a}/subscription", json={"topics": ["a-orders"]}, headers=auth(KEY_A))
    assert r.status_code == 204
    # the same instance name in another tenant is a different instance
    r = await http.post("/consumers/gb-1", json={"name": "same-name"}, headers=auth(KEY_B))
    assert r.status_code == 200
    base_b = "/consumers/gb-1/instances/" + r.json()["instance_id"]
    # quota: max 2 instances for tenant A
    r2 = await http.post("/consumers/ga-2", json={}, headers=auth(KEY_A))
    assert r2.status_code == 200
    r3 = await http.post("/consumers/ga-3", json={}, headers=auth(KEY_A))
    assert r3.status_code == 429 and r3.json()["error_code"] == 42901
    for base, key in ((base_a, KEY_A), (base_b, KEY_B),
                      ("/consumers/ga-2/instances/" + r2.json()["instance_id"], KEY_A)):
        assert (await http.delete(base, headers=auth(key))).status_code == 204


async def test_rate_limit(http: httpx.AsyncClient) -> None:
    codes = []
    for _ in range(8):
        r = await http.get("/consumers/any/instances/none/subscription", headers=auth(KEY_C))
        codes.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
    assert 429 in codes and codes[0] == 404  # the burst passes, then the bucket is empty


async def test_streams_hold_a_concurrent_poll_slot(http: httpx.AsyncClient, bclient: KafkaClient) -> None:
    """max_concurrent_polls counts open streams like waiting polls: a second stream or poll is 429 while
    one stream is open, and the slot comes back when the stream ends."""
    await bclient.create_topics({"d-events": 1})
    r = await http.post("/consumers/gd-1", json={"name": "s1", "format": "binary"}, headers=auth(KEY_D))
    assert r.status_code == 200, r.text
    base = "/consumers/gd-1/instances/s1"
    r = await http.post(f"{base}/assignments", json={"partitions": [{"topic": "d-events", "partition": 0}]},
                        headers=auth(KEY_D))
    assert r.status_code == 204, r.text
    ndjson = {**auth(KEY_D), "Accept": "application/x-ndjson"}
    binary = {**auth(KEY_D), "Accept": "application/vnd.kafka.binary.v2+json"}
    async with http.stream("GET", f"{base}/records", headers=ndjson) as stream:
        assert stream.status_code == 200
        second = await http.get(f"{base}/records", headers=ndjson)
        assert second.status_code == 429 and second.json()["error_code"] == 42901, second.text
        poll = await http.get(f"{base}/records", params={"timeout": 0}, headers=binary)
        assert poll.status_code == 429 and poll.json()["error_code"] == 42901, poll.text
    # the stream ended (client closed it): the slot is free again once the gateway notices
    for _ in range(200):
        poll = await http.get(f"{base}/records", params={"timeout": 0}, headers=binary)
        if poll.status_code != 429:
            break
        await asyncio.sleep(0.05)  # the gateway notices the disconnect at its next poll (<= 1 s)
    assert poll.status_code == 200, poll.text
    assert (await http.delete(base, headers=auth(KEY_D))).status_code == 204
