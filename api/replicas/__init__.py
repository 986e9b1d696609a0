"""Any replica serves any instance: the HTTP side of routing between gateway replicas (see docs/routing.md;
the pure core, ring and peer table, is :mod:`service.ring`).

The way of one request through the replicas, module by module:

1. :mod:`~api.replicas.middleware` — :class:`RoutingMiddleware` (inside ``ObserveMiddleware``: trailing
   slashes stripped, bodies capped) sorts the request: ``/internal/*``, forwarded by a peer (served here,
   never forwarded twice), an instance request or a create, or anything else (straight to the app).
2. :mod:`~api.replicas.route` — where it goes: served here when this replica holds the instance; else (the
   route's 404/410 held back) to the replica last seen holding it, the ring owner, then whichever peer
   answers a lookup; 404/40403 when none holds it. Creates go to the holder of the name or its ring owner.
   Share consumer instances (``/share-groups/...``) are routed alike (:data:`service.ring.SHARE_PREFIX`).
3. :mod:`~api.replicas.peer_auth` — before anything leaves this replica the client is authenticated here;
   forwarded requests and ``/internal`` carry the peer token; peer TLS settings and their start-up checks.
4. :mod:`~api.replicas.forward` — one hop: the request sent to the target and its answer passed through
   chunk by chunk (streams, long polls), or a 307 with ``GATEWAY_ROUTING=redirect``; over
   :mod:`~api.replicas.upstream` (:class:`UpstreamPool`, keep-alive HTTP/1.1 parsed with httptools).
5. On the target, the same middleware serves it (step 1) and marks a "not here" answer with
   :data:`~service.ring.ABSENT_HEADER`, so the forwarding replica tries the next candidate.

Around it: :mod:`~api.replicas.peers` (the peer set: discovery, probes, lookups, ring owner),
:mod:`~api.replicas.internal` (the ``/internal/*`` endpoints), :mod:`~api.replicas.moves` (durable instances
handed off to their new ring owner when the replica set changes), :mod:`~api.replicas.quota` (``max_instances``
across replicas over ``/internal/quota/*``), :mod:`~api.replicas.router` (the :class:`Router` that holds the
state and combines these), :mod:`~api.replicas.asgi` (ASGI helpers) and :mod:`~api.replicas.metrics`.
"""

from __future__ import annotations

from fastapi import FastAPI

from api.replicas.middleware import RoutingMiddleware
from api.replicas.peer_auth import peer_token_problem
from api.replicas.router import Router
from service.instances.registry import Gateway
from service.ring import SHARE_PREFIX
from service.settings import Settings

__all__ = ["Router", "RoutingMiddleware", "install_routing"]


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
    shares = getattr(app.state, "shares", None)
    if shares is not None:  # share consumer instances are routed like consumer instances (SHARE_PREFIX)
        router.shares = shares
        shares.name_placement = lambda group, name: router.owns(SHARE_PREFIX + group, name)
        shares.instance_quota = router.quota  # max_instances across the replica set, as for consumer instances
    for tenant in app.state.tenants.tenants.values():  # rates and concurrency: this replica's share
        tenant.replicas = router.replica_count
    app.add_middleware(RoutingMiddleware, router=router)
    app.state.routing = router
    return router
