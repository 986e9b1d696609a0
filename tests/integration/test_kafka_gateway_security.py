"""The gateway reaching Apache Kafka's own SASL and TLS listeners, one tenant per listener and mechanism.

One dedicated broker (SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; SSL asking for client
certificates; SASL_SSL) and one gateway process with a tenants file: each tenant produces, consumes, commits and
reads its committed offsets over HTTP through its own listener, every record counted. Tenants with a wrong password,
a CA that did not sign the broker's certificate, a SCRAM mechanism their user has no credentials for, or a client
certificate from a foreign CA get a JSON error promptly, and the other tenants keep working beside them.
Kafka only: Tansu has neither SASL nor TLS (test_kafka_security.py checks the same listeners with our client alone).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import yaml

from service.client.client import KafkaClient
from service.embedded.kafka import BrokerTls, EmbeddedKafka
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
H = {"Content-Type": "application/vnd.kafka.v2+json"}
JSN = "application/vnd.kafka.json.v2+json"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
#: a user the PLAIN login module knows but who has no SCRAM credentials
PLAIN_ONLY = ("carol", "carol-secret")
N = 12  # records per tenant and round
ADMIN = "admin-token-of-the-security-test"

#: tenant id -> (listener, its kafka section without bootstrap)
GOOD: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("sasl", {"security_protocol": "SASL_PLAINTEXT",
                       "sasl": {"mechanism": "PLAIN", "username": "alice", "password_env": "KCG_T_ALICE"}}),
    "scram256": ("sasl", {"security_protocol": "SASL_PLAINTEXT",
                          "sasl": {"mechanism": "SCRAM-SHA-256", "username": "bob", "password_file": "bob.pw"}}),
    "scram512": ("sasl", {"security_protocol": "SASL_PLAINTEXT",
                          "sasl": {"mechanism": "SCRAM-SHA-512", "username": "alice", "password_env": "KCG_T_ALICE"}}),
    "tls": ("ssl", {"security_protocol": "SSL", "tls": {"cafile": "ca.pem"}}),
    "mtls": ("ssl", {"security_protocol": "SSL",
                     "tls": {"cafile": "ca.pem", "certfile": "client-cert.pem", "keyfile": "client-key.pem"}}),
    "saslssl": ("sasl_ssl", {"security_protocol": "SASL_SSL", "tls": {"cafile": "ca.pem"},
                             "sasl": {"mechanism": "SCRAM-SHA-512", "username": "bob", "password_file": "bob.pw"}}),
}
BAD: dict[str, tuple[str, dict[str, Any]]] = {
    "badpassword": ("sasl", {"security_protocol": "SASL_PLAINTEXT",
                             "sasl": {"mechanism": "SCRAM-SHA-256", "username": "alice",
                                      "password_file": "bob.pw"}}),
    "badca": ("sasl_ssl", {"security_protocol": "SASL_SSL", "tls": {"cafile": "other-ca.pem"},
                           "sasl": {"mechanism": "PLAIN", "username": "alice", "password_env": "KCG_T_ALICE"}}),
    "noscram": ("sasl", {"security_protocol": "SASL_PLAINTEXT",
                         "sasl": {"mechanism": "SCRAM-SHA-256", "username": PLAIN_ONLY[0],
                                  "password_env": "KCG_T_CAROL"}}),
    "foreigncert": ("ssl", {"security_protocol": "SSL",
                            "tls": {"cafile": "ca.pem", "certfile": "foreign-client.pem"}}),
}


def key(tenant: str) -> str:
    return f"key-of-{tenant}-0123456789"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA, the broker's certificate, a client certificate, another CA and a client certificate it signed."""
    d = tmp_path_factory.mktemp("gw-kafka-tls")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gateway-tenant-mtls")
    ca.cert_pem.write_to_path(d / "ca.pem")
    other.cert_pem.write_to_path(d / "other-ca.pem")
    for i, pem in enumerate(server.cert_chain_pems):
        pem.write_to_path(d / "server-cert.pem", append=i > 0)
    server.private_key_pem.write_to_path(d / "server-key.pem")
    for i, pem in enumerate(client.cert_chain_pems):
        pem.write_to_path(d / "client-cert.pem", append=i > 0)
    client.private_key_pem.write_to_path(d / "client-key.pem")
    other.issue_cert("intruder").private_key_and_cert_chain_pem.write_to_path(d / "foreign-client.pem")
    (d / "bob.pw").write_text(USERS["bob"] + "\n")
    return d


@pytest.fixture(scope="module")
def secure_kafka(material: Path) -> Iterator[EmbeddedKafka]:
    """PLAINTEXT (set-up), SASL_PLAINTEXT, SSL (client certificates requested: verified when given) and SASL_SSL."""
    users = {**USERS, PLAIN_ONLY[0]: PLAIN_ONLY[1]}
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            + " ".join(f'user_{u}="{p}"' for u, p in users.items()) + ";")
    k = EmbeddedKafka(sasl_users=USERS, log_file=material / "kafka.log",
                      tls=BrokerTls(certfile=str(material / "server-cert.pem"),
                                    keyfile=str(material / "server-key.pem"), cafile=str(material / "ca.pem"),
                                    client_auth="requested"),
                      # carol: PLAIN only (SCRAM credentials are written for USERS alone)
                      overrides={"listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas})
    k.start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="module")
def gateway(secure_kafka: EmbeddedKafka, material: Path) -> Iterator[GatewayProcess]:
    addresses = {"sasl": secure_kafka.sasl_bootstrap, "ssl": secure_kafka.ssl_bootstrap,
                 "sasl_ssl": secure_kafka.sasl_ssl_bootstrap}
    tenants = [{"id": tid, "api_keys": [sha(key(tid))], "kafka": {"bootstrap": addresses[listener], **kafka}}
               for tid, (listener, kafka) in {**GOOD, **BAD}.items()]
    (material / "tenants.yaml").write_text(yaml.safe_dump({"version": 1, "tenants": tenants}))
    env = {"GATEWAY_TENANTS_FILE": str(material / "tenants.yaml"), "KCG_T_ALICE": USERS["alice"],
           "KCG_T_CAROL": PLAIN_ONLY[1], "GATEWAY_REQUEST_TIMEOUT_MS": "5000", "GATEWAY_ADMIN_TOKEN": ADMIN}
    # the gateway's own bootstrap: the PLAINTEXT listener (every tenant names its own)
    with GatewayProcess(secure_kafka.bootstrap, env=env, log_file=material / "gateway.log") as g:
        yield g
    text = (material / "gateway.log").read_text(errors="replace")
    for secret in (*USERS.values(), PLAIN_ONLY[1]):
        assert secret not in text, "a SASL password reached the gateway's log"


@pytest.fixture
async def http(gateway: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:
        yield c


async def _create_topics(kafka: EmbeddedKafka, names: list[str]) -> None:
    client = KafkaClient(kafka.bootstrap)
    try:
        await client.create_topics({n: 2 for n in names})
    finally:
        await client.close()


def auth(tenant: str) -> dict[str, str]:
    return {**H, "X-API-Key": key(tenant)}


async def round_trip(http: httpx.AsyncClient, tenant: str, topic: str, group: str) -> None:
    """Produce N records, consume them in a new group, commit, read the committed offsets: all N, once each."""
    h = auth(tenant)
    values = [{"tenant": tenant, "i": i} for i in range(N)]
    r = await http.post(f"/topics/{topic}", headers={**h, "Content-Type": JSN},
                        json={"records": [{"key": f"k{i}", "value": v} for i, v in enumerate(values)]})
    assert r.status_code == 200, (tenant, r.text)
    offsets = r.json()["offsets"]
    assert len(offsets) == N and all(o.get("error_code") is None for o in offsets), (tenant, r.text)
    r = await http.post(f"/consumers/{group}", headers=h,
                        json={"name": "c1", "format": "json", "auto.offset.reset": "earliest"})
    assert r.status_code == 200, (tenant, r.text)
    base = f"/consumers/{group}/instances/c1"
    r = await http.post(f"{base}/subscription", headers=h, json={"topics": [topic]})
    assert r.status_code == 204, (tenant, r.text)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < N and time.monotonic() < deadline:
        r = await http.get(f"{base}/records", params={"timeout": 1000}, headers={**h, "Accept": JSN})
        assert r.status_code == 200, (tenant, r.text)
        got += r.json()
    assert sorted(g["value"]["i"] for g in got) == list(range(N)), (tenant, got)
    assert all(g["value"]["tenant"] == tenant and g["topic"] == topic for g in got)
    while True:  # a commit during the first rebalance is refused with 40903: poll, then retry
        r = await http.post(f"{base}/offsets", headers=h)
        if r.status_code == 200:
            break
        assert r.status_code == 409 and r.json()["error_code"] == 40903, (tenant, r.text)
        assert time.monotonic() < deadline, (tenant, r.text)
        r = await http.get(f"{base}/records", params={"timeout": 200}, headers={**h, "Accept": JSN})
        assert r.status_code == 200 and r.json() == [], (tenant, r.text)
    r = await http.request("GET", f"{base}/offsets", headers=h,
                           json={"partitions": [{"topic": topic, "partition": p} for p in (0, 1)]})
    assert r.status_code == 200, (tenant, r.text)
    committed = {o["partition"]: o["offset"] for o in r.json()["offsets"]}
    per_partition = {p: sum(1 for g in got if g["partition"] == p) for p in (0, 1)}
    assert committed == per_partition, (tenant, committed, per_partition)  # offsets from 0: next = count
    assert (await http.delete(base, headers=h)).status_code == 204


async def refused(http: httpx.AsyncClient, tenant: str, topic: str) -> dict[str, Any]:
    """A produce by a tenant Kafka will not let in: a JSON error, well before the client's timeout."""
    t0 = time.monotonic()
    r = await http.post(f"/topics/{topic}", headers={**auth(tenant), "Content-Type": JSN},
                        json={"records": [{"value": {"tenant": tenant}}]})
    assert time.monotonic() - t0 < 30, tenant  # generous: what matters is that it does not hang
    assert r.status_code == 503, (tenant, r.status_code, r.text)
    body = r.json()
    # SASL refused, the broker's certificate not trusted, ours refused: all "cannot authenticate", none a
    # broker that is merely unreachable (the broker's text and address stay in the gateway's log)
    assert body == {"error_code": 50302, "message": "the gateway cannot authenticate to Kafka"}, (tenant, body)
    assert r.headers.get("Retry-After") == "5"
    for secret in (*USERS.values(), PLAIN_ONLY[1]):
        assert secret not in r.text
    # a consumer instance needs no Kafka connection until it subscribes (the topic's metadata): that fails the
    # same way, and the instance is deleted without waiting for Kafka
    h = auth(tenant)
    r = await http.post(f"/consumers/g-{tenant}", headers=h,
                        json={"name": "c1", "format": "json", "auto.offset.reset": "earliest"})
    assert r.status_code == 200, (tenant, r.text)
    base = f"/consumers/g-{tenant}/instances/c1"
    r = await http.post(f"{base}/subscription", headers=h, json={"topics": [topic]})
    assert r.status_code == 503 and r.json() == body, (tenant, r.status_code, r.text)
    assert (await http.delete(base, headers=h)).status_code == 204
    return body


@pytest.mark.parametrize("tenant", list(GOOD))
async def test_tenant_through_its_listener(secure_kafka: EmbeddedKafka, http: httpx.AsyncClient,
                                           tenant: str) -> None:
    topic = f"sec-{tenant}"
    await _create_topics(secure_kafka, [topic])
    await round_trip(http, tenant, topic, f"g-{tenant}")


async def test_refused_tenants_get_json_errors_and_the_others_keep_working(
        secure_kafka: EmbeddedKafka, http: httpx.AsyncClient) -> None:
    topics = {t: f"sec2-{t}" for t in GOOD}
    again = {t: f"sec3-{t}" for t in GOOD}
    await _create_topics(secure_kafka, [*topics.values(), *again.values(), "sec-refused"])
    results = await asyncio.gather(
        *(refused(http, t, "sec-refused") for t in BAD),
        *(round_trip(http, t, topics[t], f"g2-{t}") for t in GOOD))
    messages = dict(zip(BAD, (b["message"] for b in results[:len(BAD)]), strict=True))
    assert all(messages.values()), messages
    # and after the refusals, once more: the failing tenants changed nothing for the others
    for t in BAD:
        await refused(http, t, "sec-refused")
    await asyncio.gather(*(round_trip(http, t, again[t], f"g3-{t}") for t in GOOD))
    # the readiness probe names the refused tenants, and only them (every tenant's brokers must answer it: one
    # refused tenant makes the replica not ready, see docs/runbook.md KcgNotReady)
    r = await http.get("/readyz", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 503, r.text
    assert r.json()["tenants"] == dict.fromkeys(BAD, "the gateway cannot authenticate to Kafka"), r.text
