"""One memory budget for the process (``GATEWAY_MEMORY_BUDGET_BYTES``): everything that holds record bytes
because a client asked for them is charged to it.

Six kinds of charge:

- ``prefetch``: records fetched for consumer instances and not yet handed to their owners (the fetcher's
  buffer). Charged when a fetch response has been decoded, released as polls drain it.
- ``fetch``: in-flight consumer fetches. Before a fetch is sent the fetcher asks for a *grant*
  (:meth:`MemoryBudget.grant`); the grant is the fetch's ``max_bytes`` (the broker's response is bounded by it,
  plus at most one record batch: Kafka returns the first batch even when it is larger, so a consumer can always
  progress) and is released when the response has been handled.
- ``share``: records acquired by share consumer instances (service/share/consumer.py): each ShareFetch's
  ``max_bytes`` is a ``fetch`` grant as above while it is in flight; the bytes of the records it brought are then
  charged as ``share`` until the answer carrying them (a poll, a stream's chunk) was written and sent.
- ``range``: offset-range pages being read, decoded and rendered (:meth:`MemoryBudget.reserve`, a short queue).
- ``body``: request bodies being received (produce), charged as they arrive (and, on the protocol-level produce
  path, until the answer left the process).
- ``send``: answer bodies (range pages, polls, stream chunks, produce answers) written to a connection and not yet
  sent: charged (forced: the bytes exist) when written, released once the connection drained below its
  low-water mark (api/server/http.py ``held_send``), so a client that does not read holds its answer in
  the budget and later requests wait for room instead of the process growing.

Consumer prefetch (``prefetch`` + ``fetch``) may take at most :attr:`MemoryBudget.prefetch_limit` (three quarters
of the total), so consumers whose owners stopped polling cannot leave nothing for range reads and produce
requests; requests may take up to the total. When a request's charge does not fit it waits in a FIFO queue for a
bounded time and is then refused (:class:`BudgetExhausted`: the HTTP layer answers 503 with ``Retry-After``);
a fetch that gets no grant is not sent, and its fetcher is woken when memory is released.

A fetch without a grant whose owner is polling makes room by dropping the prefetched records of the
instances that have not asked for records for the longest time (:meth:`MemoryBudget.reclaim`: prefetch is a
cache; positions do not move, the records are fetched again when those owners poll, and until then they do not
prefetch), so consumers that stopped polling cannot starve the ones that poll.

Grants shrink as the budget fills (a quarter of what is left, at least :data:`MIN_GRANT`), so many consumers keep
long-polling with small fetches instead of a few holding the whole budget. Nothing here does I/O; the waiting
queue uses the running event loop's futures only in :meth:`MemoryBudget.reserve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

KINDS = ("prefetch", "fetch", "share", "range", "body", "send")
#: The smallest fetch grant: below it the fetch waits for memory to be released.
MIN_GRANT = 64 * 1024
#: The share of the budget consumer prefetch (buffered + in-flight fetches) may use.
PREFETCH_SHARE = 0.75


class BudgetExhausted(Exception):
    """The memory budget had no room for a request's charge within its wait."""

    def __init__(self, kind: str, wanted: int, budget: MemoryBudget, retry_after: int = 1) -> None:
        self.kind = kind
        self.wanted = wanted
        self.retry_after = retry_after
        super().__init__(
            f"the gateway's memory budget is spent ({budget.used} of {budget.total} bytes in use; this request "
            f"needs {wanted}): retry later")


class MemoryBudget:
    """The process-wide memory budget (see the module docstring)."""

    def __init__(self, total: int, prefetch_share: float = PREFETCH_SHARE) -> None:
        if total <= 0:
            raise ValueError("the memory budget must be positive")
        self.total = total
        self.prefetch_limit = max(1, int(total * prefetch_share))
        self.by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.used = 0
        self.refused: dict[str, int] = dict.fromkeys(KINDS, 0)  # charges refused (range, body) or deferred (fetch)
        self._waiters: deque[tuple[int, str, asyncio.Future[None]]] = deque()
        self._on_free: list[Callable[[], None]] = []
        self._fetchers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.reclaimed = 0  # prefetched bytes dropped for fetchers whose owners were waiting

    # -- accounting -------------------------------------------------------------------------------
    @property
    def consumer_used(self) -> int:
        return self.by_kind["prefetch"] + self.by_kind["fetch"]

    def _charge(self, kind: str, n: int) -> None:
        self.by_kind[kind] += n
        self.used += n

    def add(self, delta: int, kind: str = "prefetch") -> None:
        """Charge (``delta`` > 0) or release (< 0) bytes that are already held (the fetcher's buffer)."""
        if delta < 0:
            self.release(-delta, kind)
        elif delta:
            self._charge(kind, delta)

    def release(self, n: int, kind: str) -> None:
        if n <= 0:
            return
        n = min(n, self.by_kind[kind])  # never below zero, whatever the caller's bookkeeping
        self.by_kind[kind] -= n
        self.used -= n
        self._wake()

    def available(self) -> bool:
        """Whether consumer prefetch may fetch more (the fetcher's gate)."""
        return self.consumer_used < self.prefetch_limit and self.used < self.total

    def room(self) -> int:
        return max(0, self.total - self.used)

    # -- consumer fetches ---------------------------------------------------------------------------
    def grant(self, want: int) -> int:
        """Bytes granted to a consumer fetch that wants up to ``want`` (0: none now; wait for
        :meth:`when_free`). The grant is charged as ``fetch`` until :meth:`release` (kind ``fetch``)."""
        left = min(self.prefetch_limit - self.consumer_used, self.total - self.used)
        if left < min(MIN_GRANT, want) or want <= 0:
            if want > 0:
                self.refused["fetch"] += 1
            return 0
        n = min(want, max(MIN_GRANT, left // 4))
        n = min(n, left)
        self._charge("fetch", n)
        return n

    def register(self, fetcher: Any) -> None:
        """A consumer fetcher whose prefetched records :meth:`reclaim` may drop (``last_demand``, ``polling``,
        ``buffered_bytes``, ``shed()``)."""
        self._fetchers.add(fetcher)

    def reclaim(self, need: int, requester: Any = None, active_s: float = 1.0) -> int:
        """Prefetched records are a cache: drop those of the fetchers whose owners asked for records longest
        ago (not polling now, no poll for ``active_s``), until ``need`` bytes are free for ``requester``, a
        fetcher with an owner waiting. The records are fetched again when their owners poll (positions do not
        move). Returns the bytes freed."""
        now = time.monotonic()
        victims = sorted((f for f in list(self._fetchers)
                          if f is not requester and not f.polling and f.buffered_bytes > 0
                          and now - f.last_demand > active_s), key=lambda f: f.last_demand)
        freed = 0
        for f in victims:
            if freed >= need:
                break
            freed += f.shed()
        if freed:
            self.reclaimed += freed
        return freed

    def when_free(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) the next time memory is released."""
        self._on_free.append(callback)

    # -- requests ----------------------------------------------------------------------------------
    def try_reserve(self, n: int, kind: str) -> bool:
        """Charge ``n`` bytes at once if they fit and nobody is queued before — or, for a small charge (at most
        1/16 of the budget), if they fit at all: a small page or body is not refused for a large one waiting
        (which is bounded by its own wait) — else False."""
        if n <= 0:
            return True
        if self.used + n <= self.total and (not self._waiters or n <= self.total // 16):
            self._charge(kind, n)
            return True
        return False

    async def reserve(self, n: int, kind: str, wait_s: float) -> int:
        """Charge ``n`` bytes (at most the total) for a request, queueing up to ``wait_s`` seconds behind
        earlier requests; raise :class:`BudgetExhausted` when they do not fit in time. Returns the charge
        (release it with :meth:`release`)."""
        n = min(max(0, n), self.total)
        if self.try_reserve(n, kind):
            return n
        if wait_s <= 0:
            self.refused[kind] += 1
            raise BudgetExhausted(kind, n, self, self._retry_after(wait_s))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, kind, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled():
                # charged just as the wait ended: give it back before giving up
                self.release(n, kind)
            else:
                fut.cancel()
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
            self._wake()  # the queue's head may have changed
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.refused[kind] += 1
            raise BudgetExhausted(kind, n, self, self._retry_after(wait_s)) from None
        return n

    @contextlib.asynccontextmanager
    async def held(self, n: int, kind: str, wait_s: float) -> AsyncIterator[int]:
        """:meth:`reserve` for the duration of a block."""
        got = await self.reserve(n, kind, wait_s)
        try:
            yield got
        finally:
            self.release(got, kind)

    def _retry_after(self, wait_s: float) -> int:
        return max(1, math.ceil(wait_s))

    def _wake(self) -> None:
        while self._waiters:
            n, kind, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.used + n > self.total:
                break
            self._waiters.popleft()
            self._charge(kind, n)
            fut.set_result(None)
        if self._on_free and self.available():
            callbacks, self._on_free = self._on_free, []
            for cb in callbacks:
                cb()

    def snapshot(self) -> dict[str, int]:
        return {"total": self.total, "used": self.used, "prefetch_limit": self.prefetch_limit,
                "queued": len(self._waiters), **{f"used_{k}": v for k, v in self.by_kind.items()}}
