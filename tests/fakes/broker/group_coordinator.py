"""The consumer-group coordinator of the test broker (classic protocol), modelled on Apache Kafka's.

One :class:`GroupCoordinatorState` per cluster lives in ``ClusterState.extensions["groups"]``; get it
with :func:`group_coordinator`. The handlers in :mod:`tests.fakes.broker.handlers.groups` turn every request
version into the calls here, which take and return plain values. Timers (session expiry, the initial
rebalance delay, the rebalance and pending-sync timeouts) are asyncio timers of the running loop.

Kafka semantics reproduced:

* **Coordinator.** Each group has one coordinator broker: the lowest node id unless moved with
  :meth:`GroupCoordinatorState.move_coordinator`. Group requests that reach any other broker answer
  NOT_COORDINATOR; FindCoordinator answers COORDINATOR_NOT_AVAILABLE while the coordinator is down.
  Moving a group answers its parked JoinGroup/SyncGroup requests NOT_COORDINATOR and restarts every
  member's session timer (as when a new coordinator loads the group); members, generation, assignments
  and offsets move along.
* **JoinGroup.** A dynamic member without a member id gets MEMBER_ID_REQUIRED and a new id from v4 on
  (a pending member until it rejoins or its session times out); before v4, and for static members, it
  joins at once. The group's first rebalance waits ``group_join_delay_ms`` (Kafka's
  ``group.initial.rebalance.delay.ms``), extended while new members keep arriving, up to the rebalance
  timeout; later rebalances complete as soon as every known member has rejoined, or at the rebalance
  timeout, dropping the dynamic members that did not. Generations start at 1. The leader is the first
  member and stays leader while it rejoins. The protocol is chosen by votes among the protocols every
  member supports. A follower rejoining a stable group with unchanged metadata gets the current
  generation back without a rebalance; the leader rejoining, or changed metadata, triggers one.
* **Static membership.** A known ``group.instance.id`` joining without a member id takes over the old
  member (new member id, same assignment); in a stable group with an unchanged protocol choice there
  is no rebalance. The old member id is fenced: its requests carrying the instance id answer
  FENCED_INSTANCE_ID. Static members that do not rejoin are kept (until their session expires).
* **SyncGroup** waits for the leader's assignments (members it leaves out get an empty one);
  REBALANCE_IN_PROGRESS while preparing a rebalance; members that do not sync within the rebalance
  timeout are removed.
* **Heartbeat** keeps a member's session; REBALANCE_IN_PROGRESS while a rebalance is being prepared,
  ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID for stale members. A member whose session
  timer fires (not awaiting a JoinGroup/SyncGroup answer) is removed and the group rebalances.
* **OffsetCommit** accepts generation -1 with an empty member id only while the group is empty (a
  "simple" group is created if needed); otherwise member, instance and generation must match
  (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION) and a group completing a rebalance
  answers REBALANCE_IN_PROGRESS. A group that does not exist answers ILLEGAL_GENERATION (v9+:
  GROUP_ID_NOT_FOUND). Offsets keep their metadata and leader epoch.
* **ListGroups** lists the groups a broker coordinates with protocol type and state (v4+), also
  the groups made by manual commits (Empty, protocol type ""); a state filter (v4+) picks states.
* **OffsetFetch** answers -1 (leader epoch -1, metadata "") for unknown partitions; a null topic list
  means every committed partition. :meth:`GroupCoordinatorState.unstable_offsets` makes the next
  RequireStable fetches answer UNSTABLE_OFFSET_COMMIT, as pending transactional offsets do in Kafka.
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.protocol import error_codes as EC

if TYPE_CHECKING:
    from tests.fakes.broker.cluster import TestCluster
    from tests.fakes.broker.state import ClusterState

EXTENSION_KEY = "groups"

INVALID_GROUP_ID = EC.BY_NAME["INVALID_GROUP_ID"]
INVALID_SESSION_TIMEOUT = EC.BY_NAME["INVALID_SESSION_TIMEOUT"]
INCONSISTENT_GROUP_PROTOCOL = EC.BY_NAME["INCONSISTENT_GROUP_PROTOCOL"]
GROUP_MAX_SIZE_REACHED = EC.BY_NAME["GROUP_MAX_SIZE_REACHED"]
GROUP_ID_NOT_FOUND = EC.BY_NAME["GROUP_ID_NOT_FOUND"]
OFFSET_METADATA_TOO_LARGE = EC.BY_NAME["OFFSET_METADATA_TOO_LARGE"]
INVALID_REQUEST = EC.BY_NAME["INVALID_REQUEST"]

Protocol = tuple[str, bytes]  # (name, metadata) of a JoinGroup protocol
MemberInfo = tuple[str, str | None, bytes]  # (member id, group instance id, metadata) in a JoinGroup answer


class GroupPhase(enum.Enum):
    """Kafka's classic group states (the values are the names DescribeGroups reports)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass
class JoinOutcome:
    """The answer to one JoinGroup request."""

    error_code: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: list[MemberInfo] = field(default_factory=list)


@dataclass
class SyncOutcome:
    """The answer to one SyncGroup request."""

    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1


@dataclass(frozen=True)
class JoinSpec:
    """The member-describing fields of a JoinGroup request."""

    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    is_new: bool = True
    join_future: asyncio.Future[JoinOutcome] | None = field(default=None, repr=False)
    sync_future: asyncio.Future[SyncOutcome] | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    heartbeats: int = 0

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    def matches(self, protocols: Sequence[Protocol]) -> bool:
        return self.protocols == tuple(protocols)

    def complete_join(self, outcome: JoinOutcome) -> bool:
        fut, self.join_future = self.join_future, None
        if fut is not None and not fut.done():
            fut.set_result(outcome)
            return True
        return False

    def complete_sync(self, outcome: SyncOutcome) -> bool:
        fut, self.sync_future = self.sync_future, None
        if fut is not None and not fut.done():
            fut.set_result(outcome)
            return True
        return False

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@dataclass(eq=False)
class Group:
    group_id: str
    phase: GroupPhase = GroupPhase.EMPTY
    previous_phase: GroupPhase = GroupPhase.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: dict[str, asyncio.TimerHandle | None] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_sync: set[str] = field(default_factory=set)
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    new_member_added: bool = False
    join_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    sync_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    rebalances: int = 0  # completed join phases

    # -- queries ---------------------------------------------------------------------------------
    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def member_infos(self) -> list[MemberInfo]:
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    def assignments(self) -> dict[str, bytes]:
        return {mid: m.assignment for mid, m in self.members.items()}

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        """UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID / 0, as Kafka validates a member's request."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return EC.UNKNOWN_MEMBER_ID
            return EC.FENCED_INSTANCE_ID if current != member_id else 0
        return 0 if member_id in self.members else EC.UNKNOWN_MEMBER_ID

    def supports_protocols(self, protocol_type: str, protocols: Sequence[Protocol]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        counts = Counter(name for m in self.members.values() for name in set(m.protocol_names()))
        return any(counts[name] == len(self.members) for name, _ in protocols)

    def select_protocol(self) -> str | None:
        """The protocol every member supports with the most first-choice votes (ties: the first
        member's preference)."""
        members = list(self.members.values())
        if not members:
            return None
        candidates = set(members[0].protocol_names())
        for m in members[1:]:
            candidates &= set(m.protocol_names())
        if not candidates:
            return None
        votes: Counter[str] = Counter()
        for m in members:
            votes[next(n for n in m.protocol_names() if n in candidates)] += 1
        order = [n for n in members[0].protocol_names() if n in candidates]
        return max(order, key=lambda n: (votes[n], -order.index(n)))

    # -- membership changes (no rebalance logic) --------------------------------------------------
    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        member.cancel_timer()
        iid = member.group_instance_id
        if iid is not None and self.static_members.get(iid) == member_id:
            del self.static_members[iid]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        # A duplicate of the old instance may be parked in a JoinGroup/SyncGroup: fence it now.
        member.complete_join(JoinOutcome(EC.FENCED_INSTANCE_ID, old_id))
        member.complete_sync(SyncOutcome(EC.FENCED_INSTANCE_ID))
        member.cancel_timer()
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member


class GroupCoordinatorState:
    """Every group of one test cluster plus the coordinator's settings.

    Settings (plain attributes, change them any time):
        group_join_delay_ms: the initial rebalance delay of an empty group (Kafka: 3000 ms).
        min_session_timeout_ms / max_session_timeout_ms: JoinGroup answers INVALID_SESSION_TIMEOUT
            outside this range (Kafka: 6000 / 1800000; the minimum is 1 here so tests can be fast).
        new_member_join_timeout_ms: how long a new member's JoinGroup may stay parked (Kafka: 5 min).
        max_group_size: GROUP_MAX_SIZE_REACHED beyond this many members (None: unlimited).
        offset_metadata_max_bytes: OFFSET_METADATA_TOO_LARGE beyond this (Kafka: 4096).
    """

    def __init__(self, state: ClusterState, errors: list[BaseException] | None = None) -> None:
        self.state = state
        self.errors = errors if errors is not None else []
        self.groups: dict[str, Group] = {}
        self.default_coordinator: int | None = None
        self.coordinators: dict[str, int] = {}  # per-key overrides (group ids, transactional ids)
        self.group_join_delay_ms = 50
        self.min_session_timeout_ms = 1
        self.max_session_timeout_ms = 1_800_000
        self.new_member_join_timeout_ms = 300_000
        self.max_group_size: int | None = None
        self.offset_metadata_max_bytes = 4096
        self._unstable: dict[str, int] = {}
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    # -- test API ----------------------------------------------------------------------------------
    def coordinator_for(self, key: str) -> int:
        """The coordinator node of a group (or transactional id)."""
        if key in self.coordinators:
            return self.coordinators[key]
        if self.default_coordinator is not None:
            return self.default_coordinator
        return min(self.state.brokers)

    def move_coordinator(self, to: int, group_id: str | None = None) -> None:
        """Make ``to`` the coordinator of ``group_id`` (or of every group). Requests to the old
        coordinator then answer NOT_COORDINATOR; parked JoinGroup/SyncGroup requests are answered
        NOT_COORDINATOR and session timers restart, as when the new coordinator loads the group."""
        if to not in self.state.brokers:
            raise ValueError(f"unknown broker {to}")
        before = {gid: self.coordinator_for(gid) for gid in self.groups}
        if group_id is None:
            self.default_coordinator = to
            self.coordinators.clear()
        else:
            self.coordinators[group_id] = to
        for gid, old in before.items():
            if self.coordinator_for(gid) != old:
                self._unload(self.groups[gid])
        self._notify()

    def unstable_offsets(self, group_id: str, count: int = 1) -> None:
        """The next ``count`` OffsetFetch requests for ``group_id`` with RequireStable answer
        UNSTABLE_OFFSET_COMMIT for every partition (as while a transactional commit is pending)."""
        if count < 1:
            raise ValueError("count must be >= 1")
        self._unstable[group_id] = self._unstable.get(group_id, 0) + count

    def group(self, group_id: str) -> Group:
        return self.groups[group_id]

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        g = self.groups.get(group_id)
        return dict(g.offsets) if g is not None else {}

    def commit(self, group_id: str, topic: str, partition: int, offset: int, *, metadata: str = "",
               leader_epoch: int = -1) -> None:
        """Store a committed offset directly (as an admin tool would for an empty group)."""
        g = self._get_or_create(group_id)
        g.offsets[(topic, partition)] = CommittedOffset(offset, leader_epoch, metadata, _now_ms())
        self._notify()

    def expire_member(self, group_id: str, member_id: str) -> None:
        """Expire a member's session now (whatever it is doing) and update the group."""
        g = self.groups[group_id]
        if member_id in g.pending_members:
            self._remove_pending(g, member_id)
        else:
            self._remove_member_and_update(g, g.members[member_id])
        self._notify()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; it is re-checked after every change of group state."""
        if predicate():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (predicate, fut)
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def wait_for_phase(self, group_id: str, phase: GroupPhase, *, generation: int | None = None,
                             timeout: float = 10.0) -> Group:
        def ok() -> bool:
            g = self.groups.get(group_id)
            return g is not None and g.phase is phase and (generation is None or g.generation_id >= generation)

        await self.wait_until(ok, timeout)
        return self.groups[group_id]

    # -- request entry points ----------------------------------------------------------------------
    def check(self, node_id: int, group_id: str | None, *, allow_empty_id: bool = False) -> int:
        """The group-level error of a request for ``group_id`` received by ``node_id`` (0 if none)."""
        if group_id is None or (not group_id and not allow_empty_id):
            return INVALID_GROUP_ID
        if self.coordinator_for(group_id) != node_id:
            return EC.NOT_COORDINATOR
        return 0

    async def join(self, node_id: int, *, group_id: str, member_id: str, spec: JoinSpec, version: int) -> JoinOutcome:
        code = self.check(node_id, group_id)
        if code:
            return JoinOutcome(code, member_id)
        if not self.min_session_timeout_ms <= spec.session_timeout_ms <= self.max_session_timeout_ms:
            return JoinOutcome(INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.get(group_id)
        unknown = member_id == ""
        if group is None:
            if not unknown:
                return JoinOutcome(EC.UNKNOWN_MEMBER_ID, member_id)
            group = self._get_or_create(group_id)
        if not self._accept_joining(group, member_id):
            return JoinOutcome(GROUP_MAX_SIZE_REACHED, "")
        if not group.supports_protocols(spec.protocol_type, spec.protocols):
            return JoinOutcome(INCONSISTENT_GROUP_PROTOCOL, member_id)
        fut: asyncio.Future[JoinOutcome] = asyncio.get_running_loop().create_future()
        try:
            if unknown:
                if spec.group_instance_id is not None:
                    new_id = f"{spec.group_instance_id}-{uuid.uuid4()}"
                    existing = group.static_members.get(spec.group_instance_id)
                    if existing is not None:
                        self._update_static_member(group, existing, new_id, spec, fut, version)
                    else:
                        self._add_member(group, new_id, spec, fut)
                else:
                    new_id = f"{spec.client_id}-{uuid.uuid4()}"
                    if version >= 4:
                        group.pending_members[new_id] = self._timer(spec.session_timeout_ms, self._expire_session,
                                                                    group_id, new_id)
                        return JoinOutcome(EC.MEMBER_ID_REQUIRED, new_id)
                    self._add_member(group, new_id, spec, fut)
            elif member_id in group.pending_members:
                if spec.group_instance_id is not None:
                    return JoinOutcome(INVALID_REQUEST, member_id)
                timer = group.pending_members.pop(member_id)
                if timer is not None:
                    timer.cancel()
                self._add_member(group, member_id, spec, fut)
            else:
                code = group.validate_member(member_id, spec.group_instance_id)
                if code:
                    return JoinOutcome(code, member_id)
                member = group.members[member_id]
                if group.phase is GroupPhase.PREPARING_REBALANCE:
                    self._update_member(member, spec, fut)
                    self._maybe_complete_join_phase(group)
                elif group.phase is GroupPhase.COMPLETING_REBALANCE:
                    if member.matches(spec.protocols):
                        return self._current_generation(group, member_id, with_members=group.is_leader(member_id))
                    self._update_member(member, spec, fut)
                    self._maybe_prepare_rebalance(group)
                elif group.phase is GroupPhase.STABLE:
                    if group.is_leader(member_id) or not member.matches(spec.protocols):
                        self._update_member(member, spec, fut)
                        self._maybe_prepare_rebalance(group)
                    else:
                        return self._current_generation(group, member_id, with_members=False)
                else:
                    return JoinOutcome(EC.UNKNOWN_MEMBER_ID, member_id)
        finally:
            self._notify()
        return await fut

    async def sync(self, node_id: int, *, group_id: str, generation_id: int, member_id: str,
                   group_instance_id: str | None, protocol_type: str | None, protocol_name: str | None,
                   assignments: Sequence[tuple[str, bytes]]) -> SyncOutcome:
        code = self.check(node_id, group_id)
        if code:
            return SyncOutcome(code)
        group = self.groups.get(group_id)
        if group is None:
            return SyncOutcome(EC.UNKNOWN_MEMBER_ID)
        code = group.validate_member(member_id, group_instance_id)
        if code:
            return SyncOutcome(code)
        if generation_id != group.generation_id:
            return SyncOutcome(EC.ILLEGAL_GENERATION)
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(protocol_name, group.protocol_name):
            return SyncOutcome(INCONSISTENT_GROUP_PROTOCOL)
        if group.phase is GroupPhase.EMPTY:
            return SyncOutcome(EC.UNKNOWN_MEMBER_ID)
        if group.phase is GroupPhase.PREPARING_REBALANCE:
            return SyncOutcome(EC.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        if group.phase is GroupPhase.STABLE:
            self._remove_pending_sync(group, member_id)
            self._notify()
            return SyncOutcome(0, member.assignment, group.protocol_type, group.protocol_name)
        # CompletingRebalance: park until the leader's assignments arrive
        member.complete_sync(SyncOutcome(EC.REBALANCE_IN_PROGRESS))  # a duplicate request supersedes
        fut: asyncio.Future[SyncOutcome] = asyncio.get_running_loop().create_future()
        member.sync_future = fut
        self._remove_pending_sync(group, member_id)
        if group.is_leader(member_id):
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.previous_phase, group.phase = group.phase, GroupPhase.STABLE
            self._propagate_assignment(group, 0)
        self._notify()
        return await fut

    def heartbeat(self, node_id: int, *, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None) -> int:
        code = self.check(node_id, group_id)
        if code:
            return code
        group = self.groups.get(group_id)
        if group is None:
            return EC.UNKNOWN_MEMBER_ID
        code = group.validate_member(member_id, group_instance_id)
        if code:
            return code
        if generation_id != group.generation_id:
            return EC.ILLEGAL_GENERATION
        if group.phase is GroupPhase.EMPTY:
            return EC.UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        member.heartbeats += 1
        self._reschedule(group, member, member.session_timeout_ms)
        if group.phase is GroupPhase.PREPARING_REBALANCE:
            return EC.REBALANCE_IN_PROGRESS
        return 0

    def leave(self, node_id: int, *, group_id: str, members: Sequence[tuple[str, str | None]]
              ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """Remove members; returns the group-level error and (member id, instance id, error) per member."""
        code = self.check(node_id, group_id)
        if code:
            return code, []
        group = self.groups.get(group_id)
        if group is None:
            return 0, [(mid, iid, EC.UNKNOWN_MEMBER_ID) for mid, iid in members]
        results: list[tuple[str, str | None, int]] = []
        for mid, iid in members:
            if mid == "":
                # administrative removal by group.instance.id
                current = group.static_members.get(iid) if iid is not None else None
                if current is None:
                    results.append((mid, iid, EC.UNKNOWN_MEMBER_ID))
                else:
                    self._remove_current_member(group, current)
                    results.append((mid, iid, 0))
            elif mid in group.pending_members:
                self._drop_pending(group, mid)
                results.append((mid, iid, 0))
            else:
                code = group.validate_member(mid, iid)
                if not code:
                    self._remove_current_member(group, mid)
                results.append((mid, iid, code))
        if any(c == 0 for _, _, c in results):
            if group.phase in (GroupPhase.STABLE, GroupPhase.COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance(group)
            elif group.phase is GroupPhase.PREPARING_REBALANCE:
                self._maybe_complete_join_phase(group)
        self._notify()
        return 0, results

    def commit_offsets(self, node_id: int, *, group_id: str, generation_id: int, member_id: str,
                       group_instance_id: str | None,
                       offsets: Sequence[tuple[str, int, int, int, str | None]], version: int
                       ) -> list[tuple[str, int, int]]:
        """Store ``(topic, partition, offset, leader epoch, metadata)`` entries; returns
        (topic, partition, error) per entry."""
        code = self.check(node_id, group_id, allow_empty_id=True)
        group = self.groups.get(group_id)
        if not code:
            if group is None:
                if generation_id < 0:
                    group = self._get_or_create(group_id)  # a "simple" group, only storing offsets
                else:
                    code = GROUP_ID_NOT_FOUND if version >= 9 else EC.ILLEGAL_GENERATION
            else:
                code = self._validate_commit(group, generation_id, member_id, group_instance_id)
        out: list[tuple[str, int, int]] = []
        now = _now_ms()
        for topic, partition, offset, epoch, metadata in offsets:
            t = self.state.topics.get(topic)
            pcode = code
            if t is None or not 0 <= partition < len(t.partitions):
                pcode = EC.UNKNOWN_TOPIC_OR_PARTITION
            elif not pcode and metadata is not None and len(metadata.encode()) > self.offset_metadata_max_bytes:
                pcode = OFFSET_METADATA_TOO_LARGE
            if not pcode and group is not None:
                group.offsets[(topic, partition)] = CommittedOffset(offset, epoch, metadata or "", now)
            out.append((topic, partition, pcode))
        if not code and group is not None and member_id in group.members:
            m = group.members[member_id]
            self._reschedule(group, m, m.session_timeout_ms)
        self._notify()
        return out

    def fetch_offsets(self, node_id: int, *, group_id: str, topics: Sequence[tuple[str, Sequence[int]]] | None,
                      require_stable: bool) -> tuple[int,
                                                     list[tuple[str, list[tuple[int, CommittedOffset | None, int]]]]]:
        """Committed offsets: the group-level error and, per topic, (partition, offset or None, error)."""
        code = self.check(node_id, group_id, allow_empty_id=True)
        if code:
            return code, []
        unstable = False
        if require_stable and self._unstable.get(group_id, 0) > 0:
            self._unstable[group_id] -= 1
            unstable = True
        group = self.groups.get(group_id)
        stored = group.offsets if group is not None else {}
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(stored):
                by_topic.setdefault(t, []).append(p)
            wanted: list[tuple[str, Sequence[int]]] = list(by_topic.items())
        else:
            wanted = list(topics)
        out = []
        for t, parts in wanted:
            if unstable:
                out.append((t, [(p, None, EC.UNSTABLE_OFFSET_COMMIT) for p in parts]))
            else:
                out.append((t, [(p, stored.get((t, p)), 0) for p in parts]))
        return 0, out

    def list_groups(self, node_id: int, states: Sequence[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group ``node_id`` coordinates, as Kafka's ListGroups
        answers them: groups made by a manual commit are listed too (protocol type ""), and a state filter
        matches state names case-insensitively (empty: every state)."""
        wanted = {s.lower() for s in states}
        return [(g.group_id, g.protocol_type or "", g.phase.value) for g in self.groups.values()
                if self.coordinator_for(g.group_id) == node_id and (not wanted or g.phase.value.lower() in wanted)]

    def describe(self, node_id: int, group_id: str) -> tuple[int, Group | None]:
        code = self.check(node_id, group_id, allow_empty_id=True)
        if code:
            return code, None
        return 0, self.groups.get(group_id)

    # -- internals: join phase ----------------------------------------------------------------------
    def _get_or_create(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        return g

    def _accept_joining(self, group: Group, member_id: str) -> bool:
        limit = self.max_group_size
        if limit is None or group.phase is GroupPhase.EMPTY:
            return True
        if group.phase is GroupPhase.PREPARING_REBALANCE:
            m = group.members.get(member_id)
            return (m is not None and m.awaiting_join) or group.awaiting_join_count() < limit
        return member_id in group.members or len(group.members) < limit

    def _current_generation(self, group: Group, member_id: str, *, with_members: bool) -> JoinOutcome:
        return JoinOutcome(0, member_id, group.generation_id, group.protocol_type, group.protocol_name,
                           group.leader_id or "", members=group.member_infos() if with_members else [])

    def _add_member(self, group: Group, member_id: str, spec: JoinSpec, fut: asyncio.Future[JoinOutcome]) -> None:
        member = Member(member_id, spec.group_instance_id, spec.client_id, spec.client_host, spec.session_timeout_ms,
                        spec.rebalance_timeout_ms, spec.protocol_type, spec.protocols)
        member.join_future = fut
        if group.phase is GroupPhase.PREPARING_REBALANCE and group.previous_phase is GroupPhase.EMPTY:
            group.new_member_added = True
        group.add(member)
        # A parked JoinGroup cannot heartbeat: a new member's join times out on its own timer.
        self._reschedule(group, member, self.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group)

    def _update_member(self, member: Member, spec: JoinSpec, fut: asyncio.Future[JoinOutcome]) -> None:
        # The same member joining again on another connection supersedes its parked request.
        member.complete_join(JoinOutcome(EC.REBALANCE_IN_PROGRESS, member.member_id))
        member.protocols = spec.protocols
        member.session_timeout_ms = spec.session_timeout_ms
        member.rebalance_timeout_ms = spec.rebalance_timeout_ms
        member.join_future = fut

    def _update_static_member(self, group: Group, old_id: str, new_id: str, spec: JoinSpec,
                              fut: asyncio.Future[JoinOutcome], version: int) -> None:
        assert spec.group_instance_id is not None
        current_leader = group.leader_id
        member = group.replace_static_member(spec.group_instance_id, old_id, new_id)
        self._reschedule(group, member, spec.session_timeout_ms)
        self._update_member(member, spec, fut)
        if group.phase is GroupPhase.STABLE:
            if group.protocol_name == group.select_protocol():
                # No rebalance: the member takes over its predecessor's assignment.
                is_leader = group.is_leader(new_id)
                if version >= 9:
                    outcome = JoinOutcome(0, new_id, group.generation_id, group.protocol_type, group.protocol_name,
                                          group.leader_id or "", skip_assignment=is_leader,
                                          members=group.member_infos() if is_leader else [])
                else:
                    # Older clients are told the old leader id, so a returning leader does not
                    # compute an assignment a stable group would ignore.
                    outcome = JoinOutcome(0, new_id, group.generation_id, group.protocol_type, group.protocol_name,
                                          current_leader or "")
                member.complete_join(outcome)
            else:
                self._maybe_prepare_rebalance(group)
        elif group.phase is GroupPhase.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id: rebalance again.
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _maybe_prepare_rebalance(self, group: Group) -> None:
        if group.phase in (GroupPhase.STABLE, GroupPhase.COMPLETING_REBALANCE, GroupPhase.EMPTY):
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.phase is GroupPhase.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
            self._propagate_assignment(group, EC.REBALANCE_IN_PROGRESS)
        self._cancel_sync_timer(group)
        group.pending_sync.clear()
        initial = group.phase is GroupPhase.EMPTY
        group.previous_phase, group.phase = group.phase, GroupPhase.PREPARING_REBALANCE
        if initial:
            delay = self.group_join_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            self._schedule_join(group, delay, self._try_complete_initial, group.group_id, delay, remaining)
        elif group.has_all_members_joined():
            self._complete_join(group)
        else:
            self._schedule_join(group, group.rebalance_timeout_ms, self._complete_join_by_id, group.group_id)

    def _maybe_complete_join_phase(self, group: Group) -> None:
        if (group.phase is GroupPhase.PREPARING_REBALANCE and group.has_all_members_joined()
                and group.previous_phase is not GroupPhase.EMPTY):
            self._complete_join(group)

    def _try_complete_initial(self, group_id: str, delay: int, remaining: int) -> None:
        group = self.groups.get(group_id)
        if group is None or group.phase is not GroupPhase.PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            new_delay = min(self.group_join_delay_ms, remaining)
            self._schedule_join(group, new_delay, self._try_complete_initial, group_id, new_delay,
                                max(remaining - delay, 0))
        else:
            self._complete_join(group)

    def _complete_join_by_id(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.phase is GroupPhase.PREPARING_REBALANCE:
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        for m in list(group.members.values()):
            if not m.awaiting_join and m.group_instance_id is None:
                group.remove(m.member_id)  # dynamic members that did not rejoin in time
        if group.members and not self._elect_joined_leader(group):
            # nobody rejoined: wait another rebalance timeout for sessions to expire
            self._schedule_join(group, group.rebalance_timeout_ms, self._complete_join_by_id, group.group_id)
            return
        group.generation_id += 1
        group.rebalances += 1
        group.previous_phase = group.phase
        group.pending_sync.clear()
        if not group.members:
            group.protocol_name = None
            group.phase = GroupPhase.EMPTY
            return
        group.protocol_name = group.select_protocol()
        group.phase = GroupPhase.COMPLETING_REBALANCE
        infos = group.member_infos()
        for m in group.members.values():
            leader = group.is_leader(m.member_id)
            m.complete_join(JoinOutcome(0, m.member_id, group.generation_id, group.protocol_type, group.protocol_name,
                                        group.leader_id or "", members=infos if leader else []))
            self._reschedule(group, m, m.session_timeout_ms)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        self._cancel_sync_timer(group)
        group.sync_timer = self._timer(group.rebalance_timeout_ms, self._expire_pending_sync, group.group_id,
                                       group.generation_id)

    def _elect_joined_leader(self, group: Group) -> bool:
        if group.leader_id is None:
            return False
        leader = group.members.get(group.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for m in group.members.values():
            if m.awaiting_join:
                group.leader_id = m.member_id
                return True
        return False

    # -- internals: sync phase ----------------------------------------------------------------------
    def _propagate_assignment(self, group: Group, code: int) -> None:
        for m in group.members.values():
            outcome = SyncOutcome(code, m.assignment if not code else b"",
                                  group.protocol_type if not code else None, group.protocol_name if not code else None)
            if m.complete_sync(outcome):
                self._reschedule(group, m, m.session_timeout_ms)

    def _remove_pending_sync(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._cancel_sync_timer(group)

    def _cancel_sync_timer(self, group: Group) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def _expire_pending_sync(self, group_id: str, generation: int) -> None:
        group = self.groups.get(group_id)
        if group is None or group.generation_id != generation:
            return
        if group.phase in (GroupPhase.COMPLETING_REBALANCE, GroupPhase.STABLE) and group.pending_sync:
            for mid in list(group.pending_sync):
                m = group.remove(mid)
                if m is not None:
                    m.complete_sync(SyncOutcome(EC.UNKNOWN_MEMBER_ID))
            self._prepare_rebalance(group)

    # -- internals: sessions and removal -----------------------------------------------------------
    def _expire_session(self, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is None:
            return
        if member_id in group.pending_members:
            self._remove_pending(group, member_id)
            return
        member = group.members.get(member_id)
        if member is None:
            return
        if member.is_new or not (member.awaiting_join or member.awaiting_sync):
            self._remove_member_and_update(group, member)

    def _remove_pending(self, group: Group, member_id: str) -> None:
        self._drop_pending(group, member_id)
        if group.phase is GroupPhase.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group)

    def _drop_pending(self, group: Group, member_id: str) -> None:
        timer = group.pending_members.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def _remove_current_member(self, group: Group, member_id: str) -> None:
        member = group.remove(member_id)
        if member is not None:
            member.complete_join(JoinOutcome(EC.UNKNOWN_MEMBER_ID, ""))
            member.complete_sync(SyncOutcome(EC.UNKNOWN_MEMBER_ID))

    def _remove_member_and_update(self, group: Group, member: Member) -> None:
        self._remove_current_member(group, member.member_id)
        if group.phase in (GroupPhase.STABLE, GroupPhase.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group)
        elif group.phase is GroupPhase.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group)

    def _validate_commit(self, group: Group, generation_id: int, member_id: str, group_instance_id: str | None) -> int:
        if generation_id < 0 and group.phase is GroupPhase.EMPTY:
            return 0  # a consumer without group management (or an admin tool) on an empty group
        if generation_id >= 0 or member_id or group_instance_id is not None:
            code = group.validate_member(member_id, group_instance_id)
            if code:
                return code
            if generation_id != group.generation_id:
                return EC.ILLEGAL_GENERATION
        else:
            return EC.UNKNOWN_MEMBER_ID  # only members may commit while the group has members
        if group.phase is GroupPhase.COMPLETING_REBALANCE:
            return EC.REBALANCE_IN_PROGRESS
        return 0

    def _unload(self, group: Group) -> None:
        for m in group.members.values():
            m.complete_join(JoinOutcome(EC.NOT_COORDINATOR, m.member_id))
            m.complete_sync(SyncOutcome(EC.NOT_COORDINATOR))
            self._reschedule(group, m, m.session_timeout_ms)

    # -- timers -----------------------------------------------------------------------------------
    def _timer(self, ms: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(max(ms, 0) / 1000, self._fire, fn, args)

    def _fire(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a bug in the coordinator: make the test fail
            self.errors.append(exc)
        self._notify()

    def _reschedule(self, group: Group, member: Member, ms: float) -> None:
        member.cancel_timer()
        member.timer = self._timer(ms, self._expire_session, group.group_id, member.member_id)

    def _schedule_join(self, group: Group, ms: float, fn: Callable[..., None], *args: Any) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
        group.join_timer = self._timer(ms, fn, *args)

    def _notify(self) -> None:
        for pred, fut in list(self._waiters):
            if fut.done():
                continue
            try:
                ok = pred()
            except Exception as exc:
                fut.set_exception(exc)
                continue
            if ok:
                fut.set_result(None)


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


def _now_ms() -> int:
    return int(time.time() * 1000)


def group_coordinator(cluster: TestCluster) -> GroupCoordinatorState:
    """The group coordinator state of ``cluster`` (created on first use)."""
    ext = cluster.state.extensions
    gc = ext.get(EXTENSION_KEY)
    if gc is None:
        gc = ext[EXTENSION_KEY] = GroupCoordinatorState(cluster.state, cluster.errors)
    return gc


__all__ = [
    "EXTENSION_KEY",
    "CommittedOffset",
    "Group",
    "GroupCoordinatorState",
    "GroupPhase",
    "JoinOutcome",
    "JoinSpec",
    "Member",
    "SyncOutcome",
    "group_coordinator",
]
