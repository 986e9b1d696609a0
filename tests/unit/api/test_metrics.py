"""kcg_event_loop_lag_seconds reports the largest event-loop lag since the previous scrape; the collector's
heartbeat age, readiness and background-task series."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service import metrics
from service.consumer.consumer import ConsumerStats
from service.metrics import BACKGROUND_TASKS, GatewayCollector, GatewayMetrics

LAG = "kcg_event_loop_lag_seconds"


def scrape(registry: CollectorRegistry) -> float:
    """One scrape, as /metrics does it (generate_latest), parsed back."""
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == LAG:
                return float(s.value)
    raise AssertionError(f"{LAG} missing")


def test_lag_is_the_maximum_since_the_previous_scrape() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    assert scrape(registry) == 0.0  # nothing observed yet
    for lag in (0.002, 0.25, 0.004, 0.0):  # a short stall between quiet ticks
        m.observe_event_loop_lag(lag)
    assert scrape(registry) == 0.25  # the stall, not the last tick's 0.0
    assert scrape(registry) == 0.0  # reset by the scrape
    m.observe_event_loop_lag(0.01)
    m.observe_event_loop_lag(0.003)
    assert scrape(registry) == 0.01
    text = generate_latest(registry).decode()
    assert f"# HELP {LAG} Largest delay of a periodic event-loop tick since the previous scrape" in text
    assert f"# TYPE {LAG} gauge" in text


async def test_a_short_stall_between_scrapes_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    stalled = asyncio.Event()  # a tick saw the stall
    quiet_after = asyncio.Event()  # a later tick was quick again
    observe = m.observe_event_loop_lag

    def observed(lag: float) -> None:
        observe(lag)
        if lag >= 0.15:
            stalled.set()
        elif stalled.is_set() and lag < 0.1:
            quiet_after.set()

    monkeypatch.setattr(m, "observe_event_loop_lag", observed)
    watcher = asyncio.create_task(m.watch_event_loop(interval=0.01))
    try:
        await asyncio.sleep(0)  # let the watcher start its first tick
        time.sleep(0.2)  # noqa: ASYNC251 - the stall under test: block the event loop
        await asyncio.wait_for(quiet_after.wait(), 5)
        # the last tick was quick, yet the next scrape still shows the stall ...
        assert scrape(registry) >= 0.15
        # ... and the one after it has forgotten it
        assert scrape(registry) < 0.15
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


# -- the collector's heartbeat, readiness and background-task series ------------------------------------------

class FakeCoordinator:
    def __init__(self) -> None:
        self.heartbeats = 0
        self.heartbeat_latency: float | None = None
        self.stable = False


def fake_instance(coordinator: FakeCoordinator | None) -> Any:
    fetch_stats = SimpleNamespace(full_fetches=0, incremental_fetches=0, session_errors=0, session_resets=0,
                                  aborted_after_delivery=0)
    consumer = SimpleNamespace(stats=ConsumerStats(), fetcher=SimpleNamespace(stats=fetch_stats, buffered_bytes=0),
                               coordinator=coordinator, lag=dict)
    return SimpleNamespace(consumer=consumer, group="g")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(registry: CollectorRegistry, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
            if s.name.startswith(prefix)}


def heartbeat_age(registry: CollectorRegistry, tenant: str = "t1") -> float:
    return samples(registry, "kcg_heartbeat_age_seconds")[("kcg_heartbeat_age_seconds",
                                                           frozenset({("tenant", tenant)}))]


def test_heartbeat_age_grows_while_a_stable_member_completes_no_heartbeat() -> None:
    clock = Clock()
    a, b = FakeCoordinator(), FakeCoordinator()
    rt = SimpleNamespace(instances={"a": fake_instance(a), "b": fake_instance(b), "c": fake_instance(None)})
    registry = CollectorRegistry()
    registry.register(GatewayCollector(SimpleNamespace(tenants={"t1": rt}), clock=clock))  # type: ignore[arg-type]
    assert heartbeat_age(registry) == 0  # nobody stable yet: nobody is expected to heartbeat
    clock.now += 30
    assert heartbeat_age(registry) == 0  # joining for 30 s is not a missed heartbeat

    a.stable = b.stable = True  # both joined: from now on they must heartbeat
    assert heartbeat_age(registry) == 0
    clock.now += 5
    a.heartbeats += 2
    b.heartbeats += 2
    assert heartbeat_age(registry) == 0  # both heartbeated since the previous scrape
    clock.now += 5
    a.heartbeats += 1  # b is silent
    assert heartbeat_age(registry) == 5
    clock.now += 7
    a.heartbeats += 3
    assert heartbeat_age(registry) == 12  # the max over the tenant's members: b, silent for 12 s
    a.heartbeats += 1
    b.heartbeats += 1
    clock.now += 1
    assert heartbeat_age(registry) == 0  # b is back
    assert samples(registry, "kcg_heartbeats_total") == {("kcg_heartbeats_total", frozenset({("tenant", "t1")})): 10}

    a.stable = False  # a is closing: no longer expected to heartbeat
    b.stable = False  # b rebalances: not expected to heartbeat; its age starts over once stable again
    clock.now += 20
    assert heartbeat_age(registry) == 0
    b.stable = True
    clock.now += 20
    assert heartbeat_age(registry) == 0
    clock.now += 3
    assert heartbeat_age(registry) == 3


def test_heartbeat_age_of_a_closed_member_is_forgotten() -> None:
    clock = Clock()
    a = FakeCoordinator()
    a.stable = True
    rt = SimpleNamespace(instances={"a": fake_instance(a)})
    collector = GatewayCollector(SimpleNamespace(tenants={"t1": rt}), clock=clock)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    assert heartbeat_age(registry) == 0  # first seen by this scrape
    clock.now += 50
    assert heartbeat_age(registry) == 50
    del rt.instances["a"]
    assert heartbeat_age(registry) == 0
    assert collector._heartbeats == {}  # no reference to the closed member's coordinator is kept


def test_every_background_task_has_a_series_per_tenant() -> None:
    stats = ConsumerStats()
    stats.task_failures["fetcher"] = 2
    inst = fake_instance(None)
    inst.consumer.stats = stats
    registry = CollectorRegistry()
    gateway = SimpleNamespace(tenants={"t1": SimpleNamespace(instances={"a": inst}),
                                       "t2": SimpleNamespace(instances={})})
    registry.register(GatewayCollector(gateway))  # type: ignore[arg-type]
    got = {(dict(lbl)["tenant"], dict(lbl)["task"]): v
           for (name, lbl), v in samples(registry, "kcg_background_task_failures_total").items()
           if name == "kcg_background_task_failures_total"}
    assert got == {**{(t, task): 0.0 for t in ("t1", "t2") for task in BACKGROUND_TASKS}, ("t1", "fetcher"): 2.0}


class FakeClient:
    def __init__(self, fail: bool = False, hang: asyncio.Event | None = None) -> None:
        self.fail = fail
        self.hang = hang
        self.probes = 0

    async def refresh_metadata(self) -> None:
        self.probes += 1
        if self.hang is not None:
            await self.hang.wait()
        if self.fail:
            raise ConnectionRefusedError("broker down")


def readiness(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for (name, lbl), v in samples(registry, "kcg_").items():
        if name == "kcg_ready":
            out["ready"] = v
        elif name == "kcg_broker_reachable":
            out[dict(lbl)["tenant"]] = v
    return out


async def scrape_readiness(collector: GatewayCollector, registry: CollectorRegistry) -> dict[str, float]:
    """One scrape as /metrics does it: prepare() on the event loop (which may start a probe), then the text."""
    await collector.prepare()
    return readiness(registry)


async def test_readiness_comes_from_background_probes_started_by_scrapes() -> None:
    clock = Clock()
    good, bad = FakeClient(), FakeClient(fail=True)
    gateway = SimpleNamespace(tenants={"ok": SimpleNamespace(instances={}, client=good)}, draining=False)
    collector = GatewayCollector(gateway, clock=clock)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    assert await scrape_readiness(collector, registry) == {}  # starts a probe; no result yet: absent, not a guess
    assert collector._probe_task is not None
    await collector._probe_task
    assert await scrape_readiness(collector, registry) == {"ready": 1, "ok": 1}  # a later scrape shows it
    assert good.probes == 1  # and started no probe: the previous one is too recent

    gateway.tenants["down"] = SimpleNamespace(instances={}, client=bad)
    clock.now += metrics.READINESS_PROBE_INTERVAL_S
    assert await scrape_readiness(collector, registry) == {"ready": 1, "ok": 1}
    await collector._probe_task
    assert await scrape_readiness(collector, registry) == {"ready": 0, "ok": 1, "down": 0}
    assert (good.probes, bad.probes) == (2, 1)

    del gateway.tenants["down"]
    gateway.draining = True  # SIGTERM: not ready whatever the brokers say
    assert (await scrape_readiness(collector, registry))["ready"] == 0
    clock.now += metrics.READINESS_PROBE_INTERVAL_S
    await scrape_readiness(collector, registry)
    await collector._probe_task
    assert await scrape_readiness(collector, registry) == {"ready": 0, "ok": 1}


async def test_a_hanging_broker_is_unreachable_after_the_probe_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "READINESS_PROBE_TIMEOUT_S", 0.05)
    hang = asyncio.Event()
    slow = FakeClient(hang=hang)
    gateway = SimpleNamespace(tenants={"slow": SimpleNamespace(instances={}, client=slow)})
    collector = GatewayCollector(gateway, clock=Clock())  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    task = collector.start_readiness_probe()
    assert task is not None
    assert collector.start_readiness_probe() is None  # one probe at a time
    await asyncio.wait_for(task, 5)
    assert readiness(registry) == {"ready": 0, "slow": 0}
    hang.set()


def test_counters_do_not_go_down_when_instances_close() -> None:
    """A closed instance's counts stay in its tenant's totals: a drop would be a counter reset to rate()."""
    def inst(rebalances: int, fetches: int, failures: int, heartbeats: int) -> Any:
        coordinator = FakeCoordinator()
        coordinator.heartbeats = heartbeats
        i = fake_instance(coordinator)
        i.consumer.stats.rebalances = rebalances
        i.consumer.stats.task_failures["membership"] = failures
        i.consumer.fetcher.stats.full_fetches = fetches
        i.consumer.fetcher.stats.session_resets = failures
        return i

    rt = SimpleNamespace(instances={"a": inst(2, 10, 1, 7), "b": inst(1, 5, 0, 3)})
    registry = CollectorRegistry()
    registry.register(GatewayCollector(SimpleNamespace(tenants={"t1": rt})))  # type: ignore[arg-type]

    def counters() -> tuple[float, float, float, float]:
        got = samples(registry, "kcg_")
        t1 = ("tenant", "t1")
        failures = got[("kcg_background_task_failures_total", frozenset({t1, ("task", "membership")}))]
        # session resets were set to the task failures: they stay in the totals alike
        assert got[("kcg_fetch_session_resets_total", frozenset({t1}))] == failures
        return (got[("kcg_rebalances_total", frozenset({t1}))],
                got[("kcg_fetch_requests_total", frozenset({t1, ("kind", "full")}))],
                failures,
                got[("kcg_heartbeats_total", frozenset({t1}))])

    assert counters() == (3, 15, 1, 10)
    rt.instances["a"].consumer.stats.rebalances = 4  # a moves on, then closes
    assert counters() == (5, 15, 1, 10)
    del rt.instances["a"]
    assert counters() == (5, 15, 1, 10)
    rt.instances["c"] = inst(1, 1, 1, 1)  # a new instance adds to them
    assert counters() == (6, 16, 2, 11)
    del rt.instances["b"], rt.instances["c"]
    assert counters() == (6, 16, 2, 11)
    assert samples(registry, "kcg_consumer_instances") == {
        ("kcg_consumer_instances", frozenset({("tenant", "t1")})): 0}


def test_group_protocol_series() -> None:
    """kcg_group_*: revocations and assignment changes by group protocol, the slowest latest convergence, and the
    highest member epoch of a group's consumer-protocol members; a deleted instance's counts stay."""
    classic = fake_instance(FakeCoordinator())
    classic.consumer.group_protocol = "classic"
    classic.consumer.stats.partitions_revoked, classic.consumer.stats.rebalances = 12, 2
    classic.consumer.stats.last_converge_seconds = 0.8
    coord = FakeCoordinator()
    coord.converge_seconds = 0.3  # type: ignore[attr-defined]
    new = fake_instance(coord)
    new.consumer.group_protocol = "consumer"
    new.consumer.member = SimpleNamespace(member_epoch=7)
    new.consumer.stats.partitions_revoked, new.consumer.stats.rebalances = 2, 3
    rt = SimpleNamespace(instances={"a": classic, "b": new})
    registry = CollectorRegistry()
    registry.register(GatewayCollector(SimpleNamespace(tenants={"t1": rt})))  # type: ignore[arg-type]

    def by(prefix: str) -> dict[str, float]:
        return {dict(labels).get("protocol") or dict(labels)["group"]: v
                for (_, labels), v in samples(registry, prefix).items()}

    assert by("kcg_group_partitions_revoked_total") == {"classic": 12, "consumer": 2}
    assert by("kcg_group_assignment_changes_total") == {"classic": 2, "consumer": 3}
    assert by("kcg_group_converge_seconds") == {"classic": 0.8, "consumer": 0.3}
    assert by("kcg_group_member_epoch") == {"g": 7}
    del rt.instances["b"]
    assert by("kcg_group_partitions_revoked_total") == {"classic": 12, "consumer": 2}
