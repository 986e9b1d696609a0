"""The peer set and the ring view of one replica: discovery (static ``GATEWAY_PEERS`` and/or
``GATEWAY_PEER_DNS`` re-resolved every ``GATEWAY_PEER_REFRESH_S``), probes of ``/internal/peer`` by a
supervised background task (so the ring is made of stable replica ids, not addresses), ``/internal/lookup``
of who holds an instance, and the owner of a key on the ring (:mod:`service.ring`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from api.replicas.peer_auth import tls_failure
from service.instances.registry import Gateway
from service.ring import (
    TOKEN_HEADER,
    Identity,
    PeerTable,
    ProbeResult,
    urls_of_addrinfo,
)
from service.settings import Settings

if TYPE_CHECKING:
    from service.durable.moves import Move

log = logging.getLogger(__name__)

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore runs `import sniffio` on every request (twice) and falls back to asyncio when it is missing;
    # recent anyio no longer installs it, and a failed import searches sys.path each time (~150 µs, most of
    # the forwarding cost). A None entry makes that import fail at once, with the same outcome.
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

PROBE_TIMEOUT_S = 1.0
LOOKUP_TIMEOUT_S = 1.0


class PeerSet:
    """Discovery, probes, lookups and the ring view of the :class:`~api.replicas.router.Router`."""

    settings: Settings
    gateway: Gateway
    token: str | None
    scheme: str
    static_urls: list[str]
    dns: tuple[str, int] | None
    dns_urls: list[str]
    refresh_s: float
    table: PeerTable
    client: httpx.AsyncClient | None
    refreshes: int
    _peer_hosts: set[str]
    _last_result: dict[str, str]

    if TYPE_CHECKING:  # from the other parts of the Router
        def check_moves(self, now: float | None = None) -> list[Move]: ...

    # -- ring --------------------------------------------------------------------------------------------
    @property
    def self_id(self) -> str:
        return self.table.self_id

    def _sync(self) -> None:
        self.table.self_draining = self.gateway.draining

    def owner(self, group: str, name: str) -> str:
        self._sync()
        return self.table.owner(group, name)

    def owns(self, group: str, name: str) -> bool:
        return self.owner(group, name) == self.self_id

    def identity(self) -> Identity:
        return Identity(self.self_id, self.table.self_boot, draining=self.gateway.draining)

    async def _supervise(self) -> None:
        while True:
            try:
                while True:
                    await asyncio.sleep(self.refresh_s)
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("refreshing the gateway peer set failed; restarting the refresh loop")
                await asyncio.sleep(min(self.refresh_s, 1.0))

    # -- discovery ---------------------------------------------------------------------------------------
    async def targets(self) -> list[str]:
        urls = list(self.static_urls)
        if self.dns is not None:
            host, port = self.dns
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
                self.dns_urls = urls_of_addrinfo(infos, port, self.scheme)
            except OSError as exc:  # keep the last answer: a DNS hiccup must not empty the ring
                log.warning("resolving GATEWAY_PEER_DNS %s:%d failed: %s", host, port, exc)
        urls += [u for u in self.dns_urls if u not in urls]
        return urls

    async def refresh(self) -> None:
        urls = await self.targets()
        results = await asyncio.gather(*(self.probe(u) for u in urls))
        self._sync()
        self.table.retain(urls)
        self._peer_hosts = {h for u in urls if (h := urlsplit(u).hostname)}
        for gone in [u for u in self._last_result if u not in urls]:
            del self._last_result[gone]
        for url, (ident, problem) in zip(urls, results, strict=True):
            result = self.table.record_probe(url, ident)
            state = problem or result
            before = self._last_result.get(url)
            if state == before:
                continue
            self._last_result[url] = state
            name = ident.replica_id if ident is not None else "?"
            if state == ProbeResult.OK:
                log.info("gateway peer %s at %s is up", name, url)
            elif state == "refused":
                log.error("the gateway at %s refused this replica's peer token: GATEWAY_PEER_TOKEN must be the "
                          "same on every replica; it is left out of the routing ring", url)
            elif state == "tls":
                log.error("the gateway at %s failed the TLS handshake: its certificate is not signed by a CA of "
                          "GATEWAY_PEER_TLS_CA_FILE, does not name %r, or it does not speak TLS; it is left out of "
                          "the routing ring and gets no forwarded requests", url,
                          self.server_name(url) or urlsplit(url).hostname)
            elif state == ProbeResult.CONFLICT:
                log.error("the gateway at %s also calls itself %r: every replica needs its own "
                          "GATEWAY_REPLICA_ID; it is left out of the routing ring", url, name)
            elif state == ProbeResult.INCOMPATIBLE:
                log.error("the gateway at %s speaks another routing protocol version; left out of the ring", url)
            elif state == ProbeResult.DOWN and before is not None:
                log.warning("gateway peer at %s is unreachable; left out of the routing ring", url)
        self.refreshes += 1
        self.check_moves()  # durable instances whose ring owner changed (api/replicas/moves.py)

    def _internal_headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: self.token} if self.token else {}

    def server_name(self, url: str) -> str | None:
        """The name the certificate of the peer at ``url`` must carry: GATEWAY_PEER_TLS_SERVER_NAME, else the
        GATEWAY_PEER_DNS host for a discovered peer (reached by address), else None (the URL's host)."""
        if self.settings.peer_tls_server_name:
            return self.settings.peer_tls_server_name
        if self.dns is not None and url in self.dns_urls and url not in self.static_urls:
            return self.dns[0]
        return None

    def _extensions(self, url: str) -> dict[str, Any]:
        name = self.server_name(url) if url.startswith("https:") else None
        return {"sni_hostname": name} if name else {}

    async def probe(self, url: str) -> tuple[Identity | None, str | None]:
        """The identity a replica answers (None: unreachable or not a gateway) and what went wrong: "refused"
        (it refused our token), "tls" (its certificate is not trusted, or it does not speak TLS) or None."""
        assert self.client is not None
        try:
            r = await self.client.get(f"{url}/internal/peer", headers=self._internal_headers(),
                                      timeout=PROBE_TIMEOUT_S, extensions=self._extensions(url))
        except httpx.HTTPError as exc:
            return None, "tls" if tls_failure(exc) else None
        if r.status_code != 200:
            return None, "refused" if r.status_code == 403 else None
        try:
            return Identity.from_json(r.json()), None
        except ValueError:
            return None, None

    async def lookup(self, group: str, name: str, exclude: set[str]) -> list[str]:
        """The peers (alive, not in ``exclude``) that hold (group, name) for some tenant, asked in parallel."""
        assert self.client is not None
        peers = [p for p in self.table.alive() if p.replica_id not in exclude]
        if not peers:
            return []

        async def ask(replica_id: str, url: str) -> bool:
            assert self.client is not None
            try:
                r = await self.client.get(f"{url}/internal/lookup", params={"group": group, "name": name},
                                          headers=self._internal_headers(), extensions=self._extensions(url),
                                          timeout=httpx.Timeout(LOOKUP_TIMEOUT_S, connect=LOOKUP_TIMEOUT_S / 2))
            except (httpx.ConnectError, httpx.ConnectTimeout):
                self.table.mark_dead(replica_id)
                return False
            except httpx.HTTPError:
                return False
            if r.status_code != 200:
                return False
            with contextlib.suppress(ValueError):
                return bool(r.json().get("held"))
            return False

        held = await asyncio.gather(*(ask(p.replica_id, p.url) for p in peers))
        return [p.replica_id for p, h in zip(peers, held, strict=True) if h]

