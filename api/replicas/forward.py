"""One hop: send a request to the replica holding the instance and pass its answer through to the client
chunk by chunk (streams and long polls included; a target that breaks off mid-stream ends the stream with an
error event), or answer a 307 to it (``GATEWAY_ROUTING=redirect``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

import orjson

from api.errors import error_response
from api.replicas.asgi import (
    Captured,
    Scope,
    Send,
    header,
    no_receive,
)
from api.replicas.metrics import RoutingMetrics
from api.replicas.upstream import UpstreamConnectError, UpstreamError, UpstreamPool
from api.responses import OrjsonResponse
from service.ring import (
    ABSENT_HEADER,
    CLIENT_HEADER,
    HOP_HEADER,
    RECREATE_HEADER,
    SCHEME_HEADER,
    SERVED_BY_HEADER,
    TOKEN_HEADER,
    PeerTable,
)

log = logging.getLogger(__name__)

_HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
               b"upgrade", b"proxy-authenticate", b"proxy-authorization"}
_DROP_REQUEST = _HOP_BY_HOP | {b"content-length", b"expect"}
_DROP_RESPONSE = _HOP_BY_HOP | {b"date", b"server"}
_HOP = HOP_HEADER.encode()
_TOKEN = TOKEN_HEADER.encode()
_STREAM_MEDIA = ("application/x-ndjson", "text/event-stream")
_ABSENT = ABSENT_HEADER.encode()
_SERVED_BY = SERVED_BY_HEADER.encode()


class Forwarding:
    """Forwarding and redirecting of the :class:`~api.replicas.router.Router`."""

    token: str | None
    table: PeerTable
    metrics: RoutingMetrics
    pool: UpstreamPool
    read_timeout: float

    if TYPE_CHECKING:  # from the other parts of the Router
        @property
        def self_id(self) -> str: ...

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
        if scope.get("kcg_recreate"):
            out.append((RECREATE_HEADER.encode(), b"1"))
        return out

    def _is_stream(self, scope: Scope) -> bool:
        accept = (header(scope, b"accept") or b"").decode("latin-1").lower()
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
            await error_response(503, 50303, f"the gateway replica {target!r} holding this instance "
                                 f"failed during the request ({exc}); retry, and if it keeps failing create the "
                                 "instance again", {"Retry-After": "1"})(scope, no_receive, send)
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
                                    "this instance failed; commit (or acknowledge) what you received, then retry "
                                    "(create the instance again if it is gone)"})
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

