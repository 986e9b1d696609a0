"""Small asyncio helpers shared by the engine."""

from __future__ import annotations

import asyncio


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
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            await fut
            return True
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
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        timer = loop.call_later(max(0.0, timeout), _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            self._waiters.remove(fut)
            if not self._waiters:
                self._waiters = None

    def __repr__(self) -> str:
        return f"<LightEvent {'set' if self._value else 'unset'}, waiters: {len(self._waiters or ())}>"


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
