"""Internal topics (``__*``, ``_schemas``, ``_confluent*``) are denied to every tenant, whatever its
patterns: produce (v2, v3), range reads, subscribe (names and patterns), assign, offsets, v2 and v3 metadata and v3
consumer-group lags. Attacked over real sockets on gateway processes in open mode and with a tenants file whose
tenants have no or permissive topic patterns; a normal topic keeps working for the same tenant throughout.

The module runs its own Tansu broker: it creates ``__consumer_offsets`` and ``_schemas`` (ordinary topics to Tansu)
with records in them, which must not leak into the session broker other tests (Karapace) share."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess, tenants_gateway

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
KEY_OPEN, KEY_STAR = "internal-topics-key-no-patterns-1", "internal-topics-key-star-pattern-2"
DENIED = ("__consumer_offsets", "_schemas", "_confluent-command")
NORMAL = "orders-" + uuid.uuid4().hex[:8]
SECRET = b"another-tenant's-secret"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: no-patterns
    api_keys: ["{sha(KEY_OPEN)}"]
  - id: star
    api_keys: ["{sha(KEY_STAR)}"]
    topics: ["*", "_schemas", "__consumer_offsets"]
"""


@dataclass
class Target:
    """A gateway and the credentials of a tenant on it."""

    url: str
    headers: dict[str, str]


def produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(30) == 0


def commit_raw(bootstrap: str, group: str, topic: str) -> None:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[CKTopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        c.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(log_file=tmp_path_factory.mktemp("internal-tansu") / "tansu.log")
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def seeded(broker: EmbeddedBroker) -> EmbeddedBroker:
    async def create() -> None:
        client = KafkaClient(broker.bootstrap)
        try:
            await client.create_topics({**{t: 1 for t in DENIED}, NORMAL: 1})
        finally:
            await client.close()

    asyncio.run(create())
    for t in (*DENIED, NORMAL):
        produce_raw(broker.bootstrap, t, [SECRET if t != NORMAL else b"normal-0"])
    return broker


@pytest.fixture(scope="module")
def gateways(seeded: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    d = tmp_path_factory.mktemp("internal-topics")
    open_gw = GatewayProcess(seeded.bootstrap, log_file=d / "open.log")
    tenant_gw = tenants_gateway(seeded.bootstrap, TENANTS, Path(d), name="tenants")
    for g in (open_gw, tenant_gw):
        g.launch()
    try:
        for g in (open_gw, tenant_gw):
            g.wait_healthy()
        yield {
            "open": Target(open_gw.url, {}),
            "no-patterns": Target(tenant_gw.url, {"Authorization": f"Bearer {KEY_OPEN}"}),
            "star": Target(tenant_gw.url, {"Authorization": f"Bearer {KEY_STAR}"}),
        }
    finally:
        open_gw.stop()
        tenant_gw.stop()


@pytest.fixture(params=["open", "no-patterns", "star"])
async def client(request: pytest.FixtureRequest, gateways: dict[str, Target]) -> AsyncIterator[httpx.AsyncClient]:
    t = gateways[request.param]
    async with httpx.AsyncClient(base_url=t.url, headers=t.headers, timeout=30) as http:
        yield http


def refused(r: httpx.Response, topic: str | None = None) -> None:
    assert r.status_code == 403, (r.status_code, r.text)
    body = r.json()
    assert body["error_code"] == 40301 and "internal topic" in body["message"], body
    assert topic is None or topic in body["message"], body
    assert SECRET.decode() not in r.text


async def cluster_id(http: httpx.AsyncClient) -> str:
    r = await http.get("/v3/clusters")
    assert r.status_code == 200, r.text
    cid: str = r.json()["data"][0]["cluster_id"]
    return cid


async def normal_still_works(http: httpx.AsyncClient) -> None:
    r = await http.post(f"/topics/{NORMAL}", json={"records": [{"value": "bm9ybWFs"}]}, headers={"Content-Type": BIN})
    assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] is None, r.text
    r = await http.get(f"/topics/{NORMAL}/partitions/0/records", params={"offset": 0}, headers={"Accept": BIN})
    assert r.status_code == 200 and r.json()["records"], r.text


async def test_produce_v2_and_v3_is_refused(client: httpx.AsyncClient) -> None:
    cid = await cluster_id(client)
    for topic in DENIED:
        refused(await client.post(f"/topics/{topic}", json={"records": [{"value": "eA=="}]},
                                  headers={"Content-Type": BIN}), topic)
        refused(await client.post(f"/topics/{topic}/partitions/0", json={"records": [{"value": "eA=="}]},
                                  headers={"Content-Type": BIN}), topic)
        refused(await client.post(f"/v3/clusters/{cid}/topics/{topic}/records",
                                  content=b'{"value":{"type":"STRING","data":"x"}}',
                                  headers={"Content-Type": "application/json"}), topic)
    await normal_still_works(client)


async def test_range_reads_and_v2_metadata_are_refused_or_hidden(client: httpx.AsyncClient) -> None:
    for topic in DENIED:
        refused(await client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0},
                                 headers={"Accept": BIN}), topic)
        for path in ("", "/partitions", "/partitions/0", "/partitions/0/offsets"):
            refused(await client.get(f"/topics/{topic}{path}"), topic)
    r = await client.get("/topics")
    assert r.status_code == 200 and NORMAL in r.json(), r.text
    assert not set(r.json()) & set(DENIED), r.json()
    await normal_still_works(client)


async def test_v3_topics_are_hidden_and_refused(client: httpx.AsyncClient, seeded: EmbeddedBroker) -> None:
    cid = await cluster_id(client)
    base = f"/v3/clusters/{cid}/topics"
    r = await client.get(base)
    names = {t["topic_name"] for t in r.json()["data"]}
    assert r.status_code == 200 and NORMAL in names and not names & set(DENIED), names
    for topic in DENIED:
        for path in ("", "/partitions", "/partitions/0", "/partitions/0/replicas", "/configs",
                     "/configs/cleanup.policy"):
            refused(await client.get(f"{base}/{topic}{path}"), topic)
        refused(await client.delete(f"{base}/{topic}"), topic)
    refused(await client.post(base, json={"topic_name": "_confluent-new", "partitions_count": 1}), "_confluent-new")
    refused(await client.post(base, json={"topic_name": "__new_internal", "validate_only": True}))
    r = await client.get("/v3/clusters/{}/brokers/{}/partition-replicas".format(
        cid, (await client.get(f"/v3/clusters/{cid}/brokers")).json()["data"][0]["broker_id"]))
    assert r.status_code == 200 and not {x["topic_name"] for x in r.json()["data"]} & set(DENIED), r.text
    # nothing was deleted or created on the broker
    kc = KafkaClient(seeded.bootstrap)
    try:
        md = await kc.ensure_metadata(list(DENIED))
        assert all(not md.topic_error(t) for t in DENIED)
        await kc.refresh_metadata()
        assert "_confluent-new" not in kc.metadata.topics and "__new_internal" not in kc.metadata.topics
    finally:
        await kc.close()
    await normal_still_works(client)


async def consumer(http: httpx.AsyncClient, group: str) -> str:
    r = await http.post(f"/consumers/{group}", json={"auto.offset.reset": "earliest", "format": "binary"},
                        headers={"Content-Type": V2})
    assert r.status_code == 200, r.text
    return "/consumers/" + r.json()["base_uri"].split("/consumers/", 1)[1]


async def test_subscribe_assign_and_offsets_are_refused(client: httpx.AsyncClient) -> None:
    base = await consumer(client, f"g-int-{uuid.uuid4().hex[:8]}")
    h = {"Content-Type": V2}
    for topic in DENIED:
        refused(await client.post(f"{base}/subscription", json={"topics": [NORMAL, topic]}, headers=h), topic)
        refused(await client.post(f"{base}/assignments", json={"partitions": [{"topic": topic, "partition": 0}]},
                                  headers=h), topic)
        refused(await client.post(f"{base}/offsets", json={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]},
                                  headers=h), topic)
        refused(await client.request("GET", f"{base}/offsets", json={"partitions": [{"topic": topic, "partition": 0}]},
                                     headers=h), topic)
        refused(await client.get(f"{base}/offsets", params={"topic": topic, "partition": 0}), topic)
    r = await client.get(f"{base}/subscription")
    assert r.status_code == 200 and r.json()["topics"] == [], r.text
    # the same instance still assigns, reads and commits the normal topic
    r = await client.post(f"{base}/assignments", json={"partitions": [{"topic": NORMAL, "partition": 0}]}, headers=h)
    assert r.status_code == 204, r.text
    r = await client.post(f"{base}/offsets", json={"offsets": [{"topic": NORMAL, "partition": 0, "offset": 0}]},
                          headers=h)
    assert r.status_code == 200, r.text
    r = await client.get(f"{base}/offsets", params={"topic": NORMAL, "partition": 0})
    assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 1, r.text
    assert (await client.delete(base)).status_code == 204


@pytest.mark.parametrize("pattern", [".*", "_.*", f"__.*|_schemas|_confluent.*|{NORMAL}"])
async def test_patterns_never_match_internal_topics(client: httpx.AsyncClient, pattern: str) -> None:
    base = await consumer(client, f"g-pat-{uuid.uuid4().hex[:8]}")
    r = await client.post(f"{base}/subscription", json={"topic_pattern": pattern + f"|{NORMAL}"},
                          headers={"Content-Type": V2})
    assert r.status_code == 204, r.text
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(rec["topic"] == NORMAL for rec in got):
        r = await client.get(f"{base}/records", params={"timeout": 1000}, headers={"Accept": BIN})
        assert r.status_code == 200, r.text
        got += r.json()
    # the normal topic's records arrived: the group's assignment (normal and, were it not for the deny-list,
    # internal topics alike, all matched at once) is settled
    assert any(rec["topic"] == NORMAL for rec in got), got
    assert not [rec for rec in got if rec["topic"] in DENIED or base64.b64decode(str(rec["value"])) == SECRET]
    r = await client.get(f"{base}/assignments")
    assigned = {p["topic"] for p in r.json()["partitions"]}
    assert r.status_code == 200 and NORMAL in assigned and not assigned & set(DENIED), r.text
    r = await client.get(f"{base}/subscription")
    assert not set(r.json()["topics"]) & set(DENIED), r.text
    assert (await client.delete(base)).status_code == 204


async def test_v3_group_lags_leave_internal_topics_out(client: httpx.AsyncClient, seeded: EmbeddedBroker) -> None:
    group = f"g-lag-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(commit_raw, seeded.bootstrap, group, "_schemas")
    await asyncio.to_thread(commit_raw, seeded.bootstrap, group, NORMAL)
    cid = await cluster_id(client)
    r = await client.get(f"/v3/clusters/{cid}/consumer-groups/{group}/lags")
    assert r.status_code == 200, r.text
    topics = {x["topic_name"] for x in r.json()["data"]}
    assert NORMAL in topics and not topics & set(DENIED), topics
    refused(await client.get(f"/v3/clusters/{cid}/consumer-groups/{group}/lags/_schemas/partitions/0"), "_schemas")
