"""Declarative definitions of the Kafka messages this gateway speaks (one per message).

Generated once by tools/gen_protocol.py from Apache Kafka's wire facts, then maintained here;
tests/unit/protocol/test_conformance.py checks every field of every implemented version against Kafka's
JSON schemas. Field names are snake_case forms of Kafka's names.
"""

from service.protocol.definitions_groups import GROUP_PROTOCOL_SCHEMAS
from service.protocol.dsl import F, MessageSchema

API_VERSIONS_REQUEST = MessageSchema(
    'ApiVersionsRequest', api_key=18, kind='request', versions=(0, 4), flexible='3+', fields=(
    F('client_software_name', 'string', '3+', ignorable=True),
    F('client_software_version', 'string', '3+', ignorable=True),
))

API_VERSIONS_RESPONSE = MessageSchema(
    'ApiVersionsResponse', api_key=18, kind='response', versions=(0, 4), flexible='3+', fields=(
    F('error_code', 'int16', '0+'),
    F('api_keys', '[]ApiVersion', '0+', fields=(
        F('api_key', 'int16', '0+'),
        F('min_version', 'int16', '0+'),
        F('max_version', 'int16', '0+'),
    )),
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('supported_features', '[]SupportedFeatureKey', '3+', tag=0, tagged='3+', ignorable=True, fields=(
        F('name', 'string', '3+'),
        F('min_version', 'int16', '3+'),
        F('max_version', 'int16', '3+'),
    )),
    F('finalized_features_epoch', 'int64', '3+', tag=1, tagged='3+', default='-1', ignorable=True),
    F('finalized_features', '[]FinalizedFeatureKey', '3+', tag=2, tagged='3+', ignorable=True, fields=(
        F('name', 'string', '3+'),
        F('max_version_level', 'int16', '3+'),
        F('min_version_level', 'int16', '3+'),
    )),
    F('zk_migration_ready', 'bool', '3+', tag=3, tagged='3+', default='false', ignorable=True),
))

METADATA_REQUEST = MessageSchema('MetadataRequest', api_key=3, kind='request', versions=(1, 12), flexible='9+', fields=(
    F('topics', '[]MetadataRequestTopic', '0+', nullable='1+', fields=(
        F('topic_id', 'uuid', '10+', ignorable=True),
        F('name', 'string', '0+', nullable='10+'),
    )),
    F('allow_auto_topic_creation', 'bool', '4+', default='true'),
    F('include_cluster_authorized_operations', 'bool', '8-10'),
    F('include_topic_authorized_operations', 'bool', '8+'),
))

METADATA_RESPONSE = MessageSchema(
    'MetadataResponse', api_key=3, kind='response', versions=(1, 12), flexible='9+', fields=(
    F('throttle_time_ms', 'int32', '3+', ignorable=True),
    F('brokers', '[]MetadataResponseBroker', '0+', fields=(
        F('node_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '1+', nullable='1+', default='null', ignorable=True),
    )),
    F('cluster_id', 'string', '2+', nullable='2+', default='null', ignorable=True),
    F('controller_id', 'int32', '1+', default='-1', ignorable=True),
    F('topics', '[]MetadataResponseTopic', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('name', 'string', '0+', nullable='12+'),
        F('topic_id', 'uuid', '10+', ignorable=True),
        F('is_internal', 'bool', '1+', default='false', ignorable=True),
        F('partitions', '[]MetadataResponsePartition', '0+', fields=(
            F('error_code', 'int16', '0+'),
            F('partition_index', 'int32', '0+'),
            F('leader_id', 'int32', '0+'),
            F('leader_epoch', 'int32', '7+', default='-1', ignorable=True),
            F('replica_nodes', '[]int32', '0+'),
            F('isr_nodes', '[]int32', '0+'),
            F('offline_replicas', '[]int32', '5+', ignorable=True),
        )),
        F('topic_authorized_operations', 'int32', '8+', default='-2147483648'),
    )),
    F('cluster_authorized_operations', 'int32', '8-10', default='-2147483648'),
))

FIND_COORDINATOR_REQUEST = MessageSchema(
    'FindCoordinatorRequest', api_key=10, kind='request', versions=(0, 6), flexible='3+', fields=(
    F('key', 'string', '0-3'),
    F('key_type', 'int8', '1+', default='0'),
    F('coordinator_keys', '[]string', '4+'),
))

FIND_COORDINATOR_RESPONSE = MessageSchema(
    'FindCoordinatorResponse', api_key=10, kind='response', versions=(0, 6), flexible='3+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '0-3'),
    F('error_message', 'string', '1-3', nullable='1-3', ignorable=True),
    F('node_id', 'int32', '0-3'),
    F('host', 'string', '0-3'),
    F('port', 'int32', '0-3'),
    F('coordinators', '[]Coordinator', '4+', fields=(
        F('key', 'string', '4+'),
        F('node_id', 'int32', '4+'),
        F('host', 'string', '4+'),
        F('port', 'int32', '4+'),
        F('error_code', 'int16', '4+'),
        F('error_message', 'string', '4+', nullable='4+', ignorable=True),
    )),
))

JOIN_GROUP_REQUEST = MessageSchema(
    'JoinGroupRequest', api_key=11, kind='request', versions=(0, 9), flexible='6+', fields=(
    F('group_id', 'string', '0+'),
    F('session_timeout_ms', 'int32', '0+'),
    F('rebalance_timeout_ms', 'int32', '1+', default='-1', ignorable=True),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '5+', nullable='5+', default='null'),
    F('protocol_type', 'string', '0+'),
    F('protocols', '[]JoinGroupRequestProtocol', '0+', fields=(
        F('name', 'string', '0+'),
        F('metadata', 'bytes', '0+'),
    )),
    F('reason', 'string', '8+', nullable='8+', default='null', ignorable=True),
))

JOIN_GROUP_RESPONSE = MessageSchema(
    'JoinGroupResponse', api_key=11, kind='response', versions=(0, 9), flexible='6+', fields=(
    F('throttle_time_ms', 'int32', '2+', ignorable=True),
    F('error_code', 'int16', '0+'),
    F('generation_id', 'int32', '0+', default='-1'),
    F('protocol_type', 'string', '7+', nullable='7+', default='null', ignorable=True),
    F('protocol_name', 'string', '0+', nullable='7+'),
    F('leader', 'string', '0+'),
    F('skip_assignment', 'bool', '9+', default='false'),
    F('member_id', 'string', '0+'),
    F('members', '[]JoinGroupResponseMember', '0+', fields=(
        F('member_id', 'string', '0+'),
        F('group_instance_id', 'string', '5+', nullable='5+', default='null', ignorable=True),
        F('metadata', 'bytes', '0+'),
    )),
))

SYNC_GROUP_REQUEST = MessageSchema(
    'SyncGroupRequest', api_key=14, kind='request', versions=(0, 5), flexible='4+', fields=(
    F('group_id', 'string', '0+'),
    F('generation_id', 'int32', '0+'),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '3+', nullable='3+', default='null'),
    F('protocol_type', 'string', '5+', nullable='5+', default='null', ignorable=True),
    F('protocol_name', 'string', '5+', nullable='5+', default='null', ignorable=True),
    F('assignments', '[]SyncGroupRequestAssignment', '0+', fields=(
        F('member_id', 'string', '0+'),
        F('assignment', 'bytes', '0+'),
    )),
))

SYNC_GROUP_RESPONSE = MessageSchema(
    'SyncGroupResponse', api_key=14, kind='response', versions=(0, 5), flexible='4+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '0+'),
    F('protocol_type', 'string', '5+', nullable='5+', default='null', ignorable=True),
    F('protocol_name', 'string', '5+', nullable='5+', default='null', ignorable=True),
    F('assignment', 'bytes', '0+'),
))

HEARTBEAT_REQUEST = MessageSchema(
    'HeartbeatRequest', api_key=12, kind='request', versions=(0, 4), flexible='4+', fields=(
    F('group_id', 'string', '0+'),
    F('generation_id', 'int32', '0+'),
    F('member_id', 'string', '0+'),
    F('group_instance_id', 'string', '3+', nullable='3+', default='null'),
))

HEARTBEAT_RESPONSE = MessageSchema(
    'HeartbeatResponse', api_key=12, kind='response', versions=(0, 4), flexible='4+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '0+'),
))

LEAVE_GROUP_REQUEST = MessageSchema(
    'LeaveGroupRequest', api_key=13, kind='request', versions=(0, 5), flexible='4+', fields=(
    F('group_id', 'string', '0+'),
    F('member_id', 'string', '0-2'),
    F('members', '[]MemberIdentity', '3+', fields=(
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', nullable='3+', default='null'),
        F('reason', 'string', '5+', nullable='5+', default='null', ignorable=True),
    )),
))

LEAVE_GROUP_RESPONSE = MessageSchema(
    'LeaveGroupResponse', api_key=13, kind='response', versions=(0, 5), flexible='4+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '0+'),
    F('members', '[]MemberResponse', '3+', fields=(
        F('member_id', 'string', '3+'),
        F('group_instance_id', 'string', '3+', nullable='3+'),
        F('error_code', 'int16', '3+'),
    )),
))

OFFSET_COMMIT_REQUEST = MessageSchema(
    'OffsetCommitRequest', api_key=8, kind='request', versions=(2, 9), flexible='8+', fields=(
    F('group_id', 'string', '0+'),
    F('generation_id_or_member_epoch', 'int32', '1+', default='-1', ignorable=True),
    F('member_id', 'string', '1+', ignorable=True),
    F('group_instance_id', 'string', '7+', nullable='7+', default='null'),
    F('retention_time_ms', 'int64', '2-4', default='-1', ignorable=True),
    F('topics', '[]OffsetCommitRequestTopic', '0+', fields=(
        F('name', 'string', '0-9', ignorable=True),
        F('partitions', '[]OffsetCommitRequestPartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('committed_offset', 'int64', '0+'),
            F('committed_leader_epoch', 'int32', '6+', default='-1', ignorable=True),
            F('committed_metadata', 'string', '0+', nullable='0+'),
        )),
    )),
))

OFFSET_COMMIT_RESPONSE = MessageSchema(
    'OffsetCommitResponse', api_key=8, kind='response', versions=(2, 9), flexible='8+', fields=(
    F('throttle_time_ms', 'int32', '3+', ignorable=True),
    F('topics', '[]OffsetCommitResponseTopic', '0+', fields=(
        F('name', 'string', '0-9', ignorable=True),
        F('partitions', '[]OffsetCommitResponsePartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
        )),
    )),
))

OFFSET_FETCH_REQUEST = MessageSchema(
    'OffsetFetchRequest', api_key=9, kind='request', versions=(1, 9), flexible='6+', fields=(
    F('group_id', 'string', '0-7'),
    F('topics', '[]OffsetFetchRequestTopic', '0-7', nullable='2-7', fields=(
        F('name', 'string', '0-7'),
        F('partition_indexes', '[]int32', '0-7'),
    )),
    F('groups', '[]OffsetFetchRequestGroup', '8+', fields=(
        F('group_id', 'string', '8+'),
        F('member_id', 'string', '9+', nullable='9+', default='null', ignorable=True),
        F('member_epoch', 'int32', '9+', default='-1', ignorable=True),
        F('topics', '[]OffsetFetchRequestTopics', '8+', nullable='8+', fields=(
            F('name', 'string', '8-9', ignorable=True),
            F('partition_indexes', '[]int32', '8+'),
        )),
    )),
    F('require_stable', 'bool', '7+', default='false'),
))

OFFSET_FETCH_RESPONSE = MessageSchema(
    'OffsetFetchResponse', api_key=9, kind='response', versions=(1, 9), flexible='6+', fields=(
    F('throttle_time_ms', 'int32', '3+', ignorable=True),
    F('topics', '[]OffsetFetchResponseTopic', '0-7', fields=(
        F('name', 'string', '0-7'),
        F('partitions', '[]OffsetFetchResponsePartition', '0-7', fields=(
            F('partition_index', 'int32', '0-7'),
            F('committed_offset', 'int64', '0-7'),
            F('committed_leader_epoch', 'int32', '5-7', default='-1', ignorable=True),
            F('metadata', 'string', '0-7', nullable='0-7'),
            F('error_code', 'int16', '0-7'),
        )),
    )),
    F('error_code', 'int16', '2-7', default='0', ignorable=True),
    F('groups', '[]OffsetFetchResponseGroup', '8+', fields=(
        F('group_id', 'string', '8+'),
        F('topics', '[]OffsetFetchResponseTopics', '8+', fields=(
            F('name', 'string', '8-9', ignorable=True),
            F('partitions', '[]OffsetFetchResponsePartitions', '8+', fields=(
                F('partition_index', 'int32', '8+'),
                F('committed_offset', 'int64', '8+'),
                F('committed_leader_epoch', 'int32', '8+', default='-1', ignorable=True),
                F('metadata', 'string', '8+', nullable='8+'),
                F('error_code', 'int16', '8+'),
            )),
        )),
        F('error_code', 'int16', '8+', default='0'),
    )),
))

LIST_OFFSETS_REQUEST = MessageSchema(
    'ListOffsetsRequest', api_key=2, kind='request', versions=(1, 9), flexible='6+', fields=(
    F('replica_id', 'int32', '0+'),
    F('isolation_level', 'int8', '2+'),
    F('topics', '[]ListOffsetsTopic', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]ListOffsetsPartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '4+', default='-1', ignorable=True),
            F('timestamp', 'int64', '0+'),
        )),
    )),
))

LIST_OFFSETS_RESPONSE = MessageSchema(
    'ListOffsetsResponse', api_key=2, kind='response', versions=(1, 9), flexible='6+', fields=(
    F('throttle_time_ms', 'int32', '2+', ignorable=True),
    F('topics', '[]ListOffsetsTopicResponse', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]ListOffsetsPartitionResponse', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('timestamp', 'int64', '1+', default='-1'),
            F('offset', 'int64', '1+', default='-1'),
            F('leader_epoch', 'int32', '4+', default='-1'),
        )),
    )),
))

FETCH_REQUEST = MessageSchema('FetchRequest', api_key=1, kind='request', versions=(4, 17), flexible='12+', fields=(
    F('cluster_id', 'string', '12+', nullable='12+', tag=0, tagged='12+', default='null', ignorable=True),
    F('replica_id', 'int32', '0-14', default='-1'),
    F('replica_state', 'ReplicaState', '15+', tag=1, tagged='15+', fields=(
        F('replica_id', 'int32', '15+', default='-1'),
        F('replica_epoch', 'int64', '15+', default='-1'),
    )),
    F('max_wait_ms', 'int32', '0+'),
    F('min_bytes', 'int32', '0+'),
    F('max_bytes', 'int32', '3+', default='0x7fffffff', ignorable=True),
    F('isolation_level', 'int8', '4+', default='0', ignorable=True),
    F('session_id', 'int32', '7+', default='0', ignorable=True),
    F('session_epoch', 'int32', '7+', default='-1', ignorable=True),
    F('topics', '[]FetchTopic', '0+', fields=(
        F('topic', 'string', '0-12', ignorable=True),
        F('topic_id', 'uuid', '13+', ignorable=True),
        F('partitions', '[]FetchPartition', '0+', fields=(
            F('partition', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '9+', default='-1', ignorable=True),
            F('fetch_offset', 'int64', '0+'),
            F('last_fetched_epoch', 'int32', '12+', default='-1'),
            F('log_start_offset', 'int64', '5+', default='-1', ignorable=True),
            F('partition_max_bytes', 'int32', '0+'),
            F('replica_directory_id', 'uuid', '17+', tag=0, tagged='17+', ignorable=True),
        )),
    )),
    F('forgotten_topics_data', '[]ForgottenTopic', '7+', fields=(
        F('topic', 'string', '7-12', ignorable=True),
        F('topic_id', 'uuid', '13+', ignorable=True),
        F('partitions', '[]int32', '7+'),
    )),
    F('rack_id', 'string', '11+', default='', ignorable=True),
))

FETCH_RESPONSE = MessageSchema('FetchResponse', api_key=1, kind='response', versions=(4, 17), flexible='12+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '7+', ignorable=True),
    F('session_id', 'int32', '7+', default='0'),
    F('responses', '[]FetchableTopicResponse', '0+', fields=(
        F('topic', 'string', '0-12', ignorable=True),
        F('topic_id', 'uuid', '13+', ignorable=True),
        F('partitions', '[]PartitionData', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('high_watermark', 'int64', '0+'),
            F('last_stable_offset', 'int64', '4+', default='-1', ignorable=True),
            F('log_start_offset', 'int64', '5+', default='-1', ignorable=True),
            F('diverging_epoch', 'EpochEndOffset', '12+', tag=0, tagged='12+', fields=(
                F('epoch', 'int32', '12+', default='-1'),
                F('end_offset', 'int64', '12+', default='-1'),
            )),
            F('current_leader', 'LeaderIdAndEpoch', '12+', tag=1, tagged='12+', fields=(
                F('leader_id', 'int32', '12+', default='-1'),
                F('leader_epoch', 'int32', '12+', default='-1'),
            )),
            F('snapshot_id', 'SnapshotId', '12+', tag=2, tagged='12+', fields=(
                F('end_offset', 'int64', '0+', default='-1'),
                F('epoch', 'int32', '0+', default='-1'),
            )),
            F('aborted_transactions', '[]AbortedTransaction', '4+', nullable='4+', ignorable=True, fields=(
                F('producer_id', 'int64', '4+'),
                F('first_offset', 'int64', '4+'),
            )),
            F('preferred_read_replica', 'int32', '11+', default='-1'),
            F('records', 'records', '0+', nullable='0+'),
        )),
    )),
    F('node_endpoints', '[]NodeEndpoint', '16+', tag=0, tagged='16+', fields=(
        F('node_id', 'int32', '16+'),
        F('host', 'string', '16+'),
        F('port', 'int32', '16+'),
        F('rack', 'string', '16+', nullable='16+', default='null'),
    )),
))

DESCRIBE_GROUPS_REQUEST = MessageSchema(
    'DescribeGroupsRequest', api_key=15, kind='request', versions=(0, 5), flexible='5+', fields=(
    F('groups', '[]string', '0+'),
    F('include_authorized_operations', 'bool', '3+'),
))

DESCRIBE_GROUPS_RESPONSE = MessageSchema(
    'DescribeGroupsResponse', api_key=15, kind='response', versions=(0, 5), flexible='5+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('groups', '[]DescribedGroup', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('group_id', 'string', '0+'),
        F('group_state', 'string', '0+'),
        F('protocol_type', 'string', '0+'),
        F('protocol_data', 'string', '0+'),
        F('members', '[]DescribedGroupMember', '0+', fields=(
            F('member_id', 'string', '0+'),
            F('group_instance_id', 'string', '4+', nullable='4+', default='null', ignorable=True),
            F('client_id', 'string', '0+'),
            F('client_host', 'string', '0+'),
            F('member_metadata', 'bytes', '0+'),
            F('member_assignment', 'bytes', '0+'),
        )),
        F('authorized_operations', 'int32', '3+', default='-2147483648'),
    )),
))

LIST_GROUPS_REQUEST = MessageSchema(
    'ListGroupsRequest', api_key=16, kind='request', versions=(0, 5), flexible='3+', fields=(
    F('states_filter', '[]string', '4+'),
    F('types_filter', '[]string', '5+'),
))

LIST_GROUPS_RESPONSE = MessageSchema(
    'ListGroupsResponse', api_key=16, kind='response', versions=(0, 5), flexible='3+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('error_code', 'int16', '0+'),
    F('groups', '[]ListedGroup', '0+', fields=(
        F('group_id', 'string', '0+'),
        F('protocol_type', 'string', '0+'),
        F('group_state', 'string', '4+', ignorable=True),
        F('group_type', 'string', '5+', ignorable=True),
    )),
))

SASL_HANDSHAKE_REQUEST = MessageSchema(
    'SaslHandshakeRequest', api_key=17, kind='request', versions=(0, 1), flexible='none', fields=(
    F('mechanism', 'string', '0+'),
))

SASL_HANDSHAKE_RESPONSE = MessageSchema(
    'SaslHandshakeResponse', api_key=17, kind='response', versions=(0, 1), flexible='none', fields=(
    F('error_code', 'int16', '0+'),
    F('mechanisms', '[]string', '0+'),
))

SASL_AUTHENTICATE_REQUEST = MessageSchema(
    'SaslAuthenticateRequest', api_key=36, kind='request', versions=(0, 2), flexible='2+', fields=(
    F('auth_bytes', 'bytes', '0+'),
))

SASL_AUTHENTICATE_RESPONSE = MessageSchema(
    'SaslAuthenticateResponse', api_key=36, kind='response', versions=(0, 2), flexible='2+', fields=(
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+'),
    F('auth_bytes', 'bytes', '0+'),
    F('session_lifetime_ms', 'int64', '1+', default='0', ignorable=True),
))

PRODUCE_REQUEST = MessageSchema('ProduceRequest', api_key=0, kind='request', versions=(3, 11), flexible='9+', fields=(
    F('transactional_id', 'string', '3+', nullable='3+', default='null'),
    F('acks', 'int16', '0+'),
    F('timeout_ms', 'int32', '0+'),
    F('topic_data', '[]TopicProduceData', '0+', fields=(
        F('name', 'string', '0-12', ignorable=True),
        F('partition_data', '[]PartitionProduceData', '0+', fields=(
            F('index', 'int32', '0+'),
            F('records', 'records', '0+', nullable='0+'),
        )),
    )),
))

PRODUCE_RESPONSE = MessageSchema(
    'ProduceResponse', api_key=0, kind='response', versions=(3, 11), flexible='9+', fields=(
    F('responses', '[]TopicProduceResponse', '0+', fields=(
        F('name', 'string', '0-12', ignorable=True),
        F('partition_responses', '[]PartitionProduceResponse', '0+', fields=(
            F('index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('base_offset', 'int64', '0+'),
            F('log_append_time_ms', 'int64', '2+', default='-1', ignorable=True),
            F('log_start_offset', 'int64', '5+', default='-1', ignorable=True),
            F('record_errors', '[]BatchIndexAndErrorMessage', '8+', ignorable=True, fields=(
                F('batch_index', 'int32', '8+'),
                F('batch_index_error_message', 'string', '8+', nullable='8+', default='null'),
            )),
            F('error_message', 'string', '8+', nullable='8+', default='null', ignorable=True),
            F('current_leader', 'LeaderIdAndEpoch', '10+', tag=0, tagged='10+', fields=(
                F('leader_id', 'int32', '10+', default='-1'),
                F('leader_epoch', 'int32', '10+', default='-1'),
            )),
        )),
    )),
    F('throttle_time_ms', 'int32', '1+', default='0', ignorable=True),
    F('node_endpoints', '[]NodeEndpoint', '10+', tag=0, tagged='10+', fields=(
        F('node_id', 'int32', '10+'),
        F('host', 'string', '10+'),
        F('port', 'int32', '10+'),
        F('rack', 'string', '10+', nullable='10+', default='null'),
    )),
))

INIT_PRODUCER_ID_REQUEST = MessageSchema(
    'InitProducerIdRequest', api_key=22, kind='request', versions=(0, 5), flexible='2+', fields=(
    F('transactional_id', 'string', '0+', nullable='0+'),
    F('transaction_timeout_ms', 'int32', '0+'),
    F('producer_id', 'int64', '3+', default='-1'),
    F('producer_epoch', 'int16', '3+', default='-1'),
))

INIT_PRODUCER_ID_RESPONSE = MessageSchema(
    'InitProducerIdResponse', api_key=22, kind='response', versions=(0, 5), flexible='2+', fields=(
    F('throttle_time_ms', 'int32', '0+', ignorable=True),
    F('error_code', 'int16', '0+'),
    F('producer_id', 'int64', '0+', default=-1),
    F('producer_epoch', 'int16', '0+'),
))

CREATE_TOPICS_REQUEST = MessageSchema(
    'CreateTopicsRequest', api_key=19, kind='request', versions=(2, 7), flexible='5+', fields=(
    F('topics', '[]CreatableTopic', '0+', fields=(
        F('name', 'string', '0+'),
        F('num_partitions', 'int32', '0+'),
        F('replication_factor', 'int16', '0+'),
        F('assignments', '[]CreatableReplicaAssignment', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('broker_ids', '[]int32', '0+'),
        )),
        F('configs', '[]CreatableTopicConfig', '0+', fields=(
            F('name', 'string', '0+'),
            F('value', 'string', '0+', nullable='0+'),
        )),
    )),
    F('timeout_ms', 'int32', '0+', default='60000'),
    F('validate_only', 'bool', '1+', default='false'),
))

CREATE_TOPICS_RESPONSE = MessageSchema(
    'CreateTopicsResponse', api_key=19, kind='response', versions=(2, 7), flexible='5+', fields=(
    F('throttle_time_ms', 'int32', '2+', ignorable=True),
    F('topics', '[]CreatableTopicResult', '0+', fields=(
        F('name', 'string', '0+'),
        F('topic_id', 'uuid', '7+', ignorable=True),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '1+', nullable='0+', ignorable=True),
        F('topic_config_error_code', 'int16', '5+', tag=0, tagged='5+', ignorable=True),
        F('num_partitions', 'int32', '5+', default='-1', ignorable=True),
        F('replication_factor', 'int16', '5+', default='-1', ignorable=True),
        F('configs', '[]CreatableTopicConfigs', '5+', nullable='5+', ignorable=True, fields=(
            F('name', 'string', '5+'),
            F('value', 'string', '5+', nullable='5+'),
            F('read_only', 'bool', '5+'),
            F('config_source', 'int8', '5+', default='-1', ignorable=True),
            F('is_sensitive', 'bool', '5+'),
        )),
    )),
))

DELETE_TOPICS_REQUEST = MessageSchema(
    'DeleteTopicsRequest', api_key=20, kind='request', versions=(1, 6), flexible='4+', fields=(
    F('topics', '[]DeleteTopicState', '6+', fields=(
        F('name', 'string', '6+', nullable='6+', default='null'),
        F('topic_id', 'uuid', '6+'),
    )),
    F('topic_names', '[]string', '0-5', ignorable=True),
    F('timeout_ms', 'int32', '0+'),
))

DELETE_TOPICS_RESPONSE = MessageSchema(
    'DeleteTopicsResponse', api_key=20, kind='response', versions=(1, 6), flexible='4+', fields=(
    F('throttle_time_ms', 'int32', '1+', ignorable=True),
    F('responses', '[]DeletableTopicResult', '0+', fields=(
        F('name', 'string', '0+', nullable='6+'),
        F('topic_id', 'uuid', '6+', ignorable=True),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '5+', nullable='5+', default='null', ignorable=True),
    )),
))

ADD_PARTITIONS_TO_TXN_REQUEST = MessageSchema(
    'AddPartitionsToTxnRequest', api_key=24, kind='request', versions=(0, 3), flexible='3+', fields=(
    F('v3_and_below_transactional_id', 'string', '0-3'),
    F('v3_and_below_producer_id', 'int64', '0-3'),
    F('v3_and_below_producer_epoch', 'int16', '0-3'),
    F('v3_and_below_topics', '[]AddPartitionsToTxnTopic', '0-3', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]int32', '0+'),
    )),
))

ADD_PARTITIONS_TO_TXN_RESPONSE = MessageSchema(
    'AddPartitionsToTxnResponse', api_key=24, kind='response', versions=(0, 3), flexible='3+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('results_by_topic_v3_and_below', '[]AddPartitionsToTxnTopicResult', '0-3', fields=(
        F('name', 'string', '0+'),
        F('results_by_partition', '[]AddPartitionsToTxnPartitionResult', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('partition_error_code', 'int16', '0+'),
        )),
    )),
))

END_TXN_REQUEST = MessageSchema('EndTxnRequest', api_key=26, kind='request', versions=(0, 3), flexible='3+', fields=(
    F('transactional_id', 'string', '0+'),
    F('producer_id', 'int64', '0+'),
    F('producer_epoch', 'int16', '0+'),
    F('committed', 'bool', '0+'),
))

END_TXN_RESPONSE = MessageSchema('EndTxnResponse', api_key=26, kind='response', versions=(0, 3), flexible='3+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
))

TXN_OFFSET_COMMIT_REQUEST = MessageSchema(
    'TxnOffsetCommitRequest', api_key=28, kind='request', versions=(0, 3), flexible='3+', fields=(
    F('transactional_id', 'string', '0+'),
    F('group_id', 'string', '0+'),
    F('producer_id', 'int64', '0+'),
    F('producer_epoch', 'int16', '0+'),
    F('generation_id', 'int32', '3+', default='-1'),
    F('member_id', 'string', '3+', default=''),
    F('group_instance_id', 'string', '3+', nullable='3+', default='null'),
    F('topics', '[]TxnOffsetCommitRequestTopic', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]TxnOffsetCommitRequestPartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('committed_offset', 'int64', '0+'),
            F('committed_leader_epoch', 'int32', '2+', default='-1', ignorable=True),
            F('committed_metadata', 'string', '0+', nullable='0+'),
        )),
    )),
))

TXN_OFFSET_COMMIT_RESPONSE = MessageSchema(
    'TxnOffsetCommitResponse', api_key=28, kind='response', versions=(0, 3), flexible='3+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('topics', '[]TxnOffsetCommitResponseTopic', '0+', fields=(
        F('name', 'string', '0+'),
        F('partitions', '[]TxnOffsetCommitResponsePartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
        )),
    )),
))

DESCRIBE_CONFIGS_REQUEST = MessageSchema(
    'DescribeConfigsRequest', api_key=32, kind='request', versions=(1, 4), flexible='4+', fields=(
    F('resources', '[]DescribeConfigsResource', '0+', fields=(
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
        F('configuration_keys', '[]string', '0+', nullable='0+'),
    )),
    F('include_synonyms', 'bool', '1+', default='false'),
    F('include_documentation', 'bool', '3+', default='false'),
))

DESCRIBE_CONFIGS_RESPONSE = MessageSchema(
    'DescribeConfigsResponse', api_key=32, kind='response', versions=(1, 4), flexible='4+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('results', '[]DescribeConfigsResult', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
        F('configs', '[]DescribeConfigsResourceResult', '0+', fields=(
            F('name', 'string', '0+'),
            F('value', 'string', '0+', nullable='0+'),
            F('read_only', 'bool', '0+'),
            F('config_source', 'int8', '1+', default='-1', ignorable=True),
            F('is_sensitive', 'bool', '0+'),
            F('synonyms', '[]DescribeConfigsSynonym', '1+', ignorable=True, fields=(
                F('name', 'string', '1+'),
                F('value', 'string', '1+', nullable='0+'),
                F('source', 'int8', '1+'),
            )),
            F('config_type', 'int8', '3+', default='0', ignorable=True),
            F('documentation', 'string', '3+', nullable='0+', ignorable=True),
        )),
    )),
))

CONSUMER_PROTOCOL_SUBSCRIPTION = MessageSchema(
    'ConsumerProtocolSubscription', api_key=None, kind='data', versions=(0, 3), flexible='none', fields=(
    F('topics', '[]string', '0+'),
    F('user_data', 'bytes', '0+', nullable='0+', default='null'),
    F('owned_partitions', '[]TopicPartition', '1+', ignorable=True, fields=(
        F('topic', 'string', '1+'),
        F('partitions', '[]int32', '1+'),
    )),
    F('generation_id', 'int32', '2+', default='-1', ignorable=True),
    F('rack_id', 'string', '3+', nullable='3+', default='null', ignorable=True),
))

CONSUMER_PROTOCOL_ASSIGNMENT = MessageSchema(
    'ConsumerProtocolAssignment', api_key=None, kind='data', versions=(0, 3), flexible='none', fields=(
    F('assigned_partitions', '[]TopicPartition', '0+', fields=(
        F('topic', 'string', '0+'),
        F('partitions', '[]int32', '0+'),
    )),
    F('user_data', 'bytes', '0+', nullable='0+', default='null'),
))

ALL_SCHEMAS = (
    API_VERSIONS_REQUEST,
    API_VERSIONS_RESPONSE,
    METADATA_REQUEST,
    METADATA_RESPONSE,
    FIND_COORDINATOR_REQUEST,
    FIND_COORDINATOR_RESPONSE,
    JOIN_GROUP_REQUEST,
    JOIN_GROUP_RESPONSE,
    SYNC_GROUP_REQUEST,
    SYNC_GROUP_RESPONSE,
    HEARTBEAT_REQUEST,
    HEARTBEAT_RESPONSE,
    LEAVE_GROUP_REQUEST,
    LEAVE_GROUP_RESPONSE,
    OFFSET_COMMIT_REQUEST,
    OFFSET_COMMIT_RESPONSE,
    OFFSET_FETCH_REQUEST,
    OFFSET_FETCH_RESPONSE,
    LIST_OFFSETS_REQUEST,
    LIST_OFFSETS_RESPONSE,
    FETCH_REQUEST,
    FETCH_RESPONSE,
    DESCRIBE_GROUPS_REQUEST,
    DESCRIBE_GROUPS_RESPONSE,
    LIST_GROUPS_REQUEST,
    LIST_GROUPS_RESPONSE,
    SASL_HANDSHAKE_REQUEST,
    SASL_HANDSHAKE_RESPONSE,
    SASL_AUTHENTICATE_REQUEST,
    SASL_AUTHENTICATE_RESPONSE,
    PRODUCE_REQUEST,
    PRODUCE_RESPONSE,
    INIT_PRODUCER_ID_REQUEST,
    INIT_PRODUCER_ID_RESPONSE,
    CREATE_TOPICS_REQUEST,
    CREATE_TOPICS_RESPONSE,
    DELETE_TOPICS_REQUEST,
    DELETE_TOPICS_RESPONSE,
    ADD_PARTITIONS_TO_TXN_REQUEST,
    ADD_PARTITIONS_TO_TXN_RESPONSE,
    END_TXN_REQUEST,
    END_TXN_RESPONSE,
    TXN_OFFSET_COMMIT_REQUEST,
    TXN_OFFSET_COMMIT_RESPONSE,
    DESCRIBE_CONFIGS_REQUEST,
    DESCRIBE_CONFIGS_RESPONSE,
    CONSUMER_PROTOCOL_SUBSCRIPTION,
    CONSUMER_PROTOCOL_ASSIGNMENT,
    *GROUP_PROTOCOL_SCHEMAS,
)
