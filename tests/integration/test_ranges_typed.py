"""Typed offset-range reads: records produced by confluent-kafka's AvroSerializer (and
JSONSerializer) against the real Karapace registry (``schema_registry``), a schema evolution mid-range,
read back through a gateway process as typed Arrow (``format=avro``): one reader schema per page (the latest
writer's by default, or pinned), rows of other writer schemas resolved into it, undecodable rows as error
rows with their bytes, and the request errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from service.schemas.wire import frame
from tests.conftest import AnyBroker
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.proto_orders import order_class

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ARROW = "application/vnd.apache.arrow.stream"
F = descriptor_pb2.FieldDescriptorProto

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                   {"name": "note", "type": ["null", "string"], "default": None}]}
# the same full name with an "id" no long can be read as: not resolvable into ORDER_V2
ORDER_BAD = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "string"}]}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, schema_registry: str,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": schema_registry},
                        log_file=tmp_path_factory.mktemp("gw-typed") / "gateway.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def new_topic(bootstrap: str) -> str:
    name = f"typed-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, 1, 1)]).values():
        f.result(30)
    return name


def produce(bootstrap: str, topic: str, values: list[bytes | None]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


async def typed_page(http: httpx.AsyncClient, topic: str, **params: Any) -> tuple[pa.Table, httpx.Response]:
    r = await http.get(f"/topics/{topic}/partitions/0/records", headers={"Accept": ARROW},
                       params={"offset": 0, **params})
    assert r.status_code == 200, r.text
    return pa.ipc.open_stream(r.content).read_all(), r


def order(i: int, **extra: Any) -> dict[str, Any]:
    from decimal import Decimal

    return {"id": i, "amount": Decimal(f"{i}.25"), "at": 1_700_000_000_000 + i, "tags": [f"t{i}"], **extra}


async def test_avro_range_with_evolution_reads_typed_columns(
        http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str) -> None:
    topic = new_topic(broker.bootstrap)
    client = SchemaRegistryClient({"url": schema_registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = AvroSerializer(client, json.dumps(ORDER_V1)), AvroSerializer(client, json.dumps(ORDER_V2))
    bad = AvroSerializer(client, json.dumps(ORDER_BAD), conf={"auto.register.schemas": True})
    values = [v1(order(i), ctx) for i in range(3)] + [v2(order(i, note=f"n{i}"), ctx) for i in range(3, 6)]
    values += [b"not avro", None, frame(2_000_000_000, b"\x02"),
               bad({"id": "x"}, SerializationContext(f"{topic}-other", MessageField.VALUE))]
    produce(broker.bootstrap, topic, values)
    id1 = client.get_latest_version(f"{topic}-value").schema_id  # v2 is the subject's latest
    id_v1 = client.get_version(f"{topic}-value", 1).schema_id

    # default reader: the last record with a known Avro schema is ORDER_BAD's -> pin v2 to see evolution
    t, r = await typed_page(http, topic, format="avro", value_schema_id=str(id1))
    assert r.headers["X-Value-Schema-Id"] == str(id1) and r.headers["X-Next-Offset"] == "10"
    assert t.schema.metadata[b"value_schema_id"] == str(id1).encode()
    assert t.column_names == ["topic", "partition", "offset", "timestamp", "key", "value", "headers",
                              "value_schema_id", "error", "value_raw"]
    vt = t.schema.field("value").type
    assert [f.name for f in vt] == ["id", "amount", "at", "tags", "note"]
    assert vt.field("amount").type == pa.decimal128(9, 2) and vt.field("at").type == pa.timestamp("ms", "UTC")
    assert vt.field("tags").type == pa.list_(pa.string())
    rows = t.to_pylist()
    assert [r["offset"] for r in rows] == list(range(10))
    # v1 rows resolved into v2: the added field takes its default
    assert [(r["value"]["id"], r["value"]["note"], str(r["value"]["amount"])) for r in rows[:6]] == [
        (0, None, "0.25"), (1, None, "1.25"), (2, None, "2.25"), (3, "n3", "3.25"), (4, "n4", "4.25"),
        (5, "n5", "5.25")]
    assert rows[0]["value"]["at"].timestamp() * 1000 == 1_700_000_000_000
    assert [r["value_schema_id"] for r in rows] == [id_v1] * 3 + [id1] * 3 + [None, None, 2_000_000_000,
                                                                              rows[9]["value_schema_id"]]
    assert all(r["error"] is None and r["value_raw"] is None for r in rows[:6])
    assert "magic byte" in rows[6]["error"] and rows[6]["value_raw"] == b"not avro" and rows[6]["value"] is None
    assert rows[7]["value"] is None and rows[7]["error"] is None  # a tombstone is no error
    assert "2000000000 not found" in rows[8]["error"]
    assert "cannot be read as schema id" in rows[9]["error"] and rows[9]["value_raw"] == values[9]

    # pinned to v1: v2 rows read with the older schema (the new field dropped)
    t1, _ = await typed_page(http, topic, format="avro", value_schema_id=str(id_v1), end_offset=6)
    assert [f.name for f in t1.schema.field("value").type] == ["id", "amount", "at", "tags"]
    assert [v["id"] for v in t1.column("value").to_pylist()] == list(range(6))

    # default reader (no pin): the latest writer seen in the page
    t3, r3 = await typed_page(http, topic, format="avro", end_offset=6)
    assert r3.headers["X-Value-Schema-Id"] == str(id1)
    assert t3.column("value").to_pylist()[5]["note"] == "n5"

    # the schema alone: an empty range with the subject's latest schema (what the Spark sink plans with)
    t4, r4 = await typed_page(http, topic, format="avro", value_schema_id="latest", end_offset=0)
    assert t4.num_rows == 0 and r4.headers["X-Value-Schema-Id"] == str(id1)
    assert t4.schema.field("value").type == vt

    # paging: max_bytes keeps pages small, the reader pinned, every page the same type
    seen, off = [], 0
    while off < 6:
        tp, rp = await typed_page(http, topic, format="avro", value_schema_id=str(id1), offset=off,
                                  end_offset=6, max_bytes=40)
        assert tp.schema.field("value").type == vt
        seen += tp.column("offset").to_pylist()
        off = int(rp.headers["X-Next-Offset"])
    assert seen == list(range(6))


async def test_jsonschema_typed_range(http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str) -> None:
    topic = new_topic(broker.bootstrap)
    client = SchemaRegistryClient({"url": schema_registry})
    schema = {"type": "object", "title": "Evt", "properties": {
        "n": {"type": "integer"}, "who": {"$ref": "#/definitions/who"}, "any": {}},
        "definitions": {"who": {"type": "object", "properties": {"name": {"type": ["null", "string"]}}}}}
    ser = JSONSerializer(json.dumps(schema), client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce(broker.bootstrap, topic, [ser({"n": i, "who": {"name": f"w{i}"}, "any": [i]}, ctx) for i in range(3)])
    t, _ = await typed_page(http, topic, format="jsonschema")
    vt = t.schema.field("value").type
    assert vt.field("n").type == pa.int64() and vt.field("who").type == pa.struct([("name", pa.string())])
    assert vt.field("any").type == pa.string()  # an unconstrained schema: JSON text
    assert t.column("value").to_pylist() == [{"n": i, "who": {"name": f"w{i}"}, "any": f"[{i}]"} for i in range(3)]


async def test_protobuf_typed_range_with_a_reference_and_evolution(
        http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str) -> None:
    topic = new_topic(broker.bootstrap)
    client = SchemaRegistryClient({"url": schema_registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = []
    p = f"p{uuid.uuid4().hex[:6]}"  # the same file and message names in both versions
    for version, with_note in enumerate((False, True)):
        cls = order_class(p, ping_first=True, with_note=with_note)
        ser = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
        for i in range(2):
            msg = cls(order_id=f"o{version}{i}")
            msg.total.units, msg.total.currency = 10 * version + i, "EUR"
            if with_note:
                msg.note = f"n{i}"
            values.append(ser(msg, ctx))
    produce(broker.bootstrap, topic, values)
    t, _ = await typed_page(http, topic, format="protobuf")
    vt = t.schema.field("value").type
    assert [f.name for f in vt] == ["order_id", "total", "note"]  # the latest writer's Order (indexes [1])
    assert vt.field("total").type == pa.struct([("units", pa.int64()), ("currency", pa.string())])
    assert t.column("value").to_pylist() == [
        {"order_id": "o00", "total": {"units": 0, "currency": "EUR"}, "note": ""},  # v1 rows: proto3 default
        {"order_id": "o01", "total": {"units": 1, "currency": "EUR"}, "note": ""},
        {"order_id": "o10", "total": {"units": 10, "currency": "EUR"}, "note": "n0"},
        {"order_id": "o11", "total": {"units": 11, "currency": "EUR"}, "note": "n1"}]
    assert len(set(t.column("value_schema_id").to_pylist())) == 2 and set(t.column("error").to_pylist()) == {None}


async def test_typed_range_request_errors(http: httpx.AsyncClient, broker: AnyBroker) -> None:
    topic = new_topic(broker.bootstrap)
    path = f"/topics/{topic}/partitions/0/records"
    r = await http.get(path, params={"offset": 0, "format": "avro"},
                       headers={"Accept": "application/vnd.kafka.json.v2+json"})
    assert r.status_code == 406 and r.json()["error_code"] == 40601 and ARROW in r.json()["message"]
    r = await http.get(path, params={"offset": 0, "format": "avro"}, headers={"Accept": "*/*"})
    assert r.status_code == 200 and r.headers["content-type"] == ARROW, r.text  # accepting anything: Arrow
    r = await http.get(path, params={"offset": 0, "value_schema_id": "1"}, headers={"Accept": ARROW})
    assert r.status_code == 422 and r.json()["error_code"] == 42206
    r = await http.get(path, params={"offset": 0, "end_offset": 0, "format": "avro", "value_schema_id": "1999999999"},
                       headers={"Accept": ARROW})
    assert r.status_code == 422 and r.json()["error_code"] == 42210, r.text
    r = await http.get(path, params={"offset": 0, "end_offset": 0, "format": "avro", "value_schema_id": "latest"},
                       headers={"Accept": ARROW})
    assert r.status_code == 422 and r.json()["error_code"] in (42210, 42212), r.text  # no subject {topic}-value
    r = await http.get(path, params={"offset": 0, "format": "xml"}, headers={"Accept": ARROW})
    assert r.status_code == 422
