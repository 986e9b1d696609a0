"""ndjson / SSE streams of a share consumer instance (``GET .../records`` with ``Accept: application/x-ndjson``
or ``text/event-stream``): records as the instance acquires them, one line (ndjson) or one ``data:`` event (SSE)
per record, each with its ``delivery_count`` and ``lock_expires_at``, while the client acknowledges them
through ``POST .../acknowledgements`` on another connection.

A chunk is what one acquisition returned (at most ``max_records``); the next acquisition happens only after
the previous chunk was written, so a slow reader stops acquiring (records it has not read are not locked for
it). Implicit mode: the records of a chunk are accepted when the stream acquires the next chunk, which it does
as soon as the chunk was written to the connection (handed to the socket, not necessarily read by the client).
When the stream ends (the client left, an error, shutdown), records acquired but not written (an acquisition
in flight, a chunk whose write did not complete) are released: delivered again with ``delivery_count`` + 1.
Explicit mode: records written and not acknowledged stay held until their lock runs out (or are acknowledged,
on any connection, before then), whether or not the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request

from api.deps import SSE, gateway
from api.v2.streams import SSE_KEEP_ALIVE, stream_error_frame, stream_stop
from service.instances.share import ShareInstance
from service.schemas.registry import RegistryUnavailable
from service.share.consumer import ShareRecord
from service.tenants import Tenant

log = logging.getLogger(__name__)

#: how long one acquisition of a stream waits for records before an SSE keep-alive (and a disconnect check)
STREAM_POLL_S = 1.0


#: renders acquired records as JSON objects, one line each (api/share/routes.py: render_share_pieces)
Renderer = Callable[[Request, ShareInstance, Tenant, list[ShareRecord]], Awaitable[list[bytes]]]


async def settle_stream_end(inst: ShareInstance, acquiring: asyncio.Future[tuple[list[ShareRecord], int]] | None,
                            unwritten: list[ShareRecord]) -> None:
    """At the end of a stream: the acquisition in flight is let finish (cancelling a ShareFetch would lose the
    share session, and with it every lock the instance holds); what it acquired and the chunk whose write did
    not complete are released (delivered again with delivery_count + 1: the client did not get them), and so is
    the memory budget's charge for them. In implicit mode the last chunk written stays accepted (its next
    acquisition happened)."""
    try:
        if acquiring is not None:
            with contextlib.suppress(Exception):
                late, charge = await acquiring
                inst.release_charge(charge)
                unwritten = unwritten + late
        if not unwritten or inst.closed:
            return
        async with inst.poll_lock:
            release = inst.unhand(unwritten)
            if release:
                await inst.acknowledge(release, wait=False, linger=0.0)
    except Exception:
        log.exception("share consumer instance %s: releasing what its stream did not write failed", inst.name)


async def stream_share_records(request: Request, inst: ShareInstance, tenant: Tenant, media: str,
                               max_records: int, max_bytes: int | None, render: Renderer) -> AsyncIterator[bytes]:
    """The stream's body (the caller holds the tenant's stream slot): acquire, write, acquire again."""
    gw = gateway(request)
    inst.active_requests += 1
    acquiring: asyncio.Future[tuple[list[ShareRecord], int]] | None = None
    unwritten: list[ShareRecord] = []
    charge = 0  # the memory budget's charge for the chunk being rendered and written
    try:
        while not inst.closed:
            stop = await stream_stop(request, gw, media)
            if stop is not None:
                if stop:
                    yield stop
                break
            acquiring = asyncio.ensure_future(inst.poll(max_records, max_bytes, STREAM_POLL_S,
                                                        stop=lambda: gw.draining or inst.closed))
            recs, charge = await asyncio.shield(acquiring)
            acquiring = None
            inst.touch()
            if not recs:
                if media == SSE:
                    yield SSE_KEEP_ALIVE
                continue
            unwritten = recs
            pieces = await render(request, inst, tenant, recs)
            if media == SSE:
                yield b"".join(b"data: " + p + b"\n\n" for p in pieces)
            else:
                yield b"\n".join(pieces) + b"\n"
            unwritten = []
            inst.release_charge(charge)  # the chunk was sent
            charge = 0
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # in-band: the status line was sent
        code = 50307 if isinstance(exc, RegistryUnavailable) else 50002
        if code == 50002:
            log.exception("share consumer instance %s: the stream failed", inst.name)
        yield stream_error_frame(media, code, exc)
    finally:
        inst.release_charge(charge)
        inst.active_requests -= 1
        inst.touch()
        # (shielded: a stream ends by cancellation when its client leaves)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(asyncio.ensure_future(settle_stream_end(inst, acquiring, unwritten)))
