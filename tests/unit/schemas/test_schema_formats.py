"""service/schemas/formats.py and proto_text.py: schema ids -> codecs, per-record decode errors, which registry a
tenant uses, .proto text compiled with protoc; and the tenants file's schema_registry. No sockets: the registry
is an httpx MockTransport answering as the Confluent Schema Registry REST API does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from service.client.connection import ConnectionConfig
from service.schemas import proto_text
from service.schemas.avro import AvroCodec
from service.schemas.codecs import DecodeError
from service.schemas.formats import RegistryNotConfigured, SchemaResolver, SchemaService
from service.schemas.protobuf import ProtobufCodec, ProtobufSchemaError
from service.schemas.registry import RegistryClient, RegistryConfig, RegistryUnavailable
from service.schemas.wire import frame
from service.tenants import TenantConfigError, TenantRegistry

USER = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"},
                                                     {"name": "n", "type": ["null", "int"], "default": None}]}
JSON_ITEM = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
JSON_ORDER = {"type": "object", "properties": {"item": {"$ref": "item.json"}}}
DEP_PROTO = 'syntax = "proto3";\npackage shop.money;\nmessage Money { int64 units = 1; string currency = 2; }\n'
MAIN_PROTO = ('syntax = "proto3";\npackage shop;\nimport "shop/money.proto";\n'
              'import "google/protobuf/timestamp.proto";\n'
              'message Ping { int32 n = 1; }\n'
              'message Order { string id = 1; shop.money.Money total = 2; google.protobuf.Timestamp at = 3; }\n')


class FakeRegistry:
    """Schemas by id and subject versions; ``down`` makes every request fail as a connection error would."""

    def __init__(self) -> None:
        self.by_id: dict[int, dict[str, Any]] = {}
        self.versions: dict[tuple[str, int], int] = {}
        self.down = False
        self.calls: list[str] = []

    def add(self, sid: int, schema: str, schema_type: str = "AVRO", refs: list[dict[str, Any]] | None = None,
            subject: str | None = None) -> None:
        doc: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            doc["schemaType"] = schema_type
        if refs:
            doc["references"] = refs
        self.by_id[sid] = doc
        if subject is not None:
            self.versions[(subject, 1)] = sid

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.url.path)
        if self.down:
            raise httpx.ConnectError("connection refused")
        raw = request.url.raw_path.decode().split("?")[0]
        parts = [unquote(x) for x in raw.strip("/").split("/")]
        if parts[:2] == ["schemas", "ids"]:
            doc = self.by_id.get(int(parts[2]))
            if doc is None:
                return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"})
            return httpx.Response(200, json=doc)
        if parts[0] == "subjects" and parts[2] == "versions":
            subject = parts[1]
            sid = self.versions.get((subject, int(parts[3])))
            if sid is None:
                return httpx.Response(404, json={"error_code": 40402, "message": "Version not found"})
            return httpx.Response(200, json={"subject": subject, "version": int(parts[3]), "id": sid,
                                             **self.by_id[sid]})
        return httpx.Response(404, json={"error_code": 404, "message": "no route"})

    def resolver(self, **kwargs: Any) -> SchemaResolver:
        client = RegistryClient(RegistryConfig("http://registry.test"), transport=httpx.MockTransport(self.handler))
        return SchemaResolver(client, **kwargs)


async def test_decode_puts_each_records_outcome_in_its_place() -> None:
    reg = FakeRegistry()
    reg.add(1, json.dumps(USER))
    reg.add(2, json.dumps(JSON_ITEM), "JSON")
    reg.add(3, "{not a schema")
    avro = AvroCodec(USER)
    payloads = [frame(1, avro.encode({"name": "a", "n": 1})), None, b"plain", frame(99, b"\x00"),
                frame(2, b'{"sku":"x"}'), frame(3, b"\x00"), frame(1, b"\xff\xff\xff"),
                frame(1, avro.encode({"name": "b"}))]
    resolver = reg.resolver()
    out = await resolver.decode_all("avro", payloads)
    assert out[0] == {"name": "a", "n": {"int": 1}} and out[1] is None and out[7] == {"name": "b", "n": None}
    errors = {i: v for i, v in enumerate(out) if isinstance(v, DecodeError)}
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert "magic byte" in errors[2].message and errors[2].schema_id is None
    assert "schema id 99 not found" in errors[3].message
    assert "is a JSON schema, not AVRO" in errors[4].message
    assert errors[5].schema_id == 3 and "avro schema" in errors[5].message
    assert errors[6].schema_id == 1
    # the same records in the other rendering: unions untagged
    assert resolver.decode("avro", payloads[:1], rendering="karapace") == [{"name": "a", "n": 1}]
    # ids are fetched once each (404s too, for a while), decoding again asks nothing
    calls = len(reg.calls)
    await resolver.decode_all("avro", payloads)
    assert len(reg.calls) == calls


async def test_registry_outage_raises_and_is_not_cached() -> None:
    reg = FakeRegistry()
    reg.add(1, json.dumps(USER))
    resolver = reg.resolver()
    reg.down = True
    with pytest.raises(RegistryUnavailable):
        await resolver.decode_all("avro", [frame(1, AvroCodec(USER).encode({"name": "x"}))])
    reg.down = False
    assert await resolver.decode_all("avro", [frame(1, AvroCodec(USER).encode({"name": "x"}))]) == [
        {"name": "x", "n": None}]


async def test_json_schema_references_resolve_transitively() -> None:
    reg = FakeRegistry()
    reg.add(5, json.dumps(JSON_ITEM), "JSON", subject="item")
    reg.add(6, json.dumps(JSON_ORDER), "JSON", refs=[{"name": "item.json", "subject": "item", "version": 1}])
    resolver = reg.resolver()
    out = await resolver.decode_all("jsonschema", [frame(6, b'{"item":{"sku":"a"}}')])
    assert out == [{"item": {"sku": "a"}}]
    assert resolver.cached(6).references == {"item.json": json.dumps(JSON_ITEM)}  # type: ignore[union-attr]


async def test_protobuf_text_with_imports_compiles_with_protoc_and_decodes_by_message_index() -> None:
    reg = FakeRegistry()
    reg.add(7, DEP_PROTO, "PROTOBUF", subject="shop/money.proto")
    reg.add(8, MAIN_PROTO, "PROTOBUF", refs=[{"name": "shop/money.proto", "subject": "shop/money.proto", "version": 1}])
    resolver = reg.resolver()
    await resolver.prepare({8})
    resolved = resolver.cached(8)
    assert resolved is not None and isinstance(resolved.codec, ProtobufCodec)
    order = {"id": "o1", "total": {"units": "3", "currency": "EUR"}, "at": "2026-01-02T03:04:05Z"}
    payload = resolved.codec.encode(order, [1])
    out = resolver.decode("protobuf", [frame(8, payload, [1]), frame(8, b"\x08\x05", [0])])
    assert out == [order, {"n": 5}]  # [0]: the first message, Ping
    assert not any(path.startswith("/schemas/ids/8") and "format" in path for path in reg.calls)


def test_proto_text_errors_are_protocs_diagnostics_and_import_names_are_checked() -> None:
    with pytest.raises(ProtobufSchemaError, match=r"does not compile:.*Money"):
        proto_text.compile_proto("m.proto", 'syntax = "proto3";\nmessage A { Money m = 1; }\n', {})
    with pytest.raises(ProtobufSchemaError, match="not a relative"):
        proto_text.compile_proto("m.proto", 'syntax = "proto3";\n', {"../etc/passwd": "x"})
    assert proto_text.looks_like_text(MAIN_PROTO) and not proto_text.looks_like_text("CgVhLnByb3RvIgMKAUE=")


async def test_schema_service_picks_the_tenants_registry() -> None:
    default = RegistryConfig("http://default.test")
    own = RegistryConfig("http://tenant.test")
    svc = SchemaService(default)
    assert svc.resolver(None).client.config is default
    assert svc.resolver(own).client.config is own
    assert svc.resolver(own) is svc.resolver(RegistryConfig("http://tenant.test"))  # one per distinct config
    empty = SchemaService(None)
    assert not empty.available(None) and empty.available(own)
    with pytest.raises(RegistryNotConfigured, match="GATEWAY_SCHEMA_REGISTRY_URL"):
        empty.resolver(None, "avro")
    empty.set_default(None, pending="the embedded schema registry is starting")
    assert empty.available(None)
    with pytest.raises(RegistryUnavailable, match="starting"):
        empty.resolver(None)
    await svc.close()


def _tenants(tmp_path: Path, registry: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(f"""version: 1
tenants:
  - id: acme
    api_keys: ["sha256:{'a' * 64}"]
    schema_registry:
{registry}
  - id: plain
    api_keys: ["sha256:{'b' * 64}"]
""")
    return path


def test_tenants_file_schema_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_SR", "u:p")
    path = _tenants(tmp_path, "      url: https://sr.acme.test\n      basic_auth_env: ACME_SR\n"
                              "      ca_file: ca.pem\n      timeout_s: 2")
    reg = TenantRegistry.from_file(str(path), default_bootstrap="b:9092", default_connection=ConnectionConfig())
    acme = reg.tenants["acme"].schema_registry
    assert acme is not None and acme.url == "https://sr.acme.test" and acme.basic_auth == "u:p"
    assert acme.ca_file == str(tmp_path / "ca.pem") and acme.timeout_s == 2
    assert "u:p" not in repr(acme)
    assert reg.tenants["plain"].schema_registry is None
    for bad, why in (("      url: ftp://x", "url"),
                     ("      url: http://x\n      basic_auth_env: ACME_SR\n      bearer_token_env: ACME_SR",
                      "at most one"),
                     ("      url: http://x\n      bearer_token_env: NOT_SET_ANYWHERE", "NOT_SET_ANYWHERE")):
        with pytest.raises(TenantConfigError, match=why):
            TenantRegistry.from_file(str(_tenants(tmp_path, bad)), default_bootstrap="b:9092",
                                     default_connection=ConnectionConfig())


async def test_avro_schema_references_resolve_in_any_order() -> None:
    """A schema naming types of other subjects (the registry's references, here two levels deep and listed
    out of order) decodes; the C renderer and the Python path agree on it."""
    country = {"type": "enum", "name": "Country", "namespace": "geo", "symbols": ["FR", "NZ"]}
    address = {"type": "record", "name": "Address", "namespace": "geo",
               "fields": [{"name": "city", "type": "string"}, {"name": "country", "type": "geo.Country"}]}
    user = {"type": "record", "name": "User", "fields": [{"name": "home", "type": "geo.Address"},
                                                          {"name": "work", "type": ["null", "geo.Address"]}]}
    reg = FakeRegistry()
    reg.add(20, json.dumps(country), subject="country")
    reg.add(21, json.dumps(address), refs=[{"name": "geo.Country", "subject": "country", "version": 1}],
            subject="address")
    reg.add(22, json.dumps(user), refs=[{"name": "geo.Address", "subject": "address", "version": 1}])
    resolver = reg.resolver()
    value = {"home": {"city": "Lyon", "country": "FR"}, "work": {"city": "Wellington", "country": "NZ"}}
    full = AvroCodec(user, references=[json.dumps(address), json.dumps(country)])  # out of order on purpose
    payloads = [frame(22, full.encode(value))]
    out = await resolver.decode_all("avro", payloads)
    assert out == [{"home": {"city": "Lyon", "country": "FR"},
                    "work": {"geo.Address": {"city": "Wellington", "country": "NZ"}}}]
    from api.v2.render import render_decoded, render_schema_chunks
    from service.consumer.subscription import TopicPartition
    from service.protocol.records import Record

    chunks = [(TopicPartition("t", 0), [Record(0, 1, None, payloads[0], ())])]
    fast = render_schema_chunks(resolver, "avro", None, chunks)
    assert fast.array() == render_decoded(chunks, [([None], out)]).array()
    with pytest.raises(Exception, match="unknown type"):
        AvroCodec(user, references=[json.dumps(address)])  # geo.Country missing
