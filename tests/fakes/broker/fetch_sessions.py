"""Broker side of incremental fetch sessions (KIP-227), modelled on Apache Kafka's rules (no I/O).

Each broker has a :class:`FetchSessionCache`. A Fetch request (v7+) carries ``(session id, epoch)``:

* epoch 0 or -1 is a *full* request listing every partition. A non-zero session id in it closes that
  session. Epoch -1 (or a request below v7) is sessionless; epoch 0 tries to create a session (a
  random non-zero id, next expected epoch 1) and answers session id 0 if the cache has no room.
* epoch > 0 is *incremental*: an unknown id → FETCH_SESSION_ID_NOT_FOUND (70), a wrong epoch →
  INVALID_FETCH_SESSION_EPOCH (71), a session created with topic ids used by a request without them
  (or the reverse) → FETCH_SESSION_TOPIC_ID_ERROR (106). Otherwise the sent partitions are added or
  updated, ``forgotten_topics_data`` removed, the epoch moves on; a session left empty is closed and
  the request answered sessionless. The broker reads every session partition, but the response holds
  only those with records, a changed high watermark, log start offset or last stable offset, or an
  error; partitions that returned records move to the end of the session (the next read starts with
  the others).

Cache: ``max_entries`` slots (Kafka's ``max.incremental.fetch.session.cache.slots``, 1,000). When it is
full a newcomer may evict (1) the least recently used session if it has been idle longer than
``eviction_ms`` (120 s), else (2) the least valuable evictable session — fewest partitions, then lowest
id — if the newcomer has strictly more partitions. As in Kafka, a consumer's session only becomes
evictable by size once it was *touched* more than ``eviction_ms`` after its creation; follower
(privileged) sessions outrank consumer sessions. The clock (milliseconds) is injectable, see
:class:`ManualClock`.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.protocol import error_codes as EC

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "BrokerFetchSession",
    "CachedPartition",
    "FetchContext",
    "FetchSessionCache",
    "FetchSessionStats",
    "FetchSessions",
    "ManualClock",
    "PartitionFetch",
    "PartitionKey",
    "PartitionResult",
    "new_context",
]

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1
DEFAULT_CACHE_SLOTS = 1000
DEFAULT_EVICTION_MS = 120_000

# A partition as the request names it: (topic name, partition) before v13, (topic id, partition) from v13.
PartitionKey = tuple[Any, int]
Clock = Callable[[], float]


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == INT32_MAX else epoch + 1


class ManualClock:
    """A clock for the session cache that only moves when told: ``clock.advance(121_000)``."""

    def __init__(self, start_ms: float = 1_000_000.0) -> None:
        self.now_ms = start_ms

    def __call__(self) -> float:
        return self.now_ms

    def advance(self, ms: float) -> None:
        self.now_ms += ms


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What a request asks of one partition (the session keeps the latest one per partition)."""

    key: PartitionKey
    topic: str | None  # None: a topic id this broker does not know
    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class PartitionResult:
    """What the broker read for one partition."""

    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    aborted: list[tuple[int, int]] | None = None  # (producer id, first offset); None: read_uncommitted
    current_leader: tuple[int, int] | None = None  # (leader id, leader epoch) on leadership errors

    @property
    def size(self) -> int:
        return len(self.records)


@dataclass(slots=True)
class CachedPartition:
    request: PartitionFetch
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def must_respond(self, result: PartitionResult, update: bool) -> bool:
        respond = result.size > 0 or result.error_code != 0
        if self.high_watermark != result.high_watermark:
            respond = True
            if update:
                self.high_watermark = result.high_watermark
        if self.log_start_offset != result.log_start_offset:
            respond = True
            if update:
                self.log_start_offset = result.log_start_offset
        if self.last_stable_offset != result.last_stable_offset:
            respond = True
            if update:
                self.last_stable_offset = result.last_stable_offset
        if result.error_code != 0 and update:
            self.high_watermark = -1  # so the partition is sent again once the error is gone
        return respond


@dataclass(eq=False)
class BrokerFetchSession:
    id: int
    privileged: bool
    partitions: dict[PartitionKey, CachedPartition]  # ordered: the read order of incremental fetches
    uses_topic_ids: bool
    creation_ms: float
    last_used_ms: float
    epoch: int
    node_id: int = -1
    cached_size: int = -1
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False

    @property
    def size(self) -> int:
        return len(self.partitions)

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)

    def keys(self) -> list[PartitionKey]:
        return list(self.partitions)

    def update(self, fetch: Sequence[PartitionFetch], forgotten: Iterable[PartitionKey]
               ) -> tuple[list[PartitionKey], list[PartitionKey], list[PartitionKey]]:
        added: list[PartitionKey] = []
        updated: list[PartitionKey] = []
        removed: list[PartitionKey] = []
        for pf in fetch:
            cached = self.partitions.get(pf.key)
            if cached is None:
                self.partitions[pf.key] = CachedPartition(pf)
                added.append(pf.key)
            else:
                cached.request = pf
                updated.append(pf.key)
        for key in forgotten:
            if self.partitions.pop(key, None) is not None:
                removed.append(key)
        return added, updated, removed

    def __repr__(self) -> str:
        return (f"<BrokerFetchSession id={self.id} node={self.node_id} epoch={self.epoch} "
                f"partitions={self.size} last_used={self.last_used_ms}>")


@dataclass
class FetchSessionStats:
    created: int = 0
    evicted: int = 0  # evicted_stale + evicted_by_size
    evicted_stale: int = 0
    evicted_by_size: int = 0
    closed: int = 0  # removed because a request named it (epoch 0 / -1) or emptied it
    not_created: int = 0  # full requests answered with session id 0 for lack of room
    full: int = 0
    incremental: int = 0
    sessionless: int = 0
    errors: Counter[int] = field(default_factory=Counter)  # top-level error code -> count

    def __iadd__(self, other: FetchSessionStats) -> FetchSessionStats:
        for name in ("created", "evicted", "evicted_stale", "evicted_by_size", "closed", "not_created", "full",
                     "incremental", "sessionless"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.update(other.errors)
        return self


class FetchSessionCache:
    """The fetch sessions of one broker (see the module docstring for the rules)."""

    def __init__(self, max_entries: int = DEFAULT_CACHE_SLOTS, eviction_ms: float = DEFAULT_EVICTION_MS, *,
                 clock: Clock | None = None, id_factory: Callable[[], int] | None = None,
                 node_id: int = -1) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.clock: Clock = clock if clock is not None else monotonic_ms
        self.id_factory = id_factory
        self.node_id = node_id
        self.sessions: dict[int, BrokerFetchSession] = {}
        self.stats = FetchSessionStats()

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: int) -> BrokerFetchSession | None:
        return self.sessions.get(session_id)

    @property
    def total_partitions(self) -> int:
        return sum(s.size for s in self.sessions.values())

    def _new_id(self) -> int:
        while True:
            sid = self.id_factory() if self.id_factory is not None else random.randint(1, INT32_MAX - 1)
            if sid != INVALID_SESSION_ID and sid not in self.sessions:
                return sid

    def maybe_create(self, now: float, privileged: bool, partitions: dict[PartitionKey, CachedPartition],
                     uses_topic_ids: bool) -> int:
        """Create a session holding ``partitions`` if there is room (or room can be made); else 0."""
        size = len(partitions)
        if len(self.sessions) < self.max_entries or self._try_evict(privileged, (privileged, size, 0), now):
            session = BrokerFetchSession(self._new_id(), privileged, partitions, uses_topic_ids, now, now,
                                         next_epoch(INITIAL_EPOCH), node_id=self.node_id)
            self.sessions[session.id] = session
            self.touch(session, now)
            self.stats.created += 1
            return session.id
        self.stats.not_created += 1
        return INVALID_SESSION_ID

    def _try_evict(self, privileged: bool, key: tuple[bool, int, int], now: float) -> bool:
        if not self.sessions:
            return False
        lru = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - lru.last_used_ms > self.eviction_ms:
            self.remove(lru.id)
            self.stats.evicted += 1
            self.stats.evicted_stale += 1
            return True
        candidates = [s for s in self.sessions.values()
                      if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
        if not candidates:
            return False
        victim = min(candidates, key=lambda s: s.evictable_key())
        if key < victim.evictable_key():
            return False
        self.remove(victim.id)
        self.stats.evicted += 1
        self.stats.evicted_by_size += 1
        return True

    def touch(self, session: BrokerFetchSession, now: float) -> None:
        session.last_used_ms = now
        session.cached_size = session.size
        old_enough = now - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = (not session.privileged) or old_enough
        session.evictable_by_all = old_enough

    def remove(self, session_id: int) -> BrokerFetchSession | None:
        return self.sessions.pop(session_id, None)

    def clear(self) -> int:
        n = len(self.sessions)
        self.sessions.clear()
        return n


class FetchSessions:
    """Per-cluster switch and per-broker caches, kept in ``ClusterState.extensions["fetch_sessions"]``."""

    def __init__(self, *, enabled: bool = True, max_entries: int = DEFAULT_CACHE_SLOTS,
                 eviction_ms: float = DEFAULT_EVICTION_MS, clock: Clock | None = None,
                 id_factory: Callable[[], int] | None = None) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.clock: Clock = clock if clock is not None else monotonic_ms
        self.id_factory = id_factory
        self.caches: dict[int, FetchSessionCache] = {}

    def cache(self, node_id: int) -> FetchSessionCache:
        c = self.caches.get(node_id)
        if c is None:
            c = self.caches[node_id] = FetchSessionCache(self.max_entries, self.eviction_ms, clock=self.clock,
                                                         id_factory=self.id_factory, node_id=node_id)
        return c

    def configure(self, *, enabled: bool | None = None, max_entries: int | None = None,
                  eviction_ms: float | None = None, clock: Clock | None = None,
                  id_factory: Callable[[], int] | None = None) -> None:
        if enabled is not None:
            self.enabled = enabled
        if max_entries is not None:
            self.max_entries = max_entries
        if eviction_ms is not None:
            self.eviction_ms = eviction_ms
        if clock is not None:
            self.clock = clock
        if id_factory is not None:
            self.id_factory = id_factory
        for c in self.caches.values():
            c.max_entries, c.eviction_ms, c.clock = self.max_entries, self.eviction_ms, self.clock
            c.id_factory = self.id_factory

    def sessions(self, node_id: int | None = None) -> list[BrokerFetchSession]:
        caches = [self.caches[node_id]] if node_id is not None and node_id in self.caches else (
            [] if node_id is not None else list(self.caches.values()))
        return [s for c in caches for s in c.sessions.values()]

    def stats(self, node_id: int | None = None) -> FetchSessionStats:
        total = FetchSessionStats()
        for nid, c in self.caches.items():
            if node_id is None or nid == node_id:
                total += c.stats
        return total

    def find(self, session_id: int) -> BrokerFetchSession | None:
        for c in self.caches.values():
            s = c.get(session_id)
            if s is not None:
                return s
        return None


# -- contexts -----------------------------------------------------------------------------------------
@dataclass
class FetchContext:
    """How one Fetch request is served: which partitions to read, and how to build the answer.

    ``kind``: ``"error"`` (``error_code`` set, nothing read), ``"sessionless"``, ``"full"`` or
    ``"incremental"``.
    """

    kind: str
    cache: FetchSessionCache | None
    to_read: list[PartitionFetch]
    error_code: int = 0
    session: BrokerFetchSession | None = None
    expected_epoch: int = 0
    privileged: bool = False
    uses_topic_ids: bool = False

    def build(self, results: dict[PartitionKey, PartitionResult]
              ) -> tuple[int, int, list[tuple[PartitionFetch, PartitionResult]]]:
        """(top-level error, session id, partitions to answer in order); updates the session."""
        if self.kind == "error":
            return self.error_code, INVALID_SESSION_ID, []
        pairs = [(pf, results[pf.key]) for pf in self.to_read]
        if self.kind == "sessionless":
            return 0, INVALID_SESSION_ID, pairs
        assert self.cache is not None
        if self.kind == "full":
            cached = {pf.key: CachedPartition(pf, r.high_watermark, r.last_stable_offset, r.log_start_offset)
                      for pf, r in pairs}
            sid = self.cache.maybe_create(self.cache.clock(), self.privileged, cached, self.uses_topic_ids)
            return 0, sid, pairs
        session = self.session
        assert session is not None
        if session.epoch != self.expected_epoch:
            # another request of this session was served while this one waited: a duplicate request
            self.cache.stats.errors[EC.INVALID_FETCH_SESSION_EPOCH] += 1
            return EC.INVALID_FETCH_SESSION_EPOCH, INVALID_SESSION_ID, []
        out: list[tuple[PartitionFetch, PartitionResult]] = []
        for pf, r in pairs:
            cached = session.partitions.get(pf.key)
            if cached is None:
                continue
            if cached.must_respond(r, True):
                out.append((pf, r))
                if r.size > 0:
                    session.partitions[pf.key] = session.partitions.pop(pf.key)  # to the end
        return 0, session.id, out


def new_context(cache: FetchSessionCache | None, *, version: int, session_id: int, epoch: int,
                fetch: Sequence[PartitionFetch], forgotten: Sequence[PartitionKey], privileged: bool = False,
                uses_topic_ids: bool = False) -> FetchContext:
    """Apply a request's session metadata to ``cache`` (``None``: sessions disabled on this broker)."""
    if version < 7:
        return FetchContext("sessionless", cache, list(fetch))
    is_full = epoch in (INITIAL_EPOCH, FINAL_EPOCH)
    if is_full:
        if cache is not None:
            if session_id != INVALID_SESSION_ID and cache.remove(session_id) is not None:
                cache.stats.closed += 1
            if epoch == FINAL_EPOCH:
                cache.stats.sessionless += 1
            else:
                cache.stats.full += 1
        if epoch == FINAL_EPOCH or cache is None:
            return FetchContext("sessionless", cache, list(fetch))
        return FetchContext("full", cache, list(fetch), privileged=privileged, uses_topic_ids=uses_topic_ids)
    session = cache.get(session_id) if cache is not None else None
    if session is None:
        if cache is not None:
            cache.stats.errors[EC.FETCH_SESSION_ID_NOT_FOUND] += 1
        return FetchContext("error", cache, [], EC.FETCH_SESSION_ID_NOT_FOUND)
    assert cache is not None
    if session.epoch != epoch:
        cache.stats.errors[EC.INVALID_FETCH_SESSION_EPOCH] += 1
        return FetchContext("error", cache, [], EC.INVALID_FETCH_SESSION_EPOCH)
    if session.uses_topic_ids != uses_topic_ids:
        cache.stats.errors[EC.FETCH_SESSION_TOPIC_ID_ERROR] += 1
        return FetchContext("error", cache, [], EC.FETCH_SESSION_TOPIC_ID_ERROR)
    cache.stats.incremental += 1
    session.update(fetch, forgotten)
    if not session.partitions:
        cache.remove(session.id)
        cache.stats.closed += 1
        return FetchContext("sessionless", cache, list(fetch))
    cache.touch(session, cache.clock())
    session.epoch = next_epoch(session.epoch)
    to_read = [c.request for c in session.partitions.values()]
    return FetchContext("incremental", cache, to_read, session=session, expected_epoch=session.epoch)
