"""The OpenAPI contract: FastAPI's generated schema, enriched with what it cannot infer.

FastAPI derives paths, parameters and the request/response models from the routes. This module adds
what the routes do by hand and FastAPI cannot see: the media types actually sent and accepted
(``application/vnd.kafka.v2+json`` beside ``application/json`` for bodies, the record formats and the
streaming types on ``/records``), the error body and its codes for every error status (from
:data:`api.errors.ERROR_CODES`, the one table of codes), the ``Retry-After`` and
``WWW-Authenticate`` headers, the security schemes (``Authorization: Bearer <API key or JWT>`` and
``X-API-Key``, see :mod:`service.tenants`), stable operation ids, links from a created instance to its
operations, the ``servers`` generated clients target, and the Confluent-compatible semantics in the
descriptions.

The published contract is **OpenAPI 3.0.3** (:func:`to_openapi_30` converts FastAPI's 3.1 output): client
generators handle 3.0's ``nullable: true`` everywhere, while 3.1's ``anyOf: [..., {type: 'null'}]`` and type
lists break several of them (openapi-generator's ``python`` generator, ``typescript-*`` ``Null`` models,
openapi-python-client's "invalid property in union"). Either/or rules between fields are stated in the
descriptions rather than as ``oneOf``/``anyOf`` combinators, for the same reason; the records, produce and
error schemas are flat objects.

:func:`install_openapi` makes ``app.openapi()`` (and ``/openapi.json``) return the enriched schema;
``openapi.yaml`` at the repository root is that schema (:func:`api.contract.app_schema`), written by
``tools/export_openapi.py`` and kept in step by ``tests/integration/test_openapi.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import fastapi.routing
import orjson
from fastapi import FastAPI
from fastapi.routing import APIRoute

from api.errors import ERROR_CODES, codes_for
from api.v2.produce import PRODUCE_SCHEMAS

V2 = "application/vnd.kafka.v2+json"
JSON = "application/json"
BINARY = "application/vnd.kafka.binary.v2+json"
JSONFMT = "application/vnd.kafka.json.v2+json"
AVRO = "application/vnd.kafka.avro.v2+json"
PROTOBUF = "application/vnd.kafka.protobuf.v2+json"
JSONSCHEMA = "application/vnd.kafka.jsonschema.v2+json"
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
PROMETHEUS = "text/plain"


#: Where generated clients send requests by default: a gateway from ``make run``, or any gateway by its
#: scheme and host (clients pass their own base URL either way).
SERVERS = [
    {"url": "http://127.0.0.1:8080", "description": "A local gateway as `make run` starts it (GATEWAY_PORT 8080)"},
    {"url": "{scheme}://{host}", "description": "Any gateway (its GATEWAY_PUBLIC_URL, without a trailing slash)",
     "variables": {"scheme": {"enum": ["http", "https"], "default": "http"},
                   "host": {"default": "127.0.0.1:8080", "description": "host[:port][/path prefix]"}}},
]
TAGS = {
    "consumers": "Confluent REST Proxy v2 consumer API, with extensions",
    "topics": "Confluent REST Proxy v2 topic metadata and partition offsets",
    "produce": "Confluent REST Proxy v2 produce API (binary and json formats)",
    "v3": "Confluent REST Proxy v3 subset: clusters, topics, partitions, topic configs, consumer groups and "
          "their lag, produce",
    "ops": "Health, readiness and Prometheus metrics (no credentials)",
    "share-groups": "Share consumer instances (Kafka share groups, KIP-932): records acquired one by one, "
                    "acknowledged per record (docs/share-groups.md)",
}
LICENSE = {"name": "Apache-2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"}

_REASONS = {400: "Bad request", 401: "Unauthenticated", 403: "Forbidden", 404: "Not found",
            405: "Method not allowed", 406: "Not acceptable", 408: "Request head not received in time", 409: "Conflict",
            410: "Gone",
            413: "Request body too large", 415: "Unsupported media type", 421: "Host not allowed",
            422: "Invalid request", 431: "Request header fields too large",
            429: "Too many requests", 500: "Server or Kafka error", 503: "Kafka unavailable"}

#: Stable operation ids by route function name (anything else keeps the function name).
OPERATION_IDS = {
    # share groups (api/share/)
    "create_share_consumer": "createShareConsumer", "delete_share_consumer": "deleteShareConsumer",
    "share_subscribe": "shareSubscribe", "share_subscription": "getShareSubscription",
    "share_records": "getShareRecords", "share_acknowledge": "acknowledgeShareRecords",
    "share_ack_outcomes": "getShareAcknowledgementOutcomes", "list_share_groups_v3": "listShareGroups",
    "get_share_group": "getShareGroup", "get_share_group_offsets": "getShareGroupOffsets",
    "reset_share_group_offsets": "resetShareGroupOffsets", "delete_share_group_offsets_v3": "deleteShareGroupOffsets",
    "healthz": "healthz", "readyz": "readyz", "prom_metrics": "metrics",
    "create_consumer": "createConsumer", "delete_consumer": "deleteConsumer",
    "subscribe": "subscribe", "get_subscription": "getSubscription", "unsubscribe": "unsubscribe",
    "assign": "assignPartitions", "get_assignments": "getAssignments",
    "seek": "seek", "seek_beginning": "seekToBeginning", "seek_end": "seekToEnd",
    "commit": "commitOffsets", "committed": "getCommittedOffsets", "records": "getRecords",
    "list_topics": "listTopics", "get_topic": "getTopic", "list_partitions": "listPartitions",
    "get_partition": "getPartition", "get_partition_offsets": "getPartitionOffsets",
    "produce_to_topic": "produceToTopic", "produce_to_partition": "produceToPartition",
    "read_partition_records": "readPartitionRecords",
    # v3 (api/v3/clusters.py): Confluent's v3 operation ids without their "V3" (ids here are letters only)
    "v3_list_clusters": "listKafkaClusters", "v3_get_cluster": "getKafkaCluster",
    "v3_list_brokers": "listKafkaBrokers", "v3_get_broker": "getKafkaBroker",
    "v3_replicas_by_broker": "searchKafkaReplicasByBroker",
    "v3_list_topics": "listKafkaTopics", "v3_create_topic": "createKafkaTopic", "v3_get_topic": "getKafkaTopic",
    "v3_delete_topic": "deleteKafkaTopic", "v3_list_partitions": "listKafkaPartitions",
    "v3_get_partition": "getKafkaPartition", "v3_list_replicas": "listKafkaReplicas",
    "v3_get_replica": "getKafkaReplica", "v3_list_topic_configs": "listKafkaTopicConfigs",
    "v3_get_topic_config": "getKafkaTopicConfig",
    # v3 (api/v3/groups.py)
    "v3_list_consumer_groups": "listKafkaConsumerGroups", "v3_get_consumer_group": "getKafkaConsumerGroup",
    "v3_list_consumers": "listKafkaConsumers", "v3_get_consumer": "getKafkaConsumer",
    "v3_list_consumer_assignments": "listKafkaConsumerAssignment",
    "v3_get_consumer_assignment": "getKafkaConsumerAssignment",
    "v3_list_consumer_lags": "listKafkaConsumerLags", "v3_get_consumer_lag": "getKafkaConsumerLag",
    "v3_get_consumer_group_lag_summary": "getKafkaConsumerGroupLagSummary",
    "v3_produce_record": "produceRecord",  # api/v3/produce.py
}

_INSTANCE_OPS = ("deleteConsumer", "subscribe", "getSubscription", "unsubscribe", "assignPartitions",
                 "getAssignments", "seek", "seekToBeginning", "seekToEnd", "commitOffsets",
                 "getCommittedOffsets", "getRecords")

DESCRIPTION = """\
An HTTP gateway that lets clients in any language consume Kafka as members of consumer groups. It is
wire-compatible with the **Confluent REST Proxy v2 consumer API** and adds extensions: true long-poll,
streaming (NDJSON and server-sent events), record timestamps and headers, seeking to timestamps. It also
serves the v2 **topic** endpoints (`GET /topics`, a topic, its partitions, a partition's beginning, end
and last stable offsets) and **produce** (`POST /topics/{topic}`, `POST /topics/{topic}/partitions/{p}` in
the binary and json embedded formats, with headers and timestamps as extensions; answered after the
broker acknowledged, through one idempotent producer per tenant).

## Flow
1. `POST /consumers/{group}` creates a consumer instance and returns its `instance_id` and `base_uri`.
2. `POST {base_uri}/subscription` (topics or a pattern) or `POST {base_uri}/assignments` (partitions).
3. `GET {base_uri}/records` long-polls for records; the first poll after subscribing waits for the
   group assignment.
4. `POST {base_uri}/offsets` commits (or rely on `auto.commit.enable`), `DELETE {base_uri}` leaves the group.

Idle instances expire (410, error code 41001) after the gateway's idle timeout; every request renews one.

## Media types
Request bodies are JSON sent as `application/vnd.kafka.v2+json` (the media type listed for them here),
`application/json` or any other `application/vnd.kafka.*+json`; anything else is 415 (41501). Responses with a body are
`application/vnd.kafka.v2+json`, except `GET /records`, whose type follows the `Accept` header and the
instance's format: `application/vnd.kafka.binary.v2+json` (keys, values and header values in base64) or
`application/vnd.kafka.json.v2+json` (embedded JSON) as one JSON array, or — extensions — a stream of
records as `application/x-ndjson` (one JSON record per line) or `text/event-stream` (one `data:` event
per record, `: keep-alive` comments while idle, an `event: error` with an error body if the stream fails).
`Accept: */*`, `application/json` (what generated clients send), `application/vnd.kafka.v2+json` or none
mean the instance's format; another format is 406 (40601). One `ConsumerRecord` schema covers both formats.

## Confluent-compatible semantics
- `POST /offsets` commits **offset + 1** for every listed record offset (the offset of the last record
  consumed is given, the position after it is stored), as the Confluent REST Proxy does; `GET /offsets`
  returns what is stored (so the value sent + 1) and leaves out partitions with nothing committed, as
  Confluent does. An empty body commits everything consumed so far.
- `GET /offsets` takes its partitions in a **request body on a GET**, as the Confluent REST Proxy does; as
  extensions for clients that cannot send one (fetch, generated clients), also as `topic` and `partition`
  query parameters (every topic with every partition), or with neither: the partitions assigned to the
  instance.
- The instance id is the `name` the client chose (or the legacy `id`), so clients can build URLs from it;
  a name already used in the group is 409 (40902). Without a name an id is generated.
- Paths match with or without a trailing slash (no redirect).
- `auto.offset.reset` accepts `smallest`/`largest` as aliases of `earliest`/`latest`; `format` is
  case-insensitive; configuration values may be strings (`"true"`, `"1000"`) as Confluent clients send them.
- Kafka consumer properties in the create body (as clients of other proxies send them) are honoured when
  they apply per instance (`session.timeout.ms`, `heartbeat.interval.ms`, `max.poll.interval.ms`,
  `fetch.max.wait.ms`, `fetch.max.bytes`, `max.partition.fetch.bytes`, `auto.commit.interval.ms`,
  `max.poll.records`, `consumer.request.max.bytes`, `partition.assignment.strategy`, `client.id`,
  `client.rack`, `metadata.max.age.ms`, `group.protocol` (`classic` | `consumer`, KIP-848:
  docs/consumer-protocol.md; default `GATEWAY_GROUP_PROTOCOL`), `group.remote.assignor`, ...), accepted and
  ignored when they only shape a client process (deserializers, socket buffers, librdkafka queue sizes, ...),
  and refused (422, 42204) when only the operator may set them (brokers, security, group id) or when they are
  not Kafka consumer properties.

## Authentication
With a tenants file (`GATEWAY_TENANTS_FILE`) every `/consumers` and `/topics` request needs `Authorization: Bearer
<API key or JWT>` or `X-API-Key: <API key>`; failures are 401 (40101) with `WWW-Authenticate: Bearer`.
Without one the gateway serves everything as tenant `default` without authentication (development only).
A tenant sees only its own instances (404, 40403) and gets 403 (40301) outside its topic and group
patterns. Quotas answer 429 (42901) with `Retry-After`. `/healthz`, `/readyz` and `/metrics` need no
credentials.

## Errors
Every error is `{"error_code": <5 digits>, "message": "..."}` with one of these codes:

| HTTP | code | meaning |
| ---- | ---- | ------- |
"""


def error_table_markdown() -> str:
    return "".join(f"| {s} | {c} | {m} |\n" for s, c, m in ERROR_CODES)


_ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "title": "ErrorBody",
    "description": "The body of every error response. `error_code` has five digits, mostly the HTTP status "
                   "followed by two (Confluent's 50003, retriable Kafka error, comes with 503); the codes are "
                   "listed in the API description.",
    "required": ["error_code", "message"],
    "properties": {
        "error_code": {"type": "integer", "title": "Error Code", "enum": sorted({c for _, c, _ in ERROR_CODES})},
        "message": {"type": "string", "title": "Message", "description": "Human-readable; never contains a credential"},
    },
}

_B64 = {"type": ["string", "null"], "contentEncoding": "base64"}

_RECORD_HEADER = {
    "type": "object",
    "title": "RecordHeader",
    "required": ["key", "value"],
    "properties": {
        "key": {"type": "string"},
        "value": {**_B64, "description": "The header value in base64 (null for a null value)"},
    },
    "additionalProperties": False,
}

#: One record of ``GET .../records`` in every format: key and value have no fixed type (the format decides).
_RECORD = {
    "type": "object",
    "title": "ConsumerRecord",
    "description": "A consumed record, in the instance's `format` (the response's Content-Type names it). "
                   "A `binary` instance gives `key` and `value` as base64 strings; a `json` instance gives them "
                   "as embedded JSON (any JSON value); `avro`, `protobuf` and `jsonschema` instances give them "
                   "decoded with the writer's schema from the schema registry, as JSON. Either way null is a "
                   "null key or value. A key or value that does not decode in the instance's format (not JSON; "
                   "no Confluent wire-format magic byte, an unknown schema id, a payload that does not fit its "
                   "schema) is null, with `key_error`/`value_error` saying why and its raw bytes in "
                   "`key_base64`/`value_base64` (these four fields appear only then): the record is delivered.",
    "required": ["topic", "partition", "offset", "timestamp", "key", "value", "headers"],
    "properties": {
        "topic": {"type": "string"},
        "partition": {"type": "integer", "minimum": 0},
        "offset": {"type": "integer", "minimum": 0, "format": "int64"},
        "timestamp": {"type": "integer", "format": "int64",
                      "description": "Record timestamp, milliseconds since the epoch (extension)"},
        "key": {"description": "binary: the key in base64; json: the key as embedded JSON (any JSON value); "
                               "null for a null key"},
        "value": {"description": "binary: the value in base64; json: the value as embedded JSON (any JSON "
                                 "value); null for a null value"},
        "key_error": {"type": "string", "description": "not binary instances: why the key did not decode "
                                                       "(json: `not valid JSON`)"},
        "key_base64": {"type": "string", "contentEncoding": "base64",
                       "description": "with key_error: the key's bytes"},
        "value_error": {"type": "string", "description": "not binary instances: why the value did not decode "
                                                         "(json: `not valid JSON`)"},
        "value_base64": {"type": "string", "contentEncoding": "base64",
                         "description": "with value_error: the value's bytes"},
        "headers": {"type": "array", "items": {"$ref": "#/components/schemas/RecordHeader"},
                    "description": "Record headers in order (extension)"},
        "resume": {"type": "string", "description": "ndjson streams only, on the last record of each write: a "
                                                    "resume token (`?resume=` on reconnect; docs/streams.md)"},
    },
    "additionalProperties": False,
}

_HEALTH = {
    "type": "object", "title": "Health", "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["ok"]}},
}

_READY = {
    "type": "object", "title": "Ready", "required": ["status"],
    "description": "`tenants` and `brokers` only for `Authorization: Bearer <GATEWAY_ADMIN_TOKEN>` (or without a "
                   "tenants file and admin token)",
    "properties": {
        "status": {"type": "string", "enum": ["ready"]},
        "tenants": {"type": "array", "items": {"type": "string"}},
        "brokers": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                    "description": "Number of known brokers by tenant"},
    },
}

_NOT_READY = {
    "type": "object", "title": "NotReady", "required": ["status"],
    "description": "`error_code` and `tenants` only for `Authorization: Bearer <GATEWAY_ADMIN_TOKEN>` (or without "
                   "a tenants file and admin token)",
    "properties": {
        "status": {"type": "string", "enum": ["unavailable"]},
        "error_code": {"type": "integer", "enum": [50302]},
        "tenants": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "The problem by tenant id, for the tenants whose brokers are unreachable"},
    },
}

_RESPONSE_HEADERS = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer", "minimum": 0}},
    "WWW-Authenticate": {"description": "The accepted scheme: `Bearer`", "schema": {"type": "string"}},
}

SECURITY_SCHEMES = {
    "BearerAuth": {
        "type": "http", "scheme": "bearer", "bearerFormat": "API key or JWT",
        "description": "`Authorization: Bearer <token>`. A token shaped like a JWT (three base64url parts "
                       "separated by dots) is verified as a JWT from a trusted issuer (HS*, RS*, PS*, ES*; "
                       "`exp`, `iss`, `aud` and the tenant claim required); anything else is an API key.",
    },
    "ApiKeyAuth": {
        "type": "apiKey", "in": "header", "name": "X-API-Key",
        "description": "An API key. Not together with `Authorization: Bearer`.",
    },
}
_SECURITY: list[dict[str, list[str]]] = [{"BearerAuth": []}, {"ApiKeyAuth": []}]

_OPERATION_NOTES = {
    "createConsumer": "The body is optional (all defaults). The instance id is the `name` (or legacy `id`) "
                      "given, as in the Confluent REST Proxy; without one an id is generated. A name already "
                      "used in the group is 409 (40902). `base_uri` honours `GATEWAY_PUBLIC_URL`, `Forwarded` "
                      "and `X-Forwarded-*`. `format` chooses binary (base64) or json (embedded JSON) records. "
                      "Other Kafka consumer properties are honoured, ignored or refused (42204) as the API "
                      "description explains.",
    "subscribe": "Give `topics` or `topic_pattern` (a regular expression; new matching topics are picked up). "
                 "With both, `topics` wins, an empty `topics` list unsubscribes, and with neither nothing "
                 "changes, as in the Confluent REST Proxy. Switching between topics, a pattern and manual assignment "
                 "without unsubscribing "
                 "first is 409 (40903).",
    "assignPartitions": "Manual assignment without group management; exclusive with a subscription "
                        "(409, 40903). Unknown topics are 404 (40401), unknown partitions 404 (40402).",
    "seek": "Seek assigned partitions to `offsets` and/or, as an extension, to the first offset at or after "
            "each `timestamps` entry (milliseconds). Unassigned partitions are 409 (40903).",
    "commitOffsets": "Commits **offset + 1** for each listed record offset, as the Confluent REST Proxy does "
                     "(give the offset of the last record consumed). Without a body, or with no `offsets`, "
                     "commits the position after everything this instance has returned.",
    "getCommittedOffsets": "The partitions are given in a **request body on a GET**, as the Confluent REST "
                           "Proxy does. As extensions, for clients that cannot send a body on a GET (fetch, "
                           "generated clients), also by query parameters: `topic` and `partition` both given "
                           "mean every listed topic with every listed partition "
                           "(`?topic=a&partition=0&partition=1`: a-0 and a-1); only `topic` (or only "
                           "`partition`) means the instance's assigned partitions of those topics (with those "
                           "numbers); neither a body nor a query means the assigned partitions. A body and a "
                           "query together ask for both. `offset` is what is stored (the committed record "
                           "offset + 1); partitions with nothing committed are left out, as Confluent does.",
    "getRecords": "Long-poll: returns as soon as records are buffered, or an empty array when `timeout` "
                  "(milliseconds, default the instance's `consumer.request.timeout.ms`, capped by the "
                  "gateway) passes. With `Accept: application/x-ndjson` or `text/event-stream` the response "
                  "is a stream that runs until the client disconnects or the instance is deleted; the next "
                  "poll waits until the previous chunk was written (backpressure). Streams are resumable "
                  "(docs/streams.md): each SSE event's `id` and the `resume` field of the last ndjson record "
                  "of each write are tokens; reconnecting with `Last-Event-ID` (SSE) or `?resume=` seeks the "
                  "instance to just after that record before streaming (an altered or foreign token is 400 / "
                  "40004; partitions the instance no longer owns are named in `X-Resume-Skipped`).",
}


_OPERATION_KEYS = ("tags", "summary", "description", "operationId", "security", "parameters", "requestBody",
                   "responses")


def _error_response(status: int, media_type: str = V2) -> dict[str, Any]:
    codes = codes_for(status)
    described = "; ".join(f"{c} {m}" for s, c, m in ERROR_CODES if s == status)
    name = f"Error{status}" if codes else "ErrorBody"
    response: dict[str, Any] = {
        "description": f"{_REASONS.get(status, 'Error')}: {described}" if described else _REASONS.get(status, "Error"),
        "content": {media_type: {"schema": {"$ref": f"#/components/schemas/{name}"}}},
    }
    if status in (429, 503):
        response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    elif status == 401:
        response["headers"] = {"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}}
    return response


def _error_schema(status: int) -> dict[str, Any]:
    """``ErrorBody`` narrowed to the codes of one HTTP status: a flat object (no ``allOf``), as generators
    handle best."""
    schema = copy.deepcopy(_ERROR_BODY)
    schema["title"] = f"Error{status}"
    schema["description"] = f"The error body of a {status} answer."
    schema["properties"]["error_code"]["enum"] = codes_for(status)
    return schema


def _json_body_content(content: dict[str, Any], media_type: str = V2) -> dict[str, Any]:
    """A JSON request body is listed as Confluent's media type only: the gateway also takes it as
    ``application/json`` (the API description says so), but a second media type with the same schema
    makes generators emit a union of the model with itself (and breaks openapi-python-client on required
    bodies). A body declared with other media types (produce: the embedded formats) is kept as declared.
    v3 bodies are ``application/json`` only (Confluent's v3; the v2 type is accepted there too)."""
    if JSON not in content:
        return content
    return {media_type: content[JSON]}


def _records_200() -> dict[str, Any]:
    stream = "One `ConsumerRecord` per {unit}, in the instance's format."
    array = {"type": "array", "items": {"$ref": "#/components/schemas/ConsumerRecord"}}
    return {
        "description": "Records as one JSON array in the instance's format, or (Accept: application/x-ndjson "
                       "or text/event-stream) a stream of records. `Accept: application/json` (what generated "
                       "clients send), `*/*` or no Accept means the instance's format: the answer's "
                       "Content-Type is then `application/vnd.kafka.{binary,json,avro,protobuf,jsonschema}.v2+json`.",
        "content": {
            JSON: {"schema": copy.deepcopy(array)},
            BINARY: {"schema": copy.deepcopy(array)},
            JSONFMT: {"schema": copy.deepcopy(array)},
            AVRO: {"schema": copy.deepcopy(array)},
            PROTOBUF: {"schema": copy.deepcopy(array)},
            JSONSCHEMA: {"schema": copy.deepcopy(array)},
            NDJSON: {"schema": {"type": "string", "description": stream.format(unit="line") +
                                " The last record of each write carries `resume`, a resume token."}},
            SSE: {"schema": {"type": "string", "description": stream.format(unit="`data:` event") +
                             " Each event's `id` is a resume token (`Last-Event-ID` on reconnect). "
                             "`: keep-alive` comments while idle; `event: error` carries an error body "
                             "(`error_code`, `message`)."}},
        },
        "headers": {
            "X-Resume-Skipped": {"description": "On a resumed stream: the `topic:partition` list of the token's "
                                                "partitions the instance no longer owns (not sought)",
                                 "schema": {"type": "string"}},
        },
    }


def app_operations(app: FastAPI) -> dict[tuple[str, str], str]:
    """``{(path template, lower-case method): route function name}`` for every documented API route of the
    app, routers included (FastAPI ≥ 0.130 keeps included routers nested; older versions flatten them)."""
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    routes: Iterable[Any] = iter_contexts(app.routes) if iter_contexts is not None else app.routes
    out: dict[tuple[str, str], str] = {}
    for route in routes:
        original = getattr(route, "original_route", route)
        if not isinstance(original, APIRoute) or not original.include_in_schema:
            continue
        for method in route.methods or ():
            out[(route.path, method.lower())] = route.name
    return out


_NUMERIC_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})


def _integral_bounds(node: Any) -> None:
    """FastAPI writes numeric bounds as doubles (``maximum: 2147483647.0``); integral ones become ints."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _NUMERIC_KEYWORDS and isinstance(value, float) and value.is_integer():
                node[key] = int(value)
            else:
                _integral_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _integral_bounds(item)


def enrich(schema: dict[str, Any], app: FastAPI) -> dict[str, Any]:
    """Add to FastAPI's schema what the routes do by hand (in place; returns ``schema``)."""
    _integral_bounds(schema)
    names = app_operations(app)
    error_statuses: set[int] = {401}
    schema["info"]["description"] = DESCRIPTION + error_table_markdown()
    schema["info"]["license"] = copy.deepcopy(LICENSE)
    schema["servers"] = copy.deepcopy(SERVERS)
    used = {t for item in schema["paths"].values() for op in item.values() for t in op.get("tags", ())}
    schema["tags"] = [{"name": t, "description": d} for t, d in TAGS.items()] + [
        {"name": t, "description": t} for t in sorted(used - TAGS.keys())]
    for path, item in schema["paths"].items():
        for method, op in item.items():
            name = names.get((path, method), op.get("operationId", ""))
            op["operationId"] = OPERATION_IDS.get(name, name)
            if op["operationId"] in _OPERATION_NOTES:
                op["description"] = _OPERATION_NOTES[op["operationId"]]
            consumer = path.startswith(("/consumers/", "/topics", "/share-groups/"))
            authenticated = consumer or path.startswith("/v3/")
            op["security"] = copy.deepcopy(_SECURITY) if authenticated else []
            media_type = JSON if path.startswith("/v3/") else V2  # v3 answers and takes plain JSON
            # answered by the server before any route (api/server/http.py), and by the Host check
            # (api/hosts.py; the probes are exempt), on every path
            for extra in (408, 431) if path in ("/healthz", "/readyz") else (408, 421, 431):
                op["responses"].setdefault(str(extra), {"description": ""})
            if "requestBody" in op:
                op["requestBody"]["content"] = _json_body_content(op["requestBody"]["content"], media_type)
            for status, resp in list(op["responses"].items()):
                code = int(status)
                if code >= 400:
                    # 408 and 431 come from the HTTP server before any route, often before the path is read:
                    # answered as v2 JSON on every path (api/server/http.py)
                    op["responses"][status] = _error_response(code, V2 if code in (408, 431) else media_type)
                    error_statuses.add(code)
                elif consumer and "content" in resp and JSON in resp["content"]:
                    # the route's own V2 answer (a commit's `[]`) over FastAPI's default JSON one
                    resp["content"] = {V2: resp["content"].get(V2) or resp["content"][JSON]}
                    resp["description"] = "OK"
            op["responses"] = dict(sorted(op["responses"].items()))
            order = [k for k in _OPERATION_KEYS if k in op] + [k for k in op if k not in _OPERATION_KEYS]
            item[method] = {k: op[k] for k in order}
    base = "/consumers/{group}/instances/{instance_id}"
    records = schema["paths"][base + "/records"]["get"]
    records["responses"]["200"] = _records_200()
    share = schema["paths"]["/share-groups/{group}/instances/{instance_id}/records"]["get"]["responses"]["200"]
    share["description"] = (
        "Records acquired, as one JSON array, or (Accept: application/x-ndjson or text/event-stream) a stream "
        "of them; acknowledge them through POST .../acknowledgements, also while the stream runs "
        "(docs/share-groups.md).")
    share["content"].update({
        NDJSON: {"schema": {"type": "string", "description": "One `ShareRecordModel` per line."}},
        SSE: {"schema": {"type": "string", "description": "One `ShareRecordModel` per `data:` event; `: keep-alive` "
                         "comments while idle; `event: error` / `event: shutdown` carry an error body "
                         "(`error_code`, `message`)."}}})
    ops = schema["paths"]
    ops["/healthz"]["get"]["responses"]["200"] = {
        "description": "The process is alive", "content": {JSON: {"schema": {"$ref": "#/components/schemas/Health"}}}}
    ops["/readyz"]["get"]["responses"] = {
        "200": {"description": "Every tenant's brokers answered a metadata request",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Ready"}}}},
        "503": {"description": "Some tenant's brokers are unreachable (50302)",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/NotReady"}}}},
    }
    ops["/metrics"]["get"]["responses"]["200"] = {
        "description": "Prometheus text exposition format",
        "content": {PROMETHEUS: {"schema": {"type": "string"}}}}
    ops["/metrics"]["get"]["description"] = (
        "Needs `Authorization: Bearer <GATEWAY_ADMIN_TOKEN>` when an admin token is set or the gateway has a "
        "tenants file (metrics name tenants, groups and topics); open otherwise.")
    ops["/metrics"]["get"]["responses"]["401"] = _error_response(401)
    created = ops["/consumers/{group}"]["post"]["responses"]["200"]
    created["links"] = {
        op_id: {"operationId": op_id, "parameters": {"group": "$request.path.group",
                                                      "instance_id": "$response.body#/instance_id"}}
        for op_id in _INSTANCE_OPS
    }
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(copy.deepcopy({
        "ErrorBody": _ERROR_BODY, "RecordHeader": _RECORD_HEADER, "ConsumerRecord": _RECORD,
        "Health": _HEALTH, "Ready": _READY, "NotReady": _NOT_READY, **PRODUCE_SCHEMAS}))
    schemas.update({f"Error{s}": _error_schema(s) for s in sorted(error_statuses) if codes_for(s)})
    for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 bodies, replaced by ours
        schemas.pop(unused, None)
    if '"#/components/schemas/ErrorBody"' not in orjson.dumps(schema["paths"]).decode():
        del schemas["ErrorBody"]  # every status has its own ErrorNNN (the same body, narrowed codes)
    components["schemas"] = dict(sorted(schemas.items()))
    components["headers"] = copy.deepcopy(_RESPONSE_HEADERS)
    components["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)
    order = ["openapi", "info", "servers"]
    ordered = {k: schema[k] for k in order if k in schema} | {k: v for k, v in schema.items() if k not in order}
    schema.clear()
    schema.update(ordered)
    return to_openapi_30(schema)


# -- OpenAPI 3.1 -> 3.0.3 ------------------------------------------------------------------------------------
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not")
_DROPPED_31 = frozenset({"$schema", "$id", "$defs", "$comment", "contentMediaType", "patternProperties",
                         "propertyNames", "unevaluatedProperties", "unevaluatedItems", "dependentRequired",
                         "dependentSchemas", "if", "then", "else", "prefixItems", "contains", "minContains",
                         "maxContains"})


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("const", 0) is None
                                         or schema.get("enum") == [None])


def _schema_30(schema: Any, types: dict[str, str]) -> Any:
    """One JSON Schema 2020-12 (OpenAPI 3.1) schema as an OpenAPI 3.0 schema object: ``nullable: true`` for
    null alternatives and type lists, ``enum`` for ``const``, boolean exclusive bounds, ``format: byte`` for
    base64, one ``example``; a ``$ref`` with sibling keywords is wrapped in ``allOf`` (3.0 ignores them).
    ``nullable`` always has a ``type`` beside it (the referenced schema's for a nullable ``$ref``, given by
    ``types``); alternatives carry it each, and an untyped schema (any value) needs none."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            out[key] = {k: _schema_30(v, types) for k, v in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [_schema_30(v, types) for v in value]
        elif key in _SCHEMA_ONE:
            out[key] = _schema_30(value, types)
        else:
            out[key] = value
    nullable = False
    declared = out.get("type")
    if isinstance(declared, list):
        nullable = "null" in declared
        rest = [t for t in declared if t != "null"]
        if len(rest) == 1:
            out["type"] = rest[0]
        else:
            del out["type"]
            if rest:
                out["anyOf"] = [{"type": t} for t in rest]
    elif declared == "null":
        del out["type"]
        nullable = True
        out["enum"] = [None]
    for combinator in ("anyOf", "oneOf"):
        alternatives = out.get(combinator)
        if not isinstance(alternatives, list) or not any(_is_null(a) for a in alternatives):
            continue
        nullable = True
        rest = [a for a in alternatives if not _is_null(a)]
        if len(rest) == 1:  # X | None: X itself, nullable
            del out[combinator]
            only = rest[0]
            if "$ref" in only:
                out["allOf"] = [only]
            else:
                out = {**only, **out}
        elif rest:
            out[combinator] = rest
        else:
            del out[combinator]
    if "const" in out:
        const = out.pop("const")
        if const is None:
            nullable = True
        out["enum"] = [const]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out.get(bound), bool):
            out[plain] = out[bound]
            out[bound] = True
    if out.get("contentEncoding") == "base64":
        out.setdefault("format", "byte")
    out.pop("contentEncoding", None)
    if "examples" in out:
        examples = out.pop("examples")
        if isinstance(examples, list) and examples:
            out.setdefault("example", examples[0])
    for key in _DROPPED_31 & out.keys():
        del out[key]
    if "$ref" in out and len(out) > 1:
        ref = out.pop("$ref")
        out = {"allOf": [{"$ref": ref}], **out}
    if nullable:
        _make_nullable(out, types)
    return out


def _make_nullable(out: dict[str, Any], types: dict[str, str]) -> None:
    if "type" not in out:
        alternatives = out.get("anyOf") or out.get("oneOf")
        refs = [a["$ref"] for a in out.get("allOf", ()) if "$ref" in a]
        if alternatives:
            for alternative in alternatives:
                if "type" in alternative:
                    _make_nullable(alternative, types)
            return
        if len(refs) == 1 and refs[0] in types:
            out["type"] = types[refs[0]]
        else:
            return  # an untyped schema already admits null
    out["nullable"] = True
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]


def _media_30(content: dict[str, Any], types: dict[str, str], request: bool = False) -> None:
    for media in content.values():
        if "schema" not in media:
            continue
        schema = _schema_30(media["schema"], types)
        if request and schema.get("nullable"):
            schema.pop("title", None)  # FastAPI's "Body": generators would name a model after it
        media["schema"] = schema


def _parameter_30(parameter: dict[str, Any], types: dict[str, str]) -> None:
    if "schema" in parameter:
        parameter["schema"] = _schema_30(parameter["schema"], types)
        if parameter["schema"].get("nullable") and parameter.get("in") != "body":
            del parameter["schema"]["nullable"]  # an optional parameter is absent, never null
            if parameter["schema"].get("enum"):
                parameter["schema"]["enum"] = [v for v in parameter["schema"]["enum"] if v is not None]


def to_openapi_30(doc: dict[str, Any]) -> dict[str, Any]:
    """Convert FastAPI's OpenAPI 3.1 document to OpenAPI 3.0.3 (in place; returns ``doc``)."""
    doc["openapi"] = "3.0.3"
    for key in ("webhooks", "jsonSchemaDialect"):
        doc.pop(key, None)
    doc.get("info", {}).get("license", {}).pop("identifier", None)
    components = doc.get("components", {})
    types = {f"#/components/schemas/{name}": schema["type"] for name, schema in components.get("schemas", {}).items()
             if isinstance(schema.get("type"), str)}
    for name, schema in components.get("schemas", {}).items():
        components["schemas"][name] = _schema_30(schema, types)
    for header in components.get("headers", {}).values():
        if "schema" in header:
            header["schema"] = _schema_30(header["schema"], types)
    for item in doc.get("paths", {}).values():
        for parameter in item.get("parameters", []):
            _parameter_30(parameter, types)
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
                continue
            for parameter in op.get("parameters", []):
                _parameter_30(parameter, types)
            if "requestBody" in op:
                _media_30(op["requestBody"].get("content", {}), types, request=True)
            for response in op.get("responses", {}).values():
                _media_30(response.get("content", {}), types)
                for header in response.get("headers", {}).values():
                    if "schema" in header:
                        header["schema"] = _schema_30(header["schema"], types)
    return doc



def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and ``/openapi.json``) return the enriched schema."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = enrich(copy.deepcopy(generate()), app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

