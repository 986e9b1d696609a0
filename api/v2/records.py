"""The records endpoint: a long-poll answered as one JSON array, or a stream (ndjson / SSE, see
:mod:`api.v2.streams`); the media type a request accepts."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from api.auth import current_tenant
from api.deps import (
    BINARY,
    ERRORS,
    INT32_MAX,
    JSONFMT,
    MEDIA_OF_FORMAT,
    NDJSON,
    SSE,
    V2,
    ErrorBody,
    gateway,
)
from api.v2.consumer_config import (
    poll_timeout_ms,
)
from api.v2.consumers import BASE, STREAM_CHUNK_RECORDS, instance
from api.v2.render import (
    ARRAY_SEP,
    Rendered,
    render_array,
    render_binary,
    render_json,
)
from api.v2.schema_records import render_schema, schema_resolver
from api.v2.streams import (
    SlotStreamingResponse,
    resume_codec,
    resume_from,
    skipped_text,
    stream_epoch,
    stream_records,
)
from service.consumer.resume import MAX_TOKEN_CHARS, Binding, ResumeTokenError
from service.consumer.subscription import (
    TopicPartition,
)
from service.errors import GatewayError
from service.instances.registry import (
    ConsumerInstance,
)
from service.tenants import Tenant

router = APIRouter(tags=["consumers"])


def accepted_media(request: Request, inst: ConsumerInstance) -> str:
    accept = request.headers.get("accept", "").lower()
    want = MEDIA_OF_FORMAT.get(inst.options.format, BINARY)
    for item in (a.split(";")[0].strip() for a in accept.split(",")):
        if item in (NDJSON, SSE):
            return item
        if item == want:
            return want
    if not accept or any(a.split(";")[0].strip() in ("*/*", "application/*", V2, "application/json")
                         for a in accept.split(",")):
        return want
    raise GatewayError(
        f"the Accept header {accept!r} does not match this instance's format; use {want} "
        f"(or {NDJSON} / {SSE} to stream)", status=406, error_code=40601)


@router.get(BASE + "/records", responses={
    200: {"description": "Records (JSON array), or a stream with Accept: application/x-ndjson or text/event-stream",
          "content": {BINARY: {}, JSONFMT: {}, NDJSON: {}, SSE: {}}},
    406: {"model": ErrorBody, "description": "Accept does not match the instance's format (40601)"}, **ERRORS},
    summary="Fetch records: long-poll until data arrives or the timeout passes")
async def records(request: Request, group: str, instance_id: str,
                  timeout: Annotated[int | None, Query(ge=0, le=INT32_MAX,
                                                       description="milliseconds to wait for data")] = None,
                  max_bytes: Annotated[int | None, Query(ge=1, le=INT32_MAX,
                                                         description="soft cap on key+value bytes")] = None,
                  max_records: Annotated[int | None, Query(ge=1, le=100000)] = None,
                  resume: Annotated[str | None, Query(
                      max_length=MAX_TOKEN_CHARS, description="streams: a resume token (an SSE event id, an ndjson "
                      "record's 'resume' field) to seek the instance to before streaming; a Last-Event-ID header "
                      "wins over it (docs/streams.md)")] = None,
                  tenant: Tenant = Depends(current_tenant)) -> Response:
    inst = await instance(request, tenant, group, instance_id)
    media = accepted_media(request, inst)
    if media in (NDJSON, SSE):
        # Last-Event-ID first: an EventSource reconnects with the URL it was given (maybe an older ?resume=)
        token = request.headers.get("last-event-id") or resume
        codec = resume_codec(request)
        binding = Binding(inst.tenant, inst.group, inst.instance_id)
        positions = None
        if token:
            try:
                positions = codec.decode(token, binding)
            except ResumeTokenError as exc:
                raise GatewayError(f"resume token refused: {exc}", status=400, error_code=40004) from None
        # A stream's chunks are only a transfer unit (one line or event per record either way): without
        # max_records / max.poll.records, take up to STREAM_CHUNK_RECORDS of what is buffered per chunk
        limit = max_records or inst.options.max_poll_records or STREAM_CHUNK_RECORDS
        render = render_binary if inst.options.format == "binary" else render_json
        resolver = schema_resolver(request, inst, tenant)  # 422/42211 or 503 before the stream starts
        # A stream holds one of the tenant's stream slots and one of its concurrent-poll slots for its whole
        # life, like a plain poll holds one while it waits: no slot is 429/42901 before the status line.
        slot = tenant.stream_slot()
        await slot.__aenter__()
        headers = {"cache-control": "no-cache"}
        skipped: list[TopicPartition] = []
        try:
            if positions is not None:
                skipped = await resume_from(gateway(request), inst, positions)
            epoch = stream_epoch(inst)
        except BaseException:
            await slot.__aexit__(None, None, None)
            raise
        if skipped:
            headers["x-resume-skipped"] = skipped_text(skipped)
        return SlotStreamingResponse(
            stream_records(request, inst, tenant, media, render, limit, max_bytes or inst.options.max_bytes,
                    codec, binding, skipped, epoch, resolver),
            release=slot, media_type=media, headers=headers)
    return Response(await poll_records(request, inst, tenant, timeout, max_bytes, max_records), media_type=media)


async def poll_records(request: Request, inst: ConsumerInstance, tenant: Tenant, timeout: int | None,
                       max_bytes: int | None, max_records: int | None) -> bytes:
    """One poll of ``GET .../records`` rendered as the instance's JSON array: the body of the route and
    of its lean twin (api/server/fastpath.py), which differ only in how they get here."""
    gw = gateway(request)
    wait = min(gw.max_poll_timeout, poll_timeout_ms(timeout, inst.options.request_timeout_ms) / 1000)
    limit = max_records or inst.options.max_poll_records or 500
    max_bytes = max_bytes or inst.options.max_bytes
    resolver = schema_resolver(request, inst, tenant)  # schema'd formats: 422/42211 or 503 before polling
    out: Rendered | None = None
    metrics = request.app.state.metrics
    inst.active_requests += 1
    started = time.monotonic()
    try:
        async with inst.lock, tenant.poll_slot():
            # [] at once when the gateway drains (SIGTERM), also for a poll already waiting
            # one request returns what is waiting across the assignment (the gateway's poll linger), or
            # with fetch.min.bytes set, once more than that many bytes are buffered (Confluent's rule)
            chunks = await gw.poll(inst, limit, max_bytes, wait, min_bytes=inst.options.fetch_min_bytes)
            if resolver is not None:
                out = await render_schema(inst, resolver, chunks, ARRAY_SEP, metrics)
    finally:
        inst.active_requests -= 1
        inst.touch()
    waited = time.monotonic() - started
    metrics.poll_wait.labels(tenant.id).observe(waited)
    if out is None:  # binary / json: the array rendered in one buffer (no per-chunk bytes, no join copy)
        body, count, payload = render_array(chunks, inst.options.format != "binary")
    else:
        body, count, payload = out.array(), out.count, out.payload
    if count:
        metrics.records.labels(tenant.id).inc(count)
        metrics.bytes.labels(tenant.id).inc(payload)
    return body


