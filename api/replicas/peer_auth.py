"""Who is a peer: the peer token on /internal and forwarded requests (refusals counted and rate-limited),
the original client restored on a forwarded request, client authentication before anything leaves this
replica, and peer TLS (the context that verifies peers, start-up checks of the peer settings)."""

from __future__ import annotations

import hmac
import ssl

from fastapi import Request

from api.auth import AuthFailureLimiter, authenticate, client_address
from api.errors import error_response
from api.replicas.asgi import (
    ASGIApp,
    Scope,
    Send,
    header,
    no_receive,
)
from api.replicas.metrics import RoutingMetrics
from service.ring import (
    CLIENT_HEADER,
    SCHEME_HEADER,
    TOKEN_HEADER,
    parse_peers,
)
from service.settings import Settings
from service.tenants import TenantError

_TOKEN = TOKEN_HEADER.encode()


class PeerAuth:
    """Peer-token checks of the :class:`~api.replicas.router.Router`."""

    token: str | None
    metrics: RoutingMetrics
    limiter: AuthFailureLimiter | None

    def token_ok(self, scope: Scope) -> bool:
        """The request carries the peer token (never true without one: /internal and forwarded requests
        always need it; :func:`install_routing` refuses peers without a token)."""
        if not self.token:
            return False
        given = header(scope, _TOKEN)
        return given is not None and hmac.compare_digest(given, self.token.encode())

    def refused(self, scope: Scope, message: str) -> ASGIApp:
        """The answer to a request without the right peer token: 403/40302, counted in the metrics and, when
        a (wrong) token was presented, against the client address in the failed-authentication limit
        (429/42901 once the address is blocked)."""
        self.metrics.count("refused")
        if self.limiter is not None and header(scope, _TOKEN) is not None:
            try:
                self.limiter.refuse(client_address(Request(scope)))
            except TenantError as exc:
                return error_response(exc.status, exc.error_code, exc.message, exc.headers or None)
        return error_response(403, 40302, message)

    async def authenticated(self, scope: Scope, send: Send) -> bool:
        """Check the client's credentials here, before any lookup or forwarding: a request that fails is
        answered 401 (or 429 from a blocked address) by this replica, with no routing headers, and never
        leaves it. The replica that serves the request authenticates it again and charges its rate."""
        try:
            authenticate(Request(scope))
        except TenantError as exc:
            await error_response(exc.status, exc.error_code, exc.message, exc.headers or None)(
                scope, no_receive, send)
            return False
        return True

    def restore_client(self, scope: Scope) -> None:
        """A forwarded request is seen as coming from the original client (address and scheme), so that the
        trusted-proxy rules, base_uri and the failed-authentication limit work as on the first replica.
        Believed only from an authenticated peer (the caller checked the peer token)."""
        client = header(scope, CLIENT_HEADER.encode())
        if client:
            host, _, port = client.decode("latin-1").rpartition(":")
            if host and port.isdigit():
                scope["client"] = (host.strip("[]"), int(port))
        scheme = header(scope, SCHEME_HEADER.encode())
        if scheme in (b"http", b"https"):
            scope["scheme"] = scheme.decode()



def peer_token_problem(settings: Settings) -> str | None:
    """Why these settings may not start (peers without a peer token), or None."""
    if (settings.peers or settings.peer_dns) and not (
            settings.peer_token is not None and settings.peer_token.get_secret_value().strip()):
        return ("GATEWAY_PEERS / GATEWAY_PEER_DNS is set but GATEWAY_PEER_TOKEN is not: the replicas' "
                "/internal endpoints and forwarded requests must be authenticated. Set GATEWAY_PEER_TOKEN to "
                "the same random secret (e.g. `openssl rand -hex 32`) on every replica")
    return None


def tls_failure(exc: BaseException) -> bool:
    """An httpx error caused by a failed TLS handshake (untrusted certificate, wrong name, not TLS)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def peer_tls_enabled(settings: Settings) -> bool:
    """Peers are reached over https: a CA bundle for them is given, or this replica serves TLS (its peers,
    started from the same settings, do too)."""
    return bool(settings.peer_tls_ca_file or settings.tls_cert_file)


def peer_ssl_context(settings: Settings) -> ssl.SSLContext:
    """The context that verifies peers' certificates (and their names): GATEWAY_PEER_TLS_CA_FILE, else the
    system CAs; TLS 1.2 or newer."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.peer_tls_ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def peer_tls_problem(settings: Settings) -> str | None:
    """Why the peer TLS settings cannot start (an unreadable CA bundle, a plain http:// peer while peer TLS is
    on: the peer token and client credentials would travel in clear), or None."""
    if settings.peer_tls_ca_file:
        try:
            peer_ssl_context(settings)
        except (OSError, ssl.SSLError, ValueError) as exc:
            return f"GATEWAY_PEER_TLS_CA_FILE {settings.peer_tls_ca_file!r} does not load as a PEM CA bundle: {exc}"
    if peer_tls_enabled(settings):
        try:
            plain = [u for u in parse_peers(settings.peers, "https") if u.startswith("http://")]
        except ValueError as exc:
            return str(exc)
        if plain:
            return (f"peer TLS is on (GATEWAY_PEER_TLS_CA_FILE or GATEWAY_TLS_CERT_FILE) but GATEWAY_PEERS names "
                    f"plain http peers ({', '.join(plain)}): use https:// URLs (or no scheme)")
    return None

