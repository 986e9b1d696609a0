"""api.server.gcpolicy: long-lived objects are frozen out of the collector's way; garbage of closed
instances is reclaimed once enough of them closed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from api.server.gcpolicy import GcPolicy


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return a, weakref.ref(b)


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_then_reclaim_after_enough_instances_closed() -> None:
    live, closed = [100], [0]
    policy = GcPolicy(lambda: live[0], lambda: closed[0], reclaim_min=10, reclaim_fraction=0.25,
                      reclaim_interval=60)
    garbage_now, ref_now = cycle()
    del garbage_now  # cyclic garbage made before the round is collected, not frozen
    kept, ref_kept = cycle()
    assert policy.step(now=100.0) == "freeze"
    assert ref_now() is None
    assert gc.get_freeze_count() > 0
    del kept  # an instance closes: its cycle is frozen, so a normal collection cannot free it
    gc.collect()
    assert ref_kept() is not None
    closed[0] = 20  # below a quarter of the live instances: no reclaim yet
    assert policy.step(now=200.0) == "freeze" and ref_kept() is not None
    closed[0] = 30
    assert policy.step(now=300.0) == "reclaim"
    assert ref_kept() is None and policy.reclaims == 1
    closed[0] = 60  # enough again, but within the reclaim interval
    assert policy.step(now=330.0) == "freeze"
    assert policy.step(now=361.0) == "reclaim"


def test_a_full_collection_skips_frozen_objects() -> None:
    objs = [[i] for i in range(200_000)]
    gc.collect()
    assert len(gc.get_objects(generation=2)) > len(objs)  # what a full pass walks
    GcPolicy(lambda: 1, lambda: 0).step()
    assert gc.get_freeze_count() >= len(objs)
    assert len(gc.get_objects(generation=2)) < 1000  # frozen: no longer walked
    assert objs[-1] == [199_999]
