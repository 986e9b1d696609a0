"""Any replica serves any instance: the HTTP side of routing between gateway replicas (see docs/routing.md).

:class:`RoutingMiddleware` (installed by :func:`install_routing` when peers are configured and
``GATEWAY_ROUTING`` is not ``off``) sits inside ``ObserveMiddleware`` (so trailing slashes are already
stripped and bodies capped) and, for:

- an instance request (``/consumers/{group}/instances/{name}/...``): serves it here when this replica holds
  the instance (the route's own answer, for the authenticated tenant). Otherwise the route answered 404/410
  and that answer is held back: the request goes to the replica last seen holding it, then to the ring
  owner (:mod:`service.routing`), then to whichever peer answers a lookup (``/internal/lookup``, in
  parallel) — a target that does not hold it answers with :data:`ABSENT_HEADER` and the next is tried.
  Forwarded responses (streams, long polls) pass through chunk by chunk; the client going away closes the
  upstream request. Forwarding uses :class:`UpstreamPool` (keep-alive HTTP/1.1 connections parsed with
  httptools, as uvicorn does): httpx, used for the probes and lookups, cost about 4x more CPU per forwarded
  request (see docs/routing.md). With ``GATEWAY_ROUTING=redirect`` the answer is a 307 to the holder instead.
- a create (``POST /consumers/{group}``): goes to the replica already holding that name if any (which
  answers 409), else to the ring owner of the name; a create without a name stays here (the gateway draws
  a generated name this replica owns).

A forwarded request carries :data:`HOP_HEADER` (and the peer token): its target serves it locally, so a
request is forwarded at most once. A target that cannot be reached is marked dead (until the next
successful probe) and the next candidate is tried; when no replica holds the instance the client gets
404/40403 telling it to create the instance again.

The peer set (static ``GATEWAY_PEERS`` and/or ``GATEWAY_PEER_DNS`` re-resolved every
``GATEWAY_PEER_REFRESH_S``) is probed on ``/internal/peer`` by a supervised background task, so the ring
is made of stable replica ids rather than addresses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import secrets
import socket
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import httptools
import httpx
import orjson
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from api.auth import AuthFailureLimiter, authenticate, client_address
from api.errors import error_response
from api.responses import OrjsonResponse
from service.gateway import Gateway
from service.routing import (
    ABSENT_HEADER,
    CLIENT_HEADER,
    HOP_HEADER,
    SCHEME_HEADER,
    SERVED_BY_HEADER,
    TOKEN_HEADER,
    HintCache,
    Identity,
    PeerTable,
    ProbeResult,
    group_of_create_path,
    instance_of_path,
    name_of_create_body,
    parse_peer_dns,
    parse_peers,
    urls_of_addrinfo,
)
from service.settings import Settings
from service.tenants import TenantError
from service.tenants.quotas import InstanceQuotaCoordinator, PeerFailed, PeerUnreachable, QuotaUnavailable

log = logging.getLogger(__name__)

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore runs `import sniffio` on every request (twice) and falls back to asyncio when it is missing;
    # recent anyio no longer installs it, and a failed import searches sys.path each time (~150 µs, most of
    # the forwarding cost). A None entry makes that import fail at once, with the same outcome.
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

PROBE_TIMEOUT_S = 1.0
LOOKUP_TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 2.0
#: added to GATEWAY_MAX_POLL_TIMEOUT_MS for the read timeout of a forwarded request (streams: none)
POLL_MARGIN_S = 30.0
#: a reservation may wait for the owner of record to ask every replica for its instances (LOOKUP_TIMEOUT_S)
QUOTA_TIMEOUT_S = 3.0
QUOTA_PATHS = ("/internal/quota/held", "/internal/quota/reserve", "/internal/quota/release")
#: error codes of a route's answer that mean "this replica does not hold the instance"
NOT_HERE_CODES = (40403, 41001)

_HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
               b"upgrade", b"proxy-authenticate", b"proxy-authorization"}
_DROP_REQUEST = _HOP_BY_HOP | {b"content-length", b"expect"}
_DROP_RESPONSE = _HOP_BY_HOP | {b"date", b"server"}
_HOP = HOP_HEADER.encode()
_TOKEN = TOKEN_HEADER.encode()
_STREAM_MEDIA = ("application/x-ndjson", "text/event-stream")
_ABSENT = ABSENT_HEADER.encode()
_SERVED_BY = SERVED_BY_HEADER.encode()


class RoutingMetrics:
    """``kcg_forwarded_requests_total{outcome}`` and ``kcg_forward_duration_seconds`` on the app's registry."""

    OUTCOMES = ("forwarded", "redirected", "owner_unreachable", "absent", "failed", "not_found", "refused")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "kcg_forwarded_requests_total",
            "Requests for consumer instances this replica does not hold, by outcome: forwarded (proxied to "
            "the holder), redirected (307), owner_unreachable (a target could not be connected to; the next "
            "was tried), absent (a target did not hold it; the next was tried), failed (the target failed "
            "mid-request: 503/50303), not_found (no replica holds it: 404/40403), refused (wrong peer token)",
            ["outcome"], registry=registry)
        for outcome in self.OUTCOMES:
            self.requests.labels(outcome)
        self.duration = Histogram(
            "kcg_forward_duration_seconds",
            "Time from forwarding a request to the target's response headers (a long poll includes its wait)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry)

        self.in_flight = Gauge(
            "kcg_forwarded_requests_in_flight",
            "Forwarded requests in progress (open forwarded streams and long polls included): side=out, this "
            "replica proxying to the holder; side=in, this replica serving requests another one forwarded",
            ["side"], registry=registry)
        self.out_flight, self.in_flight_in = self.in_flight.labels("out"), self.in_flight.labels("in")

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()


@dataclass
class Captured:
    """A held-back response (status, headers, complete body)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def error_code(self) -> int | None:
        try:
            doc = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        code = doc.get("error_code") if isinstance(doc, dict) else None
        return code if isinstance(code, int) else None

    async def replay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class _HoldNotFound:
    """A ``send`` that passes a response through unless it is a 404/410, which it holds back."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.state = "undecided"  # passing | holding | held
        self._start: Message | None = None
        self._body: list[bytes] = []

    async def send(self, message: Message) -> None:
        if self.state == "undecided" and message["type"] == "http.response.start":
            if message["status"] in (404, 410):
                self.state, self._start = "holding", message
                return
            self.state = "passing"
        if self.state == "holding" and message["type"] == "http.response.body":
            self._body.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.state = "held"
            return
        await self._send(message)

    @property
    def captured(self) -> Captured | None:
        if self.state != "held" or self._start is None:
            return None
        return Captured(self._start["status"], list(self._start.get("headers", [])), b"".join(self._body))


class _Recorder:
    """A ``receive`` that remembers the request body the app read, to replay it to another replica."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.chunks: list[bytes] = []
        self.complete = False
        self.disconnected = False

    async def receive(self) -> Message:
        message = await self._receive()
        self._note(message)
        return message

    def _note(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.complete = True
        elif message["type"] == "http.disconnect":
            self.disconnected = True

    async def body(self) -> bytes | None:
        """The whole body (reading what the app left unread); None when the client went away."""
        while not self.complete and not self.disconnected:
            self._note(await self._receive())
        return None if self.disconnected else b"".join(self.chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` (which answers the client) until done, or cancel it when the client goes away (which
    closes the upstream request: the owner sees its client disconnect and ends the long poll / stream)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v  # type: ignore[no-any-return]
    return None


# -- the forwarding client ---------------------------------------------------------------------------------
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


class Router:
    """The peer table, its refresh loop, the forwarding client and the routing decisions of one replica."""

    def __init__(self, settings: Settings, gateway: Gateway, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.gateway = gateway
        self.mode = settings.routing
        self.token = settings.peer_token.get_secret_value() if settings.peer_token else None
        # peer TLS (GATEWAY_PEER_TLS_CA_FILE / GATEWAY_TLS_CERT_FILE): peers are https URLs, verified
        self.scheme = "https" if peer_tls_enabled(settings) else "http"
        self.tls = peer_ssl_context(settings)
        self.static_urls = parse_peers(settings.peers, self.scheme)
        self.dns = parse_peer_dns(settings.peer_dns)
        self.dns_urls: list[str] = []
        self.refresh_s = settings.peer_refresh_s
        self.table = PeerTable(gateway.replica_id, secrets.token_hex(8))
        self.hints = HintCache()
        self.metrics = RoutingMetrics(registry)
        self.read_timeout = gateway.max_poll_timeout + POLL_MARGIN_S
        self._peer_hosts: set[str] = set()
        self.limiter: AuthFailureLimiter | None = None  # install_routing: the app's failed-auth limiter
        self.client: httpx.AsyncClient | None = None  # probes and lookups
        self.pool = UpstreamPool(tls=self.tls, server_name=self.server_name)  # forwarded requests
        self._task: asyncio.Task[None] | None = None
        self._last_result: dict[str, str] = {}
        self.refreshes = 0
        gateway.name_placement = self.owns
        #: max_instances across the replica set (service/tenants/quotas.py; /internal/quota/*)
        self.quota = InstanceQuotaCoordinator(
            self.self_id, owner_of=self.quota_owner, members=self.members, local_tokens=self._quota_tokens,
            call=self.quota_call, mark_dead=self.table.mark_dead, sync_s=settings.quota_sync_s)
        self._quota_task: asyncio.Task[None] | None = None
        gateway.instance_quota = self.quota
        # httpx logs every request at INFO: the probes would fill the log (their state changes are logged here)
        httpx_log = logging.getLogger("httpx")
        if httpx_log.getEffectiveLevel() < logging.WARNING:
            httpx_log.setLevel(logging.WARNING)

    # -- ring --------------------------------------------------------------------------------------------
    @property
    def self_id(self) -> str:
        return self.table.self_id

    def _sync(self) -> None:
        self.table.self_draining = self.gateway.draining

    def owner(self, group: str, name: str) -> str:
        self._sync()
        return self.table.owner(group, name)

    def owns(self, group: str, name: str) -> bool:
        return self.owner(group, name) == self.self_id

    def identity(self) -> Identity:
        return Identity(self.self_id, self.table.self_boot, draining=self.gateway.draining)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.client = httpx.AsyncClient(  # probes and lookups (forwarding uses self.pool)
            timeout=httpx.Timeout(PROBE_TIMEOUT_S, connect=PROBE_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=20.0),
            trust_env=False, follow_redirects=False, verify=self.tls)
        with contextlib.suppress(Exception):  # the loop logs what goes wrong; do not block the start
            await asyncio.wait_for(self.refresh(), PROBE_TIMEOUT_S * 3)
        self._task = asyncio.create_task(self._supervise(), name="peer-refresh")
        self._quota_task = asyncio.create_task(self.quota.run(), name="quota-reconcile")

    async def stop(self) -> None:
        for task in (self._task, self._quota_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.client is not None:
            await self.client.aclose()
        self.pool.close()

    async def _supervise(self) -> None:
        while True:
            try:
                while True:
                    await asyncio.sleep(self.refresh_s)
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("refreshing the gateway peer set failed; restarting the refresh loop")
                await asyncio.sleep(min(self.refresh_s, 1.0))

    # -- discovery ---------------------------------------------------------------------------------------
    async def targets(self) -> list[str]:
        urls = list(self.static_urls)
        if self.dns is not None:
            host, port = self.dns
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
                self.dns_urls = urls_of_addrinfo(infos, port, self.scheme)
            except OSError as exc:  # keep the last answer: a DNS hiccup must not empty the ring
                log.warning("resolving GATEWAY_PEER_DNS %s:%d failed: %s", host, port, exc)
        urls += [u for u in self.dns_urls if u not in urls]
        return urls

    async def refresh(self) -> None:
        urls = await self.targets()
        results = await asyncio.gather(*(self.probe(u) for u in urls))
        self._sync()
        self.table.retain(urls)
        self._peer_hosts = {h for u in urls if (h := urlsplit(u).hostname)}
        for gone in [u for u in self._last_result if u not in urls]:
            del self._last_result[gone]
        for url, (ident, problem) in zip(urls, results, strict=True):
            result = self.table.record_probe(url, ident)
            state = problem or result
            before = self._last_result.get(url)
            if state == before:
                continue
            self._last_result[url] = state
            name = ident.replica_id if ident is not None else "?"
            if state == ProbeResult.OK:
                log.info("gateway peer %s at %s is up", name, url)
            elif state == "refused":
                log.error("the gateway at %s refused this replica's peer token: GATEWAY_PEER_TOKEN must be the "
                          "same on every replica; it is left out of the routing ring", url)
            elif state == "tls":
                log.error("the gateway at %s failed the TLS handshake: its certificate is not signed by a CA of "
                          "GATEWAY_PEER_TLS_CA_FILE, does not name %r, or it does not speak TLS; it is left out of "
                          "the routing ring and gets no forwarded requests", url,
                          self.server_name(url) or urlsplit(url).hostname)
            elif state == ProbeResult.CONFLICT:
                log.error("the gateway at %s also calls itself %r: every replica needs its own "
                          "GATEWAY_REPLICA_ID; it is left out of the routing ring", url, name)
            elif state == ProbeResult.INCOMPATIBLE:
                log.error("the gateway at %s speaks another routing protocol version; left out of the ring", url)
            elif state == ProbeResult.DOWN and before is not None:
                log.warning("gateway peer at %s is unreachable; left out of the routing ring", url)
        self.refreshes += 1

    def _internal_headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token} if self.token else {}

    def server_name(self, url: str) -> str | None:
        """The name the certificate of the peer at ``url`` must carry: GATEWAY_PEER_TLS_SERVER_NAME, else the
        GATEWAY_PEER_DNS host for a discovered peer (reached by address), else None (the URL's host)."""
        if self.settings.peer_tls_server_name:
            return self.settings.peer_tls_server_name
        if self.dns is not None and url in self.dns_urls and url not in self.static_urls:
            return self.dns[0]
        return None

    def _extensions(self, url: str) -> dict[str, Any]:
        name = self.server_name(url) if url.startswith("https:") else None
        return {"sni_hostname": name} if name else {}

    async def probe(self, url: str) -> tuple[Identity | None, str | None]:
        """The identity a replica answers (None: unreachable or not a gateway) and what went wrong: "refused"
        (it refused our token), "tls" (its certificate is not trusted, or it does not speak TLS) or None."""
        assert self.client is not None
        try:
            r = await self.client.get(f"{url}/internal/peer", headers=self._internal_headers(),
                                      timeout=PROBE_TIMEOUT_S, extensions=self._extensions(url))
        except httpx.HTTPError as exc:
            return None, "tls" if _tls_failure(exc) else None
        if r.status_code != 200:
            return None, "refused" if r.status_code == 403 else None
        try:
            return Identity.from_json(r.json()), None
        except ValueError:
            return None, None

    async def lookup(self, group: str, name: str, exclude: set[str]) -> list[str]:
        """The peers (alive, not in ``exclude``) that hold (group, name) for some tenant, asked in parallel."""
        assert self.client is not None
        peers = [p for p in self.table.alive() if p.replica_id not in exclude]
        if not peers:
            return []

        async def ask(replica_id: str, url: str) -> bool:
            assert self.client is not None
            try:
                r = await self.client.get(f"{url}/internal/lookup", params={"group": group, "name": name},
                                          headers=self._internal_headers(), extensions=self._extensions(url),
                                          timeout=httpx.Timeout(LOOKUP_TIMEOUT_S, connect=LOOKUP_TIMEOUT_S / 2))
            except (httpx.ConnectError, httpx.ConnectTimeout):
                self.table.mark_dead(replica_id)
                return False
            except httpx.HTTPError:
                return False
            if r.status_code != 200:
                return False
            with contextlib.suppress(ValueError):
                return bool(r.json().get("held"))
            return False

        held = await asyncio.gather(*(ask(p.replica_id, p.url) for p in peers))
        return [p.replica_id for p, h in zip(peers, held, strict=True) if h]

    # -- peer authentication -----------------------------------------------------------------------------
    def token_ok(self, scope: Scope) -> bool:
        """The request carries the peer token (never true without one: /internal and forwarded requests
        always need it; :func:`install_routing` refuses peers without a token)."""
        if not self.token:
            return False
        given = _header(scope, _TOKEN)
        return given is not None and hmac.compare_digest(given, self.token.encode())

    def refused(self, scope: Scope, message: str) -> ASGIApp:
        """The answer to a request without the right peer token: 403/40302, counted in the metrics and, when
        a (wrong) token was presented, against the client address in the failed-authentication limit
        (429/42901 once the address is blocked)."""
        self.metrics.count("refused")
        if self.limiter is not None and _header(scope, _TOKEN) is not None:
            try:
                self.limiter.refuse(client_address(Request(scope)))
            except TenantError as exc:
                return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)
        return error_response(403, 40302, message)

    async def authenticated(self, scope: Scope, send: Send) -> bool:
        """Check the client's credentials here, before any lookup or forwarding: a request that fails is
        answered 401 (or 429 from a blocked address) by this replica, with no routing headers, and never
        leaves it. The replica that serves the request authenticates it again and charges its rate."""
        try:
            authenticate(Request(scope))
        except TenantError as exc:
            await error_response(exc.status, exc.error_code, exc.message, exc.headers or None)(
                scope, _no_receive, send)
            return False
        return True

    def restore_client(self, scope: Scope) -> None:
        """A forwarded request is seen as coming from the original client (address and scheme), so that the
        trusted-proxy rules, base_uri and the failed-authentication limit work as on the first replica.
        Believed only from an authenticated peer (the caller checked the peer token)."""
        client = _header(scope, CLIENT_HEADER.encode())
        if client:
            host, _, port = client.decode("latin-1").rpartition(":")
            if host and port.isdigit():
                scope["client"] = (host.strip("[]"), int(port))
        scheme = _header(scope, SCHEME_HEADER.encode())
        if scheme in (b"http", b"https"):
            scope["scheme"] = scheme.decode()

    # -- forwarding --------------------------------------------------------------------------------------
    def _upstream_target(self, scope: Scope) -> str:
        raw = scope.get("raw_path") or quote(scope["path"]).encode()
        qs = scope.get("query_string") or b""
        return raw.decode("latin-1") + ("?" + qs.decode("latin-1") if qs else "")

    def _upstream_url(self, base: str, scope: Scope) -> str:
        return base + self._upstream_target(scope)

    def _upstream_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in scope["headers"] if k not in _DROP_REQUEST and not k.startswith(b"x-kcg-")]
        out.append((_HOP, self.self_id.encode()))
        client = scope.get("client")
        if client:
            host = client[0]
            out.append((CLIENT_HEADER.encode(), (f"[{host}]" if ":" in host else host).encode() + b":%d" % client[1]))
        out.append((SCHEME_HEADER.encode(), scope.get("scheme", "http").encode()))
        if self.token:
            out.append((_TOKEN, self.token.encode()))
        return out

    def _is_stream(self, scope: Scope) -> bool:
        accept = (_header(scope, b"accept") or b"").decode("latin-1").lower()
        return any(m in accept for m in _STREAM_MEDIA)

    async def forward(self, target: str, scope: Scope, body: bytes, send: Send) -> Captured | str:
        """Send the request to replica ``target`` and pass its response through to the client.

        Returns "done" (answered), "unreachable" (could not connect: the target is marked dead, nothing was
        sent to it, nothing answered) or, when the target does not hold the instance, its 404/410 response
        (not sent to the client)."""
        base = self.table.url_of(target)
        if base is None:
            return "unreachable"
        started = time.perf_counter()
        self.metrics.out_flight.inc()
        try:
            return await self._exchange(target, base, scope, body, send, started)
        finally:
            self.metrics.out_flight.dec()

    async def _exchange(self, target: str, base: str, scope: Scope, body: bytes, send: Send,
                        started: float) -> Captured | str:
        try:
            resp = await self.pool.request(base, scope["method"], self._upstream_target(scope),
                                           self._upstream_headers(scope), body,
                                           None if self._is_stream(scope) else self.read_timeout)
        except UpstreamConnectError as exc:
            self.table.mark_dead(target)
            self.metrics.count("owner_unreachable")
            log.warning("gateway peer %s at %s is unreachable (%s); left out of the routing ring until it "
                        "answers a probe", target, base, exc)
            return "unreachable"
        except UpstreamError as exc:
            self.metrics.count("failed")
            log.warning("forwarding %s %s to gateway peer %s failed: %s", scope["method"], scope["path"], target, exc)
            await error_response(503, 50303, f"the gateway replica {target!r} holding this consumer instance "
                                 f"failed during the request ({exc}); retry, and if it keeps failing create the "
                                 "instance again", {"Retry-After": "1"})(scope, _no_receive, send)
            return "done"
        try:
            self.metrics.duration.observe(time.perf_counter() - started)
            if resp.header(_ABSENT) is not None:
                try:
                    content = await resp.read()
                except UpstreamError:
                    content = b""
                self.metrics.count("absent")
                headers = [(k, v) for k, v in resp.headers if k not in _DROP_RESPONSE and k != _ABSENT]
                return Captured(resp.status, headers, content)
            self.metrics.count("forwarded")
            headers = [(k, v) for k, v in resp.headers if k not in _DROP_RESPONSE and k != _SERVED_BY]
            if resp.status not in (401, 403):  # a refusal does not tell where the instance lives
                headers.append((_SERVED_BY, target.encode()))
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            try:
                async for chunk in resp.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as exc:
                self.metrics.count("failed")
                log.warning("the response of gateway peer %s to %s %s broke off: %s", target, scope["method"],
                            scope["path"], exc)
                media = (resp.header(b"content-type") or b"").decode("latin-1")
                msg = orjson.dumps({"error_code": 50303, "message": f"the gateway replica {target!r} holding "
                                    "this consumer instance failed; commit what you received, then retry (create "
                                    "the instance again if it is gone)"})
                tail = (b"event: error\ndata: " + msg + b"\n\n" if media.startswith("text/event-stream") else
                        msg + b"\n" if media.startswith("application/x-ndjson") else b"")
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                return "done"
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return "done"
        finally:
            resp.close()

    def redirect(self, target: str, scope: Scope) -> OrjsonResponse | None:
        base = self.table.url_of(target)
        if base is None:
            return None
        self.metrics.count("redirected")
        resp = OrjsonResponse({"message": f"served by gateway replica {target!r}"}, status_code=307)
        resp.headers["location"] = self._upstream_url(base, scope)
        resp.headers[SERVED_BY_HEADER] = target
        return resp

    # -- decisions ---------------------------------------------------------------------------------------
    async def route_instance(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, group: str,
                             name: str) -> None:
        recorder = _Recorder(receive)
        local: Captured | None = None
        if self.gateway.holds(group, name):
            # Here for some tenant: the route decides (authenticated), and only its 404/410 goes further
            hold = _HoldNotFound(send)
            await app(scope, recorder.receive, hold.send)
            local = hold.captured
            if local is None:
                return  # answered
            if local.error_code not in NOT_HERE_CODES:
                await local.replay(send)
                return
        if not await self.authenticated(scope, send):
            return
        body = await recorder.body()
        if body is None:
            return  # the client went away
        if self.mode == "redirect":
            holders = await self.lookup(group, name, {self.self_id})
            resp = self.redirect(holders[0], scope) if holders else None
            if resp is not None:
                await resp(scope, _no_receive, send)
                return
            await self._not_held(app, scope, receive, body, send, group, name, local, None, [])
            return
        await _unless_disconnected(receive, self._forward_instance(app, scope, receive, body, send, group, name,
                                                                   local))

    async def _forward_instance(self, app: ASGIApp, scope: Scope, receive: Receive, body: bytes, send: Send,
                                group: str, name: str, local: Captured | None) -> None:
        tried = {self.self_id}
        unreachable: list[str] = []
        gone: Captured | None = None  # a 410 from a replica where it expired

        async def attempt(target: str) -> bool:
            nonlocal gone
            tried.add(target)
            got = await self.forward(target, scope, body, send)
            if got == "done":
                if target != self.owner(group, name):
                    self.hints.put(group, name, target)
                return True
            if got == "unreachable":
                unreachable.append(target)
            elif isinstance(got, Captured) and got.status == 410:
                gone = got
            self.hints.drop(group, name, target)
            return False

        hint = self.hints.get(group, name)
        if hint is not None and hint not in tried and self.table.is_alive(hint) and await attempt(hint):
            return
        owner = self.owner(group, name)
        if owner not in tried and await attempt(owner):
            return
        for holder in await self.lookup(group, name, tried):
            if holder not in tried and await attempt(holder):
                return
        await self._not_held(app, scope, receive, body, send, group, name, local, gone, unreachable)

    async def _not_held(self, app: ASGIApp, scope: Scope, receive: Receive, body: bytes, send: Send, group: str,
                        name: str, local: Captured | None, gone: Captured | None, unreachable: list[str]) -> None:
        """No replica holds it: this replica's own answer (authentication first: a 401 stays a 401), a 410
        from where it expired rather than a 404, and a 404 that names the unreachable replicas."""
        if local is None:
            hold = _HoldNotFound(send)
            await app(scope, _replaying(body, receive), hold.send)
            local = hold.captured
            if local is None:
                return  # answered (401, 429, ...)
        self.metrics.count("not_found")
        if local.status == 404 and local.error_code == 40403:
            if gone is not None:
                local = gone
            elif unreachable:
                names = ", ".join(repr(r) for r in unreachable)
                await error_response(404, 40403, f"consumer instance {name!r} not found in group {group!r}: "
                                     f"gateway replica {names} is unreachable (stopped or restarted) and no other "
                                     "replica holds it; create the consumer instance again")(scope, _no_receive, send)
                return
        await local.replay(send)

    async def route_create(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, group: str) -> None:
        recorder = _Recorder(receive)
        body = await recorder.body()
        if body is None:
            return
        replay = _replaying(body, receive)
        wanted = name_of_create_body(body)
        if not wanted.parsed:
            await app(scope, replay, send)  # the route answers the malformed body
            return
        self._sync()
        if wanted.name is None:
            if self.self_id in self.table.placement_ids():
                await app(scope, replay, send)  # a generated name this replica owns
                return
            if not await self.authenticated(scope, send):
                return
            target = self.table.owner(group, uuid.uuid4().hex)  # draining: let a live replica create it
        else:
            if self.gateway.holds(group, wanted.name):
                await app(scope, replay, send)  # 409 for the same tenant, a new instance for another one
                return
            if not await self.authenticated(scope, send):
                return
            holders = await self.lookup(group, wanted.name, {self.self_id})
            target = holders[0] if holders else self.owner(group, wanted.name)
        if self.mode == "redirect":
            resp = self.redirect(target, scope) if target != self.self_id else None
            if resp is not None:
                await resp(scope, replay, send)
            else:
                await app(scope, replay, send)
            return
        await _unless_disconnected(receive, self._forward_create(app, scope, replay, body, send, group,
                                                                 wanted.name, target))

    async def _forward_create(self, app: ASGIApp, scope: Scope, replay: Receive, body: bytes, send: Send,
                              group: str, name: str | None, target: str) -> None:
        for _ in range(len(self.table.peers) + 1):
            if target == self.self_id:
                break
            got = await self.forward(target, scope, body, send)
            if got != "unreachable":
                if name is not None and isinstance(got, str):
                    self.hints.put(group, name, target)
                return
            # nothing reached the target: place it on the next owner
            target = self.owner(group, name if name is not None else uuid.uuid4().hex)
        await app(scope, replay, send)

    # -- tenant instance counts across replicas (max_instances) -------------------------------------------
    def members(self) -> list[str]:
        """Every live replica id, this one first (draining ones too: they hold instances)."""
        return [self.self_id, *(p.replica_id for p in self.table.alive())]

    def replica_count(self) -> int:
        """Live replicas: each enforces its share of the scaled tenant quotas (rates, concurrency)."""
        return len(self.table.alive()) + 1

    def quota_owner(self, tenant: str) -> str:
        """The owner of record of a tenant's instance count: the ring owner of the tenant id (a key no
        instance has: group ids never contain NUL)."""
        return self.owner("\x00quota", tenant)

    def _quota_tokens(self, tenant: str) -> list[str]:
        rt = self.gateway.tenants.get(tenant)
        return [i.quota_token for i in rt.instances.values() if i.quota_token] if rt is not None else []

    async def quota_call(self, replica: str, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``/internal/quota/<op>`` on a peer: PeerUnreachable when it cannot be connected to, PeerFailed
        when it does not answer 200 with a JSON object in time."""
        url = self.table.url_of(replica)
        if url is None or self.client is None:
            raise PeerUnreachable(f"gateway replica {replica!r} is not known")
        headers = self._internal_headers()
        timeout = httpx.Timeout(QUOTA_TIMEOUT_S if op == "reserve" else LOOKUP_TIMEOUT_S,
                                connect=LOOKUP_TIMEOUT_S / 2)
        try:
            if op == "held":
                r = await self.client.get(f"{url}/internal/quota/held", params=payload, headers=headers,
                                          timeout=timeout, extensions=self._extensions(url))
            else:
                r = await self.client.post(f"{url}/internal/quota/{op}", content=orjson.dumps(payload),
                                           headers={**headers, "content-type": "application/json"},
                                           timeout=timeout, extensions=self._extensions(url))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise PeerUnreachable(str(exc) or type(exc).__name__) from None
        except httpx.HTTPError as exc:
            raise PeerFailed(str(exc) or type(exc).__name__) from None
        if r.status_code != 200:
            raise PeerFailed(f"HTTP {r.status_code}")
        try:
            doc = orjson.loads(r.content)
        except orjson.JSONDecodeError:
            raise PeerFailed("not JSON") from None
        if not isinstance(doc, dict):
            raise PeerFailed("not a JSON object")
        return doc

    async def quota_endpoint(self, scope: Scope, receive: Receive, path: str) -> ASGIApp:
        """``GET /internal/quota/held?tenant=``: this replica's tokens of a tenant; ``POST
        /internal/quota/reserve`` / ``release`` (JSON): the owner of record's ledger."""
        want = "GET" if path == "/internal/quota/held" else "POST"
        if scope["method"] != want:
            return error_response(405, 40501, f"method {scope['method']} not allowed on {path}", {"Allow": want})
        if want == "GET":
            qs = parse_qs((scope.get("query_string") or b"").decode("utf-8", "replace"))
            doc: Any = {"tenant": qs.get("tenant", [""])[0]}
        else:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if len(body) > 4096:
                    return error_response(413, 41301, "request body larger than 4096 bytes")
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                return error_response(400, 40001, "malformed JSON body")
        tenant = doc.get("tenant") if isinstance(doc, dict) else None
        token = doc.get("token") if want == "POST" else ""
        limit = doc.get("limit") if want == "POST" else None
        replica = doc.get("replica", "") if want == "POST" else ""
        if not (isinstance(tenant, str) and tenant and isinstance(token, str) and len(token) <= 64
                and isinstance(replica, str) and (limit is None or (isinstance(limit, int) and limit >= 0))):
            return error_response(422, 42206, "tenant (and for reserve/release token, replica, limit) are required")
        if path == "/internal/quota/held":
            settled, pending = self.quota.held_tokens(tenant)
            return OrjsonResponse({"replica_id": self.self_id, "tokens": settled, "pending": pending})
        if not token:
            return error_response(422, 42206, "token is required")
        if path == "/internal/quota/release":
            self.quota.ledger_release(tenant, token)
            return OrjsonResponse({"released": True})
        if not replica:
            return error_response(422, 42206, "replica is required")
        try:
            granted, count = await self.quota.grant(tenant, replica, token, limit)
        except QuotaUnavailable as exc:
            return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)
        return OrjsonResponse({"granted": granted, "count": count})

    # -- /internal ---------------------------------------------------------------------------------------
    async def internal(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path not in ("/internal/peer", "/internal/lookup", "/internal/peers", *QUOTA_PATHS):
            resp = error_response(404, 40400, f"no such endpoint: {scope['method']} {path}")
        elif not self.token_ok(scope):
            resp = self.refused(scope, "this endpoint is for gateway replicas: it needs the "
                                f"{TOKEN_HEADER} header with GATEWAY_PEER_TOKEN")
        elif path in QUOTA_PATHS:
            resp = await self.quota_endpoint(scope, receive, path)
        elif scope["method"] != "GET":
            resp = error_response(405, 40501, f"method {scope['method']} not allowed on {path}", {"Allow": "GET"})
        elif path == "/internal/peer":
            resp = OrjsonResponse(self.identity().to_json())
        elif path == "/internal/peers":
            self._sync()
            resp = OrjsonResponse({**self.table.snapshot(), "refreshes": self.refreshes})
        else:
            qs = parse_qs((scope.get("query_string") or b"").decode("utf-8", "replace"))
            group, name = qs.get("group", [""])[0], qs.get("name", [""])[0]
            if not group or not name:
                resp = error_response(422, 42206, "group and name are required")
            else:
                resp = OrjsonResponse({"replica_id": self.self_id, "held": self.gateway.holds(group, name)})
        await resp(scope, receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class RoutingMiddleware:
    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        router = self.router
        path: str = scope["path"]
        if path.startswith("/internal/"):
            await router.internal(scope, receive, send)
            return
        if _header(scope, _HOP) is not None:
            # Forwarded by a peer: served here, never forwarded again
            if not router.token_ok(scope):
                await router.refused(scope, f"forwarded request ({HOP_HEADER}) without the gateway replicas' "
                                     f"peer token ({TOKEN_HEADER})")(scope, receive, send)
                return
            router.restore_client(scope)
            if instance_of_path(path) is not None:
                send = _marking_absent(send)
            router.metrics.in_flight_in.inc()
            try:
                await self.app(scope, receive, send)
            finally:
                router.metrics.in_flight_in.dec()
            return
        inst = instance_of_path(path)
        if inst is not None:
            await router.route_instance(self.app, scope, receive, send, *inst)
            return
        if scope["method"] == "POST":
            group = group_of_create_path(path)
            if group is not None:
                await router.route_create(self.app, scope, receive, send, group)
                return
        await self.app(scope, receive, send)


def _marking_absent(send: Send) -> Send:
    """On a forwarded instance request: a 404/40403 or 410/41001 answer gets :data:`ABSENT_HEADER`, telling
    the forwarding replica to look elsewhere."""
    hold = _HoldNotFound(send)
    replayed = False

    async def marking(message: Message) -> None:
        nonlocal replayed
        await hold.send(message)
        got = hold.captured
        if got is not None and not replayed:
            replayed = True
            if got.error_code in NOT_HERE_CODES:
                got.headers.append((ABSENT_HEADER.encode(), b"1"))
            await got.replay(send)

    return marking


def peer_token_problem(settings: Settings) -> str | None:
    """Why these settings may not start (peers without a peer token), or None."""
    if (settings.peers or settings.peer_dns) and not (
            settings.peer_token is not None and settings.peer_token.get_secret_value().strip()):
        return ("GATEWAY_PEERS / GATEWAY_PEER_DNS is set but GATEWAY_PEER_TOKEN is not: the replicas' "
                "/internal endpoints and forwarded requests must be authenticated. Set GATEWAY_PEER_TOKEN to "
                "the same random secret (e.g. `openssl rand -hex 32`) on every replica")
    return None


def _tls_failure(exc: BaseException) -> bool:
    """An httpx error caused by a failed TLS handshake (untrusted certificate, wrong name, not TLS)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def peer_tls_enabled(settings: Settings) -> bool:
    """Peers are reached over https: a CA bundle for them is given, or this replica serves TLS (its peers,
    started from the same settings, do too)."""
    return bool(settings.peer_tls_ca_file or settings.tls_cert_file)


def peer_ssl_context(settings: Settings) -> ssl.SSLContext:
    """The context that verifies peers' certificates (and their names): GATEWAY_PEER_TLS_CA_FILE, else the
    system CAs; TLS 1.2 or newer."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.peer_tls_ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def peer_tls_problem(settings: Settings) -> str | None:
    """Why the peer TLS settings cannot start (an unreadable CA bundle, a plain http:// peer while peer TLS is
    on: the peer token and client credentials would travel in clear), or None."""
    if settings.peer_tls_ca_file:
        try:
            peer_ssl_context(settings)
        except (OSError, ssl.SSLError, ValueError) as exc:
            return f"GATEWAY_PEER_TLS_CA_FILE {settings.peer_tls_ca_file!r} does not load as a PEM CA bundle: {exc}"
    if peer_tls_enabled(settings):
        try:
            plain = [u for u in parse_peers(settings.peers, "https") if u.startswith("http://")]
        except ValueError as exc:
            return str(exc)
        if plain:
            return (f"peer TLS is on (GATEWAY_PEER_TLS_CA_FILE or GATEWAY_TLS_CERT_FILE) but GATEWAY_PEERS names "
                    f"plain http peers ({', '.join(plain)}): use https:// URLs (or no scheme)")
    return None


def install_routing(app: FastAPI, settings: Settings, gateway: Gateway) -> Router | None:
    """Add :class:`RoutingMiddleware` when peers are configured and routing is on; the caller starts and stops
    the returned router in the app's lifespan. Call it before adding ``ObserveMiddleware`` (which must stay
    outside: trailing slashes, body caps)."""
    if settings.routing == "off" or not (settings.peers or settings.peer_dns):
        return None
    problem = peer_token_problem(settings)
    if problem is not None:
        raise ValueError(problem)
    router = Router(settings, gateway, app.state.metrics.registry)
    router.limiter = getattr(app.state, "auth_limiter", None)
    for tenant in app.state.tenants.tenants.values():  # rates and concurrency: this replica's share
        tenant.replicas = router.replica_count
    app.add_middleware(RoutingMiddleware, router=router)
    app.state.routing = router
    return router
