"""Confluent v3 produce (``POST /v3/clusters/{cluster_id}/topics/{topic}/records``) against a real gateway
process over Tansu: one record of each type read back byte for byte with confluent-kafka; streaming over one
chunked request with a raw HTTP/1.1 client that reads each result before sending the next record; 1,000
records in one stream stored exactly once, in order; per-record errors that leave the other records alone;
whole-request errors; tenant isolation; the per-record body limit; the result shapes against Confluent's
published ``ProduceResponse`` schema."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from service.client.client import KafkaClient
from tests.conftest import AnyBroker
from tests.fakes.broker import TestCluster
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.test_produce_vs_test_broker import ProduceGate
from tests.v3_shapes import OBJECTS, check

pytestmark = pytest.mark.integration
KEY_A, KEY_B = "v3-produce-key-a-1234", "v3-produce-key-b-5678"
JSON_CT = {"Content-Type": "application/json"}


def sha(k: str) -> str:
    return "sha256:" + hashlib.sha256(k.encode()).hexdigest()


TENANTS = f"""
version: 1
tenants:
  - id: tenant-a
    api_keys: ["{sha(KEY_A)}"]
    topics: ["a-*"]
  - id: tenant-b
    api_keys: ["{sha(KEY_B)}"]
    topics: ["b-*"]
"""


def auth(key: str = KEY_A) -> dict[str, str]:
    return {**JSON_CT, "Authorization": f"Bearer {key}"}


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    d = tmp_path_factory.mktemp("v3produce")
    f = Path(d) / "tenants.yaml"
    f.write_text(TENANTS)
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(f)}, log_file=d / "gw.log") as g:
        yield g


@pytest.fixture(scope="module")
def gw_small(broker: AnyBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """No tenants file (metrics readable), a 64 KiB body limit, topics created on first produce."""
    d = tmp_path_factory.mktemp("v3small")
    env = {"GATEWAY_MAX_BODY_BYTES": "65536", "GATEWAY_AUTO_CREATE_TOPICS": "true",
           "GATEWAY_AUTO_CREATE_PARTITIONS": "2"}
    with GatewayProcess(broker.bootstrap, env=env, log_file=d / "gw.log") as g:
        yield g


@pytest.fixture
async def cluster(bclient: KafkaClient) -> str:
    await bclient.refresh_metadata()
    cid = bclient.metadata.cluster_id
    assert cid
    return cid


@pytest.fixture
def a_topic(topic_name: str) -> str:
    return "a-" + topic_name


def records_path(cluster: str, topic: str) -> str:
    return f"/v3/clusters/{cluster}/topics/{topic}/records"


def results_of(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.content.endswith(b"\r\n")
    return [orjson.loads(line) for line in r.content.split(b"\r\n") if line]


def read_back(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    """Every record of ``topic`` (expects ``n``), as confluent-kafka messages sorted by (partition, offset)."""
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{time.time_ns()}", "enable.auto.commit": False})
    try:
        c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += [m for m in c.consume(num_messages=2000, timeout=0.5) if m.error() is None]
        # anything beyond n would be a duplicate: give it a moment to show up
        got += [m for m in c.consume(num_messages=2000, timeout=0.5) if m.error() is None]
        return sorted(got, key=lambda m: (m.partition(), m.offset()))
    finally:
        c.close()


class ChunkedClient:
    """A raw HTTP/1.1 client: the request body goes out one chunk at a time while the chunked response is
    read concurrently (httpx sends the whole body before it reads a response)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.status = 0
        self._body = b""
        self._done = False

    @classmethod
    async def open(cls, url: str, path: str, headers: dict[str, str]) -> ChunkedClient:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode())
        await writer.drain()
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def end(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def _head(self) -> None:
        if self.status:
            return
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        assert b"transfer-encoding: chunked" in head.lower(), head

    async def result(self) -> dict[str, Any] | None:
        """The next result; None when the response ended."""
        await self._head()
        while b"\r\n" not in self._body:
            if self._done:
                assert not self._body, self._body
                return None
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                self._done = True
            self._body += data[:-2]
        line, self._body = self._body.split(b"\r\n", 1)
        return dict(orjson.loads(line))

    async def all_results(self) -> list[dict[str, Any]]:
        out = []
        while (r := await self.result()) is not None:
            out.append(r)
        return out

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@pytest.fixture
async def chunked(gw: GatewayProcess) -> AsyncIterator[list[ChunkedClient]]:
    clients: list[ChunkedClient] = []
    yield clients
    for c in clients:
        await c.close()


def assert_confluent_shape(result: dict[str, Any]) -> None:
    """A success is a Confluent ProduceResponse (with its error_code 200 and an RFC 3339 timestamp); a failure
    is Confluent's Error body."""
    if result["error_code"] == 200:
        check(result, "ProduceResponse")
        assert result["timestamp"].endswith("Z")
        for part in ("key", "value"):
            if part in result:
                assert result[part]["type"] in ("BINARY", "JSON", "STRING")
    else:
        check(result, "Error")
        assert result["error_code"] != 200 and result["message"]


# -- one record of each kind, read back byte for byte -----------------------------------------------------
async def test_single_records_of_every_type_round_trip(gw: GatewayProcess, broker: AnyBroker, http: httpx.AsyncClient,
                                                      bclient: KafkaClient, cluster: str, a_topic: str) -> None:
    await bclient.create_topics({a_topic: 3})
    path = records_path(cluster, a_topic)
    cases: list[tuple[dict[str, Any], bytes | None, bytes | None]] = [
        ({"value": {"type": "BINARY", "data": b64(b"\x00\x01\xfe\xff")}}, None, b"\x00\x01\xfe\xff"),
        ({"key": {"type": "STRING", "data": "clé"}, "value": {"type": "JSON", "data": {"n": 1, "l": [True, None]}}},
         "clé".encode(), b'{"n":1,"l":[true,null]}'),
        ({"key": {"type": "JSON", "data": 123456789012345678901234567890}, "value": {"type": "STRING", "data": ""}},
         b"123456789012345678901234567890", b""),
        ({"key": None, "value": {"type": "JSON", "data": "text"}, "partition_id": 2,
          "headers": [{"name": "h1", "value": b64(b"v\x00")}, {"name": "h2", "value": None}, {"name": "h1"}],
          "timestamp": "2021-02-05T19:14:42.123Z"}, None, b'"text"'),
        ({"value": {"type": "BINARY", "data": None}, "partition_id": 1, "timestamp": "2022-01-01T01:00:00+01:00"},
         None, None),
    ]
    results = []
    before = time.time()
    for body, _, _ in cases:
        r = await http.post(path, content=json.dumps(body), headers=auth())  # (orjson: no integers beyond 64 bits)
        out = results_of(r)
        assert len(out) == 1
        assert_confluent_shape(out[0])
        assert out[0]["error_code"] == 200, out
        results.append(out[0])
    for (body, key, value), res in zip(cases, results, strict=True):
        assert res["cluster_id"] == cluster and res["topic_name"] == a_topic
        for part, data in (("key", key), ("value", value)):
            if body.get(part) is None:
                assert part not in res
            else:
                assert res[part] == {"type": body[part]["type"], "size": -1 if data is None else len(data)}
    assert results[3]["partition_id"] == 2 and results[3]["timestamp"] == "2021-02-05T19:14:42.123Z"
    assert results[4]["partition_id"] == 1 and results[4]["timestamp"] == "2022-01-01T00:00:00Z"
    got = await asyncio.to_thread(read_back, broker.bootstrap, a_topic, 3, len(cases))
    assert len(got) == len(cases)
    by_pos = {(m.partition(), m.offset()): m for m in got}
    for (body, key, value), res in zip(cases, results, strict=True):
        m = by_pos[(res["partition_id"], res["offset"])]
        assert m.key() == key and m.value() == value
        want_headers = [(h["name"], None if h.get("value") is None else base64.b64decode(h["value"]))
                        for h in body.get("headers", [])]
        assert (m.headers() or []) == want_headers
        ts = m.timestamp()[1]
        if "timestamp" in body:
            assert ts == {"2021-02-05T19:14:42.123Z": 1612552482123, "2022-01-01T01:00:00+01:00": 1640995200000}[
                body["timestamp"]]
        else:
            assert before * 1000 - 5000 <= ts <= time.time() * 1000 + 5000
            assert res["timestamp"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(ts / 1000)))


# -- streaming ------------------------------------------------------------------------------------------------
async def test_stream_answers_each_record_before_the_body_ends(gw: GatewayProcess, bclient: KafkaClient,
                                                              cluster: str, a_topic: str,
                                                              chunked: list[ChunkedClient]) -> None:
    await bclient.create_topics({a_topic: 1})
    c = await ChunkedClient.open(gw.url, records_path(cluster, a_topic), auth())
    chunked.append(c)
    for i in range(20):
        await c.send(orjson.dumps({"value": {"type": "STRING", "data": f"r{i}"}}) + b"\n")
        res = await asyncio.wait_for(c.result(), 20)  # the request is still open: results come as records do
        assert res is not None and res["error_code"] == 200 and res["offset"] == i, res
        assert c.status == 200
    await c.end()
    assert await c.all_results() == []


async def test_stream_of_1000_records_in_order_stored_exactly_once(gw: GatewayProcess, broker: AnyBroker,
                                                                   bclient: KafkaClient, cluster: str, a_topic: str,
                                                                   chunked: list[ChunkedClient]) -> None:
    await bclient.create_topics({a_topic: 3})
    c = await ChunkedClient.open(gw.url, records_path(cluster, a_topic), auth())
    chunked.append(c)
    n = 1000
    values = [b"value-%04d-" % i + bytes([i % 256]) for i in range(n)]

    async def write() -> None:
        for i in range(n):
            rec: dict[str, Any] = {"value": {"type": "BINARY", "data": b64(values[i])}}
            if i % 2:
                rec["key"] = {"type": "STRING", "data": f"k{i % 7}"}
            await c.send(orjson.dumps(rec) + (b"\n" if i % 3 else b""))
        await c.end()

    writer = asyncio.create_task(write())
    results = await asyncio.wait_for(c.all_results(), 120)
    await writer
    assert len(results) == n
    assert all(r["error_code"] == 200 for r in results), [r for r in results if r["error_code"] != 200][:3]
    positions = [(r["partition_id"], r["offset"]) for r in results]
    assert len(set(positions)) == n  # each offset distinct
    for p in range(3):  # per partition, offsets follow the order of the stream
        offs = [o for q, o in positions if q == p]
        assert offs == sorted(offs)
    got = await asyncio.to_thread(read_back, broker.bootstrap, a_topic, 3, n)
    assert len(got) == n  # stored exactly once: no record missing, none twice
    stored = {(m.partition(), m.offset()): m.value() for m in got}
    assert {pos: stored[pos] for pos in positions} == dict(zip(positions, values, strict=True))


async def test_errors_are_per_record_and_the_stream_goes_on(gw: GatewayProcess, broker: AnyBroker,
                                                            http: httpx.AsyncClient, bclient: KafkaClient,
                                                            cluster: str, a_topic: str) -> None:
    await bclient.create_topics({a_topic: 2})
    good = [orjson.dumps({"value": {"type": "STRING", "data": f"good-{i}"}, "partition_id": 0}) for i in range(5)]
    body = b"\n".join([
        good[0],
        b'{"value":{"type":"BINARY","data":"not base64"}}',
        good[1],
        b'{"value":{"type":"STRING","data":"x"},"partition_id":99}',
        b'{"value":{"type":"AVRO","data":"x","schema":"\\"string\\""}}',
        good[2],
        b'{"value": {"type": "JSON", "data": tru}}',
        b'{"vaule":{"type":"STRING","data":"typo"}}',
        good[3],
        b'{"value":{"data":"no type"}}',
        b'{"value":{"type":"STRING","data":"x"},"timestamp":"not a time"}',
        good[4],
    ])
    out = results_of(await http.post(records_path(cluster, a_topic), content=body, headers=auth()))
    for res in out:
        assert_confluent_shape(res)
    assert [r["error_code"] for r in out] == [200, 42206, 200, 40402, 42208, 200, 40001, 42206, 200, 42208, 42207,
                                              200]
    assert "schema registry" in out[4]["message"] and "base64" in out[1]["message"]
    assert [r["offset"] for r in out if r["error_code"] == 200] == [0, 1, 2, 3, 4]
    got = await asyncio.to_thread(read_back, broker.bootstrap, a_topic, 2, 5)
    assert [m.value() for m in got] == [f"good-{i}".encode() for i in range(5)]
    # text that cannot be split into records ends the stream with one error result
    body = good[0] + b" xyz " + good[1]
    out = results_of(await http.post(records_path(cluster, a_topic), content=body, headers=auth()))
    assert [r["error_code"] for r in out] == [200, 40001]
    # a body that ends inside a record
    out = results_of(await http.post(records_path(cluster, a_topic), content=good[2] + b'{"value":', headers=auth()))
    assert [r["error_code"] for r in out] == [200, 40001]
    # one JSON array of records works as a stream of them (as Confluent's MappingIterator reads it)
    out = results_of(await http.post(records_path(cluster, a_topic), content=b"[" + b",".join(good[:2]) + b"]",
                                     headers=auth()))
    assert [r["error_code"] for r in out] == [200, 200]


async def test_unknown_topic_is_a_per_record_40401(http: httpx.AsyncClient, cluster: str, a_topic: str) -> None:
    body = b'{"value":{"type":"STRING","data":"x"}}{"value":{"type":"STRING","data":"y"}}'
    out = results_of(await http.post(records_path(cluster, a_topic), content=body, headers=auth()))
    assert [r["error_code"] for r in out] == [40401, 40401]
    assert_confluent_shape(out[0])


async def test_whole_request_errors(http: httpx.AsyncClient, bclient: KafkaClient, cluster: str, a_topic: str) -> None:
    await bclient.create_topics({a_topic: 1})
    rec = b'{"value":{"type":"STRING","data":"x"}}'
    r = await http.post(records_path("no-such-cluster", a_topic), content=rec, headers=auth())
    assert r.status_code == 404 and r.json()["error_code"] == 404
    r = await http.post(records_path(cluster, a_topic), content=b" \n ", headers=auth())
    assert r.status_code == 422 and r.json()["error_code"] == 42208
    r = await http.post(records_path(cluster, a_topic), content=rec, headers={**auth(), "Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error_code"] == 41501
    r = await http.post(records_path(cluster, a_topic), content=rec, headers=JSON_CT)
    assert r.status_code == 401 and r.json()["error_code"] == 40101


async def test_tenant_isolation(gw: GatewayProcess, broker: AnyBroker, http: httpx.AsyncClient,
                                bclient: KafkaClient, cluster: str, topic_name: str,
                                chunked: list[ChunkedClient]) -> None:
    a, b = "a-" + topic_name, "b-" + topic_name
    await bclient.create_topics({a: 1, b: 1})
    rec = b'{"value":{"type":"STRING","data":"x"}}'
    # tenant B may not write tenant A's topic (nor A B's): 403 before any record is read
    r = await http.post(records_path(cluster, a), content=rec, headers=auth(KEY_B))
    assert r.status_code == 403 and r.json()["error_code"] == 40301
    r = await http.post(records_path(cluster, b), content=rec, headers=auth(KEY_A))
    assert r.status_code == 403 and r.json()["error_code"] == 40301
    # also for a stream: refused at once, nothing written
    c = await ChunkedClient.open(gw.url, records_path(cluster, a), auth(KEY_B))
    chunked.append(c)
    await c.send(rec)
    head = await asyncio.wait_for(c.reader.readuntil(b"\r\n"), 20)
    assert b" 403 " in head
    assert [r["error_code"] for r in results_of(await http.post(records_path(cluster, b), content=rec,
                                                                 headers=auth(KEY_B)))] == [200]
    assert await asyncio.to_thread(read_back, broker.bootstrap, a, 1, 0) == []


async def test_contract_names_the_operation_and_the_result_shape() -> None:
    from api.contract import app_schema

    schema = app_schema()

    def resolve(s: dict[str, Any]) -> dict[str, Any]:
        return schema["components"]["schemas"][s["$ref"].rsplit("/", 1)[1]] if "$ref" in s else s

    op = schema["paths"]["/v3/clusters/{cluster_id}/topics/{topic_name}/records"]["post"]
    assert op["operationId"] == "produceRecord"
    body = resolve(next(iter(op["requestBody"]["content"].values()))["schema"])  # JSON (the media type: openapi.py)
    assert {"partition_id", "headers", "key", "value", "timestamp"} <= set(body["properties"])
    result = resolve(op["responses"]["200"]["content"]["application/json"]["schema"])
    assert set(OBJECTS["ProduceResponse"]) <= set(result["properties"])


# -- the body limit applies per record; metrics ----------------------------------------------------------------
async def test_long_stream_beyond_the_body_limit_works_and_a_huge_record_ends_it(
        gw_small: GatewayProcess, broker: AnyBroker, bclient: KafkaClient, cluster: str,
        topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    path = records_path(cluster, topic_name)
    rec = orjson.dumps({"value": {"type": "BINARY", "data": b64(b"z" * 1500)}})
    n = 100  # ~200 KB in one stream, the limit is 64 KiB
    c = await ChunkedClient.open(gw_small.url, path, JSON_CT)
    try:
        for _ in range(n):
            await c.send(rec)
        await c.send(orjson.dumps({"value": {"type": "STRING", "data": "h" * 70_000}}))  # one record > 64 KiB
        await c.send(rec)
        await c.end()
        out = await asyncio.wait_for(c.all_results(), 60)
    finally:
        await c.close()
    assert c.status == 200
    assert [r["error_code"] for r in out] == [200] * n + [41301]
    async with httpx.AsyncClient(base_url=gw_small.url, timeout=30) as http:
        # with a Content-Length above the limit, the request is refused at once
        r = await http.post(path, content=rec * 60, headers=JSON_CT)
        assert r.status_code == 413 and r.json()["error_code"] == 41301
        metrics = (await http.get("/metrics")).text
    line = next(x for x in metrics.splitlines() if x.startswith('kcg_records_produced_total{tenant="default"}'))
    assert float(line.split()[-1]) >= n
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 1, n)
    assert len(got) == n


async def test_sigterm_ends_an_open_stream_after_answering_what_was_read(broker: AnyBroker, bclient: KafkaClient,
                                                                        cluster: str, topic_name: str,
                                                                        tmp_path: Path) -> None:
    """At SIGTERM a stream stops reading records: those read are produced and answered, then one 50301 result
    ends it, and the gateway exits without waiting for the client to close its request."""
    await bclient.create_topics({topic_name: 1})
    g = GatewayProcess(broker.bootstrap, env={"GATEWAY_SHUTDOWN_DRAIN_S": "30", "GATEWAY_SHUTDOWN_TIMEOUT_S": "30"},
                       log_file=tmp_path / "gw.log")
    g.start()
    try:
        c = await ChunkedClient.open(g.url, records_path(cluster, topic_name), JSON_CT)
        try:
            for i in range(5):
                await c.send(orjson.dumps({"value": {"type": "STRING", "data": f"r{i}"}}))
                res = await asyncio.wait_for(c.result(), 20)
                assert res is not None and res["error_code"] == 200 and res["offset"] == i
            assert g.proc is not None
            started = time.monotonic()
            g.proc.terminate()
            last = await asyncio.wait_for(c.result(), 20)
            assert last is not None and last["error_code"] == 50301, last
            assert await asyncio.wait_for(c.result(), 20) is None  # the response ended
            assert await asyncio.to_thread(g.proc.wait, 20) == 0
            assert time.monotonic() - started < 15  # not the 30 s drain window
        finally:
            await c.close()
    finally:
        g.stop()
    got = await asyncio.to_thread(read_back, broker.bootstrap, topic_name, 1, 5)
    assert [m.value() for m in got] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert "Traceback" not in (tmp_path / "gw.log").read_text()


async def test_auto_create_applies_as_in_v2(gw_small: GatewayProcess, bclient: KafkaClient, cluster: str,
                                           topic_name: str) -> None:
    """With GATEWAY_AUTO_CREATE_TOPICS the first record creates the topic (as v2 produce does); internal names
    never are."""
    body = b'{"value":{"type":"STRING","data":"x"},"partition_id":1}{"value":{"type":"STRING","data":"y"}}'
    async with httpx.AsyncClient(base_url=gw_small.url, timeout=30) as http:
        out = results_of(await http.post(records_path(cluster, topic_name), content=body, headers=JSON_CT))
        assert (out[0]["error_code"], out[0]["partition_id"]) == (200, 1)
        assert out[1]["error_code"] == 200
        r = await http.post(records_path(cluster, "__v3_" + topic_name), content=body, headers=JSON_CT)
        assert r.status_code == 403 and r.json()["error_code"] == 40301, r.text  # internal: denied to every tenant
    await bclient.refresh_metadata([topic_name])
    assert bclient.metadata.partitions(topic_name) == [0, 1]


# -- broker refusals, over the protocol-level test broker ------------------------------------------------------
async def test_kafka_errors_are_per_record_results(tmp_path: Path) -> None:
    """A record the broker refuses gets its Kafka error code (50002, 40301; the HTTP status stays 200, unlike
    v2's 403, since the answer is a stream), the records around it are stored."""
    gate = ProduceGate()
    async with TestCluster(topics={"t": 2}, registry=gate.registry) as tc:
        g = GatewayProcess(tc.bootstrap_servers, log_file=tmp_path / "gw.log")
        await asyncio.to_thread(g.start)
        client = KafkaClient(tc.bootstrap_servers)
        try:
            await client.refresh_metadata()
            cid = client.metadata.cluster_id or "tenant-default"
            path = records_path(cid, "t")

            def rec(v: str) -> bytes:
                return orjson.dumps({"value": {"type": "STRING", "data": v}, "partition_id": 0})

            async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
                assert [r["error_code"] for r in results_of(await http.post(path, content=rec("a"),
                                                                             headers=JSON_CT))] == [200]
                for code, want in ((87, 50002), (29, 40301)):
                    gate.plan = [code]
                    out = results_of(await http.post(path, content=rec("refused") + rec("refused"),
                                                     headers=JSON_CT))
                    assert [r["error_code"] for r in out] == [want, want], out
                    assert f"({code})" in out[0]["message"]
                    assert_confluent_shape(out[0])
                gate.plan = [6]  # NOT_LEADER_OR_FOLLOWER is retried: stored once
                assert [r["error_code"] for r in results_of(await http.post(path, content=rec("b"),
                                                                             headers=JSON_CT))] == [200]
            assert [r.value for r in tc.partition_log("t", 0).records()] == [b"a", b"b"]
        finally:
            await client.close()
            await asyncio.to_thread(g.stop)
