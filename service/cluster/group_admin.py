"""Consumer groups, their members and their lag, for the Confluent v3 ``/consumer-groups`` endpoints (no HTTP).

The views and the lag arithmetic are pure (unit-tested without sockets); :class:`GroupAdmin` asks the broker:

- **ListGroups** goes to every broker (each lists the groups it coordinates) and keeps consumer groups
  (protocol type ``consumer``, or empty for groups that only hold offsets committed by ``assign`` users), as
  Kafka's Admin ``listConsumerGroups`` does. Groups that members of this process belong to are added: some
  brokers (Tansu) list only groups that committed offsets.
- **FindCoordinator** (batched from v4) then **DescribeGroups** at each coordinator: state, protocol (the
  partition assignor), members with client id, host and assignment (decoded with the consumer protocol).
  A group the broker answers as ``Dead`` with no protocol type does not exist (Kafka describes unknown
  groups that way); nor does an ``Empty`` one without protocol type, members or committed offsets (Tansu
  describes unknown groups that way). Where the broker leaves a member's assignment, client id or the
  group's protocol empty (Tansu) and the member lives in this process, the member's own view is used.
- **OffsetFetch** (all partitions) gives the committed offsets; the log end offset of each partition is
  its last stable offset, taken from a Fetch response (:func:`service.cluster.topics.read_offsets`): Confluent
  reads ``ListOffsets(latest, read_committed)``, which Tansu answers wrongly.

Lag follows Confluent's REST Proxy: only partitions with a committed offset are listed (a partition
consumed but never committed has no lag entry), ``lag = log_end_offset - current_offset``, the partition's
consumer is the member it is assigned to (``""`` when none), the list is sorted by lag (largest first),
then topic and partition; the summary's maximum is the first partition (in topic, partition order) with
the largest lag, and negative lags count as 0 in the summary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError, KafkaError
from service.client.metadata import BrokerInfo
from service.cluster.topic_admin import ResourceNotFound
from service.consumer.subscription import TopicPartition
from service.fetch.offsets import read_offsets
from service.group.protocol import decode_assignment
from service.protocol import error_codes as EC
from service.protocol import messages as M

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL = "consumer"
RETRIES = 5  # attempts for retriable coordinator errors (loading, moved, not available)
RETRY_BACKOFF_S = 0.1
LOG_END_CONCURRENCY = 32  # partitions whose end offset is read at once (each: 2 ListOffsets + 1 Fetch)

_FetchGroup = M.struct("OffsetFetchRequest", "OffsetFetchRequestGroup")

# Kafka's classic group states as DescribeGroups names them → Confluent's ConsumerGroupState enum.
_STATES = {
    "Unknown": "UNKNOWN",
    "PreparingRebalance": "PREPARING_REBALANCE",
    "CompletingRebalance": "COMPLETING_REBALANCE",
    "AwaitingSync": "COMPLETING_REBALANCE",  # the pre-2.0 name of CompletingRebalance
    "Stable": "STABLE",
    "Dead": "DEAD",
    "Empty": "EMPTY",
    # KIP-848 consumer-group states (Tansu reports Assigning for classic groups too): Confluent's enum has
    # neither, so the nearest classic state — computing an assignment, then members converging on it
    "Assigning": "PREPARING_REBALANCE",
    "Reconciling": "COMPLETING_REBALANCE",
}


class GroupNotFound(ResourceNotFound):
    """404 with Confluent's bare-status error code (as every v3 "not found")."""


class ConsumerNotFound(ResourceNotFound):
    pass


class LagNotFound(ResourceNotFound):
    pass


# -- views (pure) ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MemberView:
    consumer_id: str
    instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]  # sorted


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    is_simple: bool
    partition_assignor: str
    state: str  # Confluent's enum name: STABLE, EMPTY, ...
    coordinator: int
    members: tuple[MemberView, ...]  # sorted by consumer id
    #: the group protocol: "classic" (JoinGroup/SyncGroup; DescribeGroups) or "consumer" (KIP-848; described by
    #: ConsumerGroupDescribe, which Kafka answers for those groups instead)
    group_type: str = "classic"

    def member(self, consumer_id: str) -> MemberView | None:
        return next((m for m in self.members if m.consumer_id == consumer_id), None)

    def owners(self) -> dict[TopicPartition, MemberView]:
        return {tp: m for m in self.members for tp in m.assignment}


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    current_offset: int
    log_end_offset: int
    consumer_id: str
    instance_id: str | None
    client_id: str

    @property
    def lag(self) -> int:
        return self.log_end_offset - self.current_offset


@dataclass(frozen=True, slots=True)
class LagSummary:
    max_lag: int
    total_lag: int
    top: PartitionLag  # the partition with the maximum lag


@dataclass(frozen=True, slots=True)
class LocalMember:
    """What this process knows of one of its own members (to fill what a broker leaves out)."""

    client_id: str
    assignment: tuple[TopicPartition, ...]
    protocol: str = ""  # the group protocol (assignor) the member joined with


def confluent_state(kafka_state: str) -> str:
    return _STATES.get(kafka_state, "UNKNOWN")


def listed_consumer_groups(resp: Any) -> list[str]:
    """The consumer groups of one ListGroupsResponse (Kafka's Admin keeps protocol type "consumer" or "")."""
    if resp.error_code:
        raise BrokerResponseError(resp.error_code, "ListGroups")
    return [g.group_id for g in resp.groups if g.protocol_type in (CONSUMER_PROTOCOL, "")]


def member_assignment(protocol_type: str, data: bytes | None) -> tuple[TopicPartition, ...] | None:
    """The partitions of a member's assignment bytes; None when unknown (empty bytes, another protocol or
    bytes that are not a consumer-protocol assignment)."""
    if protocol_type != CONSUMER_PROTOCOL or not data:
        return None
    try:
        decoded = decode_assignment(bytes(data))
    except Exception as exc:  # a broker answering garbage must not fail the whole description
        log.debug("undecodable member assignment: %s", exc)
        return None
    return tuple(sorted(TopicPartition(t, p) for t, p in decoded.pairs()))


def group_view(described: Any, coordinator: int, local: Mapping[str, LocalMember] | None = None,
               allows_topic: Callable[[str], bool] | None = None) -> GroupView | None:
    """A view of one DescribedGroup; None when the group does not exist (Dead with no protocol type, as
    Kafka describes unknown groups). ``local`` fills members' assignment and client id where the broker
    left them empty; ``allows_topic`` drops assigned partitions of topics the caller may not see."""
    if described.error_code:
        raise BrokerResponseError(described.error_code, f"DescribeGroups {described.group_id!r}")
    if described.group_state == "Dead" and not described.protocol_type:
        return None
    members = []
    assignor = described.protocol_data or ""
    for m in described.members:
        assignment = member_assignment(described.protocol_type, m.member_assignment)
        client_id = m.client_id or ""
        own = (local or {}).get(m.member_id)
        if own is not None:
            if assignment is None:
                assignment = own.assignment
            client_id = client_id or own.client_id
            assignor = assignor or own.protocol
        parts = tuple(tp for tp in assignment or () if allows_topic is None or allows_topic(tp.topic))
        members.append(MemberView(m.member_id, getattr(m, "group_instance_id", None), client_id,
                                  m.client_host or "", parts))
    return GroupView(
        group_id=described.group_id,
        is_simple=not described.protocol_type,
        partition_assignor=assignor,
        state=confluent_state(described.group_state),
        coordinator=coordinator,
        members=tuple(sorted(members, key=lambda m: m.consumer_id)),
    )


def consumer_group_view(described: Any, coordinator: int,
                        allows_topic: Callable[[str], bool] | None = None) -> GroupView | None:
    """A view of one ConsumerGroupDescribe group (the consumer protocol, KIP-848); None when it is not one
    (GROUP_ID_NOT_FOUND: unknown, or a classic group)."""
    if described.error_code == GROUP_ID_NOT_FOUND:
        return None
    if described.error_code:
        raise BrokerResponseError(described.error_code, f"ConsumerGroupDescribe {described.group_id!r}")
    members = []
    for m in described.members:
        parts = tuple(sorted(TopicPartition(t.topic_name, p) for t in m.assignment.topic_partitions
                             for p in t.partitions if allows_topic is None or allows_topic(t.topic_name)))
        members.append(MemberView(m.member_id, m.instance_id, m.client_id or "", m.client_host or "", parts))
    return GroupView(
        group_id=described.group_id, is_simple=False, partition_assignor=described.assignor_name or "",
        state=confluent_state(described.group_state), coordinator=coordinator,
        members=tuple(sorted(members, key=lambda m: m.consumer_id)), group_type="consumer")


def may_be_unknown(group: GroupView) -> bool:
    """An empty simple group without members: a group that only holds committed offsets, or (Tansu, which
    describes unknown groups so) no group at all; its committed offsets decide."""
    return group.is_simple and group.state == "EMPTY" and not group.members


def committed_offsets(resp: Any, group_id: str, version: int) -> dict[TopicPartition, int]:
    """Committed offsets (partitions with an offset >= 0) of an OffsetFetchResponse for all partitions."""
    if version >= 8:
        grp = next((g for g in resp.groups if g.group_id == group_id), None)
        if grp is None:
            raise BrokerResponseError(EC.COORDINATOR_NOT_AVAILABLE, f"OffsetFetch {group_id!r}: group missing")
        code, topics = grp.error_code, grp.topics
    else:
        code, topics = resp.error_code, resp.topics
    if code:
        raise BrokerResponseError(code, f"OffsetFetch {group_id!r}")
    out: dict[TopicPartition, int] = {}
    for t in topics:
        for p in t.partitions:
            if p.error_code:
                raise BrokerResponseError(p.error_code, f"OffsetFetch {group_id!r} {t.name}-{p.partition_index}")
            if p.committed_offset >= 0:
                out[TopicPartition(t.name, p.partition_index)] = p.committed_offset
    return out


def consumer_lags(group: GroupView, committed: Mapping[TopicPartition, int],
                  log_end: Mapping[TopicPartition, int]) -> list[PartitionLag]:
    """Confluent's lag list: committed partitions whose end offset is known, largest lag first."""
    owners = group.owners()
    out = []
    for tp, current in committed.items():
        end = log_end.get(tp)
        if end is None:
            continue
        m = owners.get(tp)
        out.append(PartitionLag(tp.topic, tp.partition, current, end, m.consumer_id if m else "",
                                m.instance_id if m else None, m.client_id if m else ""))
    out.sort(key=lambda x: (-x.lag, x.topic, x.partition))
    return out


def lag_summary(lags: Iterable[PartitionLag]) -> LagSummary | None:
    """Maximum and total lag (negative lags count as 0); the maximum is the first partition, in topic and
    partition order, with the largest lag. None without partitions."""
    top: PartitionLag | None = None
    max_lag = -1
    total = 0
    for x in sorted(lags, key=lambda x: (x.topic, x.partition)):
        lag = max(0, x.lag)
        total += lag
        if lag > max_lag:
            max_lag, top = lag, x
    return None if top is None else LagSummary(max_lag, total, top)


# -- broker I/O ---------------------------------------------------------------------------------------------
GROUP_ID_NOT_FOUND = EC.BY_NAME["GROUP_ID_NOT_FOUND"]
_COORDINATOR_RETRY = frozenset({EC.NOT_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE, EC.COORDINATOR_LOAD_IN_PROGRESS})


class GroupAdmin:
    """Group administration over one tenant's :class:`KafkaClient` (stateless; cheap to create per request).

    ``local_members(group_id)`` returns this process's own members of a group (member id → LocalMember);
    ``local_groups()`` the groups they belong to."""

    def __init__(self, client: KafkaClient, *,
                 local_members: Callable[[str], Mapping[str, LocalMember]] | None = None,
                 local_groups: Callable[[], Iterable[str]] | None = None,
                 read_log_end: Callable[[KafkaClient, TopicPartition], Any] | None = None) -> None:
        self.client = client
        self._local_members = local_members or (lambda _g: {})
        self._local_groups = local_groups or (lambda: ())
        self._read_log_end = read_log_end

    # -- lists and descriptions --------------------------------------------------------------------
    async def list_group_ids(self, allowed: Callable[[str], bool]) -> list[str]:
        """Consumer group ids of the cluster (every broker asked) plus this process's groups, filtered."""
        md = await self.client.ensure_metadata()
        nodes = sorted(md.brokers)

        async def one(node: int) -> list[str]:
            conn = await self.client.connection(node).get()
            version = conn.version_for(M.ApiKey.LIST_GROUPS)
            req = M.ListGroupsRequest(states_filter=[], types_filter=[])
            return listed_consumer_groups(await conn.send(req, version))

        found: set[str] = set(self._local_groups())
        for ids in await asyncio.gather(*(one(n) for n in nodes)):
            found.update(ids)
        return sorted(g for g in found if allowed(g))

    async def describe(self, group_ids: Sequence[str], allows_topic: Callable[[str], bool] | None = None,
                       *, skip_unauthorized: bool = False) -> list[GroupView]:
        """Views of the groups that exist, in the order asked. A group the broker refuses to describe
        (GROUP_AUTHORIZATION_FAILED) raises, or is left out with ``skip_unauthorized`` (as Confluent's list
        leaves it out)."""
        views: dict[str, GroupView | None] = {}
        pending = list(dict.fromkeys(group_ids))
        for attempt in range(RETRIES):
            try:
                coordinators = await self.find_coordinators(pending)
            except BrokerResponseError as exc:
                if exc.code not in _COORDINATOR_RETRY or attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            by_node: dict[int, list[str]] = {}
            for g in pending:
                by_node.setdefault(coordinators[g], []).append(g)
            retry: list[str] = []
            last_code = 0
            results = await asyncio.gather(*(self._describe_at(node, gs) for node, gs in by_node.items()))
            not_classic: dict[int, list[str]] = {}
            for node, resp in zip(by_node, results, strict=True):
                for d in resp.groups:
                    if d.error_code in _COORDINATOR_RETRY:
                        retry.append(d.group_id)
                        last_code = d.error_code
                        continue
                    if d.error_code == GROUP_ID_NOT_FOUND:
                        not_classic.setdefault(node, []).append(d.group_id)  # unknown, or a consumer group
                        views[d.group_id] = None
                        continue
                    if skip_unauthorized and d.error_code == EC.GROUP_AUTHORIZATION_FAILED:
                        views[d.group_id] = None
                        continue
                    views[d.group_id] = group_view(d, node, self._local_members(d.group_id), allows_topic)
                    if views[d.group_id] is None:  # (DescribeGroups before v6 answers Dead for those too)
                        not_classic.setdefault(node, []).append(d.group_id)
            for node, gs in not_classic.items():
                for view in await self._describe_consumer_groups(node, gs, allows_topic):
                    views[view.group_id] = view
            if not retry:
                break
            pending = retry
            if attempt == RETRIES - 1:
                raise BrokerResponseError(last_code, f"DescribeGroups {retry!r} (retries exhausted)")
            await asyncio.sleep(RETRY_BACKOFF_S)
        # An empty simple group exists only while it holds committed offsets (Kafka describes an unknown
        # group as Dead, which group_view drops; Tansu describes it as Empty).
        unsure = [v for v in views.values() if v is not None and may_be_unknown(v)]
        offsets = await asyncio.gather(*(self.committed(v) for v in unsure))
        for v, committed in zip(unsure, offsets, strict=True):
            if not committed:
                views[v.group_id] = None
        out = [views.get(g) for g in dict.fromkeys(group_ids)]
        return [v for v in out if v is not None]

    async def group(self, group_id: str, allows_topic: Callable[[str], bool] | None = None) -> GroupView:
        found = await self.describe([group_id], allows_topic)
        if not found:
            raise GroupNotFound(f"Consumer Group {group_id} could not be found.")
        return found[0]

    async def _describe_consumer_groups(self, node: int, group_ids: list[str],
                                        allows_topic: Callable[[str], bool] | None) -> list[GroupView]:
        """Views of those of ``group_ids`` that are consumer-protocol groups (none on a broker without
        ConsumerGroupDescribe)."""
        conn = await self.client.connection(node).get()
        if not conn.versions or not conn.versions.has(M.ApiKey.CONSUMER_GROUP_DESCRIBE):
            return []
        resp = await conn.send(M.ConsumerGroupDescribeRequest(group_ids=group_ids, include_authorized_operations=False),
                               conn.version_for(M.ApiKey.CONSUMER_GROUP_DESCRIBE))
        views = [consumer_group_view(d, node, allows_topic) for d in resp.groups
                 if d.error_code != EC.GROUP_AUTHORIZATION_FAILED]
        return [v for v in views if v is not None]

    async def _describe_at(self, node: int, group_ids: list[str]) -> Any:
        conn = await self.client.connection(node).get()
        version = conn.version_for(M.ApiKey.DESCRIBE_GROUPS)
        return await conn.send(M.DescribeGroupsRequest(groups=group_ids, include_authorized_operations=False),
                               version)

    async def find_coordinators(self, group_ids: Sequence[str]) -> dict[str, int]:
        """The coordinator node of every group (batched FindCoordinator from v4; one request each before)."""
        conn = await self.client.any_connection()
        version = conn.version_for(M.ApiKey.FIND_COORDINATOR)
        answers: list[tuple[str, int, int, str, int, str | None]] = []  # key, code, node, host, port, message
        if version >= 4:
            resp = await conn.send(M.FindCoordinatorRequest(key_type=0, coordinator_keys=list(group_ids)), version)
            answers = [(c.key, c.error_code, c.node_id, c.host, c.port, c.error_message) for c in resp.coordinators]
        else:
            for g in group_ids:
                resp = await conn.send(M.FindCoordinatorRequest(key=g, key_type=0), version)
                answers.append((g, resp.error_code, resp.node_id, resp.host, resp.port, resp.error_message))
        out: dict[str, int] = {}
        for key, code, node, host, port, msg in answers:
            if code:
                raise BrokerResponseError(code, f"FindCoordinator({key!r})", msg)
            if self.client.metadata.broker(node) is None:
                self.client.metadata.brokers[node] = BrokerInfo(node, host, port)
            out[key] = node
        missing = [g for g in group_ids if g not in out]
        if missing:
            raise BrokerResponseError(EC.COORDINATOR_NOT_AVAILABLE, f"FindCoordinator: no answer for {missing!r}")
        return out

    # -- offsets and lag -----------------------------------------------------------------------------
    async def committed(self, group: GroupView) -> dict[TopicPartition, int]:
        """The group's committed offsets (every partition that has one), from its coordinator."""
        node = group.coordinator
        for attempt in range(RETRIES):
            conn = await self.client.connection(node).get()
            version = conn.version_for(M.ApiKey.OFFSET_FETCH)
            if version >= 8:
                req = M.OffsetFetchRequest(groups=[_FetchGroup(group_id=group.group_id, topics=None)],
                                           require_stable=False)
            else:
                req = M.OffsetFetchRequest(group_id=group.group_id, topics=None, require_stable=False)
            try:
                return committed_offsets(await conn.send(req, version), group.group_id, version)
            except BrokerResponseError as exc:
                if exc.code not in _COORDINATOR_RETRY or attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(RETRY_BACKOFF_S)
                node = (await self.find_coordinators([group.group_id]))[group.group_id]
        raise AssertionError("unreachable")

    async def log_end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offset of each partition (partitions that no longer exist are left out)."""
        tps = sorted(set(partitions))
        read = self._read_log_end
        if read is None:
            async def read(client: KafkaClient, tp: TopicPartition) -> int:
                return (await read_offsets(client, tp)).last_stable_offset

        limit = asyncio.Semaphore(LOG_END_CONCURRENCY)

        async def bounded(tp: TopicPartition) -> int:
            async with limit:
                return int(await read(self.client, tp))

        results = await asyncio.gather(*(bounded(tp) for tp in tps), return_exceptions=True)
        out: dict[TopicPartition, int] = {}
        for tp, r in zip(tps, results, strict=True):
            if isinstance(r, BrokerResponseError) and r.code == EC.UNKNOWN_TOPIC_OR_PARTITION:
                continue  # committed offsets of a deleted topic: no end offset, no lag (as Confluent)
            if isinstance(r, BaseException):
                raise r
            out[tp] = r
        return out

    async def lags(self, group: GroupView, allows_topic: Callable[[str], bool]) -> list[PartitionLag]:
        """Confluent's consumer lags of the group (topics the caller may not see are left out)."""
        committed = {tp: o for tp, o in (await self.committed(group)).items() if allows_topic(tp.topic)}
        if not committed:
            raise LagNotFound(f"Consumer group offsets of {group.group_id} could not be found.")
        ends = await self.log_end_offsets(committed)
        lags = consumer_lags(group, committed, ends)
        if not lags:
            raise LagNotFound("Consumer lags not found.")
        return lags


def local_view(instances: Iterable[Any], client_id: str) -> tuple[set[str], dict[str, dict[str, LocalMember]]]:
    """This process's groups and members from a tenant's consumer instances (``service.instances.registry``):
    (group ids, group id → member id → LocalMember). Instances without a member id (manual assignment,
    not joined yet) belong to their group but describe no member."""
    groups: set[str] = set()
    members: dict[str, dict[str, LocalMember]] = {}
    for inst in instances:
        if getattr(inst, "closed", False):
            continue
        consumer = inst.consumer
        groups.add(inst.group)
        member = getattr(consumer, "member", None)
        member_id = getattr(member, "member_id", "") if member is not None else ""
        if not member_id:
            continue
        try:
            assignment = tuple(sorted(consumer.assignment()))
        except KafkaError:  # pragma: no cover - a closing consumer
            assignment = ()
        protocol = getattr(member, "protocol_name", None) or ""
        members.setdefault(inst.group, {})[member_id] = LocalMember(client_id, assignment, protocol)
    return groups, members
