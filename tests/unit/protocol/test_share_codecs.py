"""The share-group codecs (KIP-932) beyond the generic round trips of test_roundtrip.py.

kafka-python has no share-group messages, so test_crosscheck.py cannot compare them; the bytes below were written
by the kafka-clients 4.4.0 jar's own generated message classes (once, by hand) and are pinned here, in particular
the nullable struct (an int8 marker: -1 for null, 1 before the struct), which no older message we speak has.
"""

from __future__ import annotations

import uuid

import pytest

from service.protocol import messages as M
from service.protocol.errors import ProtocolDecodeError

HB_RESP = M.compiled("ShareGroupHeartbeatResponse")
Assignment = M.struct("ShareGroupHeartbeatResponse", "Assignment")
TopicPartitions = M.struct("ShareGroupHeartbeatResponse", "TopicPartitions")
TOPIC = uuid.UUID(int=(1 << 64) + 2)

# ShareGroupHeartbeatResponseData(memberId="m", memberEpoch=3, heartbeatIntervalMs=5000, assignment=...) v1
JAVA_WITH_ASSIGNMENT = bytes.fromhex(
    "00000000000000026d0000000300001388010200000000000000010000000000000002030000000000000001000000")
JAVA_NULL_ASSIGNMENT = bytes.fromhex("00000000000000026d0000000300001388ff00")


def _hb(assignment: object) -> object:
    return M.ShareGroupHeartbeatResponse(member_id="m", member_epoch=3, heartbeat_interval_ms=5000,
                                         assignment=assignment)


def test_nullable_struct_matches_the_java_bytes() -> None:
    present = _hb(Assignment(topic_partitions=[TopicPartitions(topic_id=TOPIC, partitions=[0, 1])]))
    assert HB_RESP.encode(present, 1) == JAVA_WITH_ASSIGNMENT
    assert HB_RESP.decode(JAVA_WITH_ASSIGNMENT, 1) == present
    absent = _hb(None)
    assert HB_RESP.encode(absent, 1) == JAVA_NULL_ASSIGNMENT
    decoded = HB_RESP.decode(JAVA_NULL_ASSIGNMENT, 1)
    assert decoded == absent and decoded.assignment is None


def test_nullable_struct_defaults_to_null_and_truncation_is_refused() -> None:
    assert M.ShareGroupHeartbeatResponse().assignment is None
    with pytest.raises(ProtocolDecodeError):
        HB_RESP.decode(JAVA_WITH_ASSIGNMENT[:-8], 1)
    with pytest.raises(ProtocolDecodeError):
        HB_RESP.decode(JAVA_NULL_ASSIGNMENT[:-2], 1)


def test_a_non_nullable_struct_stays_a_fresh_struct() -> None:
    # ShareGroupDescribe's member assignment is not nullable: it defaults to an empty struct, as before.
    member = M.struct("ShareGroupDescribeResponse", "Member")()
    assert member.assignment is not None and member.assignment.topic_partitions == []


def test_share_fetch_request_defaults_follow_kafka() -> None:
    req = M.ShareFetchRequest()
    assert req.max_bytes == 0x7FFFFFFF
    assert req.group_id is None and req.share_acquire_mode == 0 and req.is_renew_ack is False


@pytest.mark.parametrize("version", [1, 2])
def test_share_fetch_round_trip_with_acknowledgements(version: int) -> None:
    cm = M.compiled("ShareFetchRequest")
    topic = M.struct("ShareFetchRequest", "FetchTopic")
    part = M.struct("ShareFetchRequest", "FetchPartition")
    batch = M.struct("ShareFetchRequest", "AcknowledgementBatch")
    forgotten = M.struct("ShareFetchRequest", "ForgottenTopic")
    req = M.ShareFetchRequest(
        group_id="g", member_id="m", share_session_epoch=7, max_wait_ms=500, min_bytes=1, max_records=500,
        batch_size=500, is_renew_ack=version >= 2,
        topics=[topic(topic_id=TOPIC, partitions=[part(partition_index=1, acknowledgement_batches=[
            batch(first_offset=10, last_offset=12, acknowledge_types=[1, 0, 3])])])],
        forgotten_topics_data=[forgotten(topic_id=TOPIC, partitions=[0])])
    assert cm.decode(cm.encode(req, version), version) == req


def test_share_api_keys() -> None:
    assert (M.ApiKey.SHARE_GROUP_HEARTBEAT, M.ApiKey.SHARE_GROUP_DESCRIBE) == (76, 77)
    assert (M.ApiKey.SHARE_FETCH, M.ApiKey.SHARE_ACKNOWLEDGE) == (78, 79)
    assert (M.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, M.ApiKey.ALTER_SHARE_GROUP_OFFSETS,
            M.ApiKey.DELETE_SHARE_GROUP_OFFSETS) == (90, 91, 92)
    assert M.ApiKey.INCREMENTAL_ALTER_CONFIGS == 44
    for key in (44, 76, 77, 78, 79, 90, 91, 92):
        assert key in M.REQUESTS and key in M.RESPONSES
