"""One test broker: a TCP listener speaking the Kafka wire protocol with our codecs.

Each client connection is served by one task that reads a request, handles it and writes the answer
before reading the next, like a Kafka broker that mutes a connection while one of its requests is in
flight. Per request the broker:

1. decodes the header (garbage → close) and logs the request (see :mod:`tests.fakes.broker.log`);
2. closes the connection if SASL is enabled and the request is not allowed yet, or if the API key is
   unknown or not advertised, or the version is outside the advertised range (except an ApiVersions
   request above it, answered in v0 with UNSUPPORTED_VERSION) or the body does not decode;
3. applies the faults that match (broker's own, then cluster-wide);
4. calls the registered handler and writes its response.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from typing import TYPE_CHECKING, Any

from service.protocol import frames
from service.protocol.errors import ProtocolDecodeError, UnsupportedVersionError
from service.protocol.messages import REQUESTS
from tests.fakes.broker.faults import FaultInjector
from tests.fakes.broker.log import RequestLogEntry
from tests.fakes.broker.registry import ApiEntry, CloseConnection, RequestContext, empty_response, set_error_codes
from tests.fakes.broker.sasl_server import SaslPhase, SaslServerError, SaslSession

if TYPE_CHECKING:
    from tests.fakes.broker.cluster import TestCluster

log = logging.getLogger(__name__)

VersionRange = tuple[int, int]
MAX_REQUEST_SIZE = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
MAX_UNAUTHENTICATED_SIZE = 512 * 1024  # Kafka's sasl.server.max.receive.size default
_SIZE = struct.Struct(">i")


class ClientConnection:
    """One accepted client connection. ``data`` is free for per-connection state of handlers."""

    def __init__(self, broker: BrokerServer, conn_id: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self.id = conn_id
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.sasl = SaslSession(broker.sasl_mechanisms is not None)
        self.task: asyncio.Task[Any] | None = None
        self.closed = False
        self.data: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<ClientConnection {self.id} node={self.broker.node_id} peer={self.peer}>"

    async def close(self) -> None:
        """Close the socket and stop serving (safe to call from the connection's own task)."""
        self.closed = True
        self.writer.close()
        task = self.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class BrokerServer:
    """A listener with a node id. Tests reach it through ``TestCluster.broker(node_id)``."""

    def __init__(self, cluster: TestCluster, node_id: int, host: str, port: int = 0, *,
                 sasl_mechanisms: list[str] | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.cluster = cluster
        self.ssl_context = ssl_context  # a TLS listener when set
        self.node_id = node_id
        self.host = host
        self.port = port
        self.faults = FaultInjector()
        # api key -> (min, max) or None (not advertised); takes precedence over the cluster's override
        self.api_versions_override: dict[int, VersionRange | None] = {}
        # None: SASL disabled; otherwise the mechanisms a client may pick in SaslHandshake
        self.sasl_mechanisms = sasl_mechanisms
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.Server | None = None
        self._generation = 0  # bumped per start(); connections accepted by an older listener are refused

    def __repr__(self) -> str:
        return f"<BrokerServer node={self.node_id} {self.host}:{self.port} running={self.running}>"

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._server is not None:
            return
        self._generation += 1
        generation = self._generation

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if generation != self._generation:
                writer.close()  # accepted just before stop(): the broker is gone
                return
            await self._on_client(reader, writer)

        self._server = await asyncio.start_server(on_client, self.host, self.port, reuse_address=True,
                                                  ssl=self.ssl_context)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._generation += 1
        server.close()
        await self.close_connections()
        await server.wait_closed()

    async def close_connections(self) -> int:
        conns = list(self.connections)
        for conn in conns:
            await conn.close()
        return len(conns)

    # -- versions --------------------------------------------------------------------------------------
    def advertised_versions(self) -> dict[int, VersionRange]:
        """What ApiVersions answers: the registered handlers' ranges (plus, for keys without a handler that
        an override names or when the cluster advertises all codecs, the codec range), replaced by the
        broker's override for that key or else the cluster's."""
        registry = self.cluster.registry
        cluster_ov = self.cluster.api_versions_override
        keys = set(registry.keys()) | set(cluster_ov) | set(self.api_versions_override)
        if self.cluster.advertise_all_codecs:
            keys |= set(REQUESTS)
        out: dict[int, VersionRange] = {}
        for key in sorted(keys):
            cm = REQUESTS.get(key)
            if cm is None:
                continue
            entry = registry.get(key)
            lo, hi = entry.versions if entry is not None else cm.schema.versions
            # An override is advertised as given, even outside what our codecs implement, so tests can
            # impersonate older or newer brokers (a request in an unimplemented version is then refused).
            if key in self.api_versions_override:
                limit = self.api_versions_override[key]
            elif key in cluster_ov:
                limit = cluster_ov[key]
            else:
                limit = (lo, hi)
            if limit is None:
                continue
            if limit[0] <= limit[1]:
                out[key] = (limit[0], limit[1])
        return out

    # -- serving ---------------------------------------------------------------------------------------
    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = ClientConnection(self, self.cluster.next_connection_id(), reader, writer)
        conn.task = asyncio.current_task()
        self.connections.add(conn)
        try:
            await self._serve(conn)
        except asyncio.CancelledError:
            pass  # closed by the test or by stop(); nothing awaits this task's result
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # a bug in a handler or in the broker itself
            log.exception("test broker %s: connection %s failed", self.node_id, conn.id)
            self.cluster.errors.append(exc)
        finally:
            self.connections.discard(conn)
            conn.closed = True
            writer.close()

    async def _serve(self, conn: ClientConnection) -> None:
        reader = conn.reader
        while not conn.closed:
            try:
                head = await reader.readexactly(4)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            (size,) = _SIZE.unpack(head)
            pre_auth = conn.sasl.enabled and not conn.sasl.authenticated
            limit = MAX_UNAUTHENTICATED_SIZE if pre_auth else self.cluster.max_request_size
            if size <= 0 or size > limit:
                return
            payload = await reader.readexactly(size)
            if conn.sasl.phase is SaslPhase.RAW:
                if not await self._raw_sasl_token(conn, payload):
                    return
                continue
            if not await self._process(conn, payload, size):
                return

    async def _raw_sasl_token(self, conn: ClientConnection, token: bytes) -> bool:
        """After SaslHandshake v0 the client sends bare size-prefixed SASL tokens; answer alike."""
        try:
            reply = conn.sasl.step(token)
        except SaslServerError:
            return False
        conn.writer.write(_SIZE.pack(len(reply)) + reply)
        await conn.writer.drain()
        return True

    async def _process(self, conn: ClientConnection, payload: bytes, size: int) -> bool:
        """Handle one request frame; returns False when the connection must be closed."""
        rlog = self.cluster.log
        try:
            header, body_pos = frames.decode_request_header(payload)
        except ProtocolDecodeError:
            api_key, version = struct.unpack_from(">hh", payload) if len(payload) >= 4 else (-1, -1)
            rlog.append(RequestLogEntry(rlog.next_seq(), self.node_id, conn.id, api_key, version, -1, None, size,
                                        outcome="closed"))
            return False
        entry = RequestLogEntry(rlog.next_seq(), self.node_id, conn.id, header.api_key, header.api_version,
                                header.correlation_id, header.client_id, size)
        reg_entry = self.cluster.registry.get(header.api_key)
        ctx = RequestContext(self.cluster, self, conn, header, entry)
        advertised = self.advertised_versions().get(header.api_key)
        cm = REQUESTS.get(header.api_key)

        request: Any = None
        if cm is not None and advertised is not None and advertised[0] <= header.api_version <= advertised[1]:
            try:
                request = cm.decode(payload, header.api_version, body_pos)
            except (ProtocolDecodeError, UnsupportedVersionError):
                request = None
        entry.request = request
        rlog.append(entry)
        try:
            return await self._dispatch(ctx, conn, reg_entry, advertised, request)
        finally:
            if entry.outcome == "pending":
                entry.outcome = "aborted"
            rlog.notify()

    async def _dispatch(self, ctx: RequestContext, conn: ClientConnection, reg_entry: ApiEntry | None,
                        advertised: VersionRange | None, request: Any) -> bool:
        header, entry = ctx.header, ctx.entry
        if not conn.sasl.permits(header.api_key):
            entry.outcome = "closed"
            return False
        if advertised is None:
            entry.outcome = "closed"  # unknown or not advertised API: Kafka drops the connection
            return False
        if not advertised[0] <= header.api_version <= advertised[1]:
            if header.api_version > advertised[1] and reg_entry is not None and reg_entry.unsupported_version:
                answer = reg_entry.unsupported_version(ctx)
                if answer is not None:
                    resp, resp_version = answer
                    await self._send(ctx, resp, resp_version, "answered")
                    return not ctx.close_after
            entry.outcome = "closed"
            return False
        if request is None:
            entry.outcome = "closed"  # body does not decode
            return False

        faults = self.faults.take(header, request) + self.cluster.faults.take(header, request)
        for fault in faults:
            if fault.kind == "delay":
                await fault.wait()
        if any(f.kind == "drop" for f in faults):
            entry.outcome = "dropped"
            return False
        errors = [f for f in faults if f.kind == "error"]
        try:
            if errors:
                err = errors[-1]
                resp = await self._error_response(ctx, reg_entry, request, err.error_code, err.depth)
                outcome = "error-injected"
            elif reg_entry is None:
                entry.outcome = "closed"  # advertised through an override but not implemented
                return False
            else:
                resp = await reg_entry.handler(ctx, request)
                outcome = "answered"
        except CloseConnection:
            entry.outcome = "closed"
            return False
        if resp is None:
            entry.outcome = "no-response"
        else:
            await self._send(ctx, resp, header.api_version, outcome)
        return not ctx.close_after

    async def _error_response(self, ctx: RequestContext, reg_entry: ApiEntry | None, request: Any,
                              code: int, depth: int | None) -> Any:
        if reg_entry is not None and reg_entry.error_response is not None:
            return await reg_entry.error_response(ctx, request, code, depth)
        if reg_entry is not None:
            resp = await reg_entry.handler(ctx, request)
            if resp is not None:
                set_error_codes(resp, code, depth)
                return resp
        return empty_response(ctx.api_key, code)

    async def _send(self, ctx: RequestContext, resp: Any, version: int, outcome: str) -> None:
        frame = frames.encode_response(resp, version, ctx.header.correlation_id)
        ctx.connection.writer.write(frame)
        ctx.entry.response = resp
        try:
            await ctx.connection.writer.drain()
        except ConnectionError:
            ctx.entry.outcome = "aborted"
            raise
        ctx.entry.outcome = outcome
