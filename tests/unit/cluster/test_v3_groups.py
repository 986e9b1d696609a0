"""service.cluster.group_admin (pure parts): group views, lags and the lag summary behind the v3
consumer-group endpoints.

The v3 consumer-group JSON shapes and their checker are in :mod:`tests.v3_shapes` (tested in
``tests/unit/api/test_v3_shapes.py``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from service.client.errors import BrokerResponseError
from service.cluster.group_admin import (
    LocalMember,
    PartitionLag,
    committed_offsets,
    confluent_state,
    consumer_lags,
    group_view,
    lag_summary,
    listed_consumer_groups,
    local_view,
    may_be_unknown,
    member_assignment,
)
from service.consumer.subscription import TopicPartition
from service.group.protocol import encode_assignment
from service.protocol import error_codes as EC


# -- pure service parts --------------------------------------------------------------------------------------
def test_states_map_to_confluents_enum() -> None:
    assert [confluent_state(s) for s in ("Stable", "Empty", "PreparingRebalance", "CompletingRebalance", "Dead",
                                         "AwaitingSync", "Unknown", "whatever")] == [
        "STABLE", "EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "DEAD", "COMPLETING_REBALANCE",
        "UNKNOWN", "UNKNOWN"]
    # KIP-848 states (Tansu reports Assigning for classic groups) map into Confluent's enum, never outside it
    assert [confluent_state(s) for s in ("Assigning", "Reconciling")] == ["PREPARING_REBALANCE", "COMPLETING_REBALANCE"]


def test_listed_groups_keep_consumer_and_simple_groups() -> None:
    resp = SimpleNamespace(error_code=0, groups=[SimpleNamespace(group_id="a", protocol_type="consumer"),
                                                 SimpleNamespace(group_id="b", protocol_type=""),
                                                 SimpleNamespace(group_id="c", protocol_type="connect")])
    assert listed_consumer_groups(resp) == ["a", "b"]
    with pytest.raises(BrokerResponseError) as e:
        listed_consumer_groups(SimpleNamespace(error_code=EC.COORDINATOR_LOAD_IN_PROGRESS, groups=[]))
    assert e.value.code == EC.COORDINATOR_LOAD_IN_PROGRESS


def test_member_assignment_is_decoded_or_unknown() -> None:
    data = encode_assignment({"t": [1, 0], "u": [2]})
    assert member_assignment("consumer", data) == (TopicPartition("t", 0), TopicPartition("t", 1),
                                                   TopicPartition("u", 2))
    assert member_assignment("consumer", encode_assignment({})) == ()  # assigned nothing: known and empty
    assert member_assignment("consumer", b"") is None
    assert member_assignment("connect", data) is None
    assert member_assignment("consumer", b"\x00\x00\xff") is None


def _member(mid: str, assignment: bytes = b"", client_id: str = "", host: str = "", instance: str | None = None
            ) -> SimpleNamespace:
    return SimpleNamespace(member_id=mid, group_instance_id=instance, client_id=client_id, client_host=host,
                           member_metadata=b"", member_assignment=assignment)


def _described(members: list[SimpleNamespace], state: str = "Stable", ptype: str = "consumer",
               proto: str = "range", code: int = 0, gid: str = "g") -> SimpleNamespace:
    return SimpleNamespace(error_code=code, group_id=gid, group_state=state, protocol_type=ptype,
                           protocol_data=proto, members=members)


def test_group_view_of_a_described_group() -> None:
    d = _described([_member("m2", encode_assignment({"t": [1], "secret": [0]}), "c2", "/10.0.0.2", "i2"),
                    _member("m1", encode_assignment({"t": [0]}), "c1", "/10.0.0.1")])
    g = group_view(d, 3, allows_topic=lambda t: t != "secret")
    assert g is not None
    assert (g.group_id, g.is_simple, g.partition_assignor, g.state, g.coordinator) == ("g", False, "range", "STABLE", 3)
    assert [(m.consumer_id, m.instance_id, m.client_id, m.host, m.assignment) for m in g.members] == [
        ("m1", None, "c1", "/10.0.0.1", (TopicPartition("t", 0),)),
        ("m2", "i2", "c2", "/10.0.0.2", (TopicPartition("t", 1),))]  # sorted by id, secret topic left out
    assert g.owners() == {TopicPartition("t", 0): g.members[0], TopicPartition("t", 1): g.members[1]}
    assert g.member("m2") is g.members[1] and g.member("nobody") is None


def test_group_view_of_unknown_simple_and_failed_groups() -> None:
    assert group_view(_described([], state="Dead", ptype="", proto=""), 1) is None  # Kafka's "no such group"
    simple = group_view(_described([], state="Empty", ptype="", proto=""), 1)
    assert simple is not None and simple.is_simple and simple.state == "EMPTY" and simple.partition_assignor == ""
    with pytest.raises(BrokerResponseError) as e:
        group_view(_described([], code=EC.GROUP_AUTHORIZATION_FAILED), 1)
    assert e.value.code == EC.GROUP_AUTHORIZATION_FAILED


def test_group_view_fills_what_the_broker_left_empty_from_own_members() -> None:
    """Tansu answers members without client id and assignment: this process's own members fill them in;
    a broker's answer wins where it has one, and strangers stay empty."""
    d = _described([_member("own"), _member("stranger"),
                    _member("full", encode_assignment({"t": [5]}), "broker-said")], proto="")
    local = {"own": LocalMember("gw-client", (TopicPartition("t", 1),), "cooperative-sticky"),
             "full": LocalMember("gw-client", (TopicPartition("t", 9),))}
    g = group_view(d, 0, local)
    assert g is not None and g.partition_assignor == "cooperative-sticky"
    named = group_view(_described([_member("own")], proto="range"), 0, local)
    assert named is not None and named.partition_assignor == "range"  # the broker's answer wins
    assert {m.consumer_id: (m.client_id, m.assignment) for m in g.members} == {
        "own": ("gw-client", (TopicPartition("t", 1),)), "stranger": ("", ()),
        "full": ("broker-said", (TopicPartition("t", 5),))}


def _fetch_part(p: int, offset: int, code: int = 0) -> SimpleNamespace:
    return SimpleNamespace(partition_index=p, committed_offset=offset, error_code=code)


def test_committed_offsets_of_both_response_layouts() -> None:
    topics = [SimpleNamespace(name="t", partitions=[_fetch_part(0, 5), _fetch_part(1, -1), _fetch_part(2, 0)])]
    want = {TopicPartition("t", 0): 5, TopicPartition("t", 2): 0}
    assert committed_offsets(SimpleNamespace(error_code=0, topics=topics), "g", 7) == want
    v8 = SimpleNamespace(groups=[SimpleNamespace(group_id="other", error_code=0, topics=[]),
                                 SimpleNamespace(group_id="g", error_code=0, topics=topics)])
    assert committed_offsets(v8, "g", 8) == want
    with pytest.raises(BrokerResponseError) as e:
        committed_offsets(SimpleNamespace(error_code=EC.NOT_COORDINATOR, topics=[]), "g", 5)
    assert e.value.code == EC.NOT_COORDINATOR
    bad = [SimpleNamespace(name="t", partitions=[_fetch_part(0, -1, EC.UNSTABLE_OFFSET_COMMIT)])]
    with pytest.raises(BrokerResponseError):
        committed_offsets(SimpleNamespace(error_code=0, topics=bad), "g", 7)
    with pytest.raises(BrokerResponseError):
        committed_offsets(SimpleNamespace(groups=[]), "g", 9)


def _tp(t: str, p: int) -> TopicPartition:
    return TopicPartition(t, p)


def test_consumer_lags_are_confluents() -> None:
    d = _described([_member("m1", encode_assignment({"t": [0, 1]}), "c1", instance="i1"),
                    _member("m2", encode_assignment({"t": [2]}), "c2")])
    g = group_view(d, 0)
    assert g is not None
    committed = {_tp("t", 0): 5, _tp("t", 1): 20, _tp("t", 2): 0, _tp("u", 0): 1, _tp("gone", 0): 3}
    ends = {_tp("t", 0): 10, _tp("t", 1): 20, _tp("t", 2): 30, _tp("t", 3): 40, _tp("u", 0): 1}
    lags = consumer_lags(g, committed, ends)
    # committed partitions with an end offset, largest lag first, then topic and partition; t-3 (no
    # commit) and gone-0 (no end offset) have no entry; u-0 is nobody's
    assert [(x.topic, x.partition, x.current_offset, x.log_end_offset, x.lag, x.consumer_id, x.instance_id,
             x.client_id) for x in lags] == [
        ("t", 2, 0, 30, 30, "m2", None, "c2"),
        ("t", 0, 5, 10, 5, "m1", "i1", "c1"),
        ("t", 1, 20, 20, 0, "m1", "i1", "c1"),
        ("u", 0, 1, 1, 0, "", None, "")]


def _pl(t: str, p: int, current: int, end: int, cid: str = "") -> PartitionLag:
    return PartitionLag(t, p, current, end, cid, None, "")


def test_lag_summary_takes_the_first_largest_and_ignores_negative_lag() -> None:
    s = lag_summary([_pl("b", 0, 0, 7, "x"), _pl("a", 1, 3, 10, "y"), _pl("a", 2, 0, 7), _pl("c", 0, 9, 4)])
    assert s is not None
    assert (s.max_lag, s.total_lag, s.top.topic, s.top.partition, s.top.consumer_id) == (7, 21, "a", 1, "y")
    zero = lag_summary([_pl("t", 1, 5, 5), _pl("t", 0, 8, 8)])
    assert zero is not None and (zero.max_lag, zero.total_lag, zero.top.partition) == (0, 0, 0)
    assert lag_summary([]) is None


def test_local_view_of_a_tenants_instances() -> None:
    def inst(group: str, member_id: str | None, parts: list[TopicPartition], closed: bool = False) -> SimpleNamespace:
        member = None if member_id is None else SimpleNamespace(member_id=member_id, protocol_name="range")
        consumer = SimpleNamespace(member=member, assignment=lambda: list(parts))
        return SimpleNamespace(group=group, closed=closed, consumer=consumer)

    groups, members = local_view([inst("g1", "m1", [_tp("t", 1), _tp("t", 0)]), inst("g1", "", []),
                                  inst("g2", None, [_tp("t", 3)]), inst("g3", "m3", [], closed=True)], "cid")
    assert groups == {"g1", "g2"}
    assert members == {"g1": {"m1": LocalMember("cid", (_tp("t", 0), _tp("t", 1)), "range")}}


def test_only_empty_simple_groups_without_members_need_their_offsets_to_exist() -> None:
    empty_simple = group_view(_described([], state="Empty", ptype="", proto=""), 0)
    assert empty_simple is not None and may_be_unknown(empty_simple)
    for d in (_described([], state="Empty"), _described([_member("m")], state="Stable", ptype="", proto="")):
        view = group_view(d, 0)
        assert view is not None and not may_be_unknown(view)


async def test_log_end_offsets_skip_deleted_partitions_and_bound_concurrency() -> None:
    from service.cluster.group_admin import LOG_END_CONCURRENCY, GroupAdmin

    running = peak = 0

    async def read(client: Any, tp: TopicPartition) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        if tp.topic == "gone":
            raise BrokerResponseError(EC.UNKNOWN_TOPIC_OR_PARTITION, "end offset")
        return 100 + tp.partition

    adm = GroupAdmin(SimpleNamespace(), read_log_end=read)  # type: ignore[arg-type]
    tps = [_tp("t", p) for p in range(LOG_END_CONCURRENCY * 3)] + [_tp("gone", 0)]
    ends = await adm.log_end_offsets(tps)
    assert ends == {_tp("t", p): 100 + p for p in range(LOG_END_CONCURRENCY * 3)}
    assert 1 < peak <= LOG_END_CONCURRENCY

    async def failing(client: Any, tp: TopicPartition) -> int:
        raise BrokerResponseError(EC.NOT_LEADER_OR_FOLLOWER, "end offset")

    with pytest.raises(BrokerResponseError):
        await GroupAdmin(SimpleNamespace(), read_log_end=failing).log_end_offsets([_tp("t", 0)])  # type: ignore[arg-type]
