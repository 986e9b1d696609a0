"""Keep Python's cyclic garbage collector from stalling a gateway with many long-lived instances.

Every consumer instance owns a few hundred container objects (tasks, futures, dicts, state). CPython 3.11
collects its oldest generation whenever the objects that survived into it since the last full pass
exceed a quarter of it, and a full pass walks *every* tracked object: about 0.14 s per 1,000 instances,
1.4 s at 10,000 — an event-loop stall that delays every HTTP request and heartbeat of the process.

The policy: every ``freeze_interval`` seconds, collect what is not frozen yet (cheap: only objects created
since the last freeze) and then freeze everything that survived (``gc.freeze``). Frozen objects are
never scanned again; reference counting still frees them as usual. What freezing cannot free is cyclic
garbage formed later by frozen objects — mainly closed instances. So once the instances closed since the
last reclaim reach ``reclaim_fraction`` of the live ones (and at least ``reclaim_min``), and at most once
per ``reclaim_interval``, the frozen set is thawed and collected in one full pass (the stall the default
collector would have paid many times over).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class GcPolicy:
    live: Callable[[], int]  # instances alive now
    closed_total: Callable[[], int]  # instances closed since start
    freeze_interval: float = 30.0
    reclaim_interval: float = 600.0
    reclaim_fraction: float = 0.25
    reclaim_min: int = 500
    _closed_at_reclaim: int = 0
    _last_reclaim: float = 0.0
    reclaims: int = 0
    last_pause_s: float = 0.0

    def step(self, now: float | None = None) -> str:
        """One round; returns what it did ("reclaim" or "freeze")."""
        now = time.monotonic() if now is None else now
        closed = self.closed_total() - self._closed_at_reclaim
        started = time.perf_counter()
        action = "freeze"
        if (closed >= max(self.reclaim_min, self.reclaim_fraction * self.live())
                and now - self._last_reclaim >= self.reclaim_interval):
            gc.unfreeze()
            action = "reclaim"
            self.reclaims += 1
            self._last_reclaim = now
            self._closed_at_reclaim += closed
        gc.collect()  # with the rest frozen: only what is new since the last round
        gc.freeze()
        self.last_pause_s = time.perf_counter() - started
        if action == "reclaim":
            log.info("gc: reclaimed the garbage of %d closed instances in %.3f s", closed, self.last_pause_s)
        return action

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.freeze_interval)
            self.step()
