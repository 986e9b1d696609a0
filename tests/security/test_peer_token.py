"""Replicas always authenticate each other.

Peers without a peer token refuse to start; ``/internal/*`` needs the token even in open mode (no tenants
file); a forwarded-request header with a spoofed client address is refused without the token; wrong peer
tokens count against the caller's address in the failed-authentication limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker, free_port
from tests.integration.gateway_proc import FAST_ENV, GatewayProcess, start_replicas

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TOKEN = "peer-token-for-security-tests-0123"
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
LIMIT = 20


@pytest.mark.parametrize("peers", ["GATEWAY_PEERS", "GATEWAY_PEER_DNS"])
def test_peers_without_a_token_refuse_to_start(tansu: EmbeddedBroker, peers: str) -> None:
    port = free_port()
    env = {**os.environ, **FAST_ENV, "GATEWAY_KAFKA_BOOTSTRAP": tansu.bootstrap, "GATEWAY_PORT": str(port),
           peers: f"http://127.0.0.1:{port}" if peers == "GATEWAY_PEERS" else f"localhost:{port}"}
    env.pop("GATEWAY_PEER_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "gateway"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done
    assert b"refusing to start" in done.stderr and b"GATEWAY_PEER_TOKEN" in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr
    # an empty token is no token
    env["GATEWAY_PEER_TOKEN"] = "  "
    done = subprocess.run([sys.executable, "-m", "gateway"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2 and b"GATEWAY_PEER_TOKEN" in done.stderr, done


@pytest.fixture(scope="module")
def pair(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Two replicas in open mode (no tenants file), with the peer token."""
    procs = start_replicas(tansu.bootstrap, tmp_path_factory.mktemp("peer-token"), TOKEN,
                           {"GATEWAY_FORWARDED_ALLOW_IPS": "127.0.0.1"})
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


async def test_internal_endpoints_need_the_token_in_open_mode(pair: list[GatewayProcess]) -> None:
    a, b = pair
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as http:
        r = await http.post("/consumers/g-internal", headers=V2, json={"name": "held-here", "format": "binary"})
        assert r.status_code == 200, r.text
        holder = r.headers.get("x-kcg-served-by", "a")
        url = (a if holder == "a" else b).url
        lookup = f"{url}/internal/lookup?group=g-internal&name=held-here"
        for headers in ({}, {"x-kcg-peer-token": "wrong"}, {"x-kcg-peer-token": ""}):
            for path in (lookup, f"{url}/internal/peer", f"{url}/internal/peers"):
                r = await http.get(path, headers=headers)
                assert r.status_code == 403 and r.json()["error_code"] == 40302, (path, headers, r.text)
                assert "held" not in r.text and "placement" not in r.text
        r = await http.get(lookup, headers={"x-kcg-peer-token": TOKEN})
        assert r.status_code == 200 and r.json() == {"replica_id": holder, "held": True}


async def test_spoofed_client_header_is_refused_without_the_token(pair: list[GatewayProcess]) -> None:
    a, _ = pair
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as http:
        # from a peer host (loopback), claiming to be a forwarded request from a fresh client address each time
        for i in range(LIMIT + 5):
            r = await http.get("/consumers/g-spoof/instances/x/subscription", headers={
                "x-kcg-forwarded-by": "b", "x-kcg-client": f"192.0.2.{i}:4000"})
            assert r.status_code == 403 and r.json()["error_code"] == 40302, r.text
        # with a wrong peer token the attempts count against the real address (below)


async def test_wrong_peer_tokens_are_counted(pair: list[GatewayProcess]) -> None:
    a, b = pair
    attacker = "198.51.100.30"  # behind the trusted proxy 127.0.0.1
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
        codes = []
        for i in range(LIMIT + 3):
            spoof = {"x-kcg-client": f"192.0.2.{i}:4000"}  # never believed without the right token
            path = "/internal/lookup?group=g&name=n" if i % 2 else "/consumers/g/instances/n/subscription"
            headers = {"x-kcg-peer-token": f"guess-{i}", "X-Forwarded-For": attacker, "x-kcg-forwarded-by": "a",
                       **spoof}
            codes.append((await http.get(path, headers=headers)).status_code)
        assert codes == [403] * LIMIT + [429] * 3, codes
        r = await http.get("/internal/peer", headers={"x-kcg-peer-token": "guess", "X-Forwarded-For": attacker})
        assert r.status_code == 429 and r.json()["error_code"] == 42901 and int(r.headers["Retry-After"]) >= 1
        # the right token is never refused, and other clients keep being served
        r = await http.get("/internal/peer", headers={"x-kcg-peer-token": TOKEN, "X-Forwarded-For": attacker})
        assert r.status_code == 200 and r.json()["replica_id"] == "b"
        r = await http.get("/topics", headers={"X-Forwarded-For": "198.51.100.31"})
        assert r.status_code == 200, r.text
        r = await http.get("/internal/peer", headers={"x-kcg-peer-token": "typo", "X-Forwarded-For": "198.51.100.32"})
        assert r.status_code == 403
    # the replicas still talk to each other: an instance on a is reachable through b
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{a.url}/consumers/g-after", headers=V2, json={"format": "binary"})
        assert r.status_code == 200, r.text
        name = r.json()["instance_id"]
        r = await http.get(f"{b.url}/consumers/g-after/instances/{name}/subscription")
        assert r.status_code == 200 and r.headers["x-kcg-served-by"] == "a", r.text


def test_log_mentions_no_token(pair: list[GatewayProcess]) -> None:
    for p in pair:
        assert p.log_file is not None
        assert TOKEN not in Path(p.log_file).read_text()
