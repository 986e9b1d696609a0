"""The asyncio driver of group membership and offset storage for one consumer.

A single background task per member joins the group, keeps it alive with heartbeats (while the member
is stable they are sent in batches from the loop's heartbeat wheel over the coordinator's heartbeat
connection and answered in its read callback, the task asleep: see _drive_heartbeats and
service.group.heartbeats), and rejoins when needed; it never depends on the owner
polling (except for the max-poll-interval rule, which makes an idle owner leave so it cannot stall its
group's rebalances). Commits and committed-offset lookups go to the same coordinator, rediscovered on
NOT_COORDINATOR/COORDINATOR_NOT_AVAILABLE or a lost connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.client.client import KafkaClient, find_coordinator
from service.client.connection import BrokerConnection, wait_event
from service.client.errors import BrokerResponseError, KafkaConnectionError, KafkaError, RequestTimeoutError
from service.consumer.subscription import TopicPartition
from service.group.heartbeats import HEARTBEAT, heartbeat_wheel
from service.group.member import Action, GroupMember, MemberState, Step
from service.lib.aio import LightEvent
from service.protocol import error_codes as EC
from service.protocol import messages as M

log = logging.getLogger(__name__)

RevokeHook = Callable[[list[TopicPartition]], Awaitable[None]]
AssignHook = Callable[[list[TopicPartition], list[TopicPartition]], Awaitable[None]]
PartitionCounts = Callable[[Sequence[str]], Awaitable[dict[str, int]]]


#: Reasons named in the message of a refused commit (``reason: ...``); the HTTP API answers each 409 / 40903.
#: GROUP_REBALANCING: the group is rebalancing, or its coordinator is unknown / being rediscovered (e.g. after
#: a broker restart); nothing was committed, the commit may be retried after the next poll.
COMMIT_REBALANCING = "GROUP_REBALANCING"
#: PARTITION_NOT_ASSIGNED: the partition is not assigned to this instance (another member may own it).
COMMIT_NOT_ASSIGNED = "PARTITION_NOT_ASSIGNED"
#: PARTITION_BEING_REVOKED: the partition is being revoked from this instance in a rebalance.
COMMIT_BEING_REVOKED = "PARTITION_BEING_REVOKED"
#: How long a group-managed commit may spend finding its coordinator again (and retrying) before it is refused.
COMMIT_REDISCOVERY_S = 0.5


class CommitFailedError(KafkaError):
    """The commit was refused (nothing committed): this member is not in the group's current generation, the
    group is rebalancing, or the partitions are not (or no longer) this member's. ``reason`` is one of the
    ``COMMIT_*`` reasons above, or None for a broker's generation error."""

    retriable = False

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None) -> None:
        super().__init__(message, code=code)
        self.reason = reason


def rebalancing_error(group_id: str, why: str) -> CommitFailedError:
    return CommitFailedError(
        f"commit for group {group_id!r} refused (reason: {COMMIT_REBALANCING}): the group is rebalancing ({why}); "
        "nothing was committed, the commit may be retried after the next poll",
        code=EC.REBALANCE_IN_PROGRESS, reason=COMMIT_REBALANCING)


class GroupFatalError(KafkaError):
    retriable = False


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    metadata: str | None = ""
    leader_epoch: int | None = None


CommitPart = M.struct("OffsetCommitRequest", "OffsetCommitRequestPartition")
CommitTopic = M.struct("OffsetCommitRequest", "OffsetCommitRequestTopic")
FetchTopicOld = M.struct("OffsetFetchRequest", "OffsetFetchRequestTopic")
FetchGroup = M.struct("OffsetFetchRequest", "OffsetFetchRequestGroup")
FetchTopics = M.struct("OffsetFetchRequest", "OffsetFetchRequestTopics")


def _tps(tps: Sequence[TopicPartition]) -> str:
    """Partitions for a log line: topic[p,p,...] per topic."""
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return "{" + ", ".join(f"{t}{sorted(ps)}" for t, ps in sorted(by_topic.items())) + "}"


HEARTBEAT_TICK_S = 0.02  # heartbeats are due on this grid (service.group.heartbeats.HeartbeatWheel)


class GroupCoordinator:
    # Slots (memory per idle instance): with more than 29 attributes an instance's __dict__ stops
    # sharing its keys with the class and becomes a ~1.6 KB table of its own (one per consumer instance).
    # "__dict__" stays so that tests can still replace a method on one instance (created only then).
    __slots__ = (
        "__dict__", "_closing", "_coord_lock", "_deferred_recoveries", "_failed", "_failed_rounds",
        "_hb_result", "_loop", "_lost_at", "_on_assign", "_on_fatal", "_on_lost",
        "_on_revoke", "_on_task_failure", "_partition_counts", "_stable", "_task", "_topics",
        "_unassigned_since", "_unstable_since", "_wake", "client", "coordinator_id", "fatal", "group_id",
        "heartbeat_epoch", "heartbeat_interval", "heartbeat_latency", "heartbeat_sent_at", "heartbeats", "last_error",
        "last_poll",
        "left_for_poll_timeout", "max_poll_interval", "member", "polls_in_progress", "retry_backoff",
        "stall_recoveries", "task_failures",
    )
    heartbeat_api = HEARTBEAT  # what the heartbeat wheel sends for this member (service.group.heartbeats)

    def __init__(
        self,
        client: KafkaClient,
        member: GroupMember,
        *,
        heartbeat_interval_ms: int = 3000,
        max_poll_interval_ms: int = 300000,
        retry_backoff_ms: int = 100,
        partition_counts: PartitionCounts,
        on_revoke: RevokeHook,
        on_assign: AssignHook,
        on_lost: RevokeHook | None = None,
        on_fatal: Callable[[KafkaError], None] | None = None,
        topics: Callable[[], Sequence[str]],
        on_task_failure: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.client = client
        self.member = member
        self.group_id = member.group_id
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self._partition_counts = partition_counts
        self._on_revoke = on_revoke
        self._on_assign = on_assign
        self._on_lost = on_lost or on_revoke
        self._on_fatal = on_fatal
        self._topics = topics
        #: called (task name, exception) when the membership loop hits an unexpected error (it then restarts)
        self._on_task_failure = on_task_failure
        self.task_failures = 0
        self.coordinator_id: int | None = None
        self._lost_at = 0.0  # when the coordinator was last marked unknown
        self.polls_in_progress = 0
        self._coord_lock = asyncio.Lock()
        self._wake = LightEvent()
        self._loop: asyncio.AbstractEventLoop | None = None  # set when the membership task starts
        self._stable = LightEvent()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.last_poll = time.monotonic()
        self.left_for_poll_timeout = False
        self.heartbeat_latency: float | None = None
        self.heartbeats = 0
        self.fatal: KafkaError | None = None
        #: the last error of the membership loop, cleared once the member is stable again
        self.last_error: KafkaError | None = None
        self._failed = LightEvent()  # set while a non-retriable error blocks membership
        # heartbeats from callbacks (_drive_heartbeats): the current drive's number, and what ended it
        self.heartbeat_epoch = 0
        self._hb_result: Step | BaseException | None = None
        self.heartbeat_sent_at = 0.0  # loop time the last heartbeat from a callback was sent
        #: since when (monotonic) the member has been trying to (re)join without reaching a stable generation
        self._unstable_since: float | None = None
        #: since when (monotonic) the member has been subscribed while owning no partition (None: it owns some,
        #: or it is not subscribed); read by the metrics (kcg_unassigned_consumer_instances)
        self._unassigned_since: float | None = None
        #: times this member left and rejoined as a new member because its rebalance stalled (see _join)
        self.stall_recoveries = 0
        self._deferred_recoveries = 0  # stall recoveries left to another member (see _recover_stall)
        self._failed_rounds = 0  # JoinGroup/SyncGroup error answers since _unstable_since

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"group-{self.group_id}")

    def wake(self) -> None:
        self._wake.set()

    def poll_started(self) -> None:
        """A poll is waiting for data: the owner is not stalled while it lasts (Java refreshes its timer)."""
        self.polls_in_progress += 1
        self.polled()

    def poll_finished(self) -> None:
        self.polls_in_progress = max(0, self.polls_in_progress - 1)
        self.last_poll = time.monotonic()

    def polled(self) -> None:
        self.last_poll = time.monotonic()
        if self.left_for_poll_timeout:
            self.left_for_poll_timeout = False
            self.member.request_rejoin("owner polled again after max poll interval")
            self.wake()

    @property
    def stable(self) -> bool:
        return self.member.state is MemberState.STABLE and not self.member.rejoin_needed

    def unassigned_seconds(self, now: float | None = None) -> float:
        """How long this member has been subscribed while owning no partition (0: it owns some, or it is
        not subscribed). More members than partitions makes this legitimately grow for the spare ones."""
        self._note_assignment(now)
        since = self._unassigned_since
        return 0.0 if since is None else max(0.0, (time.monotonic() if now is None else now) - since)

    def unassigned_too_long(self, now: float | None = None) -> bool:
        """Subscribed without partitions for longer than the session timeout (kcg_unassigned_consumer_instances)."""
        return self.unassigned_seconds(now) * 1000 > self.member.session_timeout_ms

    def _note_assignment(self, now: float | None = None) -> None:
        if self._closing or not self._topics() or self.member.owned:
            self._unassigned_since = None
        elif self._unassigned_since is None:
            self._unassigned_since = time.monotonic() if now is None else now

    def _describe(self) -> str:
        m = self.member
        return f"group {self.group_id} member {m.member_id or '-'} generation {m.generation_id}"

    async def wait_stable(self, timeout: float) -> bool:
        if self.stable:
            return True
        # also wake up when a non-retriable error (e.g. rejected credentials) blocks membership
        waits = [asyncio.ensure_future(self._stable.wait()), asyncio.ensure_future(self._failed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.stable

    async def close(self, leave: bool = True, force_static_leave: bool = False) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if leave:
            await self._leave("consumer closing", force_static=force_static_leave)

    # -- coordinator discovery -----------------------------------------------------------------------
    async def ensure_coordinator(self, deadline: float | None = None) -> int:
        """The coordinator's node id, looked up if unknown. After the coordinator was lost, the next
        lookup waits ``retry_backoff`` (as Java does), so a broker that keeps answering NOT_COORDINATOR
        cannot cause a tight loop. Raises when ``deadline`` (monotonic) passes."""
        def too_late(extra: float = 0.0) -> BrokerResponseError | None:
            if deadline is not None and time.monotonic() + extra > deadline:
                return BrokerResponseError(EC.COORDINATOR_NOT_AVAILABLE,
                                           f"no coordinator for group {self.group_id!r} found in time")
            return None

        while self.coordinator_id is None:
            # One lookup attempt per lock hold, so a caller with a deadline is never stuck behind
            # another caller's long retry loop.
            try:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
                # arrives while the inner awaitable completes (a free lock is acquired at once).
                async with asyncio.timeout(remaining):
                    await self._coord_lock.acquire()
            except TimeoutError:
                raise too_late() or BrokerResponseError(EC.COORDINATOR_NOT_AVAILABLE, "FindCoordinator") from None
            try:
                if self.coordinator_id is not None:
                    break
                wait = self._lost_at + self.retry_backoff - time.monotonic()
                err = too_late(max(0.0, wait))
                if err is not None:
                    raise err
                if wait > 0:
                    await asyncio.sleep(wait)
                try:
                    self.coordinator_id = await self._find_coordinator()
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    log.debug("FindCoordinator for %s failed: %s", self.group_id, exc)
                    self._lost_at = time.monotonic()
            finally:
                self._coord_lock.release()
        return self.coordinator_id

    async def _find_coordinator(self) -> int:
        return await find_coordinator(self.client, self.group_id)

    def coordinator_dead(self, reason: str) -> None:
        if self.coordinator_id is not None:
            log.info("group %s: coordinator %s marked unknown (%s)", self.group_id, self.coordinator_id, reason)
        self.coordinator_id = None
        self._lost_at = time.monotonic()

    def _coordinator_connected(self) -> bool:
        node = self.coordinator_id
        if node is None:
            return False
        try:
            return self.client.connection(node).current is not None
        except KafkaError:
            return False

    async def _send(self, req: Any, timeout: float | None = None, blocking: bool = False,
                    deadline: float | None = None) -> Any:
        node = await self.ensure_coordinator(deadline)
        try:
            if blocking:
                return await self.client.send_blocking(node, req, timeout=timeout)
            return await self.client.send(node, req, timeout=timeout)
        except KafkaError as exc:
            if exc.retriable:
                self.coordinator_dead(str(exc))
            raise

    # -- the membership loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        failures = 0  # consecutive unexpected errors: the restart backoff doubles with each
        self._loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                await self._tick()
                failures = 0
            except asyncio.CancelledError:
                raise
            except GroupFatalError as exc:
                self.fatal = exc
                if self._on_fatal:
                    self._on_fatal(exc)
                return
            except KafkaError as exc:
                log.info("group %s: %s; retrying", self.group_id, exc)
                self.last_error = exc
                if exc.retriable:
                    self.coordinator_dead(str(exc))
                else:
                    self._failed.set()
                await self._pause(self.retry_backoff)
            except Exception as exc:  # never let the member task die silently
                self.task_failures += 1
                failures += 1
                if self._on_task_failure is not None:
                    self._on_task_failure("membership", exc)
                else:
                    log.exception("group %s member %s: unexpected error in the membership loop; restarting it",
                                  self.group_id, self.member.member_id)
                await self._pause(min(5.0, max(self.retry_backoff, 0.05) * 2 ** min(failures - 1, 10)))

    async def _pause(self, seconds: float) -> None:
        await wait_event(self._wake, seconds, self._loop)
        self._wake.clear()

    async def _tick(self) -> None:
        m = self.member
        topics = list(self._topics())
        if not topics:
            # Nothing to consume: leave if we are in the group, then idle until woken.
            if m.member_id and m.state is not MemberState.UNJOINED:
                await self._leave("subscription is empty")
            self._stable.clear()
            await self._pause(3600)
            return
        if self.left_for_poll_timeout:
            await self._pause(3600)
            return
        if (self.polls_in_progress == 0 and time.monotonic() - self.last_poll > self.max_poll_interval
                and m.state is MemberState.STABLE):
            log.warning("group %s: member %s did not poll within max.poll.interval.ms; leaving the group",
                        self.group_id, m.member_id)
            # set first: a poll arriving while LeaveGroup is in flight must request the rejoin
            self.left_for_poll_timeout = True
            await self._leave("max poll interval exceeded")
            return
        if m.rejoin_needed or m.state is not MemberState.STABLE:
            self._stable.clear()
            self._wake.clear()  # the join acts on the state of now: earlier wake-ups are answered by it
            await self._join(topics)
            return
        # Steady state: one heartbeat from this task (it finds the coordinator and connects when needed),
        # then the next ones from callbacks (_drive_heartbeats) until something needs this task again.
        started = time.monotonic()
        resp = await self._send(m.heartbeat_request())
        self.heartbeat_latency = time.monotonic() - started
        self.heartbeats += 1
        step: Step | None = m.on_heartbeat_response(resp)
        # nothing of this round stays referenced from this frame while the task sleeps in _drive_heartbeats
        # (idle memory: the answer, a Step with its four lists and the topics list were ~0.5 KB per idle member)
        del resp, topics
        if step is not None and step.action is Action.OK:
            step = None
            await self._connect_heartbeats()
            step = await self._drive_heartbeats()
        if step is not None:
            await self._after_heartbeat(step)

    async def _after_heartbeat(self, step: Step) -> None:
        """What a heartbeat answer other than OK asks for."""
        if step.action is Action.FATAL:
            log.warning("%s: heartbeat failed for good: %s", self._describe(), step.error)
        elif step.action is not Action.OK:
            log.info("%s: heartbeat: %s", self._describe(),
                     "coordinator moved" if step.action is Action.REDISCOVER else
                     "coordinator loading" if step.action is Action.RETRY else self.member.rejoin_reason)
        if step.action is Action.REDISCOVER:
            self.coordinator_dead("heartbeat")
        elif step.action is Action.RETRY:
            await self._pause(self.retry_backoff)
        elif step.action is Action.FATAL:
            await self._lose_partitions()
            raise GroupFatalError(str(step.error), code=step.error.code if step.error else None)
        elif step.action is not Action.OK:  # REJOIN
            if self.member.state is MemberState.UNJOINED and self.member.generation_id < 0:
                await self._lose_partitions()

    # -- heartbeats from callbacks -------------------------------------------------------------------
    # Ten thousand idle members each heartbeat every few seconds. Waking each member's task twice per
    # heartbeat (to send, then for the answer), through a chain of coroutines, costs several times what
    # the heartbeat itself does. While a member is stable its heartbeats are therefore sent by the loop's
    # heartbeat wheel (service.group.heartbeats: one batch per tick and coordinator connection) and their
    # answers handled in the connection's read callback; the task sleeps until an answer is not OK, a
    # heartbeat fails, the member stops being stable (poll timeout, rejoin, subscription, closing), the
    # connection is gone, or someone calls wake().

    async def _drive_heartbeats(self) -> Step | None:
        """Heartbeat from callbacks until this task is needed. Returns the step of an answer other than OK,
        None when woken for anything else (the next tick of the loop decides); raises a failed heartbeat's
        error (as the task's own send would)."""
        loop = self._loop or asyncio.get_running_loop()
        self._hb_result = None
        self.heartbeat_epoch += 1
        self._schedule_heartbeat(loop)
        try:
            await self._wake.wait()
        finally:
            self.heartbeat_epoch += 1  # a due heartbeat or an answer in flight now belongs to nobody
        self._wake.clear()
        result, self._hb_result = self._hb_result, None
        if isinstance(result, BaseException):
            if isinstance(result, KafkaConnectionError):
                self.client.metadata.mark_stale()
            if isinstance(result, KafkaError) and result.retriable:
                self.coordinator_dead(str(result))
            raise result
        return result

    async def _connect_heartbeats(self) -> None:
        """Open the coordinator's heartbeat connection (KafkaClient.heartbeat_connection) if it is not: the next
        heartbeats go there. Best effort: until it connects they go over the main connection."""
        node = self.coordinator_id
        if node is None:
            return
        try:
            hb = self.client.heartbeat_connection(node)
            if hb.current is None:
                async with asyncio.timeout(max(0.1, self.heartbeat_interval / 2)):
                    await hb.get()
        except (KafkaError, TimeoutError) as exc:
            log.debug("%s: no heartbeat connection (%s); heartbeats use the main one", self._describe(), exc)

    def _schedule_heartbeat(self, loop: asyncio.AbstractEventLoop) -> None:
        # up to 20% early, at random: members that joined together (a whole group, a gateway's worth of
        # groups) would otherwise heartbeat in lockstep, thousands within a few milliseconds. Due times end
        # on the loop's shared heartbeat tick (no timer per member); the heartbeats of a tick leave together,
        # one batch per coordinator connection (service.group.heartbeats).
        heartbeat_wheel(loop, HEARTBEAT_TICK_S).add(
            self, loop.time() + self.heartbeat_interval * (1.0 - 0.2 * random.random()))

    def heartbeat_route(self) -> tuple[BrokerConnection, bool] | None:
        """The connection for the next heartbeat if it can go from the heartbeat wheel: the member is stable
        and polled recently enough, it has topics, and the coordinator is known and connected. The
        coordinator's heartbeat connection (True: dedicated) when it is connected, else its main one."""
        m = self.member
        node = self.coordinator_id
        if (node is None or self._closing or m.state is not MemberState.STABLE or m.rejoin_needed
                or self.left_for_poll_timeout
                or (self.polls_in_progress == 0 and time.monotonic() - self.last_poll > self.max_poll_interval)
                or not self._topics()):
            return None
        return self._heartbeat_conn(node)

    def _heartbeat_conn(self, node: int) -> tuple[BrokerConnection, bool] | None:
        """The coordinator's heartbeat connection (True: dedicated) when it is connected, else its main one."""
        try:
            conn = self.client.heartbeat_connection(node).current
            if isinstance(conn, BrokerConnection):
                return conn, True
            conn = self.client.connection(node).current
        except KafkaError:
            return None
        return (conn, False) if isinstance(conn, BrokerConnection) else None

    def heartbeat_blocked(self) -> None:
        """The wheel could not send a due heartbeat (heartbeat_route gave None): the task decides (rejoin, leave,
        rediscover, reconnect ...)."""
        self._wake.set()

    def on_heartbeat_ok(self, epoch: int) -> None:
        """A heartbeat sent from the wheel was answered without error (the common case, kept short)."""
        if epoch != self.heartbeat_epoch:
            return  # the task took over meanwhile; it heartbeats on its own
        loop = self._loop or asyncio.get_running_loop()
        self.heartbeat_latency = loop.time() - self.heartbeat_sent_at
        self.heartbeats += 1
        self._schedule_heartbeat(loop)

    def on_heartbeat_answer(self, epoch: int, started: float, resp: Any, exc: BaseException | None) -> None:
        """A heartbeat sent from the wheel at loop time ``started`` was answered (``resp``) or failed (``exc``)."""
        if epoch != self.heartbeat_epoch:
            return  # the task took over meanwhile; it heartbeats on its own
        if exc is not None:
            self._hb_result = exc
            self._wake.set()
            return
        loop = self._loop or asyncio.get_running_loop()
        self.heartbeat_latency = loop.time() - started
        self.heartbeats += 1
        step = self.member.on_heartbeat_response(resp)
        if step.action is Action.OK:
            self._schedule_heartbeat(loop)
        else:
            self._hb_result = step
            self._wake.set()

    async def _lose_partitions(self) -> None:
        lost, self.member.owned = self.member.owned, []
        if lost:
            log.info("%s: lost partitions %s (no longer a member of the generation)", self._describe(),
                     _tps(lost))
            await self._on_lost(lost)
        self._note_assignment()

    async def _join(self, topics: list[str]) -> None:
        m = self.member
        if self._unstable_since is None:
            self._unstable_since = time.monotonic()
            self._failed_rounds = 0
        revoked = m.prepare_join()
        if revoked:
            log.info("%s: revoking %s before rejoining (%s)", self._describe(), _tps(revoked), m.rejoin_reason)
            await self._on_revoke(revoked)
        self._note_assignment()
        await self.ensure_coordinator()
        join_timeout = m.rebalance_timeout_ms / 1000 + 5.0
        while not self._closing:
            if m.stalled(time.monotonic() - self._unstable_since, self._failed_rounds):
                await self._recover_stall()
            req = m.join_request(topics)
            log.info("%s: joining (reason: %s)", self._describe(), req.reason)
            resp = await self._send(req, timeout=join_timeout, blocking=True)
            step = m.on_join_response(resp)
            if resp.error_code:
                log.info("%s: JoinGroup answered %s", self._describe(), EC.describe(resp.error_code).name)
                if resp.error_code != EC.MEMBER_ID_REQUIRED:
                    self._failed_rounds += 1
            else:
                log.info("%s: joined; leader %s%s%s", self._describe(), m.leader_id or "-",
                         f", members {sorted(x.member_id for x in resp.members)}" if m.is_leader else "",
                         " (a static leader back in a stable group: the current assignment stays)"
                         if m.skipped_assignment else "")
            if step.action is Action.REJOIN:
                continue
            if step.action is Action.RETRY:
                await asyncio.sleep(self.retry_backoff)
                continue
            if step.action is Action.REDISCOVER:
                self.coordinator_dead("join")
                return
            if step.action is Action.FATAL:
                log.warning("%s: JoinGroup failed for good: %s", self._describe(), step.error)
                await self._lose_partitions()
                raise GroupFatalError(str(step.error), code=step.error.code if step.error else None)
            if step.action is Action.ASSIGN:
                counts = await self._partition_counts(step.topics)
                step = m.leader_sync(counts)
                for instance_id, member_ids in m.shared_instance_ids.items():
                    log.warning("group %s: the coordinator lists members %s with one group.instance.id %r (a "
                                "departed one next to its successor: a broker defect, docs/groups.md); each gets "
                                "the same partitions", self.group_id, member_ids, instance_id)
                for member_id, problem in m.bad_subscriptions:
                    log.warning("group %s: member %s sent an unreadable subscription (%s); it gets no partitions",
                                self.group_id, member_id, problem)
                if step.action is Action.FATAL:
                    raise GroupFatalError(str(step.error), code=step.error.code if step.error else None)
                log.info("%s: as leader, assigned %s", self._describe(), m.last_plan)
            resp = await self._send(step.request, timeout=join_timeout, blocking=True)
            step = m.on_sync_response(resp)
            if step.action is Action.DONE:
                log.info("%s: synced; assignment %s (added %s, revoked %s)", self._describe(),
                         _tps(step.assigned), _tps(step.added), _tps(step.revoked))
                if step.revoked:
                    await self._on_revoke(step.revoked)
                await self._on_assign(step.assigned, step.added)
                self.last_error = None
                self._failed.clear()
                self._unstable_since = None
                self._note_assignment()
                if not m.rejoin_needed:
                    self._stable.set()
                return
            log.info("%s: SyncGroup answered %s", self._describe(), EC.describe(resp.error_code).name)
            self._failed_rounds += 1
            if step.action is Action.REDISCOVER:
                self.coordinator_dead("sync")
                return
            if step.action is Action.FATAL:
                log.warning("%s: SyncGroup failed for good: %s", self._describe(), step.error)
                await self._lose_partitions()
                raise GroupFatalError(str(step.error), code=step.error.code if step.error else None)
            if step.action is Action.RETRY:
                await asyncio.sleep(self.retry_backoff)
            if m.generation_id < 0:
                await self._lose_partitions()
            # REJOIN: loop

    async def _recover_stall(self) -> None:
        """The member has not reached a stable generation for longer than its session timeout although the
        broker answers. Two ways out, chosen from what the broker says the group is (DescribeGroups):

        - the leader the broker names in JoinGroup answers is not a member of the group any more (it left or
          expired; possibly this member's own id): no one will ever send that leader's SyncGroup, so every
          follower's SyncGroup is answered REBALANCE_IN_PROGRESS for ever (Tansu 0.6, docs/groups.md; Apache
          Kafka elects a new leader instead). The member rejoins under the departed leader's member id, which
          such a broker takes for the leader's: it gets the member list and completes the rebalance;
        - otherwise it leaves (static members too) and rejoins as a new member.

        On a broker without the defect this costs one extra rebalance, and only after a stall.
        """
        m = self.member
        stalled_for = time.monotonic() - (self._unstable_since or time.monotonic())
        self.stall_recoveries += 1
        self._unstable_since = time.monotonic()
        self._failed_rounds = 0
        leader = m.leader_id
        members = await self._describe_members()
        if leader and members is not None and leader not in members:
            # One member takes the departed leader's place: the live member with the smallest id (members of
            # one gateway stall together and would otherwise all adopt the same id and fence each other). The
            # others rejoin as usual; after deferring twice a member adopts it itself (the designated one may be
            # a client outside the gateway that never recovers).
            others = sorted(x for x in members if x != m.member_id)
            if (others and m.member_id and leader != m.member_id and others[0] < m.member_id
                    and self._deferred_recoveries < 2):
                self._deferred_recoveries += 1
                log.warning("%s: no stable generation for %.1f s: the coordinator names the departed %s as "
                            "leader; member %s takes its place (the smallest live id), this member rejoins",
                            self._describe(), stalled_for, leader, others[0])
                m.request_rejoin("rebalance stalled on a departed leader: another member takes its place")
                return
            self._deferred_recoveries = 0
            log.warning("%s: no stable generation for %.1f s (session timeout %.1f s): the coordinator names "
                        "%s as leader, which is not a member of the group (members: %s); rejoining under the "
                        "departed leader's member id to complete the rebalance (a broker defect: docs/groups.md)",
                        self._describe(), stalled_for, m.session_timeout_ms / 1000, leader, sorted(members))
            await self._lose_partitions()
            if leader != m.member_id:
                # our own member id leaves first: the rebalance then does not wait for it to expire
                await self._leave_quietly(m.leave_request("rejoining under the departed leader's id",
                                                          force_static=True))
            m.adopt_member_id(leader, "rebalance stalled on a departed leader")
            return
        log.warning("%s: no stable generation for %.1f s (session timeout %.1f s; leader %s, members %s); "
                    "leaving the group and rejoining as a new member", self._describe(), stalled_for,
                    m.session_timeout_ms / 1000, m.leader_id or "-",
                    "unknown" if members is None else sorted(members))
        await self._lose_partitions()
        req = m.leave_request("rebalance stalled: rejoining as a new member", force_static=True)
        m.reset_member("rebalance stalled: rejoining as a new member")
        await self._leave_quietly(req)

    async def _leave_quietly(self, req: Any | None) -> None:
        """Send a LeaveGroup built by the member (if any); failures are only logged."""
        if req is None:
            return
        try:
            resp = await self._send(req, timeout=5.0)
            codes = [resp.error_code] + [x.error_code for x in (resp.members or [])]
            if any(codes):
                log.info("%s: LeaveGroup answered %s", self._describe(), [EC.describe(c).name for c in codes if c])
        except KafkaError as exc:
            log.info("%s: LeaveGroup failed: %s", self._describe(), exc)

    async def _describe_members(self) -> set[str] | None:
        """The member ids the coordinator lists for this group (DescribeGroups), None if it cannot tell."""
        try:
            resp = await self._send(M.DescribeGroupsRequest(groups=[self.group_id],
                                                            include_authorized_operations=False), timeout=5.0)
        except KafkaError as exc:
            log.info("%s: DescribeGroups failed: %s", self._describe(), exc)
            return None
        g = next((g for g in resp.groups if g.group_id == self.group_id), None)
        if g is None or g.error_code:
            return None
        return {x.member_id for x in g.members}

    async def _leave(self, reason: str, force_static: bool = False) -> None:
        """onLeavePrepare then LeaveGroup: the revocation hook (which may commit) runs while this
        member still holds its generation, then the member leaves and forgets it."""
        m = self.member
        self._stable.clear()
        owned = list(m.owned)
        if owned:
            try:
                await self._on_revoke(owned)
            except Exception:
                log.exception("group %s: revocation hook failed while leaving", self.group_id)
        req = m.leave_request(reason, force_static=force_static)
        if req is not None:
            log.info("%s: leaving (%s)", self._describe(), reason)
        elif m.member_id and m.group_instance_id is not None:
            log.info("%s: stopping without LeaveGroup (%s): a static member keeps its slot until its session "
                     "times out", self._describe(), reason)
        m.after_leave(reason)
        self._unstable_since = None
        self._note_assignment()
        if req is None or self.coordinator_id is None:
            return
        try:
            resp = await self._send(req, timeout=5.0)
            if resp.error_code:
                log.info("group %s: LeaveGroup answered %s", self.group_id, EC.describe(resp.error_code).name)
        except KafkaError as exc:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)

    # -- offsets ------------------------------------------------------------------------------------
    def _group_commit_identity(self, revoking: bool) -> tuple[int, str, str | None]:
        """(generation, member id, instance id) of a group-managed commit, or raise to refuse it locally (the
        consumer protocol's driver, service.group.coordinator_consumer, puts the member epoch there)."""
        m = self.member
        if m.state is not MemberState.STABLE or m.generation_id < 0 or (m.rejoin_needed and not revoking):
            # Like Java's generationIfStable(): outside a stable generation the partitions may
            # already belong to someone else, and a generation -1 commit would be accepted by an
            # empty group (a zombie commit). Fail locally instead.
            raise rebalancing_error(self.group_id, "this member is not in a stable generation")
        return m.commit_identity()

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata], *, manual: bool = False,
                     timeout: float = 30.0, check: Callable[[], None] | None = None,
                     revoking: bool = False) -> None:
        """Commit offsets; retriable errors are retried (after coordinator rediscovery) until ``timeout``.

        Generation errors (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) are raised as
        :class:`CommitFailedError` without touching membership: the heartbeat loop handles that.

        A group-managed commit (not ``manual``) is refused locally, before anything is sent, unless the
        member is stable (no rebalance pending; ``revoking``: the commit made before giving partitions up,
        while the member still holds its generation); finding the coordinator again and retrying may take
        at most :data:`COMMIT_REDISCOVERY_S`, then it is refused as rebalancing (nothing waits seconds for a
        restarted broker). ``check`` runs before every attempt and raises to refuse (e.g. partitions no
        longer owned).
        """
        if not offsets:
            return
        started = time.monotonic()
        deadline = started + timeout
        # a client's group-managed commit: how long coordinator rediscovery and retries may take in all
        fast = not manual and not revoking
        retry_deadline = min(deadline, started + COMMIT_REDISCOVERY_S) if fast else deadline
        while True:
            if manual:
                gen, member_id, instance = -1, "", None
            else:
                gen, member_id, instance = self._group_commit_identity(revoking)
            if check is not None:
                check()
            if fast and self.coordinator_id is None:
                try:
                    async with asyncio.timeout(max(0.0, retry_deadline - time.monotonic())):
                        await self.ensure_coordinator(retry_deadline)
                except (TimeoutError, KafkaError) as exc:
                    if isinstance(exc, KafkaError) and not exc.retriable:
                        raise
                    raise rebalancing_error(self.group_id, "its coordinator is unknown or being rediscovered"
                                            ) from None
                continue  # the member may have changed while we looked: check again
            by_topic: dict[str, list[Any]] = {}
            for tp, om in offsets.items():
                by_topic.setdefault(tp.topic, []).append(
                    CommitPart(partition_index=tp.partition, committed_offset=om.offset,
                               committed_leader_epoch=-1 if om.leader_epoch is None else om.leader_epoch,
                               committed_metadata=om.metadata)
                )
            req = M.OffsetCommitRequest(
                group_id=self.group_id, generation_id_or_member_epoch=gen, member_id=member_id,
                group_instance_id=instance, retention_time_ms=-1,
                topics=[CommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
            )
            # Not connected to the coordinator (e.g. its broker restarted): reconnecting counts against the
            # rediscovery budget of a group-managed commit, a connected one gets the whole timeout.
            bound = None
            if fast and not self._coordinator_connected():
                bound = max(0.0, retry_deadline - time.monotonic())
            try:
                async with asyncio.timeout(bound):
                    resp = await self._send(req, timeout=max(0.1, deadline - time.monotonic()), deadline=deadline)
            except TimeoutError:
                self.coordinator_dead("commit: no connection to the coordinator")
                raise rebalancing_error(self.group_id, "its coordinator is unreachable or being rediscovered"
                                        ) from None
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                if fast and time.monotonic() + self.retry_backoff >= retry_deadline:
                    raise rebalancing_error(self.group_id, f"the commit failed: {exc}") from None
                await asyncio.sleep(self.retry_backoff)
                continue
            retry_code = 0
            for t in resp.topics:
                for p in t.partitions:
                    code = p.error_code
                    if not code:
                        continue
                    if code in (EC.NOT_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE):
                        self.coordinator_dead("commit")
                        retry_code = code
                    elif code in (EC.REBALANCE_IN_PROGRESS, EC.ILLEGAL_GENERATION, EC.UNKNOWN_MEMBER_ID,
                                  EC.FENCED_INSTANCE_ID):
                        raise CommitFailedError(
                            f"commit for group {self.group_id!r} rejected: {EC.describe(code).name}; "
                            "the group rebalanced and these partitions may now belong to another member",
                            code=code,
                        )
                    elif EC.describe(code).retriable:
                        retry_code = code
                    else:
                        raise BrokerResponseError(code, f"OffsetCommit {t.name}-{p.partition_index}")
            if not retry_code:
                return
            if time.monotonic() >= deadline:
                raise BrokerResponseError(retry_code, "OffsetCommit (retries exhausted)")
            if fast and time.monotonic() + self.retry_backoff >= retry_deadline:
                raise rebalancing_error(self.group_id, f"OffsetCommit answered {EC.describe(retry_code).name}")
            await asyncio.sleep(self.retry_backoff)

    async def committed(self, partitions: Sequence[TopicPartition], timeout: float = 30.0
                        ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets (None where nothing is committed), with RequireStable where supported."""
        if not partitions:
            return {}
        deadline = time.monotonic() + timeout
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        while True:
            try:
                node = await self.ensure_coordinator(deadline)
                conn = await self.client.connection(node).get()
                version = conn.version_for(M.ApiKey.OFFSET_FETCH)
                if version >= 8:
                    req = M.OffsetFetchRequest(
                        groups=[FetchGroup(group_id=self.group_id,
                                           topics=[FetchTopics(name=t, partition_indexes=ps)
                                                   for t, ps in by_topic.items()])],
                        require_stable=True,
                    )
                else:
                    req = M.OffsetFetchRequest(
                        group_id=self.group_id,
                        topics=[FetchTopicOld(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
                        require_stable=True,
                    )
                resp = await conn.send(req, version)
            except (KafkaError, RequestTimeoutError) as exc:
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                self.coordinator_dead(str(exc))
                await asyncio.sleep(self.retry_backoff)
                continue
            if version >= 8:
                grp = next((g for g in resp.groups if g.group_id == self.group_id), None)
                top_code = grp.error_code if grp else EC.COORDINATOR_NOT_AVAILABLE
                topics = grp.topics if grp else []
            else:
                top_code = resp.error_code
                topics = resp.topics
            codes = [top_code] + [p.error_code for t in topics for p in t.partitions]
            retry = next((c for c in codes if c and EC.describe(c).retriable), 0)
            if retry:
                if retry in (EC.NOT_COORDINATOR, EC.COORDINATOR_NOT_AVAILABLE):
                    self.coordinator_dead("offset fetch")
                if time.monotonic() >= deadline:
                    raise BrokerResponseError(retry, "OffsetFetch (retries exhausted)")
                await asyncio.sleep(self.retry_backoff)
                continue
            fatal = next((c for c in codes if c), 0)
            if fatal:
                raise BrokerResponseError(fatal, f"OffsetFetch for group {self.group_id!r}")
            out: dict[TopicPartition, OffsetAndMetadata | None] = {tp: None for tp in partitions}
            for t in topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    if p.committed_offset >= 0:
                        epoch = p.committed_leader_epoch
                        out[tp] = OffsetAndMetadata(p.committed_offset, p.metadata,
                                                    None if epoch is None or epoch < 0 else epoch)
            return out
