"""Published third-party clients of the Confluent REST Proxy v2, unmodified, against the real gateway.

- ``nlp-kafka-rest-api`` 1.0.0 (PyPI, import name ``kafka_rest``): a requests-based v2 client. Its producer
  posts json-embedded records to /topics/<topic>; its consumer creates a *named* binary instance, builds
  every URL from that name, subscribes to "<topic>-response" and polls GET records until the keys it waits
  for arrive.
- ``pymapr-kafkarest`` 0.1.1 (PyPI; written for MapR/HPE's Confluent-v2-compatible proxy; imports
  ``slugify`` from ``python-slugify`` without declaring it): builds instance URLs from its own name,
  handles 409 on create by deleting and re-creating the instance, seeks with POST .../positions/ (with a
  trailing slash) and consumes in the json format.
- ``kafka-bridge-client`` 0.7.1 (PyPI; aiohttp; Strimzi's bridge by default, Confluent's v2 with
  ``proxy="confluent"``): create, subscribe, poll, commit (expects Confluent's 200) and delete.

The first two clients are synchronous (requests), so they run in a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp("gw-client") / "gateway.log") as g:
        yield g



@pytest.fixture
def nlp_client(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # its environment variables would win over the arguments
    for var in ("KAFKA_REST_API_URL", "TOPIC_ID", "X_API_KEY", "PRODUCER_DATA_MAX_SIZE"):
        monkeypatch.delenv(var, raising=False)
    import kafka_rest  # nlp-kafka-rest-api

    return kafka_rest


@pytest.fixture(scope="module")
def pymapr() -> ModuleType:
    # On import it sets the root logger to DEBUG (KAFKAREST_LOG_LEVEL) and adds a stream handler: undo that.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    import pymapr_kafkarest.kafkarest as mod

    root.setLevel(level)
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    return mod


def ck_produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for key, value in records:
        p.produce(topic, key=key, value=value, partition=0)
    assert p.flush(30) == 0


def nlp_consume(consumer: Any, keys: list[str], deadline_s: float = 30.0) -> list[dict[str, Any]]:
    """The client's own polling generator (interval 0), stopped at a deadline instead of looping forever."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + deadline_s
    for batch, remaining in consumer.consume(keys, interval_sec=0):
        got += batch
        if not remaining or time.monotonic() > deadline:
            break
    return got


async def instances_gone(http: httpx.AsyncClient, group: str, name: str) -> None:
    r = await http.get(f"/consumers/{group}/instances/{name}/subscription")
    assert (r.status_code, r.json()["error_code"]) == (404, 40403), r.text


# -- nlp-kafka-rest-api ------------------------------------------------------------------------------------
async def test_nlp_kafka_rest_api_consumer_reads_records(nlp_client: ModuleType, broker: AnyBroker,
                                                         bclient: KafkaClient, gw: GatewayProcess,
                                                         http: httpx.AsyncClient, topic_name: str) -> None:
    t = topic_name
    await bclient.create_topics({f"{t}-response": 1})
    keys = [str(uuid.uuid4()) for _ in range(5)]
    await asyncio.to_thread(ck_produce, broker.bootstrap, f"{t}-response", [
        (json.dumps(k).encode(), json.dumps({"n": i, "k": k}).encode()) for i, k in enumerate(keys)])
    group, name = f"g-{t}", "nlp-consumer"

    def run() -> list[dict[str, Any]]:
        with nlp_client.Consumer(kafka_rest_api_url=gw.url, topic_id=t, consumer_group=group,
                                 instance=name) as consumer:
            return nlp_consume(consumer, keys)

    got = await asyncio.to_thread(run)
    assert sorted((r["key"], r["value"]["n"]) for r in got) == sorted((k, i) for i, k in enumerate(keys))
    await instances_gone(http, group, name)  # its __exit__ deleted the instance


async def test_nlp_kafka_rest_api_produce_and_consume(nlp_client: ModuleType, bclient: KafkaClient,
                                                      gw: GatewayProcess, http: httpx.AsyncClient,
                                                      topic_name: str) -> None:
    t = topic_name
    await bclient.create_topics({f"{t}-response": 1})
    group, name = f"g-{t}", "nlp-roundtrip"
    messages = [{"text": "héllo"}, {"text": "world", "n": [1, 2, 3]}, "plain"]

    def run() -> tuple[list[str], list[dict[str, Any]]]:
        producer = nlp_client.Producer(kafka_rest_api_url=gw.url, topic_id=f"{t}-response")
        keys = producer.produce(messages, endpoint="/echo")
        with nlp_client.Consumer(kafka_rest_api_url=gw.url, topic_id=t, consumer_group=group,
                                 instance=name) as consumer:
            return keys, nlp_consume(consumer, keys)

    keys, got = await asyncio.to_thread(run)
    assert len(keys) == 3
    by_key = {r["key"]: r["value"] for r in got}
    assert by_key == {k: {"endpoint": "/echo", "payload": m} for k, m in zip(keys, messages, strict=True)}
    await instances_gone(http, group, name)


# -- pymapr-kafkarest --------------------------------------------------------------------------------------
async def test_pymapr_kafkarest_consumer_flow(pymapr: ModuleType, broker: AnyBroker, bclient: KafkaClient,
                                              gw: GatewayProcess, http: httpx.AsyncClient, topic_name: str) -> None:
    t = topic_name
    await bclient.create_topics({t: 1})
    values = [{"n": i, "s": "é"} for i in range(4)]
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, json.dumps(v).encode()) for v in values])
    group, name = f"g-{t}", "mapr-consumer"

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        mk = pymapr.MaprKlient(f"{gw.url}/", group, headers={}, topics=[t], instance=name, partition=0)
        mk.connect(clear=True)  # GET subscription of an unknown instance (404), then create by name
        mk.subscribe()
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            got += mk.consume()
        out["first"] = got
        out["after_position"] = _consume_at_least(mk, 2, position=2)  # POST .../positions/ (trailing slash)
        out["after_seek"] = _consume_at_least(mk, 1, seek=True)  # POST .../positions/beginning
        # a second client with the same name: its create gets 409, so it deletes and re-creates the instance
        again = pymapr.MaprKlient(f"{gw.url}/", group, headers={}, topics=[t], instance=name, partition=0)
        again.connect(clear=True)
        out["subscription_after_recreate"] = again._subscription_topics()
        again._instance_delete()
        return out

    out = await asyncio.to_thread(run)
    assert [(r["offset"], r["value"]) for r in out["first"]] == list(enumerate(values))
    assert [r["offset"] for r in out["after_position"]][:2] == [2, 3]
    assert out["after_seek"][0]["offset"] == 0
    assert out["subscription_after_recreate"] == {"topics": []}  # a fresh instance
    await instances_gone(http, group, name)


def _consume_at_least(mk: Any, n: int, position: int | None = None, seek: bool = False,
                      deadline_s: float = 20.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = list(mk.consume(position=position, seek=True if seek else None))
    deadline = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        got += mk.consume()
    return got


async def test_pymapr_kafkarest_produce_and_consume(pymapr: ModuleType, bclient: KafkaClient, gw: GatewayProcess,
                                                    http: httpx.AsyncClient, topic_name: str) -> None:
    t = topic_name
    await bclient.create_topics({t: 1})
    group, name = f"g-{t}", "mapr-roundtrip"
    records = [{"value": {"n": 1}}, {"key": "k2", "value": ["two", 2]}, {"value": "three"}]

    def run() -> list[dict[str, Any]]:
        producer = pymapr.MaprKProducer(f"{gw.url}/", headers={})
        # Its constructor passes `retry` into the `topics` slot, so retry stays 3 and a successful batch would
        # be posted 4 times; set it the way a user of the library has to.
        producer.retry = 0
        producer.produce(records, topic=t)  # asserts HTTP 200 itself
        mk = pymapr.MaprKlient(f"{gw.url}/", group, headers={}, topics=[t], instance=name, partition=0)
        mk.connect(clear=True)
        mk.subscribe()
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < len(records) and time.monotonic() < deadline:
            got += mk.consume()
        mk._instance_delete()
        return got

    got = await asyncio.to_thread(run)
    assert [(r["offset"], r["key"], r["value"]) for r in got] == [
        (0, None, {"n": 1}), (1, "k2", ["two", 2]), (2, None, "three")]
    await instances_gone(http, group, name)


# -- kafka-bridge-client (Confluent mode) --------------------------------------------------------------------
async def test_kafka_bridge_client_confluent_mode(broker: AnyBroker, bclient: KafkaClient, gw: GatewayProcess,
                                                  http: httpx.AsyncClient, topic_name: str) -> None:
    """``kafka-bridge-client`` 0.7 (PyPI; aiohttp) with ``proxy="confluent"``: entering its context deletes a
    leftover instance (a 404 is expected), creates a named binary instance (needs 200) and subscribes (204);
    ``poll_records`` GETs records (200, sending a ``{}`` body on the GET); ``commit`` posts the last offset of
    each partition and needs Confluent's 200 (it raises on our former 204); leaving deletes the instance
    (204). Every other status raises in the client."""
    from kafka_bridge_client import KafkaBridgeConsumer

    t = topic_name
    await bclient.create_topics({t: 1})
    await asyncio.to_thread(ck_produce, broker.bootstrap, t, [(None, b"one"), (b"k", b"two"), (None, b"three")])
    group, name = f"kbc-{t}", f"kbc-{uuid.uuid4().hex[:8]}"
    consumer = KafkaBridgeConsumer(t, bootstrap_server=gw.url, group_id=group, auto_offset_reset="earliest",
                                   enable_auto_commit=False, consumer_name=name, sleep_interval_seconds=0,
                                   proxy="confluent")
    got: list[dict[str, Any]] = []
    async with consumer:
        deadline = time.monotonic() + 30
        while len(got) < 3:
            assert time.monotonic() < deadline, got
            got += await consumer.poll_records(max_bytes=1_000_000, timeout=1000)
        await consumer.commit()
    assert [base64.b64decode(r["value"]) for r in got] == [b"one", b"two", b"three"]
    await instances_gone(http, group, name)
    # the commit reached the broker: the next offset to read is after the last record
    r = await http.post(f"/consumers/{group}", json={"name": "check", "format": "binary"}, headers={"Content-Type": V2})
    assert r.status_code == 200, r.text
    check = f"/consumers/{group}/instances/check"
    r = await http.request("GET", f"{check}/offsets", json={"partitions": [{"topic": t, "partition": 0}]},
                           headers={"Content-Type": V2})
    assert r.status_code == 200 and r.json()["offsets"] == [
        {"topic": t, "partition": 0, "offset": 3, "metadata": ""}], r.text
    await http.delete(check)
