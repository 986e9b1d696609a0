"""Small asyncio helpers shared by the engine."""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Waiter(Protocol):
    """What TickTimers wakes: an asyncio future, or anything with the same done() and set_result()."""

    def done(self) -> bool: ...

    def set_result(self, result: bool, /) -> None: ...


T = TypeVar("T")

class LightEvent:
    """asyncio.Event's interface (set/clear/is_set/wait) in ~60 bytes instead of ~860.

    asyncio.Event allocates a deque for its waiters up front; a gateway keeps several events per consumer
    instance and tens of thousands of instances, most of which nobody ever waits on. Waiters here are
    kept in a list created on the first wait. Semantics match asyncio.Event: ``set`` wakes every current
    waiter, ``clear`` affects only later waits, and a cancelled waiter is simply removed.
    """

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if self._value:
            return
        self._value = True
        waiters = self._waiters
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        await self._park(asyncio.get_running_loop().create_future())
        return True

    async def _park(self, fut: asyncio.Future[bool]) -> bool:
        """Wait on ``fut`` as one of this event's waiters (``set`` resolves it with True)."""
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            return await fut
        finally:
            self._waiters.remove(fut)
            if not self._waiters:
                self._waiters = None

    async def wait_timeout(self, timeout: float, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Wait until set or ``timeout`` seconds passed; True if set. A plain timer resolves the waiter's
        future (no task cancellation and no exceptions on expiry, unlike ``asyncio.timeout``): thousands
        of idle members pause between heartbeats with it, and an expiring ``asyncio.timeout`` costs
        several times more than the wake-up itself."""
        if self._value:
            return True
        if loop is None:
            loop = asyncio.get_running_loop()  # callers on a hot path pass theirs (this is a getpid() on 3.11)
        fut: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(max(0.0, timeout), _expire, fut)
        try:
            return await self._park(fut)
        finally:
            timer.cancel()

    def __repr__(self) -> str:
        return f"<LightEvent {'set' if self._value else 'unset'}, waiters: {len(self._waiters or ())}>"


class TickGrid(Generic[T]):
    """Items due on a shared grid of ``tick`` seconds of one loop's clock, served by one loop timer.

    An item is appended to the list of its tick (the first multiple of ``tick`` at or after its deadline) and
    the loop has one timer armed, for the earliest tick; deadlines are rounded up by less than ``tick``, so the
    items of many callers come due together. Subclasses act on the due items in ``_fire`` (with
    :meth:`_begin_fire` and :meth:`_pop_due`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float) -> None:
        self.loop = loop
        self.tick = tick
        self._buckets: dict[int, list[T]] = {}
        self._heap: list[int] = []  # the ticks that have a bucket
        self._armed: int | None = None  # the tick the loop timer is set for
        self._handle: asyncio.TimerHandle | None = None
        self.fired = 0  # timer callbacks so far (tests, metrics)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def add(self, item: T, when: float) -> None:
        k = math.ceil(when / self.tick - 1e-9)
        bucket = self._buckets.get(k)
        if bucket is None:
            bucket = self._buckets[k] = []
            heapq.heappush(self._heap, k)
            if self._armed is None or k < self._armed:
                self._arm(k)
        bucket.append(item)

    def _arm(self, k: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = k
        self._handle = self.loop.call_at(k * self.tick, self._fire)

    def _begin_fire(self) -> int:
        """At the start of ``_fire``: count it and return the last tick that is due now."""
        self.fired += 1
        self._handle = None
        due = max(self._armed if self._armed is not None else 0, math.floor(self.loop.time() / self.tick + 1e-9))
        self._armed = None
        return due

    def _pop_due(self, due: int) -> Iterator[list[T]]:
        """The buckets of the ticks up to ``due``, earliest first, each removed from the grid."""
        heap = self._heap
        while heap and heap[0] <= due:
            yield self._buckets.pop(heapq.heappop(heap))

    def _fire(self) -> None:
        raise NotImplementedError


class TickTimers(TickGrid[Waiter]):
    """Many waiters woken on a shared grid of ``tick`` seconds by one loop timer (:class:`TickGrid`).

    Ten thousand idle consumer members each wait for something every few seconds; with a loop timer each,
    every wait pays a timer's creation, its insertion into and removal from the loop's timer heap (ten
    thousand entries, cold in the CPU caches) and its cancellation. When a tick fires, every waiter of the
    due ticks that is not done yet gets ``set_result(False)``. A waiter is a future or anything future-like
    with ``done()`` and ``set_result()``; waiters that ended early (done) are left in their list and
    skipped."""

    def _fire(self) -> None:
        for bucket in self._pop_due(self._begin_fire()):
            for fut in bucket:
                if not fut.done():
                    fut.set_result(False)
        if self._heap:
            self._arm(self._heap[0])


_TICKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, TickTimers]] = weakref.WeakKeyDictionary()


def tick_timers(loop: asyncio.AbstractEventLoop, tick: float) -> TickTimers:
    """The loop's shared :class:`TickTimers` of ``tick`` seconds."""
    per_loop = _TICKS.get(loop)
    if per_loop is None:
        per_loop = _TICKS[loop] = {}
    t = per_loop.get(tick)
    if t is None:
        t = per_loop[tick] = TickTimers(loop, tick)
    return t


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
