"""A replica checks credentials before forwarding or looking anything up.

An unauthenticated request for an instance another replica holds is answered 401 by the receiving replica,
with no routing headers (nothing tells where the instance lives), and never reaches the holder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from service.ring import owner, routing_key
from tests.integration.gateway_proc import GatewayProcess, start_replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TOKEN = "peer-token-auth-before-forwarding-01"
ADMIN = "admin-token-auth-before-forwarding-01"
KEY_A, KEY_B = "forwarding-key-of-tenant-a-0001", "forwarding-key-of-tenant-b-0002"
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
SERVED_BY = "x-kcg-served-by"
GROUP = "fg-auth"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: fwd-a
    api_keys: ["{sha(KEY_A)}"]
    topics: ["fa-*"]
  - id: fwd-b
    api_keys: ["{sha(KEY_B)}"]
    topics: ["fb-*"]
"""


@pytest.fixture(scope="module")
def pair(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GatewayProcess]]:
    d = tmp_path_factory.mktemp("auth-forwarding")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    replicas = start_replicas(tansu.bootstrap, d, TOKEN, {"GATEWAY_TENANTS_FILE": str(f), "GATEWAY_ADMIN_TOKEN": ADMIN})
    procs = dict(zip("ab", replicas, strict=True))
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def name_owned_by(rid: str, prefix: str) -> str:
    return next(n for i in range(10_000) if owner(["a", "b"], routing_key(GROUP, n := f"{prefix}{i}")) == rid)


async def arrivals(g: GatewayProcess) -> tuple[float, float]:
    """What replica ``g`` saw of consumer requests (every status) and of /internal lookups."""
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{g.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).text
    consumer = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kcg_http_request_duration_seconds_count{") and "/consumers" in line)
    forwarded_in = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("kcg_http_request_duration_seconds_count{") and "/internal" in line)
    return consumer, forwarded_in


async def test_unauthenticated_requests_are_not_forwarded(pair: dict[str, GatewayProcess]) -> None:
    a, b = pair["a"], pair["b"]
    name = name_owned_by("a", "inst")
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as via_b:
        # created through b with a valid key: forwarded to its owner a
        r = await via_b.post(f"/consumers/{GROUP}", headers={**V2, "X-API-Key": KEY_A},
                             json={"name": name, "format": "binary"})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a", r.text
        base = f"/consumers/{GROUP}/instances/{name}"
        r = await via_b.get(f"{base}/subscription", headers={"X-API-Key": KEY_A})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a"
        before_a, before_b = await arrivals(a), await arrivals(b)
        b_forwarded = await forwarded_total(b)
        attempts = [
            ("GET", f"{base}/subscription", {}),
            ("GET", f"{base}/subscription", {"X-API-Key": "not-a-key"}),
            ("GET", f"{base}/records", {"Authorization": "Bearer wrong-bearer", "Accept": "application/x-ndjson"}),
            ("POST", f"{base}/subscription", {**V2, "X-API-Key": "nope"}),
            ("DELETE", base, {}),
            ("GET", f"/consumers/{GROUP}/instances/someone-else/subscription", {}),
            ("POST", f"/consumers/{GROUP}", {**V2, "X-API-Key": "nope"}),
        ]
        for method, path, headers in attempts:
            body = {"name": name_owned_by("a", "new"), "format": "binary"} if path.endswith(GROUP) else \
                {"topics": ["fa-x"]} if method == "POST" else None
            r = await via_b.request(method, path, headers=headers, json=body)
            assert r.status_code == 401 and r.json()["error_code"] == 40101, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert not [h for h in r.headers if h.startswith("x-kcg-")], (method, path, r.headers)
        # nothing arrived at a (no forwarded request, no lookup), and b forwarded nothing
        assert await arrivals(a) == before_a
        assert await forwarded_total(b) == b_forwarded
        # another tenant's valid key is authenticated, then forwarded: the holder says it has no such instance
        r = await via_b.get(f"{base}/subscription", headers={"X-API-Key": KEY_B})
        assert r.status_code == 404 and r.json()["error_code"] == 40403 and SERVED_BY not in r.headers
        # the instance's own tenant is still served through b
        r = await via_b.get(f"{base}/subscription", headers={"X-API-Key": KEY_A})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "a"
        assert (await via_b.delete(base, headers={"X-API-Key": KEY_A})).status_code == 204
    assert before_b  # b saw the requests itself (its own counters moved)
    assert await arrivals(b) != before_b


async def forwarded_total(g: GatewayProcess) -> float:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{g.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kcg_forwarded_requests_total{") and 'outcome="refused"' not in line)
