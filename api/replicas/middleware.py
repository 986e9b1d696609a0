"""The entry point: :class:`RoutingMiddleware` sorts each request. ``/internal/*`` → :mod:`api.replicas.internal`;
a request a peer forwarded (:data:`~service.ring.HOP_HEADER`, peer token checked) → served here, never
forwarded again; an instance request or a create → :mod:`api.replicas.route`; anything else → the app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.replicas.asgi import (
    ASGIApp,
    HoldNotFound,
    Message,
    Receive,
    Scope,
    Send,
    header,
)
from api.replicas.route import NOT_HERE_CODES
from service.ring import (
    ABSENT_HEADER,
    HOP_HEADER,
    RECREATE_HEADER,
    TOKEN_HEADER,
    group_of_create_path,
    instance_of_path,
)

if TYPE_CHECKING:
    from api.replicas.router import Router

_HOP = HOP_HEADER.encode()


class RoutingMiddleware:
    """The ASGI middleware of the routing layer (installed by :func:`api.replicas.install_routing`)."""

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
        if header(scope, _HOP) is not None:
            # Forwarded by a peer: served here, never forwarded again
            if not router.token_ok(scope):
                await router.refused(scope, f"forwarded request ({HOP_HEADER}) without the gateway replicas' "
                                     f"peer token ({TOKEN_HEADER})")(scope, receive, send)
                return
            router.restore_client(scope)
            inst = instance_of_path(path)
            if inst is not None:
                send = marking_absent(send)
                if header(scope, RECREATE_HEADER.encode()) is not None:
                    # the forwarding replica found no holder and this replica is the owner: re-create
                    scope.setdefault("state", {})["kcg_recreate"] = True
            router.metrics.in_flight_in.inc()
            try:
                if inst is None:
                    await self.app(scope, receive, send)
                else:
                    async with router.gateway.serving(*inst):  # (waits while it is being handed off here)
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


def marking_absent(send: Send) -> Send:
    """On a forwarded instance request: a 404/40403 or 410/41001 answer gets :data:`ABSENT_HEADER`, telling
    the forwarding replica to look elsewhere."""
    hold = HoldNotFound(send)
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

