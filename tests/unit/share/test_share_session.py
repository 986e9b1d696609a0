"""The sans-io share session (service/share/session.py): epochs, partitions added and forgotten, acknowledgements
batched into ranges and mapped back per record, acquired records with delivery counts and lock deadlines, and
what a lost session or a lost answer does. Every request goes through the real codecs (encoded and decoded at
the version the broker speaks), so a field the wire cannot carry fails here."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.share.session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NO_ANSWER,
    AckType,
    FetchedPartition,
    SessionError,
    ShareSession,
    ack_batches,
    next_epoch,
)

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
A, B, C = (T1, 0), (T1, 1), (T2, 0)

_RTopic = M.struct("ShareFetchResponse", "ShareFetchableTopicResponse")
_RPart = M.struct("ShareFetchResponse", "PartitionData")
_RAcq = M.struct("ShareFetchResponse", "AcquiredRecords")
_KTopic = M.struct("ShareAcknowledgeResponse", "ShareAcknowledgeTopicResponse")
_KPart = M.struct("ShareAcknowledgeResponse", "PartitionData")


def wire(req: Any, version: int = 2) -> Any:
    """The request as the broker would read it."""
    cm = M.compiled(type(req).__name__)
    return cm.decode(cm.encode(req, version), version)


def fetch_resp(parts: dict[tuple[uuid.UUID, int], dict[str, Any]], *, error: int = 0, lock_ms: int = 30_000) -> Any:
    topics: dict[uuid.UUID, list[Any]] = {}
    for (tid, p), kw in parts.items():
        acquired = [_RAcq(first_offset=f, last_offset=la, delivery_count=c) for f, la, c in kw.get("acquired", [])]
        topics.setdefault(tid, []).append(_RPart(
            partition_index=p, error_code=kw.get("error", 0), acknowledge_error_code=kw.get("ack_error", 0),
            records=kw.get("records", b""), acquired_records=acquired))
    resp = M.ShareFetchResponse(error_code=error, acquisition_lock_timeout_ms=lock_ms,
                                responses=[_RTopic(topic_id=t, partitions=ps) for t, ps in topics.items()])
    cm = M.compiled("ShareFetchResponse")
    return cm.decode(cm.encode(resp, 2), 2)


def ack_resp(codes: dict[tuple[uuid.UUID, int], int], *, error: int = 0, lock_ms: int = 0) -> Any:
    topics: dict[uuid.UUID, list[Any]] = {}
    for (tid, p), code in codes.items():
        topics.setdefault(tid, []).append(_KPart(partition_index=p, error_code=code))
    return M.ShareAcknowledgeResponse(error_code=error, acquisition_lock_timeout_ms=lock_ms,
                                      responses=[_KTopic(topic_id=t, partitions=ps) for t, ps in topics.items()])


def fetched(tp: tuple[uuid.UUID, int], first: int, last: int, count: int = 1) -> FetchedPartition:
    return FetchedPartition(tp[0], tp[1], 0, None, b"", [(first, last, count)], 1, 0)


def opened(*tps: tuple[uuid.UUID, int], acquired: dict[Any, tuple[int, int, int]] | None = None,
           now: float = 100.0) -> ShareSession:
    """A session past its opening ShareFetch (epoch 1), holding ``acquired`` ranges, all delivered as records."""
    s = ShareSession("g", "m")
    s.set_partitions(tps)
    s.build_fetch(max_wait_ms=0)
    acquired = acquired or {}
    s.handle_fetch_response(fetch_resp({tp: {"acquired": [r]} for tp, r in acquired.items()}), now)
    for tp, (f, la, c) in acquired.items():
        s.deliver(fetched(tp, f, la, c), range(f, la + 1))
    return s


def parts_of(req: Any) -> dict[tuple[uuid.UUID, int], list[tuple[int, int, list[int]]]]:
    return {(t.topic_id, p.partition_index): [(b.first_offset, b.last_offset, list(b.acknowledge_types))
                                              for b in p.acknowledgement_batches]
            for t in req.topics for p in t.partitions}


# -- batching --------------------------------------------------------------------------------------------------------

def test_ack_batches_merge_consecutive_offsets_and_share_one_type() -> None:
    assert ack_batches({}) == []
    assert ack_batches({5: AckType.ACCEPT, 6: AckType.ACCEPT, 7: AckType.ACCEPT}) == [(5, 7, [1])]
    assert ack_batches({5: AckType.ACCEPT, 7: AckType.ACCEPT}) == [(5, 5, [1]), (7, 7, [1])]
    assert ack_batches({3: AckType.ACCEPT, 4: AckType.RELEASE, 5: AckType.GAP, 9: AckType.REJECT}) == [
        (3, 5, [1, 2, 0]), (9, 9, [3])]


def test_epochs_count_up_and_wrap_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


# -- epochs and partitions -------------------------------------------------------------------------------------------

def test_opening_fetch_names_every_partition_and_later_ones_only_changes() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A, B])
    req = wire(s.build_fetch(max_wait_ms=500, max_records=50, batch_size=50))
    assert req.share_session_epoch == INITIAL_EPOCH and req.group_id == "g" and req.member_id == "m"
    assert set(parts_of(req)) == {A, B} and req.forgotten_topics_data == []
    assert (req.max_wait_ms, req.max_records, req.batch_size, req.share_acquire_mode) == (500, 50, 50, 0)
    s.handle_fetch_response(fetch_resp({}), 0.0)
    assert s.epoch == 1
    req = wire(s.build_fetch(max_wait_ms=0))
    assert req.share_session_epoch == 1 and req.topics == [] and req.forgotten_topics_data == []
    s.handle_fetch_response(fetch_resp({}), 0.0)
    s.set_partitions([B, C])
    req = wire(s.build_fetch(max_wait_ms=0, record_limit=True))
    assert req.share_acquire_mode == 1  # record-limit: max_records is a hard limit
    assert req.share_session_epoch == 2
    assert set(parts_of(req)) == {C}
    assert [(f.topic_id, list(f.partitions)) for f in req.forgotten_topics_data] == [(T1, [0])]


def test_one_request_at_a_time() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    s.build_fetch(max_wait_ms=0)
    with pytest.raises(SessionError):
        s.build_fetch(max_wait_ms=0)
    with pytest.raises(SessionError):
        s.handle_acknowledge_response(ack_resp({}), 0.0)
    s.handle_fetch_response(fetch_resp({}), 0.0)
    with pytest.raises(SessionError):
        s.handle_fetch_response(fetch_resp({}), 0.0)


# -- acquired records ------------------------------------------------------------------------------------------------

def test_acquired_records_carry_delivery_count_and_lock_deadline() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    s.build_fetch(max_wait_ms=0)
    out = s.handle_fetch_response(fetch_resp({A: {"acquired": [(10, 12, 1), (13, 13, 3)]}}, lock_ms=2000), 50.0)
    assert s.lock_timeout_ms == 2000
    [part] = out.partitions
    assert part.acquired == [(10, 12, 1), (13, 13, 3)]
    # the blob holds the whole batch, 8..14: only 10-13 are ours; 11 is a gap (a control record, say)
    got = s.deliver(part, [8, 9, 10, 12, 13, 14])
    assert got == [(10, 10, 1, 52.0), (12, 12, 1, 52.0), (13, 13, 3, 52.0)]  # runs: (first, last, count, deadline)
    assert sorted(s.acquired(A)) == [10, 12, 13]
    assert s.holds(A, 12) and not s.holds(A, 11) and not s.holds(B, 12)
    # the gap is acknowledged with the partition's next acknowledgement, and never reported back
    assert s.acknowledge(A, 10, AckType.ACCEPT) is None
    req = wire(s.build_acknowledge())
    assert parts_of(req) == {A: [(10, 11, [1, 0])]}
    results = s.handle_acknowledge_response(ack_resp({A: 0}), 51.0)
    assert [(r.offset, r.type, r.applied) for r in results] == [(10, AckType.ACCEPT, True)]


def test_expired_locks_are_forgotten_and_cannot_be_acknowledged() -> None:
    s = opened(A, acquired={A: (0, 2, 1)}, now=10.0)
    assert s.expire(39.9) == []
    assert sorted(s.expire(40.0)) == [(A, 0), (A, 1), (A, 2)]
    r = s.acknowledge(A, 1, AckType.ACCEPT)
    assert r is not None and not r.applied and r.error_code == EC.INVALID_RECORD_STATE
    assert s.build_acknowledge() is None


# -- acknowledgements ------------------------------------------------------------------------------------------------

def test_acknowledgements_ride_on_the_next_fetch_and_map_back_per_partition() -> None:
    s = opened(A, B, acquired={A: (0, 4, 1), B: (7, 8, 2)})
    for o, t in [(0, AckType.ACCEPT), (1, AckType.ACCEPT), (2, AckType.RELEASE), (4, AckType.REJECT)]:
        assert s.acknowledge(A, o, t) is None
    assert s.acknowledge(B, 7, AckType.ACCEPT) is None
    assert s.pending_count() == 5
    req = wire(s.build_fetch(max_wait_ms=0))
    assert parts_of(req) == {A: [(0, 2, [1, 1, 2]), (4, 4, [3])], B: [(7, 7, [1])]}
    assert not s.has_pending
    # B's acknowledgement failed (the record's lock ran out on the broker): reported, never silently accepted
    out = s.handle_fetch_response(fetch_resp({A: {}, B: {"ack_error": EC.INVALID_RECORD_STATE}}), 101.0)
    res = {(r.partition, o): r for r in out.ack_results for o in r.offsets}  # (results come as runs)
    assert sorted(res) == [(0, 0), (0, 1), (0, 2), (0, 4), (1, 7)]
    assert all(res[(0, o)].applied for o in (0, 1, 2, 4))
    assert res[(1, 7)].error_code == EC.INVALID_RECORD_STATE and not res[(1, 7)].applied
    assert sorted(s.acquired(A)) == [3] and sorted(s.acquired(B)) == [8]


def test_a_partition_missing_from_the_answer_reports_no_answer() -> None:
    s = opened(A, acquired={A: (0, 0, 1)})
    s.acknowledge(A, 0, AckType.ACCEPT)
    s.build_fetch(max_wait_ms=0)
    out = s.handle_fetch_response(fetch_resp({}), 101.0)
    assert [(r.offset, r.error_code) for r in out.ack_results] == [(0, NO_ANSWER)]


def test_a_record_is_acknowledged_once() -> None:
    s = opened(A, acquired={A: (0, 1, 1)})
    assert s.acknowledge(A, 0, AckType.ACCEPT) is None
    again = s.acknowledge(A, 0, AckType.REJECT)
    assert again is not None and again.error_code == EC.INVALID_RECORD_STATE
    unknown = s.acknowledge(C, 5, AckType.ACCEPT)
    assert unknown is not None and not unknown.applied
    with pytest.raises(ValueError):
        s.acknowledge(A, 1, AckType.GAP)


def test_acknowledgements_ride_from_epoch_one_and_share_acknowledge_never_opens() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    assert s.build_fetch(max_wait_ms=0).share_session_epoch == 0
    s.handle_fetch_response(fetch_resp({A: {"acquired": [(0, 0, 1)]}}), 0.0)
    s.deliver(fetched(A, 0, 0), [0])
    s.acknowledge(A, 0, AckType.ACCEPT)
    assert parts_of(wire(s.build_fetch(max_wait_ms=0))) == {A: [(0, 0, [1])]}  # epoch 1: now it may
    # a ShareAcknowledge cannot open a session
    fresh = ShareSession("g", "m")
    assert fresh.build_acknowledge() is None


def test_share_acknowledge_alone_and_renew_keeps_the_lock() -> None:
    s = opened(A, acquired={A: (0, 2, 1)}, now=100.0)
    s.lock_timeout_ms = 30_000
    assert s.acknowledge(A, 0, AckType.ACCEPT) is None
    assert s.acknowledge(A, 1, AckType.RENEW) is None
    # a renewal never rides on a ShareFetch; the accept does
    req = wire(s.build_fetch(max_wait_ms=0))
    assert parts_of(req) == {A: [(0, 0, [1])]} and req.is_renew_ack is False
    s.handle_fetch_response(fetch_resp({A: {}}), 101.0)
    assert s.has_pending
    req = wire(s.build_acknowledge())
    assert req.share_session_epoch == 2 and req.is_renew_ack is True
    assert parts_of(req) == {A: [(1, 1, [4])]}
    [r] = s.handle_acknowledge_response(ack_resp({A: 0}, lock_ms=20_000), 110.0)
    assert r.applied and r.type == AckType.RENEW and s.epoch == 3
    assert s.acquired(A)[1].deadline == 130.0  # renewed from the answer's lock timeout
    assert s.acquired(A)[2].deadline == 130.0  # untouched: still the fetch's (100 + 30)
    # a renewed record still needs its outcome; a refused renewal means the lock is gone
    s.acknowledge(A, 2, AckType.RENEW)
    s.build_acknowledge()
    [r] = s.handle_acknowledge_response(ack_resp({A: EC.INVALID_RECORD_STATE}), 111.0)
    assert not r.applied and 2 not in s.acquired(A)


def test_renew_before_a_terminal_ack_is_superseded() -> None:
    s = opened(A, acquired={A: (0, 0, 1)})
    s.acknowledge(A, 0, AckType.RENEW)
    assert s.acknowledge(A, 0, AckType.ACCEPT) is None
    assert parts_of(wire(s.build_acknowledge())) == {A: [(0, 0, [1])]}


# -- errors ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [EC.SHARE_SESSION_NOT_FOUND, EC.INVALID_SHARE_SESSION_EPOCH])
def test_a_lost_session_starts_over_and_reports_the_acknowledgements(code: int) -> None:
    s = opened(A, B, acquired={A: (0, 1, 1), B: (5, 5, 1)})
    s.acknowledge(A, 0, AckType.ACCEPT)
    s.build_fetch(max_wait_ms=0)
    s.acknowledge(B, 5, AckType.REJECT)  # queued while the fetch was in flight
    out = s.handle_fetch_response(fetch_resp({}, error=code), 101.0)
    assert out.session_reset and s.epoch == INITIAL_EPOCH and s.acquired_count() == 0
    assert sorted((r.partition, r.offset, r.applied) for r in out.ack_results) == [(0, 0, False), (1, 5, False)]
    req = wire(s.build_fetch(max_wait_ms=0))
    assert req.share_session_epoch == 0 and set(parts_of(req)) == {A, B}
    assert all(batches == [] for batches in parts_of(req).values())


def test_another_top_level_error_moves_the_epoch_on() -> None:
    s = opened(A, acquired={A: (0, 0, 1)})
    s.acknowledge(A, 0, AckType.ACCEPT)
    s.build_fetch(max_wait_ms=0)
    out = s.handle_fetch_response(fetch_resp({}, error=EC.GROUP_AUTHORIZATION_FAILED), 101.0)
    assert not out.session_reset and s.epoch == 2
    assert [(r.offset, r.error_code) for r in out.ack_results] == [(0, EC.GROUP_AUTHORIZATION_FAILED)]


def test_no_answer_fails_the_acknowledgements_in_flight_and_reopens() -> None:
    s = opened(A, acquired={A: (0, 1, 1)})
    s.acknowledge(A, 0, AckType.ACCEPT)
    s.build_fetch(max_wait_ms=0)
    results = s.request_failed()
    assert [(r.offset, r.error_code) for r in results] == [(0, NO_ANSWER)]
    assert s.epoch == INITIAL_EPOCH and not s.in_flight and s.acquired_count() == 0


def test_partition_errors_are_passed_on() -> None:
    s = ShareSession("g", "m")
    s.set_partitions([A])
    s.build_fetch(max_wait_ms=0)
    out = s.handle_fetch_response(fetch_resp({A: {"error": EC.NOT_LEADER_OR_FOLLOWER}}), 0.0)
    assert [(p.partition, p.error_code) for p in out.partitions] == [(0, EC.NOT_LEADER_OR_FOLLOWER)]


# -- closing ---------------------------------------------------------------------------------------------------------

def test_close_releases_what_is_held_and_ends_with_epoch_minus_one() -> None:
    s = opened(A, B, acquired={A: (0, 2, 1), B: (4, 4, 1)})
    s.acknowledge(A, 0, AckType.ACCEPT)
    s.close()
    late = s.acknowledge(A, 1, AckType.ACCEPT)
    assert late is not None and not late.applied
    with pytest.raises(SessionError):
        s.build_fetch(max_wait_ms=0)
    req = wire(s.build_close())
    assert req.share_session_epoch == FINAL_EPOCH
    assert parts_of(req) == {A: [(0, 2, [1, 2, 2])], B: [(4, 4, [2])]}
    results = s.handle_acknowledge_response(ack_resp({A: 0, B: 0}), 101.0)
    assert s.closed and sum(len(r.offsets) for r in results) == 4 and all(r.applied for r in results)
    with pytest.raises(SessionError):
        s.build_acknowledge()


def test_close_without_release_leaves_the_locks_to_run_out() -> None:
    s = opened(A, acquired={A: (0, 2, 1)})
    s.close(release=False)
    req = wire(s.build_close())
    assert req.share_session_epoch == FINAL_EPOCH and req.topics == []


def test_close_before_the_session_opened_sends_nothing() -> None:
    s = ShareSession("g", "m")
    s.close()
    assert s.build_close() is None and s.closed
    with pytest.raises(SessionError):
        ShareSession("g", "m").build_close()
