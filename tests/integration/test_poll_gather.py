"""One GET records returns what is waiting across the assignment, against Tansu through a real gateway.

Reproduces Karapace's ``test_subscription`` (tests/integration/test_rest_consumer.py): subscribe by
pattern to three topics, GET records once (the assignment arrives; nothing to read), produce 3 records to
each topic (flushing after each topic), then expect all nine from a single ``GET records?timeout=5000``;
the same with an explicit topic list, through the full route (the first variant takes the lean GET path of
api/server/fastpath.py). Also Confluent's instance configs ``consumer.request.timeout.ms`` (default and cap of a
request's timeout) and ``fetch.min.bytes`` (a request returns once more than that many bytes are there).

The gateway runs with the embedded broker's long-poll fetch wait (10 ms, as ``make run`` sets it): Tansu
answers a parked fetch only when its wait ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer as CKProducer

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
H = {"Content-Type": V2}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {"GATEWAY_CONSUMER_LONG_POLL_FETCH_MAX_WAIT_MS": "10"}
    with GatewayProcess(broker.bootstrap, env, log_file=tmp_path_factory.mktemp("gw-gather") / "gateway.log") as g:
        yield g


def produce_per_topic(bootstrap: str, topics: list[str], n: int, value: bytes) -> None:
    """n records to each topic, flushing after each topic (as Karapace's test does)."""
    p = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for t in topics:
        for _ in range(n):
            p.produce(t, value=value)
        assert p.flush(30) == 0


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, f"HTTP {r.status_code}: {r.text[:500]}"
    return r.json() if status != 204 else None


async def new_consumer(http: httpx.AsyncClient, group: str, **config: Any) -> str:
    out = ok(await http.post(f"/consumers/{group}", json={"format": "binary", "auto.offset.reset": "earliest",
                                                            **config}, headers=H))
    return f"/consumers/{group}/instances/{out['instance_id']}"


def per_topic(records: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r["topic"]] = out.get(r["topic"], 0) + 1
    return out


async def test_pattern_subscription_one_get_returns_all_nine(broker: AnyBroker, bclient: KafkaClient,
                                                             http: httpx.AsyncClient) -> None:
    prefix = f"gather-{uuid.uuid4().hex[:8]}-"
    topics = [f"{prefix}{i}" for i in range(3)]
    await bclient.create_topics(dict.fromkeys(topics, 1))
    inst = await new_consumer(http, f"g-{prefix}")
    ok(await http.post(f"{inst}/subscription", json={"topic_pattern": f"{prefix}.*"}, headers=H), 204)
    # "Consume so the proxy re-evaluates the subscription": the group assignment arrives, nothing to read
    assert ok(await http.get(f"{inst}/records", params={"timeout": 5000}, headers={"Accept": BIN})) == []
    assert sorted(ok(await http.get(f"{inst}/subscription"))["topics"]) == topics
    await asyncio.to_thread(produce_per_topic, broker.bootstrap, topics, 3, b"bar")
    r = await http.get(f"{inst}/records", params={"timeout": 5000}, headers={"Accept": BIN})
    assert per_topic(ok(r)) == dict.fromkeys(topics, 3)
    ok(await http.delete(inst, headers=H), 204)


async def test_topic_list_one_get_returns_all_nine_through_the_full_route(broker: AnyBroker, bclient: KafkaClient,
                                                                           http: httpx.AsyncClient) -> None:
    prefix = f"gather-{uuid.uuid4().hex[:8]}-"
    topics = [f"{prefix}{i}" for i in range(3)]
    await bclient.create_topics(dict.fromkeys(topics, 1))
    inst = await new_consumer(http, f"g-{prefix}")
    ok(await http.post(f"{inst}/subscription", json={"topics": topics}, headers=H), 204)
    assert ok(await http.get(f"{inst}/records", params={"timeout": 5000}, headers={"Accept": BIN})) == []
    await asyncio.to_thread(produce_per_topic, broker.bootstrap, topics, 3, b"bar")
    # a GET with a body is served by the full route (api/server/fastpath.py hands it over): same answer
    r = await http.request("GET", f"{inst}/records?timeout=5000", content=b"{}",
                           headers={"Accept": BIN, "Content-Type": V2})
    assert per_topic(ok(r)) == dict.fromkeys(topics, 3)
    ok(await http.delete(inst, headers=H), 204)


async def test_consumer_request_timeout_ms_is_the_default_and_the_cap(bclient: KafkaClient, http: httpx.AsyncClient,
                                                                      topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    inst = await new_consumer(http, f"g-{topic_name}", **{"consumer.request.timeout.ms": "300"})
    ok(await http.post(f"{inst}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                       headers=H), 204)
    for params in ({}, {"timeout": 5000}, {"timeout": 0}):  # no timeout / above the cap / 0: all wait 300 ms
        started = time.monotonic()
        assert ok(await http.get(f"{inst}/records", params=params, headers={"Accept": BIN})) == []
        assert 0.28 <= time.monotonic() - started < 2.0, params
    ok(await http.delete(inst, headers=H), 204)
    # without the config a request waits its own timeout (0: at once)
    inst = await new_consumer(http, f"g2-{topic_name}")
    ok(await http.post(f"{inst}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                       headers=H), 204)
    started = time.monotonic()
    assert ok(await http.get(f"{inst}/records", params={"timeout": 1500}, headers={"Accept": BIN})) == []
    assert time.monotonic() - started >= 1.45
    ok(await http.delete(inst, headers=H), 204)


async def test_fetch_min_bytes_waits_for_more_than_that_many_bytes(broker: AnyBroker, bclient: KafkaClient,
                                                                   http: httpx.AsyncClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    inst = await new_consumer(http, f"g-{topic_name}", **{"fetch.min.bytes": 100})
    ok(await http.post(f"{inst}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                       headers=H), 204)
    await asyncio.to_thread(produce_per_topic, broker.bootstrap, [topic_name], 2, b"0123456789")  # 20 bytes
    started = time.monotonic()
    got = ok(await http.get(f"{inst}/records", params={"timeout": 1000}, headers={"Accept": BIN}))
    assert len(got) == 2 and time.monotonic() - started >= 0.95  # below fetch.min.bytes: until the timeout
    await asyncio.to_thread(produce_per_topic, broker.bootstrap, [topic_name], 11, b"0123456789")  # 110 bytes
    started = time.monotonic()
    got = ok(await http.get(f"{inst}/records", params={"timeout": 10000}, headers={"Accept": BIN}))
    assert len(got) == 11 and time.monotonic() - started < 5.0  # more than 100 bytes: at once
    ok(await http.delete(inst, headers=H), 204)
