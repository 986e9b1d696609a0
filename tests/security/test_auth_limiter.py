"""The failed-authentication limiter throttles guessing without locking out valid keys.

Behind an ingress every client shares the ingress's address; one client guessing keys must not lock the
other tenants out. Wrong admin tokens count like wrong API keys. A real gateway process, real sockets.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
KEY_A, KEY_B = "limiter-key-of-tenant-a-0001", "limiter-key-of-tenant-b-0002"
ADMIN = "limiter-admin-token-0123456789"
LIMIT = 20  # the default GATEWAY_AUTH_FAILURES_PER_MINUTE


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: lim-a
    api_keys: ["{sha(KEY_A)}"]
    topics: ["la-*"]
  - id: lim-b
    api_keys: ["{sha(KEY_B)}"]
    topics: ["lb-*"]
"""


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("auth-limiter")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    # 127.0.0.1 is the trusted proxy (the "ingress"): X-Forwarded-For names the client behind it
    with GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={
            "GATEWAY_TENANTS_FILE": str(f), "GATEWAY_ADMIN_TOKEN": ADMIN,
            "GATEWAY_FORWARDED_ALLOW_IPS": "127.0.0.1"}) as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        yield c


def bearer(token: str, via: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Forwarded-For": via}


async def test_guessing_keys_does_not_lock_out_valid_keys(http: httpx.AsyncClient) -> None:
    shared = "198.51.100.10"  # every client behind the ingress looks like this one address
    codes = [(await http.get("/topics", headers=bearer(f"guess-{i}", shared))).status_code for i in range(LIMIT + 5)]
    assert codes == [401] * LIMIT + [429] * 5, codes
    # the attacker stays throttled...
    r = await http.get("/topics", headers=bearer("guess-again", shared))
    assert r.status_code == 429 and r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
    r = await http.get("/topics", headers={"X-API-Key": "guess-by-x-api-key", "X-Forwarded-For": shared})
    assert r.status_code == 429
    # ...while every tenant behind the same address is still served
    for key in (KEY_A, KEY_B):
        r = await http.get("/topics", headers=bearer(key, shared))
        assert r.status_code == 200, r.text
        r = await http.get("/topics", headers={"X-API-Key": key, "X-Forwarded-For": shared})
        assert r.status_code == 200, r.text
    # a valid key does not reset the guesser's count
    r = await http.get("/topics", headers=bearer("guess-after-success", shared))
    assert r.status_code == 429
    # no credentials at all is not a guess: a plain 401 that says what to send
    r = await http.get("/topics", headers={"X-Forwarded-For": shared})
    assert r.status_code == 401 and r.json()["error_code"] == 40101
    # another address is not affected
    assert (await http.get("/topics", headers=bearer("one-typo", "198.51.100.11"))).status_code == 401


async def test_wrong_admin_tokens_are_counted(http: httpx.AsyncClient) -> None:
    addr = "198.51.100.20"
    codes = [(await http.get("/metrics", headers=bearer(f"admin-guess-{i}", addr))).status_code
             for i in range(LIMIT)]
    assert codes == [401] * LIMIT, codes
    r = await http.get("/metrics", headers=bearer("admin-guess-more", addr))
    assert r.status_code == 429 and r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
    r = await http.get("/readyz", headers=bearer("admin-guess-readyz", addr))
    assert r.status_code == 429 and "tenants" not in r.text
    # wrong admin tokens and wrong API keys share the address's count
    assert (await http.get("/topics", headers=bearer("key-guess", addr))).status_code == 429
    # the right token still works from that address, and so do the tenants' keys
    r = await http.get("/metrics", headers=bearer(ADMIN, addr))
    assert r.status_code == 200 and "kcg_" in r.text
    r = await http.get("/readyz", headers=bearer(ADMIN, addr))
    assert r.status_code == 200 and r.json()["tenants"] == ["lim-a", "lim-b"]
    assert (await http.get("/topics", headers=bearer(KEY_A, addr))).status_code == 200
    # an anonymous readiness probe from that address is not refused
    r = await http.get("/readyz", headers={"X-Forwarded-For": addr})
    assert r.status_code == 200 and r.json() == {"status": "ready"}
