"""The asyncio driver of a consumer protocol (KIP-848) member, with the classic driver's interface.

:class:`ConsumerProtocolCoordinator` drives :class:`service.group.member_consumer.ConsumerGroupMember` and offers
what the consumer uses of :class:`service.group.coordinator.GroupCoordinator` (start, wake, close, wait_stable,
stable, commit, committed, the poll bookkeeping and the same hooks: ``on_revoke`` (commit, then release),
``on_assign(assigned, added)``, ``on_lost``, ``on_fatal``), so a consumer can run either protocol. Coordinator
discovery, commits and committed-offset lookups are the classic driver's; a commit carries the member epoch
where the classic one carries the generation (OffsetCommit v9+).

One task per member: it heartbeats when the member says a heartbeat is due (the broker sets the interval), runs
each hand-over the member asks for (release and commit what is revoked, then take what is added; the
acknowledging heartbeat follows at once), drops what a fenced member lost and lets it rejoin, and leaves (epoch
-1, or -2 for a static member) on close. The hand-over and the heartbeats are sequential: no answer can change
the member while its partitions move.

While the member is stable its regular heartbeats go from the loop's heartbeat wheel (service.group.heartbeats,
shared with classic members: one timer for all, one batch per tick and coordinator connection) and their answers
are handled in the connection's read callback, the task asleep, as for a classic member. The member's state
machine builds every request and reads every answer either way; the task takes over (the wheel's entry is
dropped) when an answer is not a plain OK (a new assignment, fencing, an error), a heartbeat fails, the member is
no longer stable, or someone wakes it (a commit refused for a stale epoch, a subscription change, closing). A
heartbeat the wheel sent is always answered (or failed) before the task sends one of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from service.client.client import KafkaClient
from service.client.connection import BrokerConnection
from service.client.errors import BrokerResponseError, KafkaConnectionError, KafkaError, NoCommonVersionError
from service.client.versions import NegotiatedVersions
from service.consumer.subscription import TopicPartition
from service.group.coordinator import (
    HEARTBEAT_TICK_S,
    AssignHook,
    CommitFailedError,
    GroupCoordinator,
    GroupFatalError,
    OffsetAndMetadata,
    RevokeHook,
    _tps,
    rebalancing_error,
)
from service.group.heartbeats import CONSUMER_GROUP_HEARTBEAT, heartbeat_wheel
from service.group.member_consumer import (
    Action,
    ConsumerGroupMember,
    ConsumerMemberState,
    Reconciliation,
    Step,
)
from service.lib.aio import LightEvent
from service.protocol import error_codes as EC
from service.protocol import messages as M

log = logging.getLogger(__name__)

STALE_MEMBER_EPOCH = EC.BY_NAME["STALE_MEMBER_EPOCH"]
FENCED_MEMBER_EPOCH = EC.BY_NAME["FENCED_MEMBER_EPOCH"]
#: how long a leave heartbeat may take on close
LEAVE_TIMEOUT_S = 5.0
#: the broker's default session timeout under this protocol (group.consumer.session.timeout.ms): the member does
#: not learn the group's, and only the "unassigned for too long" report uses it
SESSION_TIMEOUT_S = 45.0


class ConsumerProtocolUnsupportedError(GroupFatalError):
    """The broker cannot host a member of the consumer protocol (e.g. Tansu: no ConsumerGroupHeartbeat)."""


def consumer_protocol_problem(versions: NegotiatedVersions | None) -> str | None:
    """Why a broker cannot host members of this driver (None: it can): ConsumerGroupHeartbeat v1 (the member id
    made by the client, KIP-1082: Apache Kafka 4.0+) and OffsetCommit v9 (commits with a member epoch)."""
    if versions is None:
        return "the broker's API versions are unknown"
    if not versions.supports(M.ApiKey.CONSUMER_GROUP_HEARTBEAT, 1):
        if versions.has(M.ApiKey.CONSUMER_GROUP_HEARTBEAT):
            return "the broker supports only ConsumerGroupHeartbeat v0 (Apache Kafka before 4.0); v1 is needed"
        return "the broker does not support the consumer group protocol (no ConsumerGroupHeartbeat API)"
    if not versions.supports(M.ApiKey.OFFSET_COMMIT, 9):
        return "the broker does not support OffsetCommit v9 (commits with a member epoch)"
    return None


async def consumer_protocol_supported(client: KafkaClient) -> str | None:
    """consumer_protocol_problem for the broker ``client`` reaches (ApiVersions of any connection)."""
    conn = await client.any_connection()
    return consumer_protocol_problem(conn.versions)


async def _no_counts(topics: Sequence[str]) -> dict[str, int]:
    return {}  # the broker assigns: no partition counts are needed


class ConsumerProtocolCoordinator(GroupCoordinator):
    member: ConsumerGroupMember  # type: ignore[assignment]
    heartbeat_api = CONSUMER_GROUP_HEARTBEAT

    def __init__(
        self,
        client: KafkaClient,
        member: ConsumerGroupMember,
        *,
        max_poll_interval_ms: int = 300000,
        retry_backoff_ms: int = 100,
        on_revoke: RevokeHook,
        on_assign: AssignHook,
        on_lost: RevokeHook | None = None,
        on_fatal: Callable[[KafkaError], None] | None = None,
        topics: Callable[[], Sequence[str]],
        regex: Callable[[], str | None] | None = None,
        on_task_failure: Callable[[str, BaseException], None] | None = None,
        heartbeat_interval_ms: int | None = None,  # the broker decides; accepted for the classic signature
        partition_counts: Any = None,  # the broker assigns; accepted for the classic signature
    ) -> None:
        super().__init__(
            client, cast(Any, member), max_poll_interval_ms=max_poll_interval_ms,
            retry_backoff_ms=retry_backoff_ms, partition_counts=_no_counts, on_revoke=on_revoke,
            on_assign=on_assign, on_lost=on_lost, on_fatal=on_fatal, topics=topics, on_task_failure=on_task_failure)
        self._regex = regex
        self.heartbeat_interval = member.heartbeat_interval_s
        #: set (and dropped) when the next heartbeat answer arrives, made by whoever waits for it (commits refused
        #: for a stale epoch, a leave behind a heartbeat of the wheel)
        self._answered: LightEvent | None = None
        self._wheel_in_flight = False  # a heartbeat sent from the wheel awaits its answer
        #: what a heartbeat of the wheel ended with that the task must handle: (step, answer) or the failure
        self._wheel_result: tuple[Step, Any] | BaseException | None = None
        self.hand_overs = 0  # reconciliations carried out
        self.converged_at: float | None = None  # monotonic time the member last became stable
        self._unstable_since: float | None = None  # when the member last left STABLE (a new target, fencing)
        self.converge_seconds: float | None = None  # how long the latest change took to become stable again

    # -- what the consumer reads -------------------------------------------------------------------
    @property
    def stable(self) -> bool:
        return self.member.state is ConsumerMemberState.STABLE

    def unassigned_too_long(self, now: float | None = None) -> bool:
        return self.unassigned_seconds(now) > SESSION_TIMEOUT_S

    def _describe(self) -> str:
        m = self.member
        return f"group {self.group_id} member {m.member_id} epoch {m.member_epoch} ({m.state.value})"

    # -- the membership loop -----------------------------------------------------------------------
    def _subscription(self) -> tuple[list[str], str | None]:
        regex = self._regex() if self._regex is not None else None
        return ([] if regex is not None else list(self._topics())), regex

    async def _tick(self) -> None:
        m = self.member
        if self._wheel_in_flight:  # the wheel's heartbeat is answered (or fails) first: its callback wakes us
            await self._pause(3600)
            return
        result, self._wheel_result = self._wheel_result, None
        if result is not None:
            await self._after_wheel(result)
            return
        topics, regex = self._subscription()
        if not topics and regex is None:
            if m.in_group:
                await self._leave("subscription is empty")
            self._stable.clear()
            await self._pause(3600)
            return
        if m.state is ConsumerMemberState.FATAL:
            raise GroupFatalError(str(m.fatal_error), code=m.fatal_error.code if m.fatal_error else None)
        if self.left_for_poll_timeout:
            await self._pause(3600)
            return
        if (self.polls_in_progress == 0 and time.monotonic() - self.last_poll > self.max_poll_interval
                and m.in_group):
            log.warning("%s: did not poll within max.poll.interval.ms; leaving the group", self._describe())
            self.left_for_poll_timeout = True
            await self._leave("max poll interval exceeded")
            return
        if m.state is ConsumerMemberState.UNSUBSCRIBED or (tuple(sorted(set(topics))), regex) != (m.topics, m.regex):
            m.subscribe(topics, regex=regex)
        if m.needs_reconcile:
            rec = await self._next_reconciliation()
            if rec is not None:
                await self._hand_over(rec)
                return
        now = time.monotonic()
        if m.heartbeat_due(now):
            await self._heartbeat()
            return
        wait = m.next_heartbeat_in(now)
        if m.needs_reconcile and m.missing_topic_ids:
            wait = min(wait if wait is not None else 3600, self.retry_backoff * 5)  # look the ids up again
        elif wait is not None and self._wheel_conn() is not None:
            await self._drive_wheel(wait)
            return
        await self._pause(3600 if wait is None else wait)

    async def _next_reconciliation(self) -> Reconciliation | None:
        m = self.member
        m.update_topic_names(self.client.metadata.topic_names)
        if m.missing_topic_ids:
            topics, regex = self._subscription()
            try:
                await self.client.refresh_metadata(topics, all_topics=regex is not None)
            except KafkaError as exc:
                log.info("%s: metadata for the assigned topic ids failed: %s", self._describe(), exc)
            m.update_topic_names(self.client.metadata.topic_names)
        return m.reconcile()

    async def _hand_over(self, rec: Reconciliation) -> None:
        """Revocation before acquisition: the revoke hook commits and releases, then the assign hook takes the
        new partitions, then the member acknowledges (its next heartbeat is due at once)."""
        m = self.member
        log.info("%s: reconciling: revoking %s, adding %s", self._describe(), _tps(rec.revoked), _tps(rec.added))
        if rec.revoked:
            await self._on_revoke(list(rec.revoked))
        if m.complete_reconciliation(rec):
            await self._on_assign(list(rec.owned_after), list(rec.added))
            self.hand_overs += 1
        self._note_assignment()

    async def _check_broker(self) -> None:
        """Before joining: refuse a broker that cannot host this member, clearly and for good."""
        node = await self.ensure_coordinator()
        conn = await self.client.connection(node).get()
        problem = consumer_protocol_problem(conn.versions)
        if problem is not None:
            raise ConsumerProtocolUnsupportedError(
                f"group {self.group_id!r} cannot use the consumer protocol (KIP-848): {problem}")

    async def _heartbeat(self) -> None:
        m = self.member
        if m.state is ConsumerMemberState.JOINING:
            await self._check_broker()
        req = m.heartbeat_request(time.monotonic())
        started = time.monotonic()
        try:
            resp = await self._send(req, timeout=max(1.0, m.heartbeat_interval_s))
        except NoCommonVersionError as exc:
            m.on_heartbeat_failure(time.monotonic(), coordinator_lost=False)
            raise ConsumerProtocolUnsupportedError(
                f"the broker does not support the consumer group protocol (KIP-848): {exc}") from None
        except KafkaError as exc:
            step = m.on_heartbeat_failure(time.monotonic(), coordinator_lost=exc.retriable)
            log.info("%s: heartbeat failed: %s", self._describe(), exc)
            self.last_error = exc
            if not exc.retriable and step.action is not Action.LEFT:
                self._failed.set()
            return
        except BaseException:
            m.on_heartbeat_failure(time.monotonic(), coordinator_lost=False)
            raise
        self.heartbeat_latency = time.monotonic() - started
        self.heartbeats += 1
        self._note_answered()
        step = m.on_heartbeat_response(resp, time.monotonic())
        self.heartbeat_interval = m.heartbeat_interval_s
        await self._after_step(step, resp)

    async def _after_step(self, step: Step, resp: Any) -> None:
        m = self.member
        if step.action is Action.FATAL:
            log.warning("%s: heartbeat failed for good: %s", self._describe(), step.error)
            await self._lose_partitions()
            raise GroupFatalError(str(step.error), code=step.error.code if step.error else None)
        if step.action is Action.FENCED:
            log.info("%s: fenced (%s); dropping %s and rejoining", self._describe(),
                     EC.describe(resp.error_code).name, _tps(step.lost))
            self._stable.clear()
            if step.lost:
                await self._on_lost(step.lost)
            m.partitions_lost_released()
            self._note_assignment()
            return
        if step.action is Action.REDISCOVER:
            log.info("%s: heartbeat answered %s: finding the coordinator again", self._describe(),
                     EC.describe(resp.error_code).name)
            self.coordinator_dead("heartbeat")
            return
        if step.action is Action.RETRY:
            return  # the member's backoff delays the next heartbeat
        if m.state is ConsumerMemberState.STABLE:
            if not self._stable.is_set():
                self.converged_at = time.monotonic()
                if self._unstable_since is not None:
                    self.converge_seconds = self.converged_at - self._unstable_since
                    self._unstable_since = None
                log.info("%s: stable with %s", self._describe(), _tps(m.owned))
            self.last_error = None
            self._failed.clear()
            self._stable.set()
        else:
            if self._stable.is_set() or self._unstable_since is None:
                self._unstable_since = time.monotonic()
            self._stable.clear()

    # -- heartbeats from the wheel ---------------------------------------------------------------------
    def _note_answered(self) -> None:
        ev, self._answered = self._answered, None
        if ev is not None:
            ev.set()

    def _answer_waiter(self) -> LightEvent:
        """An event set when the next heartbeat answer (or failure) arrives."""
        if self._answered is None:
            self._answered = LightEvent()
        return self._answered

    async def _drive_wheel(self, wait: float) -> None:
        """Let the wheel heartbeat (the first one in ``wait`` seconds) until this task is woken."""
        loop = self._loop or asyncio.get_running_loop()
        await self._connect_heartbeats()
        self.heartbeat_epoch += 1
        self._schedule_wheel(loop, wait)
        try:
            await self._wake.wait()
        finally:
            self.heartbeat_epoch += 1  # a due entry now belongs to nobody; an answer in flight still comes here
        self._wake.clear()

    def _schedule_wheel(self, loop: asyncio.AbstractEventLoop, wait: float) -> None:
        # when the member says (no early jitter as for classic members: the wheel sends only what is due; members
        # that joined together are spread by their join times, and a tick's heartbeats leave as one batch anyway)
        heartbeat_wheel(loop, HEARTBEAT_TICK_S).add(cast(Any, self), loop.time() + wait)

    async def _after_wheel(self, result: tuple[Step, Any] | BaseException) -> None:
        """What the answer to (or the failure of) a heartbeat of the wheel asks of the task."""
        if isinstance(result, BaseException):
            log.info("%s: heartbeat failed: %s", self._describe(), result)
            if isinstance(result, KafkaConnectionError):
                self.client.metadata.mark_stale()
            if isinstance(result, KafkaError):
                self.last_error = result
                if result.retriable:
                    self.coordinator_dead(str(result))
                else:
                    self._failed.set()
            return
        await self._after_step(*result)

    def heartbeat_route(self) -> tuple[BrokerConnection, bool] | None:
        """The connection for the next heartbeat if it can go from the wheel: the member says it is due (it is
        stable with no heartbeat in flight), it polled recently enough, its subscription is what the member last
        sent, and the coordinator is known and connected."""
        if not self.member.heartbeat_due(time.monotonic()):
            return None
        return self._wheel_conn()

    def _wheel_conn(self) -> tuple[BrokerConnection, bool] | None:
        """heartbeat_route but whether a heartbeat is due now: may the wheel heartbeat for this member?"""
        m = self.member
        node = self.coordinator_id
        if (node is None or self._closing or m.state is not ConsumerMemberState.STABLE or m.heartbeat_in_flight
                or self.left_for_poll_timeout
                or (self.polls_in_progress == 0 and time.monotonic() - self.last_poll > self.max_poll_interval)):
            return None
        regex = self._regex() if self._regex is not None else None
        if regex != m.regex or (regex is None and tuple(sorted(set(self._topics()))) != m.topics):
            return None
        return self._heartbeat_conn(node)

    def consumer_heartbeat_request(self) -> Any:
        """The member's next heartbeat, sent from the wheel (heartbeat_route said it may)."""
        req = self.member.heartbeat_request(time.monotonic())
        self._wheel_in_flight = True
        return req

    def on_consumer_heartbeat_ok(self, epoch: int, member_epoch: int, interval_ms: int) -> None:
        """A heartbeat of the wheel was answered with no error, assignment or member id (kept short)."""
        if not self._wheel_in_flight:
            return  # given up on (closing)
        self._wheel_in_flight = False
        now = time.monotonic()
        action = self.member.on_heartbeat_ok(member_epoch, interval_ms, now)
        loop = self._loop or asyncio.get_running_loop()
        self.heartbeat_latency = loop.time() - self.heartbeat_sent_at
        self.heartbeats += 1
        self.heartbeat_interval = self.member.heartbeat_interval_s
        if self._answered is not None:
            self._note_answered()
        if epoch == self.heartbeat_epoch and action is Action.OK and not self._closing:
            wait = self.member.next_heartbeat_in(now)
            if wait is not None:
                self._schedule_wheel(loop, wait)
                return
        self._wake.set()

    def on_heartbeat_answer(self, epoch: int, started: float, resp: Any, exc: BaseException | None) -> None:
        """A heartbeat of the wheel sent at loop time ``started`` was answered (``resp``) or failed (``exc``)."""
        if not self._wheel_in_flight:
            return  # given up on (closing)
        self._wheel_in_flight = False
        m = self.member
        now = time.monotonic()
        if exc is not None:
            m.on_heartbeat_failure(now, coordinator_lost=isinstance(exc, KafkaError) and exc.retriable)
            self._wheel_result = exc
            self._note_answered()
            self._wake.set()
            return
        loop = self._loop or asyncio.get_running_loop()
        self.heartbeat_latency = loop.time() - started
        self.heartbeats += 1
        step = m.on_heartbeat_response(resp, now)
        self.heartbeat_interval = m.heartbeat_interval_s
        self._note_answered()
        if (epoch == self.heartbeat_epoch and step.action is Action.OK and m.state is ConsumerMemberState.STABLE
                and not self._closing):
            wait = m.next_heartbeat_in(now)
            if wait is not None:
                self._schedule_wheel(loop, wait)
                return
        self._wheel_result = (step, resp)  # the task does what it asks (an OK one: the stable bookkeeping)
        self._wake.set()

    async def _wheel_settled(self) -> None:
        """Before a heartbeat of the task's own outside the task (leaving on close): the answer to the wheel's
        heartbeat in flight, if any, for at most LEAVE_TIMEOUT_S; then it is given up on."""
        if not self._wheel_in_flight:
            return
        try:
            await asyncio.wait_for(self._answer_waiter().wait(), LEAVE_TIMEOUT_S)
        except TimeoutError:
            pass
        if self._wheel_in_flight:
            self._wheel_in_flight = False
            self.member.on_heartbeat_failure(time.monotonic(), coordinator_lost=False)

    async def _lose_partitions(self) -> None:
        lost = self.member.owned
        if lost:
            log.info("%s: lost partitions %s", self._describe(), _tps(lost))
            await self._on_lost(lost)
        self._note_assignment()

    async def _leave(self, reason: str, force_static: bool = False) -> None:
        """Release (commit) the owned partitions while the member still holds its epoch, then the leave
        heartbeat: epoch -1, or -2 for a static member (the broker keeps its assignment for a restart) unless
        ``force_static``."""
        m = self.member
        self._stable.clear()
        owned = m.leave(for_good=force_static)
        if owned:
            try:
                await self._on_revoke(owned)
            except Exception:
                log.exception("%s: revocation hook failed while leaving", self._describe())
        await self._wheel_settled()
        if not m.leave_ready():
            self._note_assignment()
            return
        log.info("%s: leaving (%s)", self._describe(), reason)
        req = m.heartbeat_request(time.monotonic())
        try:
            if self.coordinator_id is None:
                await asyncio.wait_for(self.ensure_coordinator(), LEAVE_TIMEOUT_S)
            resp = await self._send(req, timeout=LEAVE_TIMEOUT_S)
            m.on_heartbeat_response(resp, time.monotonic())
            if resp.error_code:
                log.info("%s: leave answered %s", self._describe(), EC.describe(resp.error_code).name)
        except (KafkaError, TimeoutError) as exc:
            m.on_heartbeat_failure(time.monotonic(), coordinator_lost=False)
            log.info("%s: leave failed: %s", self._describe(), exc)
        except BaseException:
            m.on_heartbeat_failure(time.monotonic(), coordinator_lost=False)
            raise
        self._note_assignment()

    # -- offsets ------------------------------------------------------------------------------------
    def _group_commit_identity(self, revoking: bool) -> tuple[int, str, str | None]:
        epoch, member_id, instance = self.member.commit_identity()
        if epoch < 0:
            raise rebalancing_error(self.group_id, f"this member is not in the group ({self.member.state.value})")
        return epoch, member_id, instance

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], *, manual: bool = False,
                     timeout: float = 30.0, check: Callable[[], None] | None = None,
                     revoking: bool = False) -> None:
        """The classic driver's commit with the member epoch. STALE_MEMBER_EPOCH (the broker moved the member to
        a newer epoch this member has not heard of yet): heartbeat now and commit again with the epoch it brings,
        until ``timeout``; FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID refuse the commit (CommitFailedError)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                await super().commit(offsets, manual=manual, timeout=max(0.1, deadline - time.monotonic()),
                                     check=check, revoking=revoking)
                return
            except BrokerResponseError as exc:
                if exc.code == FENCED_MEMBER_EPOCH:
                    raise CommitFailedError(
                        f"commit for group {self.group_id!r} rejected: FENCED_MEMBER_EPOCH; the member was fenced "
                        "and these partitions may now belong to another member", code=exc.code) from None
                if exc.code != STALE_MEMBER_EPOCH or time.monotonic() >= deadline:
                    raise
            epoch = self.member.member_epoch
            answered = self._answer_waiter()
            self.member.heartbeat_soon()
            self.wake()
            try:
                await asyncio.wait_for(answered.wait(), max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                raise rebalancing_error(self.group_id, "its member epoch is stale") from None
            log.info("%s: commit with stale epoch %d retried", self._describe(), epoch)
