"""Confluent REST Proxy v2-compatible consumer endpoints, plus our extensions.

Routes stay thin: they authenticate, validate, find the instance and call :mod:`service`. Records are
rendered to bytes once (orjson, base64 via binascii) without a model object per record.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from api.auth import current_tenant
from api.deps import (
    ERRORS,
    INT32_MAX,
    OFFSET_MAX,
    V2,
    base_url,
    gateway,
    runtime,
    v2,
)
from api.v2.consumer_config import (
    MAX_GROUP_INSTANCE_ID_LENGTH,
    ConfigError,
    parse_properties,
    property_schemas,
    tenant_client_id,
    validate_kafka_id,
)
from api.v2.schema_records import schema_service
from service.cluster.topics import require_legal_topic_name
from service.consumer.subscription import (
    SubscriptionError,
    TopicPartition,
)
from service.errors import GatewayError
from service.group.coordinator import OffsetAndMetadata
from service.instances.registry import (
    GROUP_ID_PATTERN,
    ConsumerInstance,
    InstanceOptions,
    validate_group_id,
)
from service.lib.logs import bind
from service.schemas.formats import SCHEMA_FORMATS, RegistryNotConfigured
from service.tenants import Tenant

router = APIRouter(tags=["consumers"])
log = logging.getLogger(__name__)




def _json_number(v: Any) -> Any:
    if isinstance(v, bool | str):  # not pydantic's lax "5", " 5", "+5" or true: the contract says integer
        raise ValueError("must be an integer")
    return v


# JSON numbers with an integral value, in range (constraints before the validator keep them in the schema)
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_json_number)]
Int64 = Annotated[int, Field(ge=0, le=OFFSET_MAX, json_schema_extra={"format": "int64"}), BeforeValidator(_json_number)]

# Confluent clients send numeric and boolean configs as strings: accept exactly what the schema says.
_DIGITS = re.compile(r"[0-9]{1,9}")
_TRUE_FALSE = re.compile(r"[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]")


def _config_int(v: Any) -> Any:
    if v is None or (isinstance(v, str) and _DIGITS.fullmatch(v)):
        return v
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("must be an integer (a JSON number or a string of digits)")
    if not 0 <= v <= INT32_MAX:
        raise ValueError(f"must be between 0 and {INT32_MAX}")
    return v


def _max_poll_records(v: Any) -> Any:
    v = _config_int(v)
    if v is not None and int(v) > 100_000:
        raise ValueError("must be at most 100000")
    return v


def _config_bool(v: Any) -> Any:
    if v is None or isinstance(v, bool) or (isinstance(v, str) and _TRUE_FALSE.fullmatch(v)):
        return v
    raise ValueError("must be true or false")


ConfigInt = Annotated[int | str | None, BeforeValidator(_config_int), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": INT32_MAX}, {"type": "string", "pattern": "^[0-9]{1,9}$"},
    {"type": "null"}]})]
MaxPollRecords = Annotated[int | str | None, BeforeValidator(_max_poll_records), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": 100_000}, {"type": "string", "pattern": "^(100000|[0-9]{1,5})$"},
    {"type": "null"}]})]
ConfigBool = Annotated[str | bool | None, BeforeValidator(_config_bool), WithJsonSchema({"anyOf": [
    {"type": "boolean"}, {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"},
    {"type": "null"}]})]


def _fetch_min_bytes(v: Any) -> Any:
    if v == -1 or v == "-1":  # Confluent's "disabled" sentinel (its default): the same as not set
        return None
    return _config_int(v)


FetchMinBytes = Annotated[int | str | None, BeforeValidator(_fetch_min_bytes), WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": -1, "maximum": INT32_MAX},
              {"type": "string", "pattern": "^(-1|[0-9]{1,9})$"}, {"type": "null"}]})]


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError("must be true or false")


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


def _document_properties(schema: dict[str, Any]) -> None:
    """The create body's schema lists every Kafka property the gateway honours or ignores; anything
    else is refused (42204)."""
    schema["properties"].update(property_schemas())
    schema["additionalProperties"] = False


class CreateConsumer(BaseModel):
    """Confluent's create body; any other Kafka consumer property is sorted by :mod:`api.v2.consumer_config`
    (honoured, ignored, or refused with 42204)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, json_schema_extra=_document_properties)

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,200}$",
                           description="legacy name of the instance (overrides name, as in Confluent)")
    format: Annotated[Literal["binary", "json", "avro", "protobuf", "jsonschema"], BeforeValidator(_lower)] = Field(
        "binary", description="binary: base64 keys and values; json: embedded JSON; avro, protobuf, jsonschema: "
        "Confluent wire format decoded with the writer's schema from the schema registry (docs/schemas.md)")
    avro_json_rendering: Literal["confluent", "karapace"] | None = Field(
        None, alias="avro.json.rendering", description="format avro: unions tagged by branch and bytes as one "
        "character per byte (confluent, as Confluent's REST Proxy), or untagged unions and base64 bytes (karapace); "
        "default: GATEWAY_AVRO_JSON_RENDERING")
    auto_offset_reset: Literal["earliest", "latest", "none", "smallest", "largest"] | None = Field(
        None, alias="auto.offset.reset")
    auto_commit_enable: ConfigBool = Field(None, alias="auto.commit.enable")
    enable_auto_commit: ConfigBool = Field(None, alias="enable.auto.commit")
    fetch_min_bytes: FetchMinBytes = Field(
        None, alias="fetch.min.bytes",
        description="return a records request once more than this many key and value bytes are there "
                    "(Confluent's v2 rule); -1 (Confluent's sentinel) or absent: as soon as records are there")
    consumer_request_timeout_ms: ConfigInt = Field(None, alias="consumer.request.timeout.ms")
    consumer_request_max_bytes: ConfigInt = Field(
        None, alias="consumer.request.max.bytes", description="default max_bytes of a records request (0: none)")
    max_poll_records: MaxPollRecords = Field(
        None, alias="max.poll.records", description="default max_records of a records request (0: 500)")
    isolation_level: Literal["read_uncommitted", "read_committed"] | None = Field(None, alias="isolation.level")
    group_instance_id: str | None = Field(
        None, alias="group.instance.id", json_schema_extra={"pattern": r"^(?!\.\.?$)[A-Za-z0-9._-]{1,249}$"},
        description="static membership id: 1-249 of A-Za-z0-9._- (not '.' or '..')")
    session_timeout_ms: ConfigInt = Field(None, alias="session.timeout.ms")

    @field_validator("auto_commit_enable", "enable_auto_commit")
    @classmethod
    def _b(cls, v: Any) -> Any:
        return None if v is None else _bool(v)

    @field_validator("fetch_min_bytes", "consumer_request_timeout_ms", "session_timeout_ms",
                     "consumer_request_max_bytes", "max_poll_records")
    @classmethod
    def _i(cls, v: Any) -> Any:
        if v is None:
            return None
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise ValueError("must be an integer") from None
        if iv < 0:
            raise ValueError("must be >= 0")
        return iv


# The group of a new instance: stated for the contract, checked by validate_group_id (clear 42206 messages).
GroupId = Annotated[str, Path(description="Consumer group id: up to 249 characters, no control characters",
                              json_schema_extra={"maxLength": 249, "pattern": GROUP_ID_PATTERN})]


class CreateConsumerResponse(BaseModel):
    instance_id: str
    base_uri: str


class Subscription(BaseModel):
    """Plain optional fields; the either/or rule is checked in subscribe() and stated in the description
    (combinators with null alternatives break client generators)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "description": "Give `topics` or `topic_pattern` (null is the same as absent). With both, `topics` "
                       "wins; an empty `topics` list unsubscribes; with neither nothing changes (all as the "
                       "Confluent REST Proxy does)."})
    topics: list[Annotated[str, Field(min_length=1, max_length=249)]] | None = None
    topic_pattern: str | None = Field(None, json_schema_extra={"format": "regex"},
                                      description="a regular expression (RE2 syntax) over topic names")


class SubscriptionTopics(BaseModel):
    topics: list[str]


class PartitionRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: str = Field(min_length=1, max_length=249)
    partition: Int32


class Partitions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partitions: list[PartitionRef]


class PartitionOffset(PartitionRef):
    offset: Int64


class PartitionTimestamp(PartitionRef):
    timestamp: Int64


class Positions(BaseModel):
    """Offsets and/or timestamps (null or absent: none), as Confluent's ConsumerSeekRequest."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "description": "`offsets` and/or `timestamps` (null is the same as absent); with neither nothing "
                       "changes, as in the Confluent REST Proxy."})
    offsets: list[PartitionOffset] | None = None
    timestamps: list[PartitionTimestamp] | None = None


class CommitOffset(PartitionRef):
    offset: Int64  # offset + 1 is committed
    metadata: str | None = Field(None, max_length=4096)


class CommitOffsets(BaseModel):
    model_config = ConfigDict(extra="forbid")
    offsets: list[CommitOffset] | None = None


class CommittedOffset(BaseModel):
    topic: str
    partition: int
    offset: int = Field(json_schema_extra={"format": "int64"})  # 64-bit in generated clients (Java, Go)
    metadata: str | None = None


class CommittedOffsets(BaseModel):
    offsets: list[CommittedOffset]



# -- helpers -----------------------------------------------------------------------------------------------
async def instance(request: Request, tenant: Tenant, group: str, instance_id: str) -> ConsumerInstance:
    """The instance the request names; with durable instances (GATEWAY_DURABLE_INSTANCES) one that no replica
    holds is re-created here from its descriptor when this replica may (no peers, or the routing layer found
    no holder and sends it to its ring owner: ``may_recreate``)."""
    bind(tenant.id, group, instance_id)
    gw = gateway(request)
    rt = runtime(request, tenant)
    if not gw.durable_instances or (group, instance_id) in rt.instances:
        return gw.get_instance(rt, group, instance_id)

    async def resubscribe(inst: ConsumerInstance, sub: dict[str, Any]) -> None:
        await apply_subscription(tenant, inst, sub)

    return await gw.find_instance(rt, group, instance_id, recreate=may_recreate(request), resubscribe=resubscribe)


def may_recreate(request: Request) -> bool:
    """Whether this replica may re-create an instance it does not hold: without routing between replicas it
    is the only one; with routing only when the routing layer marked the request (no replica holds the
    instance, and this replica is its ring owner)."""
    if getattr(request.app.state, "routing", None) is None:
        return True
    return bool(request.scope.get("state", {}).get("kcg_recreate"))


async def apply_subscription(tenant: Tenant, inst: ConsumerInstance, sub: dict[str, Any]) -> None:
    """Apply a subscription as its descriptor records it ({"topics"} | {"pattern"} | {"partitions"}), with the
    same tenant checks as the subscribe and assign routes."""
    if "topics" in sub:
        await _subscribe_topics(tenant, inst, list(sub["topics"]))
    elif "pattern" in sub:
        await _subscribe_pattern(tenant, inst, str(sub["pattern"]))
    elif "partitions" in sub:
        await _assign(tenant, inst, [TopicPartition(str(t), int(p)) for t, p in sub["partitions"]])


async def _subscribe_topics(tenant: Tenant, inst: ConsumerInstance, topics: list[str]) -> None:
    tenant.check_subscription_size(len(set(topics)))  # 422/42206 past max_topics_per_subscription
    for t in topics:
        tenant.require_topic(t)
        require_legal_topic_name(t)
    # the engine refuses switching modes (pattern/assignment → topics) with 409/40903
    await inst.consumer.subscribe(topics=topics)


async def _subscribe_pattern(tenant: Tenant, inst: ConsumerInstance, pattern: str) -> None:
    # Tenant-safe before subscribing: the pattern only ever matches the tenant's allowed topics (now and
    # topics created later); a forbidden topic it would match is left out, never delivered. The
    # engine compiles the pattern with RE2 (an invalid one is 422/42206) and refuses switching modes.
    inst.consumer.subs.topic_filter = tenant.allows_topic
    await inst.consumer.subscribe(pattern=pattern)


async def _assign(tenant: Tenant, inst: ConsumerInstance, parts: list[TopicPartition]) -> None:
    tenant.check_subscription_size(len({p.topic for p in parts}))  # 422/42206, as a subscription
    for p in parts:
        tenant.require_topic(p.topic)
        require_legal_topic_name(p.topic)
    if inst.consumer.subs.is_group_managed:  # before the metadata lookup: a mode conflict is 409 whatever the topics
        raise SubscriptionError("subscription to topics, to a pattern and manual assignment are mutually exclusive")
    md = await inst.consumer.client.ensure_metadata({p.topic for p in parts})
    for p in parts:
        if md.topic_error(p.topic):
            raise GatewayError(f"topic {p.topic!r} not found", status=404, error_code=40401)
        if p.partition not in md.topics[p.topic].partitions:
            raise GatewayError(f"partition {p.partition} of topic {p.topic!r} not found", status=404,
                               error_code=40402)
    await inst.consumer.assign(parts)




def tps(parts: list[PartitionRef]) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in parts]


# -- endpoints --------------------------------------------------------------------------------------------------
@router.post("/consumers/{group}", response_model=CreateConsumerResponse, responses=ERRORS,
             summary="Create a consumer instance in a group")
async def create_consumer(request: Request, group: GroupId, body: CreateConsumer | None = Body(None),
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    body = body or CreateConsumer()
    validate_group_id(group)  # 422/42206: empty, longer than Kafka's 249, control characters
    tenant.require_group(group)
    # the tenant's failure counter exists (at 0) before its first failure, so rate() sees that one too
    request.app.state.metrics.commit_failures.labels(tenant.id)
    base = base_url(request)  # 400/40003 before anything is created
    try:
        props = parse_properties(body.model_extra or {})
    except ConfigError as exc:
        raise GatewayError(str(exc), status=422, error_code=exc.code) from None
    if body.group_instance_id is not None:
        try:
            validate_kafka_id("group.instance.id", body.group_instance_id, MAX_GROUP_INSTANCE_ID_LENGTH)
        except ConfigError as exc:
            raise GatewayError(str(exc), status=422, error_code=exc.code) from None
    if "client_id" in props.overrides:
        # the instance's client id (its consumer's log lines) is in the tenant's own namespace, never another's
        props.overrides["client_id"] = tenant_client_id(tenant.id, props.overrides["client_id"])
    # (the model's _i validator made these ints; the declared types also admit the strings it accepts)
    if body.max_poll_records is not None and body.max_poll_records > 100_000:  # type: ignore[operator]
        raise GatewayError("max.poll.records: must be at most 100000", status=422, error_code=42206)
    if body.format in SCHEMA_FORMATS and not schema_service(request).available(tenant.schema_registry):
        raise RegistryNotConfigured(body.format)  # 422/42211, before anything is created
    auto = body.enable_auto_commit if body.enable_auto_commit is not None else body.auto_commit_enable
    reset = {"smallest": "earliest", "largest": "latest"}.get(body.auto_offset_reset or "",
                                                             body.auto_offset_reset or "latest")
    opts = InstanceOptions(
        format=body.format, avro_rendering=body.avro_json_rendering, auto_offset_reset=reset,
        auto_commit=True if auto is None else bool(auto),
        fetch_min_bytes=int(body.fetch_min_bytes) if body.fetch_min_bytes is not None else None,
        request_timeout_ms=(int(body.consumer_request_timeout_ms)
                            if body.consumer_request_timeout_ms is not None else None),
        isolation_level=body.isolation_level or "read_uncommitted",
        group_instance_id=body.group_instance_id,
        session_timeout_ms=int(body.session_timeout_ms) if body.session_timeout_ms is not None else None,
        max_poll_records=body.max_poll_records or None,  # type: ignore[arg-type]  # 0: the gateway's default
        max_bytes=body.consumer_request_max_bytes or None,  # type: ignore[arg-type]
        overrides=props.overrides,
    )
    name = body.id if body.id is not None else body.name  # the legacy 'id' overrides 'name', as in Confluent
    gw = gateway(request)
    bind(tenant.id, group, name)
    inst = await gw.create_instance(runtime(request, tenant), group, opts, name,
                                    tenant_max_instances=tenant.quotas.max_instances)
    inst.consumer.subs.topic_filter = tenant.allows_topic  # a pattern never matches a forbidden topic
    bind(instance=inst.instance_id)
    log.info("created consumer instance (format %s, auto commit %s)", opts.format, opts.auto_commit)
    uri = f"{base}/consumers/{quote(group, safe='')}/instances/{quote(inst.instance_id, safe='')}"
    return v2({"instance_id": inst.instance_id, "base_uri": uri})


BASE = "/consumers/{group}/instances/{instance_id}"
STREAM_CHUNK_RECORDS = 5000


@router.delete(BASE, status_code=204, responses=ERRORS, summary="Delete a consumer instance (leaves the group)")
async def delete_consumer(request: Request, group: str, instance_id: str,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    await gateway(request).delete_instance(runtime(request, tenant), group, instance_id,
                                          orphans=gateway(request).durable_instances and may_recreate(request))
    return Response(status_code=204)


@router.post(BASE + "/subscription", status_code=204, responses=ERRORS, summary="Subscribe to topics or a pattern")
async def subscribe(request: Request, group: str, instance_id: str, body: Subscription,
                    tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    # As Confluent's v2 consumer (KafkaConsumerState.subscribe): a topics list wins over a pattern, and
    # an empty list unsubscribes (Java's subscribe(empty) = unsubscribe()).
    if body.topics is None and body.topic_pattern is None:
        return Response(status_code=204)  # nothing to subscribe to: a no-op, as in Confluent's v2 consumer
    gw = gateway(request)
    if body.topics is not None:
        if not body.topics:
            await inst.consumer.unsubscribe()
            await gw.describe(runtime(request, tenant), inst, None)
            return Response(status_code=204)
        await _subscribe_topics(tenant, inst, body.topics)
        await gw.describe(runtime(request, tenant), inst, {"topics": sorted(set(body.topics))})
    else:
        await _subscribe_pattern(tenant, inst, body.topic_pattern or "")
        await gw.describe(runtime(request, tenant), inst, {"pattern": body.topic_pattern or ""})
    return Response(status_code=204)


@router.get(BASE + "/subscription", response_model=SubscriptionTopics, responses=ERRORS,
            summary="Topics this instance is subscribed to")
async def get_subscription(request: Request, group: str, instance_id: str,
                           tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    topics = sorted(inst.consumer.subscription()) if inst.consumer.subs.is_group_managed else []
    return v2({"topics": topics})


@router.delete(BASE + "/subscription", status_code=204, responses=ERRORS, summary="Unsubscribe")
async def unsubscribe(request: Request, group: str, instance_id: str,
                      tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    await inst.consumer.unsubscribe()
    await gateway(request).describe(runtime(request, tenant), inst, None)
    return Response(status_code=204)


@router.post(BASE + "/assignments", status_code=204, responses=ERRORS, summary="Manually assign partitions")
async def assign(request: Request, group: str, instance_id: str, body: Partitions,
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    parts = tps(body.partitions)
    await _assign(tenant, inst, parts)
    await gateway(request).describe(runtime(request, tenant), inst,
                                    {"partitions": [[tp.topic, tp.partition] for tp in parts]} if parts else None)
    return Response(status_code=204)


@router.get(BASE + "/assignments", response_model=Partitions, responses=ERRORS,
            summary="Partitions currently assigned to this instance")
async def get_assignments(request: Request, group: str, instance_id: str,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    return v2({"partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in inst.consumer.assignment()]})


def _require_assigned(inst: ConsumerInstance, parts: list[TopicPartition]) -> None:
    missing = [str(tp) for tp in parts if not inst.consumer.subs.is_assigned(tp)]
    if missing:
        raise GatewayError(f"partitions not assigned to this instance: {', '.join(missing)}",
                           status=409, error_code=40903)


@router.post(BASE + "/positions", status_code=204, responses=ERRORS,
             summary="Seek to offsets (or, our extension, to timestamps)")
async def seek(request: Request, group: str, instance_id: str, body: Positions,
               tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    offs = body.offsets or []
    stamps = body.timestamps or []
    _require_assigned(inst, tps(offs) + tps(stamps))  # type: ignore[arg-type]
    for o in offs:
        inst.consumer.seek(TopicPartition(o.topic, o.partition), o.offset)
    if stamps:
        inst.consumer.seek_to_timestamp({TopicPartition(t.topic, t.partition): t.timestamp for t in stamps})
    return Response(status_code=204)


@router.post(BASE + "/positions/beginning", status_code=204, responses=ERRORS, summary="Seek to the beginning")
async def seek_beginning(request: Request, group: str, instance_id: str, body: Partitions,
                         tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    _require_assigned(inst, tps(body.partitions))
    inst.consumer.seek_to_beginning(tps(body.partitions))
    return Response(status_code=204)


@router.post(BASE + "/positions/end", status_code=204, responses=ERRORS, summary="Seek to the end")
async def seek_end(request: Request, group: str, instance_id: str, body: Partitions,
                   tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    _require_assigned(inst, tps(body.partitions))
    inst.consumer.seek_to_end(tps(body.partitions))
    return Response(status_code=204)


COMMIT_ANSWER: dict[str, Any] = {
    "description": "committed (the broker acknowledged): an empty JSON array, as Confluent answers",
    "content": {V2: {"schema": {"type": "array", "maxItems": 0, "items": {}}}},
}


@router.post(BASE + "/offsets", status_code=200, responses={**ERRORS, 200: COMMIT_ANSWER},
             summary="Commit offsets (each offset + 1, as Confluent does); an empty body commits everything consumed")
async def commit(request: Request, group: str, instance_id: str, body: CommitOffsets | None = Body(None),
                 tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    offsets = (body.offsets if body is not None else None) or []  # null offsets = an empty body, as before
    for o in offsets:
        tenant.require_topic(o.topic)
    metrics = request.app.state.metrics
    started = time.monotonic()
    try:
        if not offsets:
            await inst.consumer.commit_consumed()
        else:
            await inst.consumer.commit({TopicPartition(o.topic, o.partition):
                                        OffsetAndMetadata(o.offset + 1, o.metadata or "")
                                        for o in offsets})
    except Exception:
        metrics.commit_failures.labels(tenant.id).inc()
        raise
    finally:
        metrics.commit_seconds.labels(tenant.id).observe(time.monotonic() - started)
    # Confluent answers a commit with 200 and the (always empty) list of its commit callback, only once
    # the broker acknowledged; clients such as kafka-bridge-client's Confluent mode expect that answer.
    return Response(b"[]", status_code=200, media_type=V2)


QueryTopics = Annotated[list[Annotated[str, Field(min_length=1, max_length=249)]] | None, Query(
    description="body-free form: topics, repeated (`?topic=a&topic=b`); see the operation's description")]
QueryPartitions = Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None, Query(
    description="body-free form: partition numbers, repeated (`?partition=0&partition=1`); see the operation's "
                "description")]


def committed_partitions(body: list[TopicPartition] | None, topics: list[str] | None, numbers: list[int] | None,
                         assigned: list[TopicPartition]) -> list[TopicPartition]:
    """The partitions ``GET .../offsets`` reports on: those of the body (Confluent's form) and, for clients
    that cannot send a body on a GET, of the query: every ``topic`` with every ``partition`` when both are
    given, else the assigned partitions of the given topics (or with the given numbers); with neither a body
    nor a query, the assigned partitions."""
    out = list(body or ())
    if topics and numbers:
        out += [TopicPartition(t, n) for t in topics for n in numbers]
    elif topics or numbers:
        out += [tp for tp in assigned if tp.topic in (topics or ()) or tp.partition in (numbers or ())]
    elif body is None:
        out = list(assigned)
    return list(dict.fromkeys(out))


def _empty_object_is_no_body(value: Any) -> Any:
    """``{}`` on ``GET .../offsets`` is no body: generated clients (openapi-generator's typescript-axios) send
    an empty object for a GET whose optional body was left out."""
    return None if value == {} else value


#: ``GET .../offsets``'s optional body: Confluent's ``{"partitions": [...]}``, or none (an empty object is none).
CommittedBody = Annotated[Partitions | None, BeforeValidator(_empty_object_is_no_body), Body()]


@router.get(BASE + "/offsets", response_model=CommittedOffsets, responses=ERRORS,
            summary="Last committed offsets of the given partitions (request body on GET, as Confluent, or "
            "query parameters, or none: the assigned partitions); partitions never committed are left out")
async def committed(request: Request, group: str, instance_id: str, body: CommittedBody = None,
                    topic: QueryTopics = None, partition: QueryPartitions = None,
                    tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    parts = committed_partitions(tps(body.partitions) if body is not None else None, topic, partition,
                                 list(inst.consumer.assignment()))
    for tp in parts:
        tenant.require_topic(tp.topic)
    if not parts:
        return v2({"offsets": []})
    got = await inst.consumer.committed(parts)
    # Partitions without a committed offset are left out, as Confluent's v2 consumer does.
    return v2({"offsets": [
        {"topic": tp.topic, "partition": tp.partition, "offset": om.offset, "metadata": om.metadata or ""}
        for tp, om in got.items() if om is not None and om.offset >= 0]})


