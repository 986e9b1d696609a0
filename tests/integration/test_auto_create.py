"""Produce to a missing topic, against Tansu: 404/40401 and nothing created by default (external brokers),
or, with ``GATEWAY_AUTO_CREATE_TOPICS`` on (the default of ``make run``'s embedded broker), the topic is
created with ``GATEWAY_AUTO_CREATE_PARTITIONS`` partitions and the records are written; tenant patterns
(with a tenants file: its ``admin_topics``) and Kafka's topic-name rules still apply. Tansu creates a missing topic (4
partitions) for a Metadata request that allows auto-creation: the topic listings here prove the gateway's requests never
do."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.client.client import KafkaClient
from service.protocol import messages as M
from service.settings import Settings
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
HB = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
KEY = "auto-create-tenant-key-1"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


async def topics_on_broker(bclient: KafkaClient) -> dict[str, int]:
    """Every topic of the broker with its partition count (a full listing: it cannot create anything)."""
    resp = await bclient.send_any(M.MetadataRequest(topics=None, allow_auto_topic_creation=False))
    return {t.name: len(t.partitions) for t in resp.topics if t.error_code == 0}


async def read_values(http: httpx.AsyncClient, topic: str, partitions: int, n: int) -> list[bytes]:
    """The values of ``n`` records of ``topic``, read through the gateway (assign + seek to the beginning)."""
    group = f"g-{topic}"
    r = await http.post(f"/consumers/{group}", json={"format": "binary", "auto.offset.reset": "earliest"},
                        headers={"Content-Type": V2})
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
    parts = {"partitions": [{"topic": topic, "partition": p} for p in range(partitions)]}
    assert (await http.post(f"{base}/assignments", json=parts, headers={"Content-Type": V2})).status_code == 204
    got: list[bytes] = []
    for _ in range(30):
        if len(got) >= n:
            break
        r = await http.get(f"{base}/records", params={"timeout": 1000},
                           headers={"Accept": "application/vnd.kafka.binary.v2+json"})
        assert r.status_code == 200, r.text
        got += [base64.b64decode(x["value"]) for x in r.json()]
    await http.delete(base)
    return sorted(got)


@pytest.fixture(scope="module")
def gw_off(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "off.log") as g:
        yield g


@pytest.fixture(scope="module")
def gw_on(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp(f"gw-{broker.name}")
    (d / "tenants.yaml").write_text(f"""
version: 1
tenants:
  - id: writer
    api_keys: ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]
    topics: ["w-*"]
    admin_topics: ["w-auto-*"]
""")
    env = {"GATEWAY_AUTO_CREATE_TOPICS": "true", "GATEWAY_AUTO_CREATE_PARTITIONS": "3",
           "GATEWAY_AUTO_CREATE_REPLICATION_FACTOR": "1",
           # a long-lived topic cache: a listing cached before an auto-create must still show the new topic
           "GATEWAY_TOPIC_METADATA_TTL_S": "60"}
    with GatewayProcess(broker.bootstrap, env=env, log_file=d / "on.log") as g, \
            GatewayProcess(broker.bootstrap, env={**env, "GATEWAY_TENANTS_FILE": str(d / "tenants.yaml")},
                           log_file=d / "on-tenants.log") as tenants:
        g.tenant_url = tenants.url  # type: ignore[attr-defined]
        yield g


def test_the_setting_defaults_on_only_for_the_embedded_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GATEWAY_AUTO_CREATE_TOPICS", "GATEWAY_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)
    assert Settings().auto_create_topics_enabled() is True  # make run: the embedded Tansu broker
    monkeypatch.setenv("GATEWAY_KAFKA_BOOTSTRAP", "kafka:9092")
    assert Settings().auto_create_topics_enabled() is False
    monkeypatch.setenv("GATEWAY_AUTO_CREATE_TOPICS", "true")
    assert Settings().auto_create_topics_enabled() is True
    monkeypatch.delenv("GATEWAY_KAFKA_BOOTSTRAP")
    monkeypatch.setenv("GATEWAY_AUTO_CREATE_TOPICS", "false")
    assert Settings().auto_create_topics_enabled() is False
    s = Settings()
    assert (s.auto_create_partitions, s.auto_create_replication_factor) == (1, -1)


async def test_off_a_missing_topic_is_404_and_is_not_created(gw_off: GatewayProcess, bclient: KafkaClient,
                                                             topic_name: str) -> None:
    body = {"records": [{"value": b64(b"lost")}]}
    async with httpx.AsyncClient(base_url=gw_off.url, timeout=30) as http:
        for path in (f"/topics/{topic_name}", f"/topics/{topic_name}/partitions/0"):
            r = await http.post(path, json=body, headers=HB)
            assert r.status_code == 404 and r.json() == {"error_code": 40401,
                                                         "message": f"topic {topic_name!r} not found"}
        assert topic_name not in await topics_on_broker(bclient)  # not even Tansu's 4-partition auto-creation
        await bclient.create_topics({topic_name: 1})
        r = await http.post(f"/topics/{topic_name}", json=body, headers=HB)  # it exists now: written
        assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 0, r.text


async def test_on_a_missing_topic_is_created_with_the_configured_partitions(
        gw_on: GatewayProcess, bclient: KafkaClient, topic_name: str) -> None:
    assert topic_name not in await topics_on_broker(bclient)
    records = [{"value": b64(f"v{i}".encode()), "partition": i % 3} for i in range(6)]
    async with httpx.AsyncClient(base_url=gw_on.url, timeout=30) as http:
        r = await http.post(f"/topics/{topic_name}", json={"records": records}, headers=HB)
        assert r.status_code == 200, r.text
        offsets = r.json()["offsets"]
        assert [(o["partition"], o["offset"], o["error_code"]) for o in offsets] == [
            (0, 0, None), (1, 0, None), (2, 0, None), (0, 1, None), (1, 1, None), (2, 1, None)]
        assert (await topics_on_broker(bclient))[topic_name] == 3
        assert await read_values(http, topic_name, 3, 6) == [f"v{i}".encode() for i in range(6)]
        # the partition route creates too; a partition beyond the configured count is still 404/40402
        r = await http.post(f"/topics/{topic_name}-p/partitions/2", json={"records": records[:1]}, headers=HB)
        assert r.status_code == 200 and r.json()["offsets"][0]["partition"] == 2, r.text
        r = await http.post(f"/topics/{topic_name}-q/partitions/7", json={"records": records[:1]}, headers=HB)
        assert r.status_code == 404 and r.json()["error_code"] == 40402, r.text
        assert (await topics_on_broker(bclient))[f"{topic_name}-q"] == 3


async def test_on_a_created_topic_is_listed_at_once(gw_on: GatewayProcess, topic_name: str) -> None:
    """The tenant's topic cache forgets its listing when produce creates a topic (v2 and v3 produce)."""
    async with httpx.AsyncClient(base_url=gw_on.url, timeout=30) as http:
        r = await http.get("/topics")
        assert r.status_code == 200 and topic_name not in r.json()  # cached now, for 60 s
        r = await http.post(f"/topics/{topic_name}", json={"records": [{"value": b64(b"x")}]}, headers=HB)
        assert r.status_code == 200, r.text
        assert topic_name in (await http.get("/topics")).json()
        cluster = (await http.get("/v3/clusters")).json()["data"][0]["cluster_id"]
        r = await http.post(f"/v3/clusters/{cluster}/topics/{topic_name}-v3/records",
                            json={"value": {"type": "STRING", "data": "x"}})
        assert r.status_code == 200 and r.json()["error_code"] == 200, r.text
        assert f"{topic_name}-v3" in (await http.get("/topics")).json()


async def test_on_concurrent_producers_of_a_missing_topic_all_succeed(gw_on: GatewayProcess, bclient: KafkaClient,
                                                                      topic_name: str) -> None:
    async with httpx.AsyncClient(base_url=gw_on.url, timeout=30) as http:
        rs = await asyncio.gather(*(
            http.post(f"/topics/{topic_name}", json={"records": [{"value": b64(b"%d" % i)}]}, headers=HB)
            for i in range(8)))
        assert [r.status_code for r in rs] == [200] * 8, [r.text for r in rs]
        assert all(r.json()["offsets"][0]["error_code"] is None for r in rs)
        assert (await topics_on_broker(bclient))[topic_name] == 3
        assert await read_values(http, topic_name, 3, 8) == sorted(b"%d" % i for i in range(8))


@pytest.mark.parametrize(("name", "legal"), [("%2E", False), ("%2E%2E", False), ("bad%20name", False),
                                             ("x" * 250, False), ("a%5Bb%5D", False), ("__internal", True)])
async def test_on_illegal_or_internal_names_are_never_created(gw_on: GatewayProcess, bclient: KafkaClient,
                                                              name: str, legal: bool) -> None:
    before = await topics_on_broker(bclient)
    async with httpx.AsyncClient(base_url=gw_on.url, timeout=30) as http:
        r = await http.post(f"/topics/{name}", json={"records": [{"value": "eA=="}]}, headers=HB)
    if name.startswith("__"):  # an internal topic: denied to every tenant before Kafka's rules
        assert r.status_code == 403 and r.json()["error_code"] == 40301 and "internal topic" in r.text, r.text
    else:
        assert r.status_code == 404 and r.json()["error_code"] == 40401, r.text
        assert ("not a legal Kafka topic name" in r.json()["message"]) is not legal, r.text
    assert await topics_on_broker(bclient) == before


async def test_on_tenant_patterns_decide_which_topics_may_be_created(gw_on: GatewayProcess, bclient: KafkaClient,
                                                                     topic_name: str) -> None:
    url: Any = gw_on.tenant_url  # type: ignore[attr-defined]
    auth = {**HB, "Authorization": f"Bearer {KEY}"}
    body = {"records": [{"value": "eA=="}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post(f"/topics/other-{topic_name}", json=body, headers=auth)
        assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text
        r = await http.post(f"/topics/w-{topic_name}", json=body, headers=HB)  # no credentials
        assert r.status_code == 401 and r.json()["error_code"] == 40101, r.text
        topics = await topics_on_broker(bclient)
        assert f"other-{topic_name}" not in topics and f"w-{topic_name}" not in topics
        # creating a topic is topic administration: a topic the tenant may write but not administer is not
        # created (as with auto-creation off), one of its admin_topics is
        r = await http.post(f"/topics/w-{topic_name}", json=body, headers=auth)
        assert r.status_code == 404 and r.json()["error_code"] == 40401 and "admin_topics" in r.text, r.text
        cluster = (await http.get("/v3/clusters", headers=auth)).json()["data"][0]["cluster_id"]
        r = await http.post(f"/v3/clusters/{cluster}/topics/w-{topic_name}/records", headers=auth,
                            json={"value": {"type": "STRING", "data": "x"}})
        assert r.status_code == 200 and r.json()["error_code"] == 40401 and "admin_topics" in r.text, r.text
        assert f"w-{topic_name}" not in await topics_on_broker(bclient)
        r = await http.post(f"/topics/w-auto-{topic_name}", json=body, headers=auth)
        assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] is None, r.text
    assert (await topics_on_broker(bclient))[f"w-auto-{topic_name}"] == 3
