"""Which broker may serve a partition, as Kafka's replica manager decides it (shared by Fetch,
ListOffsets and Produce).

Order of the checks: unknown topic/partition → UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID when it
was named by id); this broker holds no replica → NOT_LEADER_OR_FOLLOWER; the request's current leader
epoch (when not -1) is older than the partition's → FENCED_LEADER_EPOCH, newer → UNKNOWN_LEADER_EPOCH;
this broker is a replica but not the leader → NOT_LEADER_OR_FOLLOWER.

Simplification: Kafka 2.4+ (KIP-392) lets a v11+ consumer fetch from a follower; here only the
leader serves reads.
"""

from __future__ import annotations

import uuid

from service.protocol import error_codes as EC
from tests.fakes.broker.state import ClusterState, PartitionState, TopicState


def find_topic(state: ClusterState, name_or_id: str | uuid.UUID) -> TopicState | None:
    if isinstance(name_or_id, uuid.UUID):
        return state.topics_by_id.get(name_or_id)
    return state.topics.get(name_or_id)


def leader_partition(state: ClusterState, node_id: int, name_or_id: str | uuid.UUID, index: int,
                     current_leader_epoch: int = -1) -> tuple[PartitionState | None, int]:
    """(partition, 0) if ``node_id`` may serve it as leader, else (partition or None, error code)."""
    topic = find_topic(state, name_or_id)
    if topic is None:
        return None, EC.UNKNOWN_TOPIC_ID if isinstance(name_or_id, uuid.UUID) else EC.UNKNOWN_TOPIC_OR_PARTITION
    if not 0 <= index < len(topic.partitions):
        return None, EC.UNKNOWN_TOPIC_OR_PARTITION
    p = topic.partitions[index]
    if node_id not in p.replicas:
        return p, EC.NOT_LEADER_OR_FOLLOWER
    if current_leader_epoch >= 0:
        if current_leader_epoch < p.leader_epoch:
            return p, EC.FENCED_LEADER_EPOCH
        if current_leader_epoch > p.leader_epoch:
            return p, EC.UNKNOWN_LEADER_EPOCH
    if p.leader != node_id:
        return p, EC.NOT_LEADER_OR_FOLLOWER
    return p, 0
