"""Declarative definitions of the broker-driven group protocols' messages: share groups (KIP-932: heartbeat,
describe, ShareFetch/ShareAcknowledge, share-group offsets, and IncrementalAlterConfigs for share-group configs) and
the consumer group protocol (KIP-848: ConsumerGroupHeartbeat/Describe).

Written with tools/gen_protocol.py from the kafka-clients 4.4 jar's schemas, like :mod:`service.protocol.definitions`
(whose ``ALL_SCHEMAS`` includes :data:`GROUP_PROTOCOL_SCHEMAS`); tests/unit/protocol/test_conformance.py checks them
against those schemas.
"""

from service.protocol.dsl import F, MessageSchema

# -- share groups (KIP-932): ShareGroupHeartbeat/Describe, ShareFetch/Acknowledge, share-group offsets --

SHARE_GROUP_HEARTBEAT_REQUEST = MessageSchema(
    'ShareGroupHeartbeatRequest', api_key=76, kind='request', versions=(1, 1), flexible='0+', fields=(
    F('group_id', 'string', '0+'),
    F('member_id', 'string', '0+'),
    F('member_epoch', 'int32', '0+'),
    F('rack_id', 'string', '0+', nullable='0+', default='null'),
    F('subscribed_topic_names', '[]string', '0+', nullable='0+', default='null'),
))

SHARE_GROUP_HEARTBEAT_RESPONSE = MessageSchema(
    'ShareGroupHeartbeatResponse', api_key=76, kind='response', versions=(1, 1), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('member_id', 'string', '0+', nullable='0+', default='null'),
    F('member_epoch', 'int32', '0+'),
    F('heartbeat_interval_ms', 'int32', '0+'),
    F('assignment', 'Assignment', '0+', nullable='0+', default='null', fields=(
        F('topic_partitions', '[]TopicPartitions', '0+', fields=(
            F('topic_id', 'uuid', '0+'),
            F('partitions', '[]int32', '0+'),
        )),
    )),
))

SHARE_GROUP_DESCRIBE_REQUEST = MessageSchema(
    'ShareGroupDescribeRequest', api_key=77, kind='request', versions=(1, 1), flexible='0+', fields=(
    F('group_ids', '[]string', '0+'),
    F('include_authorized_operations', 'bool', '0+'),
))

SHARE_GROUP_DESCRIBE_RESPONSE = MessageSchema(
    'ShareGroupDescribeResponse', api_key=77, kind='response', versions=(1, 1), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('groups', '[]DescribedGroup', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default='null'),
        F('group_id', 'string', '0+'),
        F('group_state', 'string', '0+'),
        F('group_epoch', 'int32', '0+'),
        F('assignment_epoch', 'int32', '0+'),
        F('assignor_name', 'string', '0+'),
        F('members', '[]Member', '0+', fields=(
            F('member_id', 'string', '0+'),
            F('rack_id', 'string', '0+', nullable='0+', default='null'),
            F('member_epoch', 'int32', '0+'),
            F('client_id', 'string', '0+'),
            F('client_host', 'string', '0+'),
            F('subscribed_topic_names', '[]string', '0+'),
            F('assignment', 'Assignment', '0+', fields=(
                F('topic_partitions', '[]TopicPartitions', '0+', fields=(
                    F('topic_id', 'uuid', '0+'),
                    F('topic_name', 'string', '0+'),
                    F('partitions', '[]int32', '0+'),
                )),
            )),
        )),
        F('authorized_operations', 'int32', '0+', default='-2147483648'),
    )),
))

SHARE_FETCH_REQUEST = MessageSchema(
    'ShareFetchRequest', api_key=78, kind='request', versions=(1, 2), flexible='0+', fields=(
    F('group_id', 'string', '0+', nullable='0+', default='null'),
    F('member_id', 'string', '0+', nullable='0+'),
    F('share_session_epoch', 'int32', '0+'),
    F('max_wait_ms', 'int32', '0+'),
    F('min_bytes', 'int32', '0+'),
    F('max_bytes', 'int32', '0+', default='0x7fffffff'),
    F('max_records', 'int32', '1+'),
    F('batch_size', 'int32', '1+'),
    F('share_acquire_mode', 'int8', '2+', default='0', ignorable=True),
    F('is_renew_ack', 'bool', '2+', default='false'),
    F('topics', '[]FetchTopic', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]FetchPartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('acknowledgement_batches', '[]AcknowledgementBatch', '0+', fields=(
                F('first_offset', 'int64', '0+'),
                F('last_offset', 'int64', '0+'),
                F('acknowledge_types', '[]int8', '0+'),
            )),
        )),
    )),
    F('forgotten_topics_data', '[]ForgottenTopic', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]int32', '0+'),
    )),
))

SHARE_FETCH_RESPONSE = MessageSchema(
    'ShareFetchResponse', api_key=78, kind='response', versions=(1, 2), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('acquisition_lock_timeout_ms', 'int32', '1+'),
    F('responses', '[]ShareFetchableTopicResponse', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]PartitionData', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+', default='null'),
            F('acknowledge_error_code', 'int16', '0+'),
            F('acknowledge_error_message', 'string', '0+', nullable='0+', default='null'),
            F('current_leader', 'LeaderIdAndEpoch', '0+', fields=(
                F('leader_id', 'int32', '0+'),
                F('leader_epoch', 'int32', '0+'),
            )),
            F('records', 'records', '0+', nullable='0'),
            F('acquired_records', '[]AcquiredRecords', '0+', fields=(
                F('first_offset', 'int64', '0+'),
                F('last_offset', 'int64', '0+'),
                F('delivery_count', 'int16', '0+'),
            )),
        )),
    )),
    F('node_endpoints', '[]NodeEndpoint', '0+', fields=(
        F('node_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '0+', nullable='0+', default='null'),
    )),
))

SHARE_ACKNOWLEDGE_REQUEST = MessageSchema(
    'ShareAcknowledgeRequest', api_key=79, kind='request', versions=(1, 2), flexible='0+', fields=(
    F('group_id', 'string', '0+', nullable='0+', default='null'),
    F('member_id', 'string', '0+', nullable='0+'),
    F('share_session_epoch', 'int32', '0+'),
    F('is_renew_ack', 'bool', '2+', default='false'),
    F('topics', '[]AcknowledgeTopic', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]AcknowledgePartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('acknowledgement_batches', '[]AcknowledgementBatch', '0+', fields=(
                F('first_offset', 'int64', '0+'),
                F('last_offset', 'int64', '0+'),
                F('acknowledge_types', '[]int8', '0+'),
            )),
        )),
    )),
))

SHARE_ACKNOWLEDGE_RESPONSE = MessageSchema(
    'ShareAcknowledgeResponse', api_key=79, kind='response', versions=(1, 2), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('acquisition_lock_timeout_ms', 'int32', '2+', ignorable=True),
    F('responses', '[]ShareAcknowledgeTopicResponse', '0+', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]PartitionData', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+', default='null'),
            F('current_leader', 'LeaderIdAndEpoch', '0+', fields=(
                F('leader_id', 'int32', '0+'),
                F('leader_epoch', 'int32', '0+'),
            )),
        )),
    )),
    F('node_endpoints', '[]NodeEndpoint', '0+', fields=(
        F('node_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '0+', nullable='0+', default='null'),
    )),
))

DESCRIBE_SHARE_GROUP_OFFSETS_REQUEST = MessageSchema(
    'DescribeShareGroupOffsetsRequest', api_key=90, kind='request', versions=(0, 1), flexible='0+', fields=(
    F('groups', '[]DescribeShareGroupOffsetsRequestGroup', '0+', fields=(
        F('group_id', 'string', '0+'),
        F('topics', '[]DescribeShareGroupOffsetsRequestTopic', '0+', nullable='0+', fields=(
            F('topic_name', 'string', '0+'),
            F('partitions', '[]int32', '0+'),
        )),
    )),
))

DESCRIBE_SHARE_GROUP_OFFSETS_RESPONSE = MessageSchema(
    'DescribeShareGroupOffsetsResponse', api_key=90, kind='response', versions=(0, 1), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('groups', '[]DescribeShareGroupOffsetsResponseGroup', '0+', fields=(
        F('group_id', 'string', '0+'),
        F('topics', '[]DescribeShareGroupOffsetsResponseTopic', '0+', fields=(
            F('topic_name', 'string', '0+'),
            F('topic_id', 'uuid', '0+'),
            F('partitions', '[]DescribeShareGroupOffsetsResponsePartition', '0+', fields=(
                F('partition_index', 'int32', '0+'),
                F('start_offset', 'int64', '0+'),
                F('leader_epoch', 'int32', '0+'),
                F('lag', 'int64', '1+', default=-1, ignorable=True),
                F('error_code', 'int16', '0+'),
                F('error_message', 'string', '0+', nullable='0+', default='null'),
            )),
        )),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default='null'),
    )),
))

ALTER_SHARE_GROUP_OFFSETS_REQUEST = MessageSchema(
    'AlterShareGroupOffsetsRequest', api_key=91, kind='request', versions=(0, 0), flexible='0+', fields=(
    F('group_id', 'string', '0+'),
    F('topics', '[]AlterShareGroupOffsetsRequestTopic', '0+', fields=(
        F('topic_name', 'string', '0+'),
        F('partitions', '[]AlterShareGroupOffsetsRequestPartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('start_offset', 'int64', '0+'),
        )),
    )),
))

ALTER_SHARE_GROUP_OFFSETS_RESPONSE = MessageSchema(
    'AlterShareGroupOffsetsResponse', api_key=91, kind='response', versions=(0, 0), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('responses', '[]AlterShareGroupOffsetsResponseTopic', '0+', fields=(
        F('topic_name', 'string', '0+'),
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]AlterShareGroupOffsetsResponsePartition', '0+', fields=(
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+', default='null'),
        )),
    )),
))

DELETE_SHARE_GROUP_OFFSETS_REQUEST = MessageSchema(
    'DeleteShareGroupOffsetsRequest', api_key=92, kind='request', versions=(0, 0), flexible='0+', fields=(
    F('group_id', 'string', '0+'),
    F('topics', '[]DeleteShareGroupOffsetsRequestTopic', '0+', fields=(
        F('topic_name', 'string', '0+'),
    )),
))

DELETE_SHARE_GROUP_OFFSETS_RESPONSE = MessageSchema(
    'DeleteShareGroupOffsetsResponse', api_key=92, kind='response', versions=(0, 0), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('responses', '[]DeleteShareGroupOffsetsResponseTopic', '0+', fields=(
        F('topic_name', 'string', '0+'),
        F('topic_id', 'uuid', '0+'),
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default='null'),
    )),
))

INCREMENTAL_ALTER_CONFIGS_REQUEST = MessageSchema(
    'IncrementalAlterConfigsRequest', api_key=44, kind='request', versions=(0, 1), flexible='1+', fields=(
    F('resources', '[]AlterConfigsResource', '0+', fields=(
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
        F('configs', '[]AlterableConfig', '0+', fields=(
            F('name', 'string', '0+'),
            F('config_operation', 'int8', '0+'),
            F('value', 'string', '0+', nullable='0+'),
        )),
    )),
    F('validate_only', 'bool', '0+'),
))

INCREMENTAL_ALTER_CONFIGS_RESPONSE = MessageSchema(
    'IncrementalAlterConfigsResponse', api_key=44, kind='response', versions=(0, 1), flexible='1+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('responses', '[]AlterConfigsResourceResponse', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+'),
        F('resource_type', 'int8', '0+'),
        F('resource_name', 'string', '0+'),
    )),
))

# -- end of share groups --

# -- the consumer group protocol (KIP-848) ------------------------------------------------------------

CONSUMER_GROUP_HEARTBEAT_REQUEST = MessageSchema(
    'ConsumerGroupHeartbeatRequest', api_key=68, kind='request', versions=(0, 1), flexible='0+', fields=(
    F('group_id', 'string', '0+'),
    F('member_id', 'string', '0+'),
    F('member_epoch', 'int32', '0+'),
    F('instance_id', 'string', '0+', nullable='0+', default='null'),
    F('rack_id', 'string', '0+', nullable='0+', default='null'),
    F('rebalance_timeout_ms', 'int32', '0+', default='-1'),
    F('subscribed_topic_names', '[]string', '0+', nullable='0+', default='null'),
    F('subscribed_topic_regex', 'string', '1+', nullable='1+', default='null'),
    F('server_assignor', 'string', '0+', nullable='0+', default='null'),
    F('topic_partitions', '[]TopicPartitions', '0+', nullable='0+', default='null', fields=(
        F('topic_id', 'uuid', '0+'),
        F('partitions', '[]int32', '0+'),
    )),
))

CONSUMER_GROUP_HEARTBEAT_RESPONSE = MessageSchema(
    'ConsumerGroupHeartbeatResponse', api_key=68, kind='response', versions=(0, 1), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default='null'),
    F('member_id', 'string', '0+', nullable='0+', default='null'),
    F('member_epoch', 'int32', '0+'),
    F('heartbeat_interval_ms', 'int32', '0+'),
    F('assignment', 'Assignment', '0+', nullable='0+', default='null', fields=(
        F('topic_partitions', '[]TopicPartitions', '0+', fields=(
            F('topic_id', 'uuid', '0+'),
            F('partitions', '[]int32', '0+'),
        )),
    )),
))

CONSUMER_GROUP_DESCRIBE_REQUEST = MessageSchema(
    'ConsumerGroupDescribeRequest', api_key=69, kind='request', versions=(0, 1), flexible='0+', fields=(
    F('group_ids', '[]string', '0+'),
    F('include_authorized_operations', 'bool', '0+'),
))

CONSUMER_GROUP_DESCRIBE_RESPONSE = MessageSchema(
    'ConsumerGroupDescribeResponse', api_key=69, kind='response', versions=(0, 1), flexible='0+', fields=(
    F('throttle_time_ms', 'int32', '0+'),
    F('groups', '[]DescribedGroup', '0+', fields=(
        F('error_code', 'int16', '0+'),
        F('error_message', 'string', '0+', nullable='0+', default='null'),
        F('group_id', 'string', '0+'),
        F('group_state', 'string', '0+'),
        F('group_epoch', 'int32', '0+'),
        F('assignment_epoch', 'int32', '0+'),
        F('assignor_name', 'string', '0+'),
        F('members', '[]Member', '0+', fields=(
            F('member_id', 'string', '0+'),
            F('instance_id', 'string', '0+', nullable='0+', default='null'),
            F('rack_id', 'string', '0+', nullable='0+', default='null'),
            F('member_epoch', 'int32', '0+'),
            F('client_id', 'string', '0+'),
            F('client_host', 'string', '0+'),
            F('subscribed_topic_names', '[]string', '0+'),
            F('subscribed_topic_regex', 'string', '0+', nullable='0+', default='null'),
            F('assignment', 'Assignment', '0+', fields=(
                F('topic_partitions', '[]TopicPartitions', '0+', fields=(
                    F('topic_id', 'uuid', '0+'),
                    F('topic_name', 'string', '0+'),
                    F('partitions', '[]int32', '0+'),
                )),
            )),
            F('target_assignment', 'Assignment', '0+', fields=(
                F('topic_partitions', '[]TopicPartitions', '0+', fields=(
                    F('topic_id', 'uuid', '0+'),
                    F('topic_name', 'string', '0+'),
                    F('partitions', '[]int32', '0+'),
                )),
            )),
            F('member_type', 'int8', '1+', default='-1', ignorable=True),
        )),
        F('authorized_operations', 'int32', '0+', default='-2147483648'),
    )),
))


GROUP_PROTOCOL_SCHEMAS = (
    SHARE_GROUP_HEARTBEAT_REQUEST,
    SHARE_GROUP_HEARTBEAT_RESPONSE,
    SHARE_GROUP_DESCRIBE_REQUEST,
    SHARE_GROUP_DESCRIBE_RESPONSE,
    SHARE_FETCH_REQUEST,
    SHARE_FETCH_RESPONSE,
    SHARE_ACKNOWLEDGE_REQUEST,
    SHARE_ACKNOWLEDGE_RESPONSE,
    DESCRIBE_SHARE_GROUP_OFFSETS_REQUEST,
    DESCRIBE_SHARE_GROUP_OFFSETS_RESPONSE,
    ALTER_SHARE_GROUP_OFFSETS_REQUEST,
    ALTER_SHARE_GROUP_OFFSETS_RESPONSE,
    DELETE_SHARE_GROUP_OFFSETS_REQUEST,
    DELETE_SHARE_GROUP_OFFSETS_RESPONSE,
    INCREMENTAL_ALTER_CONFIGS_REQUEST,
    INCREMENTAL_ALTER_CONFIGS_RESPONSE,
    CONSUMER_GROUP_HEARTBEAT_REQUEST,
    CONSUMER_GROUP_HEARTBEAT_RESPONSE,
    CONSUMER_GROUP_DESCRIBE_REQUEST,
    CONSUMER_GROUP_DESCRIBE_RESPONSE,
)
