"""The producer's state, without I/O: per-partition queues, batches, idempotence sequences, retries.

The asyncio driver (:mod:`service.producer.producer`) asks this object what to send, sends it, and
reports what the broker answered; every decision (what goes in a batch, which sequence it carries,
whether an answer means success, retry, split, producer-id reset or failure, when records expire) is
made here, so it is unit-tested without sockets.

Rules:

- **Ordering**: at most one batch per partition is in flight or waiting for a retry; records that arrive
  meanwhile queue behind it and form the next batch (so concurrent callers share batches).
- **Idempotence** (KIP-98): a producer id and epoch from InitProducerId; per partition a sequence that
  a batch takes when it is first drained (``base_sequence``) and keeps, bytes unchanged, on every retry.
  A batch the broker definitely did not write (an error answer) gives its sequences back when it fails;
  one whose outcome is unknown (a lost connection or a timeout on some attempt) cannot, so its final
  failure resets the producer id (new id, all sequences from 0) once nothing is in flight.
- **Answers**: ``NONE`` → success at ``base_offset + i``; ``DUPLICATE_SEQUENCE_NUMBER`` → success (the
  broker has the batch; offset unknown, -1); ``UNKNOWN_PRODUCER_ID``, ``OUT_OF_ORDER_SEQUENCE_NUMBER``,
  ``INVALID_PRODUCER_EPOCH``, ``PRODUCER_FENCED`` → the broker rejected this attempt and its producer
  state for us is not what we think: reset the producer id and send the batch again under the new one
  (at most ``max_producer_id_resets`` times per batch); ``MESSAGE_TOO_LARGE``/``RECORD_LIST_TOO_LARGE``
  with more than one record → split in halves and resend; a retriable code (Kafka's classification) →
  send the same batch again after a backoff, refreshing metadata first for leadership errors; anything
  else → the records fail with that code.
- **Delivery timeout**: a record not acknowledged ``delivery_timeout`` after it was queued fails with a
  retriable REQUEST_TIMED_OUT (checked while queued and after each answer; an attempt in flight is bounded
  by the request timeout). A failed record never holds up later ones.
- While a producer-id reset is pending nothing new is sent; in-flight batches finish first. At the reset,
  a batch waiting for a retry whose outcome is unknown fails (retriable, "may have been written") rather
  than being sent again under the new producer id, which could store it twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from service.producer import encoding
from service.producer.encoding import encode_run_batch
from service.producer.errors import (
    NETWORK_EXCEPTION,
    REQUEST_TIMED_OUT,
    ProduceFailure,
    ProduceResult,
    RecordMetadata,
    failure,
)
from service.protocol import error_codes as EC
from service.protocol.error_codes import describe
from service.protocol.records import Compression

TP = tuple[str, int]

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
PRODUCER_FENCED = 90
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
_RESET_CODES = frozenset({OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID, PRODUCER_FENCED})
_SPLIT_CODES = frozenset({MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE})
INT32_MAX = 2**31 - 1
RECORD_OVERHEAD = 24  # a record's framing (length, attributes, deltas, lengths), roughly


@dataclass(frozen=True)
class ProducerConfig:
    """Producer settings (Java producer property names in the comments)."""

    idempotent: bool = True  # enable.idempotence; acks are always all (-1)
    compression: int = Compression.NONE  # compression.type
    linger_ms: float = 0.0  # linger.ms: 0 = send as soon as the partition has nothing in flight
    max_batch_bytes: int = 1_000_000  # batch.size / message.max.bytes: uncompressed records per batch
    max_request_bytes: int = 8 * 1024 * 1024  # max.request.size: batches per Produce request
    request_timeout_ms: int = 30_000  # request.timeout.ms (also the broker-side ack timeout)
    delivery_timeout_ms: int = 60_000  # delivery.timeout.ms: queued → acknowledged or failed
    retry_backoff_ms: int = 100  # retry.backoff.ms (doubles per attempt)
    retry_backoff_max_ms: int = 1_000  # retry.backoff.max.ms
    # Produce requests in flight per broker (each on a connection of its own). 1: the next request leaves when
    # the previous one is answered, carrying every partition's records queued meanwhile (HTTP A/B,
    # 0.26 instead of 0.48 requests per 100-record POST, less CPU per record in the gateway and the broker)
    max_in_flight_per_broker: int = 1
    buffer_bytes: int = 64 * 1024 * 1024  # buffer.memory: send_many waits while this much is queued
    # records without a key stick to one partition for this many bytes (64 KiB rather than Java's
    # 16 KiB batch.size: a request carries ~1.7 batches instead of ~3 under load; librdkafka sticks for 10 ms)
    sticky_bytes: int = 65_536
    metadata_max_age_ms: int = 300_000  # metadata.max.age.ms
    max_producer_id_resets: int = 3  # per batch, before its records fail

    def __post_init__(self) -> None:
        if self.max_batch_bytes < 1 or self.max_request_bytes < self.max_batch_bytes:
            raise ValueError("max_batch_bytes must be >= 1 and <= max_request_bytes")
        if self.delivery_timeout_ms <= 0 or self.request_timeout_ms <= 0:
            raise ValueError("timeouts must be > 0")
        if self.max_in_flight_per_broker < 1:
            raise ValueError("max_in_flight_per_broker must be >= 1")
        Compression(self.compression)


def parse_compression(name: str | int) -> int:
    """``none|gzip|snappy|lz4|zstd`` (any case) or a Compression value."""
    if isinstance(name, int):
        return int(Compression(name))
    try:
        return int(Compression[name.strip().upper()])
    except KeyError:
        raise ValueError(f"unknown compression {name!r}; use none, gzip, snappy, lz4 or zstd") from None


#: the result of a record acknowledged within Delivery.offsets (see Delivery.metadata)
ACKED = RecordMetadata(-1, -1)


class Delivery:
    """The results of one ``send_many`` call, filled as records are acknowledged or fail."""

    __slots__ = ("failed", "offsets", "on_done", "remaining", "results")

    def __init__(self, n: int, on_done: Callable[[], None] | None = None) -> None:
        self.results: list[ProduceResult | None] = [None] * n
        self.remaining = n
        self.failed = 0  # results that are ProduceFailure (successes are written in place, in bulk)
        self.on_done = on_done
        # when a list (Producer.submit): acknowledged runs of consecutive records as (first index, partition,
        # base offset, count), their results left ACKED, instead of a RecordMetadata per record
        self.offsets: list[tuple[int, int, int, int]] | None = None

    def metadata(self) -> list[ProduceResult]:
        """The results with a RecordMetadata for every record of the acknowledged runs."""
        res = self.results
        if self.offsets:
            for first, p, off, n in self.offsets:
                res[first:first + n] = encoding.metas(RecordMetadata, p, off, n)
            self.offsets = []
        return res  # type: ignore[return-value]  # all set when done

    def resolve(self, index: int, result: ProduceResult) -> None:
        if self.results[index] is not None:
            return  # never twice (defensive: a record is resolved exactly once by construction)
        self.results[index] = result
        if type(result) is not RecordMetadata:
            self.failed += 1
        self.remaining -= 1
        if self.remaining == 0 and self.on_done is not None:
            self.on_done()

    @property
    def done(self) -> bool:
        return self.remaining == 0


class Run(NamedTuple):
    """Consecutive queued records of one ``send_many`` call for one partition (the unit the queues, batches
    and answers handle, so that nothing is done per record in Python on the hot path)."""

    records: list[tuple[Any, ...]]  # (key, value, headers, partition, timestamp | None), what the encoder reads
    indices: Sequence[int]  # each record's position in ``delivery`` (a range when they are consecutive)
    timestamp: int  # ms: the timestamp of records whose own is None
    delivery: Delivery
    size: int  # the sum of the records' record_size
    enqueued: float

    def cut(self, k: int, size: int) -> tuple[Run, Run]:
        """The first ``k`` records (of ``size`` bytes) and the rest."""
        return (Run(self.records[:k], self.indices[:k], self.timestamp, self.delivery, size, self.enqueued),
                Run(self.records[k:], self.indices[k:], self.timestamp, self.delivery, self.size - size,
                    self.enqueued))


def _pieces(run: Run, limit: int) -> list[Run]:
    """``run`` cut into consecutive runs of at most ``limit`` bytes each (at least one record each)."""
    out: list[Run] = []
    records, indices = run.records, run.indices
    start = size = 0
    for i, rec in enumerate(records):
        rs = record_size(rec[0], rec[1], rec[2])
        if i > start and size + rs > limit:
            out.append(Run(records[start:i], indices[start:i], run.timestamp, run.delivery, size, run.enqueued))
            start, size = i, 0
        size += rs
    if start < len(records):
        out.append(Run(records[start:], indices[start:], run.timestamp, run.delivery, size, run.enqueued))
    return out


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    size = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    for hk, hv in headers:
        size += len(hk) + (len(hv) if hv is not None else 0) + 4
    return size


@dataclass(eq=False)
class ProducerBatch:
    tp: TP
    runs: list[Run]
    count: int  # records
    size: int
    created: float  # when its oldest record was queued (the delivery timeout counts from there)
    base_sequence: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    payload: bytes | None = None  # the encoded batch; kept unchanged across retries
    attempts: int = 0
    retry_at: float = 0.0
    ambiguous: bool = False  # some attempt ended without an answer: the broker may have written it
    producer_id_resets: int = 0
    last_error: ProduceFailure | None = None


@dataclass(eq=False)
class PartitionState:
    queue: deque[Run] = field(default_factory=deque)
    queued_bytes: int = 0
    in_flight: ProducerBatch | None = None
    retry: ProducerBatch | None = None
    next_sequence: int = 0
    split_cap: int = 0  # after a split: records per batch while split_left > 0
    split_left: int = 0


class Outcome(NamedTuple):
    """What the driver must do after an answer."""

    refresh_metadata: bool = False
    reset_producer_id: bool = False


def increment_sequence(seq: int, n: int) -> int:
    """Kafka's sequences wrap from INT32_MAX to 0."""
    return (seq + n) % (INT32_MAX + 1)


class Accumulator:
    def __init__(self, config: ProducerConfig | None = None) -> None:
        self.config = config or ProducerConfig()
        self.parts: dict[TP, PartitionState] = {}
        self.queued_bytes = 0
        self.queued_records = 0
        self.in_flight = 0  # batches in flight
        self.producer_id = -1
        self.producer_epoch = -1
        # Idempotent: nothing is sent before the first InitProducerId answer.
        self.needs_producer_id = self.config.idempotent
        self._candidates: set[TP] = set()  # partitions with a queue or a retry and nothing in flight
        self.producer_id_resets = 0
        self.batches_sent = 0

    # -- queueing ------------------------------------------------------------------------------------
    def append(self, tp: TP, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
               timestamp: int, delivery: Delivery, index: int, now: float) -> None:
        size = record_size(key, value, headers)
        self.extend(tp, Run([(key, value, headers, tp[1], timestamp)], [index], timestamp, delivery, size, now))

    def extend(self, tp: TP, run: Run) -> None:
        """Queue ``run`` (after what is queued) for ``tp``."""
        st = self.parts.get(tp)
        if st is None:
            st = self.parts[tp] = PartitionState()
        st.queue.append(run)
        size = run.size
        st.queued_bytes += size
        self.queued_bytes += size
        self.queued_records += len(run.records)
        if st.in_flight is None:
            self._candidates.add(tp)

    @property
    def empty(self) -> bool:
        return self.queued_records == 0 and self.in_flight == 0 and not any(
            st.retry is not None for st in self.parts.values())

    # -- what to send ------------------------------------------------------------------------------------
    def ready(self, now: float) -> tuple[list[TP], float | None]:
        """Partitions with a batch to send now, and the earliest time another one becomes ready (a retry
        backoff or a linger ending), if any."""
        if self.needs_producer_id:
            return [], None
        out: list[TP] = []
        wake: float | None = None
        linger = self.config.linger_ms / 1000
        drop: list[TP] = []
        for tp in self._candidates:
            st = self.parts[tp]
            if st.in_flight is not None:
                drop.append(tp)
                continue
            if st.retry is not None:
                at = st.retry.retry_at
            elif st.queue:
                at = st.queue[0].enqueued + linger if linger and st.queued_bytes < self.config.max_batch_bytes else now
            else:
                drop.append(tp)
                continue
            if at <= now:
                out.append(tp)
            elif wake is None or at < wake:
                wake = at
        for tp in drop:
            self._candidates.discard(tp)
        return out, wake

    def next_batch(self, tp: TP, now: float, max_bytes: int | None = None) -> ProducerBatch | None:
        """Take the partition's next batch (its retry, else up to ``max_batch_bytes`` of queued records,
        at least one) and mark it in flight; None if there is nothing to send."""
        st = self.parts[tp]
        if st.in_flight is not None:
            return None
        b = st.retry
        if b is not None:
            st.retry = None
            if self.config.idempotent and b.base_sequence >= 0 and b.producer_id != self.producer_id:
                # Sequenced under an older producer id (defensive: set_producer_id re-sequences retries).
                if b.ambiguous:
                    self._fail_runs(b.runs, ProduceFailure(
                        NETWORK_EXCEPTION, "the producer id changed before these records could be sent again "
                        "after an attempt with an unknown outcome; they may have been written", True, tp[1]))
                    self._candidates.add(tp)
                    return None
                b.base_sequence = -1
        else:
            if not st.queue:
                return None
            limit = self.config.max_batch_bytes if max_bytes is None else min(max_bytes, self.config.max_batch_bytes)
            cap = st.split_cap if st.split_left > 0 else -1
            runs: list[Run] = []
            size = 0
            count = 0
            q = st.queue
            while q:
                run = q[0]
                n = len(run.records)
                if size + run.size <= limit and (cap < 0 or count + n <= cap):
                    runs.append(q.popleft())
                    size += run.size
                    count += n
                    continue
                # the run does not fit whole: take the records that do (at least one per batch)
                room = n if cap < 0 else cap - count
                k = taken = 0
                for rec in run.records[:room]:
                    rs = record_size(rec[0], rec[1], rec[2])
                    if (count or k) and size + taken + rs > limit:
                        break
                    taken += rs
                    k += 1
                if k:
                    head, rest = run.cut(k, taken)
                    runs.append(head)
                    size += taken
                    count += k
                    # the rest, cut once into batch-sized runs (cutting a long run batch by batch would copy
                    # its tail every time)
                    q.popleft()
                    q.extendleft(reversed(_pieces(rest, self.config.max_batch_bytes)))
                break
            if st.split_left > 0:
                st.split_left = max(0, st.split_left - count)
            st.queued_bytes -= size
            self.queued_bytes -= size
            self.queued_records -= count
            b = ProducerBatch(tp, runs, count, size, runs[0].enqueued)
        if self.config.idempotent and b.base_sequence < 0:
            b.base_sequence = st.next_sequence
            b.producer_id = self.producer_id
            b.producer_epoch = self.producer_epoch
            st.next_sequence = increment_sequence(st.next_sequence, b.count)
            b.payload = None
        if b.payload is None:
            b.payload = encode_run_batch([(r.records, r.timestamp) for r in b.runs], producer_id=b.producer_id,
                                         producer_epoch=b.producer_epoch, base_sequence=b.base_sequence,
                                         compression=self.config.compression)
        b.attempts += 1
        st.in_flight = b
        self.in_flight += 1
        self.batches_sent += 1
        self._candidates.discard(tp)
        return b

    # -- answers ---------------------------------------------------------------------------------------
    def _landed(self, b: ProducerBatch) -> PartitionState | None:
        st = self.parts[b.tp]
        if st.in_flight is not b:
            return None  # already failed (fail_all at shutdown)
        st.in_flight = None
        self.in_flight -= 1
        if st.queue or st.retry is not None:
            self._candidates.add(b.tp)
        return st

    def on_response(self, b: ProducerBatch, code: int, base_offset: int, now: float,
                    message: str | None = None, completed: list[Delivery] | None = None) -> Outcome:
        """The broker answered for this batch's partition. ``completed``: a successful answer's completed
        deliveries are appended to it, their callbacks left to the caller (Producer: after it sent the next
        request), instead of being called here."""
        st = self._landed(b)
        if st is None:
            return Outcome()
        p = b.tp[1]
        if code == 0 or code == DUPLICATE_SEQUENCE_NUMBER:
            # the hot path: results written in place, callbacks once per completed delivery
            new = tuple.__new__
            known = code == 0 and base_offset >= 0
            off = base_offset
            dup = new(RecordMetadata, (p, -1))
            deferred = completed is not None
            if completed is None:
                completed = []
            for run in b.runs:
                d = run.delivery
                res = d.results
                idx = run.indices
                n = len(idx)
                contiguous = type(idx) is range and idx.step == 1 and res[idx.start:idx.stop].count(None) == n
                if known and contiguous and d.offsets is not None:
                    d.offsets.append((idx.start, p, off, n))  # type: ignore[attr-defined]  # contiguous: a range; no object per record
                    res[idx.start:idx.stop] = [ACKED] * n  # type: ignore[attr-defined]  # contiguous: idx is a range
                    d.remaining -= n
                    off += n
                    if d.remaining == 0:
                        completed.append(d)
                    continue
                if known:
                    metas = encoding.metas(RecordMetadata, p, off, n)
                    off += n
                else:
                    metas = [dup] * n
                if contiguous:
                    res[idx.start:idx.stop] = metas  # type: ignore[attr-defined]  # contiguous: idx is a range
                    d.remaining -= n
                else:  # scattered (keyed records) or, defensively, partly resolved already
                    for i, m in zip(idx, metas, strict=True):
                        if res[i] is None:
                            res[i] = m
                            d.remaining -= 1
                if d.remaining == 0:
                    completed.append(d)
            if not deferred:
                for d in completed:
                    if d.on_done is not None:
                        d.on_done()
            return Outcome()
        err = failure(code, message or "", p)
        b.last_error = err
        if code in _RESET_CODES and self.config.idempotent:
            # This attempt was rejected: the broker's producer state for us is not what we think (lost
            # after a restart or retention, or out of step). Resend under a new producer id.
            b.producer_id_resets += 1
            if b.producer_id_resets <= self.config.max_producer_id_resets and not self._expired(b, now):
                b.ambiguous = False  # a definite rejection; an earlier attempt would have been a duplicate
                self._requeue_for_new_id(st, b)
            else:
                self._fail_batch(st, b, err._replace(retriable=False), rejected=True)
            self.needs_producer_id = True
            return Outcome(reset_producer_id=True)
        if code in _SPLIT_CODES and b.count > 1:
            self._split(st, b)
            return Outcome()
        refresh = code in EC.METADATA_REFRESH_CODES
        if describe(code).retriable or refresh:
            if self._expired(b, now):
                self._fail_batch(st, b, err._replace(retriable=True), rejected=True)
                return Outcome(refresh_metadata=refresh, reset_producer_id=self._reset_if_ambiguous(b))
            self._retry(st, b, now)
            return Outcome(refresh_metadata=refresh)
        self._fail_batch(st, b, err, rejected=True)
        return Outcome(reset_producer_id=self._reset_if_ambiguous(b))

    def on_request_error(self, b: ProducerBatch, now: float, message: str, *, retriable: bool = True,
                         ambiguous: bool = True) -> Outcome:
        """The request carrying this batch got no answer (connection lost, timeout, ...). ``ambiguous``:
        the request may have reached the broker (False when it was never sent, e.g. no connection)."""
        st = self._landed(b)
        if st is None:
            return Outcome()
        if ambiguous:
            b.ambiguous = True
        code = NETWORK_EXCEPTION
        err = failure(code, message + ("; the records may have been written" if b.ambiguous else ""), b.tp[1],
                      retriable=retriable)
        b.last_error = err
        if retriable and not self._expired(b, now):
            self._retry(st, b, now)
            return Outcome(refresh_metadata=True)
        self._fail_batch(st, b, err, rejected=True)
        return Outcome(refresh_metadata=True, reset_producer_id=self._reset_if_ambiguous(b))

    # -- timeouts ----------------------------------------------------------------------------------------
    def _expired(self, b: ProducerBatch, now: float) -> bool:
        return now - b.created >= self.config.delivery_timeout_ms / 1000

    def expire(self, now: float) -> tuple[bool, float | None]:
        """Fail queued records and waiting retries older than the delivery timeout. Returns whether a
        producer-id reset is needed (an expired retry's outcome was unknown) and the next expiry time."""
        timeout = self.config.delivery_timeout_ms / 1000
        reset = False
        nxt: float | None = None
        for tp, st in self.parts.items():
            b = st.retry
            if b is not None:
                if now - b.created >= timeout:
                    st.retry = None
                    err = b.last_error or failure(REQUEST_TIMED_OUT, "", tp[1])
                    self._fail_runs(b.runs, self._timeout_failure(tp, b.count, err, b.ambiguous))
                    if self._reset_if_ambiguous(b):
                        reset = True
                    else:
                        self._give_back(st, b)
                else:
                    t = b.created + timeout
                    nxt = t if nxt is None or t < nxt else nxt
            q = st.queue
            if q:
                expired: list[Run] = []
                while q and now - q[0].enqueued >= timeout:
                    expired.append(q.popleft())
                if expired:
                    size = sum(r.size for r in expired)
                    count = sum(len(r.records) for r in expired)
                    st.queued_bytes -= size
                    self.queued_bytes -= size
                    self.queued_records -= count
                    st.split_left = max(0, st.split_left - count)
                    self._fail_runs(expired, self._timeout_failure(tp, count, None, False))
                if q:
                    t = q[0].enqueued + timeout
                    nxt = t if nxt is None or t < nxt else nxt
        return reset, nxt

    def _timeout_failure(self, tp: TP, n: int, last: ProduceFailure | None, ambiguous: bool) -> ProduceFailure:
        msg = (f"Expiring {n} record(s) for {tp[0]}-{tp[1]}: {self.config.delivery_timeout_ms} ms has passed "
               "since they were queued")
        if last is not None:
            msg += f"; last error: {last.message}"
        if ambiguous and "may have been written" not in msg:
            msg += "; the records may have been written"
        return ProduceFailure(REQUEST_TIMED_OUT, msg, True, tp[1])

    # -- producer id ---------------------------------------------------------------------------------------
    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id (first one, or after a reset): every partition's sequence starts at 0;
        waiting retries are re-sequenced, except those that may have been written already (they fail)."""
        first = self.producer_id < 0
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.needs_producer_id = False
        if not first:
            self.producer_id_resets += 1
        for tp, st in self.parts.items():
            st.next_sequence = 0
            b = st.retry
            if b is None:
                continue
            if b.ambiguous:
                st.retry = None
                msg = ("the producer id was reset while these records waited for a retry after an attempt "
                       "with an unknown outcome; they may have been written")
                if b.last_error is not None:
                    msg += f" (last error: {b.last_error.message})"
                self._fail_runs(b.runs, ProduceFailure(NETWORK_EXCEPTION, msg, True, tp[1]))
            else:
                b.base_sequence = -1
                b.payload = None

    def _reset_if_ambiguous(self, b: ProducerBatch) -> bool:
        """A batch that may have been written failed: the broker's next expected sequence is unknown."""
        if b.ambiguous and self.config.idempotent:
            self.needs_producer_id = True
            return True
        return False

    def request_producer_id_reset(self) -> None:
        if self.config.idempotent:
            self.needs_producer_id = True

    # -- helpers ---------------------------------------------------------------------------------------
    def _retry(self, st: PartitionState, b: ProducerBatch, now: float) -> None:
        cfg = self.config
        backoff = min(cfg.retry_backoff_max_ms, cfg.retry_backoff_ms * (2 ** min(b.attempts - 1, 16))) / 1000
        b.retry_at = now + backoff
        st.retry = b
        self._candidates.add(b.tp)

    def _requeue_for_new_id(self, st: PartitionState, b: ProducerBatch) -> None:
        b.retry_at = 0.0
        b.base_sequence = -1  # sequenced again under the new producer id
        b.payload = None
        st.retry = b
        self._candidates.add(b.tp)

    def _split(self, st: PartitionState, b: ProducerBatch) -> None:
        """Too large for the broker: put the records back in front, to go out in halves."""
        self._give_back(st, b)
        st.queue.extendleft(reversed(b.runs))
        st.queued_bytes += b.size
        self.queued_bytes += b.size
        self.queued_records += b.count
        st.split_cap = max(1, b.count // 2)
        st.split_left = b.count
        self._candidates.add(b.tp)

    def _give_back(self, st: PartitionState, b: ProducerBatch) -> None:
        """The broker did not write ``b``: its sequences are free again (nothing after it was drained)."""
        if self.config.idempotent and b.base_sequence >= 0 and b.producer_id == self.producer_id:
            st.next_sequence = b.base_sequence

    def _fail_batch(self, st: PartitionState, b: ProducerBatch, err: ProduceFailure, *, rejected: bool) -> None:
        if rejected and not b.ambiguous:
            self._give_back(st, b)
        self._fail_runs(b.runs, err)

    @staticmethod
    def _fail_runs(runs: Iterable[Run], err: ProduceFailure) -> None:
        for run in runs:
            resolve = run.delivery.resolve
            for i in run.indices:
                resolve(i, err)

    def fail_all(self, err: ProduceFailure, *, in_flight: bool = False) -> int:
        """Fail everything queued or waiting for a retry (and, with ``in_flight``, what is in flight: for
        a shutdown that gives up on answers). Returns the number of records failed."""
        n = 0
        for tp, st in self.parts.items():
            runs: list[Run] = list(st.queue)
            st.queue.clear()
            st.queued_bytes = 0
            st.split_left = 0
            if st.retry is not None:
                runs += st.retry.runs
                st.retry = None
            if in_flight and st.in_flight is not None:
                runs += st.in_flight.runs
                st.in_flight = None
                self.in_flight -= 1
            self._fail_runs(runs, err._replace(partition=tp[1]))
            n += sum(len(r.records) for r in runs)
        self.queued_bytes = 0
        self.queued_records = 0
        self._candidates.clear()
        return n

    def stats(self) -> dict[str, Any]:
        return {"queued_records": self.queued_records, "queued_bytes": self.queued_bytes,
                "in_flight": self.in_flight, "producer_id": self.producer_id,
                "producer_id_resets": self.producer_id_resets, "batches_sent": self.batches_sent}
