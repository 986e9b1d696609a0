"""kcg_event_loop_lag_seconds reports the largest event-loop lag since the previous scrape."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import GatewayMetrics

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
