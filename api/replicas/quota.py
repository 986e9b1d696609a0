"""``max_instances`` across the replica set over HTTP: the transport of
:class:`service.tenants.quotas.InstanceQuotaCoordinator` (calls to a peer's ``/internal/quota/*``) and this
replica's answers to them; the owner of record of a tenant's instance count is the ring owner of the tenant."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import httpx
import orjson

from api.errors import error_response
from api.replicas.asgi import (
    ASGIApp,
    Receive,
    Scope,
)
from api.replicas.peers import LOOKUP_TIMEOUT_S
from api.responses import OrjsonResponse
from service.instances.registry import Gateway
from service.instances.share import ShareRegistry, quota_tenant_of
from service.ring import (
    PeerTable,
)
from service.tenants.quotas import InstanceQuotaCoordinator, PeerFailed, PeerUnreachable, QuotaUnavailable

#: a reservation may wait for the owner of record to ask every replica for its instances (LOOKUP_TIMEOUT_S)
QUOTA_TIMEOUT_S = 3.0
QUOTA_PATHS = ("/internal/quota/held", "/internal/quota/reserve", "/internal/quota/release")


class QuotaTransport:
    """Tenant instance counts of the :class:`~api.replicas.router.Router`."""

    gateway: Gateway
    table: PeerTable
    client: httpx.AsyncClient | None
    quota: InstanceQuotaCoordinator
    shares: ShareRegistry | None

    if TYPE_CHECKING:  # from the other parts of the Router
        @property
        def self_id(self) -> str: ...

        def owner(self, group: str, name: str) -> str: ...

        def _internal_headers(self) -> dict[str, str]: ...

        def _extensions(self, url: str) -> dict[str, Any]: ...

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
        share_tenant = quota_tenant_of(tenant)  # the tenant's share instances, counted apart
        if share_tenant is not None:
            return self.shares.quota_tokens(share_tenant) if self.shares is not None else []
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

