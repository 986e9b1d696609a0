"""TLS between replicas (forwarded requests carry the peer token and client credentials).

Replicas a and b serve HTTPS with certificates of one CA (named ``replicas.kcg.test``, which every replica
verifies through GATEWAY_PEER_TLS_SERVER_NAME, as GATEWAY_PEER_DNS discovery does with the headless Service's
name). A consumer instance created through a that lives on b is served through a over TLS. b's listener
refuses plain HTTP. Two intruders are listed among a's peers: one with a certificate of another CA and one
that speaks plain HTTP; neither enters a's routing ring nor receives a forwarded request, and a logs each
once. A replica that trusts only the other CA cannot reach a or b: an instance b holds is not found
through it. Inconsistent TLS settings refuse to start.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from prometheus_client import CollectorRegistry

from api.replicas import Router
from service.embedded.tansu import EmbeddedBroker, free_port
from service.ring import owner, routing_key
from service.settings import Settings
from tests.integration.gateway_proc import FAST_ENV, GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TOKEN = "peer-token-for-the-peer-tls-tests-0123"
NAME = "replicas.kcg.test"
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
SERVED_BY = "x-kcg-served-by"
GROUP = "tls-group"
TLS_ERROR = "failed the TLS handshake"
HANDSHAKE_S = 2.0  # replica b's GATEWAY_HTTP_HEADER_TIMEOUT_S, which also bounds TLS handshakes


class TlsGateway(GatewayProcess):
    """A gateway process whose listener serves HTTPS (its health check verifies the certificate)."""

    def __init__(self, bootstrap: str, verify: ssl.SSLContext | bool, log_file: Path, env: dict[str, str],
                 tls: bool = True) -> None:
        super().__init__(bootstrap, env=env, log_file=log_file)
        self.verify = verify
        if tls:
            self.url = f"https://127.0.0.1:{self.port}"

    def wait_healthy(self) -> None:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start (exit {self.proc.poll()}); see {self.log_file}")
            time.sleep(0.05)  # waiting for an external process to bind its port

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, verify=self.verify, timeout=30, **kw)

    def peers(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/internal/peers", headers={"x-kcg-peer-token": TOKEN}, verify=self.verify)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


    def after_refreshes(self, count: int) -> dict[str, Any]:
        """The peer table once ``count`` more peer refreshes have run."""
        start = self.peers()["refreshes"]
        deadline = time.monotonic() + 30
        while (table := self.peers())["refreshes"] < start + count:
            assert time.monotonic() < deadline, table
            time.sleep(0.05)  # polling a condition: the peer refresh runs every 0.2 s
        return table


class Certs:
    def __init__(self, d: Path) -> None:
        self.ca, self.evil = trustme.CA(), trustme.CA()
        self.ca_file, self.evil_file = d / "ca.pem", d / "evil-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.evil.cert_pem.write_to_path(str(self.evil_file))
        self.files: dict[str, tuple[Path, Path]] = {}
        for who, ca in (("good", self.ca), ("evil", self.evil)):
            # the replicas' shared name, and 127.0.0.1 for this test's own clients
            cert = ca.issue_cert(NAME, "127.0.0.1")
            chain, key = d / f"{who}-chain.pem", d / f"{who}-key.pem"
            chain.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
            cert.private_key_pem.write_to_path(str(key))
            self.files[who] = (chain, key)

    def context(self, ca: trustme.CA) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        return ctx


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("peer-tls-certs"))


def tls_env(certs: Certs, who: str, ca_file: Path) -> dict[str, str]:
    chain, key = certs.files[who]
    return {"GATEWAY_TLS_CERT_FILE": str(chain), "GATEWAY_TLS_KEY_FILE": str(key),
            "GATEWAY_PEER_TLS_CA_FILE": str(ca_file), "GATEWAY_PEER_TLS_SERVER_NAME": NAME}


@pytest.fixture(scope="module")
def replicas(tansu: EmbeddedBroker, certs: Certs, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, TlsGateway]]:
    d = tmp_path_factory.mktemp("peer-tls")
    good, evil = certs.context(certs.ca), certs.context(certs.evil)
    common = {"GATEWAY_PEER_REFRESH_S": "0.2", "GATEWAY_PEER_TOKEN": TOKEN, "GATEWAY_AUTO_CREATE_TOPICS": "true",
              "GATEWAY_LOG_LEVEL": "info"}
    procs = {
        "a": TlsGateway(tansu.bootstrap, good, d / "gw-a.log", {**common, **tls_env(certs, "good", certs.ca_file)}),
        "b": TlsGateway(tansu.bootstrap, good, d / "gw-b.log", {**common, **tls_env(certs, "good", certs.ca_file)}),
        # an intruder with a certificate of another CA, for the same name
        "m": TlsGateway(tansu.bootstrap, evil, d / "gw-m.log", {**common, **tls_env(certs, "evil", certs.evil_file)}),
        # an intruder that speaks plain HTTP
        "p": TlsGateway(tansu.bootstrap, False, d / "gw-p.log", dict(common), tls=False),
    }
    port = {rid: p.port for rid, p in procs.items()}
    https = {rid: f"https://127.0.0.1:{port[rid]}" for rid in procs}
    for rid, p in procs.items():
        p.env["GATEWAY_REPLICA_ID"] = rid
    procs["a"].env["GATEWAY_PEERS"] = ",".join(https[r] for r in "abmp")
    procs["b"].env["GATEWAY_PEERS"] = ",".join(https[r] for r in "ab")
    procs["b"].env["GATEWAY_HTTP_HEADER_TIMEOUT_S"] = str(HANDSHAKE_S)
    procs["m"].env["GATEWAY_PEERS"] = ",".join(https[r] for r in "abm")  # trusts only the other CA
    procs["p"].env["GATEWAY_PEERS"] = procs["p"].url
    for p in procs.values():
        p.launch()
    try:
        for p in procs.values():
            p.wait_healthy()
        deadline = time.monotonic() + 30
        for rid, want in (("a", ["a", "b"]), ("b", ["a", "b"])):
            while procs[rid].peers()["placement"] != want:
                assert time.monotonic() < deadline, procs[rid].peers()
                time.sleep(0.05)  # polling a condition: the peer refresh runs every 0.2 s
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def name_owned_by(rid: str, prefix: str) -> str:
    return next(n for i in range(10_000) if owner(["a", "b"], routing_key(GROUP, n := f"{prefix}{i}")) == rid)


async def test_an_instance_on_b_is_served_through_a_over_tls(replicas: dict[str, TlsGateway], topic_name: str
                                                              ) -> None:
    a = replicas["a"]
    name = name_owned_by("b", "tls-inst")
    async with a.client() as via_a:
        assert via_a.base_url.scheme == "https"
        r = await via_a.post(f"/topics/{topic_name}", headers=BINARY,
                             json={"records": [{"value": "aGVsbG8="}, {"value": "d29ybGQ="}]})
        assert r.status_code == 200, r.text
        r = await via_a.post(f"/consumers/{GROUP}", headers=V2,
                             json={"name": name, "format": "binary", "auto.offset.reset": "earliest"})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "b", (r.status_code, r.headers, r.text)
        assert r.json()["base_uri"].startswith(f"{a.url}/consumers/"), r.json()  # the client's scheme: https
        base = f"/consumers/{GROUP}/instances/{name}"
        r = await via_a.post(f"{base}/subscription", headers=V2, json={"topics": [topic_name]})
        assert r.status_code == 204 and r.headers[SERVED_BY] == "b", r.text
        values: list[str] = []
        deadline = time.monotonic() + 30
        while len(values) < 2 and time.monotonic() < deadline:
            r = await via_a.get(f"{base}/records", params={"timeout": 3000},
                                headers={"Accept": "application/vnd.kafka.binary.v2+json"})
            assert r.status_code == 200 and r.headers[SERVED_BY] == "b", r.text
            values += [rec["value"] for rec in r.json()]
        assert values == ["aGVsbG8=", "d29ybGQ="]
        r = await via_a.delete(base, headers=V2)
        assert r.status_code == 204 and r.headers[SERVED_BY] == "b"


def test_the_listener_refuses_plain_http(replicas: dict[str, TlsGateway]) -> None:
    b = replicas["b"]
    with socket.create_connection(("127.0.0.1", b.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
    assert not answer.startswith(b"HTTP/"), answer
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{b.port}/healthz", timeout=5)
    # and a client that does not trust the replicas' CA gets no answer either
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{b.url}/healthz", timeout=5, verify=replicas["m"].verify)


def read_log(g: TlsGateway) -> str:
    assert g.log_file is not None
    return g.log_file.read_text()


def test_connections_that_never_finish_a_handshake_are_dropped(replicas: dict[str, TlsGateway]) -> None:
    """A TLS slow-loris: connections that never send a ClientHello are closed after the header timeout (the
    event loops' default handshake timeout is 60 s), while other clients are served."""
    b = replicas["b"]
    idle = [socket.create_connection(("127.0.0.1", b.port), timeout=HANDSHAKE_S * 5) for _ in range(20)]
    try:
        started = time.monotonic()
        assert httpx.get(f"{b.url}/healthz", timeout=5, verify=b.verify).status_code == 200
        for s in idle:
            try:
                data = s.recv(1)  # blocks until the server closes the connection (TimeoutError: it did not)
            except ConnectionResetError:
                data = b""
            assert data == b""
        assert time.monotonic() - started < HANDSHAKE_S * 3
    finally:
        for s in idle:
            s.close()


async def consumer_requests(g: TlsGateway) -> float:
    """Consumer requests (any status, forwarded ones included) replica ``g`` answered."""
    async with g.client() as c:
        text = (await c.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kcg_http_request_duration_seconds_count{") and "/consumers" in line)


async def test_untrusted_and_plaintext_peers_stay_out_of_the_ring(replicas: dict[str, TlsGateway]) -> None:
    a, m, p = replicas["a"], replicas["m"], replicas["p"]
    # five refreshes later: a still places on a and b only, and has logged each intruder once
    table = a.after_refreshes(5)
    assert table["placement"] == ["a", "b"], table
    assert {peer["replica_id"] for peer in table["peers"]} == {"b"}, table
    log = read_log(a)
    for intruder in (m, p):
        lines = [line for line in log.splitlines() if TLS_ERROR in line and f"127.0.0.1:{intruder.port}" in line]
        assert len(lines) == 1, (intruder.url, lines)
    # names the intruders would own in a ring with them: created through a, all placed on a or b
    before = [await consumer_requests(g) for g in (m, p)]
    async with a.client() as via_a:
        for i in range(12):
            name = next(n for j in range(10_000) if owner(["a", "b", "m", "p"],
                                                          routing_key(GROUP, n := f"intr{i}-{j}")) in ("m", "p"))
            r = await via_a.post(f"/consumers/{GROUP}", headers=V2, json={"name": name, "format": "binary"})
            assert r.status_code == 200, r.text
            assert r.headers.get(SERVED_BY, "a") in ("a", "b"), r.headers
            r = await via_a.get(f"/consumers/{GROUP}/instances/{name}/subscription")
            assert r.status_code == 200, r.text
            r = await via_a.delete(f"/consumers/{GROUP}/instances/{name}", headers=V2)
            assert r.status_code == 204, r.text
    # nothing reached the intruders (no forwarded request; the lookups go to live peers only)
    assert [await consumer_requests(g) for g in (m, p)] == before


async def test_a_replica_with_the_wrong_ca_cannot_reach_the_others(replicas: dict[str, TlsGateway]) -> None:
    a, m = replicas["a"], replicas["m"]
    assert m.peers()["placement"] == ["m"], m.peers()
    name = name_owned_by("b", "wrong-ca")
    async with a.client() as via_a:
        r = await via_a.post(f"/consumers/{GROUP}", headers=V2, json={"name": name, "format": "binary"})
        assert r.status_code == 200 and r.headers[SERVED_BY] == "b", r.text
        try:
            async with m.client() as via_m:
                r = await via_m.get(f"/consumers/{GROUP}/instances/{name}/subscription")
                assert r.status_code == 404 and r.json()["error_code"] == 40403, r.text
                assert SERVED_BY not in r.headers
            assert TLS_ERROR in read_log(m)
        finally:
            await via_a.delete(f"/consumers/{GROUP}/instances/{name}", headers=V2)


async def test_discovered_peers_are_https_and_verified_against_the_dns_name(certs: Certs) -> None:
    """GATEWAY_PEER_DNS (the chart's headless Service) resolves to addresses: with peer TLS they are https URLs
    whose certificates must name the DNS host (no per-pod IP in any certificate)."""
    gateway = types.SimpleNamespace(replica_id="r0", max_poll_timeout=30.0, draining=False, name_placement=None)
    settings = Settings(peer_dns="localhost:8443", peer_token=TOKEN, peer_tls_ca_file=str(certs.ca_file),
                        peers="https://10.1.2.3:8443,10.1.2.4:8443")
    router = Router(settings, gateway, CollectorRegistry())  # type: ignore[arg-type]
    urls = await router.targets()
    discovered = [u for u in urls if u not in router.static_urls]
    assert router.static_urls == ["https://10.1.2.3:8443", "https://10.1.2.4:8443"]  # no scheme: https
    assert discovered and all(u.startswith("https://") for u in discovered), urls
    assert {router.server_name(u) for u in discovered} == {"localhost"}
    assert {router.server_name(u) for u in router.static_urls} == {None}  # the URL's own host
    assert router.pool._server_name is not None and router.pool._server_name(discovered[0]) == "localhost"
    named = Router(settings.model_copy(update={"peer_tls_server_name": NAME}), gateway,  # type: ignore[arg-type]
                   CollectorRegistry())
    assert named.server_name("https://10.1.2.3:8443") == NAME
    # without peer TLS everything stays http
    plain = Router(Settings(peer_dns="localhost:8080", peer_token=TOKEN), gateway,  # type: ignore[arg-type]
                   CollectorRegistry())
    assert all(u.startswith("http://") for u in await plain.targets())


@pytest.mark.parametrize("case", ["cert without key", "key without cert", "unreadable cert", "garbage key",
                                  "unreadable CA", "plain http peer"])
def test_inconsistent_tls_settings_refuse_to_start(tansu: EmbeddedBroker, certs: Certs, tmp_path: Path,
                                                   case: str) -> None:
    chain, key = certs.files["good"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem file\n")
    port = free_port()
    env = {**os.environ, **FAST_ENV, "GATEWAY_KAFKA_BOOTSTRAP": tansu.bootstrap, "GATEWAY_PORT": str(port),
           "GATEWAY_PEER_TOKEN": TOKEN}
    setting, extra = {
        "cert without key": ("GATEWAY_TLS_KEY_FILE", {"GATEWAY_TLS_CERT_FILE": str(chain)}),
        "key without cert": ("GATEWAY_TLS_CERT_FILE", {"GATEWAY_TLS_KEY_FILE": str(key)}),
        "unreadable cert": ("GATEWAY_TLS_CERT_FILE", {"GATEWAY_TLS_CERT_FILE": str(tmp_path / "missing.pem"),
                                                      "GATEWAY_TLS_KEY_FILE": str(key)}),
        "garbage key": ("GATEWAY_TLS_KEY_FILE", {"GATEWAY_TLS_CERT_FILE": str(chain),
                                                 "GATEWAY_TLS_KEY_FILE": str(garbage)}),
        "unreadable CA": ("GATEWAY_PEER_TLS_CA_FILE", {"GATEWAY_PEER_TLS_CA_FILE": str(garbage),
                                                       "GATEWAY_PEERS": f"https://127.0.0.1:{port}"}),
        "plain http peer": ("GATEWAY_PEERS", {"GATEWAY_PEER_TLS_CA_FILE": str(certs.ca_file),
                                              "GATEWAY_PEERS": f"https://127.0.0.1:{port},http://127.0.0.1:1"}),
    }[case]
    for k in ("GATEWAY_TLS_CERT_FILE", "GATEWAY_TLS_KEY_FILE", "GATEWAY_PEER_TLS_CA_FILE", "GATEWAY_PEERS",
              "GATEWAY_PEER_DNS"):
        env.pop(k, None)
    env.update(extra)
    done = subprocess.run([sys.executable, "-m", "gateway"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2, done
    assert b"refusing to start" in done.stderr and setting.encode() in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr, done.stderr
