"""Confluent REST Proxy v2 topic endpoints (metadata and partition offsets), read-only.

Shapes follow Confluent's v2 entities: ``GET /topics`` → names; ``GET /topics/{topic}`` → ``{name, configs,
partitions}``; a partition → ``{partition, leader, replicas: [{broker, leader, in_sync}]}``; offsets →
``{beginning_offset, end_offset}`` plus our ``last_stable_offset``. The logic lives in :mod:`service.cluster.topics`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from api.auth import current_tenant
from api.deps import BINARY, ERRORS, JSONFMT, OFFSET_MAX, V2, runtime, v2
from api.responses import SlotResponse
from api.v2.render import render_binary, render_json
from service.cluster.topics import TopicCatalog, visible_topic_names
from service.consumer.subscription import TopicPartition
from service.errors import GatewayError
from service.fetch.ranges import (
    ARROW_STREAM,
    DEFAULT_MAX_BYTES,
    MAX_MAX_BYTES,
    RangePage,
    read_page,
    to_arrow_ipc,
)
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED
from service.schemas.subjects import TenantSchemas
from service.tenants import Tenant

router = APIRouter(tags=["topics"])


class Replica(BaseModel):
    broker: int
    leader: bool
    in_sync: bool


class PartitionInfo(BaseModel):
    partition: int
    leader: int
    replicas: list[Replica]


class TopicInfo(BaseModel):
    name: str
    configs: dict[str, str | None]
    partitions: list[PartitionInfo]


class PartitionOffsetsInfo(BaseModel):
    beginning_offset: int
    end_offset: int
    last_stable_offset: int


def catalog(request: Request, tenant: Tenant) -> TopicCatalog:
    rt = runtime(request, tenant)
    if rt.topics is None:
        rt.topics = TopicCatalog(rt.client, ttl=request.app.state.settings.topic_metadata_ttl_s)
    cat: TopicCatalog = rt.topics
    return cat


@router.get("/topics", response_model=list[str], responses=ERRORS,
            summary="Names of the topics this tenant may read (internal topics left out)")
async def list_topics(request: Request, tenant: Tenant = Depends(current_tenant)) -> Response:
    topics = await catalog(request, tenant).list_topics()
    return v2(visible_topic_names(topics, tenant.allows_topic))


@router.get("/topics/{topic}", response_model=TopicInfo, responses=ERRORS,
            summary="A topic: its configs and partitions")
async def get_topic(request: Request, topic: str, tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic)
    cat = catalog(request, tenant)
    view = await cat.topic(topic)
    return v2(view.to_json(await cat.configs(topic)))


@router.get("/topics/{topic}/partitions", response_model=list[PartitionInfo], responses=ERRORS,
            summary="The partitions of a topic")
async def list_partitions(request: Request, topic: str, tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic)
    view = await catalog(request, tenant).topic(topic)
    return v2([p.to_json() for p in view.partitions])


@router.get("/topics/{topic}/partitions/{partition}", response_model=PartitionInfo, responses=ERRORS,
            summary="One partition of a topic")
async def get_partition(request: Request, topic: str, partition: int,
                        tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic)
    p = await catalog(request, tenant).partition(topic, partition)
    return v2(p.to_json())


@router.get("/topics/{topic}/partitions/{partition}/offsets", response_model=PartitionOffsetsInfo,
            responses=ERRORS, summary="Beginning and end offsets of a partition (and its last stable offset)")
async def get_partition_offsets(request: Request, topic: str, partition: int,
                                tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic)
    offsets = await catalog(request, tenant).offsets(topic, partition)
    return v2(offsets.to_json())


# -- stateless offset-range reads ---------------------------------------------------------------------------
ARROW = ARROW_STREAM
JSON = "application/json"
_RANGE_MEDIA = {"": BINARY, "*/*": BINARY, "application/*": BINARY, JSON: BINARY, V2: BINARY, BINARY: BINARY,
                JSONFMT: JSONFMT, ARROW: ARROW}
_PAGE_FIELDS = {
    "topic": {"type": "string"},
    "partition": {"type": "integer", "minimum": 0},
    "offset": {"type": "integer", "minimum": 0, "description": "where this page was read from"},
    "next_offset": {"type": "integer", "minimum": 0,
                    "description": "the offset to read from next; done when next_offset >= end_offset"},
    "end_offset": {"type": "integer", "minimum": 0,
                   "description": "min(the requested end_offset, the LSO under read_committed, else the high "
                                  "watermark)"},
    "high_watermark": {"type": "integer"}, "last_stable_offset": {"type": "integer"},
    "log_start_offset": {"type": "integer"},
}
_PAGE_REQUIRED = ["topic", "partition", "offset", "records", "next_offset", "end_offset", "high_watermark",
                  "last_stable_offset", "log_start_offset"]


def _page_schema(record_ref: str) -> dict[str, Any]:
    return {"type": "object", "required": _PAGE_REQUIRED, "properties": {
        **_PAGE_FIELDS, "records": {"type": "array", "items": {"$ref": f"#/components/schemas/{record_ref}"}}}}


_OFFSET_HEADERS = {h: {"description": d, "schema": {"type": "integer"}} for h, d in (
    ("X-Next-Offset", "the offset to read from next"), ("X-End-Offset", "the end of the range (see end_offset)"),
    ("X-High-Watermark", "the partition's high watermark"), ("X-Last-Stable-Offset", "its last stable offset"),
    ("X-Log-Start-Offset", "its log start offset"), ("X-Record-Count", "records in this page"))}

RANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "One page of records in [offset, end_offset), with the paging state in the body (JSON) "
                         "or the schema metadata (Arrow) and in X-* headers",
          "headers": _OFFSET_HEADERS,
          "content": {
              BINARY: {"schema": _page_schema("ConsumerRecord")},
              JSONFMT: {"schema": _page_schema("ConsumerRecord")},
              ARROW: {"schema": {"type": "string", "format": "binary", "description":
                                 "Arrow IPC stream: topic (dictionary<int32, string>), partition (int32), offset "
                                 "(int64), timestamp (timestamp[ms]), key (binary), value (binary), headers "
                                 "(list<struct<key: string, value: binary>>); the paging state (next_offset, "
                                 "end_offset, high_watermark, last_stable_offset, log_start_offset) in the schema "
                                 "metadata. With format=avro|protobuf|jsonschema (typed): value is the reader "
                                 "schema's Arrow type, plus value_schema_id (int32), error (string) and value_raw "
                                 "(binary) columns (key_schema_id / key_raw with key_format); the reader schema id "
                                 "in the metadata (value_schema_id) and in X-Value-Schema-Id; see "
                                 "docs/typed-ranges.md"}},
          }},
    406: {"model": ERRORS[404]["model"], "description": "unsupported Accept (40601)"},
    **{s: e for s, e in ERRORS.items() if s not in (400, 409, 410, 413, 415)},
}


def _range_media(request: Request) -> str:
    accept = request.headers.get("accept", "")
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in _RANGE_MEDIA:
            return _RANGE_MEDIA[media]
    raise GatewayError(f"the Accept header {accept!r} is not supported here; use {BINARY} (JSON, base64 keys "
                       f"and values), {JSONFMT} (embedded JSON) or {ARROW}", status=406, error_code=40601)


def _accepts_anything(request: Request) -> bool:
    """No Accept, or a wildcard first: the client did not name a JSON type."""
    first = request.headers.get("accept", "").split(",", 1)[0].split(";", 1)[0].strip().lower()
    return first in ("", "*/*", "application/*")


async def typed_ipc(page: RangePage, schemas: Any, registry: Any, **typed: Any) -> tuple[bytes, dict[str, str]]:
    from service.fetch.typed import typed_ipc as build  # pyarrow and fastavro load on first use

    return await build(page, schemas, registry, **typed)


def _typed_request(media: str, fmt: str | None, value_schema_id: str | None, key_format: str | None,
                   key_schema_id: str | None) -> dict[str, Any] | None:
    """The typed-Arrow arguments of a range read (None: a plain read); 422 / 42206 for a combination that
    makes no sense (typed output is Arrow only: JSON answers already carry the bytes)."""
    if fmt is None:
        for name, v in (("value_schema_id", value_schema_id), ("key_format", key_format),
                        ("key_schema_id", key_schema_id)):
            if v is not None:
                raise GatewayError(f"{name} needs format (avro, protobuf or jsonschema)", status=422,
                                   error_code=42206)
        return None
    if media != ARROW:
        raise GatewayError(f"format={fmt} (typed columns) is answered as {ARROW} only; the Accept header names "
                           f"a JSON type", status=406, error_code=40601)
    if key_schema_id is not None and key_format is None:
        raise GatewayError("key_schema_id needs key_format", status=422, error_code=42206)
    return {"value_format": fmt, "value_schema": value_schema_id, "key_format": key_format,
            "key_schema": key_schema_id}


def _page_json(page: RangePage, media: str) -> tuple[bytes, int]:
    tp = TopicPartition(page.topic, page.partition)
    out = (render_json if media == JSONFMT else render_binary)([(tp, page.records)])
    body = b'{"topic":%s,"partition":%d,"offset":%d,"records":[%s],"next_offset":%d,"end_offset":%d,' \
           b'"high_watermark":%d,"last_stable_offset":%d,"log_start_offset":%d}' % (
               orjson.dumps(page.topic), page.partition, page.offset, b",".join(out.parts), page.next_offset,
               page.end_offset, page.high_watermark, page.last_stable_offset, page.log_start_offset)
    return body, out.payload


@router.get("/topics/{topic}/partitions/{partition}/records", response_class=Response,
            responses=RANGE_RESPONSES,
            summary="Read records of one partition in an offset range, without a consumer group (paged)",
            description="Stateless: no consumer group, nothing committed. Answers one page of the records in "
                        "[offset, end_offset), where end_offset is at most the last stable offset "
                        "(read_committed, the default: aborted transactions and control records left out) or "
                        "the high watermark (read_uncommitted). Offsets have gaps (compaction, transaction "
                        "markers, aborted records): read again from `next_offset` until `next_offset >= "
                        "end_offset` (also in `X-Next-Offset` / `X-End-Offset` and, for Arrow, in the schema "
                        "metadata). Accept: `application/vnd.kafka.binary.v2+json` (default; also for "
                        "`application/json` and a wildcard), `application/vnd.kafka.json.v2+json` (embedded JSON) or "
                        "`application/vnd.apache.arrow.stream` (Arrow IPC stream). An offset below the log "
                        "start or past the high watermark is 422 (42207) with `X-Log-Start-Offset` and "
                        "`X-High-Watermark`; an end_offset at or below offset is an empty range (answered "
                        "without asking the broker: the partition offsets are then -1). Typed Arrow: "
                        "`format=avro|protobuf|jsonschema` decodes Schema Registry framed values into a typed "
                        "`value` column, read with one reader schema (`value_schema_id`: an id or `latest`; "
                        "default the writer schema of the page's last record; other writers' records resolved "
                        "into it, undecodable ones as rows with `error` set); docs/typed-ranges.md.")
async def read_partition_records(
        request: Request, topic: str, partition: int,
        offset: Annotated[int, Query(ge=0, le=OFFSET_MAX, description="the first offset to read",
                                     json_schema_extra={"format": "int64"})],
        end_offset: Annotated[int | None, Query(
            ge=0, le=OFFSET_MAX, json_schema_extra={"format": "int64"},
            description="read below this offset (default: the LSO under read_committed, "
                                             "else the high watermark; never past either)")] = None,
        isolation_level: Annotated[Literal["read_committed", "read_uncommitted"], Query(
            description="read_committed: aborted transactions and records at or past the LSO left out")
        ] = "read_committed",
        max_bytes: Annotated[int, Query(ge=1, le=MAX_MAX_BYTES,
                                        description="about this many key + value bytes per page (at least "
                                                    "one record)")] = DEFAULT_MAX_BYTES,
        # -- typed Arrow: schema'd values (and keys) decoded into Arrow columns
        format: Annotated[Literal["avro", "protobuf", "jsonschema"] | None, Query(
            description="decode the values (Confluent wire format, schemas from the Schema Registry) into a "
                        "typed `value` column (Arrow only); see service/fetch/typed.py for the columns")] = None,
        value_schema_id: Annotated[str | None, Query(
            pattern=r"^(\d{1,10}|latest)$",
            description="with format: the reader schema of the value column (an id, or `latest` of the subject "
                        "`{topic}-value`); default: the writer schema of the page's last record")] = None,
        key_format: Annotated[Literal["avro", "protobuf", "jsonschema"] | None, Query(
            description="decode the keys too (Arrow only, with format); default: binary keys")] = None,
        key_schema_id: Annotated[str | None, Query(
            pattern=r"^(\d{1,10}|latest)$",
            description="with key_format: the keys' reader schema (an id, or `latest` of `{topic}-key`)")] = None,
        tenant: Tenant = Depends(current_tenant)) -> Response:
    tenant.require_topic(topic)
    media = _range_media(request)
    if format is not None and media == BINARY and _accepts_anything(request):
        media = ARROW  # typed columns are Arrow only: a client that accepts anything gets them
    typed = _typed_request(media, format, value_schema_id, key_format, key_schema_id)
    rt = runtime(request, tenant)
    await catalog(request, tenant).partition(topic, partition)  # 40401 / 40402 (cached metadata)
    iso = READ_COMMITTED if isolation_level == "read_committed" else READ_UNCOMMITTED
    extra: dict[str, str] = {}
    release: contextlib.AbstractAsyncContextManager[None] | None = None
    if end_offset is not None and end_offset <= offset:  # an empty range: nothing to ask the broker
        page = RangePage(topic, partition, offset, [], offset, end_offset)
        if typed:  # the typed schema alone (a reader learns the columns of a pinned or latest schema)
            body, extra = await typed_ipc(page, TenantSchemas(request.app.state.schemas, tenant),
                                          tenant.schema_registry, **typed)
            payload = 0
        else:
            body, payload = _page_json(page, media) if media != ARROW else (to_arrow_ipc(page), 0)
    else:
        # The page is charged to the process memory budget while it is read, decoded and rendered (the raw
        # fetch, the records, the answer: about 3 x max_bytes); no room within GATEWAY_MEMORY_WAIT_S: 503/50305.
        # The answer's bytes are charged again (kind "send") from the moment they are written until they left
        # the process (api/server/http.py held_send), and the range-read slot is held until then too.
        settings = request.app.state.settings
        slot = tenant.range_read_slot()
        async with request.app.state.gateway.budget.held(3 * max_bytes, "range", settings.memory_wait_s):
            await slot.__aenter__()
            try:
                page = await read_page(rt.client, TopicPartition(topic, partition), offset, end_offset,
                                       isolation_level=iso, max_bytes=max_bytes)
                if typed:
                    body, extra = await typed_ipc(page, TenantSchemas(request.app.state.schemas, tenant),
                                                      tenant.schema_registry, **typed)
                    payload = 0
                elif media == ARROW:
                    body = (await asyncio.to_thread(to_arrow_ipc, page) if len(page.records) > 50_000
                            else to_arrow_ipc(page))
                    payload = 0
                else:
                    body, payload = _page_json(page, media)
            except BaseException:
                await slot.__aexit__(None, None, None)
                raise
        release = slot
    headers = page.headers() | extra
    metrics = request.app.state.metrics
    if page.records:
        metrics.records.labels(tenant.id).inc(len(page.records))
        if payload:
            metrics.bytes.labels(tenant.id).inc(payload)
    if release is None:
        return Response(body, media_type=media, headers=headers)
    return SlotResponse(body, release=release, media_type=media, headers=headers)
