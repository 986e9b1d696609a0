"""Share bookkeeping by offset ranges: the pure run map (service/share/ranges.py), the share session's acquired
and pending runs (service/share/session.py), and the HTTP instance's held runs, range acknowledgements and range
outcomes (service/instances/share.py, api/share/routes.py): partial acknowledgements inside a range, lock expiry
of part of a range, duplicates and overlaps, release then redelivery with a new delivery count."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from api.share.routes import _SEP, _with_extras, outcomes_body
from service.instances import share as share_mod
from service.instances.share import LOCK_EXPIRED, NOT_HELD, AckOutcome, ShareInstance, ShareOptions
from service.protocol import error_codes as EC
from service.share.consumer import ShareRecord
from service.share.ranges import RunMap, runs_of, subtract
from service.share.session import AckType, ShareSession, run_batches
from tests.unit.share.test_share_session import ack_resp, fetch_resp, fetched, opened, parts_of, wire

T = uuid.UUID(int=7)
A = (T, 0)


# -- the run map -------------------------------------------------------------------------------------------------

def test_run_map_assigns_merges_splits_and_removes() -> None:
    m: RunMap[str] = RunMap()
    m.assign(10, 19, "a")
    m.assign(20, 29, "a")  # adjacent, same value: one run
    assert list(m) == [(10, 29, "a")] and len(m) == 20
    m.assign(15, 16, "b")  # inside: splits
    assert list(m) == [(10, 14, "a"), (15, 16, "b"), (17, 29, "a")]
    assert m.get(15) == "b" and m.get(9) is None and 29 in m and 30 not in m
    assert m.pieces(12, 18) == [(12, 14, "a"), (15, 16, "b"), (17, 18, "a")]
    assert m.remove(14, 17) == [(14, 14, "a"), (15, 16, "b"), (17, 17, "a")]
    assert list(m) == [(10, 13, "a"), (18, 29, "a")]
    assert m.remove(0, 5) == [] and m.remove(14, 17) == []  # nothing there: nothing changes
    m.assign(14, 17, "a")  # fills the hole: merged with both neighbours
    assert list(m) == [(10, 29, "a")]
    m.assign(5, 40, "c")  # overlapping everything
    assert list(m) == [(5, 40, "c")]
    m.assign(41, 41, "d")
    assert m.remove_if(lambda v: v == "c") == [(5, 40, "c")] and list(m) == [(41, 41, "d")]


def test_subtract_and_runs_of() -> None:
    assert subtract(0, 9, []) == [(0, 9)]
    assert subtract(0, 9, [(0, 9)]) == []
    assert subtract(0, 9, [(2, 3), (5, 5)]) == [(0, 1), (4, 4), (6, 9)]
    assert runs_of([5, 3, 4, 9, 9, 1]) == [(1, 1), (3, 5), (9, 9)]
    assert runs_of([]) == []


# -- the session ---------------------------------------------------------------------------------------------------

def test_session_partial_acks_inside_an_acquired_range() -> None:
    s = opened(A, acquired={A: (0, 99, 1)})
    assert s.acknowledge_range(A, 10, 19, AckType.ACCEPT) == []
    refused = s.acknowledge_range(A, 15, 24, AckType.REJECT)  # 15-19 already settled
    assert [(r.offset, r.last, r.error_code) for r in refused] == [(15, 19, EC.INVALID_RECORD_STATE)]
    assert s.acquired_runs(A) == [(0, 9, 1, 130.0), (25, 99, 1, 130.0)]
    assert s.pending_count() == 15
    req = wire(s.build_fetch(max_wait_ms=0))
    assert parts_of(req) == {A: [(10, 24, [1] * 10 + [3] * 5)]}  # one batch, a type per offset
    out = s.handle_fetch_response(fetch_resp({A: {}}), 101.0)
    assert [(r.offset, r.last, r.type, r.applied) for r in out.ack_results] == [
        (10, 19, AckType.ACCEPT, True), (20, 24, AckType.REJECT, True)]


def test_session_renewals_overlap_once_and_a_terminal_one_wins() -> None:
    s = opened(A, acquired={A: (0, 9, 1)})
    s.acknowledge_range(A, 0, 5, AckType.RENEW)
    s.acknowledge_range(A, 3, 9, AckType.RENEW)  # overlaps the first: still one renewal per offset
    s.acknowledge_range(A, 4, 4, AckType.ACCEPT)  # a terminal one replaces the renewal queued for 4
    assert s.pending_count() == 10
    req = wire(s.build_acknowledge())
    assert req.is_renew_ack and parts_of(req) == {A: [(0, 9, [4] * 4 + [1] + [4] * 5)]}
    res = s.handle_acknowledge_response(ack_resp({A: 0}, lock_ms=50_000), 120.0)
    assert [(r.offset, r.last, r.type) for r in res] == [(0, 3, AckType.RENEW), (4, 4, AckType.ACCEPT),
                                                        (5, 9, AckType.RENEW)]
    # renewed from the answer (120 + its 50 s lock); 4 is settled
    assert s.acquired_runs(A) == [(0, 3, 1, 170.0), (5, 9, 1, 170.0)]


def test_session_lock_expiry_of_part_of_the_held_records_drops_their_renewals() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    s.build_fetch(max_wait_ms=0)
    s.handle_fetch_response(fetch_resp({A: {"acquired": [(0, 4, 1)]}}, lock_ms=10_000), 0.0)
    s.build_fetch(max_wait_ms=0)
    s.handle_fetch_response(fetch_resp({A: {"acquired": [(5, 9, 1)]}}, lock_ms=10_000), 5.0)
    s.acknowledge_range(A, 3, 6, AckType.RENEW)
    assert sorted(s.expire(10.0)) == [(A, o) for o in range(5)]  # 0-4 ran out, 5-9 did not
    assert s.acquired_runs(A) == [(5, 9, 1, 15.0)]
    req = wire(s.build_acknowledge())
    assert parts_of(req) == {A: [(5, 6, [4])]}  # the renewal of 3-4 went with their lock
    refused = s.acknowledge_range(A, 0, 9, AckType.ACCEPT)
    assert [(r.offset, r.last) for r in refused] == [(0, 4)]


def test_session_release_then_redelivery_with_a_new_delivery_count() -> None:
    s = opened(A, acquired={A: (0, 9, 1)})
    s.acknowledge_range(A, 0, 9, AckType.RELEASE)
    s.build_fetch(max_wait_ms=0)
    out = s.handle_fetch_response(fetch_resp({A: {"acquired": [(0, 9, 2)]}}), 102.0)
    assert [(r.offset, r.last, r.applied) for r in out.ack_results] == [(0, 9, True)]
    got = s.deliver(out.partitions[0], range(10))
    assert got == [(0, 9, 2, 132.0)] and s.acquired_runs(A) == [(0, 9, 2, 132.0)]


def test_session_gaps_inside_a_range_are_acknowledged_as_gaps() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    s.build_fetch(max_wait_ms=0)
    s.handle_fetch_response(fetch_resp({A: {"acquired": [(0, 9, 1)]}}), 0.0)
    got = s.deliver(fetched(A, 0, 9), [0, 1, 2, 5, 6, 9])
    assert got == [(0, 2, 1, 30.0), (5, 6, 1, 30.0), (9, 9, 1, 30.0)]
    assert s.pending_count() == 0 and s.has_pending  # gaps are not acknowledgements of the client
    req = wire(s.build_fetch(max_wait_ms=0))
    assert parts_of(req) == {A: [(3, 4, [0]), (7, 8, [0])]}


def test_run_batches_merge_consecutive_runs() -> None:
    assert run_batches([(5, 9, AckType.ACCEPT), (0, 4, AckType.ACCEPT), (12, 12, AckType.GAP)]) == [
        (0, 9, [1]), (12, 12, [0])]
    assert run_batches([(0, 1, AckType.ACCEPT), (2, 2, AckType.RELEASE)]) == [(0, 2, [1, 1, 2])]


# -- the HTTP instance -----------------------------------------------------------------------------------------------

class FakeConsumer:
    """One share session standing in for the engine: acknowledgements go to it, commit answers with ``code``."""

    def __init__(self) -> None:
        self.session = ShareSession("g", "m")
        self.session.set_partitions([A])
        self.session.build_fetch(max_wait_ms=0)
        self.session.handle_fetch_response(fetch_resp({A: {}}), time.monotonic())
        self.sessions = {1: self.session}
        self.code = 0
        self.next: list[ShareRecord] = []
        self.max_records = 0
        self.max_bytes = 0

    def records(self, first: int, last: int, count: int, deadline: float) -> None:
        """The next poll acquires ``first..last`` (as a ShareFetch answer would have it)."""
        self.session._acquired.setdefault(A, RunMap()).assign(first, last, (count, deadline))
        self.next = [ShareRecord("t", 0, o, 0, None, b"v", (), count, deadline) for o in range(first, last + 1)]

    async def poll(self, timeout: float) -> list[ShareRecord]:
        out, self.next = self.next, []
        return out

    def take_charged(self) -> int:
        return 0

    def take_results(self) -> list[Any]:
        return []

    def acknowledge_range(self, topic: str, partition: int, first: int, last: int, type: AckType) -> list[Any]:
        return self.session.acknowledge_range((T, partition), first, last, type)

    async def commit(self) -> list[Any]:
        req = self.session.build_acknowledge()
        if req is None:
            return []
        return self.session.handle_acknowledge_response(ack_resp({A: self.code}), time.monotonic())


def instance(mode: str = "explicit") -> tuple[ShareInstance, FakeConsumer]:
    client: Any = SimpleNamespace(metadata=SimpleNamespace(topic_names={T: "t"}))
    inst = ShareInstance("t", "g", "w", ShareOptions(ack_mode=mode), client)
    consumer = FakeConsumer()
    inst.consumer = consumer  # type: ignore[assignment]
    return inst, consumer


def answers(outcomes: list[AckOutcome]) -> list[tuple[int, int, bool, str | None]]:
    return [(o.offset, o.last, o.applied, o.error) for o in outcomes]


async def test_instance_holds_runs_and_answers_partial_and_overlapping_acks_by_range() -> None:
    inst, consumer = instance()
    far = time.monotonic() + 600
    consumer.records(0, 99, 1, far)
    got, _ = await inst.poll(1000, None, 0.0)
    assert len(got) == 100 and list(inst.held[("t", 0)]) == [(0, 99, (1, far))]
    out = await inst.acknowledge([("t", 0, 10, 19, AckType.ACCEPT)], wait=True, linger=0.0)
    assert answers(out) == [(10, 19, True, None)]
    # overlapping what was settled, and itself twice: answered per range in the request's order
    out = await inst.acknowledge([("t", 0, 15, 24, AckType.ACCEPT), ("t", 0, 200, 201, AckType.ACCEPT)],
                                 wait=True, linger=0.0)
    assert answers(out) == [(15, 19, False, NOT_HELD), (20, 24, True, None), (200, 201, False, NOT_HELD)]
    assert list(inst.held[("t", 0)]) == [(0, 9, (1, far)), (25, 99, (1, far))]
    refused = await inst.acknowledge([("t", 0, 0, 30, AckType.ACCEPT), ("t", 0, 28, 29, AckType.ACCEPT)],
                                     wait=False, linger=10.0)
    assert answers(refused) == [(10, 24, False, NOT_HELD), (28, 29, False, NOT_HELD)]
    assert consumer.session.pending_count() == 16  # 0-9, 25-30
    inst._absorb(await consumer.commit())
    assert answers(inst.take_outcomes()) == [(0, 9, True, None), (25, 30, True, None)]
    assert inst.held_count() == 69
    assert inst.flusher is not None
    inst.flusher.cancel()


async def test_instance_lock_expiry_of_part_of_a_range_and_renewal_of_part() -> None:
    inst, consumer = instance()
    now = time.monotonic()
    consumer.records(0, 4, 1, now - 1)  # already ran out
    await inst.poll(1000, None, 0.0)
    consumer.records(5, 9, 1, now + 600)
    await inst.poll(1000, None, 0.0)  # (the poll forgets 0-4: their lock ran out)
    assert not inst.holds("t", 0, 3) and inst.holds("t", 0, 5)
    out = await inst.acknowledge([("t", 0, 0, 9, AckType.RENEW)], wait=True, linger=0.0)
    assert answers(out) == [(0, 4, False, NOT_HELD), (5, 9, True, None)]
    assert all(o.lock_deadline is None for o in out[:1]) and out[1].lock_deadline is not None
    # a lock that runs out between polls: LOCK_EXPIRED (not sent), the rest applies
    held = inst.held[("t", 0)]
    held.assign(5, 6, (1, now - 1))
    out = await inst.acknowledge([("t", 0, 5, 9, AckType.ACCEPT)], wait=True, linger=0.0)
    assert answers(out) == [(5, 6, False, LOCK_EXPIRED), (7, 9, True, None)]
    assert inst.held_count() == 0


async def test_instance_release_then_redelivery_and_refused_by_the_broker() -> None:
    inst, consumer = instance()
    far = time.monotonic() + 600
    consumer.records(0, 9, 1, far)
    await inst.poll(1000, None, 0.0)
    out = await inst.acknowledge([("t", 0, 0, 9, AckType.RELEASE)], wait=True, linger=0.0)
    assert answers(out) == [(0, 9, True, None)] and inst.held_count() == 0
    consumer.records(0, 9, 2, far)
    got, _ = await inst.poll(1000, None, 0.0)
    assert {r.delivery_count for r in got} == {2} and list(inst.held[("t", 0)]) == [(0, 9, (2, far))]
    consumer.code = EC.INVALID_RECORD_STATE  # the broker no longer holds them for us
    out = await inst.acknowledge([("t", 0, 0, 9, AckType.ACCEPT)], wait=True, linger=0.0)
    assert answers(out) == [(0, 9, False, "INVALID_RECORD_STATE")]


async def test_implicit_mode_accepts_the_previous_runs_and_unhand_leaves_them() -> None:
    inst, consumer = instance("implicit")
    far = time.monotonic() + 600
    consumer.records(0, 9, 1, far)
    got, _ = await inst.poll(1000, None, 0.0)
    assert inst.previous == [("t", 0, 0, 9, AckType.ACCEPT)]
    # 3-4 did not reach the client: released, no longer accepted by the next poll
    release = inst.unhand([r for r in got if r.offset in (3, 4)])
    assert release == [("t", 0, 3, 4, AckType.RELEASE)]
    assert inst.previous == [("t", 0, 0, 2, AckType.ACCEPT), ("t", 0, 5, 9, AckType.ACCEPT)]
    await inst.poll(1000, None, 0.0)  # accepts 0-2 and 5-9
    assert consumer.session.pending_count() == 8 and list(inst.held[("t", 0)]) == [(3, 4, (1, far))]


async def test_kept_outcomes_stay_within_the_limit_counting_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(share_mod, "MAX_KEPT_OUTCOMES", 25)
    inst, consumer = instance()
    consumer.records(0, 39, 1, time.monotonic() + 600)
    await inst.poll(1000, None, 0.0)
    for first in (0, 20):
        await inst.acknowledge([("t", 0, first, first + 9, AckType.ACCEPT),
                                ("t", 0, first + 10, first + 19, AckType.REJECT)], wait=False, linger=10.0)
        inst._absorb(await consumer.commit())
    kept = inst.take_outcomes()
    assert sum(o.count for o in kept) == 25 and kept[0].offset == 15 and kept[-1].last == 39  # the newest
    assert inst.take_outcomes() == [] and inst.kept == 0
    assert inst.flusher is not None
    inst.flusher.cancel()


def test_outcomes_body_has_one_object_per_offset() -> None:
    body = outcomes_body([AckOutcome("t", 0, 5, "accept", True, None, None, 7),
                          AckOutcome("t", 1, 9, "reject", False, NOT_HELD)])
    assert orjson.loads(body) == {"acknowledgements": [
        {"topic": "t", "partition": 0, "offset": o, "type": "accept", "applied": True, "error": None}
        for o in (5, 6, 7)] + [
        {"topic": "t", "partition": 1, "offset": 9, "type": "reject", "applied": False, "error": NOT_HELD}]}
    renewed = orjson.loads(outcomes_body([AckOutcome("t", 0, 1, "renew", True, None, time.monotonic() + 5, 2)]))
    assert [a["offset"] for a in renewed["acknowledgements"]] == [1, 2]
    assert all(a["lock_expires_at"] > time.time() * 1000 for a in renewed["acknowledgements"])


def test_rendered_records_get_their_share_fields_per_run() -> None:
    part = _SEP.join([b'{"offset":1}', b'{"offset":2,"value":"}"}', b'{"offset":3}'])
    one = [[3, b',"delivery_count":1}']]
    assert _with_extras(part, one, b",") == (b'{"offset":1,"delivery_count":1},{"offset":2,"value":"}",'
                                             b'"delivery_count":1},{"offset":3,"delivery_count":1}')
    two = [[2, b',"delivery_count":1}'], [1, b',"delivery_count":2}']]
    assert _with_extras(part, two, b"\n").split(b"\n") == [
        b'{"offset":1,"delivery_count":1}', b'{"offset":2,"value":"}","delivery_count":1}',
        b'{"offset":3,"delivery_count":2}']
    with pytest.raises(ValueError):
        _with_extras(part, [[1, b"}"], [1, b"}"]], b",")
