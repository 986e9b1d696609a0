"""Quotas: the shipped defaults and how the tenants file overrides them, the scaled
per-replica shares, the stream / range-read slots, the subscription size, and ``max_instances`` across
replicas — the owner of record's ledger and two coordinators talking through an in-process transport."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from service.client.connection import ConnectionConfig
from service.settings import Settings
from service.tenants import Quotas, Tenant, TenantError, TenantRegistry, hash_api_key
from service.tenants.quotas import (
    DEFAULT_QUOTAS,
    InstanceLedger,
    InstanceQuotaCoordinator,
    PeerFailed,
    PeerUnreachable,
    QuotaUnavailable,
    scaled,
)

H1, H2, H3 = (hash_api_key(k) for k in ("key-one-0123456789", "key-two-0123456789", "key-three-0123456789"))


def load(tmp_path: Path, text: str, defaults: Quotas | None = DEFAULT_QUOTAS) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    path.write_text(textwrap.dedent(text).replace("H1", H1).replace("H2", H2).replace("H3", H3))
    return TenantRegistry.from_file(path, default_bootstrap="k:9092", default_connection=ConnectionConfig(),
                                    default_quotas=defaults)


# -- defaults and overrides ------------------------------------------------------------------------------
def test_settings_ship_non_null_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(Settings.model_fields):
        monkeypatch.delenv(f"GATEWAY_{name.upper()}", raising=False)
    q = Settings().default_quotas()
    assert q == DEFAULT_QUOTAS
    # every cap on what requests hold is on; the request rate is off (it would throttle one heavy client)
    assert [f for f in Quotas.__dataclass_fields__ if getattr(q, f) is None] == ["requests_per_second", "burst"]
    monkeypatch.setenv("GATEWAY_DEFAULT_MAX_INSTANCES", "0")
    monkeypatch.setenv("GATEWAY_DEFAULT_MAX_STREAMS", "7")
    q = Settings().default_quotas()
    assert q.max_instances is None and q.requests_per_second is None and q.burst is None and q.max_streams == 7
    # an operator's rate: its burst is ceil(rate) unless set
    monkeypatch.setenv("GATEWAY_DEFAULT_REQUESTS_PER_SECOND", "2500.5")
    q = Settings().default_quotas()
    assert (q.requests_per_second, q.burst) == (2500.5, None)
    monkeypatch.setenv("GATEWAY_DEFAULT_BURST", "4000")
    assert Settings().default_quotas().burst == 4000


def test_open_mode_tenant_gets_the_defaults() -> None:
    reg = TenantRegistry.single_default(bootstrap="k:9092", connection=ConnectionConfig(),
                                        default_quotas=DEFAULT_QUOTAS)
    assert reg.get("default").quotas == DEFAULT_QUOTAS


def test_file_overrides_defaults_and_null_is_unlimited(tmp_path: Path) -> None:
    reg = load(tmp_path, """
        defaults:
          quotas: {max_streams: 5}
        tenants:
          - {id: a, api_keys: [H1]}
          - {id: b, api_keys: [H2], quotas: {max_instances: null, max_topics_per_subscription: 10,
                                             requests_per_second: 5}}
          - {id: c, api_keys: [H3], quotas: {burst: 50, max_range_reads: null}}
    """)
    a, b, c = reg.get("a").quotas, reg.get("b").quotas, reg.get("c").quotas
    assert a == Quotas(1000, 1000, None, None, 5, 16, 1000)
    # null = unlimited; a rate set without a burst gets ceil(rate), not the gateway's default burst
    assert (b.max_instances, b.max_topics_per_subscription, b.requests_per_second, b.burst) == (None, 10, 5, None)
    assert (c.burst, c.requests_per_second, c.max_range_reads, c.max_streams) == (50, None, None, 5)
    # without gateway defaults (library use), nothing is limited
    assert load(tmp_path, "tenants:\n  - {id: a, api_keys: [H1]}\n", None).get("a").quotas == Quotas()


def test_new_quota_keys_are_validated(tmp_path: Path) -> None:
    from service.tenants import TenantConfigError

    for key in ("max_streams", "max_range_reads", "max_topics_per_subscription"):
        with pytest.raises(TenantConfigError, match=f"quotas.{key}"):
            load(tmp_path, f"tenants:\n  - {{id: a, api_keys: [H1], quotas: {{{key}: 0}}}}\n")


# -- enforcement -------------------------------------------------------------------------------------------
def test_subscription_size() -> None:
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(max_topics_per_subscription=3))
    t.check_subscription_size(3)
    with pytest.raises(TenantError) as info:
        t.check_subscription_size(4)
    assert (info.value.status, info.value.error_code) == (422, 42206)
    assert "at most 3" in info.value.message
    Tenant("u", "k:9092", ConnectionConfig()).check_subscription_size(10**6)


async def test_stream_and_range_read_slots() -> None:
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(max_concurrent_polls=3, max_streams=1, max_range_reads=1))
    async with t.stream_slot():
        assert (t.active_streams, t.active_polls) == (1, 1)
        with pytest.raises(TenantError) as info:
            async with t.stream_slot():
                pass
        assert (info.value.status, info.value.error_code, info.value.retry_after) == (429, 42901, 1)
        async with t.range_read_slot():
            assert (t.active_range_reads, t.active_polls) == (1, 2)
            with pytest.raises(TenantError):
                async with t.range_read_slot():
                    pass
            async with t.poll_slot():
                with pytest.raises(TenantError):  # polls are full (3) even though a poll would be fine alone
                    async with t.poll_slot():
                        pass
    assert (t.active_streams, t.active_range_reads, t.active_polls) == (0, 0, 0)


async def test_scaled_shares_with_replicas() -> None:
    assert [scaled(16, n) for n in (1, 2, 3, 16, 40)] == [16, 8, 6, 1, 1]
    now = [0.0]
    t = Tenant("t", "k:9092", ConnectionConfig(), Quotas(requests_per_second=10, burst=10, max_range_reads=3),
               clock=lambda: now[0])
    t.replicas = lambda: 2
    for _ in range(5):  # this replica's share of the bucket: 5
        t.check_rate()
    with pytest.raises(TenantError) as info:
        t.check_rate()
    assert "on each of 2 gateway replicas" in info.value.message
    now[0] += 0.2  # refills at 5/s: one token
    t.check_rate()
    async with t.range_read_slot(), t.range_read_slot():  # ceil(3 / 2) = 2
        with pytest.raises(TenantError):
            async with t.range_read_slot():
                pass


# -- the owner of record's ledger ----------------------------------------------------------------------------
def test_ledger_reserve_release_tombstones() -> None:
    led = InstanceLedger()
    assert led.reserve("a", "t1", 2, 0.0) and led.reserve("b", "t2", 2, 0.0)
    assert led.reserve("a", "t1", 2, 0.0)  # a repeated grant
    assert not led.reserve("a", "t3", 2, 0.0)
    led.release("t2", 1.0)
    assert led.count() == 1
    assert not led.reserve("b", "t2", 2, 1.0)  # a released token is never granted again
    assert led.reserve("b", "t3", 2, 1.0)
    # a report asked before the release cannot bring t2 back; one asked later without t3 keeps t3 (granted later)
    led.apply_sync({"b": (["t2"], [])}, started=0.5, replicas=["a", "b"], now=2.0)
    assert set(led.held["b"]) == {"t3"}


def test_ledger_sync_drops_gone_replicas_and_counts_pending_unconfirmed() -> None:
    led = InstanceLedger()
    assert led.reserve("a", "t1", 3, 0.0) and led.reserve("b", "t2", 3, 0.0)
    # b crashed: left out of the replica set, its instances are gone
    led.apply_sync({"a": (["t1"], [])}, started=5.0, replicas=["a"], now=5.0)
    assert led.count() == 1 and "b" not in led.held
    # a pending token this owner did not grant counts, but is judged against the limit when it arrives
    led.apply_sync({"a": (["t1", "x1"], ["p1"])}, started=6.0, replicas=["a"], now=6.0)
    assert led.count() == 3
    assert not led.reserve("a", "p2", 3, 6.0)
    assert not led.reserve("a", "p1", 2, 6.0)  # p1 is not let past a limit by having been reported
    assert led.count() == 2
    assert led.reserve("a", "p1", 3, 6.0) and led.count() == 3 and "p1" not in led.unconfirmed


# -- two coordinators ------------------------------------------------------------------------------------------
class Cluster:
    """Replicas a and b with in-process transport; ``down`` replicas are unreachable, ``failing`` ones time out."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.alive = {"a", "b"}
        self.down: set[str] = set()
        self.failing: set[str] = set()
        self.instances: dict[str, dict[str, list[str]]] = {"a": {}, "b": {}}
        self.nodes = {rid: self.node(rid) for rid in ("a", "b")}

    def node(self, rid: str) -> InstanceQuotaCoordinator:
        async def call(replica: str, op: str, payload: dict[str, Any]) -> dict[str, Any]:
            if replica in self.down:
                raise PeerUnreachable("refused")
            if replica in self.failing:
                raise PeerFailed("timed out")
            peer = self.nodes[replica]
            tenant = str(payload["tenant"])
            if op == "held":
                tokens, pending = peer.held_tokens(tenant)
                return {"tokens": tokens, "pending": pending}
            if op == "release":
                peer.ledger_release(tenant, str(payload["token"]))
                return {"released": True}
            granted, count = await peer.grant(tenant, str(payload["replica"]), str(payload["token"]),
                                              payload["limit"])  # type: ignore[arg-type]
            return {"granted": granted, "count": count}

        def owner_of(tenant: str) -> str:
            return self.owner if self.owner in self.alive and self.owner not in self.down else rid

        return InstanceQuotaCoordinator(
            rid, owner_of=owner_of, members=lambda: sorted(self.alive - self.down, key=lambda r: r != rid),
            local_tokens=lambda tenant: self.instances[rid].get(tenant, []), call=call,
            mark_dead=self.down.add)

    async def create(self, rid: str, tenant: str = "t", limit: int = 3) -> str:
        node = self.nodes[rid]
        token = await node.acquire(tenant, limit)
        self.instances[rid].setdefault(tenant, []).append(token)
        node.settle(tenant, token)
        return token

    async def delete(self, rid: str, token: str, tenant: str = "t") -> None:
        self.instances[rid][tenant].remove(token)
        await self.nodes[rid].release(tenant, token)


async def test_limit_holds_across_two_replicas() -> None:
    c = Cluster(owner="a")
    made = [await c.create("b"), await c.create("a"), await c.create("b")]
    for rid in ("a", "b"):
        with pytest.raises(TenantError) as info:
            await c.create(rid)
        assert (info.value.status, info.value.error_code, info.value.retry_after) == (429, 42901, 1)
        assert "already has 3 consumer instances across the gateway replicas" in info.value.message
    assert not c.nodes["a"].pending.get("t") and not c.nodes["b"].pending.get("t")
    await c.delete("b", made[0])
    await c.create("a")
    with pytest.raises(TenantError):
        await c.create("b")
    # another tenant has its own count
    await c.create("b", tenant="other")


async def test_a_crashed_replica_leaks_no_slot() -> None:
    c = Cluster(owner="a")
    for _ in range(3):
        await c.create("b")
    c.alive.discard("b")  # b crashed: the owner's next count no longer includes its instances
    c.instances["b"] = {}
    await c.create("a")
    assert c.nodes["a"].ledgers["t"].count() == 1


async def test_owner_unreachable_moves_on_and_a_silent_peer_fails_closed() -> None:
    c = Cluster(owner="a")
    await c.create("a")
    c.down.add("a")  # b cannot connect to the owner: it is marked dead, b counts itself (a is gone)
    await c.create("b")
    assert c.nodes["b"].ledgers["t"].count() == 1
    c.down.clear()
    c.failing.add("a")  # the owner answers nothing in time: nothing is created, 503 with Retry-After
    with pytest.raises(QuotaUnavailable) as info:
        await c.create("b")
    assert (info.value.status, info.value.error_code, info.value.headers) == (503, 50306, {"Retry-After": "1"})
    assert not c.nodes["b"].pending.get("t")


async def test_reconcile_forgets_tenants_owned_elsewhere() -> None:
    c = Cluster(owner="a")
    await c.create("b")
    assert "t" in c.nodes["a"].ledgers
    c.owner = "b"
    await c.nodes["a"].reconcile()
    assert "t" not in c.nodes["a"].ledgers
    await c.nodes["b"].reconcile()  # b owns no ledger yet: it counts before its first grant
    await c.create("a")
    assert c.nodes["b"].ledgers["t"].count() == 2


# -- a 429 always carries Retry-After ----------------------------------------------------------------------
async def test_every_429_carries_retry_after() -> None:
    from api.errors import error_response
    from service.instances.registry import TooManyInstances

    now = [0.0]
    t = Tenant("t", "k:9092", ConnectionConfig(),
               Quotas(requests_per_second=0.25, burst=1, max_instances=1, max_concurrent_polls=1),
               clock=lambda: now[0])
    refusals: list[TenantError] = []
    t.check_rate()
    with pytest.raises(TenantError) as info:
        t.check_rate()
    refusals.append(info.value)
    assert info.value.headers == {"Retry-After": "4"}  # 1 token at 0.25/s
    with pytest.raises(TenantError) as info:
        t.check_instance_quota(1)
    refusals.append(info.value)
    async with t.poll_slot():
        with pytest.raises(TenantError) as info:
            async with t.poll_slot():
                pass
    refusals.append(info.value)
    refusals.append(TenantError(429, 42901, "a refusal that forgot its retry_after"))
    refusals.append(TenantError(429, 42901, "zero seconds", retry_after=0))
    for exc in refusals:
        assert exc.status == 429 and int(exc.headers["Retry-After"]) >= 1, exc
    # the one constructor of error answers adds it to any 429 that has none, and keeps a given one
    assert error_response(429, 42901, "x").headers["retry-after"] == "1"
    assert error_response(429, 42901, "x", {"Retry-After": "7"}).headers["retry-after"] == "7"
    assert "retry-after" not in error_response(404, 40403, "x").headers
    bare = TooManyInstances("no headers given")
    assert error_response(bare.status, bare.error_code, bare.message, bare.headers or None
                          ).headers["retry-after"] == "1"
