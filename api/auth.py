"""Authentication for the HTTP layer: the ``current_tenant`` dependency, the TenantError handler, trusted
proxies and the per-address limit on failed authentications.

Routes declare ``tenant: Tenant = Depends(current_tenant)``; the registry lives in
``app.state.tenants`` (a :class:`service.tenants.TenantRegistry`). Failures raise
:class:`service.tenants.TenantError` (401/40101, 429/42901), which :func:`tenant_error_handler` (the
handler :func:`api.app.create_app` installs) turns into ``{"error_code", "message"}`` JSON with
``WWW-Authenticate`` or ``Retry-After`` as appropriate.

``Forwarded`` / ``X-Forwarded-*`` headers are believed only from the addresses in
``GATEWAY_FORWARDED_ALLOW_IPS`` (:func:`peer_is_trusted_proxy`); anyone else could forge them.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response

from api.errors import error_response
from service.tenants import RATE_LIMITED, Tenant, TenantError, TenantRegistry

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """``GATEWAY_FORWARDED_ALLOW_IPS``: comma-separated addresses or CIDR networks, or ``*`` (everyone)."""

    def __init__(self, spec: str) -> None:
        self.any = False
        self.networks: list[IPNetwork] = []
        for item in (p.strip() for p in spec.split(",")):
            if not item:
                continue
            if item == "*":
                self.any = True
            else:
                try:
                    self.networks.append(ipaddress.ip_network(item, strict=False))
                except ValueError:
                    raise ValueError(f"GATEWAY_FORWARDED_ALLOW_IPS: {item!r} is not an address or network") from None

    def trusts(self, host: str | None) -> bool:
        if self.any:
            return True
        if not host:
            return False
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)


def _trusted_proxies(request: Request) -> TrustedProxies:
    state = request.app.state
    proxies = getattr(state, "trusted_proxies", None)
    if proxies is None:
        settings = getattr(state, "settings", None)
        proxies = TrustedProxies(getattr(settings, "forwarded_allow_ips", "127.0.0.1"))
        state.trusted_proxies = proxies
    return proxies  # type: ignore[no-any-return]


def peer_is_trusted_proxy(request: Request) -> bool:
    """Whether the directly connected peer may set ``Forwarded`` / ``X-Forwarded-*`` headers."""
    return _trusted_proxies(request).trusts(request.client.host if request.client else None)


def client_address(request: Request) -> str:
    """The client's address: the peer, or behind trusted proxies the nearest untrusted ``X-Forwarded-For``
    hop (proxies append, so only hops added by trusted proxies can be believed)."""
    peer = request.client.host if request.client else ""
    proxies = _trusted_proxies(request)
    if not proxies.trusts(peer):
        return peer
    hops = [h.strip() for h in request.headers.get("x-forwarded-for", "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not proxies.trusts(hop):
            return hop
    return hops[0] if hops else peer


class AuthFailureLimiter:
    """At most ``per_minute`` failed authentications (wrong credentials; missing ones do not count) per
    client address in any 60 s; beyond that every request from the address answers 429/42901 (with
    ``Retry-After``) without checking credentials, until the oldest failure is a minute old. A success
    before the block clears the address's failures. Keeps at most ``max_addresses`` addresses (the least
    recently failing are forgotten first)."""

    WINDOW = 60.0

    def __init__(self, per_minute: int, *, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.max_addresses = max_addresses
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.WINDOW:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def check(self, address: str) -> None:
        if self.per_minute <= 0:
            return
        with self._lock:
            now = self._clock()
            times = self._recent(address, now)
            if times is None or len(times) < self.per_minute:
                return
            wait = times[0] + self.WINDOW - now
        raise TenantError(429, RATE_LIMITED, "too many failed authentication attempts from this address",
                          retry_after=max(1, math.ceil(wait)))

    def succeeded(self, address: str) -> None:
        """A successful authentication clears the address's failures (a client that fumbled its key
        once in a while is never locked out; an address that is blocked cannot get here)."""
        if self._failures:
            with self._lock:
                self._failures.pop(address, None)

    def failed(self, address: str) -> None:
        if self.per_minute <= 0:
            return
        with self._lock:
            now = self._clock()
            times = self._recent(address, now)
            if times is None:
                times = self._failures[address] = deque()
            self._failures.move_to_end(address)
            times.append(now)
            if len(times) > self.per_minute:
                times.popleft()
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)


async def current_tenant(request: Request) -> Tenant:
    """The authenticated tenant of this request, after charging one request to its rate limit."""
    registry: TenantRegistry = request.app.state.tenants
    limiter: AuthFailureLimiter | None = getattr(request.app.state, "auth_limiter", None)
    address = client_address(request) if limiter is not None and registry.auth_required else ""
    if limiter is not None and registry.auth_required:
        limiter.check(address)
    try:
        tenant = registry.authenticate(request.headers)
    except TenantError as exc:
        # Only wrong credentials count (guessing); a request without any is not an attempt.
        presented = "authorization" in request.headers or "x-api-key" in request.headers
        if limiter is not None and exc.status == 401 and presented:
            limiter.failed(address)
        raise
    if limiter is not None and registry.auth_required:
        limiter.succeeded(address)
    tenant.check_rate()
    request.state.tenant = tenant
    return tenant


async def tenant_error_handler(request: Request, exc: Exception) -> Response:
    """``app.add_exception_handler(TenantError, tenant_error_handler)``: the error JSON with
    ``WWW-Authenticate`` (401) or ``Retry-After`` (429)."""
    assert isinstance(exc, TenantError)
    return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)
