"""Consumer group membership under the consumer protocol (KIP-848) as a pure state machine.

The broker computes the assignment; a member converges by heartbeats (ConsumerGroupHeartbeat). This object
decides what the next heartbeat says and what each answer means; its asyncio driver sends the requests, runs the
partition hand-overs (commit and release what is revoked, then take what is added) and feeds the outcomes back.
Time is passed in (seconds, monotonic) so every transition can be tested without a clock.

States, as in the Java consumer::

    UNSUBSCRIBED --subscribe--> JOINING --answer--> STABLE | RECONCILING
    RECONCILING --reconcile() + complete_reconciliation()--> ACKNOWLEDGING --heartbeat sent--> STABLE | RECONCILING
    any member state --FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID--> FENCED --partitions_lost_released()--> JOINING
    member --leave()--> PREPARE_LEAVING --leave_ready()--> LEAVING --heartbeat sent (epoch -1/-2)--> UNSUBSCRIBED

Rules the broker relies on:

- The member id is generated here once (KIP-1082, ConsumerGroupHeartbeat v1) and kept for the member's life,
  through fencing and rejoins; epoch 0 joins, -1 leaves, -2 leaves as a static member whose slot (and assignment)
  the broker keeps for the session timeout.
- Revocation before acquisition: a new target first releases (commits) what the member must give up, then takes
  what is added, and only then does a heartbeat acknowledge the new owned set; the broker hands a revoked partition
  to its next owner only after that acknowledgement.
- A fenced member (its epoch is stale or the broker forgot it) has lost its partitions: they may already belong to
  someone else, so nothing is committed; it rejoins with epoch 0 under the same id.
- Heartbeats are incremental: optional fields are sent only when they changed since the last one the broker
  answered; after any failure (and on joining) every field is sent again.
"""

from __future__ import annotations

import base64
import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.client.errors import BrokerResponseError
from service.consumer.subscription import TopicPartition
from service.protocol import error_codes as EC
from service.protocol import messages as M

HeartbeatTopic = M.struct("ConsumerGroupHeartbeatRequest", "TopicPartitions")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2

FENCED_MEMBER_EPOCH = EC.BY_NAME["FENCED_MEMBER_EPOCH"]
UNRELEASED_INSTANCE_ID = EC.BY_NAME["UNRELEASED_INSTANCE_ID"]
COORDINATOR_ERRORS = frozenset({EC.COORDINATOR_NOT_AVAILABLE, EC.NOT_COORDINATOR})
FENCING_ERRORS = frozenset({FENCED_MEMBER_EPOCH, EC.UNKNOWN_MEMBER_ID})

TopicIdPartition = tuple[uuid.UUID, int]


def new_member_id() -> str:
    """A random id in Kafka's UUID text form (22 url-safe base64 characters), never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class ConsumerMemberState(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"  # not in the group (never joined, or left)
    JOINING = "joining"  # a heartbeat with epoch 0 is due or in flight
    RECONCILING = "reconciling"  # the target assignment differs from what the member owns
    ACKNOWLEDGING = "acknowledging"  # a reconciliation completed: a heartbeat must report the new owned set now
    STABLE = "stable"  # owns its target assignment
    FENCED = "fenced"  # the broker fenced this member: release everything, then rejoin
    PREPARE_LEAVING = "prepare_leaving"  # leaving: the owner is releasing (committing) its partitions
    LEAVING = "leaving"  # the heartbeat that leaves (epoch -1 or -2) is due
    FATAL = "fatal"  # a non-recoverable error; see ``fatal_error``


# States in which the broker considers this member part of the group (it heartbeats).
_IN_GROUP = frozenset({ConsumerMemberState.JOINING, ConsumerMemberState.RECONCILING,
                       ConsumerMemberState.ACKNOWLEDGING, ConsumerMemberState.STABLE})
# States in which the next heartbeat is sent at once rather than after the interval.
_URGENT = frozenset({ConsumerMemberState.JOINING, ConsumerMemberState.ACKNOWLEDGING, ConsumerMemberState.LEAVING})


class Action(enum.Enum):
    OK = "ok"  # nothing to do beyond waiting for the next heartbeat
    RECONCILE = "reconcile"  # a new target: call reconcile() (after resolving step.missing_topic_ids if any)
    FENCED = "fenced"  # drop step.lost without committing, then call partitions_lost_released()
    REDISCOVER = "rediscover"  # the coordinator moved: find it, then heartbeat (every field) again
    RETRY = "retry"  # transient: the next heartbeat is delayed by a backoff (see next_heartbeat_in)
    LEFT = "left"  # the leave heartbeat was answered (or failed): the member is out of the group
    FATAL = "fatal"  # step.error must be surfaced to the owner; no more heartbeats


@dataclass
class Step:
    action: Action
    error: BrokerResponseError | None = None
    lost: list[TopicPartition] = field(default_factory=list)
    missing_topic_ids: set[uuid.UUID] = field(default_factory=set)


@dataclass(frozen=True)
class Reconciliation:
    """One hand-over the driver carries out: release ``revoked`` (commit first), then take ``added``."""

    local_epoch: int
    assigned: frozenset[TopicIdPartition]
    revoked: tuple[TopicPartition, ...]
    added: tuple[TopicPartition, ...]
    owned_after: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class _LocalAssignment:
    """An assignment with the local epoch of the target it came from (bumped on every new target)."""

    local_epoch: int
    partitions: frozenset[TopicIdPartition]


_NONE_ASSIGNMENT = _LocalAssignment(-1, frozenset())


@dataclass
class _SentFields:
    """What the last heartbeat carried, to send only what changed (reset: send everything again)."""

    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    rack_id: str | None = None
    assignment: _LocalAssignment | None = None


class ConsumerGroupMember:
    def __init__(
        self,
        group_id: str,
        *,
        member_id: str | None = None,
        group_instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int = 300000,
        server_assignor: str | None = None,
        retry_backoff_s: float = 0.1,
        retry_backoff_max_s: float = 1.0,
        wait_for_instance_release: bool = False,
    ) -> None:
        self.group_id = group_id
        #: a static member joining while its group.instance.id is still held by a predecessor that did not leave
        #: (a process killed with -9) is answered UNRELEASED_INSTANCE_ID until the broker expires that one (its
        #: session timeout): with this set it keeps trying to join (backing off) instead of failing for good, as a
        #: successor re-created under the same identity must (durable gateway instances)
        self.wait_for_instance_release = wait_for_instance_release
        self.unreleased_retries = 0
        self.member_id = member_id or new_member_id()
        self.group_instance_id = group_instance_id
        self.rack_id = rack_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.server_assignor = server_assignor
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.member_epoch = 0
        self.state = ConsumerMemberState.UNSUBSCRIBED
        self.fatal_error: BrokerResponseError | None = None
        self.topics: tuple[str, ...] = ()
        self.regex: str | None = None
        self.heartbeat_interval_s = 5.0  # until the broker says otherwise
        #: topic id -> name, from metadata (the driver feeds it)
        self.topic_names: dict[uuid.UUID, str] = {}
        self._target = _NONE_ASSIGNMENT
        self._current = _NONE_ASSIGNMENT
        self._next_local_epoch = 0
        self._reconciling: Reconciliation | None = None
        self._sent = _SentFields()
        self._in_flight = False
        self._leave_in_flight = False  # the heartbeat in flight is the one that leaves
        self._next_at = 0.0  # monotonic time of the next regular heartbeat
        self._not_before = 0.0  # a backoff after a failure holds even urgent heartbeats until then
        self._failures = 0
        self._leave_for_good = False  # a static member leaving with epoch -1: its slot is not kept
        self.reconciliations = 0  # completed hand-overs (for metrics)
        self.fencings = 0

    # -- what the member is -------------------------------------------------------------------------
    @property
    def in_group(self) -> bool:
        return self.state in _IN_GROUP

    @property
    def owned(self) -> list[TopicPartition]:
        """What the member owns now (reconciled), by name, sorted."""
        return self._names(self._current.partitions)

    @property
    def target_reconciled(self) -> bool:
        return self._target.partitions == self._current.partitions

    @property
    def missing_topic_ids(self) -> set[uuid.UUID]:
        """Topic ids of the target the member cannot name yet (metadata needed)."""
        return {tid for tid, _ in self._target.partitions if tid not in self.topic_names}

    def _names(self, parts: Iterable[TopicIdPartition]) -> list[TopicPartition]:
        return sorted(TopicPartition(self.topic_names[tid], p) for tid, p in parts if tid in self.topic_names)

    def commit_identity(self) -> tuple[int, str, str | None]:
        """(member epoch, member id, instance id) for OffsetCommit v9+ (generation id = member epoch), or
        (-1, "", instance id) when the member is not in the group (a commit then fails as for a classic member).
        While it releases its partitions to leave, its epoch still holds: what it commits then counts."""
        if (self.in_group or self.state is ConsumerMemberState.PREPARE_LEAVING) and self.member_epoch > 0:
            return self.member_epoch, self.member_id, self.group_instance_id
        return -1, "", self.group_instance_id

    def update_topic_names(self, names: Mapping[uuid.UUID, str]) -> bool:
        """Learn topic names (from metadata). True when this resolves part of a pending target: reconcile()."""
        missing = self.missing_topic_ids
        self.topic_names.update(names)
        return bool(missing) and len(self.missing_topic_ids) < len(missing)

    # -- subscription --------------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), *, regex: str | None = None) -> None:
        """Subscribe by topic names or by a regular expression (RE2/J, evaluated by the broker), not both.

        Not in the group: join. In the group: the next heartbeat carries the change."""
        topics = tuple(sorted(set(topics)))
        if regex is not None and topics:
            raise ValueError("subscribe to topic names or to a regular expression, not both")
        if regex is None and not topics:
            raise ValueError("an empty subscription: leave the group instead")
        if self.state is ConsumerMemberState.FATAL:
            raise RuntimeError(f"member of group {self.group_id!r} failed: {self.fatal_error}")
        self.topics, self.regex = topics, regex
        if self.state is ConsumerMemberState.UNSUBSCRIBED:
            self._join()

    def _join(self) -> None:
        self.member_epoch = JOIN_EPOCH
        self.state = ConsumerMemberState.JOINING
        self._target = self._current = _NONE_ASSIGNMENT
        self._reconciling = None
        self._sent = _SentFields()

    # -- heartbeats ---------------------------------------------------------------------------------
    @property
    def _urgent(self) -> bool:
        """A heartbeat must go now: joining, leaving, or owned partitions changed since the last one sent."""
        if self.state in _URGENT:
            return True
        return (self.state in _IN_GROUP and self._sent.assignment is not None
                and self._sent.assignment != self._current)

    @property
    def heartbeat_in_flight(self) -> bool:
        return self._in_flight

    def heartbeat_due(self, now: float) -> bool:
        if self._in_flight or now < self._not_before:
            return False
        if self._urgent:
            return True
        return self.state in _IN_GROUP and now >= self._next_at

    def next_heartbeat_in(self, now: float) -> float | None:
        """Seconds until a heartbeat is due (0: now), or None when none will be until something changes."""
        if self._in_flight or not (self.state in _IN_GROUP or self.state is ConsumerMemberState.LEAVING):
            return None
        at = self._not_before if self._urgent else max(self._next_at, self._not_before)
        return max(0.0, at - now)

    @property
    def needs_reconcile(self) -> bool:
        """The target differs from what the member owns and no hand-over is in progress: call reconcile()."""
        return self.state is ConsumerMemberState.RECONCILING and self._reconciling is None

    def heartbeat_request(self, now: float) -> Any:
        """The next ConsumerGroupHeartbeat (v1 fields; a v0 broker simply does not see the regex).

        Marks a heartbeat in flight; the answer goes to on_heartbeat_response or on_heartbeat_failure."""
        if self._in_flight:
            raise RuntimeError("a heartbeat is already in flight")
        if self.state is ConsumerMemberState.LEAVING:
            req = M.ConsumerGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self._leave_epoch(),
                instance_id=self.group_instance_id)
            # The broker forgets the member with this request whatever it answers.
            self.state = ConsumerMemberState.UNSUBSCRIBED
            self.member_epoch = JOIN_EPOCH
            self._in_flight = True
            self._leave_in_flight = True
            return req
        if self.state not in _IN_GROUP:
            raise RuntimeError(f"no heartbeat in state {self.state.value}")
        send_all = self.state is ConsumerMemberState.JOINING
        sent = self._sent
        req = M.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.member_epoch,
            instance_id=self.group_instance_id)
        if send_all or sent.rebalance_timeout_ms != self.rebalance_timeout_ms:
            req.rebalance_timeout_ms = sent.rebalance_timeout_ms = self.rebalance_timeout_ms
        if self.regex is not None:
            if send_all or sent.regex != self.regex:
                req.subscribed_topic_regex = sent.regex = self.regex
            sent.topics = None
        else:
            if send_all or sent.topics != self.topics:
                req.subscribed_topic_names = list(self.topics)
                sent.topics = self.topics
            sent.regex = None
        if self.server_assignor is not None and (send_all or sent.server_assignor != self.server_assignor):
            req.server_assignor = sent.server_assignor = self.server_assignor
        if self.rack_id is not None and (send_all or sent.rack_id != self.rack_id):
            req.rack_id = sent.rack_id = self.rack_id
        if send_all or sent.assignment != self._current:
            by_topic: dict[uuid.UUID, list[int]] = {}
            for tid, p in sorted(self._current.partitions):
                by_topic.setdefault(tid, []).append(p)
            req.topic_partitions = [HeartbeatTopic(topic_id=tid, partitions=ps) for tid, ps in by_topic.items()]
            sent.assignment = self._current
        if self.state is ConsumerMemberState.ACKNOWLEDGING:
            self.state = (ConsumerMemberState.STABLE if self.target_reconciled
                          else ConsumerMemberState.RECONCILING)
        self._in_flight = True
        self._leave_in_flight = False
        self._next_at = now + self.heartbeat_interval_s
        return req

    def _leave_epoch(self) -> int:
        if self.group_instance_id is not None and not self._leave_for_good:
            return LEAVE_STATIC_EPOCH
        return LEAVE_EPOCH

    def heartbeat_soon(self) -> None:
        """Heartbeat without waiting for the interval (e.g. a commit was refused for a stale member epoch: the
        answer brings the current one). Backoffs still hold."""
        self._next_at = 0.0

    def request_rejoin(self, reason: str) -> None:
        """The classic member's hook, called by the consumer when its subscription may have changed. Nothing to
        rejoin under this protocol: the driver passes the subscription to subscribe() before each heartbeat."""

    def on_heartbeat_response(self, resp: Any, now: float) -> Step:
        self._in_flight = False
        if self._leave_in_flight:
            self._leave_in_flight = False
            return Step(Action.LEFT)
        code = resp.error_code
        if code != EC.NONE:
            return self._on_error(code, resp.error_message, now)
        self._failures = 0
        self._not_before = 0.0
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = resp.heartbeat_interval_ms / 1000
            self._next_at = now + self.heartbeat_interval_s
        if not self.in_group:
            return Step(Action.OK)  # fenced, leaving or failed meanwhile: the answer is stale
        if resp.member_id:
            self.member_id = resp.member_id
        self.member_epoch = resp.member_epoch
        if resp.assignment is None:
            return Step(Action.OK)
        target = frozenset((tp.topic_id, p) for tp in resp.assignment.topic_partitions for p in tp.partitions)
        if target != self._target.partitions:
            self._target = _LocalAssignment(self._next_local_epoch, target)
            self._next_local_epoch += 1
        if not self.target_reconciled:
            self.state = ConsumerMemberState.RECONCILING
            return Step(Action.RECONCILE, missing_topic_ids=self.missing_topic_ids)
        if self.state in (ConsumerMemberState.RECONCILING, ConsumerMemberState.JOINING):
            self.state = ConsumerMemberState.STABLE
        return Step(Action.OK)

    def on_heartbeat_ok(self, member_epoch: int, heartbeat_interval_ms: int, now: float) -> Action:
        """An answer without error, member id or assignment, what a stable member hears between changes (read
        without decoding the whole answer): as on_heartbeat_response with it, which would answer ``Action.OK``
        (or ``Action.LEFT`` for the leave heartbeat) and change nothing but the epoch and the interval."""
        self._in_flight = False
        if self._leave_in_flight:
            self._leave_in_flight = False
            return Action.LEFT
        self._failures = 0
        self._not_before = 0.0
        if heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = heartbeat_interval_ms / 1000
            self._next_at = now + self.heartbeat_interval_s
        if self.in_group:
            self.member_epoch = member_epoch
        return Action.OK

    def on_heartbeat_failure(self, now: float, *, coordinator_lost: bool = True) -> Step:
        """The heartbeat got no answer (connection lost, timeout): back off, send every field next time."""
        self._in_flight = False
        if self._leave_in_flight:
            self._leave_in_flight = False
            return Step(Action.LEFT)
        self._backoff(now)
        return Step(Action.REDISCOVER if coordinator_lost else Action.RETRY)

    def _backoff(self, now: float) -> None:
        self._sent = _SentFields()
        self._failures += 1
        delay = min(self.retry_backoff_max_s, self.retry_backoff_s * 2 ** (self._failures - 1))
        self._not_before = now + delay
        self._next_at = now  # after the backoff, not after a whole interval

    def _on_error(self, code: int, message: str | None, now: float) -> Step:
        self._sent = _SentFields()
        if code in COORDINATOR_ERRORS:
            self._backoff(now)  # short: the rediscovery has its own pace
            return Step(Action.REDISCOVER)
        if code == EC.COORDINATOR_LOAD_IN_PROGRESS:
            self._backoff(now)
            return Step(Action.RETRY)
        if (code == UNRELEASED_INSTANCE_ID and self.wait_for_instance_release
                and self.state is ConsumerMemberState.JOINING):
            self.unreleased_retries += 1
            self._backoff(now)
            return Step(Action.RETRY)
        if code in FENCING_ERRORS:
            if self.state is ConsumerMemberState.JOINING:
                self._backoff(now)  # refused even as a newcomer: no tight loop of joins
            return self._fenced()
        self.state = ConsumerMemberState.FATAL
        self.fatal_error = BrokerResponseError(code, f"ConsumerGroupHeartbeat for group {self.group_id!r}", message)
        return Step(Action.FATAL, error=self.fatal_error)

    # -- fencing ------------------------------------------------------------------------------------
    def _fenced(self) -> Step:
        if self.state is ConsumerMemberState.PREPARE_LEAVING:
            # Already releasing everything to leave: no leave heartbeat is needed any more.
            self.state = ConsumerMemberState.UNSUBSCRIBED
            self.member_epoch = JOIN_EPOCH
            return Step(Action.LEFT)
        if not self.in_group:
            return Step(Action.OK)
        lost = self.owned
        self.state = ConsumerMemberState.FENCED
        self.member_epoch = JOIN_EPOCH
        self._reconciling = None
        self.fencings += 1
        return Step(Action.FENCED, lost=lost)

    def partitions_lost_released(self) -> None:
        """The driver dropped the lost partitions (without committing): rejoin with epoch 0, same member id."""
        if self.state is ConsumerMemberState.FENCED:
            self._join()

    # -- reconciliation -----------------------------------------------------------------------------
    def reconcile(self) -> Reconciliation | None:
        """The next hand-over towards the target (its resolvable part), or None: nothing to do now (already
        reconciled, one in progress, or only unresolved topic ids differ, in which case what the member owns is
        acknowledged again under the new target)."""
        if self.state is not ConsumerMemberState.RECONCILING or self._reconciling is not None:
            return None
        if self.target_reconciled:
            self.state = ConsumerMemberState.STABLE
            return None
        target = self._target
        resolved = frozenset(tp for tp in target.partitions if tp[0] in self.topic_names)
        if resolved == self._current.partitions:
            if self._current.local_epoch != target.local_epoch:
                self._current = _LocalAssignment(target.local_epoch, resolved)
                self.state = ConsumerMemberState.ACKNOWLEDGING
            return None
        owned = set(self._names(self._current.partitions))
        assigned = set(self._names(resolved))
        rec = Reconciliation(
            local_epoch=target.local_epoch,
            assigned=resolved,
            revoked=tuple(sorted(owned - assigned)),
            added=tuple(sorted(assigned - owned)),
            owned_after=tuple(sorted(assigned)),
        )
        self._reconciling = rec
        return rec

    def complete_reconciliation(self, rec: Reconciliation) -> bool:
        """The driver released ``rec.revoked`` and took ``rec.added``. True: the member now owns
        ``rec.owned_after`` and acknowledges it with the next (immediate) heartbeat. False: the hand-over was
        overtaken (fenced, leaving): the driver keeps what it released released and drops what it took."""
        if self._reconciling is not rec:
            return False
        self._reconciling = None
        if self.state is not ConsumerMemberState.RECONCILING:
            return False
        self._current = _LocalAssignment(rec.local_epoch, rec.assigned)
        self.state = ConsumerMemberState.ACKNOWLEDGING
        self.reconciliations += 1
        return True

    # -- leaving ------------------------------------------------------------------------------------
    def leave(self, *, for_good: bool = False) -> list[TopicPartition]:
        """Start leaving: the partitions to release (commit first); then call leave_ready(). A static member
        leaves with epoch -2 so that the broker keeps its assignment for a restart within the session timeout,
        unless ``for_good`` (epoch -1: its partitions move at once)."""
        self._leave_for_good = for_good
        if not self.in_group:
            if self.state is ConsumerMemberState.FENCED:
                self.state = ConsumerMemberState.UNSUBSCRIBED
            return []
        self.state = ConsumerMemberState.PREPARE_LEAVING
        self._reconciling = None
        return self.owned

    def leave_ready(self) -> bool:
        """The partitions were released: the leave heartbeat is due now. False when the member was fenced
        meanwhile (the broker already dropped it: nothing to send)."""
        if self.state is not ConsumerMemberState.PREPARE_LEAVING:
            return False
        self.state = ConsumerMemberState.LEAVING
        self._current = self._target = _NONE_ASSIGNMENT
        self._not_before = 0.0
        return True
