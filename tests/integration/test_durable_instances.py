"""Durable consumer instances on one replica (GATEWAY_DURABLE_INSTANCES): an instance
survives kill -9 of its gateway. The restarted gateway re-creates it from its descriptor on the first request
(same options and subscription, positions from the committed offsets): the client sees no 404; every record
is delivered, those after the last commit again (at-least-once). Delete and subscription changes are durable
too, and the descriptor topic is not reachable through the API."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
JSON = {"Accept": "application/vnd.kafka.json.v2+json"}


@pytest.fixture
def durable_env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield {"env": {"GATEWAY_DURABLE_INSTANCES": "true", "GATEWAY_STATIC_MEMBERSHIP": "true",
                   "GATEWAY_LOG_LEVEL": "info"},
           "log": tmp_path / "gw.log"}


def _gateway(broker: AnyBroker, d: dict[str, Any]) -> GatewayProcess:
    g = GatewayProcess(broker.bootstrap, env=d["env"], log_file=d["log"])
    g.start()
    return g


def _create_topic(bootstrap: str, topic: str) -> None:
    async def run() -> None:
        client = KafkaClient(bootstrap)
        try:
            await client.create_topics({topic: 1})
        finally:
            await client.close()
    asyncio.run(run())


def _produce(c: httpx.Client, g: GatewayProcess, topic: str, values: list[int]) -> None:
    r = c.post(f"{g.url}/topics/{topic}", headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
               json={"records": [{"value": v} for v in values]})
    assert r.status_code == 200, r.text


def _poll_until(c: httpx.Client, base: str, want: int, timeout: float = 30) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        r = c.get(f"{base}/records", params={"timeout": 1000}, headers=JSON)
        assert r.status_code == 200, r.text
        got += [rec["value"] for rec in r.json()]
    return got


def test_an_instance_survives_kill_9_of_its_gateway(broker: AnyBroker, durable_env: dict[str, Any]) -> None:
    topic, group, name = f"durable-{uuid.uuid4().hex[:6]}", f"dg-{uuid.uuid4().hex[:6]}", "c1"
    _create_topic(broker.bootstrap, topic)
    g1 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{g1.url}/topics/{topic}", headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
                          json={"records": [{"value": 0}]}).status_code == 200
            r = c.post(f"{g1.url}/consumers/{group}", headers=V2, json={
                "name": name, "format": "json", "auto.offset.reset": "earliest", "auto.commit.enable": "false"})
            assert r.status_code == 200, r.text
            base1 = f"{g1.url}/consumers/{group}/instances/{name}"
            assert c.post(f"{base1}/subscription", headers=V2, json={"topics": [topic]}).status_code == 204
            _produce(c, g1, topic, list(range(1, 10)))
            first = _poll_until(c, base1, 10)
            assert first == list(range(10))
            assert c.post(f"{base1}/offsets", headers=V2, json={}).status_code == 200  # committed through 9
            _produce(c, g1, topic, list(range(10, 15)))
            assert _poll_until(c, base1, 5) == list(range(10, 15))  # delivered, not committed
    finally:
        g1.kill()
    g2 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            base2 = f"{g2.url}/consumers/{group}/instances/{name}"
            _produce(c, g2, topic, list(range(15, 20)))
            # no 404: the instance is back with its subscription; 10..14 again (after the last commit), then on
            again = _poll_until(c, base2, 10)
            assert again == list(range(10, 20)), again
            r = c.get(f"{base2}/subscription")
            assert r.status_code == 200 and r.json() == {"topics": [topic]}
            metrics = c.get(f"{g2.url}/metrics").text
            assert "kcg_instances_recreated_total 1.0" in metrics, metrics
            assert 'kcg_descriptor_topic_lag{tenant="default"} 0.0' in metrics
            assert "kcg_descriptor_failures_total 0.0" in metrics
            # a delete is durable too
            assert c.delete(base2, headers=V2).status_code == 204
    finally:
        g2.kill()
    g3 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            r = c.get(f"{g3.url}/consumers/{group}/instances/{name}/records", headers=JSON)
            assert r.status_code == 404 and r.json()["error_code"] == 40403, r.text
            # the descriptors' topic is the gateway's own: no tenant reads or writes it
            r = c.get(f"{g3.url}/topics/__kcg_instances/partitions/0/records", params={"offset": 0})
            assert r.status_code == 403, r.text
    finally:
        g3.stop()
    assert "re-created consumer instance c1" in durable_env["log"].read_text()


def test_an_instance_deleted_while_its_gateway_is_down_is_gone(broker: AnyBroker,
                                                               durable_env: dict[str, Any]) -> None:
    group = f"dg-{uuid.uuid4().hex[:6]}"
    g1 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{g1.url}/consumers/{group}", headers=V2, json={"name": "a"}).status_code == 200
            assert c.post(f"{g1.url}/consumers/{group}", headers=V2, json={"name": "b"}).status_code == 200
    finally:
        g1.kill()
    g2 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            # "a" was never asked for since the restart: deleting it needs no re-creation
            assert c.delete(f"{g2.url}/consumers/{group}/instances/a", headers=V2).status_code == 204
            assert c.get(f"{g2.url}/consumers/{group}/instances/a/subscription").status_code == 404
            assert c.get(f"{g2.url}/consumers/{group}/instances/b/subscription").status_code == 200
            # a second delete of the same instance is a 404, as without durability
            assert c.delete(f"{g2.url}/consumers/{group}/instances/a", headers=V2).status_code == 404
    finally:
        g2.stop()


def test_descriptors_nobody_comes_back_for_are_expired(broker: AnyBroker, durable_env: dict[str, Any]) -> None:
    group = f"dg-{uuid.uuid4().hex[:6]}"
    durable_env["env"]["GATEWAY_INSTANCE_IDLE_TIMEOUT_S"] = "2"
    g1 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{g1.url}/consumers/{group}", headers=V2, json={"name": "orphan"}).status_code == 200
    finally:
        g1.kill()
    g2 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:
            # another instance of the tenant, kept in use: its descriptor stays fresh
            assert c.post(f"{g2.url}/consumers/{group}", headers=V2, json={"name": "alive"}).status_code == 200
            deadline = time.monotonic() + 30
            log = durable_env["log"]
            while "orphan (tenant default" not in log.read_text() or "unused for" not in log.read_text():
                assert time.monotonic() < deadline, "the orphan descriptor was not expired"
                r = c.get(f"{g2.url}/consumers/{group}/instances/alive/subscription")
                assert r.status_code == 200, r.text
                time.sleep(0.3)  # the reaper of another process: no event to await
            r = c.get(f"{g2.url}/consumers/{group}/instances/orphan/subscription")
            assert r.status_code == 410 and r.json()["error_code"] == 41001, r.text
    finally:
        g2.stop()
    g3 = _gateway(broker, durable_env)
    try:
        with httpx.Client(timeout=30) as c:  # the descriptor is gone for every replica
            r = c.get(f"{g3.url}/consumers/{group}/instances/orphan/subscription")
            assert r.status_code == 404, r.text
    finally:
        g3.stop()
