"""``group.instance.id`` and ``client.id`` of a new consumer instance are validated
(Kafka's legal characters, length bounds: a newline never reaches the broker), and ``client.id`` is put in
the tenant's own namespace ``kcg-<tenant>-<client.id>``, so tenant A cannot pose as tenant B to the
broker (quotas, logs, ACL audit). A real gateway process with two tenants, asked over real sockets; what
the broker sees is read from the protocol-level test broker's request log."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.embedded.tansu import EmbeddedBroker
from service.protocol.messages import ApiKey
from tests.fakes.broker import TestCluster, default_registry
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BIN = {"Accept": "application/vnd.kafka.binary.v2+json"}
KEY_A, KEY_B = "ids-test-key-of-tenant-a-01", "ids-test-key-of-tenant-b-02"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: ida
    api_keys: ["{sha(KEY_A)}"]
    topics: ["ids-*"]
    groups: ["ida-*"]
  - id: idb
    api_keys: ["{sha(KEY_B)}"]
    topics: ["ids-*"]
    groups: ["idb-*"]
"""
A = {**V2, "X-API-Key": KEY_A}
B = {**V2, "X-API-Key": KEY_B}


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("ids")
    (d / "tenants.yaml").write_text(TENANTS)
    g = GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml")})
    g.start()
    try:
        yield g
    finally:
        g.stop()


BAD_INSTANCE_IDS = ["static\n1", "static\r\nINFO forged", "a b", "x" * 250, "", ".", "..", "caf\u00e9", "a/b",
                    "tab\there", "nul\x00"]


@pytest.mark.parametrize("bad", BAD_INSTANCE_IDS, ids=repr)
def test_bad_group_instance_id_is_refused(gw: GatewayProcess, bad: str) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/consumers/ida-g1", headers=A, json={"name": "i1", "group.instance.id": bad})
        assert r.status_code == 422, r.text
        assert r.json()["error_code"] == 42206 and "group.instance.id" in r.json()["message"]
        # nothing was created: the name is free; another tenant is served meanwhile
        assert c.post("/consumers/idb-g1", headers=B, json={"name": "j1"}).status_code == 200
        assert c.delete("/consumers/idb-g1/instances/j1", headers=B).status_code == 204
        r = c.post("/consumers/ida-g1", headers=A, json={"name": "i1", "group.instance.id": "static-1"})
        assert r.status_code == 200, r.text
        assert c.delete("/consumers/ida-g1/instances/i1", headers=A).status_code == 204


@pytest.mark.parametrize("bad", ["kcg-idb-x\n", "a b", "x" * 201, "", "caf\u00e9", "a:b"], ids=repr)
def test_bad_client_id_is_refused(gw: GatewayProcess, bad: str) -> None:
    r = httpx.post(f"{gw.url}/consumers/ida-g2", headers=A, json={"name": "i2", "client.id": bad}, timeout=10)
    assert r.status_code == 422 and r.json()["error_code"] == 42206, r.text


async def test_what_the_broker_sees(tmp_path: Path) -> None:
    """Against the protocol-level test broker (it logs every request with its header): the JoinGroup of an
    instance carries exactly the validated group.instance.id, and the attacker's client.id never reaches the
    broker as another tenant's id."""
    async with TestCluster(topics={"ids-t": 1}, registry=default_registry(groups=True)) as cluster:
        (tmp_path / "tenants.yaml").write_text(TENANTS)
        g = GatewayProcess(cluster.bootstrap_servers, log_file=tmp_path / "gw.log",
                           env={"GATEWAY_TENANTS_FILE": str(tmp_path / "tenants.yaml")})
        await asyncio.to_thread(g.start)  # the broker runs on this loop: never block it
        try:
            async with httpx.AsyncClient(base_url=g.url, timeout=15) as c:
                r = await c.post("/consumers/ida-g3", headers=A, json={"name": "x", "group.instance.id": "ida\nforged"})
                assert r.status_code == 422
                r = await c.post("/consumers/ida-g3", headers=A,
                                 json={"name": "s", "client.id": "kcg-idb-worker", "group.instance.id": "ida-static-1"})
                assert r.status_code == 200, r.text
                base = "/consumers/ida-g3/instances/s"
                assert (await c.post(f"{base}/subscription", headers=A, json={"topics": ["ids-t"]})).status_code == 204
                poll = asyncio.create_task(c.get(f"{base}/records", params={"timeout": 3000}, headers={**A, **BIN}))
                joins = await cluster.wait_for_requests(ApiKey.JOIN_GROUP, timeout=15)
                await poll
                assert (await c.delete(base, headers=A)).status_code == 204
        finally:
            await asyncio.to_thread(g.stop)
    ids = {e.request.group_instance_id for e in cluster.requests(ApiKey.JOIN_GROUP)}
    assert ids == {"ida-static-1"}, ids  # the refused id with a newline never reached the broker
    assert joins and all(not (e.client_id or "").startswith("kcg-idb") for e in cluster.requests())


def test_client_id_is_prefixed_with_the_tenant() -> None:
    """The instance's Kafka client.id (its consumer's logs and the broker-facing identity) is in the
    creating tenant's namespace."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from service.settings import Settings
    from service.tenants import TenantRegistry

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tenants.yaml").write_text(TENANTS)
        settings = Settings(tenants_file=str(Path(d) / "tenants.yaml"), kafka_bootstrap="127.0.0.1:1")
        app = create_app(settings, "127.0.0.1:1")
        assert isinstance(app.state.tenants, TenantRegistry)
        with TestClient(app) as c:
            r = c.post("/consumers/ida-g4", headers=A, json={"name": "s", "client.id": "kcg-idb-worker"})
            assert r.status_code == 200, r.text
            inst = app.state.gateway.tenants["ida"].instances[("ida-g4", "s")]
            assert inst.consumer.config.client_id == "kcg-ida-kcg-idb-worker"
            assert c.delete("/consumers/ida-g4/instances/s", headers=A).status_code == 204
