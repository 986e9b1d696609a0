"""Topic names Kafka forbids (``.``, ``..``, other characters, over 249) are refused everywhere a
topic name enters — produce (v2, v3), range reads, topic metadata (v2, v3), subscribe, assign — without asking the
broker (Tansu accepts them), and nothing is created on the broker. Real sockets, a gateway process in open mode."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
# as sent in a URL path (percent-encoded, so no client or server normalises the dots away) and in a JSON body
ILLEGAL = [("%2E", "."), ("%2E%2E", ".."), ("a%5Bb%5D", "a[b]"), ("x" * 250, "x" * 250)]


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> GatewayProcess:
    d = tmp_path_factory.mktemp("topic-names")
    with GatewayProcess(tansu.bootstrap, log_file=d / "gw.log", env={"GATEWAY_AUTO_CREATE_TOPICS": "true"}) as g:
        yield g  # type: ignore[misc]


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        yield c


def not_found(r: httpx.Response, code: int = 40401) -> None:
    assert r.status_code == 404 and r.json()["error_code"] == code, (r.status_code, r.text)


def refused_in_body(r: httpx.Response) -> None:
    """404/40401 naming Kafka's rule, or 422/42206 for a name longer than the body model's 249 characters."""
    if r.status_code == 422:
        assert r.json()["error_code"] == 42206 and "249" in r.json()["message"], r.text
    else:
        not_found(r)
        assert "not a legal Kafka topic name" in r.json()["message"], r.text


async def broker_topics(kclient: KafkaClient) -> set[str]:
    md = await kclient.refresh_metadata(all_topics=True)
    return set(md.topics)


async def test_illegal_names_are_refused_everywhere(http: httpx.AsyncClient, kclient: KafkaClient,
                                                    topic_name: str) -> None:
    before = await broker_topics(kclient)
    r = await http.get("/v3/clusters")
    cid = r.json()["data"][0]["cluster_id"]
    r = await http.post("/consumers/g-names", json={"format": "binary"}, headers={"Content-Type": V2})
    assert r.status_code == 200, r.text
    base = "/consumers/" + r.json()["base_uri"].split("/consumers/", 1)[1]
    for in_path, name in ILLEGAL:
        r = await http.post(f"/topics/{in_path}", json={"records": [{"value": "eA=="}]}, headers={"Content-Type": BIN})
        not_found(r)
        assert "not a legal Kafka topic name" in r.json()["message"]
        for path in ("", "/partitions", "/partitions/0", "/partitions/0/offsets"):
            r = await http.get(f"/topics/{in_path}{path}")
            not_found(r)
            assert "not a legal Kafka topic name" in r.json()["message"], r.text
        r = await http.get(f"/topics/{in_path}/partitions/0/records", params={"offset": 0}, headers={"Accept": BIN})
        not_found(r)
        assert "not a legal Kafka topic name" in r.json()["message"], r.text
        r = await http.post(f"{base}/subscription", json={"topics": [name]}, headers={"Content-Type": V2})
        refused_in_body(r)
        r = await http.post(f"{base}/assignments", json={"partitions": [{"topic": name, "partition": 0}]},
                            headers={"Content-Type": V2})
        refused_in_body(r)
        r = await http.post(f"/v3/clusters/{cid}/topics/{in_path}/records",
                            content=b'{"value":{"type":"STRING","data":"x"}}',
                            headers={"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["error_code"] == 40401, r.text
        not_found(await http.get(f"/v3/clusters/{cid}/topics/{in_path}"), 404)
        not_found(await http.get(f"/v3/clusters/{cid}/topics/{in_path}/partitions"), 404)
        r = await http.post(f"/v3/clusters/{cid}/topics", json={"topic_name": name})
        assert r.status_code == 400 and r.json()["error_code"] == 40002, r.text
    r = await http.get(f"{base}/subscription")
    assert r.json()["topics"] == [], r.text
    # a legal name still works on the same instance and gateway
    r = await http.post(f"/topics/{topic_name}", json={"records": [{"value": "eA=="}]}, headers={"Content-Type": BIN})
    assert r.status_code == 200, r.text
    r = await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers={"Content-Type": V2})
    assert r.status_code == 204, r.text
    assert (await http.delete(base)).status_code == 204
    assert await broker_topics(kclient) - before == {topic_name}
