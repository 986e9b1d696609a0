"""Hostile JSON Schemas, Protobuf payloads and JSON values against a running gateway (real sockets).

One gateway process, its registry the protocol-level test registry of ``tests/fakes/registry`` (it registers any
schema, as a shared registry of many tenants may, so the gateway's own checks are what is tested):

- ReDoS: a JSON Schema ``pattern`` / ``patternProperties`` of ``^(a+)+$`` against ``"a" * 30 + "!"`` (Python's
  backtracking ``re`` takes ~1.3 s at 25 characters and x2 per character, holding the GIL: ~40 s here, the
  whole gateway stalled) is answered 422/42203 at once while ``/healthz`` keeps answering; so are the
  patterns ``additionalProperties`` / ``unevaluatedProperties`` match names against (``patternProperties``
  ``^(a|aa)+$`` and a 40-character name ending in ``!``) and ``propertyNames.pattern``;
- a pattern RE2 cannot run is refused at compile, 422/42205 naming its schema path;
- an unresolvable ``$ref`` is 422/42205 naming it on produce (not a 500), and each record's error on poll;
- Protobuf records that have no JSON form (a ``google.protobuf.Value`` holding NaN) or nest past
  GATEWAY_SCHEMA_MAX_DEPTH are per-record errors on poll (not a 500 for the whole poll), and such a value is
  422/42203 on produce;
- json format: a record holding ``1e400`` (no double holds it) is that record's error, so the poll answer
  stays strict JSON; a value deeper than the renderers' 512 levels is refused on produce (422, not stored,
  not a 500).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from google.protobuf import struct_pb2

from service.embedded.tansu import EmbeddedBroker
from service.schemas.wire import frame
from tests.fakes.registry.server import TestRegistry
from tests.integration.gateway_proc import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

V2 = "application/vnd.kafka.v2+json"
JSONSCHEMA = "application/vnd.kafka.jsonschema.v2+json"
PROTOBUF = "application/vnd.kafka.protobuf.v2+json"
JSONFMT = "application/vnd.kafka.json.v2+json"
REDOS = "^(a+)+$"
EVIL = "a" * 30 + "!"
PROTO = """syntax = "proto3";
import "google/protobuf/struct.proto";
message N {
  N n = 1;
  google.protobuf.Value v = 2;
}
"""


@pytest.fixture(scope="module")
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as reg:
        yield reg


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, registry: TestRegistry, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[GatewayProcess]:
    log: Path = tmp_path_factory.mktemp("hostile") / "gateway.log"
    with GatewayProcess(tansu.bootstrap, env={"GATEWAY_SCHEMA_REGISTRY_URL": registry.url,
                                              "GATEWAY_AUTO_CREATE_TOPICS": "true",
                                              "GATEWAY_EMBEDDED_REGISTRY": "false"}, log_file=log) as g:
        yield g


@pytest.fixture
async def http(gw: GatewayProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        yield c


def _topic() -> str:
    return f"hostile-{uuid.uuid4().hex[:10]}"


def refused(r: httpx.Response, status: int, code: int, *fragments: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_code"] == code, body
    for f in fragments:
        assert f in body["message"], body["message"]
    return str(body["message"])


def _produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


async def _poll(http: httpx.AsyncClient, topic: str, fmt: str, accept: str, n: int) -> list[dict[str, Any]]:
    """Create a consumer of ``fmt``, assign partition 0, poll until ``n`` records came (each answer is parsed
    strictly, with orjson), delete it."""
    r = await http.post(f"/consumers/g-{uuid.uuid4().hex[:8]}", headers={"Content-Type": V2},
                        json={"format": fmt, "auto.offset.reset": "earliest"})
    assert r.status_code == 200, r.text
    base = r.json()["base_uri"]
    r = await http.post(f"{base}/assignments", headers={"Content-Type": V2},
                        json={"partitions": [{"topic": topic, "partition": 0}]})
    assert r.status_code == 204, r.text
    got: list[dict[str, Any]] = []
    try:
        for _ in range(40):
            r = await http.get(f"{base}/records", headers={"Accept": accept}, params={"timeout": 1000})
            assert r.status_code == 200, r.text
            got += orjson.loads(r.content)  # strict: a raw 1e400 would fail the whole answer here
            if len(got) >= n:
                return got
        raise AssertionError(f"{len(got)} of {n} records")
    finally:
        await http.delete(base, headers={"Content-Type": V2})


async def _healthz_while(http: httpx.AsyncClient, task: asyncio.Future[Any], bound_s: float) -> int:
    """Probe /healthz until ``task`` is done; each probe must answer within ``bound_s``. Returns the probes."""
    probes = 0
    while True:
        started = time.monotonic()
        r = await http.get("/healthz", timeout=bound_s * 4)
        elapsed = time.monotonic() - started
        assert r.status_code == 200
        assert elapsed < bound_s, f"/healthz took {elapsed:.2f} s while a hostile produce ran"
        probes += 1
        if task.done():
            return probes


# -- JSON Schema -----------------------------------------------------------------------------------------------
async def test_catastrophic_patterns_do_not_stall_the_gateway(http: httpx.AsyncClient) -> None:
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string", "pattern": REDOS}},
                         "patternProperties": {"^(b+)+$": {"type": "integer"}}})
    bodies = [{"value_schema": schema, "records": [{"value": {"name": EVIL}}]},
              {"value_schema": schema,
               "records": [{"value": {"name": "aaa", "b" * 30 + "!": 1}}, {"value": {"b" * 30: "x"}}]}]
    topic = _topic()

    async def attack() -> list[httpx.Response]:
        return list(await asyncio.gather(*(
            http.post(f"/topics/{topic}", headers={"Content-Type": JSONSCHEMA, "Accept": V2}, json=b)
            for b in bodies)))

    started = time.monotonic()
    task = asyncio.ensure_future(asyncio.wait_for(attack(), 30))  # Python's re: ~40 s each, the loop held
    probes = await _healthz_while(http, task, bound_s=1.0)
    answers = await task
    assert time.monotonic() - started < 15, "the hostile produces took as long as a backtracking match"
    refused(answers[0], 422, 42203, "records[0].value.$.name", "does not match")
    refused(answers[1], 422, 42203, "records[1].value.$." + "b" * 30)  # the key matched ^(b+)+$: a string
    assert probes >= 1
    # a valid record with the same schema is written
    r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                        json={"value_schema": schema, "records": [{"value": {"name": "aaaa", "bb": 2}}]})
    assert r.status_code == 200, r.text


SLOW = "^(a|aa)+$"  # Python's re on "a" * 40 + "!": tens of seconds, the GIL held


async def test_patterns_matched_by_additional_and_unevaluated_properties_do_not_stall(http: httpx.AsyncClient
                                                                                      ) -> None:
    """additionalProperties and unevaluatedProperties match names against patternProperties' patterns (in
    the jsonschema library, with Python's re): on RE2 here, answered 422 at once, /healthz responsive."""
    key = "a" * 40 + "!"
    schemas = [{"type": "object", "patternProperties": {SLOW: {"type": "integer"}}, "additionalProperties": False},
               {"type": "object", "patternProperties": {SLOW: {}}, "additionalProperties": {"type": "integer"}},
               {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
               {"type": "object", "propertyNames": {"pattern": SLOW}}]
    topic = _topic()

    async def attack() -> list[httpx.Response]:
        return list(await asyncio.gather(*(
            http.post(f"/topics/{topic}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                      json={"value_schema": json.dumps(s), "records": [{"value": {key: "x"}}]})
            for s in schemas)))

    started = time.monotonic()
    task = asyncio.ensure_future(asyncio.wait_for(attack(), 60))
    probes = await _healthz_while(http, task, bound_s=1.0)
    answers = await task
    assert time.monotonic() - started < 15, "the hostile produces took as long as a backtracking match"
    assert probes >= 1
    refused(answers[0], 422, 42203, "does not match any of the regexes")
    refused(answers[1], 422, 42203, "is not of type 'integer'")
    refused(answers[2], 422, 42203, "Unevaluated properties are not allowed")
    refused(answers[3], 422, 42203, "does not match")
    for s in schemas:  # names the patterns match (or no extra names at all) are written
        r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                            json={"value_schema": json.dumps(s), "records": [{"value": {"aaaa": 1}}]})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a)\\1$"}}},
     "#/properties/name/pattern"),
    ({"type": "object", "patternProperties": {"^(?=x)": {"type": "integer"}}}, "#/patternProperties/^(?=x)"),
    ({"type": "object", "properties": {"d": {"type": "string", "pattern": "(?<!a)b"}}}, "#/properties/d/pattern"),
])
async def test_patterns_re2_cannot_run_are_refused_at_compile(http: httpx.AsyncClient, schema: Any,
                                                              where: str) -> None:
    r = await http.post(f"/topics/{_topic()}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                        json={"value_schema": json.dumps(schema), "records": [{"value": {"name": "aa"}}]})
    refused(r, 422, 42205, where, "RE2")


async def test_unresolvable_ref_is_a_422_naming_it(http: httpx.AsyncClient, registry: TestRegistry,
                                                  tansu: EmbeddedBroker) -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}})
    r = await http.post(f"/topics/{_topic()}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                        json={"value_schema": schema, "records": [{"value": {"a": 1}}]})
    refused(r, 422, 42205, "#/properties/a/$ref", "#/definitions/missing", "does not resolve")
    # registered by another client (a registry that does not check): by id, the same 422
    topic = _topic()
    sid = registry.add(f"{topic}-value", schema, "JSON")
    r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONSCHEMA, "Accept": V2},
                        json={"value_schema_id": sid, "records": [{"value": {"a": 1}}]})
    refused(r, 422, 42205, "#/properties/a/$ref")
    # and its records, written by that client, are each the record's error on poll
    _produce_raw(tansu.bootstrap, topic, [frame(sid, b'{"a": 1}'), frame(sid, b'{"a": 2}')])
    got = await _poll(http, topic, "jsonschema", JSONSCHEMA, 2)
    for rec in got:
        assert rec["value"] is None and "#/properties/a/$ref" in rec["value_error"], rec


# -- Protobuf --------------------------------------------------------------------------------------------------
def _nested(levels: int) -> bytes:
    """A wire-format N whose field n nests ``levels`` messages."""
    b = b""
    for _ in range(levels):
        n, size = len(b), bytearray()
        while True:
            size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                break
        b = b"\x0a" + bytes(size) + b
    return b


async def test_protobuf_records_without_a_json_form_are_record_errors(http: httpx.AsyncClient,
                                                                      registry: TestRegistry,
                                                                      tansu: EmbeddedBroker) -> None:
    topic = _topic()
    sid = registry.add(f"{topic}-value", PROTO, "PROTOBUF")
    nan = struct_pb2.Value(number_value=float("nan")).SerializeToString()
    values = [b"\x12" + bytes([len(nan)]) + nan, _nested(80), _nested(3)]
    _produce_raw(tansu.bootstrap, topic, [frame(sid, v, [0]) for v in values])
    got = await _poll(http, topic, "protobuf", PROTOBUF, 3)
    assert got[0]["value"] is None and "NaN" in got[0]["value_error"], got[0]
    assert got[1]["value"] is None and "deeper than 64 levels" in got[1]["value_error"], got[1]
    assert got[2]["value"]["n"]["n"]["n"] is not None and "value_error" not in got[2]


async def test_protobuf_produce_of_a_deep_value_is_a_422(http: httpx.AsyncClient) -> None:
    value: dict[str, Any] = {}
    for _ in range(70):
        value = {"n": value}
    r = await http.post(f"/topics/{_topic()}", headers={"Content-Type": PROTOBUF, "Accept": V2},
                        json={"value_schema": PROTO, "records": [{"value": value}]})
    refused(r, 422, 42203, "deeper than 64 levels")


# -- json format -----------------------------------------------------------------------------------------------
async def test_json_numbers_past_a_double_are_record_errors(http: httpx.AsyncClient, tansu: EmbeddedBroker) -> None:
    topic = _topic()
    values = [b'{"x": 1e400}', b"-1E400", b'{"y": 1e-400}', b'{"ok": 1.5e308}']
    _produce_raw(tansu.bootstrap, topic, values)
    got = await _poll(http, topic, "json", JSONFMT, 4)  # orjson parses the whole answer: no raw 1e400 in it
    for rec, raw in zip(got[:2], values[:2], strict=True):
        assert rec["value"] is None and rec["value_error"] == "not valid JSON", rec
        assert rec["value_base64"] and raw
    assert got[2]["value"] == {"y": 0.0} and got[3]["value"] == {"ok": 1.5e308}


async def test_json_values_deeper_than_the_renderers_are_refused(http: httpx.AsyncClient) -> None:
    topic = _topic()
    for body in (b'{"records":[{"value":' + b"[" * 600 + b"]" * 600 + b"}]}",
                 b'{"records":[{"value":' + b"[" * 990 + b"123456789012345678901234567890" + b"]" * 990 + b"}]}"):
        r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONFMT, "Accept": V2}, content=body)
        refused(r, 422, 42206, "nested deeper than 512 levels")
    r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONFMT, "Accept": V2},
                        content=b'{"records":[{"value":' + b"[" * 500 + b"]" * 500 + b"}]}")
    assert r.status_code == 200, r.text
    got = await _poll(http, topic, "json", JSONFMT, 1)
    assert got[0]["value"] == orjson.loads(b"[" * 500 + b"]" * 500)


async def test_v3_json_data_deeper_than_the_renderers_is_a_record_error(http: httpx.AsyncClient) -> None:
    r = await http.get("/v3/clusters")
    assert r.status_code == 200, r.text
    cluster = r.json()["data"][0]["cluster_id"]
    topic = _topic()
    r = await http.post(f"/topics/{topic}", headers={"Content-Type": JSONFMT, "Accept": V2},
                        json={"records": [{"value": 1}]})  # creates the topic
    assert r.status_code == 200, r.text
    body = b"\n".join([
        b'{"value":{"type":"JSON","data":' + b"[" * 600 + b"]" * 600 + b"}}",
        b'{"value":{"type":"JSON","data":' + b"[" * 990 + b"1.5," + b"1" * 30 + b"]" * 990 + b"}}",
        b'{"value":{"type":"JSON","data":[1]}}',
    ])
    r = await http.post(f"/v3/clusters/{cluster}/topics/{topic}/records", content=body,
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    out = [orjson.loads(line) for line in r.content.split(b"\r\n") if line]
    assert [x["error_code"] for x in out] == [42206, 42206, 200], out
    assert "nested deeper than 512 levels" in out[0]["message"]


def test_protobuf_schema_text_scan_is_linear(tansu: EmbeddedBroker, registry: TestRegistry,
                                             tmp_path: Path) -> None:
    """With a record-name subject strategy, .proto text posted with produce is scanned for its first message
    before anything else; 100 KB of open strings (`"\\` repeated) took ~70 s of the event loop (each quote
    rescanned the rest of the text), now milliseconds: refused 42205 (no message) while /healthz answers."""
    env = {"GATEWAY_SCHEMA_REGISTRY_URL": registry.url, "GATEWAY_AUTO_CREATE_TOPICS": "true",
           "GATEWAY_EMBEDDED_REGISTRY": "false", "GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY": "RecordNameStrategy"}
    with GatewayProcess(tansu.bootstrap, env=env, log_file=tmp_path / "gateway.log") as g:

        async def run() -> None:
            async with httpx.AsyncClient(base_url=g.url, timeout=60) as http:
                schema = '"\\' * 50_000 + '/* ' * 30_000

                async def attack() -> httpx.Response:
                    return await http.post(f"/topics/{_topic()}", headers={"Content-Type": PROTOBUF, "Accept": V2},
                                           json={"value_schema": schema, "records": [{"value": {}}]})

                started = time.monotonic()
                task = asyncio.ensure_future(asyncio.wait_for(attack(), 30))
                assert await _healthz_while(http, task, bound_s=1.0) >= 1
                refused(await task, 422, 42205, "no record name")
                assert time.monotonic() - started < 10

        asyncio.run(run())
