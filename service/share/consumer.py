"""The asyncio share consumer: a share-group member (service/share/member.py) that heartbeats to the group
coordinator, and one share session (service/share/session.py) per leader of its assigned partitions, over our own
client (service/client/).

``poll`` sends a ShareFetch to every leader at once (carrying the acknowledgements queued for it) and returns
the records acquired, each with its delivery count and lock deadline; ``acknowledge`` queues one record's
outcome; ``commit`` sends what is queued without fetching (ShareAcknowledge) and returns the per-record results;
``close`` releases whatever is still held, ends the sessions and leaves the group.

With a process memory budget (``budget``, service/instances/budget.py) each ShareFetch's ``max_bytes`` is a grant
from it (kind ``fetch``, as a consumer fetch), held while the request is in flight; the record bytes a response
brought are then charged as ``share`` and added to :attr:`ShareConsumer.charged`, which the caller takes
(:meth:`ShareConsumer.take_charged`) and releases once it has handed the records on. A leader gets no ShareFetch
while the budget has no room (nothing is acquired that could not be held); ``poll`` then waits for memory to be
released, up to its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from service.client.client import KafkaClient, find_coordinator
from service.client.errors import KafkaError
from service.protocol import error_codes as EC
from service.protocol.records import Header, Record, decode_records
from service.share.member import MemberState, ShareMember
from service.share.ranges import subtract
from service.share.session import AckResult, AckType, FetchedPartition, ShareSession, TopicPartition

log = logging.getLogger(__name__)


class ShareRecord(NamedTuple):
    """An acquired record (a tuple: built once per record on the hot path)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    delivery_count: int
    lock_deadline: float  # time.monotonic() when the acquisition lock runs out
    record: Record | None = None  # the decoded record it came from (renderers take it as it is)


class ShareConsumer:
    def __init__(self, client: KafkaClient, group_id: str, topics: Iterable[str], *, member_id: str | None = None,
                 max_wait_ms: int = 500, max_records: int = 500, max_bytes: int = 16 * 1024 * 1024,
                 request_timeout: float = 30.0, record_limit: bool = False) -> None:
        self.client = client
        self.group_id = group_id
        self.member = ShareMember(group_id, topics, member_id=member_id)
        self.max_wait_ms = max_wait_ms
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.request_timeout = request_timeout
        #: acquire at most max_records per ShareFetch (ShareFetch v2 record-limit mode), not whole batches
        self.record_limit = record_limit
        self.coordinator: int | None = None
        self.sessions: dict[int, ShareSession] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._results: list[AckResult] = []  # answers to acknowledgements that rode on a ShareFetch
        self._hb_task: asyncio.Task[None] | None = None
        self._hb_wake = asyncio.Event()
        self._assigned = asyncio.Event()
        self._closed = False
        #: the process memory budget (service.instances.budget.MemoryBudget), or None: no accounting
        self.budget: Any = None
        #: bytes charged to the budget as ``share`` for records returned and not yet taken by the caller
        self.charged = 0
        self._starved = False  # a ShareFetch was not sent for want of memory (this poll round)

    @property
    def member_id(self) -> str:
        return self.member.member_id

    # -- membership -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.client.ensure_metadata(self.member.topics)
        await self._heartbeat_once()
        if self.member.state == MemberState.FAILED and self.member.error is not None:
            raise self.member.error
        self._hb_task = asyncio.create_task(self._heartbeat_loop(), name=f"share-heartbeat-{self.member_id}")

    async def subscribe(self, topics: Iterable[str]) -> None:
        """Change the subscribed topics: the next heartbeat (sent now) carries them."""
        topics = list(topics)
        await self.client.ensure_metadata(topics)
        self.member.subscribe(topics)
        self._hb_wake.set()

    async def wait_assigned(self, timeout: float) -> None:
        """Until the coordinator assigned this member at least one partition."""
        async with asyncio.timeout(timeout):
            await self._assigned.wait()

    async def _heartbeat_once(self) -> None:
        member = self.member
        if member.state in (MemberState.LEFT, MemberState.FAILED):
            return
        try:
            if self.coordinator is None:
                self.coordinator = await find_coordinator(self.client, self.group_id)
            req = member.build_heartbeat()
        except KafkaError as exc:
            log.debug("share group %s: no coordinator yet: %s", self.group_id, exc)
            return
        try:
            resp = await self.client.send(self.coordinator, req, timeout=self.request_timeout)
        except KafkaError as exc:
            log.info("share group %s: heartbeat failed: %s", self.group_id, exc)
            member.heartbeat_failed()
            self.coordinator = None
            return
        outcome = member.handle_response(resp)
        if outcome.find_coordinator:
            self.coordinator = None
        if outcome.error_code:
            log.info("share group %s member %s: heartbeat answered %s", self.group_id, self.member_id,
                     EC.describe(outcome.error_code).name)
        if member.assignment:
            self._assigned.set()
        else:
            self._assigned.clear()

    async def _heartbeat_loop(self) -> None:
        while not self._closed and self.member.state not in (MemberState.LEFT, MemberState.FAILED):
            stable = self.member.state == MemberState.STABLE and self.coordinator is not None
            delay = self.member.heartbeat_interval_ms / 1000 if stable else 0.2
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._hb_wake.wait()
            self._hb_wake.clear()
            if self._closed:
                return
            await self._heartbeat_once()

    # -- fetching -------------------------------------------------------------------------------------------------
    def _session(self, node: int) -> ShareSession:
        s = self.sessions.get(node)
        if s is None:
            s = self.sessions[node] = ShareSession(self.group_id, self.member_id)
            self._locks[node] = asyncio.Lock()
        return s

    async def _plan(self) -> dict[int, list[TopicPartition]]:
        """The assigned partitions by leader; metadata is refreshed when a leader or a topic name is unknown."""
        assigned = self.member.assigned()
        md = self.client.metadata
        if md.needs_refresh or any(md.topic_names.get(tid) is None for tid, _ in assigned):
            await self.client.refresh_metadata(self.member.topics)
        plan: dict[int, list[TopicPartition]] = {}
        for tid, p in assigned:
            name = md.topic_names.get(tid)
            leader = md.leader(name, p) if name is not None else None
            if leader is not None:
                plan.setdefault(leader, []).append((tid, p))
        return plan

    async def poll(self, timeout: float = 1.0) -> list[ShareRecord]:
        """The records acquired by one ShareFetch round to every leader (waiting up to ``timeout`` for some)."""
        if self._closed:
            raise RuntimeError("the share consumer is closed")
        if self.member.error is not None:  # a fatal heartbeat answer (authorization, group full): surface it
            raise self.member.error
        plan = await self._plan()
        for node in set(self.sessions) | set(plan):
            self._session(node).set_partitions(plan.get(node, ()))
        wait_ms = max(0, min(self.max_wait_ms, int(timeout * 1000)))
        nodes = [n for n, s in self.sessions.items() if s.partitions or s.has_pending]
        if not nodes:
            await asyncio.sleep(min(timeout, 0.1))
            return []
        self._starved = False
        batches = await asyncio.gather(*(self._fetch(node, wait_ms) for node in nodes))
        out = [r for batch in batches for r in batch]
        if not out and self._starved and timeout > 0:
            await self._memory_freed(timeout)
        return out

    async def _memory_freed(self, timeout: float) -> None:
        """Until the memory budget released some memory, at most ``timeout`` seconds."""
        freed = asyncio.Event()
        self.budget.when_free(freed.set)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await freed.wait()

    def take_charged(self) -> int:
        """The bytes charged (kind ``share``) for the records returned since the last call: the caller's to
        release once the records left."""
        n, self.charged = self.charged, 0
        return n

    def _grant(self) -> int:
        """This ShareFetch's max_bytes: a grant from the memory budget (0: none now), or max_bytes without one."""
        budget = self.budget
        if budget is None:
            return self.max_bytes
        grant = int(budget.grant(self.max_bytes))
        if not grant and budget.reclaim(self.max_bytes):  # a client is waiting: idle consumers' prefetch goes
            grant = int(budget.grant(self.max_bytes))
        if not grant:
            self._starved = True
        return grant

    async def _fetch(self, node: int, wait_ms: int) -> list[ShareRecord]:
        session = self.sessions[node]
        async with self._locks[node]:
            now = time.monotonic()
            session.expire(now)
            out: list[ShareRecord] = []
            grant = self._grant() if session.partitions else 0
            if grant:
                try:
                    out = await self._fetch_granted(node, session, wait_ms, grant)
                finally:
                    if self.budget is not None:
                        self.budget.release(grant, "fetch")
            # what a ShareFetch could not carry: renewals, partitions no longer fetched from this node
            if session.has_pending:
                got = await self._acknowledge(node, session)
                # (not ``+= await``: the list read before the await may have been taken meanwhile)
                self._results += got
            return out

    async def _fetch_granted(self, node: int, session: ShareSession, wait_ms: int, max_bytes: int) -> list[ShareRecord]:
        req = session.build_fetch(max_wait_ms=wait_ms, max_bytes=max_bytes, max_records=self.max_records,
                                  batch_size=self.max_records, record_limit=self.record_limit)
        try:
            resp = await self.client.send_blocking(node, req, timeout=self.request_timeout + wait_ms / 1000)
        except KafkaError as exc:
            log.info("share group %s: ShareFetch to node %d failed: %s", self.group_id, node, exc)
            self._results += session.request_failed()
            return []
        except asyncio.CancelledError:
            # the caller went away mid-request (a client that left a stream or a long poll): no answer
            # will be read, so the next request opens a new session rather than finding this one stuck
            self._results += session.request_failed()
            raise
        outcome = session.handle_fetch_response(resp, time.monotonic())
        self._results += outcome.ack_results
        if outcome.error_code:
            log.info("share group %s: ShareFetch to node %d answered %s", self.group_id, node,
                     EC.describe(outcome.error_code).name)
        out: list[ShareRecord] = []
        held = 0
        for part in outcome.partitions:
            got = self._records(session, part)
            if got and part.records is not None:
                held += len(part.records)  # the fetched bytes the records were decoded from
            out += got
        if held and self.budget is not None:
            self.budget.add(held, "share")  # forced: the bytes exist; the caller releases them
            self.charged += held
        return out

    def _records(self, session: ShareSession, part: FetchedPartition) -> list[ShareRecord]:
        topic = self.client.metadata.topic_names.get(part.topic_id)
        if part.error_code:
            self.client.handle_error_code(part.error_code, topic)
            log.info("share group %s: %s-%d: %s %s", self.group_id, topic, part.partition,
                     EC.describe(part.error_code).name, part.error_message or "")
        if not part.acquired or part.records is None or topic is None:
            return []
        records = list(decode_records(part.records, topic=topic, partition=part.partition).records())
        if not records:
            session.deliver(part, ())  # every acquired offset is a gap
            return []
        base = records[0].offset
        # offsets ascend in a partition: without holes the list is indexed by offset - base
        dense = records[-1].offset - base == len(records) - 1
        by_offset = None if dense else {r.offset: r for r in records}
        present = range(base, base + len(records)) if dense else sorted(by_offset or ())
        out = []
        p = part.partition
        for first, last, count, deadline in session.deliver(part, present):
            if by_offset is None:
                run = records[first - base:last - base + 1]
                if not run or run[0].offset != first or run[-1].offset != last:  # not as dense as it looked
                    by_offset = {r.offset: r for r in records}
            if by_offset is not None:
                run = [by_offset[o] for o in range(first, last + 1)]
            out += [ShareRecord(topic, p, r.offset, r.timestamp, r.key, r.value, r.headers, count, deadline, r)
                    for r in run]
        return out

    # -- acknowledging --------------------------------------------------------------------------------------------
    def acknowledge_range(self, topic: str, partition: int, first: int, last: int,
                          type: AckType = AckType.ACCEPT) -> list[AckResult]:
        """Queue the outcome of the records ``first..last`` (sent with the next poll or commit); immediate
        results for the runs not held by this consumer (unknown, already acknowledged, or their lock was seen
        to run out)."""
        type = AckType(type)
        if type == AckType.GAP:
            raise ValueError("gaps are acknowledged by the session itself")
        tp = (self.client.metadata.topic_id(topic), partition)
        left = [(first, last)]
        for s in self.sessions.values():  # (after a leader change an old session may still hold some)
            nxt: list[tuple[int, int]] = []
            for f, la in left:
                done = s.acknowledge_held(tp, f, la, type)
                nxt += subtract(f, la, done) if done else [(f, la)]
            left = nxt
            if not left:
                break
        return [AckResult(tp[0], tp[1], f, type, EC.INVALID_RECORD_STATE, la) for f, la in left]

    def acknowledge(self, topic: str, partition: int, offset: int, type: AckType = AckType.ACCEPT) -> AckResult | None:
        """Queue one record's outcome (sent with the next poll or commit); an immediate result when the record is
        not held by this consumer (unknown, already acknowledged, or its lock was seen to run out)."""
        refused = self.acknowledge_range(topic, partition, offset, offset, type)
        return AckResult(refused[0].topic_id, partition, offset, refused[0].type,
                         refused[0].error_code) if refused else None

    def take_results(self) -> list[AckResult]:
        """The results of acknowledgements sent along with ShareFetch requests since the last call."""
        out, self._results = self._results, []
        return out

    async def commit(self) -> list[AckResult]:
        """Send every queued acknowledgement now (ShareAcknowledge to each leader); their results, with those
        that rode on ShareFetch requests since the last call."""
        async def one(node: int) -> list[AckResult]:
            async with self._locks[node]:
                return await self._acknowledge(node, self.sessions[node])

        batches = await asyncio.gather(*(one(n) for n, s in self.sessions.items() if s.has_pending))
        return self.take_results() + [r for b in batches for r in b]

    async def _acknowledge(self, node: int, session: ShareSession) -> list[AckResult]:
        req = session.build_acknowledge()
        if req is None:
            return []
        try:
            resp = await self.client.send(node, req, timeout=self.request_timeout)
        except KafkaError as exc:
            log.info("share group %s: ShareAcknowledge to node %d failed: %s", self.group_id, node, exc)
            return session.request_failed()
        except asyncio.CancelledError:
            self._results += session.request_failed()  # (as a cancelled ShareFetch)
            raise
        return session.handle_acknowledge_response(resp, time.monotonic())

    # -- closing --------------------------------------------------------------------------------------------------
    async def close(self, *, release: bool = True) -> list[AckResult]:
        """Release what is still held (unless ``release`` is false: then the locks run out), end every share
        session (carrying the acknowledgements queued), and leave the group. Returns the last results."""
        if self._closed:
            return []
        self._closed = True
        self._hb_wake.set()
        results = self.take_results()

        async def end(node: int, session: ShareSession) -> list[AckResult]:
            async with self._locks[node]:
                session.close(release=release)
                req = session.build_close()
                if req is None:
                    return []
                try:
                    resp = await self.client.send(node, req, timeout=self.request_timeout)
                except KafkaError as exc:
                    log.info("share group %s: closing the session on node %d failed: %s", self.group_id, node, exc)
                    return session.request_failed()
                return session.handle_acknowledge_response(resp, time.monotonic())

        for batch in await asyncio.gather(*(end(n, s) for n, s in self.sessions.items())):
            results += batch
        if self._hb_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._hb_task
        if self.member.leave():
            await self._heartbeat_once()
        return results

    def topic_partition(self, topic: str, partition: int) -> TopicPartition:
        tid = self.client.metadata.topic_id(topic)
        if tid == uuid.UUID(int=0):
            raise KeyError(topic)
        return (tid, partition)
