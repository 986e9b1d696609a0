"""The share session with one broker (KIP-932 ShareFetch / ShareAcknowledge), as a pure state machine.

A share consumer keeps one share session per partition leader, identified by (group, member id) and advanced
by an epoch: 0 opens it (and replaces any session the member had there), each answered request moves it on by
one, and -1 closes it. The session remembers which partitions it fetches from, so a request only names the
partitions it adds (``topics``) and those it drops (``forgotten_topics_data``).

Records come back *acquired*: locked for this member until the broker's acquisition lock runs out (kept here as
runs of offsets with their delivery count and lock deadline, as the broker hands them out). Each is
settled by an acknowledgement (accept, release, reject; renew only extends the lock), batched per partition into
offset ranges, and sent either along with the next ShareFetch or alone in a ShareAcknowledge. The answer carries
one error code per partition, which is mapped back to every record acknowledged there: applied or not.

No I/O: the driver (service/share/consumer.py) builds requests here, sends them, and hands the answers back.
Requests go one at a time (the epochs must follow each other); ``now`` is a monotonic time in seconds.
"""

from __future__ import annotations

import enum
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from service.protocol import error_codes as EC
from service.protocol import messages as M
from service.share.ranges import RunMap, subtract

TopicPartition = tuple[uuid.UUID, int]  # (topic id, partition index)

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = 2**31 - 1

_FetchTopic = M.struct("ShareFetchRequest", "FetchTopic")
_FetchPartition = M.struct("ShareFetchRequest", "FetchPartition")
_FetchBatch = M.struct("ShareFetchRequest", "AcknowledgementBatch")
_Forgotten = M.struct("ShareFetchRequest", "ForgottenTopic")
_AckTopic = M.struct("ShareAcknowledgeRequest", "AcknowledgeTopic")
_AckPartition = M.struct("ShareAcknowledgeRequest", "AcknowledgePartition")
_AckBatch = M.struct("ShareAcknowledgeRequest", "AcknowledgementBatch")

#: top-level errors after which the broker no longer has our session: start a new one (epoch 0)
SESSION_LOST = frozenset({EC.SHARE_SESSION_NOT_FOUND, EC.INVALID_SHARE_SESSION_EPOCH})
#: the code reported for acknowledgements whose request got no answer (connection lost, timeout)
NO_ANSWER = EC.UNKNOWN_SERVER_ERROR


class AckType(enum.IntEnum):
    """The acknowledgement types of the wire (``AcknowledgeTypes``)."""

    GAP = 0  # an offset in an acquired range that holds no record (compacted away, a control record)
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # keeps the lock (ShareFetch/ShareAcknowledge v2+, and the group must allow it)


class SessionError(Exception):
    """A request asked of the session in a state that cannot make it (one already in flight, closed)."""


@dataclass(slots=True)
class Acquired:
    """An offset this member holds: its delivery count and when its lock runs out (monotonic seconds)."""

    delivery_count: int
    deadline: float


@dataclass(frozen=True, slots=True)
class AckResult:
    """What became of acknowledged records (``offset`` to ``last_offset``, inclusive; one record when
    ``last_offset`` is not given): ``error_code`` 0 means the broker applied them."""

    topic_id: uuid.UUID
    partition: int
    offset: int
    type: AckType
    error_code: int
    last_offset: int = -1

    @property
    def applied(self) -> bool:
        return self.error_code == EC.NONE

    @property
    def last(self) -> int:
        return self.last_offset if self.last_offset >= self.offset else self.offset

    @property
    def offsets(self) -> range:
        return range(self.offset, self.last + 1)


@dataclass(slots=True)
class FetchedPartition:
    """One partition of a ShareFetch answer."""

    topic_id: uuid.UUID
    partition: int
    error_code: int
    error_message: str | None
    records: Any  # the raw records blob (bytes / memoryview) or None
    acquired: list[tuple[int, int, int]]  # (first offset, last offset, delivery count)
    leader_id: int
    leader_epoch: int


@dataclass(slots=True)
class FetchOutcome:
    error_code: int
    error_message: str | None
    partitions: list[FetchedPartition] = field(default_factory=list)
    ack_results: list[AckResult] = field(default_factory=list)
    #: the top-level error made the session start over: every acquired record was dropped
    session_reset: bool = False


AckRun = tuple[int, int, AckType]  # first offset, last offset, type


@dataclass(slots=True)
class _InFlight:
    kind: str  # "fetch" | "ack" | "close"
    acks: dict[TopicPartition, list[AckRun]]


def run_batches(runs: Iterable[AckRun]) -> list[tuple[int, int, list[int]]]:
    """Disjoint runs of offsets with their types as wire batches: consecutive runs merged, each batch with one
    type when all of it shares it, else one type per offset."""
    out: list[tuple[int, int, list[int]]] = []
    group: list[AckRun] = []

    def emit() -> None:
        types = {t for _, _, t in group}
        if len(types) == 1:
            out.append((group[0][0], group[-1][1], [int(group[0][2])]))
        else:
            out.append((group[0][0], group[-1][1], [int(t) for f, la, t in group for _ in range(f, la + 1)]))

    for run in sorted(runs):
        if group and run[0] != group[-1][1] + 1:
            emit()
            group = []
        group.append(run)
    if group:
        emit()
    return out


def ack_batches(acks: dict[int, AckType]) -> list[tuple[int, int, list[int]]]:
    """Offsets and their types as wire batches (see :func:`run_batches`)."""
    return run_batches((o, o, t) for o, t in acks.items())


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return epoch
    return 1 if epoch >= _MAX_EPOCH else epoch + 1


class ShareSession:
    """The share session of one member with one broker."""

    def __init__(self, group_id: str, member_id: str) -> None:
        self.group_id = group_id
        self.member_id = member_id
        self.epoch = INITIAL_EPOCH  # the epoch of the next request
        self.lock_timeout_ms = 0  # the broker's acquisition lock, from its last answer
        self.closed = False
        self._session: set[TopicPartition] = set()  # what the broker's session fetches from
        self._wanted: set[TopicPartition] = set()
        #: per partition, runs of acquired offsets: (delivery count, lock deadline)
        self._acquired: dict[TopicPartition, RunMap[tuple[int, float]]] = {}
        self._pending: dict[TopicPartition, RunMap[AckType]] = {}
        self._in_flight: _InFlight | None = None
        self._closing = False

    # -- partitions -----------------------------------------------------------------------------------------------
    def set_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions to fetch from (this broker leads them); applied by the next ShareFetch."""
        self._wanted = set(partitions)

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return frozenset(self._wanted)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    # -- acquired records -----------------------------------------------------------------------------------------
    def acquired(self, tp: TopicPartition) -> dict[int, Acquired]:
        """The offsets held in ``tp`` one by one (for inspection: the session keeps them as runs)."""
        held = self._acquired.get(tp)
        return {o: Acquired(c, d) for f, la, (c, d) in held for o in range(f, la + 1)} if held else {}

    def acquired_runs(self, tp: TopicPartition) -> list[tuple[int, int, int, float]]:
        """The runs held in ``tp``: (first, last, delivery count, lock deadline)."""
        held = self._acquired.get(tp)
        return [(f, la, c, d) for f, la, (c, d) in held] if held else []

    def holds(self, tp: TopicPartition, offset: int) -> bool:
        held = self._acquired.get(tp)
        return held is not None and offset in held

    def acquired_count(self) -> int:
        return sum(len(a) for a in self._acquired.values())

    def _pend(self, tp: TopicPartition) -> RunMap[AckType]:
        pending = self._pending.get(tp)
        if pending is None:
            pending = self._pending[tp] = RunMap()
        return pending

    def deliver(self, fetched: FetchedPartition, record_offsets: Iterable[int] | range) -> list[
            tuple[int, int, int, float]]:
        """The runs of records of ``fetched`` this member acquired — (first, last, delivery count, lock
        deadline) — given the offsets of the records its blob decoded to.

        A blob holds whole batches, so records outside the acquired ranges are someone else's and are left out.
        Acquired offsets with no record (compacted, control records) are gaps: acknowledged as such with the
        partition's next acknowledgement, so the broker does not wait for their lock.
        """
        tp = (fetched.topic_id, fetched.partition)
        held = self._acquired.get(tp)
        if held is None:
            return []
        present = record_offsets if isinstance(record_offsets, range) else sorted(set(record_offsets))
        out: list[tuple[int, int, int, float]] = []
        for first, last, _count in fetched.acquired:
            for f, la, (c, d) in held.pieces(first, last):
                n = bisect_right(present, la) - bisect_left(present, f)
                if n == la - f + 1:  # every offset has its record: the usual case
                    out.append((f, la, c, d))
                    continue
                have = set(present[bisect_left(present, f):bisect_right(present, la)])
                start = None
                for o in range(f, la + 2):
                    if o <= la and o in have:
                        if start is None:
                            start = o
                        continue
                    if start is not None:
                        out.append((start, o - 1, c, d))
                        start = None
                    if o <= la:
                        held.remove(o, o)
                        self._pend(tp).assign(o, o, AckType.GAP)
        out.sort()
        return out

    def expire(self, now: float) -> list[tuple[TopicPartition, int]]:
        """Forget the records whose lock ran out (the broker hands them out again); returns them."""
        gone = []
        for tp, held in self._acquired.items():
            runs = held.remove_if(lambda v: v[1] <= now)
            pending = self._pending.get(tp)
            for f, la, _ in runs:
                gone += [(tp, o) for o in range(f, la + 1)]
                if pending is not None:
                    for pf, pl, t in pending.pieces(f, la):
                        if t == AckType.RENEW:
                            pending.remove(pf, pl)
        return gone

    # -- acknowledgements -----------------------------------------------------------------------------------------
    def acknowledge_held(self, tp: TopicPartition, first: int, last: int, type: AckType) -> list[tuple[int, int]]:
        """Queue an acknowledgement of the records of ``first..last`` this session holds; returns the runs it
        queued (the rest is not held here). Nothing is queued while the session is closing."""
        held = self._acquired.get(tp)
        if self._closing or held is None:
            return []
        if type == AckType.RENEW:
            pieces = held.pieces(first, last)
            if pieces:
                pending = self._pend(tp)
                for f, la, _ in pieces:  # held offsets have no terminal acknowledgement queued
                    pending.assign(f, la, AckType.RENEW)
        else:
            pieces = held.remove(first, last)  # settled: a second acknowledgement of them is refused
            if pieces:
                pending = self._pend(tp)
                for f, la, _ in pieces:
                    pending.assign(f, la, type)
        return [(f, la) for f, la, _ in pieces]

    def acknowledge_range(self, tp: TopicPartition, first: int, last: int, type: AckType) -> list[AckResult]:
        """Queue an acknowledgement of ``first..last``; the answer to the request that carries it says whether it
        applied. Returns immediate, not-applied results for the runs not held (never acquired, already settled,
        lock known to have run out, or the session is closing): nothing is sent for them."""
        type = AckType(type)
        if type == AckType.GAP:
            raise ValueError("gaps are acknowledged by the session itself")
        done = self.acknowledge_held(tp, first, last, type)
        return [AckResult(tp[0], tp[1], f, type, EC.INVALID_RECORD_STATE, la)
                for f, la in subtract(first, last, done)]

    def acknowledge(self, tp: TopicPartition, offset: int, type: AckType) -> AckResult | None:
        """Queue one record's acknowledgement (see :meth:`acknowledge_range`); an immediate, not-applied result
        when it is not held."""
        refused = self.acknowledge_range(tp, offset, offset, type)
        return AckResult(tp[0], tp[1], offset, refused[0].type, refused[0].error_code) if refused else None

    def pending_count(self) -> int:
        return sum(la - f + 1 for acks in self._pending.values() for f, la, t in acks if t != AckType.GAP)

    @property
    def has_pending(self) -> bool:
        return any(self._pending.values())

    def _take_pending(self, tps: Iterable[TopicPartition] | None, *, renew: bool) -> dict[
            TopicPartition, list[AckRun]]:
        taken: dict[TopicPartition, list[AckRun]] = {}
        for tp in list(self._pending) if tps is None else [tp for tp in tps if tp in self._pending]:
            acks = self._pending[tp]
            chosen = [(f, la, t) for f, la, t in acks if renew or t != AckType.RENEW]
            if chosen:
                taken[tp] = chosen
                if len(chosen) == len(acks.runs):
                    acks.clear()
                else:
                    for f, la, _ in chosen:
                        acks.remove(f, la)
            if not acks:
                del self._pending[tp]
        return taken

    # -- requests -------------------------------------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self._in_flight is not None:
            raise SessionError("a request of this share session is still in flight")
        if self.closed:
            raise SessionError("the share session is closed")

    def build_fetch(self, *, max_wait_ms: int, min_bytes: int = 1, max_bytes: int = 0x7FFFFFFF,
                    max_records: int = 500, batch_size: int = 500, record_limit: bool = False) -> Any:
        """The next ShareFetch: partitions added and forgotten, with the acknowledgements it can carry (not on a
        session's opening request, which may carry none; renewals travel in ShareAcknowledge).

        ``record_limit`` (ShareFetch v2+): acquire at most ``max_records`` records, splitting batches; otherwise
        the broker may hand out whole batches beyond it, so one member can take what several could share."""
        self._check_idle()
        if self._closing:
            raise SessionError("the share session is closing")
        if self.epoch == INITIAL_EPOCH:
            added, forgotten = set(self._wanted), set()
            acks: dict[TopicPartition, list[AckRun]] = {}
        else:
            added, forgotten = self._wanted - self._session, self._session - self._wanted
            acks = self._take_pending(self._wanted & self._session, renew=False)
        self._session = set(self._wanted)
        self._in_flight = _InFlight("fetch", acks)
        topics: dict[uuid.UUID, list[Any]] = {}
        for tp in sorted(added | set(acks)):
            batches = [_FetchBatch(first_offset=f, last_offset=la, acknowledge_types=t)
                       for f, la, t in run_batches(acks.get(tp, ()))]
            topics.setdefault(tp[0], []).append(_FetchPartition(partition_index=tp[1],
                                                                acknowledgement_batches=batches))
        gone: dict[uuid.UUID, list[int]] = {}
        for tid, p in sorted(forgotten):
            gone.setdefault(tid, []).append(p)
        return M.ShareFetchRequest(
            group_id=self.group_id, member_id=self.member_id, share_session_epoch=self.epoch,
            max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, max_records=max_records,
            batch_size=batch_size, share_acquire_mode=1 if record_limit else 0,
            topics=[_FetchTopic(topic_id=tid, partitions=parts) for tid, parts in topics.items()],
            forgotten_topics_data=[_Forgotten(topic_id=tid, partitions=ps) for tid, ps in gone.items()])

    def build_acknowledge(self) -> Any | None:
        """A ShareAcknowledge with every queued acknowledgement, or None (nothing queued, or no session yet:
        a session cannot be opened by ShareAcknowledge)."""
        self._check_idle()
        if self.epoch == INITIAL_EPOCH or not self.has_pending:
            return None
        acks = self._take_pending(None, renew=True)
        self._in_flight = _InFlight("ack", acks)
        return self._ack_request(acks, self.epoch)

    def close(self, *, release: bool = True) -> None:
        """Stop fetching; with ``release`` every record still held is released (redelivered at once, not after
        its lock). The closing ShareAcknowledge comes from :meth:`build_close`."""
        self._closing = True
        self._wanted = set()
        if release:
            for tp, held in self._acquired.items():
                if held:
                    pending = self._pend(tp)
                    for f, la, _ in held:
                        pending.assign(f, la, AckType.RELEASE)
                held.clear()

    def build_close(self) -> Any | None:
        """The ShareAcknowledge with epoch -1 that ends the session (with the acknowledgements still queued), or
        None when there is no session on the broker."""
        self._check_idle()
        if not self._closing:
            raise SessionError("close() first")
        if self.epoch == INITIAL_EPOCH:
            self.closed = True
            return None
        acks = self._take_pending(None, renew=False)
        self._take_pending(None, renew=True)  # renewals are moot now
        self._in_flight = _InFlight("close", acks)
        return self._ack_request(acks, FINAL_EPOCH)

    def _ack_request(self, acks: dict[TopicPartition, list[AckRun]], epoch: int) -> Any:
        topics: dict[uuid.UUID, list[Any]] = {}
        for tp in sorted(acks):
            batches = [_AckBatch(first_offset=f, last_offset=la, acknowledge_types=t)
                       for f, la, t in run_batches(acks[tp])]
            topics.setdefault(tp[0], []).append(_AckPartition(partition_index=tp[1],
                                                              acknowledgement_batches=batches))
        renew = any(t == AckType.RENEW for a in acks.values() for _, _, t in a)
        return M.ShareAcknowledgeRequest(
            group_id=self.group_id, member_id=self.member_id, share_session_epoch=epoch, is_renew_ack=renew,
            topics=[_AckTopic(topic_id=tid, partitions=parts) for tid, parts in topics.items()])

    # -- answers --------------------------------------------------------------------------------------------------
    def _results(self, acks: dict[TopicPartition, list[AckRun]], codes: dict[TopicPartition, int],
                 default: int, now: float) -> list[AckResult]:
        out = []
        for tp, runs in acks.items():
            code = codes.get(tp, default)
            for first, last, type in sorted(runs):
                if type == AckType.GAP:
                    continue
                if type == AckType.RENEW:
                    held = self._acquired.get(tp)
                    if held is not None:
                        if code == EC.NONE:
                            deadline = now + self.lock_timeout_ms / 1000
                            for f, la, (c, _) in held.pieces(first, last):
                                held.assign(f, la, (c, deadline))
                        else:  # the broker does not hold them for us any more
                            held.remove(first, last)
                out.append(AckResult(tp[0], tp[1], first, type, code, last))
        return out

    def _reset(self) -> list[AckResult]:
        """The broker lost the session: a new one starts at epoch 0, the records held are gone (the broker
        releases them with the session), and the acknowledgements queued for them cannot apply."""
        self.epoch = INITIAL_EPOCH
        self._session = set()
        lost = self._pending
        self._pending = {}
        self._acquired = {}
        return [AckResult(tp[0], tp[1], f, t, EC.SHARE_SESSION_NOT_FOUND, la)
                for tp, acks in lost.items() for f, la, t in acks if t != AckType.GAP]

    def _finish(self, kind: str) -> _InFlight:
        flight = self._in_flight
        if flight is None or flight.kind != kind:
            raise SessionError(f"no {kind} request in flight")
        self._in_flight = None
        return flight

    def handle_fetch_response(self, resp: Any, now: float) -> FetchOutcome:
        flight = self._finish("fetch")
        code = resp.error_code
        if code != EC.NONE:
            results = self._results(flight.acks, {}, code, now)
            if code in SESSION_LOST:
                results += self._reset()
                return FetchOutcome(code, resp.error_message, [], results, session_reset=True)
            self.epoch = next_epoch(self.epoch)
            return FetchOutcome(code, resp.error_message, [], results)
        self.epoch = next_epoch(self.epoch)
        self.lock_timeout_ms = resp.acquisition_lock_timeout_ms
        lock = self.lock_timeout_ms / 1000
        codes: dict[TopicPartition, int] = {}
        parts = []
        for t in resp.responses:
            for p in t.partitions:
                tp = (t.topic_id, p.partition_index)
                codes[tp] = p.acknowledge_error_code
                ranges = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
                if ranges:
                    held = self._acquired.get(tp)
                    if held is None:
                        held = self._acquired[tp] = RunMap()
                    for first, last, count in ranges:
                        held.assign(first, last, (count, now + lock))
                leader = p.current_leader
                parts.append(FetchedPartition(t.topic_id, p.partition_index, p.error_code, p.error_message,
                                              p.records, ranges, leader.leader_id, leader.leader_epoch))
        return FetchOutcome(EC.NONE, None, parts, self._results(flight.acks, codes, NO_ANSWER, now))

    def handle_acknowledge_response(self, resp: Any, now: float) -> list[AckResult]:
        flight = self._in_flight
        if flight is None or flight.kind not in ("ack", "close"):
            raise SessionError("no acknowledge request in flight")
        self._in_flight = None
        code = resp.error_code
        if flight.kind == "close":
            self.closed = True
            self._acquired = {}
        if code != EC.NONE:
            results = self._results(flight.acks, {}, code, now)
            if code in SESSION_LOST and not self.closed:
                results += self._reset()
            elif not self.closed:
                self.epoch = next_epoch(self.epoch)
            return results
        if not self.closed:
            self.epoch = next_epoch(self.epoch)
        if getattr(resp, "acquisition_lock_timeout_ms", 0):
            self.lock_timeout_ms = resp.acquisition_lock_timeout_ms
        codes = {(t.topic_id, p.partition_index): p.error_code for t in resp.responses for p in t.partitions}
        return self._results(flight.acks, codes, NO_ANSWER, now)

    def request_failed(self) -> list[AckResult]:
        """The request in flight got no answer (connection lost, timeout): its acknowledgements are reported
        not applied, and the next request opens a new session (which makes the broker drop the old one and
        release what it held)."""
        flight = self._in_flight
        self._in_flight = None
        results = []
        if flight is not None:
            for tp, acks in flight.acks.items():
                results += [AckResult(tp[0], tp[1], f, t, NO_ANSWER, la) for f, la, t in sorted(acks)
                            if t != AckType.GAP]
            if flight.kind == "close":
                self.closed = True
        return results + self._reset()
