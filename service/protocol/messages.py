"""Compiled message classes and the registry keyed by API key.

Every request/response class is derived from its declarative schema in :mod:`service.protocol.definitions`.
Nested struct classes are reachable as ``compiled(XXX).classes["StructName"]`` or through
``Message.struct("StructName")``.
"""

from __future__ import annotations

from typing import Any

from service.protocol import definitions as S
from service.protocol.dsl import CompiledMessage, MessageSchema, Struct

_BY_NAME: dict[str, CompiledMessage] = {}
REQUESTS: dict[int, CompiledMessage] = {}
RESPONSES: dict[int, CompiledMessage] = {}
DATA: dict[str, CompiledMessage] = {}

for _schema in S.ALL_SCHEMAS:
    _cm = CompiledMessage(_schema)
    _BY_NAME[_schema.name] = _cm
    if _schema.kind == "request":
        REQUESTS[_schema.api_key] = _cm  # type: ignore[index]
    elif _schema.kind == "response":
        RESPONSES[_schema.api_key] = _cm  # type: ignore[index]
    else:
        DATA[_schema.name] = _cm


def compiled(schema_or_name: MessageSchema | str) -> CompiledMessage:
    name = schema_or_name if isinstance(schema_or_name, str) else schema_or_name.name
    return _BY_NAME[name]


def compiled_for(obj: Struct) -> CompiledMessage:
    return _BY_NAME[type(obj).__name__]


def _cls(name: str) -> Any:
    return _BY_NAME[name].cls


class ApiKey:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    # share groups (KIP-932)
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92
    INCREMENTAL_ALTER_CONFIGS = 44  # (share-group configs)
    # the consumer group protocol (KIP-848)
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


ApiVersionsRequest = _cls("ApiVersionsRequest")
ApiVersionsResponse = _cls("ApiVersionsResponse")
MetadataRequest = _cls("MetadataRequest")
MetadataResponse = _cls("MetadataResponse")
FindCoordinatorRequest = _cls("FindCoordinatorRequest")
FindCoordinatorResponse = _cls("FindCoordinatorResponse")
JoinGroupRequest = _cls("JoinGroupRequest")
JoinGroupResponse = _cls("JoinGroupResponse")
SyncGroupRequest = _cls("SyncGroupRequest")
SyncGroupResponse = _cls("SyncGroupResponse")
HeartbeatRequest = _cls("HeartbeatRequest")
HeartbeatResponse = _cls("HeartbeatResponse")
LeaveGroupRequest = _cls("LeaveGroupRequest")
LeaveGroupResponse = _cls("LeaveGroupResponse")
OffsetCommitRequest = _cls("OffsetCommitRequest")
OffsetCommitResponse = _cls("OffsetCommitResponse")
OffsetFetchRequest = _cls("OffsetFetchRequest")
OffsetFetchResponse = _cls("OffsetFetchResponse")
ListOffsetsRequest = _cls("ListOffsetsRequest")
ListOffsetsResponse = _cls("ListOffsetsResponse")
FetchRequest = _cls("FetchRequest")
FetchResponse = _cls("FetchResponse")
DescribeGroupsRequest = _cls("DescribeGroupsRequest")
DescribeGroupsResponse = _cls("DescribeGroupsResponse")
ListGroupsRequest = _cls("ListGroupsRequest")
ListGroupsResponse = _cls("ListGroupsResponse")
SaslHandshakeRequest = _cls("SaslHandshakeRequest")
SaslHandshakeResponse = _cls("SaslHandshakeResponse")
SaslAuthenticateRequest = _cls("SaslAuthenticateRequest")
SaslAuthenticateResponse = _cls("SaslAuthenticateResponse")
ProduceRequest = _cls("ProduceRequest")
ProduceResponse = _cls("ProduceResponse")
InitProducerIdRequest = _cls("InitProducerIdRequest")
InitProducerIdResponse = _cls("InitProducerIdResponse")
CreateTopicsRequest = _cls("CreateTopicsRequest")
CreateTopicsResponse = _cls("CreateTopicsResponse")
DeleteTopicsRequest = _cls("DeleteTopicsRequest")
DeleteTopicsResponse = _cls("DeleteTopicsResponse")
AddPartitionsToTxnRequest = _cls("AddPartitionsToTxnRequest")
AddPartitionsToTxnResponse = _cls("AddPartitionsToTxnResponse")
EndTxnRequest = _cls("EndTxnRequest")
EndTxnResponse = _cls("EndTxnResponse")
TxnOffsetCommitRequest = _cls("TxnOffsetCommitRequest")
TxnOffsetCommitResponse = _cls("TxnOffsetCommitResponse")
DescribeConfigsRequest = _cls("DescribeConfigsRequest")
DescribeConfigsResponse = _cls("DescribeConfigsResponse")
ConsumerProtocolSubscription = _cls("ConsumerProtocolSubscription")
ConsumerProtocolAssignment = _cls("ConsumerProtocolAssignment")
# share groups (KIP-932)
ShareGroupHeartbeatRequest = _cls("ShareGroupHeartbeatRequest")
ShareGroupHeartbeatResponse = _cls("ShareGroupHeartbeatResponse")
ShareGroupDescribeRequest = _cls("ShareGroupDescribeRequest")
ShareGroupDescribeResponse = _cls("ShareGroupDescribeResponse")
ShareFetchRequest = _cls("ShareFetchRequest")
ShareFetchResponse = _cls("ShareFetchResponse")
ShareAcknowledgeRequest = _cls("ShareAcknowledgeRequest")
ShareAcknowledgeResponse = _cls("ShareAcknowledgeResponse")
DescribeShareGroupOffsetsRequest = _cls("DescribeShareGroupOffsetsRequest")
DescribeShareGroupOffsetsResponse = _cls("DescribeShareGroupOffsetsResponse")
AlterShareGroupOffsetsRequest = _cls("AlterShareGroupOffsetsRequest")
AlterShareGroupOffsetsResponse = _cls("AlterShareGroupOffsetsResponse")
DeleteShareGroupOffsetsRequest = _cls("DeleteShareGroupOffsetsRequest")
DeleteShareGroupOffsetsResponse = _cls("DeleteShareGroupOffsetsResponse")
IncrementalAlterConfigsRequest = _cls("IncrementalAlterConfigsRequest")
IncrementalAlterConfigsResponse = _cls("IncrementalAlterConfigsResponse")
# the consumer group protocol (KIP-848)
ConsumerGroupHeartbeatRequest = _cls("ConsumerGroupHeartbeatRequest")
ConsumerGroupHeartbeatResponse = _cls("ConsumerGroupHeartbeatResponse")
ConsumerGroupDescribeRequest = _cls("ConsumerGroupDescribeRequest")
ConsumerGroupDescribeResponse = _cls("ConsumerGroupDescribeResponse")


def struct(message: str, struct_name: str) -> Any:
    """A nested struct class, e.g. ``struct("FetchRequest", "FetchTopic")``."""
    return _BY_NAME[message].classes[struct_name]
