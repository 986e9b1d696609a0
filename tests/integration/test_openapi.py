"""``openapi.yaml`` is the HTTP contract: it must equal the app's generated schema, be a valid OpenAPI
document, document every route (and only routes that exist) and carry what FastAPI cannot infer
(media types, error codes, security, Confluent semantics)."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi.routing
import orjson
import pytest
import yaml
from fastapi import FastAPI
from openapi_spec_validator import validate

import api.errors
from api.app import create_app
from api.contract import app_schema
from api.docs_ui import DOCS_PATHS
from api.openapi import ERROR_CODES, app_operations
from service.settings import Settings
from tests.integration.node_tools import NODE_ENV, node_tool

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "openapi.yaml"
EXPORT = REPO / "tools" / "export_openapi.py"
REGENERATE = ".venv/bin/python tools/export_openapi.py > openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
V2 = "application/vnd.kafka.v2+json"
RECORD_TYPES = {"application/json", "application/vnd.kafka.binary.v2+json", "application/vnd.kafka.json.v2+json",
                "application/vnd.kafka.avro.v2+json", "application/vnd.kafka.protobuf.v2+json",
                "application/vnd.kafka.jsonschema.v2+json", "application/x-ndjson", "text/event-stream"}


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    doc = yaml.safe_load(OPENAPI.read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def generated() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(app_schema()))  # JSON types, as the YAML holds them


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings.model_construct(), "localhost:9092")


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def _differences(a: Any, b: Any, where: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            here = f"{where}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key not in b:
                yield f"{here}: only in openapi.yaml"
            elif key not in a:
                yield f"{here}: only in the app"
            else:
                yield from _differences(a[key], b[key], here)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{where}/{i}")
    elif a != b:
        yield f"{where or '/'}: {a!r:.80} in openapi.yaml, {b!r:.80} in the app"


def test_committed_contract_is_the_generated_schema(committed: dict[str, Any], generated: dict[str, Any]) -> None:
    if committed == generated:
        return
    pointers = list(_differences(committed, generated))
    diff = "".join(difflib.unified_diff(
        yaml.safe_dump(orjson.loads(orjson.dumps(committed)), sort_keys=False).splitlines(keepends=True),
        yaml.safe_dump(generated, sort_keys=False).splitlines(keepends=True),
        "openapi.yaml", "app.openapi()", n=2))
    pytest.fail(f"openapi.yaml has drifted from the app's OpenAPI schema at {len(pointers)} place(s):\n  "
                + "\n  ".join(pointers[:30]) + f"\n\n{diff[:6000]}\nRegenerate it with:\n  {REGENERATE}\n",
                pytrace=False)


def test_export_is_deterministic(generated: dict[str, Any]) -> None:
    """Same bytes from two runs with different hash seeds, and they parse to the app's schema."""
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, str(EXPORT)], cwd=REPO, env=env, capture_output=True, check=True,
                              timeout=60)
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    text = outputs[0].decode("utf-8")
    assert text.startswith("# ") and REGENERATE in text.splitlines()[1]
    assert not re.search(r"[&*]id\d+\b", text), "YAML anchors/aliases make the contract hard to read"
    assert yaml.safe_load(text) == generated


def test_contract_is_valid_openapi(committed: dict[str, Any]) -> None:
    assert committed["openapi"] == "3.0.3"  # what client generators handle best (see api.openapi)
    validate(committed)  # raises OpenAPIValidationError with the path of the first problem


def test_redocly_lint_is_clean() -> None:
    """An independent linter (Redocly CLI, rules in redocly.yaml) finds no error and no warning."""
    config = yaml.safe_load((REPO / "redocly.yaml").read_text())
    assert config["extends"] == ["recommended"] and config["rules"]["no-empty-servers"] == "error"
    proc = subprocess.run([str(node_tool("redocly")), "lint", str(OPENAPI), "--config", str(REPO / "redocly.yaml"),
                           "--format", "json"], cwd=REPO, env=NODE_ENV, capture_output=True, text=True, timeout=180)
    start = proc.stdout.find("{")
    assert start >= 0, f"no report from redocly (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout[start:])
    problems = [f"{p['severity']} {p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
                for p in report["problems"]]
    assert report["totals"]["errors"] == 0 and report["totals"]["warnings"] == 0, "\n".join(problems)
    assert proc.returncode == 0


def _schemas(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object of the document (anything with a schema keyword), with its JSON pointer."""
    if isinstance(node, dict):
        if any(k in node for k in ("type", "anyOf", "oneOf", "allOf", "nullable", "$ref", "enum", "const")):
            yield where, node
        for key, value in node.items():
            yield from _schemas(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _schemas(value, f"{where}/{i}")


def test_generator_friendly_form(committed: dict[str, Any]) -> None:
    """What broke client generators is gone: no null alternatives or type lists (nullable: true beside a
    type instead), no const, no either/or combinators on request bodies, flat error bodies, a server."""
    for where, schema in _schemas(committed):
        if "/properties/type" in where or where.endswith("/examples"):
            continue
        assert not isinstance(schema.get("type"), list), where
        assert schema.get("type") != "null", where
        assert "const" not in schema, where
        for combinator in ("anyOf", "oneOf"):
            for alternative in schema.get(combinator, ()):
                assert alternative.get("type") != "null", where
        if schema.get("nullable"):
            assert "type" in schema, where
    components = committed["components"]["schemas"]
    for name in ("Subscription", "Positions", "CommitOffsets", "Partitions", "CreateConsumer"):
        assert not {"anyOf", "oneOf", "allOf"} & components[name].keys(), name
    subscription = components["Subscription"]
    assert subscription["properties"]["topics"]["nullable"] is True
    assert subscription["properties"]["topic_pattern"] == {**subscription["properties"]["topic_pattern"],
                                                           "type": "string", "nullable": True}
    assert "`topics` wins" in subscription["description"]
    record = components["ConsumerRecord"]
    assert "type" not in record["properties"]["key"] and "type" not in record["properties"]["value"]
    servers = committed["servers"]
    assert servers[0]["url"] == "http://127.0.0.1:8080"
    assert servers[1]["url"] == "{scheme}://{host}" and set(servers[1]["variables"]) == {"scheme", "host"}


def test_every_route_is_documented_and_every_operation_exists(app: FastAPI, committed: dict[str, Any]) -> None:
    documented = {(path, method) for path, method, _ in operations(committed)}
    routes = set(app_operations(app))
    assert routes - documented == set(), "routes missing from openapi.yaml"
    assert documented - routes == set(), "operations in openapi.yaml that the app does not serve"
    # anything else the app serves is FastAPI's own documentation
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    served = {(r.path, m.lower()) for r in (iter_contexts(app.routes) if iter_contexts else app.routes)
              for m in (getattr(r, "methods", None) or ()) if m != "HEAD"}
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url, *DOCS_PATHS}
    assert {path for path, _ in served - documented} <= docs


def test_operation_ids_are_unique_and_named(committed: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(committed)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][A-Za-z]+", i) for i in ids), ids


def test_error_codes_are_those_of_api_errors(committed: dict[str, Any]) -> None:
    table = api.errors.ERROR_CODES  # the one table of codes
    assert len(table) >= 20 and len({c for _, c, _ in table}) == len(table)
    # v3 answers some errors with the bare HTTP status as the code, as Confluent's v3 does (404)
    assert all(c // 100 == s or c == s or (s, c) == (503, 50003) for s, c, _ in table), \
        "a code that does not start with its status"
    assert ERROR_CODES is table
    description = committed["info"]["description"]
    for status, code, meaning in table:
        assert f"| {status} | {code} | {meaning} |" in description


def test_every_error_response_is_the_error_body_with_its_codes(committed: dict[str, Any]) -> None:
    seen: set[int] = set()
    schemas = committed["components"]["schemas"]
    for path, method, op in operations(committed):
        for status, resp in op["responses"].items():
            code = int(status)
            if code < 400 or path == "/readyz":
                continue
            seen.add(code)
            media = "application/json" if path.startswith("/v3/") else V2  # v3: plain JSON, as Confluent's
            if code in (408, 431):  # the HTTP server's answers, before any route (often before the path is read)
                media = V2
            assert list(resp["content"]) == [media], (path, method, status)
            assert resp["content"][media]["schema"] == {"$ref": f"#/components/schemas/Error{code}"}
            if code in (429, 503):
                assert "Retry-After" in resp["headers"]
            if code == 401:
                assert "WWW-Authenticate" in resp["headers"]
    for code in seen:  # one flat schema per status: the error body with that status's codes
        body = schemas[f"Error{code}"]
        assert body["type"] == "object" and body["required"] == ["error_code", "message"]
        assert body["properties"]["error_code"]["enum"] == [c for s, c, _ in ERROR_CODES if s == code]
        assert body["properties"]["message"]["type"] == "string"
    # every status of the table is documented on some operation, except the path-level ones
    assert {s for s, _, _ in ERROR_CODES} - seen == {405}


def test_consumer_operations(committed: dict[str, Any]) -> None:
    ops = [(p, m, op) for p, m, op in operations(committed) if p.startswith("/consumers/")]
    assert len(ops) == 13
    for path, method, op in ops:
        assert op["security"] == [{"BearerAuth": []}, {"ApiKeyAuth": []}], (path, method)
        for status in ("400", "401", "404", "413", "415", "422", "429", "500", "503"):
            assert status in op["responses"], (path, method, status)
        if "requestBody" in op:
            content = op["requestBody"]["content"]
            assert list(content) == [V2], (path, method)  # application/json is accepted too (description)
        for status, resp in op["responses"].items():
            if status.startswith("2") and "content" in resp and not path.endswith("/records"):
                assert list(resp["content"]) == [V2], (path, method, status)
    schemes = committed["components"]["securitySchemes"]
    assert schemes["BearerAuth"] == {**schemes["BearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["ApiKeyAuth"] == {**schemes["ApiKeyAuth"], "type": "apiKey", "in": "header", "name": "X-API-Key"}
    for path in ("/healthz", "/readyz", "/metrics"):
        assert committed["paths"][path]["get"]["security"] == []
    assert list(committed["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_records_media_types(committed: dict[str, Any]) -> None:
    op = committed["paths"]["/consumers/{group}/instances/{instance_id}/records"]["get"]
    content = op["responses"]["200"]["content"]
    assert set(content) == RECORD_TYPES
    # generated clients send the first JSON type as Accept: application/json, the instance's format
    assert next(iter(content)) == "application/json"
    for media in RECORD_TYPES - {"application/x-ndjson", "text/event-stream"}:
        assert content[media]["schema"] == {"type": "array", "items": {"$ref": "#/components/schemas/ConsumerRecord"}}
    record = committed["components"]["schemas"]["ConsumerRecord"]
    assert set(record["required"]) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
    assert "406" in op["responses"]
    assert {p["name"] for p in op["parameters"]} == {"group", "instance_id", "timeout", "max_bytes", "max_records",
                                                     "resume"}


def test_produce_bodies(committed: dict[str, Any]) -> None:
    schemas = committed["components"]["schemas"]
    for path in ("/topics/{topic}", "/topics/{topic}/partitions/{partition}"):
        content = committed["paths"][path]["post"]["requestBody"]["content"]
        assert content == {
            "application/vnd.kafka.binary.v2+json": {"schema": {"$ref": "#/components/schemas/BinaryProduceRequest"}},
            "application/vnd.kafka.json.v2+json": {"schema": {"$ref": "#/components/schemas/JsonProduceRequest"}},
            "application/vnd.kafka.avro.v2+json": {"schema": {"$ref": "#/components/schemas/AvroProduceRequest"}},
            "application/vnd.kafka.protobuf.v2+json": {
                "schema": {"$ref": "#/components/schemas/ProtobufProduceRequest"}},
            "application/vnd.kafka.jsonschema.v2+json": {
                "schema": {"$ref": "#/components/schemas/JsonSchemaProduceRequest"}}}
        # openapi-generator types the body with the first media type's schema: json's takes every format's records
        # (any JSON value, base64 text included, and the schema fields); the Content-Type parameter picks the format
        assert next(iter(content)) == "application/vnd.kafka.json.v2+json"
        (param,) = [p for p in committed["paths"][path]["post"]["parameters"] if p["in"] == "header"]
        assert param["name"] == "Content-Type" and param["required"] is False
        assert param["schema"]["enum"] == list(content)
    for name in ("AvroProduceRequest", "ProtobufProduceRequest", "JsonSchemaProduceRequest", "JsonProduceRequest"):
        assert {"key_schema", "value_schema", "key_schema_id", "value_schema_id"} <= set(schemas[name]["properties"])
    binary = schemas["BinaryProduceRecord"]["properties"]
    assert binary["value"] == {**binary["value"], "type": "string", "format": "byte", "nullable": True}
    assert "type" not in schemas["JsonProduceRecord"]["properties"]["value"]  # any JSON value


def test_confluent_semantics_are_stated(committed: dict[str, Any]) -> None:
    base = "/consumers/{group}/instances/{instance_id}"
    commit = committed["paths"][base + "/offsets"]["post"]
    assert "offset + 1" in commit["description"]
    assert commit["requestBody"].get("required", False) is False  # an empty body commits everything consumed
    assert list(commit["responses"]["200"]["content"]) == [V2]
    assert commit["responses"]["200"]["content"][V2]["schema"] == {"type": "array", "maxItems": 0, "items": {}}
    committed_get = committed["paths"][base + "/offsets"]["get"]
    assert committed_get["requestBody"].get("required", False) is False  # a body on a GET, as Confluent, or none
    assert "request body on a GET" in committed_get["description"]
    query = {p["name"]: p for p in committed_get["parameters"] if p["in"] == "query"}
    assert set(query) == {"topic", "partition"}
    assert query["topic"]["schema"]["type"] == query["partition"]["schema"]["type"] == "array"
    links = committed["paths"]["/consumers/{group}"]["post"]["responses"]["200"]["links"]
    ids = {op["operationId"] for p, _, op in operations(committed) if p.startswith(base)}
    assert set(links) == ids
    for link in links.values():
        assert link["parameters"] == {"group": "$request.path.group", "instance_id": "$response.body#/instance_id"}
