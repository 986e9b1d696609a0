"""Share consumer instances over HTTP (share groups, KIP-932), in the style of the v2 consumer API.

``POST /share-groups/{group}`` creates an instance (a member of the share group), ``.../subscription`` names
its topics, ``GET .../records`` long-polls for acquired records (each with its ``delivery_count`` and the
deadline of its acquisition lock), ``POST .../acknowledgements`` settles them per record (accept, release,
reject; renew extends the lock) and answers, per record, whether the broker applied it. The registry and its
rules are in :mod:`service.instances.share`; docs/share-groups.md is the guide.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import current_tenant
from api.deps import ERRORS, INT32_MAX, NDJSON, OFFSET_MAX, SSE, V2, base_url, gateway, runtime, v2
from api.share.streams import stream_share_records
from api.v2.render import Rendered, chunk_schema_ids, render_binary, render_json, render_schema_chunks
from api.v2.schema_records import schema_service
from api.v2.streams import SlotStreamingResponse
from service.client.errors import BrokerResponseError
from service.cluster.topics import require_legal_topic_name
from service.consumer.subscription import TopicPartition
from service.errors import GatewayError
from service.instances.registry import GROUP_ID_PATTERN, validate_group_id
from service.instances.share import (
    ACK_TYPES,
    AckOutcome,
    ShareInstance,
    ShareOptions,
    ShareRegistry,
    ack_ranges,
    require_share_groups,
)
from service.lib.logs import bind
from service.protocol.records import Record
from service.schemas.formats import SCHEMA_FORMATS, RegistryNotConfigured
from service.schemas.registry import RegistryUnavailable
from service.schemas.subjects import tenant_view
from service.share.admin import alter_group_config
from service.share.consumer import ShareRecord
from service.share.session import AckType
from service.tenants import Tenant

router = APIRouter(tags=["share-groups"])

BASE = "/share-groups/{group}/instances/{instance_id}"
#: the most offsets one acknowledgements request may name (ranges expanded)
MAX_ACK_OFFSETS = 100_000

ShareGroupId = Annotated[str, Path(description="Share group id: up to 249 characters, no control characters",
                                   json_schema_extra={"maxLength": 249, "pattern": GROUP_ID_PATTERN})]


class ShareGroupConfigs(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    auto_offset_reset: str | None = Field(None, alias="share.auto.offset.reset",
                                          description="earliest, latest or by_duration:<ISO-8601 duration>")
    record_lock_duration_ms: str | None = Field(None, alias="share.record.lock.duration.ms")
    isolation_level: str | None = Field(None, alias="share.isolation.level")
    delivery_count_limit: str | None = Field(None, alias="share.delivery.count.limit")
    session_timeout_ms: str | None = Field(None, alias="share.session.timeout.ms")
    heartbeat_interval_ms: str | None = Field(None, alias="share.heartbeat.interval.ms")


class CreateShareConsumer(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,200}$",
                             description="the instance's name (its id in URLs); generated when absent")
    format: Literal["binary", "json", "avro", "protobuf", "jsonschema"] = Field(
        "binary", description="binary: base64 keys and values; json: embedded JSON; avro, protobuf, jsonschema: "
        "decoded with the writer's schema from the schema registry (as consumer instances)")
    acknowledgement_mode: Literal["explicit", "implicit"] = Field(
        "explicit", alias="acknowledgement.mode",
        description="explicit: each record is acknowledged by POST .../acknowledgements (or its lock runs out); "
                    "implicit: each records request accepts every record the previous one returned")
    configs: ShareGroupConfigs | None = Field(
        None, description="share-group configs set on the group before joining (they apply to every member; Kafka "
                          "checks the values: 422/42206 when it refuses one); e.g. "
                          "{\"share.auto.offset.reset\": \"earliest\"} (a new share group starts at the latest "
                          "offset)")


class CreateShareConsumerResponse(BaseModel):
    instance_id: str
    base_uri: str


class ShareSubscription(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topics: list[Annotated[str, Field(min_length=1, max_length=249)]] = Field(min_length=1)


class ShareSubscriptionTopics(BaseModel):
    topics: list[str]


class Acknowledgement(BaseModel):
    """One record (``offset``) or a range of them (``first_offset`` to ``last_offset``, inclusive)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "description": "Give `offset`, or `first_offset` and `last_offset` (a range, inclusive): anything else "
                       "is 422/42207."})
    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0, le=INT32_MAX)
    offset: int | None = Field(None, ge=0, le=OFFSET_MAX, json_schema_extra={"format": "int64"})
    first_offset: int | None = Field(None, ge=0, le=OFFSET_MAX, json_schema_extra={"format": "int64"})
    last_offset: int | None = Field(None, ge=0, le=OFFSET_MAX, json_schema_extra={"format": "int64"})
    type: Literal["accept", "release", "reject", "renew"] = Field(
        "accept", description="accept: done; release: deliver it again (delivery_count + 1); reject: never "
                              "deliver it again; renew: keep it locked for another acquisition lock duration")

    def offsets(self) -> range:
        """The offsets named: ``offset``, or ``first_offset`` to ``last_offset`` (422/42207 otherwise)."""
        ranged = self.first_offset is not None or self.last_offset is not None
        if self.offset is not None and not ranged:
            return range(self.offset, self.offset + 1)
        if self.offset is None and self.first_offset is not None and self.last_offset is not None \
                and self.first_offset <= self.last_offset:
            return range(self.first_offset, self.last_offset + 1)
        raise GatewayError(f"{self.topic}-{self.partition}: give either offset, or first_offset and last_offset "
                           "(first_offset <= last_offset)", status=422, error_code=42207)


class Acknowledgements(BaseModel):
    model_config = ConfigDict(extra="forbid")
    acknowledgements: list[Acknowledgement]
    wait: bool = Field(True, description="true: send now and answer the broker's word per record; false: answer "
                       "at once (only the records refused locally), the rest ride on the next records request or "
                       "go out alone within ~100 ms; their outcomes are in GET .../acknowledgements")


class AckOutcomeModel(BaseModel):
    topic: str
    partition: int
    offset: int = Field(json_schema_extra={"format": "int64"})
    type: str
    applied: bool
    error: str | None = Field(None, description="why it was not applied: NOT_HELD (this instance does not hold "
                              "it: never delivered here, or already acknowledged), LOCK_EXPIRED (its acquisition "
                              "lock ran out), or the broker's error name (INVALID_RECORD_STATE, ...)")
    lock_expires_at: int | None = Field(None, description="renew: the new lock deadline (ms since the epoch)")


class AckOutcomes(BaseModel):
    acknowledgements: list[AckOutcomeModel]


class ShareRecordModel(BaseModel):
    topic: str
    partition: int
    offset: int = Field(json_schema_extra={"format": "int64"})
    timestamp: int = Field(json_schema_extra={"format": "int64"})
    key: Any = None
    value: Any = None
    headers: list[dict[str, Any]]
    delivery_count: int = Field(description="1 on the first delivery, one more on each redelivery")
    lock_expires_at: int = Field(description="when the acquisition lock runs out (ms since the epoch): "
                                             "acknowledge (or renew) before then")


# -- helpers ------------------------------------------------------------------------------------------------------
class ChargedResponse(Response):
    """An answer whose records are charged to the memory budget: ``release`` runs once it was sent (or could not
    be: the client left)."""

    def __init__(self, content: bytes, *, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def shares(request: Request) -> ShareRegistry:
    return request.app.state.shares


def share_instance(request: Request, tenant: Tenant, group: str, instance_id: str) -> ShareInstance:
    bind(tenant.id, group, instance_id)
    return shares(request).get(tenant.id, group, instance_id)


def stream_media(request: Request) -> str | None:
    """``application/x-ndjson`` or ``text/event-stream`` when the Accept header names one (a stream), else
    None (a JSON array, whatever else it names)."""
    for item in request.headers.get("accept", "").lower().split(","):
        media = item.split(";")[0].strip()
        if media in (NDJSON, SSE):
            return media
    return None


def wall_ms(deadline: float) -> int:
    """A monotonic deadline as ms since the epoch."""
    return int((time.time() + (deadline - time.monotonic())) * 1000)


def outcome_json(o: AckOutcome) -> dict[str, Any]:
    """One offset's outcome as JSON (``o`` of one record; see :func:`outcomes_body` for runs)."""
    out: dict[str, Any] = {"topic": o.topic, "partition": o.partition, "offset": o.offset, "type": o.type,
                           "applied": o.applied, "error": o.error}
    if o.lock_deadline is not None:
        out["lock_expires_at"] = wall_ms(o.lock_deadline)
    return out


def outcomes_body(outcomes: list[AckOutcome]) -> bytes:
    """``{"acknowledgements": [...]}`` with one object per offset (a run's outcome repeated for each of its
    offsets), rendered per run: only the offset differs within a run."""
    pieces: list[bytes] = []
    for o in outcomes:
        head = orjson.dumps(outcome_json(o))
        at = head.index(b'"offset":') + 9
        end = head.index(b",", at)
        if o.offset == o.last:
            pieces.append(head)
        else:
            template = head[:at].replace(b"%", b"%%") + b"%d" + head[end:].replace(b"%", b"%%")
            pieces += [template % n for n in range(o.offset, o.last + 1)]
    return b'{"acknowledgements":[' + b",".join(pieces) + b"]}"


_SEP = b"\x00"  # no rendered record holds a NUL byte (JSON escapes it): the records are split on it


#: per chunk, runs of records sharing their share fields: (how many records, the fields rendered)
ExtraRuns = list[list[list[Any]]]


def _chunks(records: list[ShareRecord]) -> tuple[list[tuple[TopicPartition, list[Record]]], ExtraRuns]:
    """The records per partition (as the renderers take them), and beside each chunk its rendered share fields
    (``delivery_count``, ``lock_expires_at``) as runs: records acquired together share them."""
    chunks: dict[tuple[str, int], tuple[list[Record], list[list[Any]]]] = {}
    shift = time.time() - time.monotonic()  # monotonic lock deadlines as wall-clock times
    for r in records:
        c = chunks.get((r.topic, r.partition))
        if c is None:
            c = chunks[(r.topic, r.partition)] = ([], [])
        c[0].append(r.record if r.record is not None else Record(r.offset, r.timestamp, r.key, r.value, r.headers))
        runs = c[1]
        if runs and runs[-1][1] == r.delivery_count and runs[-1][2] == r.lock_deadline:
            runs[-1][0] += 1
        else:
            runs.append([1, r.delivery_count, r.lock_deadline])
    extras = [[[n, b',"delivery_count":%d,"lock_expires_at":%d}' % (count, int((shift + deadline) * 1000))]
               for n, count, deadline in runs] for _, runs in chunks.values()]
    return [(TopicPartition(t, p), recs) for (t, p), (recs, _) in chunks.items()], extras


def _with_extras(part: bytes, runs: list[list[Any]], sep: bytes) -> bytes:
    """A rendered chunk (records ending in ``}``, joined by NUL) with each record's share fields, joined by
    ``sep``."""
    texts = part.split(_SEP)  # (NUL only ever separates records; bytes.replace of "}" NUL is slower)
    if len(runs) == 1:  # one acquisition: every record gets the same fields
        extra = runs[0][1]
        if runs[0][0] != len(texts):
            raise ValueError(f"{len(texts)} records rendered, {runs[0][0]} expected")
        return sep.join([t[:-1] + extra for t in texts])
    out: list[bytes] = []
    i = 0
    for n, extra in runs:
        out += [t[:-1] + extra for t in texts[i:i + n]]
        i += n
    if i != len(texts):
        raise ValueError(f"{len(texts)} records rendered, {i} expected")
    return sep.join(out)


async def render_share_records(request: Request, inst: ShareInstance, tenant: Tenant,
                               records: list[ShareRecord]) -> bytes:
    """The records as a JSON array in the instance's format (see :func:`render_share_pieces`)."""
    return b"[" + await _render_share(request, inst, tenant, records, b",") + b"]"


async def render_share_pieces(request: Request, inst: ShareInstance, tenant: Tenant,
                              records: list[ShareRecord]) -> list[bytes]:
    """The records as JSON objects in the instance's format, each on one line (no line break: ndjson and SSE
    take them as they are) with ``delivery_count`` and ``lock_expires_at``. A schema registry that cannot
    answer: the records are released (delivered again at once) and 503/50307 is raised."""
    return (await _render_share(request, inst, tenant, records, _SEP)).split(_SEP) if records else []


async def _render_share(request: Request, inst: ShareInstance, tenant: Tenant, records: list[ShareRecord],
                        sep: bytes) -> bytes:
    """The records rendered (see :func:`render_share_pieces`), joined by ``sep``."""
    if not records:
        return b""
    chunks, extras = _chunks(records)
    fmt = inst.options.format
    rendered: Rendered
    if fmt in SCHEMA_FORMATS:
        resolver = tenant_view(schema_service(request).resolver(tenant.schema_registry, fmt), tenant)
        try:
            await resolver.prepare(chunk_schema_ids(chunks), inst.options.avro_rendering, programs=fmt == "avro",
                                   tenant=inst.tenant)
        except RegistryUnavailable:
            await inst.acknowledge(ack_ranges(records, AckType.RELEASE), wait=False, linger=0.0)
            request.app.state.metrics.schema_registry_unavailable.labels(inst.tenant).inc()
            raise
        errors = request.app.state.metrics.schema_decode_errors.labels(inst.tenant, fmt)  # as consumer polls count
        rendered = render_schema_chunks(resolver, fmt, inst.options.avro_rendering, chunks, _SEP,
                                        on_errors=lambda n: errors.inc(n))
    elif fmt == "json":
        rendered = render_json(chunks, _SEP)
    else:
        rendered = render_binary(chunks, _SEP)
    body = sep.join([_with_extras(part, runs, sep)  # (every chunk has records)
                     for runs, part in zip(extras, rendered.parts, strict=True)])
    metrics = request.app.state.metrics
    metrics.records.labels(tenant.id).inc(rendered.count)
    metrics.bytes.labels(tenant.id).inc(rendered.payload)
    return body


# -- endpoints ------------------------------------------------------------------------------------------------------
@router.post("/share-groups/{group}", response_model=CreateShareConsumerResponse, responses=ERRORS,
             summary="Create a share consumer instance (a member of the share group)")
async def create_share_consumer(request: Request, group: ShareGroupId,
                                body: CreateShareConsumer | None = Body(None),
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    body = body or CreateShareConsumer()
    validate_group_id(group)
    tenant.require_group(group)
    base = base_url(request)
    client = runtime(request, tenant).client
    await require_share_groups(client)  # 409/40912 on a cluster without share groups (Tansu)
    configs: dict[str, str | None] = {}
    if body.configs is not None:
        configs = {k: v for k, v in body.configs.model_dump(by_alias=True).items() if v is not None}
    if body.format in SCHEMA_FORMATS and not schema_service(request).available(tenant.schema_registry):
        raise RegistryNotConfigured(body.format)
    if configs:
        try:
            await alter_group_config(client, group, configs)
        except BrokerResponseError as exc:  # an invalid value: the broker's error name
            raise GatewayError(f"share-group configs refused by Kafka: {exc.name}", status=422,
                               error_code=42206) from None
    inst = await shares(request).create(
        tenant.id, client, group, ShareOptions(format=body.format, ack_mode=body.acknowledgement_mode),
        body.name, tenant_max_instances=tenant.quotas.max_instances)
    uri = f"{base}/share-groups/{quote(group, safe='')}/instances/{quote(inst.name, safe='')}"
    return v2({"instance_id": inst.name, "base_uri": uri})


@router.delete(BASE, status_code=204, responses=ERRORS,
               summary="Delete a share consumer instance (releases what it holds, leaves the share group)")
async def delete_share_consumer(request: Request, group: str, instance_id: str,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    bind(tenant.id, group, instance_id)
    await shares(request).delete(tenant.id, group, instance_id)
    return Response(status_code=204)


@router.post(BASE + "/subscription", status_code=204, responses=ERRORS,
             summary="Subscribe the share consumer instance to topics (replaces its subscription)")
async def share_subscribe(request: Request, group: str, instance_id: str, body: ShareSubscription,
                          tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = share_instance(request, tenant, group, instance_id)
    tenant.check_subscription_size(len(set(body.topics)))
    for t in body.topics:
        tenant.require_topic(t)
        require_legal_topic_name(t)
    inst.active_requests += 1
    try:
        await inst.subscribe(body.topics)
    finally:
        inst.active_requests -= 1
        inst.touch()
    return Response(status_code=204)


@router.get(BASE + "/subscription", response_model=ShareSubscriptionTopics, responses=ERRORS,
            summary="Topics the share consumer instance is subscribed to")
async def share_subscription(request: Request, group: str, instance_id: str,
                             tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = share_instance(request, tenant, group, instance_id)
    return v2({"topics": list(inst.topics)})


@router.get(BASE + "/records", response_model=list[ShareRecordModel], responses=ERRORS,  # (200: api/openapi.py)
            summary="Acquire records: long-poll until some arrive or the timeout passes, or stream them")
async def share_records(request: Request, group: str, instance_id: str,
                        timeout: Annotated[int | None, Query(ge=0, le=INT32_MAX,
                                                             description="milliseconds to wait for data")] = None,
                        max_bytes: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
                        max_records: Annotated[int | None, Query(
                            ge=1, le=100000, description="at most this many records per partition leader "
                            "(acquired records are locked for this instance: ask for what you can handle)")] = None,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = share_instance(request, tenant, group, instance_id)
    media = stream_media(request)
    if media is not None:
        if inst.consumer is None:
            raise GatewayError("the share consumer instance is not subscribed to any topic", status=409,
                               error_code=40903)
        # a stream holds one of the tenant's stream slots (and poll slots) for its whole life: 429/42901 first
        slot = tenant.stream_slot()
        await slot.__aenter__()
        return SlotStreamingResponse(
            stream_share_records(request, inst, tenant, media, max_records or 500, max_bytes, render_share_pieces),
            release=slot, media_type=media, headers={"cache-control": "no-cache"})
    body, charge = await poll_share_records(request, inst, tenant, timeout, max_bytes, max_records)
    # one media type whatever the format (the instance's format says how keys and values are rendered); the
    # records stay charged to the memory budget until the answer was sent
    return ChargedResponse(body, media_type=V2, release=lambda: inst.release_charge(charge))


async def poll_share_records(request: Request, inst: ShareInstance, tenant: Tenant, timeout: int | None,
                             max_bytes: int | None, max_records: int | None) -> tuple[bytes, int]:
    """A records request (not a stream): the JSON array of what was acquired within ``timeout`` ms, and the
    bytes charged to the memory budget for it (the caller's to release once the answer was sent). Also the
    lean route's (api/server/fastpath.py)."""
    reg = shares(request)
    gw = gateway(request)
    wait = min(reg.max_poll_timeout, (1000 if timeout is None else timeout) / 1000)
    inst.active_requests += 1
    charge = 0
    try:
        async with tenant.poll_slot():
            recs: list[ShareRecord] = []
            if not gw.draining:
                recs, charge = await inst.poll(max_records or 500, max_bytes, wait,
                                               stop=lambda: gw.draining or inst.closed)
            body = await render_share_records(request, inst, tenant, recs)
    except BaseException:
        inst.release_charge(charge)
        raise
    finally:
        inst.active_requests -= 1
        inst.touch()
    return body, charge


@router.post(BASE + "/acknowledgements", response_model=AckOutcomes, responses=ERRORS,
             summary="Acknowledge records (accept, release, reject, renew); the answer says per record whether "
                     "it was applied")
async def share_acknowledge(request: Request, group: str, instance_id: str, body: Acknowledgements,
                            tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = share_instance(request, tenant, group, instance_id)
    return Response(await acknowledge_share(request, inst, body), media_type=V2)


async def acknowledge_share(request: Request, inst: ShareInstance, body: Acknowledgements) -> bytes:
    """An acknowledgements request: the answer's body (one outcome per offset). Also the lean route's
    (api/server/fastpath.py)."""
    total = sum(len(a.offsets()) for a in body.acknowledgements)
    if total > MAX_ACK_OFFSETS:
        raise GatewayError(f"{total} offsets in one request; at most {MAX_ACK_OFFSETS}", status=422,
                           error_code=42206)
    acks = []
    for a in body.acknowledgements:
        offsets = a.offsets()
        acks.append((a.topic, a.partition, offsets.start, offsets.stop - 1, ACK_TYPES[a.type]))
    inst.active_requests += 1
    try:
        got = await inst.acknowledge(acks, wait=body.wait, linger=shares(request).ack_linger)
    finally:
        inst.active_requests -= 1
        inst.touch()
    return outcomes_body(got)


@router.get(BASE + "/acknowledgements", response_model=AckOutcomes, responses=ERRORS,
            summary="Outcomes of acknowledgements answered since the last call that no request waited for "
                    "(wait: false, implicit mode)")
async def share_ack_outcomes(request: Request, group: str, instance_id: str,
                             tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = share_instance(request, tenant, group, instance_id)
    return Response(outcomes_body(inst.take_outcomes()), media_type=V2)

