"""Produce formats avro, protobuf and jsonschema against a real registry.

Gateways run in-process (``create_app`` over httpx's ASGI transport, a few ms each) on the module's broker
(Tansu, then Kafka), pointed at the real Karapace registry (``schema_registry``; its own broker holds only the schemas).
Records are read back from Kafka raw and decoded with confluent-kafka's own AvroDeserializer / ProtobufDeserializer /
JSONDeserializer against the same registry. Bodies marked "verbatim" are Confluent's v2 documentation examples.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.schema_registry import Schema as CSchema
from confluent_kafka.schema_registry import SchemaReference as CRef
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool

from api.app import create_app
from service.client.client import KafkaClient
from service.embedded.tansu import free_port
from service.schemas.wire import unframe
from service.settings import Settings
from tests.conftest import AnyBroker
from tests.integration.proto_orders import order_class

pytestmark = pytest.mark.integration
V2 = "application/vnd.kafka.v2+json"
AVRO = {"Content-Type": "application/vnd.kafka.avro.v2+json", "Accept": V2}
PROTOBUF = {"Content-Type": "application/vnd.kafka.protobuf.v2+json", "Accept": V2}
JSONSCHEMA = {"Content-Type": "application/vnd.kafka.jsonschema.v2+json", "Accept": V2}
F = descriptor_pb2.FieldDescriptorProto


@contextlib.asynccontextmanager
async def gateway(bootstrap: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(kafka_bootstrap=bootstrap, **settings), bootstrap)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30) as http:
        yield http


@pytest.fixture
async def http(broker: AnyBroker, schema_registry: str) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(broker.bootstrap, schema_registry_url=schema_registry) as c:
        yield c


def read_raw(bootstrap: str, topic: str, n: int, partitions: int = 1) -> list[Any]:
    """The first ``n`` records of ``topic`` as confluent-kafka Messages, by (partition, offset)."""
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                    "enable.auto.commit": False})
    try:
        c.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            got += [m for m in c.consume(num_messages=100, timeout=0.5) if m.error() is None]
        assert len(got) == n, f"{len(got)} of {n} records"
        return sorted(got, key=lambda m: (m.partition(), m.offset()))
    finally:
        c.close()


ANY = object()  # a schema id, whichever


def produced(r: httpx.Response, n: int, key_id: Any = None, value_id: Any = ANY) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == V2
    body = r.json()
    assert set(body) == {"offsets", "key_schema_id", "value_schema_id"}
    assert len(body["offsets"]) == n and all(o["error_code"] is None and o["offset"] >= 0 for o in body["offsets"])
    for field, want in (("key_schema_id", key_id), ("value_schema_id", value_id)):
        if want is ANY:
            assert isinstance(body[field], int), body
        else:
            assert body[field] == want, body
    return body


def refused(r: httpx.Response, status: int, code: int, *fragments: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_code"] == code, body
    for f in fragments:
        assert f in body["message"], body["message"]
    return str(body["message"])


async def end_offset(http: httpx.AsyncClient, topic: str, partition: int = 0) -> int:
    r = await http.get(f"/topics/{topic}/partitions/{partition}/offsets", headers={"Accept": V2})
    assert r.status_code == 200, r.text
    return int(r.json()["end_offset"])


def user_class(package: str) -> Any:
    """A dynamic message class for ``message User { string name = 1; }`` (what ProtobufDeserializer needs)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    msg = fdp.message_type.add(name="User")
    msg.field.add(name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.User"))


# -- Confluent's documented examples, read back by confluent-kafka ---------------------------------------------
async def test_docs_examples_verbatim(http: httpx.AsyncClient, bclient: KafkaClient, broker: AnyBroker,
                                      schema_registry: str, topic_name: str) -> None:
    registry = SchemaRegistryClient({"url": schema_registry})
    avro_t, proto_t, json_t, two_t = (f"{topic_name}-{s}" for s in ("avro", "proto", "json", "two"))
    await bclient.create_topics({avro_t: 1, proto_t: 1, json_t: 1, two_t: 2})

    # the quick start's avro example
    body = ('{"value_schema": "{\\"type\\": \\"record\\", \\"name\\": \\"User\\", \\"fields\\": [{\\"name\\": '
            '\\"name\\", \\"type\\": \\"string\\"}]}", "records": [{"value": {"name": "testUser"}}]}')
    out = produced(await http.post(f"/topics/{avro_t}", content=body, headers=AVRO), 1)
    assert out["offsets"] == [{"partition": 0, "offset": 0, "error_code": None, "error": None}]
    assert registry.get_latest_version(f"{avro_t}-value").schema_id == out["value_schema_id"]  # TopicNameStrategy
    [m] = read_raw(broker.bootstrap, avro_t, 1)
    assert unframe(m.value()).schema_id == out["value_schema_id"] and m.key() is None
    ctx = SerializationContext(avro_t, MessageField.VALUE)
    assert AvroDeserializer(registry)(m.value(), ctx) == {"name": "testUser"}

    # the quick start's protobuf example (the registry takes the .proto text; we encode with its descriptor)
    body = ('{"value_schema": "syntax=\\"proto3\\"; message User { string name = 1; }", '
            '"records": [{"value": {"name": "testUser"}}]}')
    out = produced(await http.post(f"/topics/{proto_t}", content=body, headers=PROTOBUF), 1)
    assert registry.get_schema(out["value_schema_id"]).schema_type == "PROTOBUF"
    [m] = read_raw(broker.bootstrap, proto_t, 1)
    fr = unframe(m.value(), protobuf=True)
    assert fr.schema_id == out["value_schema_id"] and fr.message_indexes == (0,)
    cls = user_class(f"p{uuid.uuid4().hex[:8]}")
    msg = ProtobufDeserializer(cls, {"use.deprecated.format": False})(
        m.value(), SerializationContext(proto_t, MessageField.VALUE))
    assert json_format.MessageToDict(msg) == {"name": "testUser"}

    # the API reference's jsonschema example
    body = ('{"value_schema": "{\\"type\\":\\"object\\",\\"properties\\":{\\"f1\\":{\\"type\\":\\"string\\"}}}", '
            '"records": [{"value": {"f1": "bar"}}]}')
    out = produced(await http.post(f"/topics/{json_t}", content=body, headers=JSONSCHEMA), 1)
    [m] = read_raw(broker.bootstrap, json_t, 1)
    assert JSONDeserializer(None, schema_registry_client=registry)(
        m.value(), SerializationContext(json_t, MessageField.VALUE)) == {"f1": "bar"}

    # the API reference's avro example: a primitive value schema, one record to partition 1
    body = ('{"value_schema": "{\\"name\\":\\"int\\",\\"type\\": \\"int\\"}", '
            '"records": [{"value": 12}, {"value": 24, "partition": 1}]}')
    out = produced(await http.post(f"/topics/{two_t}", content=body, headers=AVRO), 2)
    first_partition = out["offsets"][0]["partition"]  # keyless: the sticky partition
    assert [(o["partition"], o["offset"]) for o in out["offsets"]] == [(first_partition, 0),
                                                                       (1, int(first_partition == 1))]
    got = read_raw(broker.bootstrap, two_t, 2, partitions=2)
    deser = AvroDeserializer(registry)
    assert sorted(deser(m.value(), SerializationContext(two_t, MessageField.VALUE)) for m in got) == [12, 24]


async def test_keys_ids_and_evolution(http: httpx.AsyncClient, bclient: KafkaClient, broker: AnyBroker,
                                      schema_registry: str, topic_name: str) -> None:
    """Schema text, then a compatible evolution (a field added with a default), then both by id: three
    posts, two ids, every record read back by confluent-kafka with its own writer schema."""
    await bclient.create_topics({topic_name: 1})
    registry = SchemaRegistryClient({"url": schema_registry})
    v1 = {"type": "record", "name": "User", "namespace": "p23", "fields": [{"name": "name", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "age", "type": "int", "default": -1}]}
    key_schema = json.dumps({"type": "record", "name": "Key", "namespace": "p23",
                             "fields": [{"name": "id", "type": "long"}]})
    first = produced(await http.post(f"/topics/{topic_name}/partitions/0", headers=AVRO, json={
        "key_schema": key_schema, "value_schema": json.dumps(v1),
        "records": [{"key": {"id": 1}, "value": {"name": "ann"}}, {"key": None, "value": {"name": "bob"}}]}),
        2, key_id=ANY)
    key_id, id1 = first["key_schema_id"], first["value_schema_id"]
    assert isinstance(key_id, int) and key_id != id1
    second = produced(await http.post(f"/topics/{topic_name}", headers=AVRO, json={
        "value_schema": json.dumps(v2), "records": [{"value": {"name": "cy", "age": 30}}, {"value": {"name": "di"}}]}),
        2)
    id2 = second["value_schema_id"]
    assert id2 != id1 and registry.get_versions(f"{topic_name}-value") == [1, 2]
    third = produced(await http.post(f"/topics/{topic_name}", headers=AVRO, json={
        "key_schema_id": key_id, "value_schema_id": id1,
        "records": [{"key": {"id": 2}, "value": {"name": "ed"}}]}), 1, key_id=key_id, value_id=id1)
    assert third["offsets"][0]["offset"] == 4

    msgs = read_raw(broker.bootstrap, topic_name, 5)
    vctx, kctx = (SerializationContext(topic_name, f) for f in (MessageField.VALUE, MessageField.KEY))
    deser = AvroDeserializer(registry)
    assert [unframe(m.value()).schema_id for m in msgs] == [id1, id1, id2, id2, id1]
    assert [deser(m.value(), vctx) for m in msgs] == [
        {"name": "ann"}, {"name": "bob"}, {"name": "cy", "age": 30}, {"name": "di", "age": -1}, {"name": "ed"}]
    assert [None if m.key() is None else deser(m.key(), kctx) for m in msgs] == [
        {"id": 1}, None, None, None, {"id": 2}]


async def test_protobuf_and_jsonschema_by_id(http: httpx.AsyncClient, bclient: KafkaClient, broker: AnyBroker,
                                             schema_registry: str, topic_name: str) -> None:
    proto_t, json_t = f"{topic_name}-p", f"{topic_name}-j"
    await bclient.create_topics({proto_t: 1, json_t: 1})
    registry = SchemaRegistryClient({"url": schema_registry})
    package = f"p{uuid.uuid4().hex[:8]}"
    proto = f'syntax = "proto3";\npackage {package};\n\nmessage User {{\n  string name = 1;\n}}\n'
    first = produced(await http.post(f"/topics/{proto_t}", headers=PROTOBUF, json={
        "value_schema": proto, "records": [{"value": {"name": "a"}}]}), 1)
    produced(await http.post(f"/topics/{proto_t}", headers=PROTOBUF, json={
        "value_schema_id": first["value_schema_id"], "records": [{"value": {"name": "b"}}, {"value": {}}]}),
        2, value_id=first["value_schema_id"])
    deser = ProtobufDeserializer(user_class(package), {"use.deprecated.format": False})
    ctx = SerializationContext(proto_t, MessageField.VALUE)
    assert [json_format.MessageToDict(deser(m.value(), ctx), always_print_fields_with_no_presence=True)
            for m in read_raw(broker.bootstrap, proto_t, 3)] == [{"name": "a"}, {"name": "b"}, {"name": ""}]

    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}, "big": {"type": "integer"}},
                         "required": ["n"]})
    first = produced(await http.post(f"/topics/{json_t}", headers=JSONSCHEMA, json={
        "value_schema": schema, "key_schema": '{"type": "string"}',
        "records": [{"key": "k", "value": {"n": 1}}]}), 1, key_id=ANY)
    body = {"key_schema_id": first["key_schema_id"], "value_schema_id": first["value_schema_id"],
            "records": [{"key": "k2", "value": {"n": 2, "big": 9007199254740993}}]}  # beyond a double's 2**53
    produced(await http.post(f"/topics/{json_t}", headers=JSONSCHEMA, json=body), 1,
             key_id=first["key_schema_id"], value_id=first["value_schema_id"])
    jd = JSONDeserializer(None, schema_registry_client=registry)
    vctx, kctx = (SerializationContext(json_t, f) for f in (MessageField.VALUE, MessageField.KEY))
    msgs = read_raw(broker.bootstrap, json_t, 2)
    assert [jd(m.value(), vctx) for m in msgs] == [{"n": 1}, {"n": 2, "big": 9007199254740993}]
    assert [jd(m.key(), kctx) for m in msgs] == ["k", "k2"]


async def test_protobuf_schema_id_with_a_reference(http: httpx.AsyncClient, bclient: KafkaClient,
                                                    broker: AnyBroker, schema_registry: str,
                                                    topic_name: str) -> None:
    """A schema id whose .proto imports another registered schema: encoded with the import resolved."""
    await bclient.create_topics({topic_name: 1})
    p = f"p{uuid.uuid4().hex[:8]}"
    registry = SchemaRegistryClient({"url": schema_registry})
    dep_text = (f'syntax = "proto3";\npackage {p}.money;\n\n'
                f'message Money {{\n  int64 units = 1;\n  string currency = 2;\n}}\n')
    main_text = (f'syntax = "proto3";\npackage {p};\n\nimport "{p}/money.proto";\n\n'
                 f'message Order {{\n  string order_id = 1;\n  {p}.money.Money total = 2;\n}}\n')
    registry.register_schema(f"{p}/money.proto", CSchema(dep_text, "PROTOBUF"))
    main_id = registry.register_schema(f"{topic_name}-value", CSchema(
        main_text, "PROTOBUF", [CRef(f"{p}/money.proto", f"{p}/money.proto", 1)]))
    sent = {"orderId": "o-1", "total": {"units": "12", "currency": "EUR"}}
    produced(await http.post(f"/topics/{topic_name}", headers=PROTOBUF, json={
        "value_schema_id": main_id, "records": [{"value": sent}]}), 1, value_id=main_id)

    cls = order_class(p)
    [m] = read_raw(broker.bootstrap, topic_name, 1)
    assert unframe(m.value(), protobuf=True).message_indexes == (0,)
    msg = ProtobufDeserializer(cls, {"use.deprecated.format": False})(
        m.value(), SerializationContext(topic_name, MessageField.VALUE))
    assert json_format.MessageToDict(msg) == sent


async def test_round_trip_through_the_gateway(http: httpx.AsyncClient, bclient: KafkaClient,
                                              topic_name: str) -> None:
    """Produced through the gateway, consumed through the gateway (each format's media type): the same JSON."""
    cases = {
        "avro": (AVRO, json.dumps({"type": "record", "name": "R", "namespace": "rt", "fields": [
            {"name": "s", "type": "string"}, {"name": "n", "type": ["null", "long"], "default": None}]}),
            [{"s": "a", "n": {"long": 5}}, {"s": "b", "n": None}]),
        "protobuf": (PROTOBUF, 'syntax = "proto3"; package rt; message R { string s = 1; int64 n = 2; }',
                     [{"s": "a", "n": "5"}, {"s": "b", "n": "0"}]),
        "jsonschema": (JSONSCHEMA, '{"type": "object", "properties": {"s": {"type": "string"}}}',
                       [{"s": "a", "n": [1, {"x": None}]}, {"s": "b"}]),
    }
    for fmt, (headers, schema, values) in cases.items():
        topic = f"{topic_name}-{fmt}"
        await bclient.create_topics({topic: 1})
        produced(await http.post(f"/topics/{topic}", headers=headers, json={
            "value_schema": schema, "records": [{"value": v} for v in values]}), len(values))
        group = f"g-{uuid.uuid4().hex[:8]}"
        r = await http.post(f"/consumers/{group}", headers={"Content-Type": V2}, json={"format": fmt})
        assert r.status_code == 200, r.text
        base = f"/consumers/{group}/instances/{r.json()['instance_id']}"
        parts = {"partitions": [{"topic": topic, "partition": 0}]}
        try:
            assert (await http.post(f"{base}/assignments", json=parts, headers={"Content-Type": V2})).status_code == 204
            assert (await http.post(f"{base}/positions/beginning", json=parts,
                                    headers={"Content-Type": V2})).status_code == 204
            got: list[Any] = []
            for _ in range(20):
                r = await http.get(f"{base}/records", params={"timeout": 500},
                                   headers={"Accept": headers["Content-Type"]})
                assert r.status_code == 200, r.text
                got += r.json()
                if len(got) >= len(values):
                    break
            assert [g["value"] for g in got] == values, fmt
        finally:
            await http.delete(base, headers={"Content-Type": V2})


# -- refusals: nothing half-written ------------------------------------------------------------------------------
async def test_a_bad_record_fails_the_request_and_nothing_is_produced(
        http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    schema = json.dumps({"type": "record", "name": "P", "namespace": "p23",
                         "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})
    records = [{"value": {"name": "a", "age": 1}}, {"value": {"name": "b", "age": 2}},
               {"value": {"name": "c", "age": "old"}}]
    msg = refused(await http.post(f"/topics/{topic_name}", headers=AVRO, json={
        "value_schema": schema, "records": records}), 422, 42203, "records[2].value.$.age", "nothing was produced")
    assert "records[0]" not in msg and "records[1]" not in msg
    assert await end_offset(http, topic_name) == 0
    # the same for protobuf (an unknown field) and jsonschema (a type), at index 1 (topics of their own: the
    # schema was registered under <topic>-value, a schema of another type would be incompatible there)
    proto_t, json_t = f"{topic_name}-p", f"{topic_name}-j"
    await bclient.create_topics({proto_t: 1, json_t: 1})
    proto = 'syntax = "proto3"; package p23bad; message M { int32 n = 1; }'
    refused(await http.post(f"/topics/{proto_t}", headers=PROTOBUF, json={
        "value_schema": proto, "records": [{"value": {"n": 1}}, {"value": {"m": 2}}]}), 422, 42203,
        "records[1].value.$.m")
    refused(await http.post(f"/topics/{json_t}", headers=JSONSCHEMA, json={
        "value_schema": '{"type": "object", "properties": {"n": {"type": "integer"}}}',
        "records": [{"value": {"n": 1}}, {"value": {"n": "x"}}]}), 422, 42203, "records[1].value.$.n")
    assert [await end_offset(http, t) for t in (topic_name, proto_t, json_t)] == [0, 0, 0]
    # a large batch (encoded off the event loop): the same all-or-nothing
    many = [{"value": {"name": f"n{i}", "age": i}} for i in range(1500)]
    many[1200] = {"value": {"name": "x"}}
    refused(await http.post(f"/topics/{topic_name}", headers=AVRO, json={"value_schema": schema, "records": many}),
            422, 42203, "1 record(s)", "records[1200].value.$.age")
    assert await end_offset(http, topic_name) == 0
    many[1200] = {"value": {"name": "x", "age": 0}}
    produced(await http.post(f"/topics/{topic_name}", headers=AVRO, json={"value_schema": schema, "records": many}),
             1500)
    assert await end_offset(http, topic_name) == 1500


async def test_schema_errors(http: httpx.AsyncClient, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    post = http.post
    url = f"/topics/{topic_name}"
    refused(await post(url, headers=AVRO, json={"value_schema": '"int"', "records": [{"key": 1, "value": 1}]}),
            422, 42201, "key_schema")
    refused(await post(url, headers=AVRO, json={"records": [{"value": 1}]}), 422, 42202, "value_schema")
    refused(await post(url, headers=AVRO, json={"value_schema": '{"type": "nope"}', "records": [{"value": 1}]}),
            422, 42205, "invalid schema")
    refused(await post(url, headers=PROTOBUF, json={"value_schema": "message {", "records": [{"value": {}}]}),
            422, 42205, "invalid value schema")
    refused(await post(url, headers=AVRO, json={"value_schema_id": 987654, "records": [{"value": 1}]}),
            422, 42210, "987654")
    # an incompatible evolution: the registry's 409, passed on as 42212
    v1 = json.dumps({"type": "record", "name": "C", "fields": [{"name": "a", "type": "string"}]})
    v2 = json.dumps({"type": "record", "name": "C", "fields": [{"name": "a", "type": "int"}]})
    out = produced(await post(url, headers=AVRO, json={"value_schema": v1, "records": [{"value": {"a": "x"}}]}), 1)
    refused(await post(url, headers=AVRO, json={"value_schema": v2, "records": [{"value": {"a": 1}}]}),
            422, 42212, "409")
    # an Avro schema id with the jsonschema content type
    refused(await post(url, headers=JSONSCHEMA, json={"value_schema_id": out["value_schema_id"],
                                                      "records": [{"value": {"a": "x"}}]}), 422, 42205, "AVRO")
    assert await end_offset(http, topic_name) == 1
    # a missing topic is 404 before any schema is registered
    refused(await post(f"/topics/{topic_name}-missing", headers=AVRO, json={
        "value_schema": v1, "records": [{"value": {"a": "x"}}]}), 404, 40401)


async def test_subject_name_strategies(broker: AnyBroker, bclient: KafkaClient, schema_registry: str,
                                       topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    ns = f"p{uuid.uuid4().hex[:8]}"
    key = json.dumps({"type": "record", "name": "K", "namespace": ns, "fields": [{"name": "id", "type": "int"}]})
    value = json.dumps({"type": "record", "name": "V", "namespace": ns, "fields": [{"name": "s", "type": "string"}]})
    async with gateway(broker.bootstrap, schema_registry_url=schema_registry,
                       schema_subject_name_strategy="TopicRecordNameStrategy",
                       schema_key_subject_name_strategy="RecordNameStrategy") as http:
        out = produced(await http.post(f"/topics/{topic_name}", headers=AVRO, json={
            "key_schema": key, "value_schema": value, "records": [{"key": {"id": 1}, "value": {"s": "x"}}]}),
            1, key_id=ANY)
        refused(await http.post(f"/topics/{topic_name}", headers=AVRO, json={
            "key_schema": '"int"', "value_schema": value, "records": [{"key": 1, "value": {"s": "x"}}]}),
            422, 42205, "RecordNameStrategy")
    registry = SchemaRegistryClient({"url": schema_registry})
    assert registry.get_latest_version(f"{ns}.K").schema_id == out["key_schema_id"]
    assert registry.get_latest_version(f"{topic_name}-{ns}.V").schema_id == out["value_schema_id"]


async def test_registry_down_and_no_registry(broker: AnyBroker, bclient: KafkaClient, topic_name: str) -> None:
    await bclient.create_topics({topic_name: 1})
    body = {"value_schema": '"string"', "records": [{"value": "x"}]}
    async with gateway(broker.bootstrap, schema_registry_url=f"http://127.0.0.1:{free_port()}",
                       schema_registry_timeout_s=2) as http:
        r = await http.post(f"/topics/{topic_name}", headers=AVRO, json=body)
        refused(r, 503, 50307, "unreachable")
        assert int(r.headers["retry-after"]) >= 1
        refused(await http.post(f"/topics/{topic_name}", headers=PROTOBUF, json={
            "value_schema_id": 1, "records": [{"value": {}}]}), 503, 50307)
        assert await end_offset(http, topic_name) == 0
    async with gateway(broker.bootstrap) as http:
        for headers in (AVRO, PROTOBUF, JSONSCHEMA):
            refused(await http.post(f"/topics/{topic_name}", headers=headers, json=body), 422, 42211,
                    "GATEWAY_SCHEMA_REGISTRY_URL")
        # binary and json are untouched, and ignore the schema fields as Confluent does
        r = await http.post(f"/topics/{topic_name}", json={**body, "value_schema_id": 5},
                            headers={"Content-Type": "application/vnd.kafka.json.v2+json"})
        assert r.status_code == 200 and r.json()["value_schema_id"] is None
