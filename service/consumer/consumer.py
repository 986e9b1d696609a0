"""One Kafka consumer living inside the gateway (no HTTP here).

A consumer is a few asyncio tasks — group membership (join/sync/heartbeat), the fetcher, and
auto-commit — over a :class:`KafkaClient` that may be shared with many other consumers. ``poll``
waits on the prefetch buffer (true long-poll): once records are buffered it gathers what fetches still
outstanding bring for the rest of the assignment (a short, bounded linger; see ``poll_batches``) and
returns, or returns [] after its timeout. The first poll after ``subscribe`` waits for the group
assignment within its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.client.client import KafkaClient
from service.client.connection import wait_event
from service.client.errors import BrokerResponseError, KafkaError
from service.consumer.subscription import (
    FetchState,
    NoOffsetForPartitionError,
    OffsetResetStrategy,
    SubscriptionError,
    SubscriptionState,
    SubscriptionType,
    TopicPartition,
)
from service.fetch.fetcher import FetchConfig, Fetcher
from service.fetch.offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from service.fetch.oneshot import probe_fetch
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED
from service.group.assignors import Assignor, get_assignor
from service.group.coordinator import (
    COMMIT_BEING_REVOKED,
    COMMIT_NOT_ASSIGNED,
    CommitFailedError,
    GroupCoordinator,
    OffsetAndMetadata,
    rebalancing_error,
)
from service.group.coordinator_consumer import ConsumerProtocolCoordinator
from service.group.member import GroupMember
from service.group.member_consumer import ConsumerGroupMember
from service.lib.aio import LightEvent
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol.records import Record, decode_records

log = logging.getLogger(__name__)


ListTopic = M.struct("ListOffsetsRequest", "ListOffsetsTopic")
ListPartition = M.struct("ListOffsetsRequest", "ListOffsetsPartition")


# A poll that has records also waits for a fetch outstanding since before it started if that fetch's
# broker-side wait ends within this (Tansu answers only then; see Fetcher.gather_until).
GATHER_DUE_S = 0.025


_NONE_REVOKING: frozenset[Any] = frozenset()
#: revocations kept in Consumer.revoked_history (the latest ones): a member of a group that rebalances often (a
#: gateway's worth of members joining) would otherwise keep a list per rebalance for as long as it lives
REVOKED_HISTORY = 16


class ConsumerClosedError(KafkaError):
    retriable = False


@dataclass(frozen=True)
class ConsumerConfig:
    group_id: str | None = None
    client_id: str = "kafka-consumer-gateway"
    group_instance_id: str | None = None
    session_timeout_ms: int = 45000
    rebalance_timeout_ms: int | None = None  # defaults to max_poll_interval_ms, as in Java
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    auto_offset_reset: str = "latest"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    isolation_level: str = "read_uncommitted"
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 52428800
    max_partition_fetch_bytes: int = 1048576
    fetch_max_wait_ms: int = 500
    # Broker-side wait while a poll is waiting or was within the last second (None: fetch_max_wait_ms).
    # For brokers that do not answer a parked fetch as soon as data arrives (Tansu).
    fetch_active_max_wait_ms: int | None = None
    prefetch_max_bytes: int = 8 * 1024 * 1024
    assignment_strategies: tuple[str, ...] = ("range", "cooperative-sticky")
    retry_backoff_ms: int = 100
    client_rack: str = ""
    metadata_max_age_ms: int = 300000  # how often a pattern subscription looks for new topics
    fetch_idle_pause_ms: int = 30000  # stop prefetching after this long without a poll (0: never)
    # Once a poll has records to hand out, it gathers for at most this long while fetches that may bring
    # records of other assigned partitions are outstanding (see poll_batches); 0: return at once.
    poll_linger_ms: float = 0.0
    # The group membership protocol, as the Java client's group.protocol: "classic" (JoinGroup/SyncGroup,
    # client-side assignors) or "consumer" (KIP-848: the broker assigns, members converge by heartbeats)
    group_protocol: str = "classic"
    # group.remote.assignor: the broker-side assignor of a "consumer" member (uniform | range; None: the broker's)
    group_remote_assignor: str | None = None

    @property
    def isolation(self) -> int:
        v = self.isolation_level.strip().lower()
        if v not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"isolation level must be read_committed or read_uncommitted, not {v!r}")
        return READ_COMMITTED if v == "read_committed" else READ_UNCOMMITTED


@dataclass(slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


RevocationHook = Callable[[list[TopicPartition]], Awaitable[None]]


@dataclass
class ConsumerStats:
    polls: int = 0
    records: int = 0
    rebalances: int = 0
    commits: int = 0
    commit_failures: int = 0
    last_commit_latency: float | None = None
    poll_wait_seconds: float = 0.0
    wakeups: int = 0
    #: partitions this member gave up in hand-overs (revocations; not losses): under the classic protocol's eager
    #: rebalances every member gives up everything at each change, under the consumer protocol only what moves
    partitions_revoked: int = 0
    #: seconds the latest change of the assignment took to settle (classic: from the first revocation to the
    #: new assignment; consumer protocol: from a new target to stable again); None before the first change
    last_converge_seconds: float | None = None
    #: unexpected errors of background tasks by task (fetcher, membership, positions, autocommit, pattern);
    #: each was logged and the task restarted
    task_failures: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def restart_backoff(failures: int) -> float:
    """Seconds before a background task restarts after its ``failures``-th consecutive unexpected error."""
    return min(5.0, 0.1 * 2 ** min(max(failures - 1, 0), 10))


# Memory per idle instance: what is the same for most instances is shared, not built per instance.
@functools.lru_cache(maxsize=64)
def _fetch_config(isolation_level: int, min_bytes: int, max_bytes: int, partition_max_bytes: int, max_wait_ms: int,
                  active_max_wait_ms: int | None, prefetch_max_bytes: int, rack_id: str,
                  idle_pause_s: float) -> FetchConfig:
    """One FetchConfig (frozen) per distinct setting."""
    return FetchConfig(isolation_level=isolation_level, min_bytes=min_bytes, max_bytes=max_bytes,
                       partition_max_bytes=partition_max_bytes, max_wait_ms=max_wait_ms,
                       active_max_wait_ms=active_max_wait_ms, prefetch_max_bytes=prefetch_max_bytes,
                       rack_id=rack_id, idle_pause_s=idle_pause_s)


@functools.lru_cache(maxsize=64)
def _assignors(names: tuple[str, ...]) -> tuple[Assignor, ...]:
    """The assignors of ``names``; they keep no state between assignments, so members share them."""
    return tuple(get_assignor(n) for n in names)


class Consumer:
    def __init__(self, client: KafkaClient, config: ConsumerConfig,
                 on_revoke: RevocationHook | None = None) -> None:
        self.client = client
        self.config = config
        self.subs = SubscriptionState(OffsetResetStrategy.parse(config.auto_offset_reset))
        self.fetcher = Fetcher(client, self.subs, _fetch_config(
            config.isolation, config.fetch_min_bytes, config.fetch_max_bytes, config.max_partition_fetch_bytes,
            config.fetch_max_wait_ms, config.fetch_active_max_wait_ms, config.prefetch_max_bytes,
            config.client_rack, config.fetch_idle_pause_ms / 1000))
        self.stats = ConsumerStats()
        self.fetcher.on_reset = self._wake_positions
        self._user_revoke = on_revoke
        self._closed = False
        self._fatal: KafkaError | None = None
        self._positions_task: asyncio.Task[None] | None = None
        self._positions_wake = LightEvent()
        self._autocommit_task: asyncio.Task[None] | None = None
        self._consumed = LightEvent()  # records delivered since the last auto-commit
        self._pattern_task: asyncio.Task[None] | None = None
        self._assignment_event = LightEvent()
        #: set whenever the assignment changes (assign, revoke, lose); waiters clear it themselves
        self.assignment_changed = LightEvent()
        self.revoked_history: list[list[TopicPartition]] = []
        self._commit_lock = asyncio.Lock()
        # partitions being revoked (refused to commits); a shared empty frozenset while none are (an
        # empty set per instance is 216 B)
        self._revoking: frozenset[TopicPartition] = _NONE_REVOKING
        self.coordinator: GroupCoordinator | None = None
        self.member: GroupMember | None = None
        if config.group_id is not None and config.group_protocol == "consumer":
            self._consumer_protocol_member(config.group_id)
        elif config.group_id is not None:
            if config.group_protocol != "classic":
                raise ValueError(f"group.protocol must be classic or consumer, not {config.group_protocol!r}")
            assignors = _assignors(tuple(config.assignment_strategies))
            self.member = GroupMember(
                config.group_id, assignors, group_instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.rebalance_timeout_ms or config.max_poll_interval_ms,
                rack_id=config.client_rack or None,
            )
            self.coordinator = GroupCoordinator(
                client, self.member,
                heartbeat_interval_ms=config.heartbeat_interval_ms,
                max_poll_interval_ms=config.max_poll_interval_ms,
                retry_backoff_ms=config.retry_backoff_ms,
                partition_counts=self._partition_counts,
                on_revoke=self._on_revoke,
                on_assign=self._on_assign,
                on_lost=self._on_lost,
                on_fatal=self._on_group_fatal,
                topics=self._group_topics,
                on_task_failure=self._task_failed,
            )
        self.fetcher.on_error = self._fetcher_failed  # (a bound method: ~130 B less per instance than a closure)
        self._started = False
        self._change_started: float | None = None  # the first revocation of a classic rebalance in progress

    def _consumer_protocol_member(self, group_id: str) -> None:
        """Membership under the consumer protocol (KIP-848): the broker assigns (``group_remote_assignor``),
        the session timeout and heartbeat interval are the group's (broker configs), a pattern subscription
        is sent to the broker as a regular expression (RE2 syntax, see :meth:`_group_regex`)."""
        config = self.config
        member = ConsumerGroupMember(
            group_id, group_instance_id=config.group_instance_id, rack_id=config.client_rack or None,
            rebalance_timeout_ms=config.rebalance_timeout_ms or config.max_poll_interval_ms,
            server_assignor=config.group_remote_assignor, retry_backoff_s=config.retry_backoff_ms / 1000,
            # a durable instance re-created after its replica was killed joins under the same static id
            wait_for_instance_release=config.group_instance_id is not None)
        self.member = member  # type: ignore[assignment]  # the classic member's interface, as the consumer uses it
        self.coordinator = ConsumerProtocolCoordinator(
            self.client, member, max_poll_interval_ms=config.max_poll_interval_ms,
            retry_backoff_ms=config.retry_backoff_ms, on_revoke=self._on_revoke, on_assign=self._on_assign,
            on_lost=self._on_lost, on_fatal=self._on_group_fatal, topics=self._group_topics,
            regex=self._group_regex, on_task_failure=self._task_failed)

    @property
    def group_protocol(self) -> str:
        return self.config.group_protocol if self.config.group_id is not None else "none"

    # -- lifecycle ----------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._closed:
            raise ConsumerClosedError("the consumer is closed")
        if self._started:
            return
        self._started = True
        self.fetcher.start()
        self._wake_positions()
        # the auto-commit task starts with the first records delivered (_note_consumed)

    # Memory per idle instance: the positions and auto-commit tasks run only while they have work
    # and end when they have none, started again by what gives them work; an idle instance holds neither
    # (a suspended task with its coroutines, waiter and timer costs ~1-2 KB, per instance).
    def _wake_positions(self) -> None:
        """Positions may need resolving (assignment, seek, reset, an error seen): wake the positions task,
        starting it if it is not running."""
        self._positions_wake.set()
        if self._started and not self._closed:
            self._positions_task = self._running(self._positions_task, "positions", self._positions_loop)

    def _note_consumed(self) -> None:
        """Records were delivered: auto-commit them after the interval (starting the task if not running)."""
        self._consumed.set()
        if self.coordinator is not None and self.config.enable_auto_commit and not self._closed:
            self._autocommit_task = self._running(self._autocommit_task, "autocommit", self._autocommit_loop)

    def _running(self, task: asyncio.Task[None] | None, name: str,
                 loop: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """``task`` if it is running, else a new supervised task running ``loop`` (the background tasks end
        when they have no work and are started again by what gives them work)."""
        if task is None or task.done():
            task = asyncio.create_task(self._supervise(name, loop), name=name)
        return task

    # -- background task supervision -----------------------------------------------------------------
    def _task_failed(self, task: str, exc: BaseException) -> None:
        """An unexpected error in a background task: logged with the instance's identity and counted
        (``kcg_background_task_failures_total``); the caller restarts the task after a backoff."""
        self.stats.task_failures[task] = self.stats.task_failures.get(task, 0) + 1
        member = self.member.member_id if self.member is not None else ""
        log.error("consumer %s (group %s, member %s): background task %r failed (%s: %s); restarting it",
                  self.config.client_id, self.config.group_id, member or "-", task, type(exc).__name__, exc,
                  exc_info=exc)

    def _fetcher_failed(self, exc: BaseException) -> None:
        self._task_failed("fetcher", exc)

    async def _supervise(self, task: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` until it returns; restart it with a growing backoff after unexpected errors."""
        failures = 0
        while not self._closed:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._task_failed(task, exc)
                await asyncio.sleep(restart_backoff(failures))

    async def close(self, leave_group: bool = True, *, force_static_leave: bool = False,
                    commit: bool | None = None) -> None:
        if self._closed:
            return
        do_commit = self.config.enable_auto_commit if commit is None else commit
        if do_commit and self.coordinator is not None and self.subs.assignment:
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(self.commit_consumed(), 5.0)
        self._closed = True
        for t in (self._positions_task, self._autocommit_task, self._pattern_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
        if self.coordinator is not None:
            await self.coordinator.close(leave=leave_group, force_static_leave=force_static_leave)
        await self.fetcher.close()

    # -- subscription ------------------------------------------------------------------------------
    def _require_group(self, what: str) -> GroupCoordinator:
        if self.coordinator is None:
            raise SubscriptionError(f"{what} needs a group id")
        return self.coordinator

    async def subscribe(self, topics: Sequence[str] | None = None, pattern: str | None = None) -> None:
        coord = self._require_group("subscribe")
        self._ensure_started()
        if (topics is None) == (pattern is None):
            raise SubscriptionError("give either topics or a pattern")
        if pattern is not None:
            self.subs.subscribe_pattern(pattern)
            md = await self.client.refresh_metadata(all_topics=True)
            self.subs.match_pattern(md.topics)
            changed = True
            # (a consumer-protocol member sends the pattern itself: the broker re-evaluates it as topics come
            # and go, so no local re-matching loop)
            if self.group_protocol != "consumer" and (self._pattern_task is None or self._pattern_task.done()):
                self._pattern_task = asyncio.create_task(self._supervise("pattern", self._pattern_loop),
                                                         name="pattern")
        else:
            changed = self.subs.subscribe(topics or [])
        await self.client.ensure_metadata(self.subs.topics)
        if changed and self.member is not None:
            self.member.request_rejoin("subscription changed")
        coord.start()
        coord.wake()

    async def _pattern_loop(self) -> None:
        """Re-match a pattern subscription against the cluster's topics; rejoin when the match changes."""
        interval = self.config.metadata_max_age_ms / 1000
        while not self._closed and self.subs.pattern is not None:
            await asyncio.sleep(interval)
            try:
                md = await self.client.refresh_metadata(all_topics=True)
            except KafkaError as exc:
                log.info("pattern subscription: metadata refresh failed: %s", exc)
                continue
            if self.subs.pattern is not None and self.subs.match_pattern(md.topics) and self.member is not None:
                self.member.request_rejoin("topics matching the subscription pattern changed")
                if self.coordinator is not None:
                    self.coordinator.wake()

    async def unsubscribe(self) -> None:
        revoked = self.subs.assigned()
        if self.coordinator is not None and revoked and self.config.enable_auto_commit:
            with contextlib.suppress(KafkaError):
                await self.commit_consumed()
        self.subs.unsubscribe()
        self.fetcher.purge()
        if self.coordinator is not None:
            self.coordinator.wake()

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._ensure_started()
        parts = [TopicPartition(*tp) for tp in partitions]
        self.subs.assign(parts)
        await self.client.ensure_metadata({tp.topic for tp in parts})
        for tp in parts:
            err = self.client.metadata.topic_error(tp.topic)
            if err:
                raise BrokerResponseError(err, f"assign {tp}")
            if tp.partition not in self.client.metadata.topics[tp.topic].partitions:
                raise BrokerResponseError(EC.UNKNOWN_TOPIC_OR_PARTITION, f"assign {tp}")
        self.fetcher.purge([tp for tp in self.fetcher.buffer if tp not in set(parts)])
        self._assignment_event.set()
        self._wake_positions()

    def assignment(self) -> list[TopicPartition]:
        return self.subs.assigned()

    def subscription(self) -> set[str]:
        topics = set(self.subs.topics)
        if self.group_protocol == "consumer" and self.subs.type is SubscriptionType.PATTERN:
            # the broker matches the pattern as topics come and go: what it assigned counts too
            topics.update(tp.topic for tp in self.subs.assignment)
        return topics

    def _group_topics(self) -> Sequence[str]:
        return sorted(self.subs.topics) if self.subs.is_group_managed else []

    def _group_regex(self) -> str | None:
        """A pattern subscription of a consumer-protocol member: the pattern in RE2 syntax (Java spellings
        rewritten, validated by RE2 at subscribe), which the broker evaluates (RE2/J) over the cluster's topics."""
        pattern = self.subs.pattern if self.subs.type is SubscriptionType.PATTERN else None
        return None if pattern is None else str(pattern.pattern)

    # -- group hooks --------------------------------------------------------------------------------
    async def _partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        md = await self.client.refresh_metadata(topics)
        return {t: len(md.topics[t].partitions) for t in topics
                if t in md.topics and not md.topics[t].error_code}

    async def _on_revoke(self, partitions: list[TopicPartition]) -> None:
        # Deliver nothing more from these partitions (polls run concurrently with this coroutine): what
        # is committed below must cover everything handed out, or records would be delivered twice.
        self.subs.pause([tp for tp in partitions if self.subs.is_assigned(tp)])
        self._revoking = self._revoking.union(partitions)  # refused to commits from now on
        self.stats.partitions_revoked += len(partitions)
        if self._change_started is None:
            self._change_started = time.monotonic()
        try:
            await self._revoke_commit(partitions)
            if self._user_revoke is not None:
                try:
                    await self._user_revoke(partitions)
                except Exception:
                    log.exception("revocation hook failed")
            self.subs.remove_partitions(partitions)
            self.fetcher.purge(partitions)
        finally:
            self._revoking = self._revoking.difference(partitions) or _NONE_REVOKING
        self.revoked_history.append(list(partitions))
        if len(self.revoked_history) > REVOKED_HISTORY:
            del self.revoked_history[:-REVOKED_HISTORY]
        self.assignment_changed.set()

    async def _revoke_commit(self, partitions: list[TopicPartition]) -> None:
        if not self.config.enable_auto_commit or self.coordinator is None:
            return
        try:
            async with asyncio.timeout(5.0):
                # after any commit in flight: its acknowledgement may move positions forward, and what is
                # committed here must not roll it back
                async with self._commit_lock:
                    revoked = set(partitions)
                    offsets = {tp: OffsetAndMetadata(pos, "", epoch)
                               for tp, (pos, epoch) in self.subs.all_consumed().items() if tp in revoked}
                    if offsets:
                        await self.coordinator.commit(offsets, timeout=5.0, revoking=True)
        except (KafkaError, TimeoutError) as exc:
            log.warning("commit before revocation failed: %s", exc)

    async def _on_lost(self, partitions: list[TopicPartition]) -> None:
        self.subs.remove_partitions(partitions)
        self.fetcher.purge(partitions)
        self.assignment_changed.set()

    async def _on_assign(self, assigned: list[TopicPartition], added: list[TopicPartition]) -> None:
        self.stats.rebalances += 1
        started, self._change_started = self._change_started, None
        if started is not None and self.group_protocol == "classic":
            self.stats.last_converge_seconds = time.monotonic() - started
        allowed = self.subs.topic_filter
        pattern = self.subs.type is SubscriptionType.PATTERN
        if (allowed is not None or pattern) and any(
                (allowed is not None and not allowed(tp.topic)) or (pattern and tp.topic.startswith("__"))
                for tp in assigned):
            # A group leader outside the gateway (any Kafka client in the group) may hand out topics this
            # tenant may not read (or internal ones), and under the consumer protocol the broker matches a
            # pattern over every topic of the cluster: never fetch them.
            def ok(topic: str) -> bool:
                return (allowed is None or allowed(topic)) and not (pattern and topic.startswith("__"))

            refused = sorted({tp.topic for tp in assigned if not ok(tp.topic)})
            who = "the broker" if self.group_protocol == "consumer" else "the leader"
            log.warning("group %s: %s assigned topics this consumer may not read; ignored (never fetched): %s",
                        self.config.group_id, who, refused)
            self.stats.extra["refused_topics"] = refused
            assigned = [tp for tp in assigned if ok(tp.topic)]
        keep = set(assigned)
        stale = [tp for tp in self.subs.assigned() if tp not in keep]
        if stale:
            self.subs.remove_partitions(stale)
            self.fetcher.purge(stale)
        self.subs.add_partitions(assigned)
        self._assignment_event.set()
        self.assignment_changed.set()
        self._wake_positions()
        self.fetcher.wake()

    def _on_group_fatal(self, exc: KafkaError) -> None:
        self._fatal = exc
        self.fetcher.data_event.set()

    # -- positions ----------------------------------------------------------------------------------
    async def _positions_loop(self) -> None:
        while not self._closed:
            try:
                await self._update_positions()
            except asyncio.CancelledError:
                raise
            except NoOffsetForPartitionError as exc:
                for tp in exc.partitions:
                    self.fetcher.errors[tp] = exc
                self.fetcher.data_event.set()
            except KafkaError as exc:
                log.info("position update failed: %s", exc)
                await asyncio.sleep(self.config.retry_backoff_ms / 1000)
                continue
            except Exception as exc:
                self._task_failed("positions", exc)
                await asyncio.sleep(1)
                continue
            self._positions_wake.clear()
            pending = [tp for tp in (*self.subs.initializing(), *self.subs.awaiting_reset())
                       if tp not in self.fetcher.errors]
            # Work left over (e.g. a partition missing from a response) is retried after a backoff;
            # partitions blocked by an error wait until the owner has seen it and seeks.
            # Nothing to do: the task ends (no await between this check and the end, so a wake-up cannot
            # be missed); _wake_positions starts it again for an assignment, seek, reset or error seen.
            if not pending:
                self._positions_task = None  # (a finished task would keep its coroutine's memory)
                return
            await wait_event(self._positions_wake, self.config.retry_backoff_ms / 1000)

    async def _update_positions(self) -> None:
        init = [tp for tp in self.subs.initializing() if tp not in self.fetcher.errors]
        if init:
            epochs = {tp: self.subs.epoch(tp) for tp in init}
            if self.coordinator is not None:
                committed = await self.coordinator.committed(init)
            else:
                committed = {tp: None for tp in init}
            missing = []
            for tp, om in committed.items():
                if (not self.subs.is_assigned(tp) or self.subs.epoch(tp) != epochs.get(tp)
                        or self.subs.assignment[tp].state is not FetchState.INITIALIZING):
                    continue  # the owner seeked (or the partition moved) while we were looking
                if om is not None:
                    self.subs.seek(tp, om.offset, om.leader_epoch)
                else:
                    missing.append(tp)
            if missing:
                if self.subs.default_reset is OffsetResetStrategy.NONE:
                    raise NoOffsetForPartitionError(missing)
                for tp in missing:
                    self.subs.request_reset(tp)
        resets = self.subs.awaiting_reset()
        if resets:
            await self._reset_offsets(resets)
        self.fetcher.wake()

    async def _reset_offsets(self, partitions: list[TopicPartition]) -> None:
        targets: dict[TopicPartition, int] = {}
        for tp in partitions:
            st = self.subs.assignment[tp]
            if st.reset_timestamp is not None:
                targets[tp] = st.reset_timestamp
            elif st.reset_strategy is OffsetResetStrategy.EARLIEST:
                targets[tp] = EARLIEST_TIMESTAMP
            elif st.reset_strategy is OffsetResetStrategy.LATEST:
                targets[tp] = LATEST_TIMESTAMP
            else:
                raise NoOffsetForPartitionError([tp])
        epochs = {tp: self.subs.epoch(tp) for tp in targets}
        found = await self.list_offsets(targets)
        for tp, off in found.items():
            if (self.subs.is_assigned(tp) and self.subs.epoch(tp) == epochs.get(tp)
                    and self.subs.assignment[tp].state is FetchState.AWAIT_RESET):
                if off is None:  # timestamp beyond the last record: go to the end
                    end = await self.list_offsets({tp: LATEST_TIMESTAMP})
                    off = end.get(tp) or 0
                self.subs.seek(tp, off)

    async def list_offsets(self, targets: dict[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """Offsets for timestamps (-1 latest, -2 earliest); under read_committed "latest" is the LSO."""
        await self.client.ensure_metadata({tp.topic for tp in targets})
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for tp, ts in targets.items():
            leader = self.client.metadata.leader(tp.topic, tp.partition)
            if leader is None:
                await self.client.refresh_metadata([tp.topic])
                leader = self.client.metadata.leader(tp.topic, tp.partition)
                if leader is None:
                    raise BrokerResponseError(self.client.metadata.topic_error(tp.topic) or EC.LEADER_NOT_AVAILABLE,
                                              f"ListOffsets {tp}")
            by_leader.setdefault(leader, {})[tp] = ts
        out: dict[TopicPartition, int | None] = {}
        results = await asyncio.gather(*(self._list_offsets_node(n, t) for n, t in by_leader.items()))
        for r in results:
            out.update(r)
        return out

    async def _list_offsets_node(self, node: int, targets: dict[TopicPartition, int]
                                 ) -> dict[TopicPartition, int | None]:
        iso = self.config.isolation
        by_topic: dict[str, list[Any]] = {}
        for tp, ts in targets.items():
            by_topic.setdefault(tp.topic, []).append(ListPartition(
                partition_index=tp.partition, timestamp=ts,
                current_leader_epoch=self.client.metadata.leader_epoch(tp.topic, tp.partition)))
        req = M.ListOffsetsRequest(replica_id=-1, isolation_level=iso,
                                   topics=[ListTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
        resp = await self.client.send(node, req)
        out: dict[TopicPartition, int | None] = {}
        unreliable: list[TopicPartition] = []
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                if p.error_code:
                    self.client.handle_error_code(p.error_code, t.name)
                    raise BrokerResponseError(p.error_code, f"ListOffsets {tp}")
                out[tp] = p.offset if p.offset >= 0 else None
                if targets.get(tp, -1) >= 0 and p.offset >= 0 and p.timestamp < 0:
                    # Kafka answers a timestamp lookup with the matching record's timestamp, or with
                    # offset -1 when none matches; an offset without a timestamp means the broker has no
                    # time index (Tansu): search by fetching instead.
                    unreliable.append(tp)
        # The end of a partition is confirmed from a Fetch response (high watermark, or the last stable
        # offset under read_committed), which every broker computes correctly; some (Tansu) answer
        # ListOffsets(latest) wrongly for multi-record batches and ignore read_committed there.
        latest = [tp for tp, ts in targets.items() if ts == LATEST_TIMESTAMP]
        if latest:
            ends = await self._probe_end_offsets(node, {tp: out.get(tp) or 0 for tp in latest})
            out.update(ends)
        for tp in unreliable:
            out[tp] = await self._search_timestamp(node, tp, targets[tp])
        return out

    async def _probe_fetch(self, node: int, offsets: dict[TopicPartition, int], *, max_bytes: int,
                           isolation: int) -> dict[TopicPartition, Any]:
        return await probe_fetch(self.client, node, offsets, max_bytes=max_bytes, isolation=isolation)

    async def _probe_end_offsets(self, node: int, guesses: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        iso = self.config.isolation
        parts = await self._probe_fetch(node, guesses, max_bytes=1, isolation=iso)
        out: dict[TopicPartition, int] = {}
        retry: dict[TopicPartition, int] = {}
        for tp, p in parts.items():
            if p.error_code == EC.OFFSET_OUT_OF_RANGE and guesses[tp] != 0:
                retry[tp] = 0
                continue
            if p.error_code:
                self.client.handle_error_code(p.error_code, tp.topic)
                raise BrokerResponseError(p.error_code, f"end offset of {tp}")
            end = p.last_stable_offset if iso == READ_COMMITTED and p.last_stable_offset >= 0 else p.high_watermark
            out[tp] = end
        if retry:
            out.update(await self._probe_end_offsets(node, retry))
        return out

    async def _search_timestamp(self, node: int, tp: TopicPartition, target: int) -> int | None:
        """First offset whose record timestamp is >= ``target``, by binary search over fetched batches
        (log2(n) small fetches); None when every record is older."""
        first = (await self._list_offsets_node(node, {tp: EARLIEST_TIMESTAMP}))[tp] or 0
        end = (await self._probe_end_offsets(node, {tp: first}))[tp]
        lo, hi = first, end
        while lo < hi:
            mid = (lo + hi) // 2
            p = (await self._probe_fetch(node, {tp: mid}, max_bytes=1, isolation=READ_UNCOMMITTED))[tp]
            if p.error_code:
                raise BrokerResponseError(p.error_code, f"timestamp search in {tp}")
            rs = decode_records(p.records or b"", topic=tp.topic, partition=tp.partition)
            if not rs.batches:
                break
            recs = [r for r in (rs.batches[0].records or []) if lo <= r.offset < hi]
            idx = next((i for i, r in enumerate(recs) if r.timestamp >= target), None)
            if idx is None:
                lo = max(rs.batches[0].next_offset, mid + 1)  # everything up to the batch end is older
            elif idx > 0:
                return recs[idx].offset  # an older record precedes it in offset order: found
            else:
                hi = min(recs[0].offset, mid)  # the batch starts at or after the target: look before it
                if hi <= lo:
                    return lo
        return lo if lo < end else None

    # -- poll -----------------------------------------------------------------------------------------
    async def poll_batches(self, max_records: int = 500, max_bytes: int | None = None, timeout: float = 1.0, *,
                           min_bytes: int | None = None,
                           linger: float | None = None) -> list[tuple[TopicPartition, list[Record]]]:
        """Records as per-partition chunks, or [] after ``timeout`` seconds.

        A poll returns what is waiting across the whole assignment, up to ``max_records`` / ``max_bytes``:
        once records are buffered it gathers for at most ``linger`` seconds (default: the config's
        ``poll_linger_ms``), and only while a fetch that may bring records of another assigned partition
        (one with nothing buffered) is outstanding; it never lingers once ``max_records`` records or
        ``max_bytes`` bytes (as fetched) are buffered, nor past ``timeout``. ``linger=0`` returns as soon as
        anything is buffered.

        ``min_bytes`` (Confluent's ``fetch.min.bytes`` of an instance): return only once the buffered keys
        and values add up to more than ``min_bytes`` bytes (or ``max_records`` / ``max_bytes`` is reached),
        else what is buffered when ``timeout`` ends; no linger then.

        The hot path of the gateway: no per-record objects are created here, and no per-record work is
        done unless ``max_bytes`` or ``min_bytes`` asks for byte counts.
        """
        self._ensure_started()
        if self._fatal is not None:
            raise self._fatal
        if self.subs.type is SubscriptionType.NONE:
            raise SubscriptionError("the consumer is not subscribed to any topic and has no assignment")
        self.stats.polls += 1
        started = time.monotonic()
        deadline = started + max(0.0, timeout)
        gather = self.config.poll_linger_ms / 1000 if linger is None else max(0.0, linger)
        fetcher = self.fetcher
        fetcher.demand()
        try:
            return await self._poll_batches(started, deadline, max_records, max_bytes, min_bytes, gather)
        finally:
            fetcher.demand_done()

    async def _poll_batches(self, started: float, deadline: float, max_records: int, max_bytes: int | None,
                            min_bytes: int | None, linger: float) -> list[tuple[TopicPartition, list[Record]]]:
        coord = self.coordinator if self.subs.is_group_managed else None
        if coord is None:
            return await self._poll_loop(started, deadline, max_records, max_bytes, min_bytes, linger)
        coord.start()  # idempotent: also after a subscribe that failed half-way
        coord.poll_started()
        try:
            if not self.subs.assignment and not coord.stable:
                await coord.wait_stable(max(0.0, deadline - time.monotonic()))
                err = coord.last_error
                if not coord.stable and err is not None and not err.retriable:
                    raise err  # e.g. the broker rejects our credentials: say so instead of returning []
            return await self._poll_loop(started, deadline, max_records, max_bytes, min_bytes, linger)
        finally:
            coord.poll_finished()

    async def _poll_loop(self, started: float, deadline: float, max_records: int, max_bytes: int | None,
                         min_bytes: int | None, linger: float) -> list[tuple[TopicPartition, list[Record]]]:
        fetcher = self.fetcher
        # Records are taken from the buffer only at the very end (after any wait), so a poll cancelled
        # while it waits or gathers (the gateway's drain, a client that left) loses nothing.
        gather_until: float | None = None  # until when to gather (linger mode), once records were seen
        data_seen = 0.0
        sizes: dict[int, tuple[Any, int]] | None = None  # buffered_payload's cache (min_bytes mode)
        seen_done = -1
        try:
            while True:
                if fetcher.errors:
                    err = fetcher.take_error()
                    if err is not None:
                        self._wake_positions()
                        raise err
                if self._fatal is not None:
                    raise self._fatal
                now = time.monotonic()
                wait_until = deadline
                if fetcher.buffered_records:
                    if fetcher.buffered_records >= max_records or (
                            max_bytes is not None and fetcher.buffered_bytes >= max_bytes):
                        take = True  # a full poll's worth is buffered
                    elif min_bytes is not None:
                        if sizes is None:
                            sizes = {}
                        take = fetcher.buffered_payload(sizes) > min_bytes
                    elif linger <= 0:
                        take = True
                    else:
                        if gather_until is None:
                            data_seen = now
                            fetcher.gathering += 1
                        if fetcher.fetches_done != seen_done or gather_until is None:
                            # (again whenever a fetch ended: stop as soon as none that matters is outstanding)
                            seen_done = fetcher.fetches_done
                            until = fetcher.gather_until(started, data_seen, linger, max(linger, GATHER_DUE_S))
                            gather_until = now if until is None else min(deadline, until)
                        take = now >= gather_until
                        wait_until = gather_until
                    if take or now >= deadline:
                        chunks = fetcher.drain(max_records, max_bytes)
                        if chunks:
                            self.stats.records += sum(len(c) for _, c in chunks)
                            self._note_consumed()
                            self.stats.poll_wait_seconds += time.monotonic() - started
                            return chunks
                        # only paused partitions hold records: wait for others (or a resume)
                        wait_until = deadline
                if now >= deadline:
                    self.stats.poll_wait_seconds += now - started
                    return []
                fetcher.data_event.clear()
                if await wait_event(fetcher.data_event, wait_until - now):
                    self.stats.wakeups += 1
        finally:
            if gather_until is not None:
                fetcher.gathering -= 1

    async def poll(self, max_records: int = 500, max_bytes: int | None = None,
                   timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records as soon as any are buffered, or [] after ``timeout`` seconds."""
        chunks = await self.poll_batches(max_records, max_bytes, timeout)
        return [ConsumerRecord(tp.topic, tp.partition, r.offset, r.timestamp, r.key, r.value, r.headers)
                for tp, recs in chunks for r in recs]

    # -- commits --------------------------------------------------------------------------------------
    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
                     timeout: float = 30.0) -> None:
        """Commit ``offsets`` (the *next* offset to consume per partition) or, if None, everything consumed.

        Only partitions this consumer owns may be committed: a partition that is not assigned (or, in a
        group, not owned in the current generation) or is being revoked is refused with
        :class:`CommitFailedError` and nothing is sent, so a commit can never move another member's offset.
        During a rebalance (or while the coordinator is unknown) a group-managed commit is refused at once
        (reason GROUP_REBALANCING). After an acknowledged commit of N the position is at least N."""
        coord = self._require_group("commit")
        manual = self.subs.type is SubscriptionType.ASSIGNED
        started = time.monotonic()
        try:
            if offsets is None:
                offs = {tp: OffsetAndMetadata(pos, "", epoch)
                        for tp, (pos, epoch) in self.subs.all_consumed().items() if tp not in self._revoking}
            else:
                offs = {TopicPartition(*tp): (om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om)))
                        for tp, om in offsets.items()}
            for tp, om in offs.items():
                if om.offset < 0:
                    raise SubscriptionError(f"offset {om.offset} for {tp} must be >= 0")

            def check() -> None:
                self._check_commit(offs, manual)

            check()
            async with self._commit_lock:
                await coord.commit(offs, manual=manual, timeout=timeout, check=check)
                self._acknowledged(offs)
        except (CommitFailedError, KafkaError):
            self.stats.commit_failures += 1
            raise
        self.stats.commits += 1
        self.stats.last_commit_latency = time.monotonic() - started

    def _check_commit(self, offs: dict[TopicPartition, OffsetAndMetadata], manual: bool) -> None:
        """Raise unless every partition of ``offs`` may be committed by this consumer now."""
        coord = self.coordinator
        if not manual and self.subs.is_group_managed and coord is not None and not coord.stable:
            raise rebalancing_error(coord.group_id, "this member is rejoining the group")
        revoking = sorted(str(tp) for tp in offs if tp in self._revoking)
        if revoking:
            raise CommitFailedError(
                f"commit refused (reason: {COMMIT_BEING_REVOKED}): partitions {', '.join(revoking)} are being "
                "revoked from this instance in a rebalance; nothing was committed",
                code=EC.REBALANCE_IN_PROGRESS, reason=COMMIT_BEING_REVOKED)
        owned = None if manual or self.member is None else set(self.member.owned)
        missing = sorted(str(tp) for tp in offs
                         if not self.subs.is_assigned(tp) or (owned is not None and tp not in owned))
        if missing:
            raise CommitFailedError(
                f"commit refused (reason: {COMMIT_NOT_ASSIGNED}): partitions {', '.join(missing)} are not assigned "
                "to this instance (another member may own them); nothing was committed",
                code=EC.UNKNOWN_TOPIC_OR_PARTITION, reason=COMMIT_NOT_ASSIGNED)

    def _acknowledged(self, offs: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """The broker acknowledged ``offs``: no position of a partition still owned stays below them (not
        even one being looked up: the seek bumps its epoch, so a committed-offset fetch that started
        earlier is ignored)."""
        for tp, om in offs.items():
            st = self.subs.assignment.get(tp)
            if st is None:  # (a partition being revoked still moves: its revocation commit follows this one)
                continue
            if st.state is not FetchState.FETCHING or st.position is None or st.position < om.offset:
                self.subs.seek(tp, om.offset, om.leader_epoch)
                self.fetcher.purge([tp])
                self.fetcher.wake()

    async def commit_consumed(self) -> None:
        await self.commit(None)

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, OffsetAndMetadata | None]:
        coord = self._require_group("committed")
        return await coord.committed([TopicPartition(*tp) for tp in partitions])

    async def _autocommit_loop(self) -> None:
        interval = self.config.auto_commit_interval_ms / 1000
        while not self._closed:
            # Only after records were delivered (as the Java consumer, which auto-commits inside poll):
            # an idle instance has nothing new to commit and costs no timer.
            await self._consumed.wait()
            await asyncio.sleep(interval)
            self._consumed.clear()
            if self.subs.assignment and self.coordinator is not None and self.coordinator.stable:
                try:
                    await self.commit_consumed()
                except KafkaError as exc:
                    log.info("auto-commit failed: %s", exc)
            if not self._consumed.is_set():  # nothing delivered meanwhile: the task ends (and is dropped)
                self._autocommit_task = None
                return

    # -- seeking ---------------------------------------------------------------------------------------
    def seek(self, tp: TopicPartition, offset: int) -> None:
        tp = TopicPartition(*tp)
        self.subs.seek(tp, offset)
        self.fetcher.purge([tp])

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._request_reset(partitions, OffsetResetStrategy.EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._request_reset(partitions, OffsetResetStrategy.LATEST)

    def seek_to_timestamp(self, timestamps: dict[TopicPartition, int]) -> None:
        for tp, ts in timestamps.items():
            if ts < 0:
                raise SubscriptionError(f"timestamp {ts} for {tp} must be >= 0")
            self.subs.request_reset(TopicPartition(*tp), timestamp=ts)
        self.fetcher.purge([TopicPartition(*tp) for tp in timestamps])
        self._wake_positions()

    def _request_reset(self, partitions: Iterable[TopicPartition] | None, strategy: OffsetResetStrategy) -> None:
        parts = self.subs.assigned() if partitions is None else [TopicPartition(*tp) for tp in partitions]
        for tp in parts:
            self.subs.request_reset(tp, strategy)
        self.fetcher.purge(parts)
        self._wake_positions()

    async def position(self, tp: TopicPartition, timeout: float = 30.0) -> int:
        """The next offset to fetch, resolving committed offsets or resets first if needed."""
        tp = TopicPartition(*tp)
        deadline = time.monotonic() + timeout
        while True:
            pos = self.subs.position(tp)
            if pos is not None and self.subs.assignment[tp].state is FetchState.FETCHING:
                return pos
            err = self.fetcher.errors.pop(tp, None)
            if err is not None:
                self._wake_positions()
                raise err
            try:
                await self._update_positions()
            except NoOffsetForPartitionError:
                raise
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            if self.subs.position(tp) is not None:
                continue
            if time.monotonic() > deadline:
                raise KafkaError(f"position of {tp} not available within {timeout}s", retriable=True)
            await asyncio.sleep(self.config.retry_backoff_ms / 1000)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self.subs.pause([TopicPartition(*tp) for tp in partitions])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self.subs.resume([TopicPartition(*tp) for tp in partitions])
        self.fetcher.wake()
        self.fetcher.data_event.set()  # a waiting poll looks again: resumed partitions may hold records

    def paused(self) -> set[TopicPartition]:
        return self.subs.paused()

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return await self.list_offsets({TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions})

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return await self.list_offsets({TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions})

    def lag(self) -> dict[TopicPartition, int | None]:
        rc = self.config.isolation == READ_COMMITTED
        return {tp: self.subs.lag(tp, rc) for tp in self.subs.assigned()}

    async def wait_for_assignment(self, timeout: float) -> bool:
        if self.coordinator is None:
            return bool(self.subs.assignment)
        return await self.coordinator.wait_stable(timeout)
