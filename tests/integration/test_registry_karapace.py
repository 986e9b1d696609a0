"""service/schemas against a real Schema Registry (Karapace 5.0.3 on the session's Tansu broker): our client
registers Avro, JSON Schema and Protobuf (with a reference) schemas and reads them back by id and by subject,
and confluent-kafka's own SchemaRegistryClient and AvroSerializer see the same ids and framing."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.schema_registry import Schema as CSchema
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from service.schemas.registry import (
    RegistryClient,
    RegistryConfig,
    RegistryRequestError,
    Schema,
    SchemaNotFound,
    SchemaReference,
)
from service.schemas.wire import unframe

AVRO = json.dumps({"type": "record", "name": "User", "namespace": "p23",
                   "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": ["null", "int"]}]})
JSONS = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})
DEP = 'syntax = "proto3";\npackage p23.dep;\n\nmessage Money {\n  int64 units = 1;\n  string currency = 2;\n}\n'
MAIN = ('syntax = "proto3";\npackage p23;\n\nimport "dep.proto";\n\n'
        'message Order {\n  string id = 1;\n  p23.dep.Money total = 2;\n}\n')


def _norm(text: str) -> str:
    return " ".join(text.split())


async def test_register_and_read_back_three_types(schema_registry: str) -> None:
    p = f"p23-{uuid.uuid4().hex[:8]}"
    async with RegistryClient(RegistryConfig(schema_registry, timeout_s=10)) as ours:
        avro_id = await ours.register(f"{p}-avro-value", Schema(AVRO))
        json_id = await ours.register(f"{p}-json-value", Schema(JSONS, "JSON"))
        dep_id = await ours.register(f"{p}-dep", Schema(DEP, "PROTOBUF"))
        main = Schema(MAIN, "PROTOBUF", (SchemaReference("dep.proto", f"{p}-dep", 1),))
        proto_id = await ours.register(f"{p}-proto-value", main)
        assert len({avro_id, json_id, dep_id, proto_id}) == 4

    confluent = SchemaRegistryClient({"url": schema_registry})
    async with RegistryClient(RegistryConfig(schema_registry, timeout_s=10)) as fresh:  # empty caches
        by_id = {i: await fresh.get_schema(i) for i in (avro_id, json_id, proto_id)}
        assert json.loads(by_id[avro_id].schema) == json.loads(AVRO) and by_id[avro_id].schema_type == "AVRO"
        assert json.loads(by_id[json_id].schema) == json.loads(JSONS) and by_id[json_id].schema_type == "JSON"
        proto = by_id[proto_id]
        assert proto.schema_type == "PROTOBUF" and "message Order" in proto.schema
        assert proto.references == (SchemaReference("dep.proto", f"{p}-dep", 1),)
        assert fresh.requests == 3

        for subject, sid, schema in ((f"{p}-avro-value", avro_id, Schema(AVRO)),
                                     (f"{p}-json-value", json_id, Schema(JSONS, "JSON")),
                                     (f"{p}-proto-value", proto_id, main)):
            assert await fresh.get_versions(subject) == [1]
            latest = await fresh.get_latest(subject)
            assert (latest.schema_id, latest.version, latest.subject) == (sid, 1, subject)
            found = await fresh.lookup(subject, schema)
            assert (found.schema_id, found.version) == (sid, 1)
            assert await fresh.register(subject, schema) == sid  # already there: same id
            # confluent-kafka's client sees the same ids
            assert confluent.get_latest_version(subject).schema_id == sid
            assert confluent.lookup_schema(subject, CSchema(schema.schema, schema.schema_type, [])
                                           if not schema.references else _cref(schema)).schema_id == sid
            theirs = confluent.get_schema(sid)
            assert theirs.schema_type == schema.schema_type
            assert _norm(theirs.schema_str) == _norm((await fresh.get_schema(sid)).schema)
        assert [r.name for r in confluent.get_schema(proto_id).references] == ["dep.proto"]

        # a schema registered by confluent-kafka's serializer is read back by ours
        ser = AvroSerializer(confluent, json.dumps({"type": "record", "name": "Evt", "namespace": "p23",
                                                    "fields": [{"name": "n", "type": "long"}]}))
        data = ser({"n": 7}, SerializationContext(f"{p}-evt", MessageField.VALUE))
        frame = unframe(data)
        assert (await fresh.get_latest(f"{p}-evt-value")).schema_id == frame.schema_id
        assert json.loads((await fresh.get_schema(frame.schema_id)).schema)["name"] == "Evt"

        # the real registry's errors map to the typed ones
        with pytest.raises(SchemaNotFound) as ei:
            await fresh.get_schema(999_999)
        assert ei.value.error_code == 40403
        with pytest.raises(SchemaNotFound) as ei:
            await fresh.get_versions(f"{p}-missing")
        assert ei.value.error_code == 40401
        with pytest.raises(SchemaNotFound) as ei:
            await fresh.lookup(f"{p}-avro-value", Schema('"string"'))
        assert ei.value.error_code == 40403
        with pytest.raises(RegistryRequestError) as er:
            await fresh.register(f"{p}-bad", Schema('{"type": "nonsense"}'))
        assert er.value.status == 422 and not isinstance(er.value, SchemaNotFound)


def _cref(schema: Schema) -> CSchema:
    from confluent_kafka.schema_registry import SchemaReference as CRef

    return CSchema(schema.schema, schema.schema_type,
                   [CRef(r.name, r.subject, r.version) for r in schema.references])
