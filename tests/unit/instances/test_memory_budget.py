"""The process memory budget (service/instances/budget.py): grants, the prefetch share, the request queue."""

from __future__ import annotations

import asyncio

import pytest

from api.v2.consumer_config import HONOURED, MAX_FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES
from service.instances.budget import MIN_GRANT, BudgetExhausted, MemoryBudget

MiB = 1024 * 1024


def test_grants_are_charged_and_released() -> None:
    b = MemoryBudget(100 * MiB)
    g = b.grant(4 * MiB)
    assert g == 4 * MiB and b.by_kind["fetch"] == g and b.used == g
    b.release(g, "fetch")
    assert b.used == 0 and b.by_kind["fetch"] == 0


def test_consumer_prefetch_never_takes_more_than_its_share() -> None:
    b = MemoryBudget(100 * MiB)
    grants = []
    while (g := b.grant(50 * MiB)) > 0:
        grants.append(g)
        assert len(grants) < 10_000
    assert b.consumer_used <= b.prefetch_limit == 75 * MiB
    assert b.prefetch_limit - b.consumer_used < MIN_GRANT  # filled up to the share
    assert b.grant(MIN_GRANT) == 0
    # grants shrink as the budget fills, so many fetches get some room rather than a few getting it all
    assert grants[0] > grants[-1] and len(grants) > 8
    # requests still have the rest
    assert b.try_reserve(20 * MiB, "range")
    assert not b.try_reserve(10 * MiB, "range")


def test_buffered_bytes_count_against_the_share() -> None:
    b = MemoryBudget(8 * MiB)
    b.add(6 * MiB)  # the fetcher's buffer
    assert not b.available() and b.grant(MiB) == 0 and b.refused["fetch"] == 1
    woken = []
    b.when_free(lambda: woken.append(1))
    b.add(-3 * MiB)
    assert woken == [1] and b.available()
    assert b.grant(MiB) == 3 * MiB // 4  # a quarter of the room left to consumers (3 MiB)


def test_release_never_goes_negative() -> None:
    b = MemoryBudget(MiB)
    b.release(500, "range")
    b.add(-500)
    assert b.used == 0 and all(v == 0 for v in b.by_kind.values())


async def test_requests_queue_in_order_then_are_refused_with_retry_after() -> None:
    b = MemoryBudget(10 * MiB)
    first = await b.reserve(8 * MiB, "range", 1.0)
    order: list[str] = []

    async def later(name: str, n: int) -> None:
        got = await b.reserve(n, "body", 5.0)
        order.append(name)
        b.release(got, "body")

    t1 = asyncio.create_task(later("a", 4 * MiB))
    t2 = asyncio.create_task(later("b", 1 * MiB))  # would fit now, but waits behind "a" (FIFO)
    await asyncio.sleep(0)
    assert order == [] and len(b._waiters) == 2
    b.release(first, "range")
    await asyncio.gather(t1, t2)
    assert order == ["a", "b"] and b.used == 0
    # no room within the wait: refused, counted, nothing left charged or queued
    held = await b.reserve(10 * MiB, "range", 0)
    with pytest.raises(BudgetExhausted) as ei:
        await b.reserve(MiB, "body", 0.05)
    assert ei.value.retry_after >= 1 and "memory budget" in str(ei.value)
    assert b.refused["body"] == 1 and not b._waiters and b.used == held


async def test_a_cancelled_waiter_leaves_no_charge() -> None:
    b = MemoryBudget(4 * MiB)
    held = await b.reserve(4 * MiB, "range", 0)
    t = asyncio.create_task(b.reserve(MiB, "body", 10))
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    b.release(held, "range")
    assert b.used == 0 and not b._waiters


async def test_a_charge_larger_than_the_budget_is_capped_to_it() -> None:
    b = MemoryBudget(MiB)
    async with b.held(50 * MiB, "range", 0) as got:
        assert got == MiB and b.used == MiB
    assert b.used == 0


def test_client_fetch_sizes_are_clamped_to_the_documented_maxima() -> None:
    field, parse = HONOURED["fetch.max.bytes"]
    assert field == "fetch_max_bytes" and parse("fetch.max.bytes", 2**31 - 1) == MAX_FETCH_MAX_BYTES == 52428800
    assert parse("fetch.max.bytes", "1024") == 1024
    _, parse = HONOURED["max.partition.fetch.bytes"]
    assert parse("max.partition.fetch.bytes", 2**31 - 1) == MAX_PARTITION_FETCH_BYTES


class _FakeFetcher:
    def __init__(self, budget: MemoryBudget, buffered: int, last_demand: float, polling: int = 0) -> None:
        self.budget, self.buffered_bytes, self.last_demand, self.polling = budget, buffered, last_demand, polling
        budget.add(buffered)
        budget.register(self)
        self.shed_calls = 0

    def shed(self) -> int:
        freed, self.buffered_bytes = self.buffered_bytes, 0
        self.budget.add(-freed)
        self.shed_calls += 1
        return freed


def test_reclaim_drops_the_prefetch_of_the_longest_idle_owners_first() -> None:
    import time

    b = MemoryBudget(16 * MiB)
    now = time.monotonic()
    oldest = _FakeFetcher(b, 4 * MiB, now - 100)
    old = _FakeFetcher(b, 4 * MiB, now - 50)
    polling = _FakeFetcher(b, 3 * MiB, now - 200, polling=1)  # an owner is waiting on it: kept
    recent = _FakeFetcher(b, 1 * MiB, now)  # asked a moment ago: kept
    hungry = _FakeFetcher(b, 0, now, polling=1)
    assert b.grant(MiB) == 0
    assert b.reclaim(2 * MiB, hungry) == 4 * MiB
    assert (oldest.shed_calls, old.shed_calls, polling.shed_calls, recent.shed_calls) == (1, 0, 0, 0)
    assert b.grant(MiB) == MiB and b.reclaimed == 4 * MiB
    assert b.reclaim(100 * MiB, hungry) == 4 * MiB  # all that may go: only `old` was left
    assert polling.buffered_bytes and recent.buffered_bytes


async def test_a_small_request_is_not_held_behind_a_large_one_waiting() -> None:
    b = MemoryBudget(32 * MiB)
    running = await b.reserve(24 * MiB, "range", 0)
    waiting = asyncio.create_task(b.reserve(24 * MiB, "range", 5))
    await asyncio.sleep(0)
    assert len(b._waiters) == 1
    assert await b.reserve(3 * 1024, "range", 0) == 3 * 1024  # fits beside the running one: not queued
    assert not b.try_reserve(4 * MiB, "body")  # larger than 1/16 of the budget: behind the waiting one
    b.release(3 * 1024, "range")
    b.release(running, "range")
    assert await waiting == 24 * MiB
