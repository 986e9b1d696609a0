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
from collections.abc import Callable, Mapping

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
    return proxies


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
    """At most ``per_minute`` failed authentications (wrong credentials: API keys, JWTs, the admin token,
    the peer token; missing ones do not count) per client address in any 60 s. Beyond that, requests from
    the address whose credentials are wrong answer 429/42901 (with ``Retry-After``) instead of 401, until
    the oldest failure is a minute old. Valid credentials always pass: behind an ingress every client
    shares the ingress's address, and one client guessing must not lock out the others (a success does
    not clear the address's failures either: the guesser's count keeps running). Keeps at most
    ``max_addresses`` addresses (the least recently failing are forgotten first)."""

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

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until the address may fail again, or None when it is not blocked."""
        if self.per_minute <= 0:
            return None
        with self._lock:
            now = self._clock()
            times = self._recent(address, now)
            if times is None or len(times) < self.per_minute:
                return None
            wait = times[0] + self.WINDOW - now
        return max(1, math.ceil(wait))

    def check(self, address: str) -> None:
        """429/42901 when the address is blocked (call it for a request whose credentials were wrong)."""
        wait = self.retry_after(address)
        if wait is not None:
            raise TenantError(429, RATE_LIMITED, "too many failed authentication attempts from this address",
                              retry_after=wait)

    def refuse(self, address: str) -> None:
        """A wrong credential from ``address``: 429/42901 when the address is already blocked, else the
        failure is counted (the caller then answers its 401/403)."""
        self.check(address)
        self.failed(address)

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


_NO_HEADERS: Mapping[str, str] = {}


def presents_credentials(headers: Mapping[str, str]) -> bool:
    """Whether a request carries tenant credentials (a request without any is not a guess)."""
    return "authorization" in headers or "x-api-key" in headers


def auth_limiter(request: Request) -> AuthFailureLimiter | None:
    return getattr(request.app.state, "auth_limiter", None)


def authenticate(request: Request) -> Tenant:
    """The tenant the request's credentials belong to, without charging its rate limit (the routing layer
    checks credentials before forwarding; the replica that serves the request charges it). Wrong
    credentials count against the client address; from a blocked address they answer 429/42901 instead
    of 401. Valid credentials always pass."""
    registry: TenantRegistry = request.app.state.tenants
    if not registry.auth_required:  # open mode: the one tenant, whatever the headers say
        return registry.authenticate(_NO_HEADERS)
    try:
        return registry.authenticate(request.headers)
    except TenantError as exc:
        limiter = auth_limiter(request)
        if limiter is not None and exc.status == 401 and registry.auth_required and \
                presents_credentials(request.headers):
            limiter.refuse(client_address(request))
        raise


def count_wrong_secret(request: Request) -> None:
    """A wrong admin or peer token: counted against the client address like a wrong API key; 429/42901
    (TenantError) when the address is already blocked."""
    limiter = auth_limiter(request)
    if limiter is not None:
        limiter.refuse(client_address(request))


async def current_tenant(request: Request) -> Tenant:
    """The authenticated tenant of this request, after charging one request to its rate limit."""
    return charge_tenant(request)


def charge_tenant(request: Request) -> Tenant:
    """:func:`current_tenant` for callers that do not await (the protocol-level produce path)."""
    tenant = authenticate(request)
    tenant.check_rate()
    request.state.tenant = tenant
    return tenant


async def tenant_error_handler(request: Request, exc: Exception) -> Response:
    """``app.add_exception_handler(TenantError, tenant_error_handler)``: the error JSON with
    ``WWW-Authenticate`` (401) or ``Retry-After`` (429)."""
    assert isinstance(exc, TenantError)
    return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)
