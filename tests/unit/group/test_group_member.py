"""GroupMember, the pure membership state machine (service.group.member): requests it builds and how it
reacts to every JoinGroup / SyncGroup / Heartbeat answer. No sockets: responses are message structs."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from service.consumer.subscription import TopicPartition
from service.group.assignors import get_assignor
from service.group.member import Action, GroupMember, MemberState, Step
from service.group.protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from service.protocol import error_codes as EC
from service.protocol import messages as M

TP = TopicPartition
JoinMember = M.struct("JoinGroupResponse", "JoinGroupResponseMember")
GROUP_AUTHORIZATION_FAILED = EC.GROUP_AUTHORIZATION_FAILED
INVALID_SESSION_TIMEOUT = EC.BY_NAME["INVALID_SESSION_TIMEOUT"]
INCONSISTENT_GROUP_PROTOCOL = EC.BY_NAME["INCONSISTENT_GROUP_PROTOCOL"]


# -- helpers -----------------------------------------------------------------------------------------
def new_member(*strategies: str, instance: str | None = None) -> GroupMember:
    names = strategies or ("range", "cooperative-sticky")
    return GroupMember("g", [get_assignor(n) for n in names], group_instance_id=instance,
                       session_timeout_ms=10_000, rebalance_timeout_ms=20_000, rack_id="r1")


def join_ok(m: GroupMember, *, member_id: str = "m-1", generation: int = 3, leader: str = "m-0",
            protocol: str = "range", members: Iterable[object] = ()) -> Step:
    return m.on_join_response(M.JoinGroupResponse(error_code=0, generation_id=generation, protocol_name=protocol,
                                                  leader=leader, member_id=member_id, members=list(members)))


def join_error(m: GroupMember, code: int, member_id: str = "") -> Step:
    return m.on_join_response(M.JoinGroupResponse(error_code=code, generation_id=-1, protocol_name="", leader="",
                                                  member_id=member_id, members=[]))


def sync_ok(m: GroupMember, partitions: Iterable[tuple[str, int]]) -> Step:
    return m.on_sync_response(M.SyncGroupResponse(error_code=0, assignment=encode_assignment(list(partitions))))


def make_stable(m: GroupMember, topics: list[str], partitions: list[tuple[str, int]], *, generation: int = 3,
                member_id: str = "m-1") -> Step:
    m.prepare_join()
    m.join_request(topics)
    step = join_ok(m, member_id=member_id, generation=generation, protocol=m.assignors[0].name)
    assert step.action is Action.SYNC
    step = sync_ok(m, partitions)
    assert step.action is Action.DONE and m.state is MemberState.STABLE
    return step


def assignment_of(req: object, member_id: str) -> dict[str, list[int]]:
    entry = next(a for a in req.assignments if a.member_id == member_id)  # type: ignore[attr-defined]
    return decode_assignment(entry.assignment).partitions


# -- the JoinGroup request -----------------------------------------------------------------------------
def test_first_join_request_eager() -> None:
    m = new_member(instance=None)
    assert not m.cooperative  # range + cooperative-sticky: eager, as in Java
    req = m.join_request(["b", "a", "b"])
    assert m.state is MemberState.JOINING and not m.rejoin_needed
    assert (req.group_id, req.member_id, req.group_instance_id) == ("g", "", None)
    assert (req.session_timeout_ms, req.rebalance_timeout_ms, req.protocol_type) == (10_000, 20_000, "consumer")
    assert req.reason == "initial join"
    assert [p.name for p in req.protocols] == ["range", "cooperative-sticky"]
    assert req.protocols[0].metadata == req.protocols[1].metadata
    sub = decode_subscription(req.protocols[0].metadata)
    assert sub.topics == ["a", "b"] and sub.owned_partitions == {} and sub.generation_id == -1
    assert sub.rack_id == "r1"


def test_eager_rejoin_revokes_everything_and_sends_no_owned_partitions() -> None:
    m = new_member("range", instance="i-1")
    make_stable(m, ["a"], [("a", 0), ("a", 1)])
    m.request_rejoin("metadata changed")
    assert m.prepare_join() == [TP("a", 0), TP("a", 1)]
    assert m.owned == []
    req = m.join_request(["a"])
    assert (req.member_id, req.group_instance_id, req.reason) == ("m-1", "i-1", "metadata changed")
    sub = decode_subscription(req.protocols[0].metadata)
    assert sub.owned_partitions == {} and sub.generation_id == 3


def test_cooperative_join_carries_owned_partitions_and_generation() -> None:
    m = new_member("cooperative-sticky")
    assert m.cooperative
    make_stable(m, ["a", "b"], [("a", 0), ("b", 2), ("a", 1)], generation=7)
    assert m.prepare_join() == []  # nothing is revoked up front
    assert m.owned == [TP("a", 0), TP("a", 1), TP("b", 2)]  # grouped by topic on the wire
    sub = decode_subscription(m.join_request(["a", "b"]).protocols[0].metadata)
    assert sub.owned_partitions == {"a": [0, 1], "b": [2]} and sub.generation_id == 7


# -- JoinGroup errors ----------------------------------------------------------------------------------------
def test_member_id_required_rejoins_at_once_with_the_new_id() -> None:
    m = new_member()
    m.join_request(["a"])
    step = join_error(m, EC.MEMBER_ID_REQUIRED, member_id="consumer-1-abc")
    assert step.action is Action.REJOIN
    assert m.member_id == "consumer-1-abc" and m.state is MemberState.UNJOINED and m.rejoin_needed
    req = m.join_request(["a"])
    assert req.member_id == "consumer-1-abc" and req.reason == "member id assigned by the coordinator"


def test_unknown_member_id_resets_the_member() -> None:
    m = new_member()
    make_stable(m, ["a"], [("a", 0)])
    m.join_request(["a"])
    step = join_error(m, EC.UNKNOWN_MEMBER_ID, member_id="m-1")
    assert step.action is Action.REJOIN
    assert (m.member_id, m.generation_id, m.state, m.rejoin_needed) == ("", -1, MemberState.UNJOINED, True)
    assert m.join_request(["a"]).member_id == ""


def test_illegal_generation_keeps_the_member_id() -> None:
    m = new_member()
    make_stable(m, ["a"], [("a", 0)])
    m.join_request(["a"])
    step = join_error(m, EC.ILLEGAL_GENERATION, member_id="m-1")
    assert step.action is Action.REJOIN
    assert (m.member_id, m.generation_id, m.protocol_name, m.leader_id) == ("m-1", -1, None, None)
    assert m.rejoin_needed and m.rejoin_reason == "illegal generation"


@pytest.mark.parametrize(("code", "action"), [
    (EC.REBALANCE_IN_PROGRESS, Action.RETRY),
    (EC.NOT_COORDINATOR, Action.REDISCOVER),
    (EC.COORDINATOR_NOT_AVAILABLE, Action.REDISCOVER),
    (EC.COORDINATOR_LOAD_IN_PROGRESS, Action.RETRY),
])
def test_retriable_join_errors(code: int, action: Action) -> None:
    m = new_member()
    make_stable(m, ["a"], [("a", 0)])
    m.join_request(["a"])
    step = join_error(m, code, member_id="m-1")
    assert step.action is action and step.error is None
    # membership is kept: the retry joins as the same member of the same generation
    assert (m.member_id, m.generation_id) == ("m-1", 3)
    assert m.state is MemberState.UNJOINED and m.rejoin_needed and m.fatal_error is None


@pytest.mark.parametrize("code", [EC.FENCED_INSTANCE_ID, INVALID_SESSION_TIMEOUT, GROUP_AUTHORIZATION_FAILED,
                                  INCONSISTENT_GROUP_PROTOCOL])
def test_fatal_join_errors(code: int) -> None:
    m = new_member(instance="i-1")
    m.join_request(["a"])
    step = join_error(m, code)
    assert step.action is Action.FATAL
    assert step.error is m.fatal_error and step.error is not None
    assert step.error.code == code and not step.error.retriable
    text = str(step.error)
    assert "JoinGroup" in text and "'g'" in text and EC.describe(code).name in text
    assert m.state is MemberState.FATAL
    assert m.leave_request(force_static=True) is None  # a fatal member has nothing to leave


# -- leader -----------------------------------------------------------------------------------------------
def test_leader_assigns_the_union_of_subscriptions_and_syncs_every_member() -> None:
    m = new_member(instance="i-1")
    m.join_request(["a", "b"])
    members = [
        JoinMember(member_id="m-1", group_instance_id="i-1", metadata=encode_subscription(["a", "b"])),
        JoinMember(member_id="m-2", group_instance_id=None, metadata=encode_subscription(["b"])),
        JoinMember(member_id="m-3", group_instance_id=None, metadata=b"\x00"),  # garbage
        JoinMember(member_id="m-4", group_instance_id=None, metadata=encode_subscription(["c"], version=0)),
    ]
    step = join_ok(m, member_id="m-1", leader="m-1", generation=5, members=members)
    assert m.is_leader and m.state is MemberState.SYNCING
    assert step.action is Action.ASSIGN and step.topics == ["a", "b", "c"]
    step = m.leader_sync({"a": 2, "b": 2, "c": 1})
    assert step.action is Action.SYNC
    req = step.request
    assert (req.group_id, req.generation_id, req.member_id, req.group_instance_id) == ("g", 5, "m-1", "i-1")
    assert (req.protocol_type, req.protocol_name) == ("consumer", "range")
    assert sorted(a.member_id for a in req.assignments) == ["m-1", "m-2", "m-3", "m-4"]
    assert assignment_of(req, "m-1") == {"a": [0, 1], "b": [0]}
    assert assignment_of(req, "m-2") == {"b": [1]}
    assert assignment_of(req, "m-3") == {}
    assert assignment_of(req, "m-4") == {"c": [0]}
    assert [mid for mid, _ in m.bad_subscriptions] == ["m-3"]
    assert m.bad_subscriptions[0][1]  # says what was wrong
    # the leader's own assignment arrives in the SyncGroup answer like everyone's
    step = m.on_sync_response(M.SyncGroupResponse(error_code=0, assignment=req.assignments[0].assignment))
    assert step.action is Action.DONE and step.assigned == [TP("a", 0), TP("a", 1), TP("b", 0)]


def test_a_static_leader_told_to_skip_the_assignment_syncs_without_one() -> None:
    """KIP-814: a static leader back in a stable group (Apache Kafka, JoinGroup v9) gets skip_assignment: it runs
    no assignor and syncs with no assignments; the coordinator answers with its current assignment."""
    m = new_member(instance="i-1")
    m.join_request(["a"])
    members = [JoinMember(member_id="m-9", group_instance_id="i-1", metadata=encode_subscription(["a"])),
               JoinMember(member_id="m-2", group_instance_id="i-2", metadata=encode_subscription(["a"]))]
    step = m.on_join_response(M.JoinGroupResponse(error_code=0, generation_id=4, protocol_name="range", leader="m-9",
                                                  member_id="m-9", members=members, skip_assignment=True))
    assert m.is_leader and m.skipped_assignment
    assert step.action is Action.SYNC and step.request.assignments == []
    assert (step.request.generation_id, step.request.member_id) == (4, "m-9")
    step = sync_ok(m, [("a", 1)])
    assert step.action is Action.DONE and step.assigned == [TP("a", 1)]
    # the next join without the flag assigns again
    m.join_request(["a"])
    step = join_ok(m, member_id="m-9", leader="m-9", generation=5, members=members)
    assert not m.skipped_assignment and step.action is Action.ASSIGN


def test_two_member_ids_of_one_static_instance_share_its_partitions() -> None:
    """A coordinator that lists a departed member id next to its successor (one group.instance.id; Tansu after a
    hand-off, never Apache Kafka): the assignor sees the instance once and both ids get its share, so the live
    one consumes it instead of leaving it to the departed id until a stall recovery."""
    m = new_member(instance="i-1")
    m.join_request(["a"])
    members = [
        JoinMember(member_id="m-1", group_instance_id="i-1", metadata=encode_subscription(["a"])),
        JoinMember(member_id="old-2", group_instance_id="i-2", metadata=encode_subscription(["a"])),
        JoinMember(member_id="new-2", group_instance_id="i-2", metadata=encode_subscription(["a"])),
    ]
    join_ok(m, member_id="m-1", leader="m-1", generation=3, members=members)
    req = m.leader_sync({"a": 4}).request
    assert assignment_of(req, "m-1") == {"a": [0, 1]}  # half, not a third
    assert assignment_of(req, "old-2") == assignment_of(req, "new-2") == {"a": [2, 3]}
    assert m.shared_instance_ids == {"i-2": ["old-2", "new-2"]}
    assert m.last_plan == {"m-1": 2, "old-2": 2, "new-2": 2}


def test_leader_with_an_unknown_protocol_is_fatal() -> None:
    m = new_member("range")
    m.join_request(["a"])
    join_ok(m, member_id="m-1", leader="m-1", protocol="roundrobin",
            members=[JoinMember(member_id="m-1", metadata=encode_subscription(["a"]))])
    step = m.leader_sync({"a": 1})
    assert step.action is Action.FATAL and step.error is not None
    assert step.error.code == INCONSISTENT_GROUP_PROTOCOL and "roundrobin" in str(step.error)


# -- follower ---------------------------------------------------------------------------------------------
def test_follower_syncs_with_no_assignments() -> None:
    m = new_member(instance="i-2")
    m.join_request(["a"])
    step = join_ok(m, member_id="m-2", leader="m-1", generation=4)
    assert not m.is_leader and step.action is Action.SYNC
    req = step.request
    assert req.assignments == []
    assert (req.generation_id, req.member_id, req.group_instance_id, req.protocol_name) == (4, "m-2", "i-2", "range")
    step = sync_ok(m, [("a", 1), ("a", 0)])
    assert step.action is Action.DONE
    assert step.assigned == [TP("a", 1), TP("a", 0)] and step.added == step.assigned and step.revoked == []
    assert m.owned == step.assigned and m.rebalances == 1 and not m.rejoin_needed
    assert m.generation_valid


def test_empty_assignment_from_the_broker() -> None:
    m = new_member()
    m.join_request(["a"])
    join_ok(m)
    step = m.on_sync_response(M.SyncGroupResponse(error_code=0, assignment=b""))
    assert step.action is Action.DONE and step.assigned == [] and m.state is MemberState.STABLE


@pytest.mark.parametrize(("code", "action", "member_id", "generation"), [
    (EC.REBALANCE_IN_PROGRESS, Action.REJOIN, "m-1", 3),
    (EC.UNKNOWN_MEMBER_ID, Action.REJOIN, "", -1),
    (EC.ILLEGAL_GENERATION, Action.REJOIN, "m-1", -1),
    (EC.NOT_COORDINATOR, Action.REDISCOVER, "m-1", 3),
    (EC.COORDINATOR_NOT_AVAILABLE, Action.REDISCOVER, "m-1", 3),
    (EC.COORDINATOR_LOAD_IN_PROGRESS, Action.RETRY, "m-1", 3),
])
def test_sync_errors(code: int, action: Action, member_id: str, generation: int) -> None:
    m = new_member()
    m.join_request(["a"])
    join_ok(m)
    step = m.on_sync_response(M.SyncGroupResponse(error_code=code, assignment=b""))
    assert step.action is action
    assert (m.member_id, m.generation_id) == (member_id, generation)
    assert m.state is MemberState.UNJOINED and m.rejoin_needed and m.owned == []


@pytest.mark.parametrize("code", [EC.FENCED_INSTANCE_ID, GROUP_AUTHORIZATION_FAILED])
def test_fatal_sync_errors(code: int) -> None:
    m = new_member(instance="i-1")
    m.join_request(["a"])
    join_ok(m)
    step = m.on_sync_response(M.SyncGroupResponse(error_code=code, assignment=b""))
    assert step.action is Action.FATAL and step.error is not None and step.error.code == code
    assert "SyncGroup" in str(step.error) and m.state is MemberState.FATAL


# -- cooperative rebalancing -----------------------------------------------------------------------------------
def test_cooperative_revocation_requests_a_rejoin() -> None:
    m = new_member("cooperative-sticky")
    make_stable(m, ["a"], [("a", 0), ("a", 1), ("a", 2)])
    assert not m.rejoin_needed
    m.request_rejoin("new member")
    m.prepare_join()
    m.join_request(["a"])
    join_ok(m, generation=4, protocol="cooperative-sticky")
    step = sync_ok(m, [("a", 0), ("a", 3)])
    assert step.action is Action.DONE
    assert step.revoked == [TP("a", 1), TP("a", 2)] and step.added == [TP("a", 3)]
    assert step.assigned == [TP("a", 0), TP("a", 3)] == m.owned
    assert m.rejoin_needed and "revoked" in m.rejoin_reason
    # the follow-up join reports what it still owns
    sub = decode_subscription(m.join_request(["a"]).protocols[0].metadata)
    assert sub.owned_partitions == {"a": [0, 3]} and sub.generation_id == 4


def test_cooperative_sync_without_revocation_needs_no_rejoin() -> None:
    m = new_member("cooperative-sticky")
    make_stable(m, ["a"], [("a", 0)])
    m.request_rejoin("new topic")
    m.join_request(["a"])
    join_ok(m, generation=4, protocol="cooperative-sticky")
    step = sync_ok(m, [("a", 0), ("a", 1)])
    assert step.revoked == [] and step.added == [TP("a", 1)] and not m.rejoin_needed


def test_eager_sync_reports_everything_as_added() -> None:
    m = new_member("range")
    make_stable(m, ["a"], [("a", 0)])
    m.request_rejoin("again")
    assert m.prepare_join() == [TP("a", 0)]
    m.join_request(["a"])
    join_ok(m, generation=4)
    step = sync_ok(m, [("a", 0)])
    assert step.revoked == [] and step.added == [TP("a", 0)] and not m.rejoin_needed


# -- heartbeat --------------------------------------------------------------------------------------------
def test_heartbeat_request() -> None:
    m = new_member(instance="i-9")
    make_stable(m, ["a"], [("a", 0)], generation=11, member_id="m-9")
    req = m.heartbeat_request()
    assert (req.group_id, req.generation_id, req.member_id, req.group_instance_id) == ("g", 11, "m-9", "i-9")
    assert m.on_heartbeat_response(M.HeartbeatResponse(error_code=0)).action is Action.OK
    assert not m.rejoin_needed and m.state is MemberState.STABLE


@pytest.mark.parametrize(("code", "action", "member_id", "generation", "state"), [
    (EC.REBALANCE_IN_PROGRESS, Action.REJOIN, "m-1", 3, MemberState.STABLE),
    (EC.ILLEGAL_GENERATION, Action.REJOIN, "m-1", -1, MemberState.UNJOINED),
    (EC.UNKNOWN_MEMBER_ID, Action.REJOIN, "", -1, MemberState.UNJOINED),
    (EC.NOT_COORDINATOR, Action.REDISCOVER, "m-1", 3, MemberState.STABLE),
    (EC.COORDINATOR_NOT_AVAILABLE, Action.REDISCOVER, "m-1", 3, MemberState.STABLE),
    (EC.COORDINATOR_LOAD_IN_PROGRESS, Action.RETRY, "m-1", 3, MemberState.STABLE),
])
def test_heartbeat_errors(code: int, action: Action, member_id: str, generation: int, state: MemberState) -> None:
    m = new_member()
    make_stable(m, ["a"], [("a", 0)])
    step = m.on_heartbeat_response(M.HeartbeatResponse(error_code=code))
    assert step.action is action
    assert (m.member_id, m.generation_id, m.state) == (member_id, generation, state)
    assert m.rejoin_needed == (action is Action.REJOIN)
    assert m.owned == [TP("a", 0)]  # the driver decides whether partitions are lost


@pytest.mark.parametrize("code", [EC.FENCED_INSTANCE_ID, GROUP_AUTHORIZATION_FAILED])
def test_fatal_heartbeat_errors(code: int) -> None:
    m = new_member(instance="i-1")
    make_stable(m, ["a"], [("a", 0)])
    step = m.on_heartbeat_response(M.HeartbeatResponse(error_code=code))
    assert step.action is Action.FATAL and step.error is not None and step.error.code == code
    assert "Heartbeat" in str(step.error) and EC.describe(code).name in str(step.error)
    assert m.state is MemberState.FATAL and m.fatal_error is step.error


# -- leaving -------------------------------------------------------------------------------------------------
def test_dynamic_member_leaves_and_forgets_its_id() -> None:
    m = new_member()
    make_stable(m, ["a"], [("a", 0), ("a", 1)])
    req = m.leave_request("shutting down")
    assert req is not None and (req.group_id, req.member_id) == ("g", "m-1")
    [ident] = req.members
    assert (ident.member_id, ident.group_instance_id, ident.reason) == ("m-1", None, "shutting down")
    assert m.after_leave("left") == [TP("a", 0), TP("a", 1)]
    assert (m.member_id, m.generation_id, m.state, m.owned) == ("", -1, MemberState.UNJOINED, [])
    assert m.rejoin_needed and m.leave_request() is None


def test_static_member_keeps_its_slot_unless_forced() -> None:
    m = new_member(instance="i-1")
    make_stable(m, ["a"], [("a", 0)])
    assert m.leave_request() is None
    req = m.leave_request("scale down", force_static=True)
    assert req is not None
    [ident] = req.members
    assert (ident.member_id, ident.group_instance_id, ident.reason) == ("m-1", "i-1", "scale down")
    assert m.after_leave("left") == [TP("a", 0)]
    assert m.member_id == "m-1" and m.generation_id == -1  # the instance keeps its member id


def test_nothing_to_leave_before_joining() -> None:
    assert new_member().leave_request(force_static=True) is None


# -- commit identity ---------------------------------------------------------------------------------------
def test_commit_identity_per_state() -> None:
    m = new_member(instance="i-1")
    assert m.commit_identity() == (-1, "", "i-1")  # unjoined
    m.join_request(["a"])
    assert m.state is MemberState.JOINING and m.commit_identity() == (-1, "", "i-1")
    join_ok(m, member_id="m-1", generation=6)
    assert m.state is MemberState.SYNCING and m.commit_identity() == (6, "m-1", "i-1")
    sync_ok(m, [("a", 0)])
    assert m.commit_identity() == (6, "m-1", "i-1")
    m.on_heartbeat_response(M.HeartbeatResponse(error_code=EC.REBALANCE_IN_PROGRESS))
    assert m.commit_identity() == (6, "m-1", "i-1")  # still in generation 6 until it rejoins
    m.on_heartbeat_response(M.HeartbeatResponse(error_code=EC.ILLEGAL_GENERATION))
    assert m.commit_identity() == (-1, "", "i-1")
    m.join_request(["a"])
    m.on_join_response(M.JoinGroupResponse(error_code=EC.FENCED_INSTANCE_ID, member_id="m-1", members=[]))
    assert m.state is MemberState.FATAL and m.commit_identity() == (-1, "", "i-1")


def test_at_least_one_assignor_is_required() -> None:
    with pytest.raises(ValueError, match="assignor"):
        GroupMember("g", [])
