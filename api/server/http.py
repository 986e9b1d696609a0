"""Request-head limits in front of uvicorn's HTTP/1.1 parsers (httptools and h11).

uvicorn caps neither the size nor the number of request header lines for httptools, never times out a
request head that trickles in, and its ``limit_concurrency`` answers in plain text. These protocol
subclasses count the bytes of each request head *before* the parser sees them, so an oversized head is
answered 431 (JSON) after at most one socket read past the cap and never reaches the app, the lean paths
or forwarding; a head that is not complete within the header timeout is answered 408 (or, if nothing
arrived yet, the connection is just closed); a connection beyond the connection limit is answered 503
once its request head is in. Every refusal closes the connection after a short linger that drains (and
discards) what the client still sends, so the client reads the answer instead of a reset.

:class:`HeadScanner` is the sans-io part (counts and verdicts over chunks); the protocol classes only
decide when a request head begins and ends (parser callbacks for httptools, h11's connection state).

On the output side (:class:`OutputLimits`): each connection's write-buffer high-water mark is
``GATEWAY_HTTP_MAX_UNSENT_BYTES`` (uvicorn's writers wait above it); a connection above it for
``GATEWAY_HTTP_SEND_TIMEOUT_S``, or closed with unsent bytes for that long, is aborted (its client stopped
reading); :func:`held_send` keeps a large answer in the memory budget until it left the process, and
:class:`LeanCycle` completes a request only once its answer drained.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import h11
import orjson
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

#: refusal → (status, reason phrase, error code, message)
TOO_LARGE = (431, b"Request Header Fields Too Large", 43101,
             "request header section too large (over {max_bytes} bytes)")
TOO_MANY = (431, b"Request Header Fields Too Large", 43101, "too many request header fields (over {max_count})")
HEAD_TIMEOUT = (408, b"Request Timeout", 40801, "the request head was not received within {timeout:g} s")
OVER_LIMIT = (503, b"Service Unavailable", 50304, "too many connections (over {max_connections}): retry later")
#: after a refusal, discard what the client still sends for at most this long, then close
LINGER_S = 2.0


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_bytes: int = 16 * 1024  # request line + header lines + the blank line
    max_count: int = 100  # header fields
    timeout_s: float = 10.0  # from the first byte of a request head (or the connection) to its end
    max_connections: int = 0  # 0: no limit


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """What a connection may hold of answers its client has not read yet (the output side of the limits)."""

    #: the transport's high-water mark: writers (uvicorn's ``send``, :func:`held_send`) wait above it
    max_unsent_bytes: int = 1024 * 1024
    #: a connection above its mark this long without draining below it (or closed with unsent bytes this long) is
    #: aborted: its client stopped reading
    send_timeout_s: float = 30.0


class HeadScanner:
    """Bytes and lines of one request head, fed chunk by chunk before the parser sees them.

    ``feed`` returns None (fine so far) or the refusal (``TOO_LARGE`` / ``TOO_MANY``). It finds the end
    of the head (the first empty line) itself, so body bytes in the same chunk are never counted; after
    the end, the next ``feed`` starts a new head (the caller feeds only while its parser is in a head).
    """

    __slots__ = ("_tail", "ended", "limits", "lines", "size")

    def __init__(self, limits: HeadLimits) -> None:
        self.limits = limits
        self.size = 0
        self.lines = 0
        self.ended = False
        self._tail = b""

    def reset(self) -> None:
        self.size = self.lines = 0
        self.ended = False
        self._tail = b""

    def feed(self, data: bytes) -> tuple[int, bytes, int, str] | None:
        if self.ended:
            self.reset()
        tail = self._tail
        buf = tail + data if tail else data
        # the head ends at an empty line: "\r\n\r\n" (or a bare "\n\n", which a lenient parser may accept)
        end = buf.find(b"\n\r\n")
        # a bare "\n\n" counts only before that (never scan the body that follows the head in the same read)
        lf = buf.find(b"\n\n", 0, end + 1) if end >= 0 else buf.find(b"\n\n")
        if lf >= 0 and (end < 0 or lf < end):
            end = lf - 1
        if end >= 0:
            used = end + 3 - len(tail)  # bytes of ``data`` that belong to the head
            self.ended = True
        else:
            used = len(data)
            self._tail = buf[-2:]
        self.size += used
        self.lines += data.count(b"\n", 0, used)
        if self.size > self.limits.max_bytes:
            return TOO_LARGE
        # request line + fields + the blank line; a head still arriving counts the fields so far
        if self.lines - 1 - (1 if self.ended else 0) > self.limits.max_count:
            return TOO_MANY
        return None


def error_bytes(refusal: tuple[int, bytes, int, str], limits: HeadLimits) -> bytes:
    status, phrase, code, template = refusal
    body = orjson.dumps({"error_code": code, "message": template.format(
        max_bytes=limits.max_bytes, max_count=limits.max_count, timeout=limits.timeout_s,
        max_connections=limits.max_connections)})
    return b"".join((b"HTTP/1.1 %d %s\r\n" % (status, phrase), b"content-type: application/vnd.kafka.v2+json\r\n",
                     b"content-length: %d\r\n" % len(body), b"retry-after: 1\r\n" if status == 503 else b"",
                     b"connection: close\r\n\r\n", body))


#: a write at most this long (a response's status line and headers) may wait for the next write of the same
#: event-loop iteration (its body) so that both leave in one system call
HOLD_MAX_BYTES = 8192


class CoalescingTransport:
    """The connection's transport for uvicorn: uvicorn writes a response's head and its body with two
    ``write`` calls, two system calls (strace); a short write is held until the next write of the same loop
    iteration and both go out with one ``writelines``, or alone at the end of the iteration. Writes keep their
    order; closing, EOF and aborts flush (or drop, for abort) what is held first. Everything else is the
    transport's own."""

    __slots__ = ("_held", "_loop", "_send_timeout_s", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 send_timeout_s: float = OutputLimits().send_timeout_s) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._send_timeout_s = send_timeout_s

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            held.append(data)  # type: ignore[arg-type]  # written now: a buffer may be reused after return
            self._transport.writelines(held)
        elif len(data) <= HOLD_MAX_BYTES and data:
            self._held = [bytes(data)]  # held past the return: never a view of a buffer the caller reuses
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.flush()
        self._transport.writelines(list_of_data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():  # the peer may have gone since the write: nothing to send to
                self._transport.write(held[0])

    def close(self) -> None:
        self.flush()
        transport = self._transport
        transport.close()
        if transport.get_write_buffer_size():
            # a closing transport waits for its unsent bytes: a client that never reads them would keep the
            # connection (and the bytes) forever
            self._loop.call_later(self._send_timeout_s, self._abort_if_open, transport)

    @staticmethod
    def _abort_if_open(transport: asyncio.Transport) -> None:
        if transport.get_write_buffer_size():
            transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = self._held
        return self._transport.get_write_buffer_size() + (len(held[0]) if held else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


#: an answer body shorter than this is passed on as written by :func:`held_send` (no charge, no wait): the
#: connection's high-water mark bounds what a few of them hold
HELD_MIN_BYTES = 64 * 1024
_DRAIN_WAIT = {"type": "http.response.body", "body": b"", "more_body": True}
_BODY_END = {"type": "http.response.body", "body": b"", "more_body": False}

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def held_send(send: Send, budget: Any, chunk_bytes: int) -> Send:
    """An ASGI ``send`` that holds a large answer body in the memory budget (kind ``send``) until it left the
    process. On uvicorn's own cycle (``send`` bound to an object with its ``flow`` control), a body of at most
    ``chunk_bytes`` (the connection's high-water mark) is passed on as written, in its one write, and the charge
    is held after it while the connection is over its mark, until it drained below the low-water mark (or was
    lost): no extra messages on the common path. Otherwise (a larger body, another server) the body is written in
    pieces of at most ``chunk_bytes``, each after the connection drained below the mark (uvicorn's ``send`` waits
    for that), then an empty piece waits for the last to drain, and only then is the charge released and the
    body (or the stream's chunk) done. Either way a client that does not read keeps its call unfinished until
    the send timeout drops the connection (:meth:`_HeadGuard.pause_writing`). The charge is forced (the bytes
    exist already): later requests wait for room while it is held."""
    cycle = getattr(send, "__self__", None)
    flow = getattr(cycle, "flow", None)
    if flow is not None and not hasattr(flow, "write_paused"):
        flow = None

    async def send_held(message: MutableMapping[str, Any]) -> None:
        if message["type"] != "http.response.body":
            await send(message)
            return
        body = message.get("body", b"")
        n = len(body)
        if n < HELD_MIN_BYTES:
            await send(message)
            return
        if budget is not None:
            budget.add(n, "send")
        try:
            if flow is not None and n <= chunk_bytes:
                await send(message)
                if flow.write_paused and not getattr(cycle, "disconnected", False):
                    await flow.drain()  # set again once below the low-water mark, or when the connection is lost
                return
            if n <= chunk_bytes:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            else:
                view = memoryview(body)
                for i in range(0, n, chunk_bytes):
                    await send({"type": "http.response.body", "body": view[i:i + chunk_bytes], "more_body": True})
            await send(_DRAIN_WAIT)  # returns once the connection is below its mark again (or was lost)
        finally:
            if budget is not None:
                budget.release(n, "send")
        if not message.get("more_body", False):
            await send(_BODY_END)

    return send_held


class _HeadGuard:
    """The parser-independent part, mixed into both protocol classes (before uvicorn's class in the MRO)."""

    head_limits: HeadLimits = HeadLimits()
    output_limits: OutputLimits = OutputLimits()
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    cycle: Any  # uvicorn's RequestResponseCycle of the request being answered (or None)

    def _busy(self) -> bool:
        """A response is under way (a pipelined head arrives meanwhile): no status line may be written."""
        return self.cycle is not None and not self.cycle.response_complete

    def _guard_init(self) -> None:
        self._scanner = HeadScanner(self.head_limits)
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        #: called once the unsent output drained below the low-water mark, or the connection was lost
        self._on_drained: list[Callable[[], None]] = []
        self._refused = False
        self._over_limit = False

    def _guard_connection_made(self) -> None:
        # uvicorn took the transport in its connection_made (and handed it to its flow control, which only
        # pauses and resumes reading); from here on every write goes through the coalescing wrapper
        output = self.output_limits
        transport = self.transport
        # uvicorn's send waits while the transport holds more than this unsent (its flow control)
        transport.set_write_buffer_limits(high=output.max_unsent_bytes)
        self.transport = CoalescingTransport(transport, self.loop, output.send_timeout_s)  # type: ignore[assignment]
        limit = self.head_limits.max_connections
        self._over_limit = bool(limit) and len(self.connections) > limit
        self._arm_head_timer()  # a connection that never sends a byte is closed too

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_limits.timeout_s, self._head_timed_out)

    def _head_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing() or self._busy():
            return  # a pipelined head during a long response: the next chunk re-arms the timer
        if self._scanner.size or self._scanner.ended:
            self._refuse(HEAD_TIMEOUT)
        else:  # nothing of a request arrived: close quietly, like an idle keep-alive connection
            self.transport.close()

    def _guard_feed(self, data: bytes) -> bool:
        """Count a chunk of a request head; False when the connection was refused (do not parse it)."""
        if self._refused:
            return False
        refusal = self._scanner.feed(data)
        if refusal is not None:
            self._refuse(refusal)
            return False
        if self._over_limit and self._scanner.ended:
            self._refuse(OVER_LIMIT)
            return False
        return True

    def _refuse(self, refusal: tuple[int, bytes, int, str]) -> None:
        self._refused = True
        self._head_complete()
        transport = self.transport
        if self._busy():  # an oversized pipelined head during a response: no room for a status line
            transport.close()
            return
        transport.write(error_bytes(refusal, self.head_limits))
        if transport.can_write_eof():
            transport.write_eof()
        # keep reading (and discarding) for a moment so the client reads the answer rather than a reset
        self.loop.call_later(LINGER_S, transport.close)

    def _guard_connection_lost(self) -> None:
        self._head_complete()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self._run_drained()

    # -- output: answers the client has not read yet ----------------------------------------------------------
    def pause_writing(self) -> None:
        """The transport holds more than ``max_unsent_bytes`` unsent: writers wait (uvicorn's flow control), and
        the client has ``send_timeout_s`` to read it below the low-water mark."""
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.output_limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self._run_drained()

    def _send_timed_out(self) -> None:
        """The client did not read its answer within the send timeout: drop the connection and what it holds
        (uvicorn's connection_lost then wakes the writers waiting for it)."""
        self._send_timer = None
        self.transport.abort()

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the connection's unsent output is below its high-water mark (now, when it is
        already) and then drained below the low-water mark, or the connection is lost."""
        if self.flow.write_paused and not self.transport.is_closing():  # type: ignore[attr-defined]
            self._on_drained.append(callback)
        else:
            callback()

    def _run_drained(self) -> None:
        callbacks = self._on_drained
        if callbacks:
            self._on_drained = []
            for cb in callbacks:
                cb()


#: uvicorn's status lines (filled when its httptools protocol is available, the only one LeanCycle serves)
_STATUS_LINE: dict[int, bytes] = {}


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body
#: uvicorn's answer to an exception in the application
INTERNAL_ERROR: Answer = (500, [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
                                 (b"connection", b"close")], b"Internal Server Error")


class LeanCall(Protocol):
    """What an app's ``lean_begin(scope)`` returns for a request it serves at the protocol level (api/server/fastpath.py
    ``LeanProduceCall``): the answer to the whole body, or notice that the client went away first."""

    def answer_now(self, body: bytes, respond: Callable[[int, list[tuple[bytes, bytes]], bytes], None]) \
            -> Awaitable[Answer] | None:
        """None: ``respond(status, headers, body)`` is called once, now or later; else the answer to await."""

    def abandon(self) -> None: ...

    # optional: ``sent()`` is called once the answer left the process (drained below the connection's low-water
    # mark) or could not be written (the client went away): what the call holds for the answer is released then


class LeanCycle:
    """A request served without uvicorn's ASGI cycle (the produce hot path; ~20% of the gateway's CPU
    per produce request went to the request/response cycle, ASGI messages and the app's dispatch). The app's
    ``lean_begin(scope)`` takes a request once its head is parsed (httptools only); the body is collected and
    handed to the call when complete, which answers through :meth:`respond` without a task when it can (its
    records queued at once, answered when acknowledged) or returns an awaitable run in a task tracked like
    uvicorn's; the answer goes out in one write with uvicorn's default headers (``date``, ``server``). It has
    the attributes uvicorn's protocol reads of its cycle (``response_complete``, ``disconnected``,
    ``keep_alive``, ``message_event``), so keep-alive, pipelining (a request arriving meanwhile waits in
    uvicorn's queue), shutdown and lost connections behave as for any request."""

    __slots__ = ("call", "chunks", "disconnected", "keep_alive", "more_body", "pending", "proto",
                 "response_complete", "tasks")

    def __init__(self, proto: Any, call: LeanCall, keep_alive: bool) -> None:
        self.proto = proto
        self.call = call
        self.chunks: list[bytes] = []
        self.more_body = True
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False
        self.pending: Awaitable[Answer] | None = None
        #: uvicorn's set of request tasks while the answer waits for the records' acknowledgement (no task of
        #: its own): the shutdown drain's quiet check and uvicorn's concurrency limit count it like a task
        self.tasks: set[Any] | None = None

    @property
    def message_event(self) -> LeanCycle:
        """uvicorn's connection_lost calls ``cycle.message_event.set()`` (a property: no reference cycle)."""
        return self

    def set(self) -> None:
        """The connection was lost (uvicorn set ``disconnected`` first)."""
        if self.disconnected and self.more_body:
            self.more_body = False
            self.proto = None  # no reference cycle with the protocol (it holds this cycle)
            self.call.abandon()  # the body never completed: nothing produced, nothing to answer

    def start(self) -> bool:
        """The body is complete: answer it; True when the answer must be awaited in a task (:meth:`run_asgi`)."""
        self.more_body = False
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        try:
            self.pending = self.call.answer_now(body, self.respond)
        except Exception as exc:  # the call answers every error it knows: this is a bug
            self.proto.logger.error("Exception in ASGI application", exc_info=exc)
            self.respond(*INTERNAL_ERROR)
            return False
        if self.pending is not None:
            return True
        if self.proto is not None:  # not answered yet: respond() comes from the producer's callback
            self.tasks = self.proto.tasks
            self.tasks.add(self)
        return False

    def cancel(self, msg: Any = None) -> bool:
        """uvicorn cancels its tasks when the graceful shutdown times out: nothing to cancel here (the records
        are queued; the answer is written if the connection is still there)."""
        return False

    async def run_asgi(self, app: Any) -> None:
        """The awaited answer (started by ``on_message_complete`` through uvicorn's task tracking)."""
        pending, self.pending = self.pending, None
        try:
            assert pending is not None
            answer = await pending
        except Exception as exc:  # the app's handlers answer every error they know: this is a bug
            if self.proto is not None:
                self.proto.logger.error("Exception in ASGI application", exc_info=exc)
            answer = INTERNAL_ERROR
        self.respond(*answer)

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> None:
        """Write the answer (nothing once the client went away) and finish the request once it left the process:
        while the connection holds more unsent bytes than its mark the request is not complete (a pipelined
        request waits, the call keeps its memory charge) until they drain or the send timeout drops the
        connection."""
        proto, self.proto = self.proto, None  # no reference cycle with the protocol once answered
        if self.tasks is not None:
            self.tasks.discard(self)
            self.tasks = None
        if self.disconnected or proto is None:
            self._sent()
            return
        head = [_STATUS_LINE[status]]
        for name, value in proto.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        for name, value in headers:
            if name == b"connection" and b"close" in value.lower():
                self.keep_alive = False
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not any(name == b"connection" for name, _ in headers):
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        proto.transport.writelines((b"".join(head), content))
        if proto.flow.write_paused:
            proto.when_drained(lambda: self._complete(proto))
        else:
            self._complete(proto)

    def _complete(self, proto: Any) -> None:
        self.response_complete = True
        if not self.keep_alive:  # (also set by a shutdown that began while the answer drained)
            proto.transport.close()
        proto.on_response_complete()
        self._sent()

    def _sent(self) -> None:
        sent = getattr(self.call, "sent", None)
        if sent is not None:
            sent()


def _httptools_class() -> type[asyncio.Protocol] | None:
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    import urllib.parse

    from uvicorn.protocols.http.httptools_impl import STATUS_LINE
    _STATUS_LINE.update(STATUS_LINE)

    class LimitedHttpToolsProtocol(_HeadGuard, HttpToolsProtocol):
        """httptools: a head begins at connection start and after each message; on_headers_complete ends it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._guard_init()
            self._in_head = True
            self._head_open = False  # between the parser's message begin and its headers complete

        def connection_lost(self, exc: Exception | None) -> None:
            self._guard_connection_lost()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                if not self._guard_feed(data):
                    return
            elif self._refused:
                return
            super().data_received(data)
            if self._head_open and self._head_timer is None:
                # a head began and is not complete yet: it has the header timeout to arrive (a head that
                # arrives whole in one read, the usual case, never costs a timer)
                self._arm_head_timer()

        def on_message_begin(self) -> None:
            self._head_open = True
            super().on_message_begin()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._guard_connection_made()
            self._lean_begin = getattr(self.app, "lean_begin", None)

        def on_headers_complete(self) -> None:
            self._in_head = self._head_open = False
            self._head_complete()
            lean = self._lean_begin
            if lean is not None and self.url.startswith(b"/topics/") and self._lean_start(lean):
                return
            super().on_headers_complete()

        def _lean_start(self, lean: Any) -> bool:
            """Hand a produce request to the app's protocol-level path (:class:`LeanCycle`) when it takes it;
            anything else (other methods, HTTP/1.0, upgrades, a response still under way or a full write
            buffer: pipelining and back-pressure stay uvicorn's) goes the usual way."""
            parser = self.parser
            cycle = self.cycle
            if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade() \
                    or (cycle is not None and not cycle.response_complete) or self.flow.write_paused:
                return False
            scope = self.scope
            parsed = httptools.parse_url(self.url)
            path = parsed.path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            scope["method"] = "POST"
            scope["path"] = self.root_path + path
            scope["raw_path"] = self.root_path.encode("ascii") + parsed.path
            scope["query_string"] = parsed.query or b""
            call = lean(scope)
            if call is None:
                return False
            self.cycle = LeanCycle(self, call, parser.should_keep_alive())
            return True

        def on_body(self, body: bytes) -> None:
            cycle = self.cycle
            if type(cycle) is LeanCycle:
                cycle.chunks.append(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_head = True
            self._scanner.ended = True  # the next chunk starts a new head
            cycle = self.cycle
            if type(cycle) is LeanCycle:
                if cycle.start():
                    self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]
            else:
                super().on_message_complete()

    return LimitedHttpToolsProtocol


class LimitedH11Protocol(_HeadGuard, H11Protocol):
    """h11: the peer is sending a head while h11 is IDLE (nothing parsed) or DONE (a pipelined request
    waits while we answer the previous one); it parses the head only once complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init()
        if self.config.h11_max_incomplete_event_size is None:  # h11's own 16 KiB must not answer 400 first
            self.conn = h11.Connection(h11.SERVER, max(DEFAULT_MAX_INCOMPLETE_EVENT_SIZE,
                                                       self.head_limits.max_bytes + 4096))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._guard_connection_made()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_connection_lost()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        state = self.conn.their_state
        if state is h11.IDLE or state is h11.DONE:
            if state is h11.IDLE:
                self._arm_head_timer()
            if not self._guard_feed(data):
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_complete()


LimitedHttpToolsProtocol = _httptools_class()


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The listener's TLS context (GATEWAY_TLS_CERT_FILE / GATEWAY_TLS_KEY_FILE): TLS 1.2 or newer, no client
    certificate asked for (clients authenticate with API keys or JWTs, replicas with the peer token).
    Raises OSError / ssl.SSLError when the files cannot be read or do not match."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def tls_problem(certfile: str | None, keyfile: str | None) -> str | None:
    """Why these listener TLS settings cannot start (one without the other, unreadable or mismatched files),
    or None (TLS off, or the context loads)."""
    if not certfile and not keyfile:
        return None
    if not certfile or not keyfile:
        given, missing = ("GATEWAY_TLS_CERT_FILE", "GATEWAY_TLS_KEY_FILE") if certfile else (
            "GATEWAY_TLS_KEY_FILE", "GATEWAY_TLS_CERT_FILE")
        return f"{given} is set but {missing} is not: the HTTPS listener needs both (PEM files)"
    for name, path in (("GATEWAY_TLS_CERT_FILE", certfile), ("GATEWAY_TLS_KEY_FILE", keyfile)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            return f"{name} {path!r} cannot be read: {exc.strerror or exc}"
    try:
        server_ssl_context(certfile, keyfile)
    except (OSError, ssl.SSLError, ValueError) as exc:
        return (f"GATEWAY_TLS_CERT_FILE {certfile!r} / GATEWAY_TLS_KEY_FILE {keyfile!r} do not load as a PEM "
                f"certificate chain and its unencrypted private key: {exc}")
    return None


def protocol_class(parser: str, limits: HeadLimits, output: OutputLimits | None = None) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http=`` with these limits."""
    base = LimitedHttpToolsProtocol if parser == "httptools" else LimitedH11Protocol
    if base is None:
        raise SystemExit("GATEWAY_HTTP_PARSER=httptools but httptools is not installed")
    return type(base.__name__, (base,), {"head_limits": limits, "output_limits": output or OutputLimits()})
