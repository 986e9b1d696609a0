"""Consumer group membership as a pure state machine (classic protocol: JoinGroup/SyncGroup/Heartbeat).

The asyncio driver (:mod:`service.group.coordinator`) asks this object for the next request, sends it,
and feeds the decoded response back; the returned :class:`Step` says what to do next. Error handling
follows the Java consumer: MEMBER_ID_REQUIRED → rejoin at once with the given id; UNKNOWN_MEMBER_ID →
forget the member id and rejoin; ILLEGAL_GENERATION → forget the generation and rejoin;
REBALANCE_IN_PROGRESS → rejoin; coordinator errors → rediscover the coordinator; FENCED_INSTANCE_ID and
configuration/authorization errors are fatal for the member.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.client.errors import BrokerResponseError
from service.consumer.subscription import TopicPartition
from service.group import protocol as cp
from service.group.assignors import Assignor, MemberSubscription
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol.errors import ProtocolDecodeError

JoinProtocol = M.struct("JoinGroupRequest", "JoinGroupRequestProtocol")
SyncAssignment = M.struct("SyncGroupRequest", "SyncGroupRequestAssignment")
MemberIdentity = M.struct("LeaveGroupRequest", "MemberIdentity")

COORDINATOR_ERRORS = frozenset({EC.COORDINATOR_NOT_AVAILABLE, EC.NOT_COORDINATOR})
RETRY_ERRORS = frozenset({EC.COORDINATOR_LOAD_IN_PROGRESS})


def _shared(s: str | None) -> str | None:
    """``s`` interned: what every member of a group decodes alike (leader id, protocol) is then kept once."""
    return sys.intern(s) if type(s) is str else s


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"  # JoinGroup in flight
    SYNCING = "syncing"  # SyncGroup in flight
    STABLE = "stable"
    FATAL = "fatal"


class Action(enum.Enum):
    SYNC = "sync"  # send step.request (SyncGroup)
    ASSIGN = "assign"  # leader: fetch metadata for step.topics then call member.leader_sync()
    REJOIN = "rejoin"  # send a new JoinGroup now
    RETRY = "retry"  # back off, then rejoin
    REDISCOVER = "rediscover"  # coordinator moved: find it again, then rejoin
    DONE = "done"  # stable with an assignment
    OK = "ok"  # heartbeat fine
    FATAL = "fatal"  # step.error must be surfaced to the owner


@dataclass
class Step:
    action: Action
    request: Any = None
    error: BrokerResponseError | None = None
    topics: list[str] = field(default_factory=list)
    assigned: list[TopicPartition] = field(default_factory=list)
    revoked: list[TopicPartition] = field(default_factory=list)
    added: list[TopicPartition] = field(default_factory=list)


class GroupMember:
    def __init__(
        self,
        group_id: str,
        assignors: Sequence[Assignor],
        *,
        group_instance_id: str | None = None,
        session_timeout_ms: int = 45000,
        rebalance_timeout_ms: int = 300000,
        rack_id: str | None = None,
        protocol_type: str = "consumer",
    ) -> None:
        if not assignors:
            raise ValueError("at least one assignor is required")
        protocols = {a.rebalance_protocol for a in assignors}
        self.group_id = group_id
        self.assignors = tuple(assignors)  # (the consumer's shared tuple is kept as it is: idle memory)
        # As in Java, the incremental protocol is used only when every configured assignor supports it
        # (the default ["range", "cooperative-sticky"] therefore stays eager).
        self.cooperative = protocols == {"COOPERATIVE"}
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.rack_id = rack_id
        self.protocol_type = protocol_type
        self.member_id = ""
        self.generation_id = -1
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.state = MemberState.UNJOINED
        self.owned: list[TopicPartition] = []
        self.subscription: list[str] = []
        self.rejoin_needed = True
        self.rejoin_reason = "initial join"
        self.fatal_error: BrokerResponseError | None = None
        # leader only: JoinGroup members of the current generation (a shared empty tuple otherwise, as the list
        # of unreadable subscriptions: memory per idle member)
        self._members: Sequence[Any] = ()
        self.rebalances = 0
        self.bad_subscriptions: Sequence[tuple[str, str]] = ()
        #: group.instance.id -> member ids the coordinator listed for it in the last JoinGroup, when more than one
        self.shared_instance_ids: dict[str, list[str]] = {}
        #: leader only: the latest assignment it computed, as {member id: partition count} (for logs)
        self.last_plan: dict[str, int] = {}
        self.skipped_assignment = False  # the last JoinGroup made this member leader with skip_assignment set

    # -- helpers --------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.leader_id == self.member_id

    @property
    def generation_valid(self) -> bool:
        return self.state is MemberState.STABLE and self.generation_id >= 0

    def _owned_map(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for tp in self.owned:
            out.setdefault(tp.topic, []).append(tp.partition)
        return out

    def stalled(self, unstable_for_s: float, failed_rounds: int) -> bool:
        """Whether a member that has been trying to reach a stable generation for ``unstable_for_s`` seconds,
        with ``failed_rounds`` JoinGroup/SyncGroup answers that were errors, should stop retrying the usual way
        (see GroupCoordinator._recover_stall): after one session timeout, when the broker would have expired
        any member that stopped heartbeating, and at least two failed rounds (one JoinGroup plus SyncGroup
        round may legitimately take about a session timeout on a broker that holds them), a rebalance that
        still does not complete is stuck on a member that is gone."""
        return (self.state is not MemberState.FATAL and failed_rounds >= 2
                and unstable_for_s * 1000 > self.session_timeout_ms)

    def adopt_member_id(self, member_id: str, reason: str) -> None:
        """Rejoin under ``member_id`` (a departed leader's id a broker keeps naming as leader; see
        GroupCoordinator._recover_stall)."""
        self.member_id = member_id
        self.reset_generation(reason)

    def reset_generation(self, reason: str) -> None:
        self.generation_id = -1
        self.protocol_name = None
        self.leader_id = None
        self.state = MemberState.UNJOINED
        self.request_rejoin(reason)

    def reset_member(self, reason: str) -> None:
        self.member_id = ""
        self.reset_generation(reason)

    def request_rejoin(self, reason: str) -> None:
        self.rejoin_needed = True
        self.rejoin_reason = reason

    def _fatal(self, code: int, context: str, message: str | None = None) -> Step:
        self.state = MemberState.FATAL
        self.fatal_error = BrokerResponseError(code, f"{context} for group {self.group_id!r}", message)
        return Step(Action.FATAL, error=self.fatal_error)

    # -- join -----------------------------------------------------------------------------------
    def prepare_join(self) -> list[TopicPartition]:
        """onJoinPrepare: partitions to revoke before joining (all of them under the eager protocol)."""
        if self.cooperative:
            return []
        revoked, self.owned = self.owned, []
        return revoked

    def join_request(self, topics: Iterable[str]) -> Any:
        self.subscription = sorted(set(topics))
        meta = cp.encode_subscription(
            self.subscription,
            owned_partitions=self._owned_map() if self.cooperative else None,
            generation_id=self.generation_id,
            rack_id=self.rack_id,
        )
        self.state = MemberState.JOINING
        reason = self.rejoin_reason
        self.rejoin_needed = False
        return M.JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
            protocol_type=self.protocol_type,
            protocols=[JoinProtocol(name=a.name, metadata=meta) for a in self.assignors],
            reason=reason,
        )

    def on_join_response(self, resp: Any) -> Step:
        code = resp.error_code
        if code == EC.NONE:
            self.member_id = resp.member_id
            self.generation_id = resp.generation_id
            # one string per group, not one per member (memory per idle instance)
            self.protocol_name = _shared(resp.protocol_name)
            self.leader_id = _shared(resp.leader)
            self.state = MemberState.SYNCING
            # KIP-814 (JoinGroup v9+): a static leader that rejoined a stable group is told to skip the assignment:
            # the coordinator keeps the current one and would discard whatever the leader sent
            self.skipped_assignment = bool(self.is_leader and getattr(resp, "skip_assignment", False))
            if self.is_leader and not self.skipped_assignment:
                self._members = list(resp.members)
                topics: set[str] = set()
                for m in self._members:
                    try:
                        topics.update(cp.decode_subscription(m.metadata).topics)
                    except ProtocolDecodeError:
                        continue  # reported by leader_sync
                return Step(Action.ASSIGN, topics=sorted(topics))
            return Step(Action.SYNC, request=self._sync_request([]))
        self.state = MemberState.UNJOINED
        if code == EC.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            self.request_rejoin("member id assigned by the coordinator")
            return Step(Action.REJOIN)
        # During JoinGroup a rebalance in progress means "try again shortly"; during SyncGroup it
        # means "rejoin now".
        return self._rejoin_error(code, "JoinGroup", rebalance=Action.RETRY, suffix="")

    def leader_sync(self, partitions_per_topic: dict[str, int]) -> Step:
        """As leader, run the chosen assignor over every member's subscription and build SyncGroup."""
        assignor = next((a for a in self.assignors if a.name == self.protocol_name), None)
        if assignor is None:
            return self._fatal(EC.BY_NAME["INCONSISTENT_GROUP_PROTOCOL"], "JoinGroup",
                               f"coordinator chose unknown assignor {self.protocol_name!r}")
        subs: dict[str, MemberSubscription] = {}
        bad: list[tuple[str, str]] = []
        self.bad_subscriptions = bad
        for m in self._members:
            try:
                subs[m.member_id] = MemberSubscription.from_metadata(m.member_id, m.metadata, m.group_instance_id)
            except ProtocolDecodeError as exc:
                # A member sent garbage: it gets nothing (instead of failing the whole group's rebalance).
                bad.append((m.member_id, str(exc)))
                subs[m.member_id] = MemberSubscription(member_id=m.member_id, group_instance_id=m.group_instance_id)
        # Apache Kafka never lists two members with one group.instance.id (a static member that rejoins replaces
        # its old member id). Tansu at times lists the departed id next to the new one after a hand-off: the
        # assignor would give the departed id, which never syncs, a share nobody consumes until the stall
        # recovery. Such members are assigned as one (the last listed decides the subscription) and each of
        # their ids gets that share: whichever is live consumes it.
        by_instance: dict[str, list[str]] = {}
        for mid, sub in subs.items():
            if sub.group_instance_id is not None:
                by_instance.setdefault(sub.group_instance_id, []).append(mid)
        self.shared_instance_ids = {iid: mids for iid, mids in by_instance.items() if len(mids) > 1}
        stand_in = {mid: mids[-1] for mids in self.shared_instance_ids.values() for mid in mids[:-1]}
        result = assignor.assign(partitions_per_topic, {mid: s for mid, s in subs.items() if mid not in stand_in})
        for mid, rep in stand_in.items():
            result[mid] = result.get(rep, {})
        self.last_plan = {mid: sum(len(ps) for ps in result.get(mid, {}).values()) for mid in subs}
        assignments = [
            SyncAssignment(member_id=mid, assignment=cp.encode_assignment(result.get(mid, {})))
            for mid in subs
        ]
        self._members = ()
        return Step(Action.SYNC, request=self._sync_request(assignments))

    def _sync_request(self, assignments: list[Any]) -> Any:
        return M.SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation_id,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            assignments=assignments,
        )

    def on_sync_response(self, resp: Any) -> Step:
        code = resp.error_code
        if code == EC.NONE:
            assignment = cp.decode_assignment(resp.assignment or b"")
            new = [TopicPartition(t, p) for t, p in assignment.pairs()]
            old = set(self.owned)
            new_set = set(new)
            revoked = [tp for tp in self.owned if tp not in new_set]
            added = [tp for tp in new if tp not in old]
            self.owned = new
            self.state = MemberState.STABLE
            self.rebalances += 1
            if self.cooperative and revoked:
                # KIP-429: give up what moved, then rejoin so the new owner can take it.
                self.request_rejoin("partitions revoked in a cooperative rebalance")
            return Step(Action.DONE, assigned=new, revoked=revoked, added=added)
        self.state = MemberState.UNJOINED
        return self._rejoin_error(code, "SyncGroup", rebalance=Action.REJOIN, suffix=" during sync")

    def _rejoin_error(self, code: int, api: str, *, rebalance: Action, suffix: str) -> Step:
        """The error handling JoinGroup and SyncGroup share (as in Java's coordinator)."""
        if code == EC.UNKNOWN_MEMBER_ID:
            self.reset_member("coordinator does not know this member")
            return Step(Action.REJOIN)
        if code == EC.ILLEGAL_GENERATION:
            self.reset_generation(f"illegal generation{suffix}")
            return Step(Action.REJOIN)
        if code == EC.REBALANCE_IN_PROGRESS:
            self.request_rejoin(f"rebalance in progress{suffix}")
            return Step(rebalance)
        if code in COORDINATOR_ERRORS:
            self.request_rejoin("coordinator moved")
            return Step(Action.REDISCOVER)
        if code in RETRY_ERRORS:
            self.request_rejoin("coordinator loading")
            return Step(Action.RETRY)
        return self._fatal(code, api)

    # -- heartbeat ------------------------------------------------------------------------------
    def heartbeat_request(self) -> Any:
        return M.HeartbeatRequest(
            group_id=self.group_id,
            generation_id=self.generation_id,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
        )

    def on_heartbeat_response(self, resp: Any) -> Step:
        code = resp.error_code
        if code == EC.NONE:
            return Step(Action.OK)
        if code == EC.REBALANCE_IN_PROGRESS:
            self.request_rejoin("group is rebalancing")
            return Step(Action.REJOIN)
        if code == EC.ILLEGAL_GENERATION:
            self.reset_generation("heartbeat: illegal generation")
            return Step(Action.REJOIN)
        if code == EC.UNKNOWN_MEMBER_ID:
            self.reset_member("heartbeat: unknown member")
            return Step(Action.REJOIN)
        if code in COORDINATOR_ERRORS:
            return Step(Action.REDISCOVER)
        if code in RETRY_ERRORS:
            return Step(Action.RETRY)
        return self._fatal(code, "Heartbeat")

    # -- leave ----------------------------------------------------------------------------------
    def leave_request(self, reason: str = "consumer closing", *, force_static: bool = False) -> Any | None:
        """LeaveGroup for this member, or None if there is nothing to leave.

        Static members keep their slot (no LeaveGroup) unless ``force_static``: a restart within the
        session timeout then gets its partitions back without a rebalance.
        """
        if not self.member_id or self.state is MemberState.FATAL:
            return None
        if self.group_instance_id is not None and not force_static:
            return None
        return M.LeaveGroupRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            members=[MemberIdentity(member_id=self.member_id, group_instance_id=self.group_instance_id,
                                    reason=reason)],
        )

    def after_leave(self, reason: str) -> list[TopicPartition]:
        revoked, self.owned = self.owned, []
        if self.group_instance_id is None:
            self.member_id = ""
        self.generation_id = -1
        self.state = MemberState.UNJOINED
        self.request_rejoin(reason)
        return revoked

    # -- commit context --------------------------------------------------------------------------
    def commit_identity(self) -> tuple[int, str, str | None]:
        """(generation, member id, instance id) to put in OffsetCommit; -1/"" outside a stable generation."""
        if self.state is MemberState.STABLE or self.state is MemberState.SYNCING:
            return self.generation_id, self.member_id, self.group_instance_id
        return -1, "", self.group_instance_id


PartitionCounter = Callable[[Sequence[str]], dict[str, int]]
