"""The consumer group protocol's messages (ConsumerGroupHeartbeat, ConsumerGroupDescribe): exact bytes.

The property tests (test_roundtrip.py) cover every version of these messages with random values; these pin the
wire layout by hand, in particular the nullable struct (``Assignment`` of the heartbeat answer): one int8
marker, -1 when null, 1 followed by the struct when present.
"""

from __future__ import annotations

import uuid

import pytest

from service.protocol import messages as M
from service.protocol.errors import ProtocolDecodeError

TOPIC_ID = uuid.UUID("0123456789abcdef0123456789abcdef")
HbTopic = M.struct("ConsumerGroupHeartbeatRequest", "TopicPartitions")
HbAssignment = M.struct("ConsumerGroupHeartbeatResponse", "Assignment")
HbAssignedTopic = M.struct("ConsumerGroupHeartbeatResponse", "TopicPartitions")


def _compact_str(s: str) -> bytes:
    raw = s.encode()
    return bytes([len(raw) + 1]) + raw


def test_api_keys() -> None:
    assert M.ApiKey.CONSUMER_GROUP_HEARTBEAT == 68
    assert M.ApiKey.CONSUMER_GROUP_DESCRIBE == 69
    assert M.REQUESTS[68].cls is M.ConsumerGroupHeartbeatRequest
    assert M.RESPONSES[69].cls is M.ConsumerGroupDescribeResponse


def test_heartbeat_request_defaults_mean_unchanged() -> None:
    # Every optional field defaults to "not sent / unchanged since the last heartbeat".
    req = M.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3)
    assert req.instance_id is None and req.rack_id is None and req.server_assignor is None
    assert req.subscribed_topic_names is None and req.subscribed_topic_regex is None
    assert req.topic_partitions is None
    assert req.rebalance_timeout_ms == -1


def test_heartbeat_request_v1_bytes() -> None:
    req = M.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="m", member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout_ms=300000,
        subscribed_topic_names=["t"], subscribed_topic_regex=None, server_assignor="uniform",
        topic_partitions=[HbTopic(topic_id=TOPIC_ID, partitions=[0, 2])],
    )
    expected = (
        _compact_str("g") + _compact_str("m") + (0).to_bytes(4, "big")
        + b"\x00"  # instance id: null
        + b"\x00"  # rack id: null
        + (300000).to_bytes(4, "big")
        + b"\x02" + _compact_str("t")  # one topic name
        + b"\x00"  # regex: null (v1+)
        + _compact_str("uniform")
        + b"\x02" + TOPIC_ID.bytes + b"\x03" + (0).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\x00"
        + b"\x00"  # no tagged fields
    )
    cm = M.compiled("ConsumerGroupHeartbeatRequest")
    assert cm.encode(req, 1) == expected
    assert cm.decode(expected, 1) == req
    # v0 has no regex field: the same request minus that byte.
    v0 = cm.encode(req, 0)
    assert len(v0) == len(expected) - 1


def test_heartbeat_request_v0_has_no_regex() -> None:
    # A field absent in v0 with a non-default value: the codec leaves it out; callers must use v1 for a regex.
    req = M.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=1, subscribed_topic_regex="a.*")
    decoded = M.compiled("ConsumerGroupHeartbeatRequest").decode(
        M.compiled("ConsumerGroupHeartbeatRequest").encode(req, 0), 0)
    assert decoded.subscribed_topic_regex is None


def _response_bytes(assignment: bytes) -> bytes:
    return (
        (0).to_bytes(4, "big")  # throttle
        + (0).to_bytes(2, "big")  # error code
        + b"\x00"  # error message: null
        + _compact_str("member-1")
        + (7).to_bytes(4, "big")  # epoch
        + (5000).to_bytes(4, "big")  # heartbeat interval
        + assignment
        + b"\x00"  # no tagged fields
    )


@pytest.mark.parametrize("version", [0, 1])
def test_heartbeat_response_null_assignment(version: int) -> None:
    raw = _response_bytes(b"\xff")
    resp = M.compiled("ConsumerGroupHeartbeatResponse").decode(raw, version)
    assert resp.assignment is None
    assert (resp.member_id, resp.member_epoch, resp.heartbeat_interval_ms) == ("member-1", 7, 5000)
    assert M.compiled("ConsumerGroupHeartbeatResponse").encode(resp, version) == raw


@pytest.mark.parametrize("version", [0, 1])
def test_heartbeat_response_present_assignment(version: int) -> None:
    assignment = (b"\x01"  # present
                  + b"\x02" + TOPIC_ID.bytes + b"\x02" + (4).to_bytes(4, "big") + b"\x00"
                  + b"\x00")  # the Assignment struct's own (empty) tagged fields
    raw = _response_bytes(assignment)
    resp = M.compiled("ConsumerGroupHeartbeatResponse").decode(raw, version)
    assert resp.assignment == HbAssignment(topic_partitions=[HbAssignedTopic(topic_id=TOPIC_ID, partitions=[4])])
    assert M.compiled("ConsumerGroupHeartbeatResponse").encode(resp, version) == raw
    # An empty assignment is not a null one.
    empty = M.ConsumerGroupHeartbeatResponse(member_id="x", assignment=HbAssignment(topic_partitions=[]))
    back = M.compiled("ConsumerGroupHeartbeatResponse").decode(
        M.compiled("ConsumerGroupHeartbeatResponse").encode(empty, version), version)
    assert back.assignment == HbAssignment(topic_partitions=[])


def test_heartbeat_response_truncated_after_marker() -> None:
    raw = _response_bytes(b"\x01")[:-1]  # present marker, then nothing
    with pytest.raises(ProtocolDecodeError):
        M.compiled("ConsumerGroupHeartbeatResponse").decode(raw, 1)


def test_describe_roundtrip_with_member_type() -> None:
    cm = M.compiled("ConsumerGroupDescribeResponse")
    c = cm.classes
    tp = c["TopicPartitions"](topic_id=TOPIC_ID, topic_name="t", partitions=[0, 1])
    member = c["Member"](member_id="m", instance_id="i", member_epoch=4, client_id="c", client_host="/h",
                         subscribed_topic_names=["t"], assignment=c["Assignment"](topic_partitions=[tp]),
                         target_assignment=c["Assignment"](topic_partitions=[]), member_type=1)
    group = c["DescribedGroup"](group_id="g", group_state="Stable", group_epoch=5, assignment_epoch=5,
                                assignor_name="uniform", members=[member])
    resp = M.ConsumerGroupDescribeResponse(groups=[group])
    assert cm.decode(cm.encode(resp, 1), 1) == resp
    v0 = cm.decode(cm.encode(resp, 0), 0)
    assert v0.groups[0].members[0].member_type == -1  # absent in v0: the default
    assert v0.groups[0].authorized_operations == -2147483648
