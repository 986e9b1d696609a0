"""The forwarding client: :class:`UpstreamPool`, keep-alive HTTP/1.1 connections to the peers, parsed with
httptools (as uvicorn does). The hot path of forwarding: httpx (used for probes and lookups) costs about 4x
more CPU per forwarded request (see docs/routing.md)."""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 2.0


class UpstreamConnectError(Exception):
    """The peer could not be connected to: nothing was sent."""


class UpstreamError(Exception):
    """The peer failed (closed, timed out, answered garbage) after the request was sent."""


class _Upstream(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to a peer: the request written in one piece, the response parsed
    by httptools (llhttp, as uvicorn's parser) as it arrives. Reading pauses while more than
    ``_HIGH_WATER`` bytes wait for a slow client (backpressure down to the peer's socket)."""

    _HIGH_WATER = 1 << 20

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.lost = False
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.idle_until = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamError(f"malformed response: {exc}")
            assert self.transport is not None
            self.transport.close()
        if self.buffered > self._HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            self.error = UpstreamError(f"the peer closed the connection{f': {exc}' if exc else ''}")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # use
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until more arrived (or the connection failed); UpstreamError on timeout."""
        self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._expire) if timeout is not None else None
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self.error is not None:
            raise self.error

    def _expire(self) -> None:
        self.error = UpstreamError("the peer did not answer in time")
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return not self.lost and self.error is None and self.transport is not None and not self.transport.is_closing()

    def reset(self) -> None:
        self.status, self.headers, self.headers_done, self.complete = 0, [], False, False

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    def __init__(self, pool: UpstreamPool, key: str, conn: _Upstream, read_timeout: float | None) -> None:
        self.pool, self.key, self.conn, self.read_timeout = pool, key, conn, read_timeout
        self.status = conn.status
        self.headers = conn.headers
        self._done = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked transfer decoded); UpstreamError if the peer fails meanwhile."""
        conn = self.conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            await conn.wait(self.read_timeout)

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        """Give the connection back to the pool when the response was read completely, else close it."""
        if self._done:
            return
        self._done = True
        self.pool.release(self.key, self.conn)


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to the peers, for forwarding (the hot path: a fraction of httpx's CPU
    cost per request; probes and lookups use httpx)."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT_S, keepalive_s: float = 20.0,
                 max_idle_per_peer: int = 256, tls: ssl.SSLContext | None = None,
                 server_name: Callable[[str], str | None] | None = None) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle_per_peer
        self.idle: dict[str, list[_Upstream]] = {}
        self._tls = tls  # https peers: verified with this context (GATEWAY_PEER_TLS_CA_FILE), else system CAs
        self._server_name = server_name  # base URL -> the name its certificate must carry (None: the URL's host)

    async def _connect(self, base: str) -> _Upstream:
        parts = urlsplit(base)
        loop = asyncio.get_running_loop()
        tls = None
        host = parts.hostname or ""
        extra: dict[str, Any] = {}
        if parts.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
            name = self._server_name(base) if self._server_name is not None else None
            extra = {"server_hostname": name or host, "ssl_handshake_timeout": self.connect_timeout}
        port = parts.port or (443 if tls else 80)
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(loop), host, port, ssl=tls, **extra), self.connect_timeout)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError (an untrusted peer certificate) is an OSError
            raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
        return proto

    def _reuse(self, base: str) -> _Upstream | None:
        idle = self.idle.get(base)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.reusable() and conn.idle_until > now:
                return conn
            conn.close()
        return None

    def release(self, base: str, conn: _Upstream) -> None:
        if conn.complete and conn.keep_alive and conn.reusable() and not conn.chunks:
            idle = self.idle.setdefault(base, [])
            if len(idle) < self.max_idle:
                conn.reset()
                conn.idle_until = time.monotonic() + self.keepalive_s
                idle.append(conn)
                return
        conn.close()

    async def request(self, base: str, method: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: bytes, read_timeout: float | None) -> UpstreamResponse:
        """Send the request and wait for the response headers. UpstreamConnectError: nothing was sent;
        UpstreamError: the peer failed after the request was sent (it may have been processed)."""
        parts = urlsplit(base)
        host_default = parts.netloc.encode()
        head = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
        if not any(k == b"host" for k, _ in headers):
            head.append(b"host: " + host_default + b"\r\n")
        for k, v in headers:
            head.append(k + b": " + v + b"\r\n")
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"\r\n")
        data = b"".join(head) + body
        conn = self._reuse(base)
        reused = conn is not None
        if conn is None:
            conn = await self._connect(base)
        assert conn.transport is not None
        conn.transport.write(data)
        try:
            return await self._response(base, conn, read_timeout, method)
        except UpstreamError:
            if reused and conn.lost and not conn.headers and conn.status == 0 and method in ("GET", "HEAD"):
                # a kept-alive connection the peer had just closed: a GET can be sent again
                return await self.request_fresh(base, data, read_timeout, method)
            raise

    async def request_fresh(self, base: str, data: bytes, read_timeout: float | None, method: str) -> UpstreamResponse:
        conn = await self._connect(base)
        assert conn.transport is not None
        conn.transport.write(data)
        return await self._response(base, conn, read_timeout, method)

    async def _response(self, base: str, conn: Any, read_timeout: float | None, method: str) -> UpstreamResponse:
        """Wait for the response head on ``conn`` (closed on any failure) and wrap the response."""
        try:
            while not conn.headers_done:
                await conn.wait(read_timeout)
        except BaseException:
            conn.close()
            raise
        if method == "HEAD":
            conn.complete = True  # no body follows, whatever Content-Length says
        return UpstreamResponse(self, base, conn, read_timeout)

    def close(self) -> None:
        for conns in self.idle.values():
            for c in conns:
                c.close()
        self.idle.clear()

