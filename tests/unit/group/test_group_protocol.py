"""Consumer protocol payload codecs (JoinGroup subscription metadata and SyncGroup assignments).

Checks exact bytes, every version, forward compatibility with newer versions, interoperability with
kafka-python's own ConsumerProtocol classes in both directions, and that bad input only ever raises
ProtocolDecodeError.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KPAssignment
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KPSubscription
from kafka.protocol.old.consumer_protocol import (
    ConsumerProtocolMemberAssignment_v0,
    ConsumerProtocolMemberMetadata_v0,
)

from service.group.protocol import (
    ASSIGNMENT_VERSIONS,
    SUBSCRIPTION_VERSIONS,
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    group_partitions,
)
from service.protocol.errors import ProtocolDecodeError, UnsupportedVersionError

FULL = {
    "topics": ["orders", "payments"],
    "owned_partitions": {"orders": [0, 2], "payments": [1]},
    "user_data": b"\x01\x02",
    "generation_id": 7,
    "rack_id": "rack-a",
}

# Hand-assembled v3 subscription for FULL: every field of the layout spelled out.
GOLDEN_V3 = b"".join([
    b"\x00\x03",                                    # version 3
    b"\x00\x00\x00\x02",                            # 2 topics
    b"\x00\x06orders", b"\x00\x08payments",
    b"\x00\x00\x00\x02\x01\x02",                    # user_data
    b"\x00\x00\x00\x02",                            # 2 owned topics
    b"\x00\x06orders", b"\x00\x00\x00\x02", b"\x00\x00\x00\x00", b"\x00\x00\x00\x02",
    b"\x00\x08payments", b"\x00\x00\x00\x01", b"\x00\x00\x00\x01",
    b"\x00\x00\x00\x07",                            # generation 7
    b"\x00\x06rack-a",                              # rack
])


def test_versions_cover_kafka_range() -> None:
    assert SUBSCRIPTION_VERSIONS == (0, 3)
    assert ASSIGNMENT_VERSIONS == (0, 3)


# -- subscription -----------------------------------------------------------------------------
def test_subscription_v3_golden_bytes() -> None:
    assert encode_subscription(**FULL) == GOLDEN_V3
    assert decode_subscription(GOLDEN_V3) == Subscription(version=3, **FULL)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (0, Subscription(0, ["orders", "payments"], b"\x01\x02")),
        (1, Subscription(1, ["orders", "payments"], b"\x01\x02", {"orders": [0, 2], "payments": [1]})),
        (2, Subscription(2, ["orders", "payments"], b"\x01\x02", {"orders": [0, 2], "payments": [1]}, 7)),
        (3, Subscription(3, **FULL)),
    ],
)
def test_subscription_round_trip_every_version(version: int, expected: Subscription) -> None:
    data = encode_subscription(**FULL, version=version)
    assert data[:2] == struct.pack(">h", version)
    got = decode_subscription(data)
    assert got == expected
    # Fields a version lacks come back as Kafka's defaults.
    if version < 2:
        assert got.generation_id == -1
    if version < 3:
        assert got.rack_id is None


def test_subscription_minimal_defaults() -> None:
    got = decode_subscription(encode_subscription(["t"]))
    assert got == Subscription(version=3, topics=["t"], user_data=None, owned_partitions={},
                               generation_id=-1, rack_id=None)
    assert got.owned_pairs() == []


def test_subscription_accepts_pairs_and_reports_pairs() -> None:
    pairs = [("b", 3), ("a", 1), ("b", 0), ("a", 1)]  # duplicate dropped, first-seen topic order kept
    got = decode_subscription(encode_subscription(["a", "b"], owned_partitions=pairs))
    assert got.owned_partitions == {"b": [3, 0], "a": [1]}
    assert got.owned_pairs() == [("b", 3), ("b", 0), ("a", 1)]


def test_subscription_empty_rack_is_none() -> None:
    assert decode_subscription(encode_subscription(["t"], rack_id="")).rack_id is None


def test_subscription_repeated_owned_topic_on_wire_merges() -> None:
    # Two entries for the same topic (legal on the wire) merge into one list.
    body = b"".join([
        b"\x00\x01", b"\x00\x00\x00\x01", b"\x00\x01t", b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x02",
        b"\x00\x01t", b"\x00\x00\x00\x01", b"\x00\x00\x00\x05",
        b"\x00\x01t", b"\x00\x00\x00\x02", b"\x00\x00\x00\x01", b"\x00\x00\x00\x05",
    ])
    assert decode_subscription(body).owned_partitions == {"t": [5, 1]}


@pytest.mark.parametrize("version", [4, 5, 100, 32767])
def test_subscription_newer_version_read_with_newest_layout(version: int) -> None:
    newer = struct.pack(">h", version) + GOLDEN_V3[2:] + b"\x00\x00\x00\x2a" + b"future-field"
    got = decode_subscription(newer)
    assert got.version == version
    assert (got.topics, got.owned_partitions, got.generation_id, got.rack_id, got.user_data) == (
        FULL["topics"], FULL["owned_partitions"], 7, "rack-a", b"\x01\x02")


def test_subscription_older_version_ignores_trailing_bytes() -> None:
    data = encode_subscription(["t"], version=0) + b"\x00\x00\x00\x01\x00\x01t"
    assert decode_subscription(data).topics == ["t"]


def test_subscription_memoryview_and_bytearray() -> None:
    assert decode_subscription(memoryview(GOLDEN_V3)) == decode_subscription(GOLDEN_V3)
    assert decode_subscription(bytearray(GOLDEN_V3)) == decode_subscription(GOLDEN_V3)


@pytest.mark.parametrize(
    "data",
    [
        b"",                                   # no version
        b"\x00",                               # half a version
        b"\xff\xff" + GOLDEN_V3[2:],           # version -1
        b"\x80\x00" + GOLDEN_V3[2:],           # version -32768
        b"\x00\x00",                           # v0 without a topic array
        b"\x00\x00\x00\x00\x00\x01\x00\x05ab",  # topic name runs past the end
        b"\x00\x00\xff\xff\xff\xff",           # null topic array
        b"\x00\x00\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00",  # null topic name
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09",  # user data longer than the payload
        b"\x00\x00\x00\x00\x00\x01\x00\x02\xff\xfe\xff\xff\xff\xff",  # topic name is not UTF-8
        GOLDEN_V3[:-1],                        # truncated rack
        GOLDEN_V3[:20],
        b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\x7f\xff\xff\xff",  # 2^31-1 owned topics, no data
    ],
)
def test_subscription_garbage_raises_typed_error(data: bytes) -> None:
    with pytest.raises(ProtocolDecodeError):
        decode_subscription(data)


def test_subscription_unknown_encode_version() -> None:
    with pytest.raises(UnsupportedVersionError):
        encode_subscription(["t"], version=4)
    with pytest.raises(UnsupportedVersionError):
        encode_subscription(["t"], version=-1)


# -- assignment -------------------------------------------------------------------------------
def test_assignment_golden_bytes_and_round_trip_every_version() -> None:
    for version in range(4):
        data = encode_assignment({"t": [0, 1], "u": [4]}, user_data=b"x", version=version)
        assert data == b"".join([
            struct.pack(">h", version), b"\x00\x00\x00\x02",
            b"\x00\x01t", b"\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01",
            b"\x00\x01u", b"\x00\x00\x00\x01\x00\x00\x00\x04",
            b"\x00\x00\x00\x01x",
        ])
        got = decode_assignment(data)
        assert got == Assignment(version, {"t": [0, 1], "u": [4]}, b"x")
        assert got.pairs() == [("t", 0), ("t", 1), ("u", 4)]


def test_assignment_defaults_and_empty_topics_dropped() -> None:
    data = encode_assignment({"t": [], "u": [2]})
    assert data[:2] == b"\x00\x03"
    assert decode_assignment(data) == Assignment(3, {"u": [2]}, None)
    assert decode_assignment(encode_assignment({})) == Assignment(3, {}, None)
    assert decode_assignment(encode_assignment([("a", 1), ("a", 0)])).partitions == {"a": [1, 0]}


@pytest.mark.parametrize("data", [b"", None])
def test_assignment_empty_bytes_is_empty_assignment(data: bytes | None) -> None:
    got = decode_assignment(data)
    assert got == Assignment(0, {}, None)
    assert got.pairs() == []


def test_assignment_newer_version_with_trailing_bytes() -> None:
    body = encode_assignment({"t": [3]}, user_data=b"ud")[2:]
    got = decode_assignment(b"\x00\x09" + body + b"\x01\x02\x03")
    assert got == Assignment(9, {"t": [3]}, b"ud")


@pytest.mark.parametrize(
    "data",
    [b"\x00", b"\xff\xfe\x00\x00\x00\x00\xff\xff\xff\xff", b"\x00\x00", b"\x00\x00\x00\x00\x00\x01\x00\x01t",
     b"\x00\x00\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x03\x00\x00\x00\x01", b"\x00\x03\xff\xff\xff\xff"],
)
def test_assignment_garbage_raises_typed_error(data: bytes) -> None:
    with pytest.raises(ProtocolDecodeError):
        decode_assignment(data)


def test_group_partitions_shapes() -> None:
    assert group_partitions(None) == {}
    assert group_partitions({"a": [1, 1, 0], "b": []}) == {"a": [1, 0]}
    assert group_partitions([("a", 1), ("b", 2), ("a", 0)]) == {"a": [1, 0], "b": [2]}


# -- interoperability with kafka-python -------------------------------------------------------
def _kp_subscription(version: int) -> KPSubscription:
    tp = KPSubscription.TopicPartition
    return KPSubscription(
        version=version,
        topics=["orders", "payments"],
        user_data=b"\x01\x02",
        owned_partitions=[tp(topic="orders", partitions=[0, 2]), tp(topic="payments", partitions=[1])],
        generation_id=7,
        rack_id="rack-a",
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_python_subscription_bytes_decode_with_ours(version: int) -> None:
    data = _kp_subscription(version).encode()
    assert data == encode_subscription(**FULL, version=version)
    got = decode_subscription(data)
    assert got.version == version
    assert got.topics == ["orders", "payments"]
    assert got.user_data == b"\x01\x02"
    assert got.owned_partitions == ({"orders": [0, 2], "payments": [1]} if version >= 1 else {})
    assert got.generation_id == (7 if version >= 2 else -1)
    assert got.rack_id == ("rack-a" if version >= 3 else None)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_our_subscription_bytes_decode_with_kafka_python(version: int) -> None:
    theirs = KPSubscription.decode(encode_subscription(**FULL, version=version))
    assert theirs.version == version
    assert list(theirs.topics) == ["orders", "payments"]
    assert theirs.user_data == b"\x01\x02"
    if version >= 1:
        assert [(tp.topic, list(tp.partitions)) for tp in theirs.owned_partitions] == [
            ("orders", [0, 2]), ("payments", [1])]
    assert theirs.generation_id == (7 if version >= 2 else -1)
    assert theirs.rack_id == ("rack-a" if version >= 3 else None)


def test_kafka_python_legacy_v0_classes() -> None:
    meta = ConsumerProtocolMemberMetadata_v0(0, ["a", "b"], b"ud").encode()
    assert decode_subscription(meta) == Subscription(0, ["a", "b"], b"ud")
    ours = ConsumerProtocolMemberMetadata_v0.decode(encode_subscription(["a", "b"], user_data=b"ud", version=0))
    assert (ours.version, list(ours.topics), ours.user_data) == (0, ["a", "b"], b"ud")

    asn = ConsumerProtocolMemberAssignment_v0(0, [("a", [0, 1]), ("b", [2])], b"").encode()
    assert decode_assignment(asn) == Assignment(0, {"a": [0, 1], "b": [2]}, b"")
    back = ConsumerProtocolMemberAssignment_v0.decode(encode_assignment({"a": [0, 1], "b": [2]}, version=0))
    assert sorted((tp.topic, tp.partition) for tp in back.partitions()) == [("a", 0), ("a", 1), ("b", 2)]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_interop_with_kafka_python(version: int) -> None:
    tp = KPAssignment.TopicPartition
    theirs = KPAssignment(version=version, assigned_partitions=[tp(topic="t", partitions=[2, 0])], user_data=None)
    assert decode_assignment(theirs.encode()) == Assignment(version, {"t": [2, 0]}, None)
    back = KPAssignment.decode(encode_assignment({"t": [2, 0], "u": [1]}, version=version))
    assert back.version == version
    assert sorted((t.topic, t.partition) for t in back.partitions()) == [("t", 0), ("t", 2), ("u", 1)]


# -- properties -------------------------------------------------------------------------------
names = st.text(min_size=1, max_size=8)
partition_map = st.dictionaries(names, st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4, unique=True),
                                max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(0, 3),
    topics=st.lists(names, max_size=5),
    owned=partition_map,
    user_data=st.one_of(st.none(), st.binary(max_size=16)),
    generation=st.integers(-(2**31), 2**31 - 1),
    rack=st.one_of(st.none(), names),
)
def test_subscription_round_trip_property(version: int, topics: list[str], owned: dict[str, list[int]],
                                          user_data: bytes | None, generation: int, rack: str | None) -> None:
    data = encode_subscription(topics, owned_partitions=owned, user_data=user_data, generation_id=generation,
                               rack_id=rack, version=version)
    got = decode_subscription(data)
    assert got == Subscription(
        version, topics, user_data,
        owned if version >= 1 else {},
        generation if version >= 2 else -1,
        rack if version >= 3 else None,
    )
    # kafka-python agrees on every field it can see.
    theirs = KPSubscription.decode(data)
    assert list(theirs.topics) == topics and theirs.user_data == user_data


@settings(max_examples=100, deadline=None)
@given(version=st.integers(0, 3), parts=partition_map, user_data=st.one_of(st.none(), st.binary(max_size=8)))
def test_assignment_round_trip_property(version: int, parts: dict[str, list[int]], user_data: bytes | None) -> None:
    assert decode_assignment(encode_assignment(parts, user_data, version)) == Assignment(version, parts, user_data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_else(data: bytes) -> None:
    for decode in (decode_subscription, decode_assignment):
        try:
            decode(data)
        except ProtocolDecodeError:
            pass
