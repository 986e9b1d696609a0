"""One asyncio connection to one broker, pipelining many requests by correlation id.

The connection negotiates API versions (ApiVersions), authenticates (SASL PLAIN / SCRAM over
SaslHandshake v1 + SaslAuthenticate) and optionally runs over TLS. Requests are written as soon as
they are sent (small ones coalesced per event-loop iteration); the transport's protocol
(:class:`_KafkaProtocol`) cuts the incoming bytes into frames and resolves each waiter by correlation id
straight from the transport's read callback (no reader task, no StreamReader: one event-loop hop less per
response, which is most of an idle heartbeat's cost). When the socket breaks, every pending request fails
at once with a retriable :class:`KafkaConnectionError`. Request timeouts are checked by one sweep per
connection every 100 ms while requests are pending (no timer per request, no task cancellation), and the
loop is looked up once per connection (on Python 3.11 ``asyncio.get_running_loop()`` is a ``getpid()``
system call).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.client.errors import (
    AuthenticationError,
    BrokerResponseError,
    FrameTooLargeError,
    KafkaConnectionError,
    KafkaError,
    RequestTimeoutError,
)
from service.client.sasl import SaslAuthenticationError, create_mechanism, respond_off_loop
from service.client.versions import NegotiatedVersions, VersionRange
from service.lib.aio import LightEvent
from service.lib.native import load
from service.protocol import error_codes as EC
from service.protocol import frames
from service.protocol import messages as M
from service.protocol import primitives as P
from service.protocol.dsl import Struct
from service.protocol.errors import KafkaProtocolError, ProtocolDecodeError

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
CLIENT_SOFTWARE_NAME = "kafka-consumer-gateway"
CLIENT_SOFTWARE_VERSION = "0.1.0"
# Request frames below this size are coalesced per event-loop iteration (BrokerConnection._write)
COALESCE_MAX_BYTES = 64 * 1024


async def wait_event(event: asyncio.Event | LightEvent, timeout: float | None,
                     loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds; True if it is set. Uses asyncio.timeout because on
    Python 3.11 asyncio.wait_for can swallow a cancellation that races with completion. ``loop``: the
    running loop, if the caller has it at hand (saves a lookup)."""
    if timeout is not None and isinstance(event, LightEvent):
        return await event.wait_timeout(timeout, loop)  # no cancellation machinery on expiry
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


# ApiVersions answers already decoded, by (request version, response bytes): mass joins open many
# short-lived connections to the same brokers. NegotiatedVersions is never mutated after creation.
_NEGOTIATED: dict[tuple[int, bytes], NegotiatedVersions] = {}


@dataclass(frozen=True)
class SaslConfig:
    mechanism: str  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ConnectionConfig:
    client_id: str = "kafka-consumer-gateway"
    request_timeout: float = 30.0
    connect_timeout: float = 10.0
    max_frame_bytes: int = 256 * 1024 * 1024
    ssl_context: ssl.SSLContext | None = None
    ssl_server_hostname: str | None = None
    sasl: SaslConfig | None = None


@dataclass(slots=True)
class _Pending:
    api_key: int
    version: int
    future: asyncio.Future[Any] | _Callback | _BatchWaiter  # anything with done(), set_result(), set_exception()
    raw: bool
    deadline: float = math.inf  # loop time


_TIMED_OUT = object()  # what the timeout sweep puts into an expired request's future


class _Callback:
    """The waiter of a request sent with :meth:`BrokerConnection.send_nowait`: future-like (done,
    set_result, set_exception) so the read callback, the timeout sweep and a failing connection resolve
    it like a future, but it calls ``on_done(response, error)`` at once instead of waking a task."""

    __slots__ = ("_done", "on_done", "seconds", "what")

    def __init__(self, on_done: Callable[[Any, BaseException | None], None], what: str, seconds: float) -> None:
        self.on_done = on_done
        self.what = what  # the request, for messages ("HeartbeatRequest v4 to host:port")
        self.seconds = seconds  # its timeout
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        if result is _TIMED_OUT:
            self._call(None, RequestTimeoutError(f"{self.what} timed out after {self.seconds:.1f}s"))
        else:
            self._call(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._call(None, exc)

    def _call(self, result: Any, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.on_done(result, exc)
        except Exception:  # it runs inside the transport's callbacks: never let it break the connection
            log.exception("callback of %s failed", self.what)


# Request timeouts are checked by one sweep per connection every TIMEOUT_SWEEP_S while requests are
# pending (not a timer per request): a timeout fires up to this much late.
TIMEOUT_SWEEP_S = 0.1


# the read path without a copy per response. Small frames (heartbeats, metadata, offsets, ...) are read
# into a scratch buffer and handed out as bytes; a frame that cannot fit in it (a Fetch response of megabytes)
# gets a buffer of its own, which the socket fills directly (recv_into) and which is handed out as is: the records
# decoded from it are views of it (no append to a growing buffer, no copy out of it). The scratch buffer exists
# only while a read is in progress or a partial frame waits in it: an idle connection holds none (10,000 idle
# instances must stay within ~25 KB each).
SCRATCH_BYTES = 32 * 1024


def _frame_buffer_py(n: int) -> bytearray:
    return bytearray(n)


_cext, _ = load("service.protocol._crecords")
# an uninitialised bytearray (the socket overwrites all of it before it is read), or a zeroed one without C
_frame_buffer = _cext.frame_buffer if _cext is not None else _frame_buffer_py


#: TLS alerts a server sends about the client's certificate. With TLS 1.3 the client's side of the handshake ends
#: before the server has checked that certificate, so a refusal (Kafka's ssl.client.auth) arrives as an alert on
#: the first read, not as a handshake error: an authentication failure all the same, not a lost connection.
_CERTIFICATE_ALERTS = frozenset({
    "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV1_ALERT_ACCESS_DENIED", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
})


def _refused_certificate(exc: BaseException) -> bool:
    return isinstance(exc, ssl.SSLError) and exc.reason in _CERTIFICATE_ALERTS


class _KafkaProtocol(asyncio.BufferedProtocol):
    """Size-prefixed frames out of the byte stream, handed to the connection as they complete."""

    def __init__(self, conn: BrokerConnection) -> None:
        self.conn = conn
        self.scratch: bytearray | None = None  # allocated per read, dropped when it holds no partial frame
        self.view: memoryview | None = None
        self.start = 0  # unread bytes of the scratch buffer: [start, end)
        self.end = 0
        self.frame: bytearray | None = None  # a large frame being read into its own buffer
        self.frame_view: memoryview | None = None
        self.filled = 0
        self.dead = False  # a broken stream (bad frame size): what still arrives is dropped
        self.paused = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.closed = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.frame_view is not None and not self.dead:
            return self.frame_view[self.filled:]
        if self.view is None:
            self.scratch = _frame_buffer(SCRATCH_BYTES)
            self.view = memoryview(self.scratch)
        return self.view if self.dead else self.view[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.dead:
            return
        frame = self.frame
        if frame is not None:
            self.filled += nbytes
            if self.filled < len(frame):
                return
            assert self.frame_view is not None
            self.frame_view.release()
            self.frame = self.frame_view = None
            self._deliver(frame)
            return
        self.end += nbytes
        self._parse()

    def data_received(self, data: bytes) -> None:
        """For a transport that does not use the buffered interface: the same path, copied in."""
        mv = memoryview(data)
        while mv:
            buf = self.get_buffer(len(mv))
            n = min(len(buf), len(mv))
            buf[:n] = mv[:n]
            self.buffer_updated(n)
            mv = mv[n:]

    def _deliver(self, payload: bytes | bytearray) -> None:
        conn = self.conn
        try:
            conn._on_frame(payload, len(payload))  # type: ignore[arg-type]
        except Exception as exc:  # pragma: no cover - defensive: never let a callback kill the loop
            log.exception("unexpected error reading from %s", conn.address)
            conn._fail(KafkaConnectionError(f"connection to {conn.address} failed: {exc!r}"))

    def _parse(self) -> None:
        conn = self.conn
        buf, view = self.scratch, self.view
        assert buf is not None and view is not None  # buffer_updated follows a get_buffer of the scratch buffer
        pos, end = self.start, self.end
        guard = conn.config.max_frame_bytes
        try:
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(buf, pos)
                if size < 4 or size > guard:
                    raise FrameTooLargeError(
                        f"{conn.address} sent a frame of {size} bytes (guard {guard}); "
                        "is this a Kafka listener with the right security protocol?"
                    )
                stop = pos + 4 + size
                if stop <= end:
                    conn._on_frame(bytes(view[pos + 4:stop]), size)
                    pos = stop
                    continue
                if size + 4 > len(buf):  # never fits here: read the rest straight into its own buffer
                    frame = _frame_buffer(size)
                    got = end - pos - 4
                    frame[:got] = view[pos + 4:end]
                    self.frame, self.frame_view, self.filled = frame, memoryview(frame), got
                    pos = end
                break
        except KafkaError as exc:
            self.dead = True
            conn._fail(exc)
            return
        except Exception as exc:  # pragma: no cover - defensive: never let a callback kill the loop
            log.exception("unexpected error reading from %s", conn.address)
            self.dead = True
            conn._fail(KafkaConnectionError(f"connection to {conn.address} failed: {exc!r}"))
            return
        if pos == end:  # nothing left over: no buffer held until the next read
            self.start = self.end = 0
            view.release()
            self.scratch = self.view = None
        elif pos:  # a partial frame: moved to the front, so the rest of it fits behind it
            n = end - pos
            view[:n] = view[pos:end]
            self.start, self.end = 0, n
        else:
            self.start, self.end = pos, end

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if exc is None:
            conn._fail(KafkaConnectionError(f"{conn.address} closed the connection"))
        elif _refused_certificate(exc):
            conn._fail(AuthenticationError(f"{conn.address} refused the client certificate (or its absence): {exc}"))
        else:
            conn._fail(KafkaConnectionError(f"connection to {conn.address} lost: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake_writers(conn._close_reason)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writers(None)

    def _wake_writers(self, exc: BaseException | None) -> None:
        waiters, self.drain_waiters = self.drain_waiters, []
        for w in waiters:
            if not w.done():
                if exc is None:
                    w.set_result(None)
                else:
                    w.set_exception(exc)


class BrokerConnection:
    """A connected, negotiated and authenticated socket. Create with :meth:`open`."""

    def __init__(self, host: str, port: int, config: ConnectionConfig, node_id: int | None = None) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.config = config
        self.versions: NegotiatedVersions | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.Transport | None = None  # anything with write() and close()
        self._protocol: _KafkaProtocol | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_corr = 0
        self._closed = False
        self._close_reason: KafkaError | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        # Small frames written in the same event-loop iteration leave in one write() (see _write)
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"BrokerConnection(node={self.node_id}, {self.host}:{self.port})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return not self._closed and self._writer is not None

    @classmethod
    async def open(
        cls, host: str, port: int, config: ConnectionConfig, node_id: int | None = None
    ) -> BrokerConnection:
        conn = cls(host, port, config, node_id)
        try:
            await conn._connect()
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _connect(self) -> None:
        cfg = self.config
        loop = self._loop = asyncio.get_running_loop()
        try:
            transport, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _KafkaProtocol(self),
                    self.host,
                    self.port,
                    ssl=cfg.ssl_context,
                    server_hostname=(cfg.ssl_server_hostname or self.host) if cfg.ssl_context else None,
                ),
                cfg.connect_timeout,
            )
        except ssl.SSLError as exc:
            raise AuthenticationError(f"TLS handshake with {self.address} failed: {exc}") from exc
        except TimeoutError as exc:
            raise KafkaConnectionError(f"connecting to {self.address} timed out") from exc
        except OSError as exc:
            raise KafkaConnectionError(f"cannot connect to {self.address}: {exc}") from exc
        self._writer, self._protocol = transport, protocol
        self.versions = await self._negotiate()
        if cfg.sasl is not None:
            await self._authenticate(cfg.sasl)

    # -- negotiation -------------------------------------------------------------------------
    async def _negotiate(self) -> NegotiatedVersions:
        ours_lo, ours_hi = M.REQUESTS[M.ApiKey.API_VERSIONS].schema.versions
        version = ours_hi
        for _ in range(3):
            req = M.ApiVersionsRequest(
                client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION
            )
            raw = await self._send_raw(req, version, raw=True)
            cached = _NEGOTIATED.get((version, bytes(raw)))
            if cached is not None:  # the same answer as another connection's: decoded once
                return cached
            try:
                resp = frames.decode_response(M.ApiKey.API_VERSIONS, version, raw)
            except ProtocolDecodeError:
                # A broker that does not know our version answers in v0 format.
                resp = frames.decode_response(M.ApiKey.API_VERSIONS, 0, raw)
            if resp.error_code == EC.UNSUPPORTED_VERSION:
                theirs = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
                rng = theirs.get(M.ApiKey.API_VERSIONS, (0, 0))
                nxt = min(ours_hi, rng[1])
                if nxt >= version or nxt < ours_lo:
                    break
                version = nxt
                continue
            if resp.error_code:
                raise BrokerResponseError(resp.error_code, "ApiVersions", f"from {self.address}")
            broker: dict[int, VersionRange] = {
                k.api_key: (k.min_version, k.max_version) for k in resp.api_keys
            }
            negotiated = NegotiatedVersions(broker)
            if len(_NEGOTIATED) >= 64:
                _NEGOTIATED.clear()
            _NEGOTIATED[(version, bytes(raw))] = negotiated
            return negotiated
        raise KafkaConnectionError(f"{self.address} rejected every ApiVersions version", retriable=False)

    # -- SASL ------------------------------------------------------------------------------------
    async def _authenticate(self, sasl_cfg: SaslConfig) -> None:
        mech = create_mechanism(sasl_cfg.mechanism, sasl_cfg.username, sasl_cfg.password)
        hs = await self.send(M.SaslHandshakeRequest(mechanism=sasl_cfg.mechanism))
        if hs.error_code == EC.UNSUPPORTED_SASL_MECHANISM:
            raise AuthenticationError(
                f"{self.address} does not enable SASL mechanism {sasl_cfg.mechanism}; "
                f"enabled: {', '.join(hs.mechanisms) or 'none'}"
            )
        if hs.error_code:
            raise AuthenticationError(f"SaslHandshake with {self.address} failed: {EC.describe(hs.error_code).name}")
        if not self.versions or not self.versions.has(M.ApiKey.SASL_AUTHENTICATE):
            raise AuthenticationError(f"{self.address} does not support SaslAuthenticate (Kafka < 1.0)")
        token: bytes | None = mech.initial_response()
        try:
            while token is not None:
                resp = await self.send(M.SaslAuthenticateRequest(auth_bytes=token))
                if resp.error_code:
                    detail = resp.error_message or EC.describe(resp.error_code).name
                    raise AuthenticationError(
                        f"SASL {sasl_cfg.mechanism} authentication as {sasl_cfg.username!r} "
                        f"to {self.address} failed: {detail}"
                    )
                token = await respond_off_loop(mech, resp.auth_bytes or b"")  # PBKDF2 off the event loop
        except SaslAuthenticationError as exc:
            raise AuthenticationError(f"SASL {sasl_cfg.mechanism} with {self.address} failed: {exc}") from exc
        except KafkaConnectionError as exc:
            raise AuthenticationError(
                f"{self.address} closed the connection during SASL {sasl_cfg.mechanism} authentication"
            ) from exc
        if not mech.complete:
            raise AuthenticationError(f"SASL {sasl_cfg.mechanism} with {self.address} did not complete")

    # -- requests ----------------------------------------------------------------------------------
    def version_for(self, api_key: int) -> int:
        assert self.versions is not None
        return self.versions.version(api_key)

    async def send(self, req: Struct, version: int | None = None, timeout: float | None = None) -> Any:
        """Send ``req`` (at the negotiated version unless given) and await its decoded response."""
        api_key = frames.api_key_of(req)
        if version is None:
            version = self.version_for(api_key)
        return await self._send_raw(req, version, raw=False, timeout=timeout)

    async def _send_raw(self, req: Struct, version: int, *, raw: bool, timeout: float | None = None) -> Any:
        if self._closed or self._writer is None:
            raise self._close_reason or KafkaConnectionError(f"connection to {self.address} is closed")
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        seconds = timeout if timeout is not None else self.config.request_timeout
        corr = self._enqueue(req, version, fut, raw, seconds, loop)
        try:
            if self._protocol is not None and self._protocol.paused:
                await self._drain()
            result = await fut
        except (ConnectionError, OSError) as exc:
            self._pending.pop(corr, None)
            err = KafkaConnectionError(f"connection to {self.address} lost: {exc}")
            self._fail(err)
            raise err from exc
        finally:
            if not fut.done():
                fut.cancel()
        if result is _TIMED_OUT:
            raise RequestTimeoutError(f"{type(req).__name__} v{version} to {self.address} timed out after "
                                      f"{seconds:.1f}s")
        return result

    def send_nowait(self, req: Struct, version: int, on_done: Callable[[Any, BaseException | None], None],
                    timeout: float | None = None) -> None:
        """Send ``req`` without a task waiting for it: ``on_done(response, None)`` is called from the read
        callback when the answer arrives, ``on_done(None, error)`` when it cannot be sent, the connection
        breaks, the answer does not decode or ``timeout`` (default: the request timeout) passes. For
        small requests sent by the thousand (heartbeats of idle members): no future, no task wake-up.
        The caller must not block in ``on_done``; it runs inside the transport's callbacks."""
        if self._closed or self._writer is None:
            on_done(None, self._close_reason or KafkaConnectionError(f"connection to {self.address} is closed"))
            return
        seconds = timeout if timeout is not None else self.config.request_timeout
        waiter = _Callback(on_done, f"{type(req).__name__} v{version} to {self.address}", seconds)
        self._enqueue(req, version, waiter, False, seconds, self._loop or asyncio.get_running_loop())

    def _enqueue(self, req: Struct, version: int, waiter: asyncio.Future[Any] | _Callback, raw: bool,
                 seconds: float, loop: asyncio.AbstractEventLoop) -> int:
        """Number, encode and queue ``req`` with its waiter (timed out by the sweep after ``seconds``);
        returns its correlation id."""
        corr = self._next_corr
        self._next_corr = (corr + 1) & 0x7FFFFFFF
        frame = frames.encode_request(req, version, corr, self.config.client_id)
        self._pending[corr] = _Pending(frames.api_key_of(req), version, waiter, raw, loop.time() + seconds)
        if self._sweep_handle is None:
            self._sweep_handle = loop.call_later(TIMEOUT_SWEEP_S, self._sweep)
        self._write(frame)
        self.bytes_sent += len(frame)
        return corr

    def _sweep(self) -> None:
        """Expire the pending requests whose deadline passed; again in TIMEOUT_SWEEP_S while any remain."""
        self._sweep_handle = None
        pending = self._pending
        if not pending or self._closed:
            return
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        expired = [corr for corr, p in pending.items() if p.deadline <= now or p.future.done()]
        for corr in expired:
            p = pending.pop(corr)
            if not p.future.done():
                p.future.set_result(_TIMED_OUT)  # its answer, should it come, is dropped
        if pending:
            self._sweep_handle = loop.call_later(TIMEOUT_SWEEP_S, self._sweep)

    async def _drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark (a slow broker)."""
        proto = self._protocol
        if proto is None or not proto.paused or self._closed:
            return
        w: asyncio.Future[None] = (self._loop or asyncio.get_running_loop()).create_future()
        proto.drain_waiters.append(w)
        await w

    def _on_frame(self, payload: bytes, size: int) -> None:
        """A complete response frame (from the protocol's read callback): resolve its waiter."""
        self.bytes_received += size + 4
        corr = frames.response_correlation_id(payload)
        p = self._pending.pop(corr, None)
        if p is None or p.future.done():
            return  # the waiter timed out or was cancelled
        if p.raw:
            p.future.set_result(payload)
            return
        try:
            resp = frames.decode_response(p.api_key, p.version, payload)
        except KafkaProtocolError as exc:
            p.future.set_exception(exc)
            return
        p.future.set_result(resp)

    def _write(self, frame: bytes, immediate: bool = False) -> None:
        """Queue a request frame; the frames queued during one event-loop iteration are written with one
        write() call at its end. Thousands of idle members heartbeat over a few shared connections, and
        on loopback a write() also runs the receiving side's TCP processing, so one syscall per request
        costs more than the request itself. Large frames (produce, fetch with many partitions) go out at
        once, after what is queued (order is the correlation ids' order), as does an ``immediate`` one."""
        if immediate or len(frame) >= COALESCE_MAX_BYTES:
            self._flush()
            assert self._writer is not None
            self._writer.write(frame)
            return
        self._out.append(frame)
        if self._flush_handle is None:
            self._flush_handle = (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _flush(self) -> None:
        handle, self._flush_handle = self._flush_handle, None
        if handle is not None:
            handle.cancel()  # a no-op when called from the handle itself
        if not self._out:
            return
        out, self._out = self._out, []
        if self._writer is None or self._closed:
            return  # their futures failed with the connection
        self._writer.write(out[0] if len(out) == 1 else b"".join(out))

    def _fail(self, err: KafkaError) -> None:
        if not self._closed:
            self._closed = True
            self._close_reason = err
        self._out = []
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(err)
        if self._writer is not None:
            self._writer.close()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def abort(self, err: KafkaError) -> None:
        """Close at once (without waiting for the socket to go): every pending request fails with ``err``."""
        self._fail(err)

    async def close(self) -> None:
        self._fail(KafkaConnectionError(f"connection to {self.address} closed"))
        if self._protocol is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._protocol.closed), 1.0)

    async def wait_closed(self) -> None:
        """Until the socket is gone (the broker closed it, it broke, or :meth:`close`)."""
        if self._protocol is not None:
            await asyncio.shield(self._protocol.closed)


#: The longest wait between two connection attempts to a broker (as Kafka's Java client,
#: ``reconnect.backoff.max.ms`` = 1000). A broker that was down for a few seconds is reached again within
#: about a second of its return; with 10 s, the gateway found a restarted Kafka 4 s late, by when the
#: group coordinator had expired its members (session timeout) and the group rebalanced.
RECONNECT_BACKOFF_MAX_S = 1.0


class Backoff:
    """Exponential backoff with jitter (pure; the caller sleeps)."""

    def __init__(self, initial: float = 0.1, maximum: float = RECONNECT_BACKOFF_MAX_S, factor: float = 2.0,
                 jitter: float = 0.2, rng: Any = None) -> None:
        import random

        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random  # the shared generator: a Random() per instance costs 2.5 KB
        self.not_before = 0.0

    def failure(self, now: float | None = None) -> float:
        base = min(self.maximum, self.initial * (self.factor**self.failures))
        self.failures += 1
        delay = base * (1 + self.jitter * (2 * self._rng.random() - 1))
        self.not_before = (time.monotonic() if now is None else now) + delay
        return delay

    def success(self) -> None:
        self.failures = 0
        self.not_before = 0.0

    def remaining(self, now: float | None = None) -> float:
        return max(0.0, self.not_before - (time.monotonic() if now is None else now))


class ManagedConnection:
    """A connection to one broker that reconnects on demand with backoff; safe for concurrent senders."""

    def __init__(self, host: str, port: int, config: ConnectionConfig, node_id: int | None = None,
                 backoff: Backoff | None = None) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.config = config
        self.backoff = backoff or Backoff()
        self._conn: BrokerConnection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.reconnects = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def current(self) -> BrokerConnection | None:
        return self._conn if self._conn is not None and self._conn.connected else None

    async def get(self) -> BrokerConnection:
        conn = self._conn
        if conn is not None and conn.connected:
            return conn
        async with self._lock:
            if self._closed:
                raise KafkaConnectionError(f"connection to {self.address} was closed by its owner",
                                           retriable=False)
            conn = self._conn
            if conn is not None and conn.connected:
                return conn
            wait = self.backoff.remaining()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                conn = await BrokerConnection.open(self.host, self.port, self.config, self.node_id)
            except AuthenticationError:
                self.backoff.failure()
                raise
            except KafkaError:
                self.backoff.failure()
                raise
            if self._conn is not None:
                self.reconnects += 1
            self._conn = conn
            self.backoff.success()
            return conn

    async def send(self, req: Struct, version: int | None = None, timeout: float | None = None) -> Any:
        conn = await self.get()
        return await conn.send(req, version, timeout)

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            await self._conn.close()


# -- batched sends (idle heartbeats) --------------------------------------------------------------------------
# Frames built by the caller (bodies already encoded), numbered and queued on a connection in one go, their
# answers handed over raw from the connection's read callback, with BrokerConnection's own request bookkeeping
# (correlation ids, _pending, the timeout sweep, the write coalescing).

_REQ_HDR = struct.Struct(">ihhi")  # size, api key, api version, correlation id

#: ``on_done(item, payload, error)``: the raw answer (correlation id first, header tags included) or the error
BatchCallback = Callable[[Any, "bytes | None", "BaseException | None"], None]


class _BatchWaiter:
    """The waiter shared by every request of one :func:`send_frames_nowait` batch: future-like (done,
    set_result, set_exception) for the connection's read callback, timeout sweep and failure path. An answer
    names its request by correlation id; a timeout or a broken connection fails every request of the batch
    not answered yet at once (all of them share one deadline), after which the waiter is done and the
    connection drops its remaining entries without calling it."""

    __slots__ = ("_done", "first", "items", "left", "on_done", "seconds", "what")

    def __init__(self, first: int, items: list[Any], on_done: BatchCallback, what: str, seconds: float) -> None:
        self.first = first
        self.items: list[Any] = items
        self.left = len(items)
        self.on_done = on_done
        self.what = what
        self.seconds = seconds
        self._done = not items

    def done(self) -> bool:
        return self._done

    def set_result(self, payload: Any) -> None:
        if payload is _TIMED_OUT:
            self.set_exception(RequestTimeoutError(f"{self.what} timed out after {self.seconds:.1f}s"))
            return
        i = (int.from_bytes(payload[:4], "big") - self.first) & 0x7FFFFFFF
        items = self.items
        if i >= len(items) or items[i] is None:
            return
        item, items[i] = items[i], None
        self.left -= 1
        if not self.left:
            self._done = True
        try:
            self.on_done(item, payload, None)
        except Exception:  # it runs inside the transport's callbacks: never let it break the connection
            log.exception("callback of %s failed", self.what)

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            return
        self._done = True
        items, self.items = self.items, []
        for item in items:
            if item is not None:
                try:
                    self.on_done(item, None, exc)
                except Exception:
                    log.exception("callback of %s failed", self.what)


def send_frames_nowait(conn: BrokerConnection, api_key: int, version: int, bodies: Sequence[bytes],
                       items: list[Any], on_done: BatchCallback, timeout: float | None = None,
                       immediate: bool = False) -> None:
    """Send one request per encoded body (``api_key`` at ``version``) on ``conn``, all queued at once (they
    leave in the connection's one write of this loop iteration), without a task or future per request:
    ``on_done(items[i], raw answer, None)`` is called from the read callback when the answer to ``bodies[i]``
    arrives, ``on_done(items[i], None, error)`` when it cannot be sent, the connection breaks or ``timeout``
    (default: the request timeout) passes. ``items`` is taken over (entries are cleared as they are answered).
    A raw answer starts with the correlation id; the response header's tagged fields (flexible versions)
    follow it. ``on_done`` must not block: it runs inside the transport's callbacks. ``immediate``: written
    now rather than with the loop iteration's other requests (a produce request the broker should start on)."""
    if not bodies:
        return
    if len(items) != len(bodies):
        raise ValueError("one item per body")
    if not conn.connected:
        exc = conn._close_reason or KafkaConnectionError(f"connection to {conn.address} is closed")
        for item in items:
            on_done(item, None, exc)
        return
    loop = conn._loop or asyncio.get_running_loop()
    seconds = timeout if timeout is not None else conn.config.request_timeout
    deadline = loop.time() + seconds
    cm = M.REQUESTS[api_key]
    head = bytearray()
    P.write_nullable_string(head, conn.config.client_id)
    if cm.schema.is_flexible(version):
        head.append(0)  # header tagged fields
    tail = bytes(head)
    first = corr = conn._next_corr
    waiter = _BatchWaiter(first, items, on_done, f"{cm.schema.name} v{version} to {conn.address}", seconds)
    pending = conn._pending
    pack = _REQ_HDR.pack
    fixed = 8 + len(tail)
    parts: list[bytes] = []
    for body in bodies:
        pending[corr] = _Pending(api_key, version, waiter, True, deadline)
        parts += (pack(fixed + len(body), api_key, version, corr), tail, body)
        corr = (corr + 1) & 0x7FFFFFFF
    conn._next_corr = corr
    if conn._sweep_handle is None:
        conn._sweep_handle = loop.call_later(TIMEOUT_SWEEP_S, conn._sweep)
    data = b"".join(parts)
    conn._write(data, immediate)
    conn.bytes_sent += len(data)


def pause_reading(conn: BrokerConnection) -> None:
    """Stop reading ``conn``'s socket until :func:`resume_reading` (what arrives meanwhile waits in the kernel):
    for a connection whose answers are collected in bulk (heartbeats, service/group/heartbeats.py)."""
    transport = conn._writer
    if transport is not None and not conn._closed:
        transport.pause_reading()


def resume_reading(conn: BrokerConnection) -> None:
    transport = conn._writer
    if transport is not None and not conn._closed:
        transport.resume_reading()
