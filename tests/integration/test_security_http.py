"""Security fixes, black-box against a gateway process with a tenants file: tenant-safe patterns, RE2,
received-body limit, group id validation, WWW-Authenticate, trusted proxies, failed-auth limit, ops endpoints."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
H = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = "application/vnd.kafka.binary.v2+json"
KEY_A, KEY_B = "security-key-of-tenant-a-1", "security-key-of-tenant-b-2"
ADMIN = "admin-token-for-ops-endpoints-123"
MAX_BODY = 4096


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: sec-tenant-a
    api_keys: ["{sha(KEY_A)}"]
    topics: ["sa-*"]
    groups: ["sga-*"]
  - id: sec-tenant-b
    api_keys: ["{sha(KEY_B)}"]
    topics: ["sb-*"]
"""


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("security")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={
            "GATEWAY_TENANTS_FILE": str(f), "GATEWAY_MAX_BODY_BYTES": str(MAX_BODY), "GATEWAY_ADMIN_TOKEN": ADMIN,
            "GATEWAY_AUTH_FAILURES_PER_MINUTE": "5", "GATEWAY_FORWARDED_ALLOW_IPS": "127.0.0.1"}) as g:
        yield g



def auth(key: str) -> dict[str, str]:
    return {**H, "Authorization": f"Bearer {key}"}


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(30) == 0


async def create(http: httpx.AsyncClient, group: str, key: str = KEY_A, **cfg: object) -> str:
    r = await http.post(f"/consumers/{group}", json=cfg, headers=auth(key))
    assert r.status_code == 200, r.text
    return "/consumers/" + r.json()["base_uri"].split("/consumers/", 1)[1]


async def test_pattern_subscription_never_delivers_forbidden_topics(
        http: httpx.AsyncClient, kclient: KafkaClient, tansu: EmbeddedBroker) -> None:
    suffix = uuid.uuid4().hex[:8]
    allowed, forbidden = f"sa-{suffix}", f"sb-{suffix}"
    await kclient.create_topics({allowed: 1, forbidden: 1})
    await asyncio.to_thread(produce, tansu.bootstrap, forbidden, [b"secret-1", b"secret-2"])
    await asyncio.to_thread(produce, tansu.bootstrap, allowed, [b"mine"])
    base = await create(http, f"sga-{suffix}", **{"auto.offset.reset": "earliest"})
    # a pattern matching everything: restricted to the tenant's topics, not refused after the fact
    r = await http.post(f"{base}/subscription", json={"topic_pattern": ".*"}, headers=auth(KEY_A))
    assert r.status_code == 204, r.text
    r = await http.get(f"{base}/subscription", headers=auth(KEY_A))
    topics = r.json()["topics"]
    assert allowed in topics and not [t for t in topics if not t.startswith("sa-")], topics
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and b"mine" not in got:
        r = await http.get(f"{base}/records", params={"timeout": 1000}, headers={**auth(KEY_A), "Accept": BIN})
        assert r.status_code == 200, r.text
        for rec in r.json():
            assert rec["topic"].startswith("sa-"), rec
            got.append(base64.b64decode(rec["value"]))
    assert b"mine" in got and b"secret-1" not in got
    assert (await http.delete(base, headers=auth(KEY_A))).status_code == 204


async def test_catastrophic_and_unsupported_patterns(http: httpx.AsyncClient, kclient: KafkaClient) -> None:
    # a backtracking engine needs ~2**36 steps to find that this name does not match (\w|\w)*-x
    await kclient.create_topics({"sa_" + uuid.uuid4().hex[:8] + "w" * 25: 1})
    base = await create(http, f"sga-re-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    r = await http.post(f"{base}/subscription", json={"topic_pattern": r"(\w|\w)*-x"}, headers=auth(KEY_A))
    assert r.status_code == 204, r.text
    assert time.monotonic() - started < 5
    assert (await http.delete(f"{base}/subscription", headers=auth(KEY_A))).status_code == 204
    for pattern, what in ((r"(a)\1", "backreferences"), (r"(?=sa-).*", "lookahead"), (r"(?<!x)sa-.*", "lookbehind")):
        r = await http.post(f"{base}/subscription", json={"topic_pattern": pattern}, headers=auth(KEY_A))
        assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text
        assert what in r.json()["message"]
    r = await http.get("/healthz")
    assert r.status_code == 200
    assert (await http.delete(base, headers=auth(KEY_A))).status_code == 204


async def test_chunked_body_over_the_limit_is_refused(http: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "chunky", "padding": "'
        for _ in range(16):
            yield b"x" * 1024
        yield b'"}'

    r = await http.post(f"/consumers/sga-chunk-{uuid.uuid4().hex[:8]}", content=chunks(), headers=auth(KEY_A))
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413 and r.json()["error_code"] == 41301, r.text


async def test_group_id_with_control_characters_is_refused(http: httpx.AsyncClient) -> None:
    r = await http.post("/consumers/sga-%0Aforged", json={}, headers=auth(KEY_A))
    assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text
    assert "control character" in r.json()["message"]
    r = await http.post("/consumers/sga-" + "g" * 250, json={}, headers=auth(KEY_A))
    assert r.status_code == 422 and "249" in r.json()["message"]
    r = await http.post("/consumers/sga-x", json={"name": "bad name"}, headers=auth(KEY_A))
    assert r.status_code == 422 and r.json()["error_code"] == 42206


async def test_401_carries_www_authenticate(http: httpx.AsyncClient) -> None:
    r = await http.post("/consumers/sga-1", json={}, headers={**H, "X-Forwarded-For": "198.51.100.1"})
    assert r.status_code == 401 and r.json()["error_code"] == 40101
    assert r.headers["www-authenticate"].startswith("Bearer")


async def test_untrusted_client_cannot_forge_base_uri(gw: GatewayProcess) -> None:
    forged = {"Forwarded": 'proto=https;host="evil.example"', "X-Forwarded-Host": "evil.example",
              "X-Forwarded-Proto": "https", "X-Forwarded-Prefix": "/phish"}
    # the same loopback host from another source address: not in GATEWAY_FORWARDED_ALLOW_IPS
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, transport=transport) as other:
        r = await other.post("/consumers/sga-fwd", json={}, headers={**auth(KEY_A), **forged})
        assert r.status_code == 200, r.text
        uri = r.json()["base_uri"]
        assert uri.startswith(f"{gw.url}/consumers/sga-fwd/instances/") and "evil" not in uri, uri
        assert (await other.delete("/consumers/" + uri.split("/consumers/", 1)[1],
                                   headers=auth(KEY_A))).status_code == 204
    # a trusted proxy (127.0.0.1) is still believed
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as proxy:
        r = await proxy.post("/consumers/sga-fwd", json={}, headers={**auth(KEY_A), **forged})
        assert r.json()["base_uri"].startswith("https://evil.example/phish/consumers/sga-fwd/instances/")
        await proxy.delete(f"/consumers/sga-fwd/instances/{r.json()['instance_id']}", headers=auth(KEY_A))


async def test_failed_authentication_is_rate_limited_per_address(http: httpx.AsyncClient) -> None:
    attacker = {"X-Forwarded-For": "203.0.113.7"}  # through the trusted proxy 127.0.0.1
    codes = []
    for i in range(7):
        r = await http.get("/topics", headers={**auth(f"guess-{i}"), **attacker})
        codes.append(r.status_code)
    assert codes[:5] == [401] * 5 and codes[5:] == [429, 429], codes
    assert r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
    # the right key is never refused (behind an ingress every client shares the address);
    # the wrong ones stay throttled; other addresses are not affected
    r = await http.get("/topics", headers={**auth(KEY_A), **attacker})
    assert r.status_code == 200, r.text
    assert (await http.get("/topics", headers={**auth("guess-7"), **attacker})).status_code == 429
    r = await http.get("/topics", headers={**auth(KEY_A), "X-Forwarded-For": "203.0.113.8"})
    assert r.status_code == 200, r.text


async def test_ops_endpoints_do_not_leak_tenants(http: httpx.AsyncClient) -> None:
    r = await http.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    r = await http.get("/readyz", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and r.json()["tenants"] == ["sec-tenant-a", "sec-tenant-b"]
    r = await http.get("/metrics")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert "sec-tenant" not in r.text
    r = await http.get("/metrics", headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 401
    r = await http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and "kcg_" in r.text
