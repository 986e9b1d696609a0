"""Stall detection of group members: the pure decisions and the metric they feed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from service.consumer.consumer import ConsumerStats
from service.consumer.subscription import TopicPartition
from service.group.assignors import get_assignor
from service.group.coordinator import GroupCoordinator
from service.group.member import GroupMember, MemberState
from service.metrics import GatewayCollector
from service.protocol import messages as M


def member(instance: str | None = "inst-a", session_ms: int = 6000) -> GroupMember:
    return GroupMember("g", [get_assignor("range")], group_instance_id=instance, session_timeout_ms=session_ms)


def test_stalled_only_after_a_session_timeout_and_two_failed_rounds() -> None:
    m = member(session_ms=6000)
    assert not m.stalled(0.0, 5)
    assert not m.stalled(6.0, 5)
    assert m.stalled(6.01, 2)
    # one JoinGroup + SyncGroup round may take a session timeout on a broker that holds both (Tansu: 3 s each)
    assert not m.stalled(20.0, 1)
    m.state = MemberState.FATAL
    assert not m.stalled(60.0, 9)  # a fatal member does not rejoin at all


def test_adopting_a_departed_leaders_id_rejoins_under_it_with_the_same_instance_id() -> None:
    m = member()
    m.member_id, m.generation_id, m.leader_id, m.state = "inst-a-1", 3, "inst-b-9", MemberState.SYNCING
    m.adopt_member_id("inst-b-9", "rebalance stalled on a departed leader")
    assert (m.member_id, m.generation_id, m.leader_id, m.state) == ("inst-b-9", -1, None, MemberState.UNJOINED)
    assert m.rejoin_needed
    req = m.join_request(["t"])
    assert (req.member_id, req.group_instance_id, req.reason) == ("inst-b-9", "inst-a",
                                                                  "rebalance stalled on a departed leader")


def test_the_leader_records_its_plan_for_the_logs() -> None:
    from service.group import protocol as cp

    m = member(instance=None)
    Member = M.struct("JoinGroupResponse", "JoinGroupResponseMember")
    meta = cp.encode_subscription(["t"])
    resp = M.JoinGroupResponse(error_code=0, generation_id=1, protocol_name="range", leader="m1", member_id="m1",
                               members=[Member(member_id="m1", group_instance_id=None, metadata=meta),
                                        Member(member_id="m2", group_instance_id=None, metadata=meta)])
    m.on_join_response(resp)
    m.leader_sync({"t": 3})
    assert m.last_plan == {"m1": 2, "m2": 1}


def coordinator(topics: list[str], session_ms: int = 2000) -> GroupCoordinator:
    async def nothing(*_: Any) -> None:
        return None

    async def counts(_: Any) -> dict[str, int]:
        return {}

    return GroupCoordinator(SimpleNamespace(), member(session_ms=session_ms),  # type: ignore[arg-type]
                            partition_counts=counts, on_revoke=nothing, on_assign=nothing,
                            topics=lambda: topics)


def test_unassigned_time_counts_while_subscribed_without_partitions() -> None:
    topics = ["t"]
    c = coordinator(topics, session_ms=2000)
    assert c.unassigned_seconds(100.0) == 0.0  # the clock starts now
    assert c.unassigned_seconds(101.5) == 1.5 and not c.unassigned_too_long(101.5)
    assert c.unassigned_too_long(102.5)
    c.member.owned = [TopicPartition("t", 0)]
    assert c.unassigned_seconds(103.0) == 0.0 and not c.unassigned_too_long(110.0)
    c.member.owned = []
    assert c.unassigned_seconds(111.0) == 0.0  # a new period starts when the partitions went
    assert c.unassigned_too_long(113.5)
    topics.clear()  # unsubscribed: not waiting for anything
    assert c.unassigned_seconds(200.0) == 0.0 and not c.unassigned_too_long(300.0)


def fake_instance(coord: Any) -> Any:
    fetch_stats = SimpleNamespace(full_fetches=0, incremental_fetches=0, session_errors=0, session_resets=0,
                                  aborted_after_delivery=0)
    consumer = SimpleNamespace(stats=ConsumerStats(), fetcher=SimpleNamespace(stats=fetch_stats, buffered_bytes=0),
                               coordinator=coord, lag=dict)
    return SimpleNamespace(consumer=consumer, group="g")


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"tenant": "t1"})


def test_metric_counts_instances_without_partitions_past_their_session_timeout() -> None:
    now = [1000.0]
    stuck, fine, spare = coordinator(["t"]), coordinator(["t"]), coordinator([])
    fine.member.owned = [TopicPartition("t", 0)]
    stuck.stall_recoveries = 2
    rt = SimpleNamespace(instances={"a": fake_instance(stuck), "b": fake_instance(fine), "c": fake_instance(spare),
                                    "d": fake_instance(None)})
    registry = CollectorRegistry()
    registry.register(GatewayCollector(SimpleNamespace(tenants={"t1": rt}), clock=lambda: now[0]))  # type: ignore[arg-type]
    assert sample(registry, "kcg_unassigned_consumer_instances") == 0  # just started waiting
    now[0] += 2.5  # past the 2 s session timeout
    assert sample(registry, "kcg_unassigned_consumer_instances") == 1
    assert sample(registry, "kcg_group_stall_recoveries_total") == 2
    stuck.member.owned = [TopicPartition("t", 1)]
    assert sample(registry, "kcg_unassigned_consumer_instances") == 0


class RecoveringCoordinator(GroupCoordinator):
    """_recover_stall with DescribeGroups answered by ``described`` and LeaveGroups recorded, no broker."""

    def __init__(self, described: set[str] | None) -> None:
        c = coordinator(["t"])
        for name in GroupCoordinator.__slots__:  # a coordinator's state is in slots (memory per idle instance)
            if name != "__dict__":
                setattr(self, name, getattr(c, name))
        self.__dict__.update(c.__dict__)
        self.described = described
        self.left: list[str] = []

    async def _describe_members(self) -> set[str] | None:
        return self.described

    async def _leave_quietly(self, req: Any | None) -> None:
        if req is not None:
            self.left.append(req.members[0].member_id)


def stuck(c: GroupCoordinator, member_id: str, leader: str) -> None:
    c.member.member_id, c.member.leader_id, c.member.generation_id = member_id, leader, 0
    c.member.state = MemberState.UNJOINED
    c._unstable_since, c._failed_rounds = 0.0, 3


async def test_recovery_adopts_a_departed_leaders_id_after_leaving_under_its_own() -> None:
    c = RecoveringCoordinator(described={"inst-a-me"})
    stuck(c, "inst-a-me", "inst-b-gone")
    await c._recover_stall()
    assert c.left == ["inst-a-me"]
    assert (c.member.member_id, c.member.group_instance_id, c.stall_recoveries) == ("inst-b-gone", "inst-a", 1)
    assert c._failed_rounds == 0 and c.member.rejoin_needed


async def test_recovery_of_a_leader_the_broker_dropped_rejoins_under_its_own_id() -> None:
    c = RecoveringCoordinator(described={"inst-b-1"})
    stuck(c, "inst-a-me", "inst-a-me")
    await c._recover_stall()
    assert c.left == [] and c.member.member_id == "inst-a-me" and c.member.generation_id == -1


async def test_recovery_leaves_and_rejoins_as_new_when_the_leader_is_a_member_or_unknown() -> None:
    for described in ({"inst-a-me", "inst-b-1"}, None):
        c = RecoveringCoordinator(described=described)
        stuck(c, "inst-a-me", "inst-b-1")
        await c._recover_stall()
        assert c.left == ["inst-a-me"] and c.member.member_id == "" and c.member.group_instance_id == "inst-a"


async def test_only_the_smallest_live_member_takes_a_departed_leaders_place() -> None:
    # two members of one gateway stall together on a departed leader: only "inst-a-me" (the smaller id) adopts
    # its id; "inst-b-me" rejoins as usual, and adopts it itself after deferring twice
    a = RecoveringCoordinator(described={"inst-a-me", "inst-b-me"})
    stuck(a, "inst-a-me", "inst-x-gone")
    await a._recover_stall()
    assert a.member.member_id == "inst-x-gone" and a.left == ["inst-a-me"]
    b = RecoveringCoordinator(described={"inst-a-me", "inst-b-me"})
    for _ in range(2):
        stuck(b, "inst-b-me", "inst-x-gone")
        await b._recover_stall()
        assert b.member.member_id == "inst-b-me" and b.left == [] and b.member.rejoin_needed
    stuck(b, "inst-b-me", "inst-x-gone")
    await b._recover_stall()
    assert b.member.member_id == "inst-x-gone" and b.left == ["inst-b-me"]
