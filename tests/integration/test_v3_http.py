"""The v3 clusters/topics/partitions/configs API, black-box against a gateway process and Tansu.

Every answer is checked against the shapes of Confluent's v3 OpenAPI (:func:`tests.v3_shapes.check`);
tenant isolation runs against a second gateway with a tenants file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.v3_shapes import check

pytestmark = pytest.mark.integration
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
# Links Confluent's bodies require whose targets this gateway does not serve (documented in docs/v3.md).
UNSERVED = ("/acls", "/broker-configs", "/reassignment", "/consumer-groups")
BROKER_CONFIGS = re.compile(r"/brokers/[0-9]+/configs$")


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("v3")
    with GatewayProcess(broker.bootstrap, log_file=d / "gw.log") as g:
        yield g


async def cluster(http: httpx.AsyncClient) -> str:
    r = await http.get("/v3/clusters")
    assert r.status_code == 200, r.text
    check(r.json(), "KafkaClusterList")
    assert len(r.json()["data"]) == 1
    cid: str = r.json()["data"][0]["cluster_id"]
    return cid


def error(r: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    # v3 errors are plain JSON, as Confluent's; v2 ones keep Confluent's v2 type
    v3 = r.request.url.path.startswith("/v3/")
    assert r.headers["content-type"] == ("application/json" if v3 else "application/vnd.kafka.v2+json")
    body: dict[str, Any] = r.json()
    assert body["error_code"] == code and isinstance(body["message"], str), body
    return body


async def test_cluster_and_brokers(http: httpx.AsyncClient, gw: GatewayProcess) -> None:
    cid = await cluster(http)
    r = await http.get(f"/v3/clusters/{cid}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    check(body, "KafkaCluster")
    assert body["metadata"] == {"self": f"{gw.url}/v3/clusters/{cid}", "resource_name": f"crn:///kafka={cid}"}
    assert body["topics"]["related"] == f"{gw.url}/v3/clusters/{cid}/topics"
    controller = await http.get(body["controller"]["related"])
    assert controller.status_code == 200
    check(controller.json(), "KafkaBroker")
    brokers = (await http.get(body["brokers"]["related"])).json()
    check(brokers, "KafkaBrokerList")
    assert [b["broker_id"] for b in brokers["data"]] == [controller.json()["broker_id"]]
    assert brokers["data"][0]["port"] == int(gw.env["GATEWAY_KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
    error(await http.get("/v3/clusters/no-such-cluster"), 404, 404)
    error(await http.get("/v3/clusters/no-such-cluster/topics"), 404, 404)
    error(await http.get(f"/v3/clusters/{cid}/brokers/424242"), 404, 404)


async def test_topic_lifecycle(http: httpx.AsyncClient, gw: GatewayProcess, topic_name: str) -> None:
    cid = await cluster(http)
    base = f"/v3/clusters/{cid}/topics"
    # a cached v2 listing first: the create must show through it at once
    assert topic_name not in (await http.get("/topics")).json()
    r = await http.post(base, json={"topic_name": topic_name, "partitions_count": 3, "replication_factor": 1,
                                    "configs": [{"name": "cleanup.policy", "value": "compact"}]})
    assert r.status_code == 201, r.text
    assert r.headers["content-type"] == "application/json"
    created = r.json()
    check(created, "KafkaTopic")
    assert r.headers["location"] == created["metadata"]["self"] == f"{gw.url}{base}/{topic_name}"
    assert (created["topic_name"], created["partitions_count"], created["replication_factor"],
            created["is_internal"]) == (topic_name, 3, 1, False)
    assert created["metadata"]["resource_name"] == f"crn:///kafka={cid}/topic={topic_name}"
    assert topic_name in (await http.get("/topics")).json()
    error(await http.post(base, json={"topic_name": topic_name, "partitions_count": 3}), 400, 40002)

    listing = (await http.get(base)).json()
    check(listing, "KafkaTopicList")
    names = [t["topic_name"] for t in listing["data"]]
    assert topic_name in names and names == sorted(names)
    got = (await http.get(f"{base}/{topic_name}")).json()
    check(got, "KafkaTopic")
    assert got == created

    parts = (await http.get(created["partitions"]["related"])).json()
    check(parts, "KafkaPartitionList")
    assert [p["partition_id"] for p in parts["data"]] == [0, 1, 2]
    for p in parts["data"]:
        one = (await http.get(p["metadata"]["self"])).json()
        check(one, "KafkaPartition")
        assert one == p
        leader = (await http.get(one["leader"]["related"])).json()
        check(leader, "KafkaReplica")
        assert leader["is_leader"] is True and leader["is_in_sync"] is True
        replicas = (await http.get(one["replicas"]["related"])).json()
        check(replicas, "KafkaReplicaList")
        assert leader in replicas["data"]
        broker = await http.get(leader["broker"]["related"])
        assert broker.status_code == 200
    error(await http.get(f"{base}/{topic_name}/partitions/3"), 404, 404)
    error(await http.get(f"{base}/{topic_name}/partitions/0/replicas/424242"), 404, 404)

    configs = (await http.get(created["configs"]["related"])).json()
    check(configs, "KafkaTopicConfigList")
    by_name = {c["name"]: c for c in configs["data"]}
    assert by_name["cleanup.policy"]["value"] == "compact"
    one = (await http.get(by_name["cleanup.policy"]["metadata"]["self"])).json()
    check(one, "KafkaTopicConfig")
    assert one == by_name["cleanup.policy"]
    error(await http.get(f"{base}/{topic_name}/configs/no.such.config"), 404, 404)

    by_broker = (await http.get(f"/v3/clusters/{cid}/brokers/{leader['broker_id']}/partition-replicas")).json()
    check(by_broker, "KafkaReplicaList")
    assert {(r["topic_name"], r["partition_id"]) for r in by_broker["data"]} >= {(topic_name, i) for i in range(3)}

    # produce through v2 into the new topic works at once
    r = await http.post(f"/topics/{topic_name}", json={"records": [{"value": "eA=="}]},
                        headers={"Content-Type": "application/vnd.kafka.binary.v2+json"})
    assert r.status_code == 200, r.text

    r = await http.delete(f"{base}/{topic_name}")
    assert r.status_code == 204 and r.content == b""
    error(await http.get(f"{base}/{topic_name}"), 404, 404)
    assert topic_name not in [t["topic_name"] for t in (await http.get(base)).json()["data"]]
    assert topic_name not in (await http.get("/topics")).json()
    error(await http.get(f"/topics/{topic_name}"), 404, 40401)
    error(await http.delete(f"{base}/{topic_name}"), 404, 404)
    error(await http.get(f"{base}/{topic_name}/partitions"), 404, 404)
    error(await http.get(f"{base}/{topic_name}/configs"), 404, 404)


async def test_every_related_link_is_served(http: httpx.AsyncClient, topic_name: str) -> None:
    """Follow every link of the cluster, topic, partition, replica and broker bodies: each answers 200 with a
    v3 body (except the documented unserved collections)."""
    cid = await cluster(http)
    r = await http.post(f"/v3/clusters/{cid}/topics", json={"topic_name": topic_name, "partitions_count": 1})
    assert r.status_code == 201, r.text
    seen: set[str] = set()
    todo = [f"/v3/clusters/{cid}", r.json()["metadata"]["self"]]
    followed = 0
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        resp = await http.get(url)
        assert resp.status_code == 200, (url, resp.status_code, resp.text)
        body = resp.json()
        check(body, body["kind"])
        followed += 1
        items = body["data"] if "data" in body else [body]
        for item in items:
            if item["kind"] == "KafkaTopic" and item["topic_name"] != topic_name:
                continue  # other tests' topics may go away meanwhile
            todo.append(item["metadata"]["self"])
            for value in item.values():
                if isinstance(value, dict) and "related" in value:
                    link = value["related"]
                    if not link.endswith(UNSERVED) and not BROKER_CONFIGS.search(link):
                        todo.append(link)
    assert followed >= 10


async def test_create_refusals(http: httpx.AsyncClient, topic_name: str) -> None:
    cid = await cluster(http)
    base = f"/v3/clusters/{cid}/topics"
    for name in ("bad[x]", ".", "..", "a" * 250):
        error(await http.post(base, json={"topic_name": name}), 400, 40002)
    error(await http.post(base, json={"topic_name": "__consumer_offsets"}), 403, 40301)  # internal: denied first
    error(await http.post(base, json={"topic_name": topic_name, "partitions_count": 0}), 400, 40002)
    error(await http.post(base, json={"topic_name": topic_name, "replication_factor": 2}), 400, 40002)  # 1 broker
    error(await http.post(base, json={"topic_name": topic_name, "partitions_count": -5}), 422, 42206)
    error(await http.post(base, json={"partitions_count": 1}), 422, 42206)
    error(await http.post(base, content=b"{", headers={"Content-Type": "application/json"}), 400, 40001)
    error(await http.get(f"{base}/bad[x]"), 404, 404)
    # nothing of the above was created
    error(await http.get(f"{base}/{topic_name}"), 404, 404)


async def test_validate_only_creates_nothing(http: httpx.AsyncClient, topic_name: str) -> None:
    cid = await cluster(http)
    base = f"/v3/clusters/{cid}/topics"
    r = await http.post(base, json={"topic_name": topic_name, "partitions_count": 2, "validate_only": True})
    assert r.status_code == 200, r.text
    check(r.json(), "KafkaTopic")
    assert r.json()["partitions_count"] == 2
    error(await http.get(f"{base}/{topic_name}"), 404, 404)
    assert (await http.post(base, json={"topic_name": topic_name, "partitions_count": 2})).status_code == 201
    error(await http.post(base, json={"topic_name": topic_name, "validate_only": True}), 400, 40002)


async def test_default_partitions_and_replication_factor(http: httpx.AsyncClient, topic_name: str) -> None:
    cid = await cluster(http)
    r = await http.post(f"/v3/clusters/{cid}/topics", json={"topic_name": topic_name})
    assert r.status_code == 201, r.text
    got = (await http.get(r.headers["location"])).json()
    assert got["partitions_count"] >= 1 and got["replication_factor"] == 1
    assert r.json()["partitions_count"] == got["partitions_count"]


# -- tenants ------------------------------------------------------------------------------------------------
KEY_A, KEY_B = "v3-key-of-tenant-a", "v3-key-of-tenant-b"


def _sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: tenant-a
    api_keys: ["{_sha(KEY_A)}"]
    topics: ["a-*"]
    admin_topics: ["a-*"]
  - id: tenant-b
    api_keys: ["{_sha(KEY_B)}"]
    topics: ["b-*"]
    admin_topics: ["b-*"]
"""


@pytest.fixture(scope="module")
def gw_tenants(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("v3-tenants")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f)}, log_file=d / "gw.log") as g:
        yield g


@pytest.fixture
async def thttp(gw_tenants: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw_tenants.url, timeout=60) as c:
        yield c


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_tenants_see_and_touch_only_their_topics(thttp: httpx.AsyncClient, topic_name: str) -> None:
    error(await thttp.get("/v3/clusters"), 401, 40101)
    r = await thttp.get("/v3/clusters", headers=auth(KEY_A))
    assert r.status_code == 200, r.text
    cid = r.json()["data"][0]["cluster_id"]
    base = f"/v3/clusters/{cid}/topics"
    a_topic, b_topic = f"a-{topic_name}", f"b-{topic_name}"
    r = await thttp.post(base, json={"topic_name": a_topic, "partitions_count": 2}, headers=auth(KEY_A))
    assert r.status_code == 201, r.text
    error(await thttp.post(base, json={"topic_name": b_topic}, headers=auth(KEY_A)), 403, 40301)
    r = await thttp.post(base, json={"topic_name": b_topic}, headers=auth(KEY_B))
    assert r.status_code == 201, r.text

    a_names = [t["topic_name"] for t in (await thttp.get(base, headers=auth(KEY_A))).json()["data"]]
    b_names = [t["topic_name"] for t in (await thttp.get(base, headers=auth(KEY_B))).json()["data"]]
    assert a_topic in a_names and all(n.startswith("a-") for n in a_names)
    assert b_topic in b_names and all(n.startswith("b-") for n in b_names)
    for path in (f"{base}/{a_topic}", f"{base}/{a_topic}/partitions", f"{base}/{a_topic}/partitions/0",
                 f"{base}/{a_topic}/configs", f"{base}/{a_topic}/partitions/0/replicas"):
        error(await thttp.get(path, headers=auth(KEY_B)), 403, 40301)
        assert (await thttp.get(path, headers=auth(KEY_A))).status_code == 200, path
    error(await thttp.delete(f"{base}/{a_topic}", headers=auth(KEY_B)), 403, 40301)
    error(await thttp.get(f"{base}/b-does-not-exist", headers=auth(KEY_A)), 403, 40301)  # no existence leak
    broker = (await thttp.get(f"/v3/clusters/{cid}/brokers", headers=auth(KEY_B))).json()["data"][0]["broker_id"]
    replicas = (await thttp.get(f"/v3/clusters/{cid}/brokers/{broker}/partition-replicas",
                                headers=auth(KEY_B))).json()["data"]
    assert replicas and all(r["topic_name"].startswith("b-") for r in replicas)
    assert (await thttp.delete(f"{base}/{a_topic}", headers=auth(KEY_A))).status_code == 204
    assert (await thttp.delete(f"{base}/{b_topic}", headers=auth(KEY_B))).status_code == 204
