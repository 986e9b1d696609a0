"""Where a request goes. An instance request is served here when this replica holds the instance (the
route's own answer); otherwise (its 404/410 held back) it goes to the replica last seen holding it, then to
the ring owner, then to whichever peer answers a lookup; when none holds it the client gets 404/40403 (or the
410 of the replica where it expired). A create goes to the replica already holding that name, else to the
ring owner of the name; a create without a name stays here when this replica takes generated names.

Share consumer instances (``/share-groups/...``) take the same ways under their routing group
(:data:`~service.ring.SHARE_PREFIX` + share group): their "not here" answers are 404/40410 and 410/41010, and
they are never re-created from a descriptor (not durable)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from api.errors import error_response
from api.replicas.asgi import (
    ASGIApp,
    Captured,
    HoldNotFound,
    Receive,
    Recorder,
    Scope,
    Send,
    no_receive,
    replaying,
    unless_disconnected,
)
from api.replicas.metrics import RoutingMetrics
from api.responses import OrjsonResponse
from service.instances.registry import Gateway
from service.instances.share import ShareRegistry
from service.ring import (
    HintCache,
    PeerTable,
    name_of_create_body,
    owner,
    routing_key,
    share_group_of,
)

#: error codes of a route's answer that mean "this replica does not hold the instance" (consumer instances,
#: share consumer instances)
NOT_HERE_CODES = (40403, 41001, 40410, 41010)


class Routing:
    """The routing decisions of the :class:`~api.replicas.router.Router`."""

    gateway: Gateway
    shares: ShareRegistry | None
    mode: str
    table: PeerTable
    hints: HintCache
    metrics: RoutingMetrics

    if TYPE_CHECKING:  # from the other parts of the Router
        @property
        def self_id(self) -> str: ...

        def _sync(self) -> None: ...

        def owner(self, group: str, name: str) -> str: ...

        async def lookup(self, group: str, name: str, exclude: set[str]) -> list[str]: ...

        async def authenticated(self, scope: Scope, send: Send) -> bool: ...

        async def forward(self, target: str, scope: Scope, body: bytes, send: Send) -> Captured | str: ...

        def redirect(self, target: str, scope: Scope) -> OrjsonResponse | None: ...

    def holds(self, group: str, name: str) -> bool:
        """Whether this replica holds the instance of a routing group (a share instance under
        :data:`~service.ring.SHARE_PREFIX`, else a consumer instance) for some tenant."""
        share = share_group_of(group)
        if share is None:
            return self.gateway.holds(group, name)
        return self.shares is not None and self.shares.holds(share, name)

    # -- instance requests -------------------------------------------------------------------------------
    async def route_instance(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, group: str,
                             name: str) -> None:
        recorder = Recorder(receive)
        local: Captured | None = None
        # (while the instance is being handed off here, this waits: then it is gone and the request goes on)
        async with self.gateway.serving(group, name):
            if self.holds(group, name):
                # Here for some tenant: the route decides (authenticated), and only its 404/410 goes further
                hold = HoldNotFound(send)
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
                await resp(scope, no_receive, send)
                return
            await self._not_held(app, scope, receive, body, send, group, name, local, None, [])
            return
        await unless_disconnected(receive, self._forward_instance(app, scope, receive, body, send, group, name,
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
        """No replica holds it. With durable instances its owner among the live replicas re-creates it from
        its descriptor (here, or forwarded there marked to re-create); otherwise, or when that fails, this
        replica's own answer (authentication first: a 401 stays a 401), a 410 from where it expired rather
        than a 404, and a 404 that names the unreachable replicas."""
        share = share_group_of(group)
        if self.gateway.durable_instances and not self.gateway.draining and share is None:
            live = [r for r in self.table.placement_ids() if r not in unreachable]
            target = owner(live, routing_key(group, name)) or self.self_id
            if target == self.self_id:
                scope.setdefault("state", {})["kcg_recreate"] = True
                self.metrics.count("recreate_here")
                await app(scope, replaying(body, receive), send)
                return
            got = await self.forward(target, {**scope, "kcg_recreate": True}, body, send)
            if got == "done":
                self.metrics.count("recreate_forwarded")
                return
            if got == "unreachable":
                unreachable.append(target)
        if local is None:
            hold = HoldNotFound(send)
            await app(scope, replaying(body, receive), hold.send)
            local = hold.captured
            if local is None:
                return  # answered (401, 429, ...)
        self.metrics.count("not_found")
        if local.status == 404 and local.error_code in (40403, 40410):
            if gone is not None:
                local = gone
            elif unreachable:
                names = ", ".join(repr(r) for r in unreachable)
                what = "consumer instance" if share is None else "share consumer instance"
                await error_response(404, 40403 if share is None else 40410, f"{what} {name!r} not found in group "
                                     f"{(group if share is None else share)!r}: gateway replica {names} is "
                                     "unreachable (stopped or restarted) and no other replica holds it; create the "
                                     f"{what} again")(scope, no_receive, send)
                return
        await local.replay(send)

    # -- creates -----------------------------------------------------------------------------------------
    async def route_create(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, group: str) -> None:
        recorder = Recorder(receive)
        body = await recorder.body()
        if body is None:
            return
        replay = replaying(body, receive)
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
            async with self.gateway.serving(group, wanted.name):  # (waits while it is being handed off here)
                if self.holds(group, wanted.name):
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
        await unless_disconnected(receive, self._forward_create(app, scope, replay, body, send, group,
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

