"""The :class:`Router` of one replica: the routing state (settings, peer table, hints, clients, metrics,
quota coordinator) in one object, whose behaviour comes from one mixin per concern: :class:`PeerSet`
(:mod:`~api.replicas.peers`), :class:`PeerAuth` (:mod:`~api.replicas.peer_auth`), :class:`Forwarding`
(:mod:`~api.replicas.forward`), :class:`Routing` (:mod:`~api.replicas.route`), :class:`QuotaTransport`
(:mod:`~api.replicas.quota`), :class:`InternalEndpoints` (:mod:`~api.replicas.internal`) and
:class:`InstanceMoves` (:mod:`~api.replicas.moves`). Each mixin
declares the attributes it reads; they are all set here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

import httpx
from prometheus_client import CollectorRegistry

from api.auth import AuthFailureLimiter
from api.replicas.forward import Forwarding
from api.replicas.internal import InternalEndpoints
from api.replicas.metrics import RoutingMetrics
from api.replicas.moves import InstanceMoves
from api.replicas.peer_auth import PeerAuth, peer_ssl_context, peer_tls_enabled
from api.replicas.peers import PROBE_TIMEOUT_S, PeerSet
from api.replicas.quota import QuotaTransport
from api.replicas.route import Routing
from api.replicas.upstream import UpstreamPool
from service.durable.moves import AliveSince
from service.instances.registry import Gateway
from service.instances.share import ShareRegistry
from service.ring import (
    HintCache,
    PeerTable,
    parse_peer_dns,
    parse_peers,
)
from service.settings import Settings
from service.tenants.quotas import InstanceQuotaCoordinator

#: added to GATEWAY_MAX_POLL_TIMEOUT_MS for the read timeout of a forwarded request (streams: none)
POLL_MARGIN_S = 30.0


class Router(PeerSet, PeerAuth, Forwarding, Routing, QuotaTransport, InternalEndpoints, InstanceMoves):
    """The peer table, its refresh loop, the forwarding client and the routing decisions of one replica."""

    def __init__(self, settings: Settings, gateway: Gateway, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.gateway = gateway
        self.shares: ShareRegistry | None = None  # install_routing: the app's share consumer instances
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
        #: durable instances: moves to new ring owners after each refresh (api/replicas/moves.py)
        self.alive_since = AliveSince()
        self._move_task: asyncio.Task[None] | None = None
        # httpx logs every request at INFO: the probes would fill the log (their state changes are logged here)
        httpx_log = logging.getLogger("httpx")
        if httpx_log.getEffectiveLevel() < logging.WARNING:
            httpx_log.setLevel(logging.WARNING)

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
        await self.stop_moves()
        for task in (self._task, self._quota_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.client is not None:
            await self.client.aclose()
        self.pool.close()

