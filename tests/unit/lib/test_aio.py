"""service.lib.aio.LightEvent behaves like asyncio.Event."""

from __future__ import annotations

import asyncio
import sys

import pytest

from service.client.connection import wait_event
from service.lib.aio import LightEvent


async def test_set_wakes_every_waiter_and_clear_affects_later_waits() -> None:
    ev = LightEvent()
    assert not ev.is_set()
    waiters = [asyncio.create_task(ev.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    ev.set()
    ev.clear()  # like asyncio.Event: waiters woken by set() still return True
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert ev._waiters is None
    later = asyncio.create_task(ev.wait())
    await asyncio.sleep(0)
    assert not later.done()
    ev.set()
    assert await later is True
    assert await ev.wait() is True  # already set: returns at once


async def test_a_cancelled_waiter_is_removed() -> None:
    ev = LightEvent()
    a = asyncio.create_task(ev.wait())
    b = asyncio.create_task(ev.wait())
    await asyncio.sleep(0)
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    assert ev._waiters is not None and len(ev._waiters) == 1
    ev.set()
    assert await b is True


async def test_wait_event_times_out_and_sees_a_set() -> None:
    ev = LightEvent()
    assert await wait_event(ev, 0.01) is False
    assert ev._waiters is None
    asyncio.get_running_loop().call_soon(ev.set)
    assert await wait_event(ev, 5) is True


def test_is_small_until_waited_on() -> None:
    ev = LightEvent()
    assert not hasattr(ev, "__dict__") and ev._waiters is None
    assert sys.getsizeof(ev) < 100 < sys.getsizeof(asyncio.Event()._waiters)  # asyncio's deque alone


async def test_wait_timeout_expires_without_cancellation_and_wakes_on_set() -> None:
    ev = LightEvent()
    assert await ev.wait_timeout(0.01) is False
    assert ev._waiters is None  # the expired waiter is gone
    waiter = asyncio.ensure_future(ev.wait_timeout(30))
    await asyncio.sleep(0)
    ev.set()
    assert await waiter is True and ev._waiters is None
    assert await ev.wait_timeout(0) is True  # already set
    ev.clear()
    task = asyncio.ensure_future(ev.wait_timeout(30))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ev._waiters is None  # a cancelled waiter leaves nothing behind
