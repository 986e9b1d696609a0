"""Cluster metadata cache (pure): brokers, partition leaders with leader epochs, topic ids.

It is updated from decoded Metadata responses and never regresses a partition's leader epoch,
so a stale response from a lagging broker cannot move a leader back.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from service.protocol import error_codes as EC
from service.protocol.primitives import ZERO_UUID


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    error_code: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionInfo]
    error_code: int = 0
    is_internal: bool = False


class ClusterMetadata:
    def __init__(self) -> None:
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.topic_names: dict[uuid.UUID, str] = {}
        self.cluster_id: str | None = None
        self.controller_id: int = -1
        self.updated_at: float = 0.0
        self.version = 0  # bumps on every update
        self._stale: set[str] = set()
        self._stale_all = True

    # -- updates ---------------------------------------------------------------------------------
    def update(self, resp: Any, *, requested_topics: list[str] | None = None, now: float | None = None) -> None:
        """Apply a MetadataResponse. ``requested_topics`` None means the response lists all topics."""
        self.brokers = {
            b.node_id: BrokerInfo(b.node_id, b.host, b.port, getattr(b, "rack", None)) for b in resp.brokers
        }
        self.cluster_id = getattr(resp, "cluster_id", None)
        self.controller_id = getattr(resp, "controller_id", -1)
        seen: set[str] = set()
        for t in resp.topics:
            name = t.name
            if name is None:
                continue
            seen.add(name)
            if t.error_code and t.error_code != EC.LEADER_NOT_AVAILABLE:
                # Unknown or unauthorized: forget what we knew, keep the error for callers.
                old = self.topics.pop(name, None)
                if old is not None:
                    self.topic_names.pop(old.topic_id, None)
                self.topics[name] = TopicInfo(name, ZERO_UUID, {}, t.error_code)
                continue
            old = self.topics.get(name)
            tid = getattr(t, "topic_id", ZERO_UUID) or ZERO_UUID
            parts: dict[int, PartitionInfo] = {}
            for p in t.partitions:
                epoch = getattr(p, "leader_epoch", -1)
                prev = old.partitions.get(p.partition_index) if old and old.topic_id == tid else None
                if prev is not None and epoch >= 0 and prev.leader_epoch > epoch:
                    parts[p.partition_index] = prev  # stale response: keep the newer leader
                    continue
                parts[p.partition_index] = PartitionInfo(
                    p.partition_index, p.leader_id, epoch, list(p.replica_nodes), list(p.isr_nodes), p.error_code
                )
            if old is not None and old.topic_id != tid:
                self.topic_names.pop(old.topic_id, None)
            info = TopicInfo(name, tid, parts, t.error_code, getattr(t, "is_internal", False))
            self.topics[name] = info
            if tid != ZERO_UUID:
                self.topic_names[tid] = name
        if requested_topics is None:
            for gone in set(self.topics) - seen:
                info = self.topics.pop(gone)
                self.topic_names.pop(info.topic_id, None)
            self._stale.clear()
            self._stale_all = False
        else:
            # The client always asks for every topic it is interested in, so a topic-list answer
            # satisfies a general "refresh everything" request too.
            self._stale.difference_update(requested_topics)
            self._stale_all = False
        self.updated_at = time.monotonic() if now is None else now
        self.version += 1

    def mark_stale(self, topic: str | None = None) -> None:
        """Ask for a refresh: of one topic, or of everything."""
        if topic is None:
            self._stale_all = True
        else:
            self._stale.add(topic)

    @property
    def needs_refresh(self) -> bool:
        return self._stale_all or bool(self._stale)

    def stale_topics(self) -> set[str]:
        return set(self._stale)

    # -- queries -----------------------------------------------------------------------------------
    def leader(self, topic: str, partition: int) -> int | None:
        t = self.topics.get(topic)
        if t is None:
            return None
        p = t.partitions.get(partition)
        if p is None or p.leader < 0:
            return None
        return p.leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        t = self.topics.get(topic)
        p = t.partitions.get(partition) if t else None
        return p.leader_epoch if p else -1

    def partitions(self, topic: str) -> list[int]:
        t = self.topics.get(topic)
        return sorted(t.partitions) if t else []

    def topic_id(self, topic: str) -> uuid.UUID:
        t = self.topics.get(topic)
        return t.topic_id if t else ZERO_UUID

    def topic_error(self, topic: str) -> int:
        t = self.topics.get(topic)
        return EC.UNKNOWN_TOPIC_OR_PARTITION if t is None else t.error_code

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self.brokers.get(node_id)
