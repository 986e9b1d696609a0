"""ndjson / SSE streams of a consumer instance: the slot a stream holds, resume tokens in the answer, and
the loop that polls and writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import StreamingResponse

from api.deps import (
    SSE,
    gateway,
)
from api.kafka_texts import client_text
from api.v2.render import (
    NDJSON_SEP,
    render_ndjson,
)
from api.v2.schema_records import render_schema
from service.client.errors import KafkaError
from service.consumer.resume import Binding, ResumeCodec, TokenPrefix, derive_key
from service.consumer.subscription import (
    TopicPartition,
)
from service.instances.registry import (
    SHUTDOWN_MESSAGE,
    ConsumerInstance,
    Gateway,
    ShuttingDown,
)
from service.protocol.records import InflatedSizeError
from service.schemas.formats import SchemaResolver
from service.schemas.registry import RegistryUnavailable
from service.tenants import Tenant

log = logging.getLogger(__name__)


class SlotStreamingResponse(StreamingResponse):
    """A stream that gives back its poll slot when it ends, however it ends (also if the client left
    before the body started)."""

    def __init__(self, content: AsyncIterator[bytes], release: contextlib.AbstractAsyncContextManager[None],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release.__aexit__(None, None, None)


#: an SSE comment sent when a stream's poll found nothing (keeps proxies from timing the connection out)
SSE_KEEP_ALIVE = b": keep-alive\n\n"


def stream_frame(media: str, event: str, doc: dict[str, Any]) -> bytes:
    """An in-band message of a stream whose status line was sent: an SSE event ``event``, or an ndjson line."""
    msg = orjson.dumps(doc)
    return (b"event: " + event.encode() + b"\ndata: " + msg + b"\n\n") if media == SSE else msg + b"\n"


def stream_error_frame(media: str, code: int, exc: BaseException) -> bytes:
    """The in-band error that ends a stream (no broker text or address in it)."""
    text = client_text(exc) if isinstance(exc, KafkaError) else str(exc)
    return stream_frame(media, "error", {"error_code": code, "message": text})


async def stream_stop(request: Request, gw: Gateway, media: str) -> bytes | None:
    """Checked before each poll of a stream (consumer and share instances): None to go on; else the stream ends,
    after the returned frame -- on SIGTERM the shutdown message (the client commits or acknowledges what it got
    and reconnects, rather than being cut later; the listener stays open for a short drain window), b"" when the
    client left."""
    if gw.draining:
        return stream_frame(media, "shutdown", {"error_code": ShuttingDown.error_code, "message": SHUTDOWN_MESSAGE})
    if await request.is_disconnected():
        return b""
    return None


RESUME_ASSIGNMENT_WAIT_S = 30.0  # a resume waits at most this long (and the poll timeout cap) for an assignment
_SKIPPED_LISTED = 50  # partitions named in X-Resume-Skipped / the SSE comment before "+N more"


def stream_epoch(inst: ConsumerInstance) -> int:
    return inst.stream_epoch


def resume_codec(request: Request) -> ResumeCodec:
    """The process's token codec: keyed from GATEWAY_RESUME_KEY, else GATEWAY_PEER_TOKEN (the same on every
    replica, across restarts), else a random key of this process."""
    codec: ResumeCodec | None = getattr(request.app.state, "resume_codec", None)
    if codec is None:
        settings = request.app.state.settings
        secret = settings.resume_key or settings.peer_token
        codec = ResumeCodec(derive_key(secret.get_secret_value() if secret is not None else None))
        request.app.state.resume_codec = codec
    return codec


async def resume_from(gw: Gateway, inst: ConsumerInstance,
                  positions: dict[TopicPartition, int | None]) -> list[TopicPartition]:
    """Seek the instance to a token's positions; returns the token's partitions it does not own (skipped).

    A group-managed instance without partitions yet (just subscribed, re-created, rebalancing) is given up to
    the poll timeout cap to get them first. A partition the token has as unresolved goes back to its
    committed offset, else to the instance's auto.offset.reset."""
    consumer = inst.consumer
    async with inst.lock:
        # an older stream of the instance (a connection cut without the server noticing yet) stops before
        # its next poll: it must not take records past the token into a socket nobody reads
        inst.stream_epoch += 1
        if not consumer.assignment() and consumer.subs.is_group_managed:
            await consumer.wait_for_assignment(min(gw.max_poll_timeout, RESUME_ASSIGNMENT_WAIT_S))
        assigned = set(consumer.assignment())
        skipped = [tp for tp in positions if tp not in assigned]
        unresolved = [tp for tp, off in positions.items() if off is None and tp in assigned]
        for tp, off in positions.items():
            if off is not None and tp in assigned:
                consumer.seek(tp, off)
        if unresolved:
            committed = await consumer.committed(unresolved) if consumer.coordinator is not None else {}
            for tp in unresolved:
                om = committed.get(tp)
                if om is not None and om.offset >= 0:
                    consumer.seek(tp, om.offset)
                elif inst.options.auto_offset_reset == "earliest":
                    consumer.seek_to_beginning([tp])
                elif inst.options.auto_offset_reset == "latest":
                    consumer.seek_to_end([tp])
    if skipped:
        log.info("stream resume: %d partition(s) of the token not assigned to the instance, skipped: %s",
                 len(skipped), skipped_text(skipped))
    return skipped


def skipped_text(skipped: list[TopicPartition]) -> str:
    names = ",".join(f"{tp.topic}:{tp.partition}" for tp in sorted(skipped)[:_SKIPPED_LISTED])
    more = len(skipped) - _SKIPPED_LISTED
    return names + (f",+{more} more" if more > 0 else "")


def token_prefix(codec: ResumeCodec, binding: Binding, inst: ConsumerInstance,
                  chunks: list[tuple[TopicPartition, list[Any]]]) -> TokenPrefix | None:
    """The token builder of one poll: the positions of every assigned partition after it, with the polled
    partitions set back to their first record (the chunks, applied in order, bring them forward)."""
    subs = inst.consumer.subs
    start: dict[TopicPartition, int | None] = {}
    for tp in subs.assigned():
        start[tp] = subs.position(tp)
    for tp, recs in reversed(chunks):
        start[tp] = recs[0].offset
    return codec.prefix(binding, start, [(tp, recs[0].offset, recs[-1].offset + 1) for tp, recs in chunks])


def sse_with_ids(out: Any, chunks: list[tuple[TopicPartition, list[Any]]], prefix: TokenPrefix | None) -> bytes:
    """One SSE event per record, each with the resume token after it as its id (rendered with the ndjson
    separator: a record is one line)."""
    pieces: list[bytes] = []
    for k, ((_, recs), part) in enumerate(zip(chunks, out.parts, strict=True)):
        lines = part.split(b"\n")
        # no token (too large): events without id, so a reconnect resumes from the last one (redelivers)
        if prefix is None or len(lines) != len(recs):  # (the renderers keep a record on one line)
            pieces += (b"data: ", part.replace(b"\n", b"\n\ndata: "), b"\n\n")
            continue
        token = prefix.token
        for rec, line in zip(recs, lines, strict=True):
            pieces += (b"data: ", line, b"\nid: ", token(k, rec.offset + 1), b"\n\n")
    return b"".join(pieces)


def ndjson_with_token(out: Any, chunks: list[tuple[TopicPartition, list[Any]]],
                       prefix: TokenPrefix | None) -> bytes:
    """The poll's records, one per line; the last one carries ``"resume"``: the token after it."""
    if prefix is None:
        return out.ndjson()
    pieces: list[bytes | memoryview] = []
    for i, part in enumerate(out.parts):
        if i:
            pieces.append(b"\n")
        pieces.append(part)
    last = pieces[-1]
    pieces[-1] = memoryview(last)[:-1]  # the last record's closing brace
    pieces += (b',"resume":"', prefix.token(len(chunks) - 1, chunks[-1][1][-1].offset + 1), b'"}\n')
    return b"".join(pieces)


async def stream_records(request: Request, inst: ConsumerInstance, tenant: Tenant, media: str, render: Any,
                  limit: int, max_bytes: int | None, codec: ResumeCodec, binding: Binding,
                  skipped: list[TopicPartition], epoch: int,
                  resolver: SchemaResolver | None = None) -> AsyncIterator[bytes]:
    """Records as they arrive. Backpressure: the next poll happens only after the previous chunk was
    written, so a slow reader stops the polling (and, once the prefetch buffer is full, fetching) —
    never the heartbeats. Every SSE event has the resume token after its record as id; in ndjson the last
    record of each write has it as "resume" (docs/streams.md)."""
    inst.active_requests += 1
    metrics = request.app.state.metrics
    gw = gateway(request)
    try:
        if skipped and media == SSE:
            yield b": resume skipped (not assigned to this instance) " + skipped_text(skipped).encode() + b"\n\n"
        while not inst.closed:
            stop = await stream_stop(request, gw, media)
            if stop is not None:
                if stop:
                    yield stop
                break
            started = time.monotonic()
            async with inst.lock:
                if stream_epoch(inst) != epoch:  # a resume took the instance over (see resume_from)
                    break
                chunks = await gw.poll(inst, limit, max_bytes, 1.0, linger=0.0)  # chunks as they come
                chunks = [c for c in chunks if c[1]]
                # schema'd: a registry outage gives the records back and ends the stream in-band (50307)
                out = await render_schema(inst, resolver, chunks, NDJSON_SEP, metrics) \
                    if resolver is not None and chunks else None
                # positions read with the records, before another request of the instance can move them
                prefix = token_prefix(codec, binding, inst, chunks) if chunks else None
            inst.touch()
            if not chunks:
                if media == SSE:
                    yield SSE_KEEP_ALIVE
                continue
            metrics.poll_wait.labels(tenant.id).observe(time.monotonic() - started)
            if out is None and media != SSE:  # binary / json ndjson: one buffer, token spliced in
                resume = prefix.token(len(chunks) - 1, chunks[-1][1][-1].offset + 1) if prefix is not None else None
                data, count, payload = render_ndjson(chunks, inst.options.format != "binary", resume)
            else:
                if out is None:
                    out = render(chunks, NDJSON_SEP)
                if media == SSE:
                    data = sse_with_ids(out, chunks, prefix)
                else:
                    data = ndjson_with_token(out, chunks, prefix)
                count, payload = out.count, out.payload
            metrics.records.labels(tenant.id).inc(count)
            metrics.bytes.labels(tenant.id).inc(payload)
            yield data
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # report in-band: the status line was already sent
        # a decompression bomb: as in a poll; a registry outage: its retryable code
        code = 42209 if isinstance(exc, InflatedSizeError) else 50307 if isinstance(exc, RegistryUnavailable) \
            else 50002
        yield stream_error_frame(media, code, exc)
    finally:
        inst.active_requests -= 1
        inst.touch()
