"""Kafka error texts: a broker's error message and broker addresses never reach clients.

Before: the broker's ``error_message`` (which names hosts and internal addresses) and the client layer's
connection errors (``cannot connect to 10.x.y.z:9092``) were copied into HTTP answers. Now a real gateway
process runs against the protocol-level test broker (in a thread of this process), which answers

- Produce to ``LEAKY`` with TOPIC_AUTHORIZATION_FAILED (29) and a message naming an internal host and address,
- every CreateTopics with INVALID_REPLICATION_FACTOR (38) and such a message,

and a second tenant's bootstrap is a closed port. The v2 and v3 produce answers, the v3 create-topic refusal
and the unreachable tenant's answers name the Kafka error (``Kafka error TOPIC_AUTHORIZATION_FAILED (29)``)
and never the host, address or broker text; the gateway's log has the broker's text; the other tenant's
requests keep being served meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.embedded.tansu import free_port
from service.protocol import messages as M
from tests.fakes.broker.cluster import TestCluster
from tests.fakes.broker.handlers import default_registry
from tests.fakes.broker.registry import HandlerRegistry, RequestContext
from tests.integration.gateway_proc import GatewayProcess

pytestmark = pytest.mark.integration

SECRET_HOST = "kafka-7.prod-internal.corp.example"
SECRET_ADDR = "10.20.30.40:9093"
AUTHZ_TEXT = f"principal User:gw denied WRITE on topic by the authorizer of {SECRET_HOST} ({SECRET_ADDR})"
CREATE_TEXT = f"Replication factor: 3 larger than available brokers: 1 (controller {SECRET_HOST}:9093)"
LEAKY, FINE = "leaky", "fine"
KEY_GOOD, KEY_DOWN = "key-of-the-good-tenant-1234", "key-of-the-unreachable-tenant-5678"
V2 = {"Content-Type": "application/vnd.kafka.binary.v2+json"}
TOPIC_AUTHORIZATION_FAILED, INVALID_REPLICATION_FACTOR = 29, 38


def leaky_registry() -> HandlerRegistry:
    reg = default_registry(transactions=True).copy()  # InitProducerId for the idempotent producer
    produce = reg.get(M.ApiKey.PRODUCE)
    assert produce is not None

    async def leaky_produce(ctx: RequestContext, req: Any) -> Any:
        resp = await produce.handler(ctx, req)
        for t in getattr(resp, "responses", None) or []:
            if t.name == LEAKY:
                for p in t.partition_responses:
                    p.error_code, p.error_message, p.base_offset = TOPIC_AUTHORIZATION_FAILED, AUTHZ_TEXT, -1
        return resp

    Result = M.struct("CreateTopicsResponse", "CreatableTopicResult")

    async def refusing_create(ctx: RequestContext, req: Any) -> Any:
        return M.CreateTopicsResponse(throttle_time_ms=0, topics=[
            Result(name=t.name, error_code=INVALID_REPLICATION_FACTOR, error_message=CREATE_TEXT)
            for t in req.topics])

    reg.register(M.ApiKey.PRODUCE, leaky_produce)
    reg.register(M.ApiKey.CREATE_TOPICS, refusing_create)
    return reg


class BrokerThread:
    """The test broker served by its own event loop in a thread (the gateway process is its client)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-broker", daemon=True)
        self.cluster = TestCluster(topics={LEAKY: 1, FINE: 1}, registry=leaky_registry())

    def __enter__(self) -> BrokerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.cluster.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.cluster.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path, str]]:
    d = tmp_path_factory.mktemp("kafka-error-texts")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    tenants = d / "tenants.yaml"
    tenants.write_text(f"""
version: 1
tenants:
  - id: good
    api_keys: ["{sha(KEY_GOOD)}"]
    topics: ["{LEAKY}", "{FINE}", "created-*"]
    admin_topics: ["created-*"]
  - id: down
    api_keys: ["{sha(KEY_DOWN)}"]
    topics: ["*"]
    kafka:
      bootstrap: "{dead}"
""")
    log = d / "gw.log"
    with BrokerThread() as broker, GatewayProcess(broker.cluster.bootstrap_servers, log_file=log,
                                                  env={"GATEWAY_TENANTS_FILE": str(tenants)}) as gw:
        yield gw, log, dead


def auth(key: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **(extra or {})}


def assert_clean(text: str, *also: str) -> None:
    for secret in (SECRET_HOST, SECRET_ADDR, "10.20.30.40", AUTHZ_TEXT, CREATE_TEXT, "authorizer", *also):
        assert secret not in text, f"{secret!r} reached the client: {text}"


def assert_fine_served(http: httpx.Client) -> None:
    """The other topic of the same tenant keeps being produced to."""
    r = http.post(f"/topics/{FINE}", headers=auth(KEY_GOOD, V2), json={"records": [{"value": "aGk="}]})
    assert r.status_code == 200, r.text
    assert r.json()["offsets"][0]["error_code"] is None


def test_v2_produce_refusal_names_the_error_not_the_broker_text(setup: tuple[GatewayProcess, Path, str]) -> None:
    gw, log, _ = setup
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        assert_fine_served(http)
        r = http.post(f"/topics/{LEAKY}", headers=auth(KEY_GOOD, V2), json={"records": [{"value": "aGk="}]})
        assert r.status_code == 403, r.text  # Confluent: a record that failed authorization
        assert_clean(r.text)
        offset = r.json()["offsets"][0]
        assert offset["error_code"] == 40301
        assert "TOPIC_AUTHORIZATION_FAILED" in offset["error"] and "(29)" in offset["error"], offset
        assert_fine_served(http)
    assert AUTHZ_TEXT in log.read_text(errors="replace")  # the operator still sees the broker's text


def test_v3_produce_refusal_names_the_error_not_the_broker_text(setup: tuple[GatewayProcess, Path, str]) -> None:
    gw, _, _ = setup
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        cid = http.get("/v3/clusters", headers=auth(KEY_GOOD)).json()["data"][0]["cluster_id"]
        r = http.post(f"/v3/clusters/{cid}/topics/{LEAKY}/records", headers=auth(KEY_GOOD),
                      json={"value": {"type": "BINARY", "data": "aGk="}})
        assert_clean(r.text)
        body = r.json()
        assert body["error_code"] == 40301, body
        assert body["message"] == "Kafka error TOPIC_AUTHORIZATION_FAILED (29)", body
        assert_fine_served(http)


def test_v3_create_topic_refusal_names_the_error_not_the_broker_text(
        setup: tuple[GatewayProcess, Path, str]) -> None:
    gw, log, _ = setup
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        cid = http.get("/v3/clusters", headers=auth(KEY_GOOD)).json()["data"][0]["cluster_id"]
        r = http.post(f"/v3/clusters/{cid}/topics", headers=auth(KEY_GOOD),
                      json={"topic_name": "created-1", "partitions_count": 1, "replication_factor": 1})
        assert r.status_code == 400, r.text
        assert_clean(r.text)
        body = r.json()
        assert body["error_code"] == 40002
        assert "INVALID_REPLICATION_FACTOR (38)" in body["message"] and "created-1" in body["message"], body
        assert_fine_served(http)
    assert CREATE_TEXT in log.read_text(errors="replace")


def test_unreachable_brokers_are_not_named(setup: tuple[GatewayProcess, Path, str]) -> None:
    gw, log, dead = setup
    port = dead.rsplit(":", 1)[1]
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        for path in ("/topics", "/v3/clusters", f"/topics/{FINE}/partitions"):
            r = http.get(path, headers=auth(KEY_DOWN))
            assert r.status_code == 503, (path, r.text)
            assert_clean(r.text, dead, port, "Connection refused", "Errno")
            body = r.json()
            assert body["error_code"] in (50302, 50003), body
            assert "Kafka" in body["message"], body
        r = http.post(f"/topics/{FINE}", headers=auth(KEY_DOWN, V2), json={"records": [{"value": "aGk="}]})
        assert_clean(r.text, dead, port, "Connection refused", "Errno")
        assert r.status_code >= 500 or r.json()["offsets"][0]["error_code"] is not None, r.text
        assert_fine_served(http)  # the reachable tenant is served meanwhile
    assert dead in log.read_text(errors="replace")
