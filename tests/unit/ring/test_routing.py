"""Routing between replicas, the sans-io core (service/ring.py), the routing middleware against a fake
peer (api/replicas/, no network) and the gateway's part: placement of generated names, static membership."""

from __future__ import annotations

import asyncio
import collections
import re
import string
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.instances.registry import (
    GROUP_ID_PATTERN,
    Gateway,
    InstanceNotFound,
    InstanceOptions,
    static_group_instance_id,
)
from service.ring import (
    ROUTING_VERSION,
    SHARE_PREFIX,
    CreateName,
    HintCache,
    Identity,
    PeerTable,
    ProbeResult,
    group_of_create_path,
    instance_of_path,
    name_of_create_body,
    owner,
    parse_peer_dns,
    parse_peers,
    rank,
    routing_key,
    share_group_of,
    url_of_address,
    urls_of_addrinfo,
    weight,
)

KEYS = [routing_key(f"group-{i % 7}", f"consumer-{i}") for i in range(6000)]


# -- placement ---------------------------------------------------------------------------------------------
def test_owner_is_deterministic_and_order_independent() -> None:
    replicas = ["a", "b", "c"]
    for key in KEYS[:200]:
        assert owner(replicas, key) == owner(list(reversed(replicas)), key) == rank(replicas, key)[0]
    # a fixed value: weights must never change between versions or processes (no PYTHONHASHSEED)
    assert weight("a", routing_key("g", "n")) == weight("a", routing_key("g", "n"))
    assert owner([], b"k") is None
    assert owner(["only"], b"k") == "only"


def test_placement_is_balanced() -> None:
    counts = collections.Counter(owner(["r0", "r1", "r2", "r3"], k) for k in KEYS)
    for n in counts.values():
        assert abs(n - len(KEYS) / 4) < len(KEYS) * 0.05


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_adding_a_replica_moves_only_its_share(n: int) -> None:
    before = [f"gw-{i}" for i in range(n)]
    after = [*before, f"gw-{n}"]
    moved = [k for k in KEYS if owner(before, k) != owner(after, k)]
    # every moved key moved to the new replica, and about 1/(n+1) of them moved
    assert all(owner(after, k) == f"gw-{n}" for k in moved)
    assert abs(len(moved) / len(KEYS) - 1 / (n + 1)) < 0.03


@pytest.mark.parametrize("n", [3, 5])
def test_removing_a_replica_moves_only_its_keys(n: int) -> None:
    before = [f"gw-{i}" for i in range(n)]
    gone = before[1]
    after = [r for r in before if r != gone]
    for k in KEYS:
        if owner(before, k) != gone:
            assert owner(after, k) == owner(before, k)  # nobody else's key moves
        else:
            assert owner(after, k) == rank(before, k)[1]  # the next in the key's ranking takes it


def test_key_separates_group_and_name() -> None:
    assert routing_key("ab", "c") != routing_key("a", "bc")
    assert routing_key("g", "n") == b"g\0n"


# -- request parsing ---------------------------------------------------------------------------------------
def test_paths() -> None:
    assert instance_of_path("/consumers/g/instances/c1") == ("g", "c1")
    assert instance_of_path("/consumers/g/instances/c1/records") == ("g", "c1")
    assert instance_of_path("/consumers/g/instances/c1/positions/beginning") == ("g", "c1")
    assert instance_of_path("/consumers/my group/instances/c.1_x-y/offsets") == ("my group", "c.1_x-y")
    assert instance_of_path("/consumers/g") is None
    assert instance_of_path("/consumers/g/instances") is None
    assert instance_of_path("/topics/t") is None
    assert group_of_create_path("/consumers/g") == "g"
    assert group_of_create_path("/consumers/g/instances/c") is None
    assert group_of_create_path("/consumers") is None


def test_share_instance_paths_are_their_own_keys() -> None:
    """Share consumer instances route like consumer instances, under SHARE_PREFIX + group: a share instance
    and a consumer instance of the same group and name are two keys."""
    assert instance_of_path("/share-groups/g/instances/w1/records") == (SHARE_PREFIX + "g", "w1")
    assert instance_of_path("/share-groups/g/instances/w1") == (SHARE_PREFIX + "g", "w1")
    assert instance_of_path("/share-groups/g") is None
    assert group_of_create_path("/share-groups/g") == SHARE_PREFIX + "g"
    assert share_group_of(SHARE_PREFIX + "g") == "g" and share_group_of("g") is None
    assert routing_key(SHARE_PREFIX + "g", "w1") != routing_key("g", "w1")
    assert re.match(GROUP_ID_PATTERN, "g") and not re.match(GROUP_ID_PATTERN, SHARE_PREFIX + "g")  # no group id


@pytest.mark.parametrize(("body", "expected"), [
    (b"", CreateName(True, None)),
    (b"  ", CreateName(True, None)),
    (b"{}", CreateName(True, None)),
    (b'{"name": "c1", "format": "binary"}', CreateName(True, "c1")),
    (b'{"id": "legacy", "name": "c1"}', CreateName(True, "legacy")),  # 'id' overrides, as in the route
    (b'{"id": null, "name": "c1"}', CreateName(True, "c1")),
    (b'{"name": null}', CreateName(True, None)),
    (b'{"name": 5}', CreateName(False, None)),
    (b"[1]", CreateName(False, None)),
    (b"{not json", CreateName(False, None)),
])
def test_name_of_create_body(body: bytes, expected: CreateName) -> None:
    assert name_of_create_body(body) == expected


@given(st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=50))
def test_name_of_create_body_roundtrip(name: str) -> None:
    assert name_of_create_body(orjson.dumps({"name": name, "format": "json"})).name == name


# -- peers -------------------------------------------------------------------------------------------------
def ident(rid: str, boot: str = "x", **kw: Any) -> Identity:
    return Identity(rid, boot, **kw)


def test_peer_table_membership() -> None:
    t = PeerTable("a", "boot-a")
    assert t.placement_ids() == ["a"]  # self is always in the ring
    assert t.record_probe("http://h1:1", ident("a", "boot-a")) == ProbeResult.SELF
    assert t.record_probe("http://h2:1", ident("b")) == ProbeResult.OK
    assert t.record_probe("http://h3:1", ident("c")) == ProbeResult.OK
    assert sorted(t.placement_ids()) == ["a", "b", "c"]
    assert t.url_of("b") == "http://h2:1" and t.hosts() == {"h1", "h2", "h3"}
    # a failed probe, or a connection failure while forwarding, takes a peer out of the ring
    assert t.record_probe("http://h2:1", None) == ProbeResult.DOWN
    assert sorted(t.placement_ids()) == ["a", "c"]
    t.mark_dead("c")
    assert t.placement_ids() == ["a"]
    assert t.record_probe("http://h3:1", ident("c")) == ProbeResult.OK  # back
    assert sorted(t.placement_ids()) == ["a", "c"]
    # another process with this replica's id: a misconfiguration, never part of the ring
    assert t.record_probe("http://h4:1", ident("a", "other-boot")) == ProbeResult.CONFLICT
    assert sorted(t.placement_ids()) == ["a", "c"]
    # another protocol version: left out
    assert t.record_probe("http://h5:1", Identity("e", "x", ROUTING_VERSION + 1)) == ProbeResult.INCOMPATIBLE
    assert "e" not in t.placement_ids()


def test_peer_table_draining_and_address_changes() -> None:
    t = PeerTable("a", "boot-a")
    t.record_probe("http://10.0.0.2:8080", ident("b", draining=True))
    t.record_probe("http://10.0.0.3:8080", ident("c"))
    assert sorted(t.placement_ids()) == ["a", "c"]  # a draining peer takes no new instances...
    assert sorted(p.replica_id for p in t.alive()) == ["b", "c"]  # ...but is still asked about its instances
    t.self_draining = True
    assert t.placement_ids() == ["c"]
    t.self_draining = False
    # b restarts with a new address (pod rescheduled): the old address disappears from DNS
    t.record_probe("http://10.0.0.9:8080", ident("b", "boot-2"))
    t.retain(["http://10.0.0.9:8080", "http://10.0.0.3:8080"])
    assert t.url_of("b") == "http://10.0.0.9:8080" and t.is_alive("b")
    # an address reused by another replica: the old one no longer answers there
    t.record_probe("http://10.0.0.3:8080", ident("d"))
    assert not t.is_alive("c") and t.is_alive("d")
    t.retain(["http://10.0.0.9:8080"])  # scaled down
    assert sorted(t.placement_ids()) == ["a", "b"]
    assert t.snapshot()["placement"] == ["a", "b"]


def test_identity_json() -> None:
    i = Identity("gw-0", "b00t", draining=True)
    assert Identity.from_json(orjson.loads(orjson.dumps(i.to_json()))) == i
    assert Identity.from_json({"replica_id": "bad id", "boot": "x", "routing_version": 1}) is None
    assert Identity.from_json({"replica_id": "a", "boot": "x", "routing_version": True}) is None
    assert Identity.from_json([1]) is None


def test_hint_cache_is_bounded() -> None:
    c = HintCache(size=2)
    c.put("g", "a", "r1")
    c.put("g", "b", "r2")
    assert c.get("g", "a") == "r1"  # a is now the most recent
    c.put("g", "c", "r3")
    assert c.get("g", "b") is None and len(c) == 2
    c.drop("g", "a", "other")
    assert c.get("g", "a") == "r1"
    c.drop("g", "a", "r1")
    assert c.get("g", "a") is None


def test_configuration_parsing() -> None:
    assert parse_peers(" http://a:1/, b:2 ,,http://a:1") == ["http://a:1", "http://b:2"]
    assert parse_peers(None) == []
    with pytest.raises(ValueError):
        parse_peers("ftp://x")
    assert parse_peer_dns("gw-headless.ns.svc:8080") == ("gw-headless.ns.svc", 8080)
    assert parse_peer_dns("[fd00::1]:80") == ("fd00::1", 80)
    assert parse_peer_dns(None) is None
    with pytest.raises(ValueError):
        parse_peer_dns("no-port")
    assert url_of_address("fd00::5", 8080) == "http://[fd00::5]:8080"
    assert url_of_address("10.0.0.5", 8080) == "http://10.0.0.5:8080"
    infos = [(2, 1, 6, "", ("10.0.0.6", 8080)), (2, 1, 6, "", ("10.0.0.5", 8080)),
             (10, 1, 6, "", ("fd00::1", 8080, 0, 0)), (2, 1, 6, "", ("10.0.0.5", 8080))]
    assert urls_of_addrinfo(infos, 8080) == ["http://10.0.0.5:8080", "http://10.0.0.6:8080",
                                             "http://[fd00::1]:8080"]


# -- the gateway's part ------------------------------------------------------------------------------------
async def test_generated_names_hash_to_the_creating_replica() -> None:
    gw = Gateway(replica_id="b")
    ring = ["a", "b", "c"]
    gw.name_placement = lambda group, name: owner(ring, routing_key(group, name)) == "b"
    rt = gw.tenant("t", bootstrap="127.0.0.1:1")
    for _ in range(20):
        inst = await gw.create_instance(rt, "g", InstanceOptions())
        assert inst.instance_id.startswith("rest-consumer-b-")
        assert owner(ring, routing_key("g", inst.instance_id)) == "b"
    assert gw.holds("g", inst.instance_id) and not gw.holds("g", "nope") and not gw.holds("h", inst.instance_id)
    # a placement nobody can satisfy still yields a name (bounded)
    gw.name_placement = lambda group, name: False
    assert gw.generate_name("g").startswith("rest-consumer-b-")
    await gw.close()


async def test_not_found_tells_the_client_to_recreate() -> None:
    gw = Gateway(replica_id="a")
    rt = gw.tenant("t", bootstrap="127.0.0.1:1")
    with pytest.raises(InstanceNotFound, match=r"stopped or restarted.*create the consumer instance again") as err:
        gw.get_instance(rt, "g", "gone")
    assert err.value.error_code == 40403 and err.value.status == 404


async def test_static_membership_derives_group_instance_id() -> None:
    gw = Gateway(replica_id="gw-1", static_membership=True)
    rt = gw.tenant("acme", bootstrap="127.0.0.1:1")
    a = await gw.create_instance(rt, "g", InstanceOptions(), "c1")
    assert a.consumer.config.group_instance_id == "gw-1.acme.c1"
    own = await gw.create_instance(rt, "g", InstanceOptions(group_instance_id="mine"), "c2")
    assert own.consumer.config.group_instance_id == "mine"  # the client's own id wins
    plain = Gateway(replica_id="gw-1")
    p = await plain.create_instance(plain.tenant("acme", bootstrap="127.0.0.1:1"), "g", InstanceOptions(), "c1")
    assert p.consumer.config.group_instance_id is None  # dynamic membership by default
    await gw.close()
    await plain.close()


def test_static_group_instance_id_is_kafka_legal() -> None:
    legal = re.compile(r"[A-Za-z0-9._-]{1,249}")
    long_name = "n" * 200
    a = static_group_instance_id("r" * 40, "t" * 100, long_name)
    b = static_group_instance_id("r" * 40, "t" * 100, long_name[:-1] + "m")
    assert legal.fullmatch(a) and legal.fullmatch(b) and a != b  # cut, but still distinct
    assert len(a) == 249
    odd = static_group_instance_id("r0", "tenant with spaces/ü", "c1")
    assert legal.fullmatch(odd) and odd.startswith("r0.tenant_with_spaces__.c1-")
    assert static_group_instance_id("r0", "tenant with spaces/ü", "c1") == odd  # deterministic
    assert odd != static_group_instance_id("r0", "tenant with spaces/u", "c1")


# -- the middleware against a fake peer --------------------------------------------------------------------
class FakePeer:
    """A minimal HTTP/1.1 keep-alive server standing in for replica 'b': it records every request and answers
    /internal/peer, /internal/lookup, and any other path with a chunked JSON array (as a stream would)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []  # method, target, headers, body
        self.connections = 0
        self.server: asyncio.base_events.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.seen.append((method, target, headers, body))
                path = target.split("?")[0]
                if path == "/internal/peer":
                    self.reply(writer, 200, orjson.dumps(Identity("b", "boot-b").to_json()))
                elif path == "/internal/lookup":
                    self.reply(writer, 200, b'{"held": false}')
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.kafka.binary.v2+json\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n1\r\n[\r\n1\r\n]\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    @staticmethod
    def reply(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(body), body))


async def test_middleware_forwards_and_marks_hops() -> None:
    """Replica 'a' with peer 'b' (a FakePeer): a request for an instance 'a' does not hold goes to its owner
    with the hop header, the peer token and the client's address, on a kept-alive connection; a forwarded
    request is served locally and its 404 is marked absent; /internal needs the token; a dead owner is
    dropped from the ring at once and the client told to create the instance again."""
    from api.app import create_app
    from service.settings import Settings

    peer = FakePeer()
    await peer.start()
    settings = Settings(replica_id="a", peers=f"http://127.0.0.1:1,{peer.url}", peer_token="s3cret",
                        kafka_bootstrap="127.0.0.1:1", peer_refresh_s=3600)
    app = create_app(settings, "127.0.0.1:1")
    router = app.state.routing
    transport = httpx.ASGITransport(app=app, client=("192.0.2.7", 5555))
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport,
                                                                   base_url="http://gw") as http:
        assert router.table.is_alive("b")
        name = next(f"c{i}" for i in range(100) if router.owner("g", f"c{i}") == "b")
        before = peer.connections
        for _ in range(3):
            r = await http.get(f"/consumers/g/instances/{name}/records", params={"timeout": "5"},
                               headers={"accept": "*/*"})
            assert r.status_code == 200 and r.content == b"[]" and r.headers["x-kcg-served-by"] == "b"
        assert peer.connections == before + 1  # one kept-alive connection for the three
        method, target, headers, body = peer.seen[-1]
        assert (method, target, body) == ("GET", f"/consumers/g/instances/{name}/records?timeout=5", b"")
        assert headers["x-kcg-forwarded-by"] == "a" and headers["x-kcg-peer-token"] == "s3cret"
        assert headers["x-kcg-client"] == "192.0.2.7:5555" and headers["host"] == "gw"
        r = await http.post(f"/consumers/g/instances/{name}/offsets", json={"offsets": []})
        assert r.status_code == 200 and peer.seen[-1][3] == b'{"offsets":[]}'
        assert peer.seen[-1][2]["content-type"] == "application/json"
        # a forwarded request is served here (never forwarded again); not holding it, 'a' says so
        n = len(peer.seen)
        r = await http.get(f"/consumers/g/instances/{name}/records",
                           headers={"x-kcg-forwarded-by": "b", "x-kcg-peer-token": "s3cret"})
        assert r.status_code == 404 and r.json()["error_code"] == 40403 and r.headers["x-kcg-absent"] == "1"
        # without the token: refused, nothing forwarded
        r = await http.get(f"/consumers/g/instances/{name}/records", headers={"x-kcg-forwarded-by": "b"})
        assert r.status_code == 403 and r.json()["error_code"] == 40302 and len(peer.seen) == n
        r = await http.get("/internal/peer")
        assert r.status_code == 403 and r.json()["error_code"] == 40302
        r = await http.get("/internal/peer", headers={"x-kcg-peer-token": "wrong"})
        assert r.status_code == 403
        r = await http.get("/internal/peer", headers={"x-kcg-peer-token": "s3cret"})
        assert r.status_code == 200 and r.json()["replica_id"] == "a"
        r = await http.get("/internal/lookup", params={"group": "g", "name": name},
                           headers={"x-kcg-peer-token": "s3cret"})
        assert r.json() == {"replica_id": "a", "held": False}
        # the owner dies: marked dead at once, and the client is told to create the instance again
        assert peer.server is not None
        peer.server.close()
        router.pool.close()
        router.table.peers["b"].url = "http://127.0.0.1:1"
        r = await http.get(f"/consumers/g/instances/{name}/records")
        assert r.status_code == 404 and r.json()["error_code"] == 40403
        msg = r.json()["message"]
        assert "'b' is unreachable" in msg and "create the consumer instance again" in msg
        assert not router.table.is_alive("b") and router.table.placement_ids() == ["a"]
        metrics = app.state.metrics.registry
        assert metrics.get_sample_value("kcg_forwarded_requests_total", {"outcome": "forwarded"}) == 4
        assert metrics.get_sample_value("kcg_forwarded_requests_total", {"outcome": "owner_unreachable"}) == 1
        assert metrics.get_sample_value("kcg_forwarded_requests_total", {"outcome": "refused"}) == 3
        assert metrics.get_sample_value("kcg_forward_duration_seconds_count") == 4


async def test_upstream_pool() -> None:
    """The forwarding client: keep-alive reuse, chunked and sized bodies, a large body streamed, a read
    timeout, a refused connection, and a kept-alive connection the peer closed meanwhile (GET sent again)."""
    from api.replicas.upstream import UpstreamConnectError, UpstreamError, UpstreamPool

    big = b"x" * (3 << 20)
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ")[1]
                if target == b"/slow":
                    await asyncio.sleep(5)
                elif target == b"/big":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
                elif target == b"/close":
                    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                    await writer.drain()
                    writer.close()  # the peer ends the kept-alive connection after answering
                    return
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = UpstreamPool(connect_timeout=2)
    try:
        for _ in range(3):
            r = await pool.request(base, "GET", "/x", [(b"accept", b"*/*")], b"", 5)
            assert r.status == 200 and await r.read() == b"abc"
            r.close()
        assert connections == 1
        r = await pool.request(base, "POST", "/big", [], b'{"a":1}', 5)
        got = 0
        async for chunk in r.chunks():
            got += len(chunk)
        r.close()
        assert got == len(big) and connections == 1
        r = await pool.request(base, "GET", "/close", [], b"", 5)
        assert r.status == 204 and await r.read() == b""
        r.close()  # back in the pool, but the peer is closing it
        with pytest.raises(UpstreamError, match="closed"):
            await pool.idle[base][-1].wait(5)  # until the peer's close arrives
        r = await pool.request(base, "GET", "/x", [], b"", 5)
        assert await r.read() == b"abc"
        r.close()
        with pytest.raises(UpstreamError, match="in time"):
            await pool.request(base, "GET", "/slow", [], b"", 0.2)
        with pytest.raises(UpstreamConnectError):
            await pool.request("http://127.0.0.1:1", "GET", "/x", [], b"", 5)
    finally:
        pool.close()
        server.close()
