"""Which replica holds a consumer instance: the sans-io core of request routing between gateway replicas.

Instances live in the memory of the replica that created them and their ids are the names clients chose
(Confluent compatibility), so the id does not say where an instance lives. Placement is decided by
rendezvous (highest-random-weight) hashing: every replica computes, for a key, a weight per live replica id
and the highest weight owns the key. Instances are created on the owner of their key, so in a steady replica
set any replica finds the holder of any instance without asking anyone. When the set changes (scaling, a
restart) only about 1/N of the keys change owner; their instances stay where they are and are found by
asking the peers (:class:`HintCache` remembers the answer).

The key is ``group + "\\0" + instance name``, without the tenant: the routing layer runs before the route
authenticates the request, and the tenant is known only after authentication. Two tenants with the same
group and instance name are therefore placed on the same replica (harmless); requests still find the one
of their own tenant because every replica first tries its own instances and a forwarded request that the
target does not hold comes back marked absent.

Nothing here does I/O: the HTTP side (probing peers, forwarding) is :mod:`api.replicas`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

#: Version of the replica-to-replica protocol (/internal endpoints, hop headers). Replicas of another
#: version are kept out of the ring (a rolling upgrade that changes it must say so).
ROUTING_VERSION = 1

#: Marks a request one replica forwarded to another (value: the forwarding replica's id). A replica
#: serves such a request itself, whatever its own view of the ring: a request is never forwarded twice.
HOP_HEADER = "x-kcg-forwarded-by"
#: The shared secret (GATEWAY_PEER_TOKEN), on forwarded requests and on the /internal endpoints.
TOKEN_HEADER = "x-kcg-peer-token"
#: The original client address (``host:port``) and scheme of a forwarded request.
CLIENT_HEADER = "x-kcg-client"
SCHEME_HEADER = "x-kcg-client-scheme"
#: On the response to a forwarded request: the target does not hold the instance (its 404/410 follows).
ABSENT_HEADER = "x-kcg-absent"
#: On a forwarded response: the replica that served it.
SERVED_BY_HEADER = "x-kcg-served-by"
#: On a forwarded instance request: no replica holds the instance and the target is its owner among the
#: live replicas: it re-creates the instance from its descriptor (durable instances) before serving it.
RECREATE_HEADER = "x-kcg-recreate"

_INSTANCE_PATH = re.compile(r"^/(consumers|share-groups)/([^/]+)/instances/([^/]+)(?:/.*)?$")
_CREATE_PATH = re.compile(r"^/(consumers|share-groups)/([^/]+)$")
#: Share consumer instances (``/share-groups/...``) are routed like consumer instances, under their group with
#: this prefix: a control character no group id may hold, so a share instance and a consumer instance of the
#: same group and name are two keys (placed, held and looked up apart).
SHARE_PREFIX = "\x1fshare\x1f"
_REPLICA_ID = re.compile(r"[A-Za-z0-9-]{1,40}")


# -- placement ---------------------------------------------------------------------------------------------
def routing_key(group: str, name: str) -> bytes:
    """The placement key of an instance (tenant-independent, see the module docstring)."""
    return group.encode("utf-8", "surrogatepass") + b"\0" + name.encode("utf-8", "surrogatepass")


def weight(replica_id: str, key: bytes) -> int:
    """The rendezvous weight of ``replica_id`` for ``key``: stable across processes and versions (a keyed
    BLAKE2b, never Python's randomised ``hash``)."""
    digest = hashlib.blake2b(key, digest_size=8, key=replica_id.encode("ascii", "replace")[:64]).digest()
    return int.from_bytes(digest, "big")


def rank(replicas: Iterable[str], key: bytes) -> list[str]:
    """Replica ids by decreasing weight for ``key`` (ties, practically impossible, by id)."""
    return sorted(set(replicas), key=lambda r: (weight(r, key), r), reverse=True)


def owner(replicas: Iterable[str], key: bytes) -> str | None:
    """The replica that owns ``key`` among ``replicas`` (None when there is none)."""
    best: tuple[int, str] | None = None
    for r in set(replicas):
        w = (weight(r, key), r)
        if best is None or w > best:
            best = w
    return None if best is None else best[1]


# -- request parsing ---------------------------------------------------------------------------------------
def instance_of_path(path: str) -> tuple[str, str] | None:
    """``(group, instance name)`` of a request path under ``/consumers/{group}/instances/{name}``, or
    ``(SHARE_PREFIX + group, name)`` under ``/share-groups/{group}/instances/{name}``, else None.

    ``path`` is the ASGI (percent-decoded) path, as the routes match it."""
    m = _INSTANCE_PATH.match(path)
    if m is None:
        return None
    return (m.group(2) if m.group(1) == "consumers" else SHARE_PREFIX + m.group(2)), m.group(3)


def group_of_create_path(path: str) -> str | None:
    """The group of ``POST /consumers/{group}`` (instance creation), ``SHARE_PREFIX + group`` of ``POST
    /share-groups/{group}``, else None."""
    m = _CREATE_PATH.match(path)
    if m is None:
        return None
    return m.group(2) if m.group(1) == "consumers" else SHARE_PREFIX + m.group(2)


def share_group_of(group: str) -> str | None:
    """The share group of a routing group (see :data:`SHARE_PREFIX`), None for a consumer group."""
    return group[len(SHARE_PREFIX):] if group.startswith(SHARE_PREFIX) else None


@dataclass(frozen=True)
class CreateName:
    """What the body of a create request says about the instance name."""

    parsed: bool  # the body is empty or a JSON object (else the route answers its own 400/422)
    name: str | None  # the chosen name: legacy 'id' when given, else 'name'; None: the gateway generates one


def name_of_create_body(body: bytes) -> CreateName:
    """The instance name a create request asks for (any JSON content type Confluent clients send:
    ``application/vnd.kafka.v2+json``, ``application/vnd.kafka+json``, ``application/json``; the content
    type itself is checked by the app). The legacy ``id`` overrides ``name``, as in the route."""
    if not body.strip():
        return CreateName(True, None)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return CreateName(False, None)
    if not isinstance(doc, dict):
        return CreateName(False, None)
    value = doc.get("id") if doc.get("id") is not None else doc.get("name")
    if value is None:
        return CreateName(True, None)
    if not isinstance(value, str):
        return CreateName(False, None)
    return CreateName(True, value)


# -- peers -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """What a replica answers on ``GET /internal/peer``."""

    replica_id: str
    boot: str  # random per process: tells this process from another one using the same replica id
    version: int = ROUTING_VERSION
    draining: bool = False  # shutting down: keeps its instances but takes no new ones

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "boot": self.boot, "routing_version": self.version,
                "draining": self.draining}

    @classmethod
    def from_json(cls, doc: Any) -> Identity | None:
        """None unless ``doc`` is a well-formed identity."""
        if not isinstance(doc, Mapping):
            return None
        rid, boot, version = doc.get("replica_id"), doc.get("boot"), doc.get("routing_version")
        if not isinstance(rid, str) or not _REPLICA_ID.fullmatch(rid) or not isinstance(boot, str):
            return None
        if not isinstance(version, int) or isinstance(version, bool):
            return None
        return cls(rid, boot, version, bool(doc.get("draining", False)))


@dataclass
class Peer:
    replica_id: str
    url: str
    alive: bool = True
    draining: bool = False
    last_seen: float = 0.0
    boot: str = ""


class ProbeResult:
    OK = "ok"
    SELF = "self"
    DOWN = "down"
    CONFLICT = "conflict"  # another process claims this replica's id
    INCOMPATIBLE = "incompatible"  # another routing protocol version


@dataclass
class PeerTable:
    """The replica set as this replica sees it: replica id → base URL, alive, draining, last seen.

    Fed by probe results (:meth:`record_probe`) and by failures seen while forwarding (:meth:`mark_dead`).
    This replica is always part of the ring, by its id."""

    self_id: str
    self_boot: str
    peers: dict[str, Peer] = field(default_factory=dict)
    self_draining: bool = False
    self_urls: set[str] = field(default_factory=set)
    #: url → replica id it last answered with
    url_ids: dict[str, str] = field(default_factory=dict)

    def record_probe(self, url: str, ident: Identity | None, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        if ident is None:
            rid = self.url_ids.get(url)
            peer = self.peers.get(rid) if rid is not None else None
            if peer is not None and peer.url == url:
                peer.alive = False
            return ProbeResult.DOWN
        if ident.version != ROUTING_VERSION:
            self.record_probe(url, None, now)
            return ProbeResult.INCOMPATIBLE
        rid = ident.replica_id
        if rid == self.self_id:
            self.url_ids.pop(url, None)
            if ident.boot == self.self_boot:
                self.self_urls.add(url)
                return ProbeResult.SELF
            return ProbeResult.CONFLICT
        old = self.url_ids.get(url)
        if old is not None and old != rid:
            stale = self.peers.get(old)
            if stale is not None and stale.url == url:
                stale.alive = False  # the address now belongs to another replica (a pod got a new IP)
        self.url_ids[url] = rid
        peer = self.peers.get(rid)
        if peer is None:
            peer = self.peers[rid] = Peer(rid, url)
        peer.url, peer.alive, peer.draining, peer.last_seen, peer.boot = url, True, ident.draining, now, ident.boot
        return ProbeResult.OK

    def retain(self, urls: Iterable[str]) -> None:
        """Forget addresses no longer listed (DNS dropped a pod) and the replicas that were only there."""
        keep = set(urls)
        for url in [u for u in self.url_ids if u not in keep]:
            del self.url_ids[url]
        for rid in [r for r, p in self.peers.items() if p.url not in keep]:
            del self.peers[rid]
        self.self_urls &= keep

    def mark_dead(self, replica_id: str) -> None:
        peer = self.peers.get(replica_id)
        if peer is not None:
            peer.alive = False

    def alive(self) -> list[Peer]:
        """Reachable peers (this replica excluded), draining ones included: they still hold instances."""
        return [p for p in self.peers.values() if p.alive]

    def placement_ids(self) -> list[str]:
        """The ring new instances are placed on: live, not draining replicas (this one too unless it
        drains; when every replica drains, all of them, so that placement stays defined)."""
        ids = [p.replica_id for p in self.peers.values() if p.alive and not p.draining]
        if not self.self_draining:
            ids.append(self.self_id)
        if not ids:
            ids = [self.self_id] + [p.replica_id for p in self.peers.values() if p.alive]
        return ids

    def owner(self, group: str, name: str) -> str:
        got = owner(self.placement_ids(), routing_key(group, name))
        assert got is not None
        return got

    def url_of(self, replica_id: str) -> str | None:
        peer = self.peers.get(replica_id)
        return peer.url if peer is not None else None

    def is_alive(self, replica_id: str) -> bool:
        peer = self.peers.get(replica_id)
        return peer is not None and peer.alive

    def hosts(self) -> set[str]:
        """The hosts (addresses) of every known peer URL, this replica's included."""
        out = set()
        for url in list(self.url_ids) + list(self.self_urls):
            host = urlsplit(url).hostname
            if host:
                out.add(host)
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"replica_id": self.self_id, "draining": self.self_draining, "placement": sorted(self.placement_ids()),
                "peers": [{"replica_id": p.replica_id, "url": p.url, "alive": p.alive, "draining": p.draining}
                          for p in sorted(self.peers.values(), key=lambda p: p.replica_id)]}


class HintCache:
    """Where instances not on their ring owner were last found: (group, name) → replica id; bounded LRU."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._d: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, group: str, name: str) -> str | None:
        key = (group, name)
        rid = self._d.get(key)
        if rid is not None:
            self._d.move_to_end(key)
        return rid

    def put(self, group: str, name: str, replica_id: str) -> None:
        self._d[(group, name)] = replica_id
        self._d.move_to_end((group, name))
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def drop(self, group: str, name: str, replica_id: str | None = None) -> None:
        if replica_id is None or self._d.get((group, name)) == replica_id:
            self._d.pop((group, name), None)

    def __len__(self) -> int:
        return len(self._d)


# -- configuration -----------------------------------------------------------------------------------------
def parse_peers(spec: str | None, default_scheme: str = "http") -> list[str]:
    """GATEWAY_PEERS: comma-separated base URLs (``default_scheme`` assumed when no scheme: ``https`` with peer
    TLS), without a trailing '/'."""
    out: list[str] = []
    for item in (spec or "").split(","):
        item = item.strip().rstrip("/")
        if not item:
            continue
        if "://" not in item:
            item = f"{default_scheme}://{item}"
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"GATEWAY_PEERS: {item!r} is not an http(s) base URL")
        if item not in out:
            out.append(item)
    return out


def parse_peer_dns(spec: str | None) -> tuple[str, int] | None:
    """GATEWAY_PEER_DNS ``host:port`` → (host, port)."""
    if not spec or not spec.strip():
        return None
    host, sep, port = spec.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"GATEWAY_PEER_DNS must be 'host:port', got {spec!r}")
    return host.strip("[]"), int(port)


def url_of_address(address: str, port: int, scheme: str = "http") -> str:
    """``http://10.0.0.5:8080`` / ``http://[fd00::5]:8080`` for a resolved address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{scheme}://{address}:{port}"
    return f"{scheme}://[{ip}]:{port}" if ip.version == 6 else f"{scheme}://{ip}:{port}"


def urls_of_addrinfo(infos: Iterable[tuple[Any, ...]], port: int, scheme: str = "http") -> list[str]:
    """Base URLs of ``getaddrinfo`` results (deduplicated, stable order)."""
    out: list[str] = []
    for info in infos:
        url = url_of_address(str(info[4][0]), port, scheme)
        if url not in out:
            out.append(url)
    return sorted(out)
