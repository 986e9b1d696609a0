"""Cluster state of the test broker, free of I/O: brokers, topics, partitions, leaders and epochs.

Handlers read and change this state; :class:`tests.fakes.broker.cluster.TestCluster` owns one instance and
exposes the operations tests need (create topics, move leaders, stop brokers). Other subsystems
(fetch sessions, groups, transactions) keep their state in ``ClusterState.extensions`` under a key of
their own, so this module does not need to know about them.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.broker.partition_log import ChangeNotifier, PartitionLog

NO_LEADER = -1
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")


def random_cluster_id() -> str:
    """A 22-character URL-safe id, the shape Kafka uses for cluster ids."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    alive: bool = False


@dataclass
class PartitionState:
    index: int
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    # the stored batches, offsets and transaction state (see tests.fakes.broker.partition_log)
    log: PartitionLog = field(default_factory=PartitionLog, repr=False, compare=False)


@dataclass
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionState]
    internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)

    def partition(self, index: int) -> PartitionState:
        if not 0 <= index < len(self.partitions):
            raise KeyError(f"{self.name} has no partition {index}")
        return self.partitions[index]


class ClusterState:
    """Topics and brokers of one test cluster."""

    def __init__(
        self,
        *,
        cluster_id: str | None = None,
        controller_id: int | None = None,
        auto_create_topics: bool = False,
        default_partitions: int = 1,
        default_replication_factor: int | None = None,
    ) -> None:
        self.cluster_id = cluster_id if cluster_id is not None else random_cluster_id()
        self.brokers: dict[int, BrokerInfo] = {}
        self._controller_id = controller_id
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.topics: dict[str, TopicState] = {}
        self.topics_by_id: dict[uuid.UUID, TopicState] = {}
        # State of other subsystems (fetch sessions, groups, ...), keyed by subsystem name.
        self.extensions: dict[str, Any] = {}
        # Signalled on every log change and leader move (wakes Fetch requests waiting for data).
        self.changes = ChangeNotifier()

    # -- brokers ---------------------------------------------------------------------------------
    def add_broker(self, info: BrokerInfo) -> None:
        self.brokers[info.node_id] = info

    def live_brokers(self) -> list[BrokerInfo]:
        return [b for _, b in sorted(self.brokers.items()) if b.alive]

    def is_alive(self, node_id: int) -> bool:
        b = self.brokers.get(node_id)
        return b is not None and b.alive

    @property
    def controller_id(self) -> int:
        """The configured controller if it is up, else the lowest live node id (-1 if none is up)."""
        if self._controller_id is not None and self.is_alive(self._controller_id):
            return self._controller_id
        live = self.live_brokers()
        return live[0].node_id if live else NO_LEADER

    @controller_id.setter
    def controller_id(self, node_id: int | None) -> None:
        self._controller_id = node_id

    def broker_stopped(self, node_id: int, *, failover: bool = True) -> list[tuple[str, int]]:
        """Mark a broker down. It leaves every ISR; with ``failover`` each partition it led gets a
        new leader from the remaining ISR (epoch bumped), or no leader if none is left.
        Returns the (topic, partition) pairs whose leader changed."""
        self.brokers[node_id].alive = False
        self.changes.notify()
        changed: list[tuple[str, int]] = []
        if not failover:
            return changed
        for topic in self.topics.values():
            for p in topic.partitions:
                if node_id in p.isr and len(p.isr) > 1:
                    p.isr.remove(node_id)
                if p.leader == node_id:
                    candidates = [r for r in p.replicas if r != node_id and r in p.isr and self.is_alive(r)]
                    p.leader = candidates[0] if candidates else NO_LEADER
                    p.leader_epoch += 1
                    changed.append((topic.name, p.index))
        return changed

    def broker_started(self, node_id: int) -> list[tuple[str, int]]:
        """Mark a broker up: it rejoins the ISR of its replicas and leads leaderless partitions."""
        self.brokers[node_id].alive = True
        self.changes.notify()
        changed: list[tuple[str, int]] = []
        for topic in self.topics.values():
            for p in topic.partitions:
                if node_id in p.replicas and node_id not in p.isr:
                    p.isr.append(node_id)
                    p.isr.sort(key=p.replicas.index)
                if p.leader == NO_LEADER and node_id in p.replicas:
                    p.leader = node_id
                    p.leader_epoch += 1
                    changed.append((topic.name, p.index))
        return changed

    # -- topics ----------------------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        *,
        replication_factor: int | None = None,
        topic_id: uuid.UUID | None = None,
        assignments: Mapping[int, Sequence[int]] | None = None,
        internal: bool = False,
        configs: Mapping[str, str] | None = None,
    ) -> TopicState:
        """Create a topic. Without ``assignments`` partition ``p`` is led by the ``p % n``-th broker
        (by node id) and replicated on the next ``replication_factor - 1`` brokers."""
        if name in self.topics:
            raise ValueError(f"topic {name!r} already exists")
        if not valid_topic_name(name):
            raise ValueError(f"invalid topic name {name!r}")
        node_ids = sorted(self.brokers)
        if not node_ids:
            raise ValueError("a cluster without brokers cannot hold topics")
        if assignments is not None:
            count = len(assignments)
            if sorted(assignments) != list(range(count)):
                raise ValueError("assignments must cover partitions 0..n-1")
            if partitions is not None and partitions != count:
                raise ValueError("partitions disagrees with assignments")
            replica_lists = [list(assignments[i]) for i in range(count)]
        else:
            count = self.default_partitions if partitions is None else partitions
            rf = replication_factor or self.default_replication_factor or min(3, len(node_ids))
            if not 1 <= rf <= len(node_ids):
                raise ValueError(f"replication factor {rf} with {len(node_ids)} brokers")
            replica_lists = [[node_ids[(p + r) % len(node_ids)] for r in range(rf)] for p in range(count)]
        if count < 1:
            raise ValueError("a topic needs at least one partition")
        parts = []
        for i, replicas in enumerate(replica_lists):
            unknown = [r for r in replicas if r not in self.brokers]
            if unknown or not replicas:
                raise ValueError(f"partition {i}: unknown or missing replicas {replicas}")
            isr = [r for r in replicas if self.is_alive(r)] or [replicas[0]]
            leader = next((r for r in replicas if self.is_alive(r)), NO_LEADER)
            parts.append(PartitionState(index=i, replicas=list(replicas), isr=isr, leader=leader,
                                        log=PartitionLog(self.changes)))
        tid = topic_id if topic_id is not None else uuid.uuid4()
        if tid in self.topics_by_id or tid.int == 0:
            raise ValueError(f"topic id {tid} is taken or zero")
        topic = TopicState(name, tid, parts, internal=internal, configs=dict(configs or {}))
        self.topics[name] = topic
        self.topics_by_id[tid] = topic
        return topic

    def delete_topic(self, name: str) -> TopicState:
        topic = self.topics.pop(name)
        del self.topics_by_id[topic.topic_id]
        self.changes.notify()
        return topic

    def topic(self, name: str) -> TopicState:
        return self.topics[name]

    def partition(self, topic: str, partition: int) -> PartitionState:
        return self.topics[topic].partition(partition)

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> PartitionState:
        """Make ``to`` (default: the next live replica after the current leader) the leader and bump
        the leader epoch. Moving to the current leader only bumps the epoch. A target that is not a
        replica yet becomes one (and joins the ISR)."""
        p = self.partition(topic, partition)
        if to is None:
            live = [r for r in p.replicas if self.is_alive(r)]
            if not live:
                raise ValueError(f"{topic}-{partition} has no live replica")
            idx = live.index(p.leader) if p.leader in live else -1
            to = live[(idx + 1) % len(live)]
        if to not in self.brokers:
            raise ValueError(f"unknown broker {to}")
        if to not in p.replicas:
            p.replicas.append(to)
        if to not in p.isr:
            p.isr.append(to)
        p.leader = to
        p.leader_epoch += 1
        self.changes.notify()
        return p

    def sorted_topics(self) -> Iterable[TopicState]:
        return (self.topics[n] for n in sorted(self.topics))
