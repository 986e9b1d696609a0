"""The asyncio fetcher of one consumer: one fetch session and at most one in-flight fetch per leader.

Each round it groups the consumer's fetchable partitions (assigned, positioned, not paused) by leader,
and for every leader without an in-flight fetch builds a request through that broker's
:class:`FetchSessionHandler`. Responses are decoded, filtered (read_committed) and buffered as
:class:`CompletedFetch` objects until ``poll`` drains them; the buffer is bounded in bytes
(``prefetch_max_bytes``), so a slow owner pauses fetching (never heartbeats).

Pipelining: while the owner is polling (a poll in progress or ended within ``active_linger_s``), a
partition that still has buffered records is fetched again from the end of its buffer (the last
buffered fetch's next offset), so the next response is on its way while polls drain the current one and
a poll rarely finds the buffer empty; each partition's buffered fetches form a chain (each one's fetch
offset is the previous one's next offset) that polls consume in order. An owner that stops polling gets
the Java consumer's behaviour (KAFKA-17182): a leader with any partition still buffered is not fetched
from until the buffer is drained, so an idle consumer holding records costs the broker nothing.

Gathering: the fetcher keeps, for each fetch in flight, its partitions, when it was sent and when its
broker-side wait ends, plus running counts of the buffered records and bytes, so a poll decides in
constant time whether a full poll's worth is buffered and, when a fetch ends (:attr:`Fetcher.fetches_done`;
``data_event`` is set then while a poll gathers), until when more may come (:meth:`Fetcher.gather_until`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.client.client import KafkaClient
from service.client.errors import KafkaError
from service.consumer.subscription import (
    NoOffsetForPartitionError,
    OffsetResetStrategy,
    SubscriptionState,
    TopicPartition,
)
from service.fetch.read_committed import READ_COMMITTED, TxnTracker, filter_batches
from service.fetch.session import FetchPartitionData, FetchSessionHandler, choose_version, to_fetch_request
from service.lib.aio import LightEvent
from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.protocol import records as _records_module
from service.protocol.errors import CorruptRecordError, UnsupportedMessageFormatError
from service.protocol.records import (
    InflatedSizeError,
    Record,
    decode_records,
    iter_batches,
    max_inflated_bytes,
)

log = logging.getLogger(__name__)


# Partition-level Fetch errors about topic identity (Java's FetchCollector requests a metadata update).
_TOPIC_ID_CODES = frozenset({EC.UNKNOWN_TOPIC_ID, EC.INCONSISTENT_TOPIC_ID, EC.FETCH_SESSION_TOPIC_ID_ERROR})


# A fetch whose broker-side wait ends at T is usually answered within this after T.
DUE_MARGIN_S = 0.003

# A partition whose next batch inflates past the bound (InflatedSizeError) reports it to the owner once and is
# not fetched again at that offset for this long (a seek or a new assignment moves it on at once), so the
# other partitions flow without repeated errors and the batch is not inflated again on every round.
INFLATE_ERROR_RETRY_S = 30.0


def _take_budget_py(recs: list[Record], i: int, j: int, budget: int, started: bool) -> tuple[int, int]:
    """How far ``recs[i:j]`` go within ``budget`` key+value bytes: a record larger than what is left ends the
    take, unless it is the very first one taken (``started`` false, ``k == i``): that one is taken whole,
    leaving 0 (a poll never stalls); the take also ends when the budget reaches 0. Returns (k, budget left).
    ``i`` must be an index of ``recs`` (or its length) and ``j >= i`` (IndexError, as in the C twin); a ``j``
    past the end stops at the end."""
    if not 0 <= i <= len(recs) or j < i:
        raise IndexError(f"take_budget: records[{i}:{j}] is not a range of the {len(recs)} records")
    j = min(j, len(recs))
    k = i
    while k < j:
        r = recs[k]
        sz = (len(r.value) if r.value else 0) + (len(r.key) if r.key else 0)
        if sz > budget and (started or k > i):
            return k, 0
        budget = budget - sz if sz <= budget else 0
        k += 1
        if budget == 0:
            break
    return k, budget


_crecords = getattr(_records_module, "_crecords", None)
#: the C twin of _take_budget_py (service/protocol/_crecords.c), when built
_take_budget: Callable[[list[Record], int, int, int, bool], tuple[int, int]] = (
    _crecords.take_budget if _crecords is not None and hasattr(_crecords, "take_budget") else _take_budget_py)


# records kept as a RecordRun (service/protocol/_crecords.c): the partition's batches copied once into
# one bytes object plus a per-record index, no Python object per record; the C renderers write the response
# straight from it and a record tuple is built only when some other code asks for one (run[i]). Used for
# the common case only (see _run_of): uncompressed data batches with records, none transactional or control,
# every record at or past the fetch offset and below the last stable offset; anything else is decoded into
# Record tuples by decode_records + filter_batches as before (the same records either way: tests).
_RecordRun: Any = getattr(_crecords, "RecordRun", None) if _crecords is not None else None
_RUN_UNUSUAL = 0x07 | 0x10 | 0x20  # compression, transactional, control
_MAGIC_AT = 16  # a batch: base offset (8), length (4), leader epoch (4), magic (1), crc (4), attributes (2)
_ATTRIBUTES_END = 23


def _payload_from(recs: Any, i: int) -> int:
    """Key + value bytes of ``recs[i:]`` (a list of records or a RecordRun)."""
    if _RecordRun is not None and type(recs) is _RecordRun:
        return int(recs.payload(i))
    if not 0 <= i <= len(recs):
        raise IndexError(f"payload({i}): not an index of the {len(recs)} records")
    n = 0
    for r in recs[i:]:
        n += (len(r.value) if r.value else 0) + (len(r.key) if r.key else 0)
    return n


def _run_of(raw: Any, tp: TopicPartition, fetch_offset: int, limit: int | None,
            max_total: int) -> tuple[Any, int, int | None] | None:
    """(run, next offset, leader epoch of the last batch) for a partition's records in the common case, or
    None when they must go the decode_records + filter_batches way (anything unusual, an error, no whole
    batch): what filter_batches would return for them, with the same next offset and epoch."""
    if len(raw) >= _ATTRIBUTES_END and raw[_MAGIC_AT] == 2 and \
            int.from_bytes(raw[_ATTRIBUTES_END - 2:_ATTRIBUTES_END], "big") & _RUN_UNUSUAL:
        return None  # a compressed, transactional or control first batch: no copy, no walk (the slow path's)
    data = bytes(raw)  # one copy: the run keeps this, not the fetch response
    run = _RecordRun(data, Record)
    nxt: int | None = None
    epoch: int | None = None
    total = 0
    try:
        for b in iter_batches(data, topic=tp.topic, partition=tp.partition):
            if nxt is not None and total >= max_total:
                break  # decode_records' max_total_inflated stop: the rest is fetched again
            if b.attributes & _RUN_UNUSUAL or b.records_count <= 0 or b.next_offset <= fetch_offset \
                    or (limit is not None and b.base_offset >= limit):
                return None
            first, last = run.add(b._start, b._end, b.records_count, b.base_offset, b.base_timestamp,
                                  b.max_timestamp if b.attributes & 0x08 else None)
            if first < fetch_offset or (limit is not None and last >= limit):
                return None  # a batch filter_batches cuts record by record
            total += b._end - b._start
            nxt = b.next_offset
            epoch = b.partition_leader_epoch
    except (CorruptRecordError, UnsupportedMessageFormatError, ValueError):
        return None  # the slow path reports it (deferred, after the batches before it)
    if nxt is None:
        return None
    return run, nxt, epoch


# a partition's records are decoded in pieces of about this many bytes of whole batches, with the
# event loop let go between pieces: a multi-megabyte partition otherwise holds the loop for ~10 ms (HTTP
# requests, heartbeats and polls wait behind it; the poll p99 under load).
DECODE_PIECE_BYTES = 512 * 1024
_BATCH_HEAD = 61  # a magic-2 batch header: base offset, length, epoch, magic, crc, attributes, ...


@dataclass(slots=True)
class _Piece:
    """One piece of a partition's fetch response: its fields, with only some of its records (whole batches)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: Any
    records: Any


def split_records(part: Any, max_piece: int = DECODE_PIECE_BYTES) -> list[_Piece] | None:
    """``part`` (a Fetch response partition) as pieces of about ``max_piece`` bytes of whole batches, in
    order, the last one with whatever follows (a batch cut short by the response size), or None when it must
    be decoded in one go: small, an error, aborted transactions listed (their filtering state spans the
    partition's batches), or anything but uncompressed magic-2 batches (the inflated-size bound is per call)."""
    raw = part.records
    if raw is None or part.error_code or len(raw) <= max_piece or part.aborted_transactions:
        return None
    mv = memoryview(raw)
    n = len(mv)
    cuts: list[int] = []
    start = pos = 0
    while pos + _BATCH_HEAD <= n:
        length = int.from_bytes(mv[pos + 8:pos + 12], "big", signed=True)
        if mv[pos + 16] != 2 or mv[pos + 22] & 0x07 or length < _BATCH_HEAD - 12:
            return None  # compressed or another format: one go
        end = pos + 12 + length
        if end > n:
            break  # cut short: stays with the last piece
        pos = end
        if pos - start >= max_piece:
            cuts.append(pos)
            start = pos
    if not cuts:
        return None
    if cuts[-1] == pos:
        cuts.pop()  # no last piece without a whole batch (only a batch cut short, or nothing)
    if not cuts:
        return None
    bounds = [0, *cuts, n]
    return [_Piece(part.error_code, part.high_watermark, part.last_stable_offset, part.log_start_offset,
                   part.aborted_transactions, mv[a:b]) for a, b in itertools.pairwise(bounds)]


class RecordTooLargeError(KafkaError):
    retriable = False


class FetchPartitionError(KafkaError):
    """A per-partition error the owner must see (authorization, corrupt data, …)."""

    retriable = False


@dataclass(slots=True)
class CompletedFetch:
    tp: TopicPartition
    fetch_offset: int
    records: list[Record]  # or a RecordRun (the common case; a sequence of the same records)
    next_offset: int
    size: int
    index: int = 0
    leader_epoch: int | None = None

    @property
    def drained(self) -> bool:
        return self.index >= len(self.records)


@dataclass
class FetcherStats:
    fetches: int = 0
    full_fetches: int = 0
    incremental_fetches: int = 0
    session_errors: int = 0
    # full fetches that re-created a fetch session lost on the broker (restart, session error, failed send)
    session_resets: int = 0
    request_bytes: int = 0
    records: int = 0
    bytes: int = 0
    aborted_batches: int = 0
    aborted_after_delivery: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    shed: int = 0  # buffers dropped for memory (MemoryBudget.reclaim)


@dataclass(frozen=True)
class FetchConfig:
    isolation_level: int = 0
    min_bytes: int = 1
    max_bytes: int = 52428800
    partition_max_bytes: int = 1048576
    max_wait_ms: int = 500
    # The wait used while records flow to a polling owner (a poll in progress or ended less than
    # active_linger_s ago, and records fetched less than active_quiet_s ago); None: always max_wait_ms.
    # A broker that answers a parked fetch only when its wait ends (Tansu) otherwise adds up to
    # max_wait_ms to the delivery of every record. A quiet partition goes back to the long wait, so
    # long-polling an idle topic costs no more fetches than not polling it.
    active_max_wait_ms: int | None = None
    active_linger_s: float = 1.0
    active_quiet_s: float = 1.0
    prefetch_max_bytes: int = 8 * 1024 * 1024
    rack_id: str = ""
    # Stop fetching once the owner has not asked for records for this long (0: never). An idle
    # consumer then holds no broker connection and costs nothing but heartbeats; its next poll wakes
    # the fetcher again.
    idle_pause_s: float = 30.0


class Fetcher:
    # Slots (memory per idle instance): past 29 attributes an instance's __dict__ is a ~1.6 KB table of
    # its own (one per consumer instance). "__dict__" lets tests replace a method on one instance (created only
    # then); "__weakref__" for the memory budget's WeakSet of fetchers.
    __slots__ = (
        "__dict__", "__weakref__", "_budget_registered", "_budget_waiting", "_closing", "_in_flight",
        "_in_flight_info", "_rotation", "_shed_at", "_task", "_wake", "budget", "buffer", "buffered_bytes",
        "buffered_records", "client", "config", "data_event", "errors", "fetches_done", "gathering", "idle",
        "last_data", "last_demand", "last_poll_end", "on_error", "on_reset", "parked", "polling",
        "sessions", "stats", "subs", "trackers",
    )

    def __init__(self, client: KafkaClient, subs: SubscriptionState, config: FetchConfig) -> None:
        self.client = client
        self.subs = subs
        self.config = config
        self.stats = FetcherStats()
        self.sessions: dict[int, FetchSessionHandler] = {}
        self.buffer: dict[TopicPartition, deque[CompletedFetch]] = {}
        self.buffered_bytes = 0
        self.buffered_records = 0  # records in the buffer not yet handed out (paused partitions included)
        self.budget: Any = None  # optional process-wide memory budget (service.instances.budget.MemoryBudget)
        self._budget_waiting = False
        self._budget_registered = False
        self._shed_at: float | None = None  # when shed() dropped the buffer; no prefetch until the next demand
        self.data_event = LightEvent()
        self.errors: dict[TopicPartition, Exception] = {}
        #: partitions held back at an offset whose batch inflates past the bound: (offset, until monotonic)
        self.parked: dict[TopicPartition, tuple[int, float]] = {}
        self.trackers: dict[TopicPartition, TxnTracker] = {}
        self._wake = LightEvent()
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        # per in-flight fetch: what it asks for, when it was sent, when its broker-side wait ends
        self._in_flight_info: dict[int, tuple[list[TopicPartition], float, float]] = {}
        #: fetches ended so far (a poll that gathers notices one ending by this changing)
        self.fetches_done = 0
        #: polls gathering records (Consumer.poll_batches' linger): while any is, the end of every fetch
        #: also sets data_event, so they stop lingering as soon as no fetch is outstanding
        self.gathering = 0
        self._task: asyncio.Task[None] | None = None
        # Called with any unexpected exception of a round or a fetch (the consumer logs and counts it)
        self.on_error: Callable[[Exception], None] | None = None
        self._closing = False
        self._rotation = 0
        self.last_demand = time.monotonic()
        self.polling = 0  # polls in progress
        self.last_poll_end = -math.inf
        self.last_data = -math.inf  # when a fetch last brought records
        self.idle = False
        #: called after a partition was marked for an offset reset (the owner resolves positions)
        self.on_reset: Callable[[], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="fetcher")

    def wake(self) -> None:
        self._wake.set()
        if self._task is None and self.idle and not self._closing:  # ended while idle (_run): start it again
            self.start()

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for t in list(self._in_flight.values()):
            t.cancel()
        for t in list(self._in_flight.values()):
            with contextlib.suppress(BaseException):
                await t
        self._in_flight.clear()
        self.purge()  # give the buffered bytes back to the budget
        await self._close_sessions()

    async def _close_sessions(self) -> None:
        """Free the brokers' session slots (epoch -1) on shutdown; best effort."""
        for node, handler in list(self.sessions.items()):
            if handler.in_flight:
                handler.handle_error(None)
            data = handler.close_request()
            if data is None:
                continue
            try:
                conn = await asyncio.wait_for(self.client.connection(node).get(), 2.0)
                version = choose_version(conn.version_for(M.ApiKey.FETCH), data)
                req = to_fetch_request(data, version=version, max_wait_ms=0, min_bytes=0,
                                       isolation_level=self.config.isolation_level)
                await conn.send(req, version, timeout=2.0)
            except (KafkaError, TimeoutError, ValueError) as exc:
                log.debug("closing fetch session on node %s failed: %s", node, exc)
        self.sessions.clear()

    # -- buffer ----------------------------------------------------------------------------------------
    def has_buffered(self, tp: TopicPartition) -> bool:
        return bool(self.buffer.get(tp))

    def purge(self, partitions: list[TopicPartition] | None = None) -> None:
        """Drop buffered data (after seek, revocation or unsubscribe)."""
        targets = list(self.buffer) if partitions is None else partitions
        for tp in targets:
            q = self.buffer.pop(tp, None)
            if q:
                self._account(-(sum(cf.size for cf in q)), -sum(len(cf.records) - cf.index for cf in q))
            self.errors.pop(tp, None)
            self.parked.pop(tp, None)
        self.wake()

    def shed(self) -> int:
        """Drop the buffered records for memory (:meth:`MemoryBudget.reclaim`): positions do not move, so they
        are fetched again when the owner asks; until then this fetcher does not prefetch. Returns the bytes
        freed."""
        freed = self.buffered_bytes
        for tp in list(self.buffer):
            q = self.buffer.pop(tp)
            self._account(-(sum(cf.size for cf in q)), -sum(len(cf.records) - cf.index for cf in q))
        self._shed_at = time.monotonic()
        self.stats.shed += 1
        return freed

    def _account(self, delta: int, records: int = 0) -> None:
        self.buffered_bytes += delta
        self.buffered_records += records
        if self.budget is not None:
            self.budget.add(delta)

    def drain(self, max_records: int, max_bytes: int | None = None) -> list[tuple[TopicPartition, list[Record]]]:
        """Take up to ``max_records`` buffered records as per-partition chunks (list slices, no per-record
        work unless ``max_bytes`` is given) and advance positions. At least one record is returned when
        any is available, even if it is larger than ``max_bytes``, so a poll can never stall."""
        out: list[tuple[TopicPartition, list[Record]]] = []
        left = max_records
        budget = -1 if max_bytes is None else max_bytes
        for tp in list(self.buffer):
            if left <= 0 or budget == 0:
                break
            q = self.buffer[tp]
            st = self.subs.assignment.get(tp)
            while q and left > 0 and budget != 0:
                cf = q[0]
                pos = st.position if st is not None else None
                if pos is None or pos != cf.fetch_offset:
                    q.popleft()  # stale: revoked or the position moved (seek) while it was buffered
                    self._account(-(cf.size), cf.index - len(cf.records))
                    continue
                if st is not None and st.paused:
                    break
                recs = cf.records
                i = cf.index
                j = min(len(recs), i + left)
                if budget > 0:
                    j, budget = _take_budget(recs, i, j, budget, bool(out))
                if j == i:
                    break
                chunk = recs if (i == 0 and j == len(recs)) else recs[i:j]
                out.append((tp, chunk))
                left -= j - i
                self.buffered_records -= j - i
                cf.index = j
                if j >= len(recs):
                    q.popleft()
                    self._account(-(cf.size))
                    self.subs.advance(tp, cf.next_offset, cf.leader_epoch)
                else:
                    nxt = (recs.offset(j - 1) if type(recs) is _RecordRun else recs[j - 1].offset) + 1  # type: ignore[attr-defined]  # a RecordRun (C): offset()
                    self.subs.advance(tp, nxt, cf.leader_epoch)
                    cf.fetch_offset = nxt
                    break
            if not q:
                self.buffer.pop(tp, None)
        if not self.buffer:
            self.data_event.clear()
        self.wake()
        return out

    def has_data(self) -> bool:
        return any(self.buffer.values())

    def gather_until(self, poll_started: float, data_seen: float, linger: float, due_window: float) -> float | None:
        """Until when a poll that saw records at ``data_seen`` should wait for more (None: no need).

        Only fetches in flight that ask for a partition with nothing buffered count (their answer may bring
        records to hand out together with the buffered ones). Each counts until ``data_seen + linger``; one
        outstanding since before the poll started (it may carry records produced before the request) whose
        broker-side wait ends within ``due_window`` of ``data_seen`` counts until that end (plus a little):
        a broker that answers a parked fetch only when its wait ends (Tansu) holds such records until then."""
        buf = self.buffer
        until: float | None = None
        for tps, sent, due in self._in_flight_info.values():
            if all(buf.get(tp) for tp in tps):
                continue
            t = data_seen + linger
            if sent <= poll_started and due <= data_seen + due_window:
                t = max(t, due + DUE_MARGIN_S)
            if until is None or t > until:
                until = t
        return until

    def buffered_payload(self, cache: dict[int, tuple[CompletedFetch, int]]) -> int:
        """Key + value bytes of the buffered records not yet handed out. ``cache`` (kept by the caller for
        one poll, during which nothing is drained) holds each buffered fetch's share, so every record is
        measured once per poll."""
        total = 0
        for q in self.buffer.values():
            for cf in q:
                hit = cache.get(id(cf))
                if hit is None or hit[0] is not cf:
                    hit = cache[id(cf)] = (cf, _payload_from(cf.records, cf.index))
                total += hit[1]
        return total

    # -- the loop ---------------------------------------------------------------------------------------
    def _failed(self, exc: Exception) -> None:
        """An unexpected error (a bug) in a round or a per-broker fetch: reported to the owner (which logs
        and counts it), or logged; the fetcher keeps running."""
        if self.on_error is not None:
            self.on_error(exc)
        else:
            log.error("fetcher: unexpected error: %r", exc, exc_info=exc)

    async def _run(self) -> None:
        failures = 0
        while not self._closing:
            try:
                await self._round()
                failures = 0
                if self.idle:
                    # Memory per idle instance: paused for idleness, the task ends instead of waiting
                    # (no suspended task, coroutines and waiter per idle instance); wake() and demand() start
                    # it again. No await since _round looked, so no wake-up was missed.
                    self._task = None
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the fetcher die: report, back off, go on
                failures += 1
                self._failed(exc)
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(failures - 1, 10)))

    def demand(self) -> None:
        """The owner wants records (a poll starts): resume fetching if it was paused for idleness."""
        self.last_demand = time.monotonic()
        self.polling += 1
        if self.idle or self._shed_at is not None:
            self.wake()  # (starts the task again if it ended while idle)
            self.idle = False

    def demand_done(self) -> None:
        """A poll ended (pairs with :meth:`demand`)."""
        self.polling -= 1
        self.last_demand = self.last_poll_end = time.monotonic()

    def max_wait_ms(self) -> int:
        """The broker-side wait for the next fetch (see FetchConfig.active_max_wait_ms)."""
        cfg = self.config
        active = cfg.active_max_wait_ms
        if active is not None and active < cfg.max_wait_ms:
            now = time.monotonic()
            if now - self.last_data < cfg.active_quiet_s and (
                    self.polling > 0 or now - self.last_poll_end < cfg.active_linger_s):
                return active
        return cfg.max_wait_ms

    async def _round(self) -> None:
        self._wake.clear()
        pause = self.config.idle_pause_s
        self.idle = bool(pause) and time.monotonic() - self.last_demand > pause and not self._in_flight
        if self.idle:
            return  # _run ends the task
        if self._shed_at is not None:  # the buffer was dropped for memory: wait for the owner to ask again
            if self.polling or self.last_demand > self._shed_at:
                self._shed_at = None
            else:
                await self._wake.wait()
                return
        if self.buffered_bytes < self.config.prefetch_max_bytes and (
                self.budget is None or self.budget.available() or self.polling):  # polling: may reclaim
            await self._send_fetches()
        waiters: list[asyncio.Future[Any]] = list(self._in_flight.values())
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([*waiters, wake], return_when=asyncio.FIRST_COMPLETED,
                               timeout=None if (waiters or self._wake.is_set()) else 1.0)
        finally:
            wake.cancel()

    def pipelining(self) -> bool:
        """Fetch ahead of the buffer (see the module docstring): while the owner is polling."""
        return self.polling > 0 or time.monotonic() - self.last_poll_end < self.config.active_linger_s

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        """Where the next fetch of ``tp`` starts: the end of its buffered records, else its position."""
        q = self.buffer.get(tp)
        if q:
            return q[-1].next_offset
        st = self.subs.assignment.get(tp)
        return None if st is None else st.position

    def _fetchable_by_leader(self) -> dict[int, list[TopicPartition]]:
        """Partitions to fetch, by leader. Unless pipelining, a leader with any partition still buffered
        (not yet handed to the owner) is skipped this round, as the Java consumer does since KAFKA-17182:
        leaving such a partition out would remove it from the fetch session and re-add it on the next
        round. When pipelining, buffered partitions are fetched from the end of their buffer."""
        md = self.client.metadata
        out: dict[int, list[TopicPartition]] = {}
        busy: set[int] = set()
        ahead = self.pipelining()
        fetchable = self.subs.fetchable()
        if fetchable:
            # rotate so that no partition is always last in line (brokers fill responses in order)
            k = self._rotation % len(fetchable)
            fetchable = fetchable[k:] + fetchable[:k]
            self._rotation += 1
        for tp in fetchable:
            leader = md.leader(tp.topic, tp.partition)
            if leader is None:
                self.client.invalidate(tp.topic)
                continue
            if not ahead and self.has_buffered(tp):
                busy.add(leader)
                continue
            if tp in self.errors:
                continue
            parked = self.parked.get(tp)
            if parked is not None:
                if parked[0] == self.fetch_offset(tp) and time.monotonic() < parked[1]:
                    continue
                del self.parked[tp]
            out.setdefault(leader, []).append(tp)
        for node in busy:
            out.pop(node, None)
        return out

    async def _send_fetches(self) -> None:
        if self.client.metadata.needs_refresh and self.subs.assignment:
            try:
                await self.client.refresh_metadata({tp.topic for tp in self.subs.assignment})
            except KafkaError as exc:
                log.debug("metadata refresh failed: %s", exc)
        cfg = self.config
        budget = self.budget
        for node, tps in self._fetchable_by_leader().items():
            if node in self._in_flight:
                continue
            # The fetch's max_bytes is granted by the process memory budget (service/instances/budget.py) and
            # charged to it until the response has been handled; no grant: wait for memory to be freed.
            grant = cfg.max_bytes
            if budget is not None:
                if not self._budget_registered:
                    self._budget_registered = True
                    budget.register(self)
                want = min(cfg.max_bytes, max(1, len(tps)) * cfg.partition_max_bytes)
                grant = budget.grant(want)
                if not grant and self.polling and budget.reclaim(want, self):
                    grant = budget.grant(want)  # an owner is waiting: idle instances' prefetch made room
                if not grant:
                    if not self._budget_waiting:
                        self._budget_waiting = True
                        budget.when_free(self._budget_freed)
                    break
            now = time.monotonic()
            self._in_flight_info[node] = (tps, now, now + self.max_wait_ms() / 1000)
            self._in_flight[node] = asyncio.create_task(self._fetch(node, tps, grant), name=f"fetch-{node}")

    def _budget_freed(self) -> None:
        self._budget_waiting = False
        self.wake()

    async def _fetch(self, node: int, tps: list[TopicPartition], max_bytes: int | None = None) -> None:
        try:
            await self._fetch_inner(node, tps, max_bytes or self.config.max_bytes)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported; the node stays "in flight" briefly so it is not retried in a loop
            self._failed(exc)
            await asyncio.sleep(0.1)
        finally:
            if self.budget is not None and max_bytes:
                self.budget.release(max_bytes, "fetch")
            self._in_flight.pop(node, None)
            self._in_flight_info.pop(node, None)
            self.fetches_done += 1
            if self.gathering:
                self.data_event.set()
            self._wake.set()

    async def _fetch_inner(self, node: int, tps: list[TopicPartition], max_bytes: int) -> None:
        handler = self.sessions.get(node)
        if handler is None:
            handler = self.sessions[node] = FetchSessionHandler(node)
        try:
            async with self.client.lease(node) as mc:
                try:
                    conn = await mc.get()
                except KafkaError as exc:
                    log.debug("fetch: cannot reach node %s: %s", node, exc)
                    self.client.invalidate()
                    await asyncio.sleep(0.1)
                    return
                await self._fetch_on(conn, node, handler, tps, max_bytes)
        except KafkaError as exc:
            log.debug("fetch: node %s: %s", node, exc)
            self.client.invalidate()

    async def _fetch_on(self, conn: Any, node: int, handler: FetchSessionHandler, tps: list[TopicPartition],
                        max_bytes: int | None = None) -> None:
        cfg = self.config
        md = self.client.metadata
        builder = handler.builder()
        for tp in tps:
            offset = self.fetch_offset(tp)
            if offset is None:
                continue
            builder.add(FetchPartitionData(
                topic=tp.topic, topic_id=md.topic_id(tp.topic), partition=tp.partition,
                fetch_offset=offset, log_start_offset=-1, partition_max_bytes=cfg.partition_max_bytes,
                current_leader_epoch=md.leader_epoch(tp.topic, tp.partition),
                last_fetched_epoch=-1,
            ))
        # The connection's negotiated version decides before building: below Fetch v7 (ApiVersions
        # renegotiated after a reconnect to a broker that now supports less) the session is dropped and
        # the request is a full, sessionless one. The handler's request() pairs the build with
        # handle_error: whatever fails before the answer (building the message included) ends the flight.
        max_wait_ms = self.max_wait_ms()
        sent_before = conn.bytes_sent
        try:
            with handler.request(builder, max_version=conn.version_for(M.ApiKey.FETCH), max_wait_ms=max_wait_ms,
                                 min_bytes=cfg.min_bytes, max_bytes=max_bytes or cfg.max_bytes,
                                 isolation_level=cfg.isolation_level, rack_id=cfg.rack_id) as fx:
                data, version = fx.data, fx.version
                try:
                    resp = await conn.send(fx.message, version,
                                           timeout=conn.config.request_timeout + max_wait_ms / 1000)
                finally:
                    handler.add_request_bytes(conn.bytes_sent - sent_before)
                    self.stats.request_bytes += conn.bytes_sent - sent_before
                ok = handler.handle_response(resp, version)
        except KafkaError as exc:
            log.debug("fetch: node %s: %s", node, exc)
            self.client.invalidate()
            return
        positions = {tp: d.fetch_offset for tp, d in data.session_partitions.items()}
        self.stats.fetches += 1
        if data.is_full:
            self.stats.full_fetches += 1
            if data.resets_session:
                self.stats.session_resets += 1
        else:
            self.stats.incremental_fetches += 1
        if not ok:
            self.stats.session_errors += 1
            log.info("fetch session with node %s: %s", node, handler.last_problem)
            if version >= 7 and resp.error_code == EC.FETCH_SESSION_TOPIC_ID_ERROR:
                # Like Java's AbstractFetch: the session's topic ids disagree with the broker's; refresh.
                self.client.invalidate()
            return
        parts = handler.response_partitions(resp, version)
        last = len(parts) - 1
        for i, (tp, part) in enumerate(parts.items()):
            pieces = split_records(part)
            if pieces is None:
                self._handle_partition(TopicPartition(*tp), part, positions.get(tp))
            else:
                await self._handle_pieces(TopicPartition(*tp), pieces, positions.get(tp))
            if i < last and part.records:
                # Decoding a partition's records is CPU work (a few ms per MB): let other tasks (HTTP
                # requests, heartbeats, a poll that has gathered enough) run before the next one.
                # _handle_partition re-checks each partition's assignment and position, so what changed
                # meanwhile is ignored safely.
                await asyncio.sleep(0)

    async def _handle_pieces(self, tp: TopicPartition, pieces: list[_Piece], fetch_offset: int | None) -> None:
        """A large partition's pieces (split_records), one after the other with the loop let go in between.
        Each piece continues where the previous one left the partition's fetch offset; when that moved
        meanwhile (a seek, a revocation, a purge) or a piece failed, the rest is dropped (fetched again)."""
        expected = fetch_offset
        for k, piece in enumerate(pieces):
            if k:
                await asyncio.sleep(0)
                if expected is None or self.fetch_offset(tp) != expected:
                    return
            self._handle_partition(tp, piece, expected)
            if tp in self.errors:
                return
            expected = self.fetch_offset(tp)

    def _handle_partition(self, tp: TopicPartition, part: Any, fetch_offset: int | None) -> None:
        subs = self.subs
        st = subs.assignment.get(tp)
        if st is None or fetch_offset is None or self.fetch_offset(tp) != fetch_offset:
            return  # revoked, seeked, or the buffer / position moved meanwhile: ignore
        code = part.error_code
        if code:
            self._partition_error(tp, code)
            return
        subs.update_marks(tp, high_watermark=part.high_watermark, last_stable_offset=part.last_stable_offset,
                          log_start_offset=part.log_start_offset)
        raw = part.records
        if not raw:
            return
        if _RecordRun is not None and _records_module.using_c_extension():
            read_committed = self.config.isolation_level == READ_COMMITTED
            fast = _run_of(raw, tp, fetch_offset,
                           part.last_stable_offset if read_committed and part.last_stable_offset >= 0 else None,
                           max(max_inflated_bytes(), self.config.partition_max_bytes))
            if fast is not None:
                run, nxt, epoch = fast
                self._buffered(CompletedFetch(tp, fetch_offset, run, nxt, len(raw), leader_epoch=epoch), len(raw))
                return
        try:
            # each batch within the process-wide bound; the partition's batches together within that bound or
            # the partition fetch size, whichever is larger, plus one batch (the rest is fetched again later)
            rs = decode_records(raw, topic=tp.topic, partition=tp.partition, defer_errors=True,
                                max_total_inflated=max(max_inflated_bytes(), self.config.partition_max_bytes))
        except (CorruptRecordError, UnsupportedMessageFormatError) as exc:  # pragma: no cover - deferred
            self.errors[tp] = exc
            return
        tracker = self.trackers.get(tp)
        if tracker is None:
            tracker = self.trackers[tp] = TxnTracker()
        res = filter_batches(
            rs.batches, fetch_offset, isolation_level=self.config.isolation_level,
            aborted_transactions=part.aborted_transactions, last_stable_offset=part.last_stable_offset,
            tracker=tracker,
        )
        self.stats.aborted_batches += res.aborted_batches
        if res.new_aborted_after_delivery:
            self.stats.aborted_after_delivery += res.new_aborted_after_delivery
            if not tracker.warned:
                tracker.warned = True
                log.warning(
                    "%s: an ABORT marker arrived for a transaction whose records were already delivered; "
                    "the broker does not filter aborted transactions (no aborted-transaction index)", tp)
        if rs.error is not None and not rs.batches:
            if isinstance(rs.error, InflatedSizeError):
                self.errors[tp] = rs.error
                self.parked[tp] = (fetch_offset, time.monotonic() + INFLATE_ERROR_RETRY_S)
                self.data_event.set()
                log.warning("%s", rs.error)
                return
            self.errors[tp] = rs.error
            return
        if not rs.batches and rs.first_batch_truncated:
            self.errors[tp] = RecordTooLargeError(
                f"{tp}: the batch at offset {fetch_offset} is larger than max.partition.fetch.bytes "
                f"({self.config.partition_max_bytes})")
            return
        if res.next_offset == fetch_offset and not res.records:
            return
        size = max(len(raw), rs.inflated_bytes)  # buffered memory: decompressed batches count as such
        cf = CompletedFetch(tp, fetch_offset, res.records, res.next_offset, size, leader_epoch=res.last_epoch)
        if not res.records:  # only control/aborted batches: move past them
            q = self.buffer.get(tp)
            if q:
                q[-1].next_offset = res.next_offset  # fetched ahead: the buffered chain ends further on
            else:
                subs.advance(tp, res.next_offset)
            return
        self._buffered(cf, len(raw))
        if rs.error is not None and not isinstance(rs.error, InflatedSizeError):  # (that one: on the next fetch)
            self.errors[tp] = rs.error

    def _buffered(self, cf: CompletedFetch, raw_bytes: int) -> None:
        """A fetch's records into the buffer (counted, owner woken)."""
        self.buffer.setdefault(cf.tp, deque()).append(cf)
        self._account(cf.size, len(cf.records))
        self.stats.records += len(cf.records)
        self.stats.bytes += raw_bytes
        self.last_data = time.monotonic()
        self.data_event.set()

    def _partition_error(self, tp: TopicPartition, code: int) -> None:
        name = EC.describe(code).name
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        if code == EC.OFFSET_OUT_OF_RANGE:
            if self.subs.default_reset is OffsetResetStrategy.NONE:
                self.errors[tp] = NoOffsetForPartitionError([tp], "fetch position out of range")
                self.data_event.set()
            else:
                log.info("%s: offset out of range; resetting to %s", tp, self.subs.default_reset.value)
                self.subs.request_reset(tp)
                if self.on_reset is not None:
                    self.on_reset()
            return
        if code in _TOPIC_ID_CODES:
            # The broker does not know (or disagrees with) the topic id we sent: refresh the topic's
            # metadata; the partition stays assigned and is fetched again with the id the refresh brings.
            log.info("%s: fetch error %s; refreshing metadata", tp, name)
            self.client.invalidate(tp.topic)
            return
        if code in EC.METADATA_REFRESH_CODES or code == EC.LEADER_NOT_AVAILABLE:
            self.client.invalidate(tp.topic)
            return
        if code in (EC.TOPIC_AUTHORIZATION_FAILED, 10, 87):  # auth, message too large, invalid record
            self.errors[tp] = FetchPartitionError(f"fetch of {tp} failed: {name}", code=code)
            self.data_event.set()
            return
        log.info("%s: fetch error %s; will retry", tp, name)
        self.client.invalidate(tp.topic)

    def take_error(self) -> Exception | None:
        """The first pending per-partition error (raised to the owner once)."""
        for tp in list(self.errors):
            err = self.errors.pop(tp)
            return err
        return None

    def is_read_committed(self) -> bool:
        return self.config.isolation_level == READ_COMMITTED
