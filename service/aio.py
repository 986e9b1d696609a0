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

    def __repr__(self) -> str:
        return f"<LightEvent {'set' if self._value else 'unset'}, waiters: {len(self._waiters or ())}>"
