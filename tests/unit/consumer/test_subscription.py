"""SubscriptionState: modes, positions, resets, pause, lag."""

from __future__ import annotations

import pytest

from service.consumer.subscription import (
    FetchState,
    OffsetResetStrategy,
    SubscriptionError,
    SubscriptionState,
    SubscriptionType,
    TopicPartition,
)

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_modes_are_exclusive() -> None:
    s = SubscriptionState()
    assert s.subscribe(["a", "b"]) and not s.subscribe(["b", "a"])
    with pytest.raises(SubscriptionError, match="mutually exclusive"):
        s.assign([A0])
    with pytest.raises(SubscriptionError):
        s.subscribe_pattern("a.*")
    s.unsubscribe()
    s.assign([A0, B0])
    assert s.type is SubscriptionType.ASSIGNED and s.topics == {"a", "b"}
    with pytest.raises(SubscriptionError):
        s.subscribe(["a"])
    s.assign([])
    assert s.type is SubscriptionType.NONE


def test_pattern_matching_excludes_internal_topics() -> None:
    s = SubscriptionState()
    s.subscribe_pattern("or.*")
    assert s.match_pattern(["orders", "orange", "__consumer_offsets", "x"])
    assert s.topics == {"orders", "orange"}
    assert not s.match_pattern(["orders", "orange"])
    with pytest.raises(SubscriptionError, match="invalid topic pattern"):
        SubscriptionState().subscribe_pattern("(")


def test_positions_lifecycle() -> None:
    s = SubscriptionState(default_reset="earliest")
    s.subscribe(["a"])
    s.set_assignment([A0, A1])
    assert s.initializing() == [A0, A1] and s.fetchable() == [] and not s.has_all_positions()
    s.seek(A0, 5)
    s.request_reset(A1)
    assert s.assignment[A1].reset_strategy is OffsetResetStrategy.EARLIEST
    assert s.awaiting_reset() == [A1] and s.fetchable() == [A0]
    s.seek(A1, 0)
    s.advance(A0, 9, leader_epoch=3)
    s.advance(A0, 7)  # never backwards
    assert s.position(A0) == 9 and s.all_consumed() == {A0: (9, 3), A1: (0, None)}
    s.pause([A0])
    assert s.fetchable() == [A1] and s.paused() == {A0}
    s.resume([A0])
    # a rebalance keeps the state of partitions that stay
    s.set_assignment([A0, B0])
    assert s.position(A0) == 9 and s.assignment[B0].state is FetchState.INITIALIZING
    with pytest.raises(SubscriptionError, match="not assigned"):
        s.seek(A1, 1)
    with pytest.raises(SubscriptionError, match=">= 0"):
        s.seek(A0, -1)


def test_lag_uses_lso_under_read_committed() -> None:
    s = SubscriptionState()
    s.assign([A0])
    assert s.lag(A0, False) is None
    s.seek(A0, 10)
    s.update_marks(A0, high_watermark=20, last_stable_offset=15, log_start_offset=0)
    assert s.lag(A0, read_committed=False) == 10
    assert s.lag(A0, read_committed=True) == 5


def test_reset_strategy_parsing() -> None:
    assert OffsetResetStrategy.parse("smallest") is OffsetResetStrategy.EARLIEST
    assert OffsetResetStrategy.parse("LATEST") is OffsetResetStrategy.LATEST
    with pytest.raises(ValueError):
        OffsetResetStrategy.parse("sideways")


def test_epoch_detects_a_seek_during_a_lookup() -> None:
    s = SubscriptionState(default_reset="latest")
    s.assign([A0])
    before = s.epoch(A0)
    s.request_reset(A0)  # the background lookup for "latest" starts with this epoch
    started = s.epoch(A0)
    s.request_reset(A0, OffsetResetStrategy.EARLIEST)  # the owner seeks to the beginning meanwhile
    assert s.epoch(A0) != started != before
    assert s.assignment[A0].reset_strategy is OffsetResetStrategy.EARLIEST
    s.seek(A0, 3)
    assert s.epoch(A0) == started + 2
    assert s.epoch(TopicPartition("x", 9)) == -1
