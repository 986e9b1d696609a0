"""The instance registry: replica-named ids, duplicates, limits, idle expiry, the prefetch budget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

from service.client.client import KafkaClient
from service.errors import GatewayError
from service.instances.budget import MemoryBudget
from service.instances.registry import (
    HARD_CLOSE_GRACE_S,
    ConsumerInstance,
    Gateway,
    InstanceExists,
    InstanceExpired,
    InstanceNotFound,
    InstanceOptions,
    TooManyInstances,
)


async def test_ids_duplicates_limits_and_expiry() -> None:
    gw = Gateway(replica_id="east-1", idle_timeout=10.0, max_instances=3)
    rt = gw.tenant("t1", bootstrap="127.0.0.1:1")  # no connection is made until a consumer starts
    a = await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    assert a.instance_id == "alpha"  # the id is the chosen name, as in Confluent
    with pytest.raises(InstanceExists):
        await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    b = await gw.create_instance(rt, "other-group", InstanceOptions(), "alpha")  # same name, other group
    assert b.instance_id == "alpha"
    anon = await gw.create_instance(rt, "g", InstanceOptions())
    assert anon.instance_id.startswith("rest-consumer-east-1-")  # generated ids name the replica
    with pytest.raises(TooManyInstances):
        await gw.create_instance(rt, "g", InstanceOptions(), "delta")
    with pytest.raises(GatewayError, match="name must be"):
        await gw.create_instance(rt, "g", InstanceOptions(), "bad/name")
    # a tenant's own limit
    rt2 = gw.tenant("t2", bootstrap="127.0.0.1:1")
    with pytest.raises(TooManyInstances, match="tenant 't2'"):
        await gw.create_instance(rt2, "g", InstanceOptions(), "x", tenant_max_instances=0)
    # tenants do not see each other's instances
    with pytest.raises(InstanceNotFound):
        gw.get_instance(rt2, "g", "alpha")
    # expiry: idle past the timeout → closed, and a distinct error afterwards
    now = time.monotonic()
    a.last_used = now - 11
    b.active_requests = 1  # a long poll or stream in progress keeps it alive
    b.last_used = now - 11
    assert await gw.reap(now) == 1
    with pytest.raises(InstanceExpired, match="expired after 10 s"):
        gw.get_instance(rt, "g", "alpha")
    assert gw.get_instance(rt, "other-group", "alpha") is b
    assert a.closed and gw.expired_total == 1
    # recreating the name clears the expired marker
    again = await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    assert gw.get_instance(rt, "g", "alpha") is again
    await gw.close()


def test_budget_and_replica_id_validation() -> None:
    b = MemoryBudget(100)
    b.add(60)
    assert b.available()
    b.add(50)
    assert not b.available()
    b.add(-200)
    assert b.used == 0 and b.available()
    with pytest.raises(ValueError):
        Gateway(replica_id="bad~id")
    assert isinstance(KafkaClient("h:1"), KafkaClient)


def _fake_closes(insts: list[ConsumerInstance], close: Callable[[], Awaitable[None]]) -> None:
    for inst in insts:
        inst.consumer.close = lambda *, force_static_leave=False, _c=close: _c()  # type: ignore[method-assign]


async def test_close_runs_instance_closes_concurrently_but_bounded() -> None:
    gw = Gateway(shutdown_concurrency=3)
    rt = gw.tenant("t1", bootstrap="127.0.0.1:1")
    insts = [await gw.create_instance(rt, "g", InstanceOptions(), f"c{i}") for i in range(10)]
    running = peak = closed = 0
    three_running = asyncio.Event()

    async def close() -> None:
        nonlocal running, peak, closed
        running += 1
        peak = max(peak, running)
        if running == 3:
            three_running.set()
        await three_running.wait()  # the first closes overlap (would deadlock if they ran one by one)
        await asyncio.sleep(0)
        running -= 1
        closed += 1

    _fake_closes(insts, close)
    assert await asyncio.wait_for(gw.close(), 5) == 0
    assert (peak, closed, gw.instance_count) == (3, 10, 0)
    assert all(i.closed for i in insts)


async def test_close_abandons_a_close_that_ignores_cancellation(caplog: pytest.LogCaptureFixture) -> None:
    gw = Gateway(shutdown_timeout=0.2)
    rt = gw.tenant("t1", bootstrap="127.0.0.1:1")
    insts = [await gw.create_instance(rt, "g", InstanceOptions(), f"c{i}") for i in range(3)]
    never = asyncio.Event()
    stubborn_started = asyncio.Event()

    async def quick() -> None:
        return None

    async def stubborn() -> None:  # like a close that swallows CancelledError around an await
        stubborn_started.set()
        while not never.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await never.wait()

    async def failing() -> None:
        raise RuntimeError("boom")

    for inst, close in zip(insts, (quick, stubborn, failing), strict=True):
        _fake_closes([inst], close)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="service.instances.registry"):
        unclean = await asyncio.wait_for(gw.close(), 5)
    elapsed = time.monotonic() - started
    assert stubborn_started.is_set()
    assert 0.2 <= elapsed < 0.2 + HARD_CLOSE_GRACE_S + 0.5
    assert unclean == 2  # the stubborn one (cancelled) and the failing one
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("1 shutdown tasks (instance or connection closes) were still running") for m in msgs)
    assert any(m.startswith("2 of 3 consumer instances did not close cleanly within the 0.2 s shutdown timeout "
                            "(1 still closing, cancelled; 1 failed)") for m in msgs), msgs
    never.set()  # let the abandoned task end


def test_shutdown_timeout_setting_reaches_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.app import create_app
    from service.settings import Settings

    assert Settings().shutdown_timeout_s == 10.0
    monkeypatch.setenv("GATEWAY_SHUTDOWN_TIMEOUT_S", "2.5")
    app = create_app(Settings(), "127.0.0.1:1")
    assert app.state.gateway.shutdown_timeout == 2.5
    with pytest.raises(ValueError):
        Gateway(shutdown_timeout=0)
