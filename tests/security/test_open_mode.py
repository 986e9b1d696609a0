"""Open mode (no tenants file, no authentication) is not open to the network.

A real gateway process over real sockets: bound to loopback unless GATEWAY_HOST says otherwise, and a
request whose Host header is not an allowed host (DNS rebinding: a web page re-points its own name at
127.0.0.1, so the browser sends ``Host: attacker.example``) is refused with 421/42101 while requests
naming localhost keep being served.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
KEY = "open-mode-test-key-0123456789"


def start(tansu: EmbeddedBroker, log: Path, **env: str) -> GatewayProcess:
    g = GatewayProcess(tansu.bootstrap, log_file=log, env=env)
    for name in ("GATEWAY_HOST", "GATEWAY_ALLOWED_HOSTS", "GATEWAY_TENANTS_FILE"):
        if name not in env:
            g.env.pop(name, None)  # the defaults under test, whatever the test runner's environment says
    g.start()
    return g


def listen_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) of sockets listening on ``port``."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                out.add(addr)
    return out


@pytest.fixture(scope="module")
def open_gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = start(tansu, tmp_path_factory.mktemp("open") / "gw.log")
    try:
        yield g
    finally:
        g.stop()


def test_open_mode_binds_loopback_by_default(open_gw: GatewayProcess) -> None:
    assert listen_addresses(open_gw.port) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0


def test_dns_rebinding_host_is_refused_while_localhost_is_served(open_gw: GatewayProcess) -> None:
    with httpx.Client(base_url=open_gw.url, timeout=10) as c:
        for _ in range(3):  # attacker and developer interleaved: the refusals do not disturb the developer
            for host in ("attacker.example", f"attacker.example:{open_gw.port}", "127.0.0.1.attacker.example",
                         "localhost.attacker.example", "local host", "user@localhost"):
                r = c.get("/topics", headers={"Host": host})
                assert r.status_code == 421, (host, r.status_code, r.text)
                assert r.json()["error_code"] == 42101 and "GATEWAY_ALLOWED_HOSTS" in r.json()["message"]
                assert r.headers["content-type"].startswith("application/vnd.kafka.v2+json")
            # creating an instance (what a rebinding page would do) is refused before anything happens
            r = c.post("/consumers/rebind-g", headers={**V2, "Host": "attacker.example"}, json={"name": "evil"})
            assert r.status_code == 421
            for host in (f"localhost:{open_gw.port}", "localhost", f"127.0.0.1:{open_gw.port}",
                         f"LOCALHOST:{open_gw.port}", f"[::1]:{open_gw.port}"):
                r = c.get("/topics", headers={"Host": host})
                assert r.status_code == 200, (host, r.text)
        # the refused create left nothing behind: the same name is free for the developer
        r = c.post("/consumers/rebind-g", headers={**V2, "Host": f"localhost:{open_gw.port}"}, json={"name": "evil"})
        assert r.status_code == 200, r.text
        assert r.json()["base_uri"].startswith(f"http://localhost:{open_gw.port}/")
        assert c.delete(r.json()["base_uri"].removeprefix(f"http://localhost:{open_gw.port}"),
                        headers={**V2, "Host": f"localhost:{open_gw.port}"}).status_code == 204
        # probes keep working whatever Host they send (Kubernetes sends the pod address)
        assert c.get("/healthz", headers={"Host": "10.1.2.3:8080"}).status_code == 200
        # v3 answers its errors as application/json
        r = c.get("/v3/clusters", headers={"Host": "attacker.example"})
        assert r.status_code == 421 and r.headers["content-type"].startswith("application/json")


def test_explicit_bind_and_allowed_hosts(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    """A container sets GATEWAY_HOST=0.0.0.0 (explicit wins); the Host check still holds, and
    GATEWAY_ALLOWED_HOSTS replaces the default list."""
    g = start(tansu, tmp_path / "gw.log", GATEWAY_HOST="0.0.0.0", GATEWAY_ALLOWED_HOSTS="gw.example.com,.corp.example")
    try:
        assert listen_addresses(g.port) == {"00000000"}
        with httpx.Client(base_url=g.url, timeout=10) as c:
            assert c.get("/topics", headers={"Host": "attacker.example"}).status_code == 421
            assert c.get("/topics", headers={"Host": f"localhost:{g.port}"}).status_code == 421  # not listed
            for host in ("gw.example.com", f"gw.example.com:{g.port}", "a.corp.example", "corp.example:443"):
                assert c.get("/topics", headers={"Host": host}).status_code == 200, host
    finally:
        g.stop()


def test_tenants_mode_checks_host_only_when_configured(tansu: EmbeddedBroker, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f'version: 1\ntenants:\n  - id: t\n'
                       f'    api_keys: ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]\n')
    auth = {"X-API-Key": KEY}
    g = start(tansu, tmp_path / "gw.log", GATEWAY_TENANTS_FILE=str(tenants))
    try:  # authenticated: no Host check by default (behind an ingress the Host is the public name)
        assert httpx.get(f"{g.url}/topics", headers={**auth, "Host": "kafka-gw.example.com"},
                         timeout=10).status_code == 200
    finally:
        g.stop()
    g = start(tansu, tmp_path / "gw2.log", GATEWAY_TENANTS_FILE=str(tenants),
              GATEWAY_ALLOWED_HOSTS="kafka-gw.example.com")
    try:
        r = httpx.get(f"{g.url}/topics", headers={**auth, "Host": "attacker.example"}, timeout=10)
        assert r.status_code == 421 and r.json()["error_code"] == 42101
        assert httpx.get(f"{g.url}/topics", headers={**auth, "Host": "kafka-gw.example.com"},
                         timeout=10).status_code == 200
    finally:
        g.stop()
