"""An idle consumer instance holds as few asyncio tasks as it can (memory per idle instance): the
fetcher's task ends once it is paused for idleness and a poll (or a wake-up) starts it again; the positions
task ends when no partition needs a position and an assignment, seek or reset starts it again; the heavy
per-instance objects keep their state in slots."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from service.consumer.consumer import Consumer, ConsumerConfig
from service.consumer.subscription import FetchState, SubscriptionState, TopicPartition
from service.fetch.fetcher import FetchConfig, Fetcher
from service.group.coordinator import GroupCoordinator

TP = TopicPartition("t", 0)


def fake_client() -> Any:
    """What a fetcher and consumer touch while nothing is assigned (no broker is ever contacted)."""
    return SimpleNamespace(metadata=SimpleNamespace(needs_refresh=False, leader=lambda t, p: None))


async def test_an_idle_fetcher_ends_its_task_and_a_poll_starts_it_again() -> None:
    f = Fetcher(fake_client(), SubscriptionState(), FetchConfig(idle_pause_s=30.0))
    f.last_demand = time.monotonic() - 60  # no poll for longer than the idle pause
    f.start()
    first = f._task
    assert first is not None
    await first  # ends by itself: paused for idleness
    assert f.idle and f._task is None
    f.wake()  # woken while still idle (e.g. an assignment): runs a round and ends again
    woken = f._task
    assert woken is not None
    await woken
    assert f.idle and f._task is None
    f.demand()  # a poll starts: fetching resumes
    resumed = f._task
    assert resumed is not None and not f.idle and not resumed.done()
    f.demand_done()
    await f.close()
    assert resumed.done() and f._task is resumed


async def test_a_closed_fetcher_is_not_restarted_by_a_wake_up() -> None:
    f = Fetcher(fake_client(), SubscriptionState(), FetchConfig(idle_pause_s=30.0))
    f.last_demand = time.monotonic() - 60
    f.start()
    task = f._task
    assert task is not None
    await task
    await f.close()
    f.wake()
    f.demand()
    assert f._task is None


async def test_the_positions_task_runs_only_while_positions_are_missing() -> None:
    c = Consumer(fake_client(), ConsumerConfig(group_id=None))
    c._ensure_started()
    task = c._positions_task
    assert task is not None
    await task  # nothing assigned: the task ends
    assert c._positions_task is None and c._autocommit_task is None
    c.subs.assign([TP])
    c.seek(TP, 5)  # a position set by hand: nothing to look up
    c._wake_positions()
    again = c._positions_task
    assert again is not None
    await again
    assert c._positions_task is None and c.subs.assignment[TP].state is FetchState.FETCHING
    await c.close()
    c._wake_positions()  # closed: nothing starts any more
    assert c._positions_task is None


def test_the_coordinator_and_fetcher_keep_their_state_in_slots() -> None:
    for cls in (GroupCoordinator, Fetcher):
        assert "__slots__" in cls.__dict__
    f = Fetcher(fake_client(), SubscriptionState(), FetchConfig())
    c = Consumer(fake_client(), ConsumerConfig(group_id="g"))
    # every attribute __init__ sets has a slot (a new attribute needs one too)
    assert not f.__dict__ and c.coordinator is not None and not c.coordinator.__dict__
