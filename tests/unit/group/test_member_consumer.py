"""The consumer protocol's (KIP-848) member state machine, without a broker: every transition by hand."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.consumer.subscription import TopicPartition
from service.group.member_consumer import (
    LEAVE_EPOCH,
    LEAVE_STATIC_EPOCH,
    Action,
    ConsumerGroupMember,
    ConsumerMemberState,
    new_member_id,
)
from service.protocol import error_codes as EC
from service.protocol import messages as M

S = ConsumerMemberState
T1, T2, T3 = (uuid.UUID(int=i) for i in (1, 2, 3))
NAMES = {T1: "t1", T2: "t2", T3: "t3"}
RespTopic = M.struct("ConsumerGroupHeartbeatResponse", "TopicPartitions")
RespAssignment = M.struct("ConsumerGroupHeartbeatResponse", "Assignment")
FENCED = EC.BY_NAME["FENCED_MEMBER_EPOCH"]


def tp(topic: str, p: int) -> TopicPartition:
    return TopicPartition(topic, p)


def answer(epoch: int, assignment: dict[uuid.UUID, list[int]] | None = None, *, interval_ms: int = 3000,
           error: int = 0, member_id: str | None = None) -> Any:
    asg = None
    if assignment is not None:
        asg = RespAssignment(topic_partitions=[RespTopic(topic_id=t, partitions=ps) for t, ps in assignment.items()])
    return M.ConsumerGroupHeartbeatResponse(error_code=error, member_id=member_id, member_epoch=epoch,
                                            heartbeat_interval_ms=interval_ms, assignment=asg)


def owned_ids(req: Any) -> dict[uuid.UUID, list[int]] | None:
    if req.topic_partitions is None:
        return None
    return {t.topic_id: t.partitions for t in req.topic_partitions}


def joined(assignment: dict[uuid.UUID, list[int]] | None = None, **kw: Any) -> ConsumerGroupMember:
    """A member that joined and reconciled ``assignment`` (acknowledged), stable at epoch 5."""
    m = ConsumerGroupMember("g", server_assignor="uniform", **kw)
    m.update_topic_names(NAMES)
    m.subscribe(["t1", "t2"])
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(5, assignment or {}), 0.0)
    if assignment:
        assert step.action is Action.RECONCILE
        rec = m.reconcile()
        assert rec is not None and m.complete_reconciliation(rec)
        m.heartbeat_request(0.0)
        m.on_heartbeat_response(answer(5), 0.0)
    assert m.state is S.STABLE
    return m


# -- identity ---------------------------------------------------------------------------------------


def test_member_id_is_generated_once_in_kafka_uuid_form() -> None:
    ids = {new_member_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)
    m = ConsumerGroupMember("g")
    assert len(m.member_id) == 22
    assert ConsumerGroupMember("g", member_id="mine").member_id == "mine"


# -- joining ----------------------------------------------------------------------------------------


def test_join_sends_every_field_with_epoch_zero() -> None:
    m = ConsumerGroupMember("g", group_instance_id="i-1", rack_id="r1", rebalance_timeout_ms=60000,
                            server_assignor="range")
    assert m.state is S.UNSUBSCRIBED and not m.heartbeat_due(0.0)
    m.subscribe(["b", "a", "a"])
    assert m.state is S.JOINING and m.heartbeat_due(0.0)
    req = m.heartbeat_request(0.0)
    assert (req.group_id, req.member_id, req.member_epoch) == ("g", m.member_id, 0)
    assert req.instance_id == "i-1" and req.rack_id == "r1"
    assert req.rebalance_timeout_ms == 60000
    assert req.subscribed_topic_names == ["a", "b"] and req.subscribed_topic_regex is None
    assert req.server_assignor == "range"
    assert req.topic_partitions == []  # joining: owns nothing, said explicitly
    assert not m.heartbeat_due(0.0), "one heartbeat in flight at a time"
    with pytest.raises(RuntimeError):
        m.heartbeat_request(0.0)


def test_join_with_a_regex() -> None:
    m = ConsumerGroupMember("g")
    m.subscribe(regex="orders-.*")
    req = m.heartbeat_request(0.0)
    assert req.subscribed_topic_regex == "orders-.*" and req.subscribed_topic_names is None
    with pytest.raises(ValueError):
        m.subscribe(["x"], regex="y")
    with pytest.raises(ValueError):
        m.subscribe([])


def test_join_answer_with_empty_assignment_is_stable() -> None:
    m = ConsumerGroupMember("g")
    m.subscribe(["t1"])
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(1, {}, interval_ms=2500), 0.0)
    assert step.action is Action.OK
    assert m.state is S.STABLE and m.member_epoch == 1 and m.owned == []
    assert m.heartbeat_interval_s == 2.5
    assert not m.heartbeat_due(2.4) and m.heartbeat_due(2.5)
    assert m.next_heartbeat_in(1.0) == pytest.approx(1.5)


def test_broker_given_member_id_is_adopted() -> None:
    m = ConsumerGroupMember("g", member_id="client-made")
    m.subscribe(["t1"])
    m.heartbeat_request(0.0)
    m.on_heartbeat_response(answer(1, {}, member_id="broker-made"), 0.0)
    assert m.member_id == "broker-made"
    m.heartbeat_request(5.0)
    m.on_heartbeat_response(answer(1, None, member_id=None), 5.0)  # null: unchanged
    assert m.member_id == "broker-made"


# -- reconciliation ---------------------------------------------------------------------------------


def test_assignment_is_reconciled_then_acknowledged_at_once() -> None:
    m = ConsumerGroupMember("g")
    m.update_topic_names(NAMES)
    m.subscribe(["t1", "t2"])
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(2, {T1: [0, 1], T2: [3]}), 0.0)
    assert step.action is Action.RECONCILE and not step.missing_topic_ids
    assert m.state is S.RECONCILING and m.owned == [] and m.needs_reconcile
    rec = m.reconcile()
    assert rec is not None
    assert rec.revoked == () and rec.added == (tp("t1", 0), tp("t1", 1), tp("t2", 3))
    assert m.reconcile() is None, "one hand-over at a time"
    assert not m.needs_reconcile
    # Until the hand-over completes, heartbeats still report what the member owned before (nothing).
    assert m.complete_reconciliation(rec)
    assert m.state is S.ACKNOWLEDGING and m.owned == [tp("t1", 0), tp("t1", 1), tp("t2", 3)]
    assert m.heartbeat_due(0.1), "the acknowledgement does not wait for the interval"
    req = m.heartbeat_request(0.1)
    assert owned_ids(req) == {T1: [0, 1], T2: [3]}
    assert m.state is S.STABLE
    assert m.commit_identity() == (2, m.member_id, None)


def test_revocation_comes_before_acquisition_and_is_acknowledged() -> None:
    m = joined({T1: [0, 1], T2: [0]})
    m.heartbeat_request(10.0)
    step = m.on_heartbeat_response(answer(6, {T1: [1], T2: [0, 1]}), 10.0)
    assert step.action is Action.RECONCILE
    rec = m.reconcile()
    assert rec is not None
    assert rec.revoked == (tp("t1", 0),) and rec.added == (tp("t2", 1),)
    assert rec.owned_after == (tp("t1", 1), tp("t2", 0), tp("t2", 1))
    # The member still owns t1-0 while the driver commits and releases it.
    assert tp("t1", 0) in m.owned
    assert m.complete_reconciliation(rec)
    req = m.heartbeat_request(10.0)
    assert owned_ids(req) == {T1: [1], T2: [0, 1]} and req.member_epoch == 6


def test_incremental_heartbeat_sends_only_what_changed() -> None:
    m = joined({T1: [0]}, group_instance_id="static-1", rack_id="r")
    req = m.heartbeat_request(10.0)
    assert req.instance_id == "static-1", "the instance id goes in every heartbeat"
    assert req.rebalance_timeout_ms == -1 and req.subscribed_topic_names is None
    assert req.server_assignor is None and req.topic_partitions is None and req.rack_id is None
    m.on_heartbeat_response(answer(5), 10.0)
    m.subscribe(["t1", "t3"])
    req = m.heartbeat_request(20.0)
    assert req.subscribed_topic_names == ["t1", "t3"] and req.topic_partitions is None
    m.on_heartbeat_response(answer(5), 20.0)
    m.rebalance_timeout_ms = 1000
    req = m.heartbeat_request(30.0)
    assert req.rebalance_timeout_ms == 1000 and req.subscribed_topic_names is None
    m.on_heartbeat_response(answer(5), 30.0)
    m.subscribe(regex="t.*")
    req = m.heartbeat_request(40.0)
    assert req.subscribed_topic_regex == "t.*" and req.subscribed_topic_names is None


def test_every_field_is_sent_again_after_a_failure() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)
    step = m.on_heartbeat_failure(10.0)
    assert step.action is Action.REDISCOVER
    assert not m.heartbeat_due(10.05), "backoff"
    assert m.heartbeat_due(10.1)
    req = m.heartbeat_request(10.1)
    assert req.subscribed_topic_names == ["t1", "t2"] and req.rebalance_timeout_ms == 300000
    assert req.server_assignor == "uniform" and owned_ids(req) == {T1: [0]}
    assert req.member_epoch == 5, "a lost heartbeat does not change the epoch"


def test_backoff_grows_and_resets() -> None:
    m = joined()
    for i, wait in enumerate((0.1, 0.2, 0.4, 0.8, 1.0, 1.0)):
        now = 100.0 * (i + 1)
        m._next_at = 0.0
        m.heartbeat_request(now)
        m.on_heartbeat_response(answer(0, error=EC.COORDINATOR_LOAD_IN_PROGRESS), now)
        assert m.next_heartbeat_in(now) == pytest.approx(wait)
    m._not_before = 0.0
    m.heartbeat_request(1000.0)
    m.on_heartbeat_response(answer(5), 1000.0)
    m.heartbeat_request(1003.0)
    m.on_heartbeat_failure(1003.0)
    assert m.next_heartbeat_in(1003.0) == pytest.approx(0.1)


def test_same_target_again_is_not_reconciled() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)
    assert m.on_heartbeat_response(answer(5, {T1: [0]}), 10.0).action is Action.OK
    assert m.state is S.STABLE and m.reconcile() is None


def test_unknown_topic_ids_are_resolved_later() -> None:
    m = ConsumerGroupMember("g")
    m.update_topic_names({T1: "t1"})
    m.subscribe(regex="t.*")
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(1, {T1: [0], T3: [0, 1]}), 0.0)
    assert step.action is Action.RECONCILE and step.missing_topic_ids == {T3}
    rec = m.reconcile()
    assert rec is not None and rec.added == (tp("t1", 0),), "the resolvable part is reconciled first"
    assert m.complete_reconciliation(rec)
    req = m.heartbeat_request(0.0)
    assert owned_ids(req) == {T1: [0]}
    assert m.state is S.RECONCILING and m.needs_reconcile, "the target is not reached yet"
    m.on_heartbeat_response(answer(1, {T1: [0], T3: [0, 1]}), 0.0)
    assert m.reconcile() is None  # nothing resolvable changed
    assert m.update_topic_names({T3: "t3"}), "resolving a missing id asks for a reconciliation"
    rec = m.reconcile()
    assert rec is not None and rec.added == (tp("t3", 0), tp("t3", 1))
    assert m.complete_reconciliation(rec)
    m.heartbeat_request(0.0)
    assert m.state is S.STABLE
    assert not m.update_topic_names({uuid.UUID(int=9): "other"})


def test_new_target_during_a_hand_over_is_reconciled_after_it() -> None:
    m = joined({T1: [0, 1]})
    m.heartbeat_request(10.0)
    m.on_heartbeat_response(answer(6, {T1: [1]}), 10.0)
    rec = m.reconcile()
    assert rec is not None and rec.revoked == (tp("t1", 0),)
    m.heartbeat_request(15.0)  # a regular heartbeat while the driver commits t1-0: still owned
    m.on_heartbeat_response(answer(7, {T1: [1], T2: [0]}), 15.0)
    assert m.reconcile() is None, "one hand-over at a time"
    assert m.complete_reconciliation(rec)
    assert m.state is S.ACKNOWLEDGING
    req = m.heartbeat_request(15.1)
    assert owned_ids(req) == {T1: [1]}
    assert m.state is S.RECONCILING
    rec2 = m.reconcile()
    assert rec2 is not None and rec2.added == (tp("t2", 0),) and rec2.revoked == ()


# -- fencing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [FENCED, EC.UNKNOWN_MEMBER_ID])
def test_fenced_member_drops_everything_and_rejoins_with_epoch_zero(code: int) -> None:
    m = joined({T1: [0, 1]})
    member_id = m.member_id
    m.heartbeat_request(10.0)
    step = m.on_heartbeat_response(answer(0, error=code), 10.0)
    assert step.action is Action.FENCED
    assert step.lost == [tp("t1", 0), tp("t1", 1)]
    assert m.state is S.FENCED and not m.heartbeat_due(10.0) and m.member_epoch == 0
    assert m.commit_identity() == (-1, "", None), "nothing can be committed once fenced"
    m.partitions_lost_released()
    assert m.state is S.JOINING and m.heartbeat_due(10.0)
    req = m.heartbeat_request(10.0)
    assert (req.member_id, req.member_epoch) == (member_id, 0)
    assert req.topic_partitions == [] and req.subscribed_topic_names == ["t1", "t2"]
    assert m.owned == [] and m.fencings == 1


def test_fencing_during_a_hand_over_aborts_it() -> None:
    m = joined({T1: [0, 1]})
    m.heartbeat_request(10.0)
    m.on_heartbeat_response(answer(6, {T1: [1], T2: [0]}), 10.0)
    rec = m.reconcile()
    assert rec is not None
    m.heartbeat_request(12.0)
    step = m.on_heartbeat_response(answer(0, error=FENCED), 12.0)
    assert step.lost == [tp("t1", 0), tp("t1", 1)]
    assert not m.complete_reconciliation(rec), "the driver must drop what it took"
    m.partitions_lost_released()
    assert m.state is S.JOINING


def test_stale_answer_after_fencing_is_ignored() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)
    m.on_heartbeat_response(answer(0, error=FENCED), 10.0)
    # a late answer (e.g. from a retried request) while fenced changes nothing
    m._in_flight = True
    assert m.on_heartbeat_response(answer(9, {T1: [0]}), 10.0).action is Action.OK
    assert m.state is S.FENCED and m.member_epoch == 0


# -- leaving ----------------------------------------------------------------------------------------


def test_dynamic_member_leaves_with_epoch_minus_one_after_releasing() -> None:
    m = joined({T1: [0], T2: [1]})
    assert m.leave() == [tp("t1", 0), tp("t2", 1)]
    assert m.state is S.PREPARE_LEAVING and not m.heartbeat_due(10.0)
    assert m.leave_ready()
    assert m.heartbeat_due(0.0), "the leave heartbeat goes at once"
    req = m.heartbeat_request(0.0)
    assert req.member_epoch == LEAVE_EPOCH == -1 and req.topic_partitions is None
    assert m.state is S.UNSUBSCRIBED
    assert m.on_heartbeat_response(answer(-1), 0.1).action is Action.LEFT
    assert not m.heartbeat_due(100.0) and m.owned == []


def test_static_member_leaves_with_epoch_minus_two_and_rejoins_under_its_instance_id() -> None:
    m = joined({T1: [0]}, group_instance_id="pod-1")
    m.leave()
    m.leave_ready()
    req = m.heartbeat_request(0.0)
    assert req.member_epoch == LEAVE_STATIC_EPOCH == -2 and req.instance_id == "pod-1"
    # even an error (or no answer at all) completes the leave: the request is not retried
    assert m.on_heartbeat_response(answer(0, error=EC.COORDINATOR_NOT_AVAILABLE), 0.1).action is Action.LEFT
    m.subscribe(["t1"])
    req = m.heartbeat_request(1.0)
    assert req.member_epoch == 0 and req.instance_id == "pod-1"


def test_leave_heartbeat_failure_still_leaves() -> None:
    m = joined()
    m.leave()
    m.leave_ready()
    m.heartbeat_request(0.0)
    assert m.on_heartbeat_failure(0.0).action is Action.LEFT


def test_fenced_while_preparing_to_leave_needs_no_leave_heartbeat() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)  # in flight when leave() starts
    m.leave()
    assert m.on_heartbeat_response(answer(0, error=FENCED), 10.0).action is Action.LEFT
    assert not m.leave_ready() and m.state is S.UNSUBSCRIBED


def test_assignment_while_leaving_is_ignored() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)
    m.leave()
    assert m.on_heartbeat_response(answer(6, {T1: [0, 1]}), 10.0).action is Action.OK
    assert m.state is S.PREPARE_LEAVING and m.reconcile() is None


def test_leave_a_hand_over_in_progress_is_aborted() -> None:
    m = joined({T1: [0]})
    m.heartbeat_request(10.0)
    m.on_heartbeat_response(answer(6, {T1: [0], T2: [0]}), 10.0)
    rec = m.reconcile()
    assert rec is not None
    assert m.leave() == [tp("t1", 0)]
    assert not m.complete_reconciliation(rec)


# -- errors -----------------------------------------------------------------------------------------


def test_coordinator_errors_rediscover() -> None:
    m = joined()
    for code in (EC.NOT_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE):
        m._not_before = m._next_at = 0.0
        m.heartbeat_request(50.0)
        assert m.on_heartbeat_response(answer(0, error=code), 50.0).action is Action.REDISCOVER
        assert m.state is S.STABLE and m.member_epoch == 5


@pytest.mark.parametrize("name", ["UNRELEASED_INSTANCE_ID", "FENCED_INSTANCE_ID", "GROUP_AUTHORIZATION_FAILED",
                                  "INVALID_REQUEST", "GROUP_MAX_SIZE_REACHED", "UNSUPPORTED_ASSIGNOR",
                                  "UNSUPPORTED_VERSION", "INVALID_REGULAR_EXPRESSION"])
def test_fatal_errors(name: str) -> None:
    m = ConsumerGroupMember("g")
    m.subscribe(["t"])
    m.heartbeat_request(0.0)
    resp = answer(0, error=EC.BY_NAME[name])
    resp.error_message = "why"
    step = m.on_heartbeat_response(resp, 0.0)
    assert step.action is Action.FATAL and step.error is not None
    assert step.error.code == EC.BY_NAME[name] and "why" in str(step.error)
    assert m.state is S.FATAL and not m.heartbeat_due(100.0) and m.next_heartbeat_in(0.0) is None
    with pytest.raises(RuntimeError):
        m.subscribe(["t"])


def test_commit_identity_outside_the_group() -> None:
    m = ConsumerGroupMember("g", group_instance_id="i")
    assert m.commit_identity() == (-1, "", "i")
    m.subscribe(["t1"])
    assert m.commit_identity() == (-1, "", "i"), "joining: no epoch yet"


def test_static_member_leaving_for_good_uses_epoch_minus_one() -> None:
    m = joined({T1: [0]}, group_instance_id="pod-1")
    m.leave(for_good=True)
    m.leave_ready()
    assert m.heartbeat_request(0.0).member_epoch == LEAVE_EPOCH


def test_commits_while_releasing_to_leave_carry_the_epoch() -> None:
    m = joined({T1: [0]})
    m.leave()
    assert m.commit_identity() == (5, m.member_id, None), "the revoked partitions are committed before leaving"
    m.leave_ready()
    assert m.commit_identity() == (-1, "", None)


def test_heartbeat_soon_skips_the_interval_not_the_backoff() -> None:
    m = joined()
    m.heartbeat_request(10.0)
    m.on_heartbeat_response(answer(5), 10.0)
    assert not m.heartbeat_due(10.5)
    m.heartbeat_soon()
    assert m.heartbeat_due(10.5)
    m.heartbeat_request(10.5)
    m.on_heartbeat_failure(10.5)
    m.heartbeat_soon()
    assert not m.heartbeat_due(10.55) and m.heartbeat_due(10.6)


def test_request_rejoin_is_harmless() -> None:
    m = joined({T1: [0]})
    m.request_rejoin("subscription changed")
    assert m.state is S.STABLE and m.owned == [tp("t1", 0)]


def test_a_join_refused_as_fenced_backs_off() -> None:
    m = ConsumerGroupMember("g")
    m.subscribe(["t1"])
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(0, error=EC.UNKNOWN_MEMBER_ID), 0.0)
    assert step.action is Action.FENCED and step.lost == []
    m.partitions_lost_released()
    assert m.state is S.JOINING and not m.heartbeat_due(0.05) and m.heartbeat_due(0.1)


def test_a_successor_waits_for_its_instance_id_to_be_released() -> None:
    """With wait_for_instance_release, UNRELEASED_INSTANCE_ID while joining is retried after a backoff (the broker
    expires a killed predecessor after the session timeout), not fatal; without it, fatal (above)."""
    m = ConsumerGroupMember("g", group_instance_id="pod-a", wait_for_instance_release=True)
    m.subscribe(["t"])
    m.heartbeat_request(0.0)
    step = m.on_heartbeat_response(answer(0, error=EC.BY_NAME["UNRELEASED_INSTANCE_ID"]), 0.0)
    assert step.action is Action.RETRY and m.state is S.JOINING and m.unreleased_retries == 1
    assert not m.heartbeat_due(0.05) and m.heartbeat_due(0.2)
    req = m.heartbeat_request(0.2)
    assert req.member_epoch == 0 and req.instance_id == "pod-a"
