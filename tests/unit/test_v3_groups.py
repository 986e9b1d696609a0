"""service.groups (pure parts) and the v3 consumer-group JSON shapes.

``SHAPES`` holds, per v3 ``kind``, the fields of Confluent's published v3 OpenAPI for that resource, written
down by hand from reading the spec (kafka-rest ``api/v3/openapi.yaml``: ``ConsumerGroupData``,
``ConsumerData``, ``ConsumerAssignmentData``, ``ConsumerLagData``, ``ConsumerGroupLagSummaryData``, the
``Resource``/``ResourceCollection`` envelopes and ``Relationship``): JSON type, required or not, nullable or
not. :func:`check_shape` compares a body with it (unknown fields are problems too: our answers carry
exactly Confluent's fields); the integration tests run it on every endpoint's answer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from service.client.errors import BrokerResponseError
from service.group.protocol import encode_assignment
from service.groups import (
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
from service.protocol import error_codes as EC
from service.subscription import TopicPartition

# -- Confluent's v3 shapes (field → (JSON type, required, nullable)) ------------------------------------------
STR, INT, BOOL, REL = "string", "integer", "boolean", "relationship"
RESOURCE_METADATA = {"self": (STR, True, False), "resource_name": (STR, False, True)}
COLLECTION_METADATA = {"self": (STR, True, False), "next": (STR, False, True)}
SHAPES: dict[str, dict[str, tuple[str, bool, bool]]] = {
    "KafkaConsumerGroup": {
        "cluster_id": (STR, True, False), "consumer_group_id": (STR, True, False), "is_simple": (BOOL, True, False),
        "partition_assignor": (STR, True, False), "state": (STR, True, False), "coordinator": (REL, True, False),
        "consumers": (REL, True, False), "lag_summary": (REL, True, False),
    },
    "KafkaConsumer": {
        "cluster_id": (STR, True, False), "consumer_group_id": (STR, True, False), "consumer_id": (STR, True, False),
        "instance_id": (STR, False, True), "client_id": (STR, True, False), "assignments": (REL, True, False),
    },
    "KafkaConsumerAssignment": {
        "cluster_id": (STR, True, False), "consumer_group_id": (STR, True, False), "consumer_id": (STR, True, False),
        "topic_name": (STR, True, False), "partition_id": (INT, True, False), "partition": (REL, True, False),
        "lag": (REL, True, False),
    },
    "KafkaConsumerLag": {
        "cluster_id": (STR, True, False), "consumer_group_id": (STR, True, False), "topic_name": (STR, True, False),
        "partition_id": (INT, True, False), "current_offset": (INT, True, False), "log_end_offset": (INT, True, False),
        "lag": (INT, True, False), "consumer_id": (STR, True, False), "instance_id": (STR, False, True),
        "client_id": (STR, True, False),
    },
    "KafkaConsumerGroupLagSummary": {
        "cluster_id": (STR, True, False), "consumer_group_id": (STR, True, False),
        "max_lag_consumer_id": (STR, True, False), "max_lag_instance_id": (STR, False, True),
        "max_lag_client_id": (STR, True, False), "max_lag_topic_name": (STR, True, False),
        "max_lag_partition_id": (INT, True, False), "max_lag": (INT, True, False), "total_lag": (INT, True, False),
        "max_lag_consumer": (REL, True, False), "max_lag_partition": (REL, True, False),
    },
}
# ConsumerGroupState (an extensible enum in the spec; the values it names)
GROUP_STATES = {"UNKNOWN", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "DEAD", "EMPTY"}
ERROR_SHAPE = {"error_code": (INT, True, False), "message": (STR, True, True)}


def _type_ok(value: Any, typ: str) -> bool:
    if typ == STR:
        return isinstance(value, str)
    if typ == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == BOOL:
        return isinstance(value, bool)
    if typ == REL:
        return isinstance(value, dict) and set(value) == {"related"} and isinstance(value["related"], str)
    raise AssertionError(typ)


def _fields(obj: dict[str, Any], spec: dict[str, tuple[str, bool, bool]], where: str) -> list[str]:
    problems = []
    for name, (typ, required, nullable) in spec.items():
        if name not in obj:
            if required:
                problems.append(f"{where}: missing {name}")
            continue
        value = obj[name]
        if value is None:
            if not nullable:
                problems.append(f"{where}: {name} is null")
        elif not _type_ok(value, typ):
            problems.append(f"{where}: {name} is {type(value).__name__}, not {typ}")
    problems += [f"{where}: unexpected field {k}" for k in obj if k not in spec]
    return problems


def shape_problems(obj: Any, kind: str) -> list[str]:
    """Differences between ``obj`` and Confluent's shape of ``kind`` (a ``…List`` kind: the collection)."""
    if not isinstance(obj, dict):
        return [f"{kind}: not an object"]
    if kind.endswith("List"):
        item = kind.removesuffix("List")
        problems = [] if obj.get("kind") == kind else [f"{kind}: kind is {obj.get('kind')!r}"]
        problems += [f"{kind}: unexpected field {k}" for k in obj if k not in ("kind", "metadata", "data")]
        meta = obj.get("metadata")
        problems += _fields(meta, COLLECTION_METADATA, f"{kind}.metadata") if isinstance(meta, dict) else [
            f"{kind}: metadata is not an object"]
        data = obj.get("data")
        if not isinstance(data, list):
            return [*problems, f"{kind}: data is not an array"]
        for i, x in enumerate(data):
            problems += shape_problems(x, item) if isinstance(x, dict) else [f"{kind}.data[{i}]: not an object"]
        return problems
    problems = [] if obj.get("kind") == kind else [f"{kind}: kind is {obj.get('kind')!r}"]
    meta = obj.get("metadata")
    problems += _fields(meta, RESOURCE_METADATA, f"{kind}.metadata") if isinstance(meta, dict) else [
        f"{kind}: metadata is not an object"]
    problems += _fields({k: v for k, v in obj.items() if k not in ("kind", "metadata")}, SHAPES[kind], kind)
    if kind == "KafkaConsumerGroup" and obj.get("state") not in GROUP_STATES:
        problems.append(f"{kind}: state {obj.get('state')!r} is not a ConsumerGroupState")
    return problems


def check_shape(obj: Any, kind: str) -> None:
    problems = shape_problems(obj, kind)
    assert not problems, problems


def check_error(obj: Any) -> None:
    """Confluent's v3 ``Error``: error_code (integer) and message (string or null), nothing else."""
    problems = _fields(obj, ERROR_SHAPE, "error")
    assert not problems, problems


# -- the checker itself can fail -----------------------------------------------------------------------------
def _lag(**over: Any) -> dict[str, Any]:
    body = {"kind": "KafkaConsumerLag", "metadata": {"self": "http://x/v3/...", "resource_name": "crn:///kafka=c"},
            "cluster_id": "c", "consumer_group_id": "g", "topic_name": "t", "partition_id": 0, "current_offset": 1,
            "log_end_offset": 3, "lag": 2, "consumer_id": "", "instance_id": None, "client_id": ""}
    body.update(over)
    return body


def test_shape_checker_accepts_a_conforming_body_and_names_every_difference() -> None:
    check_shape(_lag(), "KafkaConsumerLag")
    check_shape({"kind": "KafkaConsumerLagList", "metadata": {"self": "u", "next": None}, "data": [_lag()]},
                "KafkaConsumerLagList")
    bad = _lag(lag="2", extra=1, partition_id=True)
    del bad["client_id"]
    assert sorted(shape_problems(bad, "KafkaConsumerLag")) == sorted([
        "KafkaConsumerLag: lag is str, not integer", "KafkaConsumerLag: unexpected field extra",
        "KafkaConsumerLag: partition_id is bool, not integer", "KafkaConsumerLag: missing client_id"])
    assert shape_problems(_lag(consumer_id=None), "KafkaConsumerLag") == ["KafkaConsumerLag: consumer_id is null"]
    assert shape_problems({"kind": "KafkaConsumerLagList", "metadata": {"self": "u"}, "data": [_lag(kind="X")]},
                          "KafkaConsumerLagList") == ["KafkaConsumerLag: kind is 'X'"]
    group = {"kind": "KafkaConsumerGroup", "metadata": {"self": "u", "resource_name": None}, "cluster_id": "c",
             "consumer_group_id": "g", "is_simple": False, "partition_assignor": "range", "state": "Stable",
             "coordinator": {"related": "u"}, "consumers": {"related": "u"}, "lag_summary": {"href": "u"}}
    assert shape_problems(group, "KafkaConsumerGroup") == [
        "KafkaConsumerGroup: lag_summary is dict, not relationship",
        "KafkaConsumerGroup: state 'Stable' is not a ConsumerGroupState"]


# -- pure service parts --------------------------------------------------------------------------------------
def test_states_map_to_confluents_enum() -> None:
    assert [confluent_state(s) for s in ("Stable", "Empty", "PreparingRebalance", "CompletingRebalance", "Dead",
                                         "AwaitingSync", "Unknown", "whatever")] == [
        "STABLE", "EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "DEAD", "COMPLETING_REBALANCE",
        "UNKNOWN", "UNKNOWN"]


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
    from service.groups import LOG_END_CONCURRENCY, GroupAdmin

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
