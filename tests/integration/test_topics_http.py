"""The Confluent v2 /topics endpoints, black-box: a real gateway process (with a tenants file) over Tansu,
driven with httpx. Every endpoint, every error code, tenant filtering, caching, offsets with an open
transaction, and a gateway whose broker is down."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import free_port
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_topics_tansu import open_transaction, produce_batch

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
KEY_ALL, KEY_TA, KEY_LS = "key-all-topics-0001", "key-ta-topics-0002", "key-lister-0003"


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: everything
    api_keys: ["{sha(KEY_ALL)}"]
  - id: ta
    api_keys: ["{sha(KEY_TA)}"]
    topics: ["ta-*"]
  - id: lister
    api_keys: ["{sha(KEY_LS)}"]
    topics: ["ls-*"]
"""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("topics")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    # a long TTL, so that "answered from the cache" is observable without timing
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f), "GATEWAY_TOPIC_METADATA_TTL_S": "300"},
                           log_file=d / "gw.log") as g:
        yield g



def ok(r: httpx.Response) -> object:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == V2
    return r.json()


def err(r: httpx.Response, status: int, code: int) -> None:
    assert (r.status_code, r.json()["error_code"]) == (status, code), r.text
    assert r.headers["content-type"] == V2
    assert isinstance(r.json()["message"], str)


def partition_json(p: int, leader: int) -> dict[str, object]:
    return {"partition": p, "leader": leader, "replicas": [{"broker": leader, "leader": True, "in_sync": True}]}


async def test_every_endpoint_answers_in_confluent_shapes(broker: AnyBroker, http: httpx.AsyncClient,
                                                          bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2}, configs={topic_name: {"retention.ms": "86400000"}})
    h = auth(KEY_ALL)
    [leader] = set(bclient.metadata.brokers)
    body = ok(await http.get(f"/topics/{topic_name}", headers=h))
    assert isinstance(body, dict)
    configs = body.pop("configs")
    assert body == {"name": topic_name, "partitions": [partition_json(0, leader), partition_json(1, leader)]}
    if broker.name == "kafka":  # every config of the topic, defaults too (as Confluent's proxy shows them)
        assert configs["retention.ms"] == "86400000" and configs["cleanup.policy"] == "delete"
        assert len(configs) > 20
    else:  # Tansu describes only the configs set on the topic
        assert configs == {"retention.ms": "86400000"}
    names = ok(await http.get("/topics", headers=h))  # (the lookup put it in a listing cached earlier)
    assert isinstance(names, list) and topic_name in names and names == sorted(names)
    assert ok(await http.get(f"/topics/{topic_name}/partitions", headers=h)) == [
        partition_json(0, leader), partition_json(1, leader)]
    assert ok(await http.get(f"/topics/{topic_name}/partitions/1", headers=h)) == partition_json(1, leader)
    assert ok(await http.get(f"/topics/{topic_name}/partitions/1/offsets", headers=h)) == {
        "beginning_offset": 0, "end_offset": 0, "last_stable_offset": 0}


async def test_offsets_follow_the_log_and_an_open_transaction(broker: AnyBroker, http: httpx.AsyncClient,
                                                              bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    url, h = f"/topics/{topic_name}/partitions/0/offsets", auth(KEY_ALL)
    await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 10)
    await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 5)
    assert ok(await http.get(url, headers=h)) == {"beginning_offset": 0, "end_offset": 15, "last_stable_offset": 15}
    with open_transaction(broker.bootstrap, topic_name, 3, f"txn-{topic_name}") as txn:
        await asyncio.to_thread(produce_batch, broker.bootstrap, topic_name, 2)
        assert ok(await http.get(url, headers=h)) == {"beginning_offset": 0, "end_offset": 20,
                                                      "last_stable_offset": 15}
        await asyncio.to_thread(txn.abort_transaction, 30)
    # Kafka writes the ABORT marker (one offset) after EndTxn is answered: the LSO moves a moment later
    deadline = time.monotonic() + 10
    while (body := ok(await http.get(url, headers=h)))["last_stable_offset"] != body["end_offset"]:  # type: ignore[index]
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.02)  # no event tells when the broker has written the marker
    assert body["end_offset"] == 21 if broker.name == "kafka" else body["end_offset"] >= 20  # type: ignore[index]


async def test_not_found_errors(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    h = auth(KEY_ALL)
    missing = topic_name + "-missing"
    for path in (f"/topics/{missing}", f"/topics/{missing}/partitions", f"/topics/{missing}/partitions/0",
                 f"/topics/{missing}/partitions/0/offsets", "/topics/not%20a%20topic"):
        err(await http.get(path, headers=h), 404, 40401)
    for p in (2, 99, -1):
        err(await http.get(f"/topics/{topic_name}/partitions/{p}", headers=h), 404, 40402)
        err(await http.get(f"/topics/{topic_name}/partitions/{p}/offsets", headers=h), 404, 40402)
    err(await http.get(f"/topics/{topic_name}/partitions/one", headers=h), 422, 42207)
    err(await http.post(f"/topics/{topic_name}/partitions/0/offsets", headers=h), 405, 40501)


async def test_a_just_created_topic_is_found_at_once(http: httpx.AsyncClient, bclient: KafkaClient,
                                                     topic_name: str) -> None:
    h = auth(KEY_ALL)
    ok(await http.get("/topics", headers=h))  # fills the cache (TTL 300 s)
    err(await http.get(f"/topics/{topic_name}", headers=h), 404, 40401)  # a miss is not cached either
    await bclient.create_topics({topic_name: 3})
    assert len(ok(await http.get(f"/topics/{topic_name}", headers=h))["partitions"]) == 3  # type: ignore[index]
    assert topic_name in ok(await http.get("/topics", headers=h))  # type: ignore[operator]


async def test_listing_is_filtered_by_tenant_and_cached(http: httpx.AsyncClient, bclient: KafkaClient,
                                                        topic_name: str) -> None:
    ls = [f"ls-{topic_name}-{i}" for i in range(3)]
    await bclient.create_topics({**dict.fromkeys(ls, 1), f"ta-{topic_name}": 1, f"other-{topic_name}": 1})
    # only this tenant's patterns, sorted, and (Tansu has none) no internal topics
    assert ok(await http.get("/topics", headers=auth(KEY_LS))) == sorted(ls)
    # (other tests may have filled these tenants' cached listings: a lookup adds a topic to them)
    ok(await http.get(f"/topics/ta-{topic_name}", headers=auth(KEY_TA)))
    listed_ta = ok(await http.get("/topics", headers=auth(KEY_TA)))
    assert f"ta-{topic_name}" in listed_ta and all(t.startswith("ta-") for t in listed_ta)  # type: ignore[union-attr]
    for t in [*ls, f"ta-{topic_name}", f"other-{topic_name}"]:
        ok(await http.get(f"/topics/{t}", headers=auth(KEY_ALL)))
    everything = ok(await http.get("/topics", headers=auth(KEY_ALL)))
    assert set(ls) | {f"ta-{topic_name}", f"other-{topic_name}"} <= set(everything)  # type: ignore[arg-type]
    # a topic created now is not in the cached listing (no Metadata request per call) …
    late = f"ls-{topic_name}-late"
    await bclient.create_topics({late: 1})
    for _ in range(5):
        assert ok(await http.get("/topics", headers=auth(KEY_LS))) == sorted(ls)
    # … until someone looks it up, which adds it to the cached listing
    ok(await http.get(f"/topics/{late}", headers=auth(KEY_LS)))
    assert ok(await http.get("/topics", headers=auth(KEY_LS))) == sorted([*ls, late])


async def test_topics_outside_the_tenant_patterns_are_forbidden(http: httpx.AsyncClient, bclient: KafkaClient,
                                                                topic_name: str) -> None:
    theirs, mine = f"other-{topic_name}", f"ta-{topic_name}"
    await bclient.create_topics({theirs: 1, mine: 1})
    h = auth(KEY_TA)
    for t in (theirs, f"nonexistent-{topic_name}"):  # forbidden whether it exists or not: nothing leaks
        for path in (f"/topics/{t}", f"/topics/{t}/partitions", f"/topics/{t}/partitions/0",
                     f"/topics/{t}/partitions/0/offsets"):
            err(await http.get(path, headers=h), 403, 40301)
    ok(await http.get(f"/topics/{mine}/partitions/0/offsets", headers=h))
    err(await http.get(f"/topics/nonexistent-{topic_name}", headers=auth(KEY_ALL)), 404, 40401)


async def test_authentication_is_required(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    for path in ("/topics", f"/topics/{topic_name}", f"/topics/{topic_name}/partitions",
                 f"/topics/{topic_name}/partitions/0", f"/topics/{topic_name}/partitions/0/offsets"):
        err(await http.get(path), 401, 40101)
        err(await http.get(path, headers=auth("not-a-key")), 401, 40101)


async def test_broker_down_is_503(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    g = GatewayProcess(dead, log_file=tmp_path / "gw.log")
    g.start()
    try:
        async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
            for path in ("/topics", "/topics/t", "/topics/t/partitions", "/topics/t/partitions/0",
                         "/topics/t/partitions/0/offsets"):
                r = await http.get(path)
                err(r, 503, 50302)
                assert int(r.headers["Retry-After"]) >= 1
    finally:
        g.stop()
