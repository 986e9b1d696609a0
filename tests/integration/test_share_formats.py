"""Share consumer instances of every schema format against a real Schema Registry (Karapace, ``schema_registry``)
and Apache Kafka 4.4: records produced by confluent-kafka's own AvroSerializer / ProtobufSerializer /
JSONSerializer are answered decoded with the writer's schema, each with its delivery count; a record that cannot
be decoded (no magic byte, an unknown schema id, a payload its schema does not read) is still delivered, with the
error and its bytes in its own fields, as a consumer instance renders it, and the poll goes on. Every record is
counted: delivered once and accepted."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format

from service.embedded.kafka import EmbeddedKafka
from service.schemas.wire import frame
from tests.integration.gateway_proc import GatewayProcess
from tests.integration.proto_orders import order_class
from tests.integration.test_share_http import ack, create, new_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

USER = {"type": "record", "name": "User", "namespace": "share", "fields": [{"name": "name", "type": "string"},
                                                                          {"name": "age", "type": "int"}]}
EVENT = {"title": "Event", "type": "object", "required": ["id"],
         "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}


@pytest.fixture(scope="module")
def gw(kafka: EmbeddedKafka, schema_registry: str,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("share-formats") / "gw.log"
    with GatewayProcess(kafka.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": schema_registry}, log_file=log) as g:
        yield g
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, f"the gateway logged an unexpected exception:\n{text[-4000:]}"


def _values(fmt: str, registry: str, topic: str) -> tuple[list[bytes], list[Any]]:
    """The framed values of ``fmt`` and what the gateway answers for each good one."""
    client = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        ser: Callable[[Any, SerializationContext], bytes] = AvroSerializer(client, json.dumps(USER))
        sent: list[Any] = [{"name": "ann", "age": 7}, {"name": "bob", "age": 9}]
        return [ser(v, ctx) for v in sent], sent
    if fmt == "protobuf":
        order_cls = order_class(f"p{uuid.uuid4().hex[:8]}", ping_first=True)
        ser = ProtobufSerializer(order_cls, client, {"use.deprecated.format": False})
        sent = [{"orderId": "o-1", "total": {"units": "12", "currency": "EUR"}}, {"orderId": "o-2"}]
        return [ser(json_format.ParseDict(v, order_cls()), ctx) for v in sent], sent
    ser = JSONSerializer(json.dumps(EVENT), client)
    sent = [{"id": 1, "tags": ["a", "ü"]}, {"id": 2}]
    return [ser(v, ctx) for v in sent], sent


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


@pytest.mark.parametrize("fmt", ["protobuf", "jsonschema", "avro"])
async def test_schema_formats_decoded_and_bad_records_are_their_own_error(
        kafka: EmbeddedKafka, gw: GatewayProcess, schema_registry: str, fmt: str) -> None:
    topic = await asyncio.to_thread(new_topic, kafka.bootstrap, 1)
    good, sent = await asyncio.to_thread(_values, fmt, schema_registry, topic)
    schema_id = int.from_bytes(good[0][1:5], "big")
    # a payload the writer's schema cannot read: a truncated Avro record, a Protobuf field whose length runs past
    # the end, JSON that does not parse
    broken = {"avro": frame(schema_id, b"\x06an"), "protobuf": good[0][:5] + b"\x00\x0a\x7f",
              "jsonschema": frame(schema_id, b"{not json")}[fmt]
    values = [good[0], b"plain text", frame(2_000_000_000, b"\x02x"), broken, good[1]]
    await asyncio.to_thread(_produce, kafka.bootstrap, topic, values)
    group = f"sgf-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        path = await create(http, group, fmt, topic, format=fmt)
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while len(got) < len(values):
            assert time.monotonic() < deadline, got
            r = await http.get(f"{path}/records", params={"timeout": 1000})
            assert r.status_code == 200, r.text
            got += r.json()
        assert [x["offset"] for x in got] == list(range(len(values)))
        assert all(x["delivery_count"] == 1 and x["topic"] == topic for x in got)
        assert [got[0]["value"], got[4]["value"]] == sent
        assert "value_error" not in got[0] and "value_error" not in got[4]
        # the bad ones: delivered, value null, why and the bytes beside it
        assert "magic byte" in got[1]["value_error"] and base64.b64decode(got[1]["value_base64"]) == b"plain text"
        assert "2000000000 not found" in got[2]["value_error"], got[2]
        assert got[3]["value"] is None and got[3]["value_error"], got[3]
        assert base64.b64decode(got[3]["value_base64"]) == broken
        for x in got[1:4]:
            assert x["value"] is None, x
        answers = await ack(http, path, [{"topic": topic, "partition": 0, "first_offset": 0,
                                          "last_offset": len(values) - 1}])
        assert [a["applied"] for a in answers] == [True] * len(values)
        r = await http.get(f"{path}/records", params={"timeout": 200})  # none redelivered
        assert r.status_code == 200 and r.json() == [], r.text
        assert (await http.delete(path)).status_code == 204
        metrics = (await http.get("/metrics")).text
    assert any(line.startswith("kcg_schema_decode_errors_total{") and f'format="{fmt}"' in line
               and float(line.split()[-1]) >= 3 for line in metrics.splitlines()), "decode errors are counted"
