"""The ``/internal/*`` endpoints the replicas call on each other, all behind the peer token:
``/internal/peer`` (identity, probed), ``/internal/peers`` (the peer table), ``/internal/lookup`` (does this
replica hold an instance) and ``/internal/quota/*`` (:mod:`api.replicas.quota`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from api.errors import error_response
from api.replicas.asgi import (
    ASGIApp,
    Receive,
    Scope,
    Send,
)
from api.replicas.quota import QUOTA_PATHS
from api.responses import OrjsonResponse
from service.instances.registry import Gateway
from service.ring import (
    TOKEN_HEADER,
    Identity,
    PeerTable,
)


class InternalEndpoints:
    """``/internal/*`` of the :class:`~api.replicas.router.Router`."""

    gateway: Gateway
    table: PeerTable
    refreshes: int

    if TYPE_CHECKING:  # from the other parts of the Router
        @property
        def self_id(self) -> str: ...

        def _sync(self) -> None: ...

        def identity(self) -> Identity: ...

        def holds(self, group: str, name: str) -> bool: ...

        def token_ok(self, scope: Scope) -> bool: ...

        def refused(self, scope: Scope, message: str) -> ASGIApp: ...

        async def quota_endpoint(self, scope: Scope, receive: Receive, path: str) -> ASGIApp: ...

    async def internal(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path not in ("/internal/peer", "/internal/lookup", "/internal/peers", *QUOTA_PATHS):
            resp: ASGIApp = error_response(404, 40400, f"no such endpoint: {scope['method']} {path}")
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
                resp = OrjsonResponse({"replica_id": self.self_id, "held": self.holds(group, name)})
        await resp(scope, receive, send)

