"""Confluent REST Proxy v2 produce endpoints: ``POST /topics/{topic}`` and ``POST /topics/{topic}/partitions/{p}``.

Bodies are Confluent's ``{"records": [{"key", "value", "partition"}], "key_schema", "value_schema",
"key_schema_id", "value_schema_id"}``, with ``Content-Type``:

- ``application/vnd.kafka.binary.v2+json``: key and value are base64 strings (strict RFC 4648 with
  padding, as Confluent's Guava decoder) or null;
- ``application/vnd.kafka.json.v2+json``: key and value are any JSON value, stored as their compact JSON
  text (UTF-8; a JSON ``null`` is a null key/value, as in Confluent; integers beyond 64 bits are kept
  exactly).

Extensions (mirroring what the consumer's records carry, see :mod:`api.v2.render`): per record
``"headers": [{"key": "<string>", "value": "<base64>" | null}]`` (base64 in both formats; no value: null) and
``"timestamp"`` (ms since the epoch; default: the time of the request).

The answer is Confluent's ``ProduceResponse``: ``{"offsets": [{"partition", "offset", "error_code",
"error"}], "key_schema_id": null, "value_schema_id": null}`` in record order, sent once the broker
acknowledged every record (acks=all, idempotent producer: retries never duplicate) or it failed. A failed
record has null partition and offset, ``error_code`` 50003 (retriable Kafka error: sending it again may
work; a message ending in "may have been written" says the outcome is unknown) or 50002 (other Kafka
error), 40301/40101 for authorization/authentication failures, and ``error`` (the Kafka error). The HTTP
status is 200 even then, except 403/401 when a record failed authorization/authentication, like
Confluent's ``ProduceResponse.getRequestStatus``.

Decisions where Confluent's behaviour was not followed or had to be chosen (its v2 code:
``ProduceToTopicAction``, ``ProduceToPartitionAction``, ``AbstractProduceAction``, entities
``ProduceRequest``/``ProduceResponse``/``PartitionOffset``):

- an unknown topic is **404/40401** at once. Confluent hands the records to its Java producer, which
  either auto-creates the topic or fails every record after ``max.block.ms`` (60 s) in a 200 answer. With
  ``GATEWAY_AUTO_CREATE_TOPICS`` (on by default only with the embedded broker of ``make run``) the gateway
  creates the missing topic itself (CreateTopics with ``GATEWAY_AUTO_CREATE_PARTITIONS`` and
  ``GATEWAY_AUTO_CREATE_REPLICATION_FACTOR``) and writes; the tenant's topic patterns apply first (403), and
  names Kafka forbids (other than ``[a-zA-Z0-9._-]{1,249}``, ``.``, ``..``) or starting with ``__`` (internal
  topics) are never created (404/40401), nor, with a tenants file, a topic outside the tenant's
  ``admin_topics`` (404/40401, as with auto-creation off). The producer's own metadata requests never ask the broker to
  auto-create (Tansu would, with 4 partitions). An unknown partition (path, or a record's ``partition``) is
  **404/40402** before anything is produced (Confluent's older v2 checked the path partition the same
  way; a bad record partition made its Java producer throw, a 500).
- ``application/vnd.kafka.{avro,protobuf,jsonschema}.v2+json``: key and value are JSON data
  of the schema named by ``key_schema`` / ``value_schema`` (the schema's text: Avro JSON, ``.proto``, JSON
  Schema; registered under the subject of ``GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY``) or ``key_schema_id`` /
  ``value_schema_id``; the answer carries the ids. Every record is encoded before anything is sent: one bad
  record fails the request (422/42203 naming ``records[i].value.$.path``), nothing is written. A non-null
  key without a key schema is 422/42201, a value without a value schema 422/42202, an invalid schema
  422/42205 (Confluent's codes), an unknown id 422/42210, no registry for the tenant 422/42211, a registry
  that refuses the schema (incompatible: its 409) 422/42212, a registry that is down 503/50307 with
  Retry-After. The engine is :mod:`service.schemas.produce`. Other content types, or none, are 415/41501
  (Confluent's resources consume only the five embedded formats). ``key_schema``/``value_schema``/
  ``*_schema_id`` are ignored with binary and json, as Confluent does.
- bad base64 is **422/42206** naming the record and field (Confluent's old entities: a 422 constraint
  violation; its current serializer answers 408/40801, a known FIXME there).
- an empty body, a body without a non-empty ``records`` array, unknown fields (a typo such as ``vaule``
  would otherwise silently produce a null value) and malformed records are **422/42206**; a bad
  ``partition`` or ``timestamp`` value (not an integer in range; an integral float such as ``5.0`` is an
  integer, as for JSON Schema) is 422/42207; malformed JSON is 400/40001. On the partition route a
  record's (valid) ``partition`` is ignored: the path's partition wins, as in Confluent.
- a topic outside the tenant's patterns is 403/40301.
"""

from __future__ import annotations

import asyncio
import binascii
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from api.auth import current_tenant
from api.deps import BINARY, ERRORS, JSONFMT, V2, runtime
from api.kafka_texts import failure_text, failure_texts
from api.produce_common import LONG_DIGITS as _LONG_DIGITS
from api.produce_common import JsonTooDeep, may_create_topic, missing_topic, partitions_or_create
from api.produce_common import failure_code as _rest_code
from api.produce_common import json_bytes as _json_bytes
from api.produce_common import loads_exact as _loads_exact
from api.v2.topics import catalog
from service.cluster.topics import require_legal_topic_name
from service.errors import GatewayError
from service.producer import (
    Producer,
    ProducerConfig,
    RecordMetadata,
    UnknownTopicError,
    encoding,
    parse_compression,
)
from service.producer.accumulator import Delivery
from service.schemas import produce as schema_produce
from service.schemas.produce import ProduceSchemaError
from service.schemas.subjects import SubjectForbidden, require_spec_subject
from service.tenants import Tenant, TenantError
from service.tenants.errors import SUBJECT_FORBIDDEN

router = APIRouter(tags=["produce"])

SCHEMA_FORMATS = {
    "application/vnd.kafka.avro.v2+json": "avro",
    "application/vnd.kafka.protobuf.v2+json": "protobuf",
    "application/vnd.kafka.jsonschema.v2+json": "jsonschema",
}
_BODY_KEYS = frozenset({"records", "key_schema", "value_schema", "key_schema_id", "value_schema_id"})
_RECORD_KEYS = frozenset({"key", "value", "partition", "headers", "timestamp"})
_KEY_VALUE = frozenset({"key", "value"})
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()
INT64_MAX = 2**63 - 1
#: schema'd batches of at least this many records are encoded off the event loop
ENCODE_IN_THREAD = 1000


# -- OpenAPI description (validation itself is plain code below, never a model per record) -------------------
class ProducedOffset(BaseModel):
    partition: int | None = Field(description="null when the record failed")
    offset: int | None = Field(description="null when the record failed; -1 if the broker stored the record but "
                                           "could not tell its offset (a retried duplicate)",
                               json_schema_extra={"format": "int64"})
    error_code: int | None = Field(description="50002 Kafka error, 50003 retriable Kafka error, 40301 not "
                                               "authorized; null on success")
    error: str | None = Field(description="the Kafka error; null on success")


class ProduceResponse(BaseModel):
    offsets: list[ProducedOffset]
    key_schema_id: int | None = None
    value_schema_id: int | None = None


_MEDIA_TYPE = {"binary": BINARY, "json": JSONFMT, **{f: ct for ct, f in SCHEMA_FORMATS.items()}}
_IGNORED = "ignored with this format (as in Confluent)"


def _schema_fields(fmt: str) -> dict[str, dict[str, Any]]:
    """The body's key_schema/value_schema/*_schema_id fields of one embedded format."""
    if fmt in ("binary", "json"):
        return {f: {"type": [t, "null"], "description": _IGNORED}
                for f, t in (("key_schema", "string"), ("value_schema", "string"),
                             ("key_schema_id", "integer"), ("value_schema_id", "integer"))}
    text = {"avro": "Avro schema (its JSON text, as a string)", "protobuf": "Protobuf schema (.proto text)",
            "jsonschema": "JSON Schema (its JSON text, as a string)"}[fmt]
    out: dict[str, dict[str, Any]] = {}
    for part in ("key", "value"):
        out[f"{part}_schema"] = {
            "type": ["string", "null"],
            "description": f"the {part}s' {text}: registered under the subject of GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY "
                           f"(default <topic>-{part}); needed when a record has a non-null {part} and no "
                           f"{part}_schema_id is given"}
        out[f"{part}_schema_id"] = {
            "type": ["integer", "null"], "minimum": 0, "format": "int64",
            "description": f"the registry id of the {part}s' schema (wins over {part}_schema)"}
    return out


def _body_schema(fmt: str, key_value: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request body of one embedded format, as named schemas (generated clients get a model each)."""
    name = {"jsonschema": "JsonSchema"}.get(fmt, fmt.capitalize())
    record = {
        "type": "object",
        "title": f"{name}ProduceRecord",
        "additionalProperties": False,
        "properties": {
            "key": {**key_value, "description": f"the key: {key_value['description']}"},
            "value": {**key_value, "description": f"the value: {key_value['description']}"},
            "partition": {
                "type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1,
                "description": "POST /topics/{topic}: default by key (murmur2, as the Java client), else a sticky "
                               "partition. POST /topics/{topic}/partitions/{partition}: ignored, the path's "
                               "partition wins (as in Confluent)"},
            "headers": {"type": "array", "description": "extension: record headers (values base64)",
                        "items": {"$ref": "#/components/schemas/ProduceRecordHeader"}},
            "timestamp": {"type": "integer", "minimum": 0, "maximum": INT64_MAX, "format": "int64",
                          "description": "extension: record timestamp in ms (default: now)"},
        },
    }
    body = {
        "type": "object",
        "title": f"{name}ProduceRequest",
        "description": f"Records to produce, sent as `{_MEDIA_TYPE[fmt]}`.",
        "required": ["records"],
        "additionalProperties": False,
        "properties": {
            "records": {"type": "array", "minItems": 1, "items": {"$ref": f"#/components/schemas/{name}ProduceRecord"}},
            **_schema_fields(fmt),
        },
    }
    return {f"{name}ProduceRequest": body, f"{name}ProduceRecord": record}


#: The produce bodies' schemas, added to the contract's components by :mod:`api.openapi`.
PRODUCE_SCHEMAS: dict[str, dict[str, Any]] = {
    **_body_schema("binary", {"type": ["string", "null"], "format": "byte",
                              "description": "base64 (RFC 4648, with padding); null: none"}),
    **_body_schema("json", {"description": "any JSON value, stored as its JSON text; null: none"}),
    **_body_schema("avro", {"description": "JSON data of the Avro schema (unions as {\"type\": value} or bare), "
                                           "encoded and framed with its schema id; null: none"}),
    **_body_schema("protobuf", {"description": "the first message of the Protobuf schema in its JSON form, "
                                               "encoded and framed with its schema id; null: none"}),
    **_body_schema("jsonschema", {"description": "JSON data valid against the JSON Schema, framed with its "
                                                 "schema id; null: none"}),
    "ProduceRecordHeader": {
        "type": "object", "title": "ProduceRecordHeader", "required": ["key"], "additionalProperties": False,
        "properties": {"key": {"type": "string"},
                       "value": {"type": ["string", "null"], "format": "byte", "description": "base64; absent: null"}}},
}


def _openapi() -> dict[str, Any]:
    """The produce operations' body and format, in a shape that clients generated from the contract can use.

    The body keeps one media type per embedded format, each with its own schema (what the gateway accepts).
    Generators differ in what they make of several media types: openapi-generator types the body with the
    first one's schema and sends the first JSON media type unless a ``Content-Type`` parameter says otherwise;
    openapi-python-client picks the media type from the body's class. So the json format comes first (its
    records take any JSON value, base64 text included, so that one body type can carry binary records too),
    and ``Content-Type`` is also listed as an optional header parameter, with the five media types: it is the
    header the gateway reads anyway (OpenAPI tools that follow the specification ignore such a parameter and
    use the body's media types).
    """
    schema = {f: {"schema": {"$ref": f"#/components/schemas/{name}ProduceRequest"}}
              for f, name in (("json", "Json"), ("binary", "Binary"), ("avro", "Avro"), ("protobuf", "Protobuf"),
                              ("jsonschema", "JsonSchema"))}
    return {
        "parameters": [{
            "name": "Content-Type", "in": "header", "required": False,
            "description": "the embedded format of the records: the media type of the body (the header the "
                           "gateway reads; for generated clients that otherwise send their first media type)",
            "schema": {"type": "string", "enum": [_MEDIA_TYPE[f] for f in schema]}}],
        "requestBody": {"required": True, "content": {_MEDIA_TYPE[f]: body for f, body in schema.items()}},
    }


PRODUCE_ERRORS: dict[int | str, dict[str, Any]] = {
    **{s: e for s, e in ERRORS.items() if s not in (404, 409, 410)},
    404: {"model": ERRORS[404]["model"], "description": "not found (40401 topic, 40402 partition)"},
}


# -- helpers ---------------------------------------------------------------------------------------------------
def _invalid(message: str, code: int = 42206) -> GatewayError:
    return GatewayError(message, status=422, error_code=code)


def embedded_format(request: Request) -> str:
    return media_format(request.headers.get("content-type", ""))


def media_format(content_type: str) -> str:
    """The produce format a request's ``Content-Type`` names, or 415/41501."""
    ct = content_type.split(";", 1)[0].strip().lower()
    if ct == BINARY:
        return "binary"
    if ct == JSONFMT:
        return "json"
    fmt = SCHEMA_FORMATS.get(ct)
    if fmt is not None:
        return fmt
    raise GatewayError(f"unsupported content type {ct or '(none)'!r} for produce; use {BINARY} (base64 keys and "
                       f"values), {JSONFMT} or {', '.join(SCHEMA_FORMATS)}", status=415, error_code=41501)


def producer_for(request: Request, tenant: Tenant) -> Producer:
    """The tenant's producer, created on first use (one idempotent producer per tenant)."""
    rt = runtime(request, tenant)
    producer: Producer | None = rt.producer
    if producer is None:  # a closed one (shutdown) stays: its send_many answers 503/50003
        s = request.app.state.settings
        batch = s.producer_max_batch_bytes
        producer = rt.producer = Producer(rt.client, ProducerConfig(
            compression=parse_compression(s.producer_compression),
            linger_ms=s.producer_linger_ms,
            max_batch_bytes=batch,
            max_request_bytes=max(batch, 8 * 1024 * 1024),
            request_timeout_ms=s.request_timeout_ms,
            delivery_timeout_ms=s.producer_delivery_timeout_ms,
            idempotent=s.producer_idempotent,
            max_in_flight_per_broker=s.producer_max_in_flight_per_broker,
        ))
    return producer


def _parse_body(raw: bytes, fmt: str) -> Any:
    if not raw.strip():
        raise _invalid('the request body is empty; expected {"records": [...]}')
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(f"malformed JSON: {exc}", status=400, error_code=40001) from None
    if fmt in ("json", "jsonschema") and _LONG_DIGITS.search(raw):
        try:
            body = _loads_exact(raw)  # exact integers beyond 64 bits (orjson would make them floats)
        except JsonTooDeep as exc:
            raise _invalid(f"the body: {exc}") from None
    return body


def _b64(v: Any, i: int, field: str) -> bytes | None:
    if v is None:
        return None
    if type(v) is not str:
        raise _invalid(f"records[{i}].{field} must be a base64 string or null")
    try:
        return binascii.a2b_base64(v, strict_mode=True)
    except ValueError:
        raise _invalid(f"records[{i}].{field} is not valid base64 (RFC 4648, with padding)") from None


def _headers(v: Any, i: int) -> list[tuple[str, bytes | None]]:
    if v is None:
        return []
    if type(v) is not list:
        raise _invalid(f"records[{i}].headers must be an array of {{\"key\", \"value\"}} objects")
    out = []
    for j, h in enumerate(v):
        if type(h) is not dict or type(h.get("key")) is not str or not set(h) <= {"key", "value"}:
            raise _invalid(f"records[{i}].headers[{j}] must be {{\"key\": <string>, \"value\": <base64> | null}}")
        out.append((h["key"], _b64(h.get("value"), i, f"headers[{j}].value")))
    return out


def _int_field(v: Any, i: int, field: str, maximum: int) -> int | None:
    if v is None:
        return None
    if type(v) is float and v.is_integer():  # 5.0 is an integer for JSON Schema (and Jackson)
        v = int(v)
    if type(v) is not int or not 0 <= v <= maximum:
        raise _invalid(f"records[{i}].{field} must be an integer between 0 and {maximum}", 42207)
    return v


def too_many_records(max_records: int) -> GatewayError:
    """413 / 41303: more records in one request than ``GATEWAY_PRODUCE_MAX_RECORDS`` (nothing is written)."""
    return GatewayError(f"more than {max_records} records in one produce request (GATEWAY_PRODUCE_MAX_RECORDS): "
                        "nothing was written; send them in several requests", status=413, error_code=41303)


def parse_records(body: Any, fmt: str, path_partition: int | None,
                  max_records: int | None = None) -> tuple[list[tuple[Any, ...]], list[int]]:
    """(key, value, headers, partition, timestamp) tuples and key+value sizes, or a 422 GatewayError (413 /
    41303 for more than ``max_records`` records, before any record is looked at).

    With a schema'd ``fmt`` (avro, protobuf, jsonschema) key and value stay the JSON data as sent (sizes 0):
    :func:`_encode_schema_records` replaces them with their framed bytes."""
    if type(body) is not dict:
        raise _invalid('the body must be a JSON object {"records": [...]}')
    extra = [k for k in body if k not in _BODY_KEYS]
    if extra:
        raise _invalid(f"unknown field(s) {', '.join(repr(k) for k in extra)}; expected records, key_schema, "
                       "value_schema, key_schema_id, value_schema_id (the schema fields are ignored with binary "
                       "and json)")
    records = body.get("records")
    if type(records) is not list or not records:
        raise _invalid("records must be a non-empty array")
    if max_records is not None and len(records) > max_records:
        raise too_many_records(max_records)
    binary = fmt == "binary"
    if binary and encoding.native is not None:  # plain base64 key/value records, decoded in C
        fast = encoding.native.parse_binary(records, path_partition)
        if fast is not None:
            return fast
    out: list[tuple[Any, ...]] = []
    sizes: list[int] = []
    mode = fmt if fmt in ("binary", "json") else "schema"
    a2b = binascii.a2b_base64
    for i, r in enumerate(records):
        # fast path: a binary record of only a key and/or a value (base64 strings or null)
        if binary and type(r) is dict and len(r) <= 2 and r.keys() <= _KEY_VALUE:
            k = r.get("key")
            v = r.get("value")
            if (k is None or type(k) is str) and (v is None or type(v) is str):
                try:
                    key = None if k is None else a2b(k, strict_mode=True)
                    value = None if v is None else a2b(v, strict_mode=True)
                except ValueError:
                    pass  # the full check below names the field
                else:
                    out.append((key, value, _NO_HEADERS, path_partition, None))
                    sizes.append((len(key) if key is not None else 0) + (len(value) if value is not None else 0))
                    continue
        rec = _parse_record(r, i, mode, path_partition)
        out.append(rec)
        sizes.append(0 if mode == "schema" else
                     (len(rec[0]) if rec[0] is not None else 0) + (len(rec[1]) if rec[1] is not None else 0))
    return out, sizes


def _parse_record(r: Any, i: int, mode: str, path_partition: int | None) -> tuple[Any, ...]:
    if type(r) is not dict:
        raise _invalid(f"records[{i}] must be an object")
    unknown = [k for k in r if k not in _RECORD_KEYS]
    if unknown:
        raise _invalid(f"records[{i}]: unknown field(s) {', '.join(repr(k) for k in unknown)}")
    if mode == "binary":
        key = _b64(r.get("key"), i, "key")
        value = _b64(r.get("value"), i, "value")
    elif mode == "schema":  # JSON data, encoded with its schema once every record parsed
        key = r.get("key")
        value = r.get("value")
    else:
        try:
            key = _json_bytes(r.get("key"))
        except JsonTooDeep as exc:
            raise _invalid(f"records[{i}].key: {exc}") from None
        try:
            value = _json_bytes(r.get("value"))
        except JsonTooDeep as exc:
            raise _invalid(f"records[{i}].value: {exc}") from None
    partition = _int_field(r.get("partition"), i, "partition", 2**31 - 1)
    if path_partition is not None:  # the path's partition wins, as in Confluent
        partition = path_partition
    headers = _headers(r.get("headers"), i) if "headers" in r else _NO_HEADERS
    ts = _int_field(r.get("timestamp"), i, "timestamp", INT64_MAX) if "timestamp" in r else None
    return key, value, headers, partition, ts


def parse_body_records(raw: bytes, fmt: str, path_partition: int | None,
                       max_records: int | None = None) -> tuple[Any, list[tuple[Any, ...]], list[int]]:
    """The parsed body (None for a plain binary body, parsed in C without a JSON parser: ``{"records":
    [{"key"/"value": <base64> | null}, ...]}``, no dict per record), its records and their sizes; errors raise.
    More than ``max_records`` records (``GATEWAY_PRODUCE_MAX_RECORDS``) is 413 / 41303: the C parser stops at
    the record after the cap, the JSON path before any record is converted."""
    if fmt == "binary" and encoding.native is not None:
        plain = encoding.native.parse_body_binary(raw, path_partition, -1 if max_records is None else max_records)
        if plain is not None:
            if type(plain) is int:
                raise too_many_records(plain - 1)
            return None, plain[0], plain[1]
    body = _parse_body(raw, fmt)
    records, sizes = parse_records(body, fmt, path_partition, max_records)
    return body, records, sizes


def render(results: list[Any], key_schema_id: int | None = None,
           value_schema_id: int | None = None) -> tuple[bytes, int, int, list[bool] | None]:
    """The ProduceResponse body, its HTTP status (Confluent: 403/401 if a record failed authorization or
    authentication, else 200), the number of failures and which records succeeded (None: all of them)."""
    if encoding.native is not None and type(results) is list:  # every record written: the body in C
        body = encoding.native.render_offsets(results, RecordMetadata, key_schema_id, value_schema_id)
        if body is not None:
            return body, 200, 0, None
    parts: list[bytes] = []
    status = 200
    failed = 0
    oks: list[bool] = []
    failures: list[Any] = []
    for r in results:
        if type(r) is RecordMetadata:
            parts.append(b'{"partition":%d,"offset":%d,"error_code":null,"error":null}' % (r.partition, r.offset))
            oks.append(True)
        else:
            code = _rest_code(r)
            if status == 200 and code in (40301, 40101):
                status = 403 if code == 40301 else 401
            # the code's name, not the broker's text (logged): it may name brokers and addresses
            parts.append(orjson.dumps({"partition": None, "offset": None, "error_code": code,
                                       "error": failure_text(r)}))
            failures.append(r)
            failed += 1
            oks.append(False)
    body = b'{"offsets":[' + b",".join(parts) + b'],"key_schema_id":%s,"value_schema_id":%s}' % (
        b"null" if key_schema_id is None else b"%d" % key_schema_id,
        b"null" if value_schema_id is None else b"%d" % value_schema_id)
    if failures:
        failure_texts(failures)
    return body, status, failed, oks


def _check_partitions(topic: str, partitions: set[int], records: Sequence[tuple[Any, ...]],
                      path_partition: int | None) -> None:
    if path_partition is not None:
        if path_partition not in partitions:
            raise GatewayError(f"partition {path_partition} of topic {topic!r} not found", status=404,
                               error_code=40402)
        return
    asked = {rec[3] for rec in records}
    asked.discard(None)
    if asked <= partitions:
        return
    for i, rec in enumerate(records):  # name the first record asking for a missing partition
        if rec[3] is not None and rec[3] not in partitions:
            raise GatewayError(f"records[{i}]: partition {rec[3]} of topic {topic!r} not found", status=404,
                               error_code=40402)


def _strategy(settings: Any, is_key: bool) -> str:
    specific = settings.schema_key_subject_name_strategy if is_key else settings.schema_value_subject_name_strategy
    return str(specific or settings.schema_subject_name_strategy)


async def _require_subjects(resolver: Any, tenant: Tenant, fmt: str, topic: str, settings: Any,
                            *specs: schema_produce.SchemaSpec | None) -> None:
    """403/40304 unless every schema the body names is the tenant's (a subject of its own for a schema text,
    an id registered under one of its subjects), checked before anything is registered or resolved. No check
    for a tenant without subject patterns (open mode, a registry of its own)."""
    if tenant.subject_patterns is None:
        return
    for spec in specs:
        if spec is None:
            continue
        try:
            await require_spec_subject(resolver, fmt, spec, topic, _strategy(settings, spec.is_key),
                                       tenant.allows_subject)
        except SubjectForbidden as exc:
            raise TenantError(403, SUBJECT_FORBIDDEN, exc.message) from None


async def _encode_schema_records(request: Request, tenant: Tenant, fmt: str, topic: str, body: Any,
                                 records: list[tuple[Any, ...]], sizes: list[int]) -> tuple[int | None, int | None]:
    """Resolve the body's key/value schemas (registering schema text) and replace every record's JSON key and
    value with its framed bytes, in place; all or nothing. Returns the key and value schema ids."""
    resolver = request.app.state.schemas.resolver(tenant.schema_registry, fmt)  # no registry: 42211, first
    try:
        key_spec, value_spec = schema_produce.schema_specs(body)
        keys = [r[0] for r in records]
        values = [r[1] for r in records]
        schema_produce.require_schemas(keys, values, key_spec, value_spec)
        settings = request.app.state.settings
        key_enc = value_enc = None
        await _require_subjects(resolver, tenant, fmt, topic, settings, key_spec, value_spec)
        if key_spec is not None:
            key_enc = await schema_produce.resolve_encoder(resolver, fmt, key_spec, topic, _strategy(settings, True))
        if value_spec is not None:
            value_enc = await schema_produce.resolve_encoder(resolver, fmt, value_spec, topic,
                                                             _strategy(settings, False))
        if len(records) < ENCODE_IN_THREAD:
            encoded = schema_produce.encode_batch(keys, values, key_enc, value_enc)
        else:  # a large batch: the event loop keeps serving other requests meanwhile
            encoded = await asyncio.to_thread(schema_produce.encode_batch, keys, values, key_enc, value_enc)
    except ProduceSchemaError as exc:
        raise GatewayError(exc.message, status=exc.status, error_code=exc.code) from None
    for i, (k, v) in enumerate(encoded):
        records[i] = (k, v, *records[i][2:])
        sizes[i] = (len(k) if k is not None else 0) + (len(v) if v is not None else 0)
    return (key_enc.schema_id if key_enc is not None else None,
            value_enc.schema_id if value_enc is not None else None)


async def produce(request: Request, tenant: Tenant, topic: str, path_partition: int | None) -> Response:
    content, status = await produce_answer(request, tenant, topic, path_partition)
    return Response(content, status_code=status, media_type=V2)


async def produce_answer(request: Request, tenant: Tenant, topic: str, path_partition: int | None) -> tuple[bytes, int]:
    """The ProduceResponse body (media type ``V2``) and HTTP status of one produce request; errors raise."""
    fmt = embedded_format(request)
    tenant.require_topic(topic)
    body, records, sizes = parse_body_records(await request.body(), fmt, path_partition,
                                              request.app.state.settings.produce_max_records)
    plain = body is None
    require_legal_topic_name(topic)
    producer = producer_for(request, tenant)
    settings = request.app.state.settings
    key_schema_id = value_schema_id = None
    if fmt in ("binary", "json"):
        try:
            partitions = await partitions_or_create(settings, producer, topic, catalog(request, tenant), tenant)
        except UnknownTopicError:
            raise GatewayError(missing_topic(settings, topic, tenant), status=404, error_code=40401) from None
        # (a plain body has no per-record partitions: only the path's partition is checked)
        _check_partitions(topic, partitions, () if plain else records, path_partition)
    else:
        # schema'd: 404s first (no schema registered for a topic that is not there), then every record
        # encoded, then a missing topic created (when auto-creation is on), then the partitions checked
        known: set[int] | None = None
        try:
            known = set(await producer.partitions(topic))
        except UnknownTopicError:
            if not may_create_topic(settings, topic, tenant):
                raise GatewayError(missing_topic(settings, topic, tenant), status=404, error_code=40401) from None
        if known is not None:
            _check_partitions(topic, known, records, path_partition)
        key_schema_id, value_schema_id = await _encode_schema_records(request, tenant, fmt, topic, body, records,
                                                                      sizes)
        if known is None:
            try:
                known = await partitions_or_create(settings, producer, topic, catalog(request, tenant), tenant)
            except UnknownTopicError:
                raise GatewayError(missing_topic(settings, topic, tenant), status=404, error_code=40401) from None
            _check_partitions(topic, known, records, path_partition)
    results = await producer.send_many(topic, records)
    return _answer_results(request, tenant, results, sizes, key_schema_id, value_schema_id)


def _answer_results(request: Request, tenant: Tenant, results: list[Any], sizes: list[int],
                    key_schema_id: int | None = None, value_schema_id: int | None = None) -> tuple[bytes, int]:
    """The answer to produced records (body, status), counted in the produce metrics."""
    content, status, failed, oks = render(results, key_schema_id, value_schema_id)
    _count_produced(request, tenant, len(results) - failed,
                    sum(sizes) if oks is None else sum(s for s, ok in zip(sizes, oks, strict=True) if ok), failed)
    return content, status


def _count_produced(request: Request, tenant: Tenant, acked: int, nbytes: int, failed: int = 0) -> None:
    """The produce metrics for one request: records and bytes acknowledged, records failed."""
    metrics = request.app.state.metrics
    if acked:
        metrics.produced_records.add(tenant.id, acked)
        metrics.produced_bytes.add(tenant.id, nbytes)
    if failed:
        metrics.produce_failures.add(tenant.id, failed)


def produce_now(request: Request, tenant: Tenant, topic: str, path_partition: int | None,
                answer: Callable[[bytes, int], None], failed: Callable[[Exception], None],
                content_type: str | None = None) -> bool:
    """:func:`produce_answer` without awaiting, for the protocol-level path (no task or future per
    request): a binary or json body (the request's body already read) whose topic's partitions are in fresh
    metadata, with room in the producer's buffer, is checked and queued at once, and True is returned; its
    answer then comes through ``answer(body, status)`` (or ``failed(exc)`` for a bug) once the records are
    acknowledged. False when something must be awaited first (a schema'd format, metadata to fetch, a topic
    to create, a full buffer): then produce_answer must answer it. Errors raise as produce_answer's do, in
    the same order. ``content_type``: the request's (first) Content-Type when the caller already read it."""
    fmt = embedded_format(request) if content_type is None else media_format(content_type)
    if fmt not in ("binary", "json"):
        return False
    tenant.require_topic(topic)
    producer = producer_for(request, tenant)
    num = producer.cached_partition_count(topic)
    if num is None:
        return False  # (before the body is parsed: produce_answer parses it)
    body, records, sizes = parse_body_records(request._body, fmt, path_partition,
                                              request.app.state.settings.produce_max_records)
    require_legal_topic_name(topic)
    if body is not None or path_partition is not None:  # (a plain binary body names no partitions)
        _check_partitions(topic, set(producer.client.metadata.partitions(topic)), () if body is None else records,
                          path_partition)

    def done(delivery: Delivery) -> None:
        try:
            content = None
            if not delivery.failed and encoding.native is not None:  # every record written: from the runs
                offsets = delivery.offsets or []
                offsets.sort()
                content = encoding.native.render_offset_runs(offsets, len(delivery.results))
            if content is not None:
                status = 200
                _count_produced(request, tenant, len(delivery.results), sum(sizes))
            else:
                content, status = _answer_results(request, tenant, delivery.metadata(), sizes)
        except Exception as exc:  # a bug: answered 500 by the caller, never raised into the producer
            failed(exc)
            return
        answer(content, status)

    return producer.submit(topic, records, done, num)


@router.post("/topics/{topic}", response_model=ProduceResponse, responses=PRODUCE_ERRORS,
             openapi_extra=_openapi(),
             summary="Produce records to a topic (partition by key, or per record)")
async def produce_to_topic(request: Request, topic: str, tenant: Tenant = Depends(current_tenant)) -> Response:
    return await produce(request, tenant, topic, None)


@router.post("/topics/{topic}/partitions/{partition}", response_model=ProduceResponse, responses=PRODUCE_ERRORS,
             openapi_extra=_openapi(), summary="Produce records to one partition of a topic")
async def produce_to_partition(request: Request, topic: str, partition: int,
                               tenant: Tenant = Depends(current_tenant)) -> Response:
    if partition < 0:
        raise GatewayError(f"partition {partition} of topic {topic!r} not found", status=404, error_code=40402)
    return await produce(request, tenant, topic, partition)
