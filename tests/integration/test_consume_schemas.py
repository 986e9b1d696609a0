"""Consume formats avro, protobuf and jsonschema through the gateway, against a real registry.

Records are produced by confluent-kafka's own AvroSerializer / ProtobufSerializer / JSONSerializer against the
real Karapace registry (``schema_registry``), then consumed through a gateway process pointed at the same registry,
the way Confluent's v2 docs do it (create with ``"format": "avro"``, subscribe, GET with
``Accept: application/vnd.kafka.avro.v2+json``). Fault cases (registry down mid-poll: records given back, none
lost) use the protocol-level test registry of ``tests/fakes/registry``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format

from service.schemas.wire import frame
from tests.conftest import AnyBroker
from tests.fakes.registry.server import TestRegistry
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.proto_orders import order_class

V2 = "application/vnd.kafka.v2+json"
AVRO = "application/vnd.kafka.avro.v2+json"
PROTOBUF = "application/vnd.kafka.protobuf.v2+json"
JSONSCHEMA = "application/vnd.kafka.jsonschema.v2+json"
F = descriptor_pb2.FieldDescriptorProto

USER_V1 = {"type": "record", "name": "User", "namespace": "docs",
           "fields": [{"name": "name", "type": "string"}]}
USER_V2 = {"type": "record", "name": "User", "namespace": "docs",
           "fields": [{"name": "name", "type": "string"},
                      {"name": "age", "type": ["null", "int"], "default": None}]}


@pytest.fixture(scope="module")
def gw(broker: AnyBroker, schema_registry: str,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with GatewayProcess(broker.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": schema_registry,
                                              "GATEWAY_AUTO_CREATE_TOPICS": "true"},
                        log_file=tmp_path_factory.mktemp("gw") / "gateway.log") as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def _produce(bootstrap: str, topic: str, values: list[bytes | None], keys: list[bytes | None] | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=keys[i] if keys else None, partition=0)
    assert p.flush(30) == 0


async def _consume(http: httpx.AsyncClient, topic: str, fmt: str, accept: str, n: int) -> list[dict[str, Any]]:
    """Confluent's documented flow: create, subscribe, GET records until n arrived, delete."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    r = await http.post(f"/consumers/{group}", headers={"Content-Type": V2},
                        content=json.dumps({"name": "my_consumer_instance", "format": fmt,
                                            "auto.offset.reset": "earliest"}))
    assert r.status_code == 200, r.text
    base = r.json()["base_uri"]
    r = await http.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": [topic]})
    assert r.status_code == 204, r.text
    got: list[dict[str, Any]] = []
    try:
        for _ in range(60):
            r = await http.get(f"{base}/records", headers={"Accept": accept}, params={"timeout": 1000})
            assert r.status_code == 200, r.text
            assert r.headers["content-type"] == accept
            got += r.json()
            if len(got) >= n:
                return got
        raise AssertionError(f"{len(got)} of {n} records")
    finally:
        await http.delete(base, headers={"Content-Type": V2})


async def test_avro_docs_flow_with_evolution_and_per_record_errors(
        http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str, topic_name: str) -> None:
    client = SchemaRegistryClient({"url": schema_registry})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(USER_V1))
    v2 = AvroSerializer(client, json.dumps(USER_V2))
    values = [v1({"name": "testUser"}, ctx), v2({"name": "ann", "age": 7}, ctx), v2({"name": "bob", "age": None}, ctx),
              b"plain text", frame(2_000_000_000, b"\x02x"), None]
    keys = [None, None, None, None, None, v1({"name": "key"}, SerializationContext(topic_name, MessageField.KEY))]
    _produce(broker.bootstrap, topic_name, values, keys)
    got = await _consume(http, topic_name, "avro", AVRO, len(values))
    assert [r["offset"] for r in got] == list(range(len(values)))
    assert got[0]["topic"] == topic_name and got[0]["partition"] == 0
    assert got[0]["key"] is None and got[0]["value"] == {"name": "testUser"}  # Confluent's docs example
    # evolution: the writer's schema per record (by its id); unions tagged by branch, as Confluent renders them
    assert got[1]["value"] == {"name": "ann", "age": {"int": 7}}
    assert got[2]["value"] == {"name": "bob", "age": None}
    # not decodable: still delivered, value null plus why and the bytes
    assert got[3]["value"] is None and "magic byte" in got[3]["value_error"]
    assert base64.b64decode(got[3]["value_base64"]) == b"plain text"
    assert got[4]["value"] is None and "2000000000 not found" in got[4]["value_error"]
    assert got[5]["value"] is None and "value_error" not in got[5] and got[5]["key"] == {"name": "key"}
    metrics = (await http.get("/metrics")).text
    assert any(line.startswith("kcg_schema_decode_errors_total{") and 'format="avro"' in line
               and float(line.split()[-1]) >= 2
               for line in metrics.splitlines()), "decode errors are counted"


async def test_avro_stream_ndjson(http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str,
                                  topic_name: str) -> None:
    ser = AvroSerializer(SchemaRegistryClient({"url": schema_registry}), json.dumps(USER_V1))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    _produce(broker.bootstrap, topic_name, [ser({"name": f"u{i}"}, ctx) for i in range(5)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    r = await http.post(f"/consumers/{group}", json={"format": "avro", "auto.offset.reset": "earliest"},
                        headers={"Content-Type": V2})
    base = r.json()["base_uri"]
    await http.post(f"{base}/subscription", json={"topics": [topic_name]}, headers={"Content-Type": V2})
    names: list[str] = []
    async with http.stream("GET", f"{base}/records", headers={"Accept": "application/x-ndjson"}) as s:
        assert s.status_code == 200
        async for line in s.aiter_lines():
            if line:
                names.append(json.loads(line)["value"]["name"])
            if len(names) == 5:
                break
    assert names == [f"u{i}" for i in range(5)]
    await http.delete(base, headers={"Content-Type": V2})


async def test_protobuf_with_a_reference_and_message_indexes(
        http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str, topic_name: str) -> None:
    p = f"p{uuid.uuid4().hex[:8]}"
    order_cls = order_class(p, ping_first=True)
    ser = ProtobufSerializer(order_cls, SchemaRegistryClient({"url": schema_registry}),
                             {"use.deprecated.format": False})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    sent = [{"orderId": "o-1", "total": {"units": "12", "currency": "EUR"}}, {"orderId": "o-2", "total": None}]
    values = [ser(json_format.ParseDict({k: v for k, v in s.items() if v is not None}, order_cls()), ctx)
              for s in sent]
    _produce(broker.bootstrap, topic_name, values)
    got = await _consume(http, topic_name, "protobuf", PROTOBUF, 2)
    assert got[0]["value"] == sent[0]  # the second message of the file (indexes [1]), its import resolved
    assert got[1]["value"] == {"orderId": "o-2"}  # an unset message field is left out, as JsonFormat prints it


async def test_jsonschema(http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str,
                          topic_name: str) -> None:
    schema = json.dumps({"title": "Event", "type": "object",
                         "properties": {"id": {"type": "integer"},
                                        "tags": {"type": "array", "items": {"type": "string"}}},
                         "required": ["id"]})
    ser = JSONSerializer(schema, SchemaRegistryClient({"url": schema_registry}))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    sent = [{"id": 1, "tags": ["a", "ü"]}, {"id": 2}]
    _produce(broker.bootstrap, topic_name, [ser(v, ctx) for v in sent])
    got = await _consume(http, topic_name, "jsonschema", JSONSCHEMA, 2)
    assert [r["value"] for r in got] == sent


async def test_accept_must_match_a_schema_format(http: httpx.AsyncClient) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    r = await http.post(f"/consumers/{group}", json={"format": "AVRO"}, headers={"Content-Type": V2})
    assert r.status_code == 200, r.text
    base = r.json()["base_uri"]
    r = await http.get(f"{base}/records", headers={"Accept": "application/vnd.kafka.binary.v2+json"})
    assert r.status_code == 406 and r.json()["error_code"] == 40601 and AVRO in r.json()["message"]
    await http.delete(base, headers={"Content-Type": V2})


async def test_registry_faults_lose_nothing_and_no_registry_is_a_clear_error(
        broker: AnyBroker, topic_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    with TestRegistry() as reg:
        sid = reg.add(f"{topic_name}-value", json.dumps(USER_V1))
        from service.schemas.avro import AvroCodec

        codec = AvroCodec(USER_V1)
        _produce(broker.bootstrap, topic_name, [frame(sid, codec.encode({"name": f"n{i}"})) for i in range(3)])
        log = tmp_path_factory.mktemp("gwfault") / "gateway.log"
        with GatewayProcess(broker.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": reg.url,
                                                  "GATEWAY_SCHEMA_REGISTRY_TIMEOUT_S": "1"}, log_file=log) as g:
            async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
                r = await http.post("/consumers/gf", json={"format": "avro", "auto.offset.reset": "earliest"},
                                    headers={"Content-Type": V2})
                base = r.json()["base_uri"]
                await http.post(f"{base}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                                headers={"Content-Type": V2})
                reg.down()
                r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 3000})
                for _ in range(10):  # the first polls may find nothing fetched yet ([]): poll until the outage shows
                    if r.status_code != 200 or r.json():
                        break
                    r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 3000})
                assert r.status_code == 503, r.text
                assert r.json()["error_code"] == 50307 and int(r.headers["retry-after"]) >= 1
                assert "kcg_schema_registry_unavailable_total" in (await http.get("/metrics")).text
                reg.up()
                got: list[dict[str, Any]] = []
                for _ in range(10):
                    r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 2000})
                    assert r.status_code == 200, r.text
                    got += r.json()
                    if len(got) >= 3:
                        break
                # the records of the failed poll were given back: all three, in order, once
                assert [(x["offset"], x["value"]["name"]) for x in got] == [(0, "n0"), (1, "n1"), (2, "n2")]
        # a gateway without any registry: the format is refused at create, naming the setting
        with GatewayProcess(broker.bootstrap, env={"GATEWAY_EMBEDDED_REGISTRY": "false"},
                            log_file=log.with_name("noreg.log")) as g:
            async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
                r = await http.post("/consumers/gn", json={"format": "protobuf"}, headers={"Content-Type": V2})
            assert r.status_code == 422 and r.json()["error_code"] == 42211
            assert "GATEWAY_SCHEMA_REGISTRY_URL" in r.json()["message"]


# Karapace's REST consumer renders Avro unions untagged and bytes as base64; a consumer created with
# "avro.json.rendering": "karapace" (or a gateway with GATEWAY_AVRO_JSON_RENDERING=karapace) reads what Karapace's
# own tests expect: the records exactly as the producer's Python values (complex unions in arrays and maps).
UNION_SCHEMA = {"type": "record", "name": "MinimalUnion", "namespace": "kcg.test", "fields": [
    {"name": "id", "type": "string"},
    {"name": "attrs", "type": {"type": "array", "items": {"type": "record", "name": "Attr", "fields": [
        {"name": "k", "type": "string"},
        {"name": "v", "type": ["null", "string", "long", "double", "boolean"]}]}}},
    {"name": "props", "type": {"type": "map", "values": ["null", "string"]}},
    {"name": "blob", "type": "bytes"}]}
UNION_RECORD = {"id": "one", "attrs": [{"k": "text", "v": "value"}, {"k": "count", "v": 5}, {"k": "ratio", "v": 1.5},
                                       {"k": "flag", "v": True}, {"k": "empty", "v": None}],
                "props": {"present": "yes", "missing": None}, "blob": b"\x01\x02\xff"}


async def test_avro_renderings_confluent_tags_unions_karapace_does_not(
        http: httpx.AsyncClient, broker: AnyBroker, schema_registry: str, topic_name: str) -> None:
    ser = AvroSerializer(SchemaRegistryClient({"url": schema_registry}), json.dumps(UNION_SCHEMA))
    _produce(broker.bootstrap, topic_name, [ser(UNION_RECORD, SerializationContext(topic_name, MessageField.VALUE))],
             keys=[b"plain-key"])
    got: dict[str, dict[str, Any]] = {}
    for rendering in ("karapace", "confluent"):
        group = f"g-{uuid.uuid4().hex[:8]}"
        r = await http.post(f"/consumers/{group}", headers={"Content-Type": V2}, json={
            "format": "avro", "avro.json.rendering": rendering, "auto.offset.reset": "earliest"})
        assert r.status_code == 200, r.text
        base = r.json()["base_uri"]
        await http.post(f"{base}/assignments", json={"partitions": [{"topic": topic_name, "partition": 0}]},
                        headers={"Content-Type": V2})
        for _ in range(20):
            r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 1000})
            assert r.status_code == 200, r.text
            if r.json():
                got[rendering] = r.json()[0]
                break
        await http.delete(base, headers={"Content-Type": V2})
    k = got["karapace"]
    assert k["value"] == {**UNION_RECORD, "blob": base64.b64encode(b"\x01\x02\xff").decode()}
    c = got["confluent"]["value"]
    assert c["attrs"][1] == {"k": "count", "v": {"long": 5}} and c["attrs"][4] == {"k": "empty", "v": None}
    assert c["props"] == {"present": {"string": "yes"}, "missing": None}
    assert c["blob"] == "\x01\x02\xff"  # Avro's JSON encoding: one character per byte
    # a key that is not in the wire format (a plain string key of an avro topic): the record is still delivered
    for msg in (k, got["confluent"]):
        assert msg["key"] is None and "magic byte" in msg["key_error"]
        assert base64.b64decode(msg["key_base64"]) == b"plain-key"


# The scenarios of Karapace's own REST-consumer tests that use format avro, through our produce and consume (in
# the karapace rendering, which those tests expect): a record published with value_schema reads back equal;
# complex unions in arrays and maps read back untagged; a Debezium-style decimal (bytes) inside a nullable record
# reads back as base64. Where the gateway differs on purpose (docs/schemas.md): an undecodable key or value is
# delivered as null with key_error/value_error instead of a binary fallback or a failed poll.
DECIMAL_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "kcg.dbz", "fields": [
    {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"},
        {"name": "probability", "type": ["null", {"type": "record", "name": "VariableScaleDecimal",
                                                  "namespace": "io.debezium.data", "fields": [
                                                      {"name": "scale", "type": "int"},
                                                      {"name": "value", "type": "bytes"}]}], "default": None},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "op", "type": "string"}]}
DECIMAL_RECORD = {"before": None, "after": {"id": 1, "probability": {"scale": 2, "value": "AQI="},
                                            "created_at": 1_700_000_000_000_000}, "op": "c"}


async def test_karapace_avro_scenarios_through_produce_and_consume(http: httpx.AsyncClient, topic_name: str) -> None:
    # produce takes Avro's JSON encoding (bytes as one character per byte, as Confluent's); the karapace
    # rendering gives bytes back as base64
    dbz_in = {**DECIMAL_RECORD, "after": {**DECIMAL_RECORD["after"], "probability": {"scale": 2, "value": "\x01\x02"}}}
    cases = [(f"{topic_name}-u", UNION_SCHEMA, [{**UNION_RECORD, "blob": "\x01\x02\xff"}],
              [{**UNION_RECORD, "blob": "AQL/"}]),
             (f"{topic_name}-d", DECIMAL_ENVELOPE, [dbz_in], [DECIMAL_RECORD]),
             (f"{topic_name}-p", USER_V2, [{"name": "a", "age": 1}, {"name": "b", "age": None}], None)]
    for topic, schema, sent, expected in cases:
        records = expected or sent
        r = await http.post(f"/topics/{topic}", headers={"Content-Type": AVRO}, json={
            "value_schema": json.dumps(schema), "records": [{"value": v} for v in sent]})
        assert r.status_code == 200, r.text
        group = f"g-{uuid.uuid4().hex[:8]}"
        r = await http.post(f"/consumers/{group}", headers={"Content-Type": V2},
                            json={"format": "avro", "avro.json.rendering": "karapace"})
        base = r.json()["base_uri"]
        await http.post(f"{base}/assignments", json={"partitions": [{"topic": topic, "partition": 0}]},
                        headers={"Content-Type": V2})
        await http.post(f"{base}/positions/beginning", json={"partitions": [{"topic": topic, "partition": 0}]},
                        headers={"Content-Type": V2})
        got: list[Any] = []
        for _ in range(20):
            r = await http.get(f"{base}/records", headers={"Accept": AVRO}, params={"timeout": 1000})
            assert r.status_code == 200, r.text
            got += [x["value"] for x in r.json()]
            if len(got) >= len(records):
                break
        await http.delete(base, headers={"Content-Type": V2})
        assert got == records, topic


async def test_each_tenant_reads_with_its_own_registry(broker: AnyBroker, topic_name: str,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two tenants name two registries in the tenants file, where schema id 1 is not the same schema: the same
    record bytes decode with each tenant's own schema (no cache shared across registries); a third tenant
    without a registry (and no gateway-wide one) gets 42211."""
    import hashlib

    from service.schemas.avro import AvroCodec

    def sha(k: str) -> str:
        return "sha256:" + hashlib.sha256(k.encode()).hexdigest()

    left = {"type": "record", "name": "L", "fields": [{"name": "a", "type": "string"}]}
    right = {"type": "record", "name": "R", "fields": [{"name": "b", "type": "bytes"}]}
    with TestRegistry() as reg_a, TestRegistry() as reg_b:
        assert reg_a.add("x", json.dumps(left)) == reg_b.add("y", json.dumps(right))
        sid = reg_a.add("x", json.dumps(left))
        _produce(broker.bootstrap, topic_name, [frame(sid, AvroCodec(left).encode({"a": "hé"}))])
        d = tmp_path_factory.mktemp("tenant-registries")
        (d / "tenants.yaml").write_text(f"""version: 1
tenants:
  - id: alpha
    api_keys: ["{sha('key-alpha')}"]
    schema_registry: {{url: "{reg_a.url}"}}
  - id: beta
    api_keys: ["{sha('key-beta')}"]
    schema_registry: {{url: "{reg_b.url}", timeout_s: 2}}
  - id: gamma
    api_keys: ["{sha('key-gamma')}"]
""")
        with GatewayProcess(broker.bootstrap, env={"GATEWAY_TENANTS_FILE": str(d / "tenants.yaml")},
                            log_file=d / "gw.log") as g:
            async with httpx.AsyncClient(base_url=g.url, timeout=30) as http:
                seen = {}
                for tenant in ("alpha", "beta"):
                    auth = {"Authorization": f"Bearer key-{tenant}"}
                    r = await http.post(f"/consumers/g-{tenant}", headers={**auth, "Content-Type": V2},
                                        json={"format": "avro", "avro.json.rendering": "karapace"})
                    assert r.status_code == 200, r.text
                    base = r.json()["base_uri"]
                    await http.post(f"{base}/assignments", headers={**auth, "Content-Type": V2},
                                    json={"partitions": [{"topic": topic_name, "partition": 0}]})
                    await http.post(f"{base}/positions/beginning", headers={**auth, "Content-Type": V2},
                                    json={"partitions": [{"topic": topic_name, "partition": 0}]})
                    for _ in range(20):
                        r = await http.get(f"{base}/records", headers={**auth, "Accept": AVRO},
                                           params={"timeout": 1000})
                        assert r.status_code == 200, r.text
                        if r.json():
                            seen[tenant] = r.json()[0]["value"]
                            break
                assert seen["alpha"] == {"a": "hé"}
                # the same bytes under beta's schema 1 (a bytes field): the string's length-prefixed UTF-8
                assert seen["beta"] == {"b": base64.b64encode("hé".encode()).decode()}
                r = await http.post("/consumers/g-gamma", json={"format": "avro"},
                                    headers={"Authorization": "Bearer key-gamma", "Content-Type": V2})
                assert r.status_code == 422 and r.json()["error_code"] == 42211
