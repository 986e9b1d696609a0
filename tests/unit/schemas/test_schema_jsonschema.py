"""service.schemas.jsonschema_format: parse/validate/serialize, error paths, references, and confluent-kafka's
JSONSerializer / JSONDeserializer (offline, in-memory mock registry) as the peer."""

from __future__ import annotations

import json
import struct

import orjson
import pytest

from service.schemas.jsonschema_format import (
    JsonSchemaCodec,
    JsonSchemaDecodeError,
    JsonSchemaEncodeError,
    JsonSchemaSchemaError,
)

ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "price": {"type": "number", "minimum": 0}},
                "required": ["sku", "price"],
            },
        },
        "note": {"type": ["string", "null"]},
    },
    "required": ["id", "items"],
}
GOOD = {"id": 7, "items": [{"sku": "a-1", "price": 2.5}, {"sku": "b", "price": 0}], "note": None}


def test_encode_is_compact_json_and_decode_parses_it_back() -> None:
    codec = JsonSchemaCodec(json.dumps(ORDER))
    payload = codec.encode(GOOD)
    assert payload == orjson.dumps(GOOD)
    assert codec.decode(payload) == GOOD
    assert codec.decode(memoryview(payload)) == GOOD
    assert codec.record_name == "Order"


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({"id": "7", "items": []}, "$.id", "is not of type 'integer'"),
        ({"id": 1, "items": [{"sku": "a", "price": 1}, {"sku": "b", "price": -1}]}, "$.items[1].price", "minimum"),
        ({"id": 1, "items": [{"sku": "a"}]}, "$.items[0]", "'price' is a required property"),
        ({"id": 1}, "$", "'items' is a required property"),
        ({"id": 1, "items": [], "note": 3}, "$.note", "is not of type"),
    ],
)
def test_encode_validates_and_names_the_path(value: dict, path: str, reason: str) -> None:
    codec = JsonSchemaCodec(ORDER)
    with pytest.raises(JsonSchemaEncodeError) as info:
        codec.encode(value)
    assert info.value.path == path
    assert reason in info.value.reason


def test_decode_many_reports_each_bad_payload_in_place_and_validates_only_when_asked() -> None:
    lenient = JsonSchemaCodec(ORDER)
    strict = JsonSchemaCodec(ORDER, validate_on_decode=True)
    payloads = [orjson.dumps(GOOD), b"{not json", b'{"id": "x", "items": []}', b""]
    out = lenient.decode_many(payloads)
    assert out[0] == GOOD and out[2] == {"id": "x", "items": []}
    assert isinstance(out[1], JsonSchemaDecodeError) and isinstance(out[3], JsonSchemaDecodeError)
    out = strict.decode_many(payloads)
    assert out[0] == GOOD
    assert isinstance(out[2], JsonSchemaDecodeError) and "$.id" in str(out[2])


def test_references_resolve_by_name() -> None:
    codec = JsonSchemaCodec(
        {"type": "object", "properties": {"customer": {"$ref": "customer.json"}}, "required": ["customer"]},
        references={"customer.json": '{"type": "object", "properties": {"name": {"type": "string"}}}'},
    )
    assert codec.decode(codec.encode({"customer": {"name": "x"}})) == {"customer": {"name": "x"}}
    with pytest.raises(JsonSchemaEncodeError) as info:
        codec.encode({"customer": {"name": 1}})
    assert info.value.path == "$.customer.name"


@pytest.mark.parametrize("schema", ["{nope", '{"type": 12}', '{"minimum": "zero"}'])
def test_invalid_schemas_are_rejected(schema: str) -> None:
    with pytest.raises(JsonSchemaSchemaError):
        JsonSchemaCodec(schema)


def test_confluent_kafka_json_serde_agrees_both_ways() -> None:
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = MockSchemaRegistryClient({"url": "mock://json-tests"})
    ctx = SerializationContext("orders", MessageField.VALUE)
    codec = JsonSchemaCodec(json.dumps(ORDER), validate_on_decode=True)
    framed = JSONSerializer(json.dumps(ORDER), client)(GOOD, ctx)
    assert framed[0] == 0
    assert codec.decode(framed[5:]) == GOOD  # theirs -> ours

    schema_id = client.register_schema("orders-value", Schema(json.dumps(ORDER), "JSON"))
    ours = struct.pack(">bI", 0, schema_id) + codec.encode(GOOD)
    assert JSONDeserializer(json.dumps(ORDER), schema_registry_client=client)(ours, ctx) == GOOD  # ours -> theirs
