"""Every HTTP error is a JSON body ``{"error_code": <5 digits>, "message": "..."}`` with a stable code.

:data:`ERROR_CODES` is the one table of codes (HTTP status, code, meaning); the OpenAPI contract, the
routes' documented responses and the README are derived from it. Codes follow the Confluent REST Proxy
v2 where it defines one.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.kafka_texts import client_text
from api.responses import OrjsonResponse
from service.client.errors import (
    AuthenticationError,
    BrokerResponseError,
    KafkaConnectionError,
    KafkaError,
    NoBrokersAvailableError,
)
from service.consumer.subscription import InvalidPatternError, NoOffsetForPartitionError, SubscriptionError
from service.errors import GatewayError
from service.group.coordinator import CommitFailedError
from service.group.coordinator_consumer import ConsumerProtocolUnsupportedError
from service.instances.budget import BudgetExhausted
from service.protocol import error_codes as EC
from service.protocol.records import InflatedSizeError
from service.schemas.formats import RegistryNotConfigured
from service.schemas.registry import RegistryRequestError, RegistryUnavailable, SchemaNotFound, SchemaTooLarge

log = logging.getLogger(__name__)

#: (HTTP status, error code, meaning): the table of every error code the gateway answers.
ERROR_CODES: tuple[tuple[int, int, str], ...] = (
    (400, 40001, 'malformed JSON body'),
    (400, 40002, 'v3: Kafka refused the request (topic already exists; invalid topic name, partitions count, '
                 'replication factor, replicas assignment or config)'),
    (400, 40003, 'the Host / forwarded headers do not make a valid http(s) base URL (set GATEWAY_PUBLIC_URL)'),
    (400, 40004, 'stream resume token (Last-Event-ID / ?resume=) not valid for this consumer instance: altered, '
                 'garbage, issued for another instance, group or tenant, or signed with another key'),
    (401, 40101, 'missing or invalid credentials'),
    (403, 40301, "topic or group outside the tenant's allowed patterns, or an internal topic (the operator's "
                 "deny-list: __*, _schemas, _confluent*, GATEWAY_DENIED_TOPICS)"),
    (403, 40302, 'replica-to-replica request (/internal, forwarded) without the right peer token'),
    (403, 40303, "v3 topic create or delete (or produce's auto-creation) of a topic outside the tenant's "
                 "admin_topics patterns (a tenant of a tenants file has none unless given)"),
    (403, 40304, "produce (avro, protobuf, jsonschema): a schema subject that is not the tenant's (its subjects "
                 "patterns, or <topic>-<suffix> of its topics), or a schema id registered under none of its subjects"),
    (404, 404, 'v3: no such cluster, topic, partition, replica, broker or config (Confluent v3 answers the '
               'bare HTTP status as the code)'),
    (404, 40400, 'no such endpoint'),
    (404, 40401, 'topic not found'),
    (404, 40402, 'partition not found'),
    (404, 40403, 'consumer instance not found'),
    (404, 40410, 'share consumer instance not found'),
    (405, 40501, 'method not allowed'),
    (406, 40601, "the Accept header does not match the instance's format"),
    (408, 40801, 'the request head (request line and headers) was not complete within '
                 'GATEWAY_HTTP_HEADER_TIMEOUT_S'),
    (409, 40901, 'consumer already subscribed (subscription vs. assignment conflict)'),
    (409, 40902, 'consumer instance with this name already exists in the group'),
    (409, 40903, 'illegal state (not subscribed, partition not assigned, rebalance in progress, no offset)'),
    (409, 40910, 'share consumer instance with this name already exists in the share group'),
    (409, 40911, 'share group has members: its start offsets cannot be reset or deleted until every member left'),
    (409, 40913, "group.protocol 'consumer' on a Kafka cluster without the consumer group protocol (KIP-848; "
                 "e.g. Tansu): use 'classic'"),
    (409, 40912, "the tenant's Kafka cluster has no share groups (its brokers' ApiVersions lack "
                 "ShareGroupHeartbeat / ShareFetch: e.g. Tansu, Kafka before 4.x, or share groups disabled)"),
    (410, 41001, 'consumer instance expired after its idle timeout'),
    (410, 41010, 'share consumer instance expired after its idle timeout'),
    (413, 41301, 'request body too large'),
    (413, 41302, 'produce: a key/value schema (posted, or named by id) over GATEWAY_SCHEMA_MAX_BYTES'),
    (413, 41303, 'produce: more records in one request than GATEWAY_PRODUCE_MAX_RECORDS (nothing written)'),
    (415, 41501, 'unsupported request content type'),
    (421, 42101, 'the Host header is not one of GATEWAY_ALLOWED_HOSTS (DNS rebinding guard)'),
    (422, 42201, 'produce (avro, protobuf, jsonschema): the request includes keys but no key_schema or '
                 'key_schema_id'),
    (422, 42202, 'produce (avro, protobuf, jsonschema): the request includes values but no value_schema or '
                 'value_schema_id'),
    (422, 42203, 'produce (avro, protobuf, jsonschema): a record\'s key or value does not match its schema; the '
                 'message names each bad record and path (records[2].value.$.age); nothing was produced'),
    (422, 42204, 'unknown or invalid consumer configuration key'),
    (422, 42205, 'produce (avro, protobuf, jsonschema): invalid schema (does not parse, the registry refused it '
                 'as invalid, a schema id of another type than the content type, a record-name subject '
                 'strategy and a schema without a record name, or a JSON Schema with a pattern RE2 cannot run, '
                 'a $ref that does not resolve or subschemas nested past GATEWAY_SCHEMA_MAX_DEPTH: the message '
                 'names the schema path, e.g. #/properties/name/pattern)'),
    (422, 42206, 'invalid request field'),
    (422, 42207, 'invalid offset, partition or timestamp value'),
    (422, 42208, 'v3 produce: empty body, or a record whose key/value needs a schema registry (AVRO, PROTOBUF, '
                 'JSONSCHEMA or no type; the gateway has none)'),
    (422, 42209, 'a record batch decompresses past GATEWAY_MAX_BATCH_INFLATED_BYTES (a decompression bomb); the '
                 'message names topic, partition and offset (also in X-Error-Topic/-Partition/-Offset)'),
    (422, 42210, 'schema not found in the schema registry (a key_schema_id / value_schema_id, or no schema under '
                 'the subject)'),
    (422, 42211, 'a schema format (avro, protobuf, jsonschema) was asked for and no schema registry is configured: '
                 'set GATEWAY_SCHEMA_REGISTRY_URL or the tenant\'s schema_registry'),
    (422, 42212, 'the schema registry refused the request (e.g. an incompatible or invalid schema); its error code '
                 'and message are in the message'),
    (422, 42213, 'v3 topic create: partitions_count (or replicas_assignments) above '
                 'GATEWAY_MAX_PARTITIONS_PER_TOPIC (also with validate_only)'),
    (422, 42214, "v3 topic create: a topic config outside GATEWAY_TOPIC_CONFIGS_ALLOWED (or the tenant's "
                 "admin_topic_configs); the message names it"),
    (429, 42901, 'rate limited / quota exceeded (Retry-After header)'),
    (431, 43101, 'request header section too large or too many header fields (GATEWAY_HTTP_MAX_HEADER_BYTES, '
                 'GATEWAY_HTTP_MAX_HEADERS)'),
    (500, 50001, 'internal error (details logged, never returned)'),
    (500, 50002, 'Kafka error'),
    (503, 50003, 'retriable Kafka error (Retry-After header)'),
    (503, 50301, 'the gateway is shutting down: no new instance (Retry-After); last line of a stream'),
    (503, 50302, 'no Kafka broker reachable'),
    (503, 50303, 'the gateway replica holding the consumer instance failed or timed out during the request '
                 '(Retry-After; if it keeps failing the instance is gone: create it again)'),
    (503, 50304, 'too many open HTTP connections to this replica (GATEWAY_HTTP_MAX_CONNECTIONS): retry later'),
    (503, 50305, "the gateway's memory budget (GATEWAY_MEMORY_BUDGET_BYTES) is spent: the request waited "
                 "GATEWAY_MEMORY_WAIT_S for room (Retry-After)"),
    (503, 50306, "the gateway replica keeping the tenant's consumer-instance count across the replicas (the ring "
                 "owner of the tenant) did not answer: nothing was created (Retry-After)"),
    (503, 50307, 'the schema registry (GATEWAY_SCHEMA_REGISTRY_URL) is unreachable, timed out or answered 5xx '
                 '(Retry-After)'),
)
ERROR_MEDIA_TYPE = "application/vnd.kafka.v2+json"
#: Confluent's v3 API answers (errors included) as plain JSON
V3_ERROR_MEDIA_TYPE = "application/json"


def codes_for(status: int) -> list[int]:
    return [c for s, c, _ in ERROR_CODES if s == status]


def documented_errors(model: Any, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for these statuses (all of the table's when none are given)."""
    wanted = statuses or tuple(sorted({s for s, _, _ in ERROR_CODES}))
    return {s: {"model": model, "description": "; ".join(f"{c} {m}" for st, c, m in ERROR_CODES if st == s)}
            for s in wanted}


def error_response(status: int, code: int, message: str, headers: dict[str, str] | None = None,
                   media_type: str = ERROR_MEDIA_TYPE) -> OrjsonResponse:
    """The error JSON. A 429 always carries ``Retry-After`` (1 s unless the caller gave one), so that a client
    backing off never has to guess."""
    if status == 429 and not any(k.lower() == "retry-after" for k in headers or ()):
        headers = {**(headers or {}), "Retry-After": "1"}
    resp = OrjsonResponse({"error_code": code, "message": message}, status_code=status, headers=headers)
    resp.headers["content-type"] = media_type
    return resp


def for_request(request: Request, resp: Response) -> Response:
    """An error answer in the media type of the API version asked: ``application/json`` under ``/v3``
    (as Confluent's v3), Confluent's v2 type elsewhere."""
    if request.url.path.startswith("/v3/") and resp.headers.get("content-type") == ERROR_MEDIA_TYPE:
        resp.headers["content-type"] = V3_ERROR_MEDIA_TYPE
    return resp


def kafka_error_response(exc: KafkaError) -> OrjsonResponse:
    # the error's name and code, never the broker's text or addresses (logged: api/kafka_texts.py)
    text = client_text(exc)
    if isinstance(exc, CommitFailedError):
        return error_response(409, 40903, text)
    if isinstance(exc, ConsumerProtocolUnsupportedError):
        return error_response(409, 40913, "group.protocol 'consumer' (KIP-848) is not available on this Kafka "
                              "cluster: delete the instance and create it with group.protocol 'classic'")
    if isinstance(exc, BrokerResponseError):
        if exc.code == EC.UNKNOWN_TOPIC_OR_PARTITION:
            return error_response(404, 40401, f"topic or partition not found: {text}")
        if exc.code in (EC.TOPIC_AUTHORIZATION_FAILED, EC.GROUP_AUTHORIZATION_FAILED):
            return error_response(403, 40301, f"Kafka denied access: {text}")
        if exc.code == EC.REBALANCE_IN_PROGRESS:
            return error_response(409, 40903, f"the group is rebalancing: {text}")
    if isinstance(exc, NoBrokersAvailableError | AuthenticationError):
        retry = "1" if isinstance(exc, NoBrokersAvailableError) else "5"
        return error_response(503, 50302, text, {"Retry-After": retry})
    if isinstance(exc, KafkaConnectionError) or exc.retriable:
        return error_response(503, 50003, f"retriable Kafka error: {text}", {"Retry-After": "1"})
    return error_response(500, 50002, text)


def _validation_message(errors: list[Any]) -> tuple[int, str]:
    parts = []
    code = 42206
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body",))
        typ = e.get("type", "")
        if typ == "json_invalid":
            return 40001, f"malformed JSON: {e.get('msg', '')}"
        if typ == "extra_forbidden":
            code = 42204 if code == 42206 else code
            parts.append(f"unknown field {loc!r}")
        else:
            if code == 42206 and loc.rsplit(".", 1)[-1] in ("offset", "partition", "timestamp"):
                code = 42207
            parts.append(f"{loc or 'body'}: {e.get('msg', 'invalid')}")
    return code, "; ".join(parts) or "invalid request"


def _all_routes(routes: Any) -> list[Any]:
    """Routes, descending into included routers (FastAPI may wrap them)."""
    out: list[Any] = []
    for r in routes:
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and hasattr(inner, "routes") and inner is not r:
            out += _all_routes(inner.routes)
        else:
            out.append(r)
    return out


# Exceptions answered with a fixed status and error code and the exception's text as the message.
_PLAIN_ERRORS: dict[type[Exception], tuple[int, int]] = {
    NoOffsetForPartitionError: (409, 40903),
    SchemaNotFound: (422, 42210),
    SchemaTooLarge: (413, 41302),
    RegistryRequestError: (422, 42212),
    RegistryNotConfigured: (422, 42211),
    InvalidPatternError: (422, 42206),
    SubscriptionError: (409, 40903),  # Java's IllegalStateException, which Confluent's v2 consumer answers 40903
}


def _plain_handler(status: int, code: int) -> Any:
    async def handle(request: Request, exc: Exception) -> OrjsonResponse:
        return error_response(status, code, str(exc))

    return handle


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway(request: Request, exc: GatewayError) -> OrjsonResponse:
        return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)

    @app.exception_handler(KafkaError)
    async def _kafka(request: Request, exc: KafkaError) -> OrjsonResponse:
        return kafka_error_response(exc)

    @app.exception_handler(BudgetExhausted)
    async def _budget(request: Request, exc: BudgetExhausted) -> OrjsonResponse:
        return error_response(503, 50305, str(exc), {"Retry-After": str(exc.retry_after)})

    for exc_class, (status, code) in _PLAIN_ERRORS.items():
        app.add_exception_handler(exc_class, _plain_handler(status, code))

    @app.exception_handler(InflatedSizeError)
    async def _inflated(request: Request, exc: InflatedSizeError) -> OrjsonResponse:
        skip = f"; seek to offset {exc.next_offset} to skip it" if exc.next_offset is not None else ""
        headers = {"X-Error-Partition": str(exc.partition), "X-Error-Offset": str(exc.offset)}
        if exc.topic and exc.topic.isascii() and exc.topic.isprintable():
            headers["X-Error-Topic"] = exc.topic
        return error_response(422, 42209, f"{exc}{skip}", headers)

    @app.exception_handler(RegistryUnavailable)
    async def _registry_down(request: Request, exc: RegistryUnavailable) -> OrjsonResponse:
        return error_response(503, 50307, str(exc), {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> OrjsonResponse:
        code, msg = _validation_message(list(exc.errors()))
        return error_response(400 if code == 40001 else 422, code, msg)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> OrjsonResponse:
        if exc.status_code == 404:
            return error_response(404, 40400, f"no such endpoint: {request.method} {request.url.path}")
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:
            # Every route with this path (Starlette names only the first partial match's methods).
            allowed: set[str] = set()
            for route in _all_routes(request.app.router.routes):
                regex = getattr(route, "path_regex", None)
                if regex is not None and regex.match(request.url.path) and getattr(route, "methods", None):
                    allowed |= set(route.methods)
            if allowed:
                headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
            return error_response(405, 40501, f"method {request.method} not allowed on {request.url.path}", headers)
        return error_response(exc.status_code, exc.status_code * 100 + 1, str(exc.detail), headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> OrjsonResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, 50001, "internal error; the gateway logged the details")

    for exc_class, handler in list(app.exception_handlers.items()):
        app.exception_handlers[exc_class] = v3_aware(handler)


def v3_aware(handler: Any) -> Any:
    """``handler`` with its error answers in the media type of the API version asked (:func:`for_request`)."""

    async def handle(request: Request, exc: Exception) -> Response:
        return for_request(request, await handler(request, exc))

    return handle
