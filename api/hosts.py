"""The Host header check (GATEWAY_ALLOWED_HOSTS): a browser page that re-points its own DNS name at a
developer's gateway (DNS rebinding) sends that name as Host; refusing unknown names stops it driving the
gateway. Also the gate for values that end up in ``base_uri``: a parsed, syntactically valid host only.

Entries are a host name or address (any port), ``host:port`` (that port only), ``[v6]`` / ``[v6]:port``,
``.example.com`` (the domain and its subdomains, any port) or ``*`` (no check).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from api.errors import error_response

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: What a Host header may be: a DNS name (RFC 1123 labels) or IPv4 address, or an IPv6 literal in
#: brackets, with an optional port. Nothing else (no userinfo, path, spaces or control characters).
_NAME = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
_HOST_RE = re.compile(rf"(?P<host>{_NAME}|\[(?P<v6>[0-9A-Fa-f:.]+)\])(?::(?P<port>[0-9]{{1,5}}))?")
#: Paths every probe may ask whatever its Host (Kubernetes probes send Host: <pod IP>:<port>)
UNCHECKED_PATHS = frozenset({"/healthz", "/readyz"})
#: Hosts allowed by default in open mode (no tenants file), next to the bind address: any port
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def parse_host(value: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a Host header value (host lower-cased, a trailing dot dropped, IPv6 in brackets),
    or None when it is not a plain host name / address with an optional port."""
    if len(value) > 300:
        return None
    m = _HOST_RE.fullmatch(value)
    if m is None:
        return None
    port = int(m["port"]) if m["port"] is not None else None
    if port is not None and port > 65535:
        return None
    if m["v6"] is not None:
        try:
            return f"[{ipaddress.IPv6Address(m['v6']).compressed}]", port
        except ValueError:
            return None
    host = m["host"].lower().rstrip(".")
    if len(host) > 253 or not host:
        return None
    return host, port


_SEEN_MAX = 1024


class AllowedHosts:
    """A parsed GATEWAY_ALLOWED_HOSTS list."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any = False
        self.hosts: set[str] = set()  # any port
        self.host_ports: set[tuple[str, int]] = set()
        self.domains: list[str] = []  # ".example.com"
        # verdicts by Host value: clients send the same few on every request (the parse is a regex, ~5 µs)
        self._seen: dict[str, bool] = {}
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            if entry == "*":
                self.any = True
            elif entry.startswith("."):
                parsed = parse_host(entry[1:])
                if parsed is None or parsed[1] is not None:
                    raise ValueError(f"GATEWAY_ALLOWED_HOSTS: {entry!r} is not a domain ('.example.com')")
                self.domains.append("." + parsed[0])
            else:
                bare = entry if entry.startswith("[") or entry.count(":") <= 1 else f"[{entry}]"  # bare IPv6
                parsed = parse_host(bare)
                if parsed is None:
                    raise ValueError(f"GATEWAY_ALLOWED_HOSTS: {entry!r} is not a host, host:port or [IPv6]:port")
                host, port = parsed
                if port is None:
                    self.hosts.add(host)
                else:
                    self.host_ports.add((host, port))

    @classmethod
    def from_setting(cls, value: str) -> AllowedHosts:
        return cls(value.split(","))

    def allows(self, value: str | None) -> bool:
        if self.any:
            return True
        if value is None:
            return False
        verdict = self._seen.get(value)
        if verdict is None:
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            verdict = self._seen[value] = self._judge(value)
        return verdict

    def _judge(self, value: str) -> bool:
        parsed = parse_host(value)
        if parsed is None:
            return False
        host, port = parsed
        if host in self.hosts or (port is not None and (host, port) in self.host_ports):
            return True
        return any(host == d[1:] or host.endswith(d) for d in self.domains)


def default_allowed_hosts(bind_host: str, urls: Iterable[str] = ()) -> str:
    """GATEWAY_ALLOWED_HOSTS when unset in open mode: the bind address (unless a wildcard such as 0.0.0.0),
    localhost and the loopback addresses, and the hosts of ``urls``: GATEWAY_PEERS (replicas forward to each
    other) and GATEWAY_PUBLIC_URL (the gateway's public name)."""
    from urllib.parse import urlsplit

    out: list[str] = []
    if bind_host not in WILDCARD_BINDS:
        out.append(f"[{bind_host}]" if ":" in bind_host and not bind_host.startswith("[") else bind_host)
    out.extend(LOOPBACK_HOSTS)
    for url in urls:
        host = urlsplit(url.strip()).hostname
        if host:
            out.append(f"[{host}]" if ":" in host else host)
    return ",".join(dict.fromkeys(out))


class HostGuard:
    """The Host check of one gateway: whether a request's Host header is allowed, or it carries the peer
    token (replica-to-replica calls address a peer by its pod address). Used by
    :class:`HostCheckMiddleware` and by the lean produce path (api/server/fastpath.py), which must agree."""

    def __init__(self, allowed: AllowedHosts, peer_token: str | None = None, peer_token_header: str = "") -> None:
        self.allowed = allowed
        self.peer_token = peer_token.encode() if peer_token else None
        self.peer_token_header = peer_token_header.lower().encode()

    def permits(self, scope: Scope) -> bool:
        if self.allowed.any or scope["path"] in UNCHECKED_PATHS:
            return True
        host: str | None = None
        token: bytes | None = None
        for k, v in scope["headers"]:
            if k == b"host":
                if host is not None:  # two Host headers: refuse (RFC 9112 §3.2)
                    host = ""
                    break
                host = v.decode("latin-1")
            elif self.peer_token is not None and k == self.peer_token_header:
                token = v
        return self.allowed.allows(host) or (token is not None and self.peer_token is not None
                                             and hmac.compare_digest(token, self.peer_token))


class HostCheckMiddleware:
    """Refuse (421/42101, JSON body) a request whose Host header is not allowed (:class:`HostGuard`).
    /healthz and /readyz are exempt (probes), and so is a request carrying the peer token."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], guard: HostGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.guard.permits(scope):
            await self.app(scope, receive, send)
            return
        resp = error_response(421, 42101, "the Host header names a host this gateway does not serve; "
                                          "add it to GATEWAY_ALLOWED_HOSTS")
        if scope["path"].startswith("/v3/"):
            resp.headers["content-type"] = "application/json"
        await resp(scope, receive, send)
