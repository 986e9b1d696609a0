"""Black-box HTTP tests of the produce endpoints: a real gateway process over Tansu (and, for broker
failures, over the protocol-level test broker), driven with httpx; produced records are read back through
the gateway's own consumer API and with confluent-kafka."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from service.producer import partition_for_key
from service.protocol import messages as M
from tests.conftest import AnyBroker
from tests.fakes.broker import TestCluster
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_produce_vs_test_broker import ProduceGate

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
BIN = "application/vnd.kafka.binary.v2+json"
JSN = "application/vnd.kafka.json.v2+json"
H = {"Content-Type": V2}
HB = {"Content-Type": BIN}
HJ = {"Content-Type": JSN}


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, log_file=tmp_path_factory.mktemp(f"gw-{broker.name}") / "gateway.log") as g:
        yield g



async def consume_back(http: httpx.AsyncClient, topic: str, partitions: int, n: int, fmt: str = "binary",
                       subscribe: bool = False, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Read ``n`` records of ``topic`` through the gateway's consumer API (assign + seek to the beginning,
    or subscribe), sorted by (partition, offset)."""
    group = f"g-{topic}-{fmt}-{time.time_ns()}"
    r = await http.post(f"/consumers/{group}", json={"format": fmt, "auto.offset.reset": "earliest"}, headers=H)
    assert r.status_code == 200, r.text
    base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
    try:
        if subscribe:
            r = await http.post(f"{base}/subscription", json={"topics": [topic]}, headers=H)
        else:
            parts = {"partitions": [{"topic": topic, "partition": p} for p in range(partitions)]}
            r = await http.post(f"{base}/assignments", json=parts, headers=H)
            assert r.status_code == 204, r.text
            r = await http.post(f"{base}/positions/beginning", json=parts, headers=H)
        assert r.status_code == 204, r.text
        accept = {"binary": BIN, "json": JSN}[fmt]
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            r = await http.get(f"{base}/records", params={"timeout": 1000}, headers={"Accept": accept})
            assert r.status_code == 200, r.text
            got += r.json()
        return sorted(got, key=lambda x: (x["partition"], x["offset"]))
    finally:
        await http.delete(base)


def raw_values(bootstrap: str, topic: str, partitions: int, n: int) -> list[tuple[int, int, Any, Any]]:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{time.time_ns()}", "enable.auto.commit": False})
    try:
        c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, Any, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is None:
                    got.append((m.partition(), m.offset(), m.key(), m.value()))
        return sorted(got)
    finally:
        c.close()


def offsets_ok(r: httpx.Response, n: int) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == V2
    body = r.json()
    assert set(body) == {"offsets", "key_schema_id", "value_schema_id"}
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    offs = body["offsets"]
    assert len(offs) == n
    for o in offs:
        assert o["error_code"] is None and o["error"] is None and o["offset"] >= 0, o
    return list(offs)


# -- both formats, both routes, read back ---------------------------------------------------------------------
async def test_binary_topic_route_round_trip(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 3})
    records = []
    for i in range(30):
        rec: dict[str, Any] = {"value": b64(b"value-%d\x00\xff" % i)}
        if i % 3:
            rec["key"] = b64(b"key-%d" % (i % 5))
        if i % 4 == 0:
            rec["headers"] = [{"key": "trace", "value": b64(b"t%d" % i)}, {"key": "none", "value": None}]
        if i % 10 == 7:
            rec["partition"] = 2
        if i == 5:
            rec["value"] = None
        if i % 6 == 1:
            rec["timestamp"] = 1_700_000_000_000 + i
        records.append(rec)
    offs = offsets_ok(await http.post(f"/topics/{topic_name}", json={"records": records}, headers=HB), 30)
    for rec, o in zip(records, offs, strict=True):
        if "partition" in rec:
            assert o["partition"] == 2
        elif "key" in rec:
            assert o["partition"] == partition_for_key(base64.b64decode(rec["key"]), 3)
    got = await consume_back(http, topic_name, 3, 30)
    assert [(g["partition"], g["offset"]) for g in got] == sorted((o["partition"], o["offset"]) for o in offs)
    by_pos = {(g["partition"], g["offset"]): g for g in got}
    for rec, o in zip(records, offs, strict=True):
        g = by_pos[(o["partition"], o["offset"])]
        assert g["topic"] == topic_name
        assert g["key"] == rec.get("key") and g["value"] == rec["value"]
        assert g["headers"] == rec.get("headers", [])
        if "timestamp" in rec:
            assert g["timestamp"] == rec["timestamp"]
        else:
            assert abs(g["timestamp"] - time.time() * 1000) < 120_000
    # a second request appends after the first (offsets keep growing per partition)
    offs2 = offsets_ok(await http.post(f"/topics/{topic_name}/", json={"records": [{"value": "eA==", "partition": 2}]},
                                       headers=HB), 1)
    assert offs2[0]["offset"] == sum(1 for o in offs if o["partition"] == 2)


async def test_json_format_both_routes(broker: AnyBroker, http: httpx.AsyncClient, bclient: KafkaClient,
                                       topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    values: list[Any] = [{"n": 1, "s": "é\u2028", "nested": {"a": [1, 2.5, None, True]}}, [1, "two"], "text", 42,
                         123456789012345678901234567890, -1.5e300, None, False, {}]
    records = [{"key": {"id": i} if i % 2 else None, "value": v} for i, v in enumerate(values)]
    offs = offsets_ok(await http.post(f"/topics/{topic_name}/partitions/1", json={"records": records}, headers=HJ),
                      len(values))
    assert [o["partition"] for o in offs] == [1] * len(values)
    assert [o["offset"] for o in offs] == list(range(len(values)))
    keyed = offsets_ok(await http.post(f"/topics/{topic_name}", json={"records": [{"key": "k", "value": {"x": 1}}]},
                                       headers=HJ), 1)
    assert keyed[0]["partition"] == partition_for_key(b'"k"', 2)
    # stored as compact JSON text; null is a null value; big integers exactly
    raw = await asyncio.to_thread(raw_values, broker.bootstrap, topic_name, 2, len(values) + 1)
    p1 = [(k, v) for p, _, k, v in raw if p == 1][:len(values)]
    assert [v for _, v in p1] == [None if v is None else json.dumps(v, separators=(",", ":"), ensure_ascii=False)
                                  .encode() for v in values]
    assert p1[1][0] == b'{"id":1}' and p1[0][0] is None
    assert b"123456789012345678901234567890" in [v for _, v in p1]
    # read back through the gateway in json format: the same JSON values
    got = await consume_back(http, topic_name, 2, len(values) + 1, fmt="json")
    part1 = [g for g in got if g["partition"] == 1]
    assert [g["value"] for g in part1] == values
    assert [g["key"] for g in part1] == [r["key"] for r in records]


async def test_partition_route_binary_and_subscribe_round_trip(http: httpx.AsyncClient, bclient: KafkaClient,
                                                               topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    body = {"records": [{"key": b64(b"k%d" % i), "value": b64(b"v%d" % i)} for i in range(5)]
            + [{"value": b64(b"same"), "partition": 0}]}
    offs = offsets_ok(await http.post(f"/topics/{topic_name}/partitions/0", json=body, headers=HB), 6)
    assert [(o["partition"], o["offset"]) for o in offs] == [(0, i) for i in range(6)]
    got = await consume_back(http, topic_name, 2, 6, subscribe=True)
    assert [base64.b64decode(g["value"]) for g in got] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"same"]
    assert {g["partition"] for g in got} == {0}


async def test_schema_valid_bodies_are_accepted(http: httpx.AsyncClient, bclient: KafkaClient,
                                                topic_name: str) -> None:
    """Regressions found by schemathesis (ST202): integral floats are integers (JSON Schema), a header
    without a value is a null one, and on the partition route a record's partition is ignored (the path wins,
    as in Confluent)."""
    await bclient.create_topics({topic_name: 2})
    body = b'{"records":[{"value":"eA==","partition":1.0,"timestamp":406.0,"headers":[{"key":"h"}]}]}'
    offs = offsets_ok(await http.post(f"/topics/{topic_name}", content=body, headers=HB), 1)
    assert offs[0]["partition"] == 1
    body = (b'{"key_schema":"x","key_schema_id":3,"records":[{"headers":[],"key":{"k":2.7086731049929216e+16},'
            b'"partition":2147483646,"timestamp":0,"value":null},{"value":1,"partition":null,"timestamp":5.0}],'
            b'"value_schema":null,"value_schema_id":null}')
    offs = offsets_ok(await http.post(f"/topics/{topic_name}/partitions/0", content=body, headers=HJ), 2)
    assert [o["partition"] for o in offs] == [0, 0]
    got = await consume_back(http, topic_name, 2, 3)
    assert [(g["partition"], g["timestamp"]) for g in got] == [(0, 0), (0, 5), (1, 406)]
    assert got[2]["headers"] == [{"key": "h", "value": None}]


async def test_concurrent_requests_are_all_acknowledged_in_order(http: httpx.AsyncClient, bclient: KafkaClient,
                                                                 topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})

    async def post(j: int) -> list[dict[str, Any]]:
        body = {"records": [{"value": b64(b"%d-%d" % (j, i))} for i in range(50)]}
        return offsets_ok(await http.post(f"/topics/{topic_name}/partitions/0", json=body, headers=HB), 50)

    results = await asyncio.gather(*(post(j) for j in range(20)))
    for offs in results:
        o = [x["offset"] for x in offs]
        assert o == list(range(o[0], o[0] + 50))
    assert sorted(x["offset"] for offs in results for x in offs) == list(range(1000))


# -- errors ---------------------------------------------------------------------------------------------------
ERROR_CASES: list[tuple[str, str | None, bytes, int, int, str]] = [
    # (path suffix, content type, body, status, error code, message fragment)
    ("", "application/vnd.kafka.avro.v2+json", b'{"records":[{"value":1}]}', 422, 42211, "GATEWAY_SCHEMA_REGISTRY_URL"),
    ("", "application/vnd.kafka.protobuf.v2+json", b'{"records":[{"value":1}]}', 422, 42211,
     "GATEWAY_SCHEMA_REGISTRY_URL"),
    ("", "application/vnd.kafka.jsonschema.v2+json", b'{"records":[{"value":1}]}', 422, 42211,
     "GATEWAY_SCHEMA_REGISTRY_URL"),
    ("", V2, b'{"records":[{"value":"eA=="}]}', 415, 41501, "unsupported content type"),
    ("", "application/json", b'{"records":[{"value":"eA=="}]}', 415, 41501, "unsupported content type"),
    ("", "text/plain", b"x", 415, 41501, "unsupported content type"),
    ("", None, b'{"records":[{"value":"eA=="}]}', 415, 41501, "(none)"),
    ("", BIN, b"", 422, 42206, "empty"),
    ("", BIN, b"{bad", 400, 40001, "malformed JSON"),
    ("", BIN, b"[]", 422, 42206, "JSON object"),
    ("", BIN, b"{}", 422, 42206, "records must be a non-empty array"),
    ("", BIN, b'{"records":[]}', 422, 42206, "records must be a non-empty array"),
    ("", BIN, b'{"records":{"value":"eA=="}}', 422, 42206, "records must be a non-empty array"),
    ("", BIN, b'{"records":[{"value":"eA=="}],"extra":1}', 422, 42206, "'extra'"),
    ("", BIN, b'{"records":["eA=="]}', 422, 42206, "records[0] must be an object"),
    ("", BIN, b'{"records":[{"value":"eA=="},{"vaule":"eA=="}]}', 422, 42206, "records[1]: unknown field(s) 'vaule'"),
    ("", BIN, b'{"records":[{"value":"not base64!"}]}', 422, 42206, "records[0].value is not valid base64"),
    ("", BIN, b'{"records":[{"key":"eA","value":null}]}', 422, 42206, "records[0].key is not valid base64"),
    ("", BIN, b'{"records":[{"value":12}]}', 422, 42206, "records[0].value must be a base64 string"),
    ("", BIN, b'{"records":[{"value":"eA==","headers":{"a":"b"}}]}', 422, 42206, "records[0].headers must be"),
    ("", BIN, b'{"records":[{"value":"eA==","headers":[{"key":1}]}]}', 422, 42206, "headers[0] must be"),
    ("", JSN, b'{"records":[{"value":1,"headers":[{"key":"h","value":"%%"}]}]}', 422, 42206,
     "records[0].headers[0].value is not valid base64"),
    ("", BIN, b'{"records":[{"value":"eA==","partition":-1}]}', 422, 42207, "records[0].partition"),
    ("", BIN, b'{"records":[{"value":"eA==","partition":"0"}]}', 422, 42207, "records[0].partition"),
    ("", BIN, b'{"records":[{"value":"eA==","partition":true}]}', 422, 42207, "records[0].partition"),
    ("", BIN, b'{"records":[{"value":"eA==","partition":0.5}]}', 422, 42207, "records[0].partition"),
    ("", JSN, b'{"records":[{"value":1,"timestamp":-5}]}', 422, 42207, "records[0].timestamp"),
    ("", BIN, b'{"records":[{"value":"eA==","partition":7}]}', 404, 40402, "partition 7"),
    ("/partitions/7", BIN, b'{"records":[{"value":"eA=="}]}', 404, 40402, "partition 7"),
    ("/partitions/-1", BIN, b'{"records":[{"value":"eA=="}]}', 404, 40402, "partition -1"),
    ("/partitions/x", BIN, b'{"records":[{"value":"eA=="}]}', 422, 42207, "partition"),
]


@pytest.mark.parametrize("suffix,ctype,body,status,code,fragment", ERROR_CASES)
async def test_error_paths(http: httpx.AsyncClient, bclient: KafkaClient, suffix: str, ctype: str | None,
                           body: bytes, status: int, code: int, fragment: str) -> None:
    topic = "produce-errors"
    await bclient.create_topics({topic: 2})
    headers = {"Content-Type": ctype} if ctype else {}
    r = await http.post(f"/topics/{topic}{suffix}", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == V2
    err = r.json()
    assert err["error_code"] == code and fragment in err["message"], err


async def test_body_over_the_size_cap(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    big = {"records": [{"value": b64(b"x" * 600_000)}, {"value": b64(b"y" * 600_000)}]}  # > 1 MiB as JSON
    r = await http.post(f"/topics/{topic_name}", json=big, headers=HB)
    assert r.status_code == 413 and r.json()["error_code"] == 41301, r.text
    one = {"records": [{"value": b64(b"x" * 600_000)}]}  # a large record under the cap is fine
    assert offsets_ok(await http.post(f"/topics/{topic_name}", json=one, headers=HB), 1)[0]["offset"] == 0


async def test_nothing_is_produced_by_a_rejected_request(broker: AnyBroker, http: httpx.AsyncClient,
                                                         bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 2})
    good = {"value": b64(b"good")}
    for body in ({"records": [good, {"value": "%%%"}]}, {"records": [good, {"value": "eA==", "partition": 5}]}):
        r = await http.post(f"/topics/{topic_name}", json=body, headers=HB)
        assert r.status_code in (404, 422), r.text
    offsets_ok(await http.post(f"/topics/{topic_name}/partitions/1", json={"records": [good]}, headers=HB), 1)
    raw = await asyncio.to_thread(raw_values, broker.bootstrap, topic_name, 2, 1)
    assert raw == [(1, 0, None, b"good")]  # only the accepted request's record


async def test_unknown_topics_and_ignored_schema_fields(http: httpx.AsyncClient, bclient: KafkaClient,
                                                        topic_name: str) -> None:
    body = {"records": [{"value": "eA=="}]}
    for path in (f"/topics/{topic_name}", f"/topics/{topic_name}/partitions/0", "/topics/bad%20name",
                 "/topics/" + "x" * 250):
        r = await http.post(path, json=body, headers=HB)
        assert r.status_code == 404 and r.json()["error_code"] == 40401, (path, r.text)
    await bclient.create_topics({topic_name: 1})  # now it exists: found at once (no negative cache)
    r = await http.post(f"/topics/{topic_name}", json={**body, "key_schema": "x", "value_schema_id": 3}, headers=HB)
    body_ok = offsets_ok(r, 1)
    assert body_ok[0]["partition"] == 0


async def test_metrics_count_produced_records(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})

    def metric(text: str, name: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + '{tenant="default"}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    # Tansu lists a topic created a moment ago as unknown now and then (to the catalog or to the producer's
    # own metadata request): count around a second produce, once a first one went through
    for _ in range(200):  # up to ~10 s, polling the broker's metadata: no event to wait for
        warm = await http.post(f"/topics/{topic_name}", json={"records": [{"value": b64(b"w")}]}, headers=HB)
        if warm.status_code == 200:
            break
        await asyncio.sleep(0.05)  # (a 404 or a retriable 5xx while Tansu settles; checked after the loop)
    offsets_ok(warm, 1)
    before = (await http.get("/metrics")).text
    offsets_ok(await http.post(f"/topics/{topic_name}", json={"records": [
        {"key": b64(b"ab"), "value": b64(b"cde")}, {"value": b64(b"f")}]}, headers=HB), 2)
    after = (await http.get("/metrics")).text
    assert metric(after, "kcg_records_produced_total") - metric(before, "kcg_records_produced_total") == 2
    assert metric(after, "kcg_record_bytes_produced_total") - metric(before, "kcg_record_bytes_produced_total") == 6
    assert 'route="/topics/{topic}"' in after


# -- tenants --------------------------------------------------------------------------------------------------
KEY_P = "produce-tenant-key-123"


@pytest.fixture(scope="module")
def tenant_gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("ptenants")
    f = Path(d) / "tenants.yaml"
    f.write_text(f"""
version: 1
tenants:
  - id: writer
    api_keys: ["sha256:{hashlib.sha256(KEY_P.encode()).hexdigest()}"]
    topics: ["w-*"]
""")
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f)}, log_file=d / "gw.log") as g:
        yield g


async def test_tenant_topic_patterns_and_auth(tenant_gw: GatewayProcess, bclient: KafkaClient) -> None:
    await bclient.create_topics({"w-orders": 1, "other-orders": 1})
    body = {"records": [{"value": "eA=="}]}
    async with httpx.AsyncClient(base_url=tenant_gw.url, timeout=30) as http:
        r = await http.post("/topics/w-orders", json=body, headers=HB)
        assert r.status_code == 401 and r.json()["error_code"] == 40101
        auth = {**HB, "Authorization": f"Bearer {KEY_P}"}
        for path in ("/topics/other-orders", "/topics/other-orders/partitions/0"):
            r = await http.post(path, json=body, headers=auth)
            assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text
        offsets_ok(await http.post("/topics/w-orders", json=body, headers=auth), 1)


# -- broker failures, over the protocol-level test broker -------------------------------------------------------
@contextlib.asynccontextmanager
async def gated_gateway(tmp_path: Path, delivery_timeout_ms: int
                        ) -> AsyncIterator[tuple[TestCluster, ProduceGate, GatewayProcess]]:
    gate = ProduceGate()
    async with TestCluster(topics={"t": 2}, registry=gate.registry) as cluster:
        g = GatewayProcess(cluster.bootstrap_servers, log_file=tmp_path / "gw.log",
                           env={"GATEWAY_PRODUCER_DELIVERY_TIMEOUT_MS": str(delivery_timeout_ms),
                                "GATEWAY_REQUEST_TIMEOUT_MS": "500"})
        await asyncio.to_thread(g.start)
        try:
            yield cluster, gate, g
        finally:
            await asyncio.to_thread(g.stop)


@pytest.fixture
async def gate_gw(tmp_path: Path) -> AsyncIterator[tuple[TestCluster, ProduceGate, GatewayProcess]]:
    async with gated_gateway(tmp_path, 1500) as parts:
        yield parts


@pytest.fixture
async def patient_gate_gw(tmp_path: Path) -> AsyncIterator[tuple[TestCluster, ProduceGate, GatewayProcess]]:
    """A produce held by the broker stays in flight for seconds (retried every request timeout, 0.5 s), not only
    until a 1.5 s delivery timeout that a loaded machine can spend before the test even sends SIGTERM."""
    async with gated_gateway(tmp_path, 30000) as parts:
        yield parts


async def test_per_record_kafka_errors(gate_gw: tuple[TestCluster, ProduceGate, GatewayProcess]) -> None:
    cluster, gate, g = gate_gw
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        two = {"records": [{"value": b64(b"a"), "partition": 0}, {"value": b64(b"b"), "partition": 1}]}
        offsets_ok(await http.post("/topics/t", json=two, headers=HB), 2)
        # a non-retriable error for the request: every record carries 50002 and the Kafka error
        gate.plan = [87]
        r = await http.post("/topics/t/partitions/0", json={"records": [{"value": b64(b"x")}] * 2}, headers=HB)
        assert r.status_code == 200, r.text
        for o in r.json()["offsets"]:
            assert o == {"partition": None, "offset": None, "error_code": 50002, "error": o["error"]}
            assert "INVALID_RECORD (87)" in o["error"]
        # a leadership error is retried: success
        gate.plan = [6]
        offsets_ok(await http.post("/topics/t/partitions/0", json={"records": [{"value": b64(b"y")}]}, headers=HB), 1)
        # not authorized: 403 and 40301 per record, like Confluent
        gate.plan = [29]
        r = await http.post("/topics/t/partitions/1", json={"records": [{"value": b64(b"z")}]}, headers=HB)
        assert r.status_code == 403 and r.json()["offsets"][0]["error_code"] == 40301, r.text
        # a broker that stops answering: retriable 50003 after the delivery timeout, outcome unknown
        cluster.delay(M.ApiKey.PRODUCE, math.inf, count=1000)
        t0 = time.monotonic()
        r = await http.post("/topics/t/partitions/1", json={"records": [{"value": b64(b"w")}]}, headers=HB)
        assert r.status_code == 200 and time.monotonic() - t0 < 10, r.text
        (o,) = r.json()["offsets"]
        assert o["error_code"] == 50003 and "may have been written" in o["error"]
        cluster.clear_faults()
        offsets_ok(await http.post("/topics/t/partitions/1", json={"records": [{"value": b64(b"v")}]}, headers=HB), 1)
        assert [r.value for r in cluster.partition_log("t", 0).records()] == [b"a", b"y"]


async def test_sigterm_lets_an_in_flight_produce_finish(
        patient_gate_gw: tuple[TestCluster, ProduceGate, GatewayProcess], tmp_path: Path) -> None:
    cluster, _, g = patient_gate_gw
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
        offsets_ok(await http.post("/topics/t/partitions/0", json={"records": [{"value": b64(b"warm")}]},
                                   headers=HB), 1)
        release = asyncio.Event()
        cluster.delay(M.ApiKey.PRODUCE, until=release)
        since = len(cluster.requests())
        post = asyncio.create_task(http.post("/topics/t/partitions/0", json={"records": [{"value": b64(b"late")}]},
                                             headers=HB))
        await cluster.wait_for_requests(M.ApiKey.PRODUCE, since=since)
        assert g.proc is not None
        t0 = time.monotonic()
        g.proc.terminate()  # SIGTERM while the broker holds the produce request
        await asyncio.to_thread(_wait_until_refused, g.url, 10)
        # the drain counts the produce in flight (answered from the producer's callback, no task of its own):
        # the listener stays open for the whole drain window (1.5 s), not only the 0.5 s quiet period
        assert time.monotonic() - t0 >= 1.2
        release.set()
        r = await post
        assert offsets_ok(r, 1)[0]["offset"] == 1
        assert await asyncio.to_thread(g.proc.wait, 20) == 0
    assert [r.value for r in cluster.partition_log("t", 0).records()] == [b"warm", b"late"]
    assert "Traceback" not in (tmp_path / "gw.log").read_text()


def _wait_until_refused(url: str, timeout: float) -> None:
    """Until the gateway stops accepting connections (it has begun its graceful shutdown)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=5)
        except httpx.ConnectError:  # refused: the listener is closed (a slow answer on a busy machine is not)
            return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the gateway still accepts connections"
        time.sleep(0.02)  # polling another process
