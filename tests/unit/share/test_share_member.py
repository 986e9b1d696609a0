"""The sans-io share-group member (service/share/member.py): joining with epoch 0, the assignment the coordinator
computes, fencing and rejoining, coordinator moves, fatal errors and leaving with epoch -1. Heartbeats go through
the real codecs (ShareGroupHeartbeat v1)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.share.member import JOIN_EPOCH, LEAVE_EPOCH, MemberState, ShareMember

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
_Assignment = M.struct("ShareGroupHeartbeatResponse", "Assignment")
_TP = M.struct("ShareGroupHeartbeatResponse", "TopicPartitions")


def wire(req: Any) -> Any:
    cm = M.compiled("ShareGroupHeartbeatRequest")
    return cm.decode(cm.encode(req, 1), 1)


def resp(*, epoch: int = 1, error: int = 0, interval: int = 1000,
         assignment: dict[uuid.UUID, list[int]] | None = None) -> Any:
    a = None if assignment is None else _Assignment(
        topic_partitions=[_TP(topic_id=t, partitions=ps) for t, ps in assignment.items()])
    r = M.ShareGroupHeartbeatResponse(error_code=error, member_id="x", member_epoch=epoch,
                                      heartbeat_interval_ms=interval, assignment=a)
    cm = M.compiled("ShareGroupHeartbeatResponse")
    return cm.decode(cm.encode(r, 1), 1)


def joined(**kw: Any) -> ShareMember:
    m = ShareMember("g", ["b", "a", "a"], **kw)
    m.build_heartbeat()
    m.handle_response(resp(epoch=3, assignment={T1: [0, 1]}))
    return m


def test_join_sends_epoch_zero_and_the_subscription() -> None:
    m = ShareMember("g", ["b", "a", "a"], rack_id="r1")
    uuid.UUID(m.member_id)  # a random id of its own
    assert ShareMember("g", ["a"]).member_id != m.member_id
    req = wire(m.build_heartbeat())
    assert (req.group_id, req.member_id, req.member_epoch) == ("g", m.member_id, JOIN_EPOCH)
    assert req.subscribed_topic_names == ["a", "b"] and req.rack_id == "r1"
    out = m.handle_response(resp(epoch=1, interval=2500))
    assert m.state == MemberState.STABLE and m.epoch == 1 and m.heartbeat_interval_ms == 2500
    assert not out.assignment_changed and m.assignment == {}


def test_later_heartbeats_send_only_the_epoch_until_the_subscription_changes() -> None:
    m = joined(rack_id="r1")
    req = wire(m.build_heartbeat())
    assert req.member_epoch == 3 and req.subscribed_topic_names is None and req.rack_id is None
    m.handle_response(resp(epoch=3))
    m.subscribe(["a", "b"])  # the same set: nothing to say
    assert wire(m.build_heartbeat()).subscribed_topic_names is None
    m.handle_response(resp(epoch=3))
    m.subscribe(["c"])
    assert wire(m.build_heartbeat()).subscribed_topic_names == ["c"]


def test_assignment_is_applied_and_a_null_one_keeps_it() -> None:
    m = joined()
    assert m.assigned() == [(T1, 0), (T1, 1)]
    m.build_heartbeat()
    out = m.handle_response(resp(epoch=4))  # null: unchanged
    assert not out.assignment_changed and m.assigned() == [(T1, 0), (T1, 1)] and m.epoch == 4
    m.build_heartbeat()
    out = m.handle_response(resp(epoch=5, assignment={T1: [1], T2: [0], uuid.UUID(int=3): []}))
    assert out.assignment_changed and m.assigned() == [(T1, 1), (T2, 0)]
    m.build_heartbeat()
    assert not m.handle_response(resp(epoch=5, assignment={T2: [0], T1: [1]})).assignment_changed


@pytest.mark.parametrize("code", [EC.FENCED_MEMBER_EPOCH, EC.UNKNOWN_MEMBER_ID])
def test_fenced_member_drops_its_assignment_and_rejoins_under_the_same_id(code: int) -> None:
    m = joined()
    member_id = m.member_id
    m.build_heartbeat()
    out = m.handle_response(resp(error=code))
    assert out.fenced and out.assignment_changed and m.assignment == {} and m.state == MemberState.JOINING
    req = wire(m.build_heartbeat())
    assert req.member_epoch == JOIN_EPOCH and req.member_id == member_id and req.subscribed_topic_names == ["a", "b"]


@pytest.mark.parametrize(("code", "find"), [(EC.NOT_COORDINATOR, True), (EC.COORDINATOR_NOT_AVAILABLE, True),
                                            (EC.COORDINATOR_LOAD_IN_PROGRESS, False)])
def test_coordinator_errors_keep_the_member_and_its_assignment(code: int, find: bool) -> None:
    m = joined()
    m.build_heartbeat()
    out = m.handle_response(resp(error=code))
    assert out.find_coordinator is find and not out.fenced
    assert m.state == MemberState.STABLE and m.epoch == 3 and m.assigned() == [(T1, 0), (T1, 1)]


def test_fatal_errors_fail_the_member() -> None:
    m = joined()
    m.build_heartbeat()
    out = m.handle_response(M.ShareGroupHeartbeatResponse(error_code=EC.GROUP_AUTHORIZATION_FAILED,
                                                          error_message="denied"))
    assert out.assignment_changed and m.state == MemberState.FAILED and m.assignment == {}
    assert m.error is not None and m.error.code == EC.GROUP_AUTHORIZATION_FAILED and "denied" in str(m.error)
    with pytest.raises(RuntimeError):
        m.build_heartbeat()
    assert not m.leave()


def test_a_lost_answer_repeats_the_subscription() -> None:
    m = joined()
    m.build_heartbeat()
    with pytest.raises(RuntimeError):
        m.build_heartbeat()  # one at a time
    m.heartbeat_failed()
    req = wire(m.build_heartbeat())
    assert req.member_epoch == 3 and req.subscribed_topic_names == ["a", "b"]


def test_leave_sends_epoch_minus_one_and_ends_the_member() -> None:
    m = joined()
    assert m.leave()
    req = wire(m.build_heartbeat())
    assert req.member_epoch == LEAVE_EPOCH and req.member_id == m.member_id
    out = m.handle_response(resp(epoch=LEAVE_EPOCH))
    assert out.assignment_changed and m.state == MemberState.LEFT and m.assignment == {}
    assert not m.leave()


def test_leave_without_an_answer_still_ends_the_member() -> None:
    m = joined()
    m.leave()
    m.build_heartbeat()
    m.heartbeat_failed()
    assert m.state == MemberState.LEFT


def test_a_member_that_never_joined_has_nothing_to_leave() -> None:
    m = ShareMember("g", ["a"])
    assert not m.leave() and m.state == MemberState.LEFT
