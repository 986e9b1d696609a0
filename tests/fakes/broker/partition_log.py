"""Partition logs of the test broker: stored record batches, offsets and transaction state (no I/O).

One :class:`PartitionLog` per topic-partition (``PartitionState.log``), single replica, so the high
watermark is the log end offset. It models what a Kafka leader's log offers to fetchers:

* batches are stored as magic-2 bytes (as :func:`service.protocol.records.build_batch` builds them);
  the log assigns the base offset and stamps the partition leader epoch (neither is covered by the
  CRC, so the batch is not re-encoded), and a topic with ``message.timestamp.type=LogAppendTime``
  gets the append time written in (CRC recomputed);
* transactional state: the first offset of every producer's ongoing transaction, the last stable
  offset (the first offset of the earliest ongoing transaction, else the high watermark) and an
  aborted-transaction index of ``(producer id, first offset, last offset)`` where the last offset is
  the ABORT marker's, kept in the order the markers were written (as Kafka's transaction index is, so
  it is not sorted by first offset);
* :meth:`PartitionLog.read` serves whole batches from the batch containing the fetch offset, up to
  an upper bound (high watermark or last stable offset) and a byte limit, returning the first batch
  even when it is larger than the limit if asked to (KIP-74). With ``partial`` it also appends the
  leading bytes of the batch that did not fit, as Kafka's byte-range reads do.

Every change (append, truncation) calls the log's notifier so delayed fetches re-check their data.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import crc32c as _crc32c

from service.protocol.errors import CorruptRecordError, UnsupportedMessageFormatError
from service.protocol.records import (
    NO_PRODUCER_ID,
    ControlType,
    RecordBatch,
    build_batch,
    build_control_batch,
    iter_batches,
)

__all__ = [
    "AbortedTxn",
    "ChangeNotifier",
    "InvalidBatchError",
    "PartitionLog",
    "StoredBatch",
    "TimestampOffset",
    "normalize_records",
    "parse_single_batch",
]

_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_POS = 12
_ATTRIBUTES_POS = 21
_MAX_TIMESTAMP_POS = 35
_CRC_POS = 17
_CRC_START = 21
_LOG_APPEND_TIME = 0x08


class InvalidBatchError(ValueError):
    """A batch the log refuses (not exactly one complete magic-2 batch, bad CRC, ...).

    ``error_code`` is what a Produce response would carry (CORRUPT_MESSAGE 2 or INVALID_RECORD 87).
    """

    def __init__(self, message: str, error_code: int = 87) -> None:
        super().__init__(message)
        self.error_code = error_code


class ChangeNotifier:
    """Wakes every waiter on :meth:`notify` (one per cluster: appends, truncations, leader moves)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.version = 0

    def notify(self) -> None:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next :meth:`notify` (True) or ``timeout`` seconds (False)."""
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int
    leader_epoch: int


@dataclass(slots=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    data: bytes
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    transactional: bool
    control: bool
    control_type: int | None
    max_timestamp: int
    leader_epoch: int

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def decode(self) -> RecordBatch:
        """The batch decoded by our codec (records included)."""
        batch = next(iter_batches(self.data))
        batch.decode()
        return batch


RecordLike = bytes | None | tuple[Any, ...]


def normalize_records(records: Iterable[RecordLike]) -> list[tuple[Any, ...]]:
    """Accept plain values (``b"v"`` → key None) or ``(key, value[, headers[, timestamp]])`` tuples."""
    out: list[tuple[Any, ...]] = []
    for r in records:
        if r is None or isinstance(r, (bytes, bytearray)):
            out.append((None, None if r is None else bytes(r)))
        else:
            out.append(tuple(r))
    if not out:
        raise ValueError("a batch needs at least one record")
    return out


class PartitionLog:
    """Stored batches and offsets of one partition (see the module docstring)."""

    def __init__(self, notifier: ChangeNotifier | None = None) -> None:
        self.notifier = notifier
        self.batches: list[StoredBatch] = []
        self._last_offsets: list[int] = []  # parallel to batches, for bisect
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedTxn] = []  # in marker order
        self.producer_epochs: dict[int, int] = {}
        # (producer id, producer epoch, base sequence) -> base offset, to answer a retried batch
        self.sequences: dict[tuple[int, int, int], int] = {}

    def __repr__(self) -> str:
        return (f"<PartitionLog start={self.log_start_offset} hw={self.high_watermark} lso={self.last_stable_offset} "
                f"batches={len(self.batches)} ongoing={self.ongoing} aborted={len(self.aborted)}>")

    # -- offsets -----------------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        return min(self.ongoing.values(), default=self.log_end_offset)

    @property
    def size_bytes(self) -> int:
        return sum(b.size for b in self.batches)

    def _changed(self) -> None:
        if self.notifier is not None:
            self.notifier.notify()

    # -- appending ---------------------------------------------------------------------------------
    def append_batch(self, raw: bytes, *, leader_epoch: int = 0, log_append_time: int | None = None,
                     verify_crc: bool = True, allow_empty: bool = False) -> StoredBatch:
        """Append one complete magic-2 batch (its base offset is replaced by the log end offset).

        A control batch (COMMIT/ABORT marker) ends its producer's transaction; a transactional data
        batch opens one if none is open. ``allow_empty``: accept a batch with records count 0 (what
        Kafka's log cleaner leaves of a batch whose records it removed, e.g. a transaction marker);
        such a batch changes no transaction state. Raises :class:`InvalidBatchError`.
        """
        batch = parse_single_batch(raw, verify_crc=verify_crc, allow_empty=allow_empty)
        data = bytearray(raw)
        base = self.log_end_offset
        _BASE_OFFSET.pack_into(data, 0, base)
        _LEADER_EPOCH.pack_into(data, _LEADER_EPOCH_POS, leader_epoch)
        max_ts = batch.max_timestamp
        if log_append_time is not None and not batch.is_control:
            attrs = batch.attributes | _LOG_APPEND_TIME
            struct.pack_into(">h", data, _ATTRIBUTES_POS, attrs)
            struct.pack_into(">q", data, _MAX_TIMESTAMP_POS, log_append_time)
            struct.pack_into(">I", data, _CRC_POS, _crc32c.crc32c(memoryview(data)[_CRC_START:]))
            max_ts = log_append_time
        control_type: int | None = None
        if batch.is_control:
            ctype = batch.control_type
            control_type = int(ctype) if ctype is not None else None
        stored = StoredBatch(
            base_offset=base, last_offset=base + batch.last_offset_delta, data=bytes(data),
            producer_id=batch.producer_id, producer_epoch=batch.producer_epoch, base_sequence=batch.base_sequence,
            records_count=batch.records_count, transactional=batch.is_transactional, control=batch.is_control,
            control_type=control_type, max_timestamp=max_ts, leader_epoch=leader_epoch,
        )
        pid = stored.producer_id
        if pid != NO_PRODUCER_ID:
            self.producer_epochs[pid] = max(self.producer_epochs.get(pid, stored.producer_epoch), stored.producer_epoch)
            if stored.base_sequence >= 0 and not stored.control:
                self.sequences[(pid, stored.producer_epoch, stored.base_sequence)] = base
        if stored.control and stored.records_count == 0:
            pass  # an empty (cleaned) control batch: no marker, no transaction state
        elif stored.control:
            first = self.ongoing.pop(pid, base)
            if control_type == ControlType.ABORT:
                self.aborted.append(AbortedTxn(pid, first, base))
        elif stored.transactional and pid != NO_PRODUCER_ID and stored.records_count:
            self.ongoing.setdefault(pid, base)
        self.batches.append(stored)
        self._last_offsets.append(stored.last_offset)
        self.log_end_offset = stored.last_offset + 1
        self._changed()
        return stored

    def append_records(self, records: Iterable[RecordLike], *, leader_epoch: int = 0, compression: int = 0,
                       producer_id: int = NO_PRODUCER_ID, producer_epoch: int = 0, base_sequence: int = -1,
                       transactional: bool = False, timestamp: int | None = None,
                       log_append_time: int | None = None) -> StoredBatch:
        """Build one batch of ``records`` (see :func:`normalize_records`) and append it."""
        rows = normalize_records(records)
        raw = build_batch(rows, compression=compression, producer_id=producer_id,
                          producer_epoch=producer_epoch if producer_id != NO_PRODUCER_ID else -1,
                          base_sequence=base_sequence, transactional=transactional, base_timestamp=timestamp)
        return self.append_batch(raw, leader_epoch=leader_epoch, log_append_time=log_append_time)

    def end_txn(self, producer_id: int, commit: bool, *, producer_epoch: int | None = None, leader_epoch: int = 0,
                coordinator_epoch: int = 0, timestamp: int | None = None) -> StoredBatch:
        """Write a COMMIT or ABORT marker for ``producer_id`` (as the transaction coordinator does)."""
        epoch = producer_epoch if producer_epoch is not None else self.producer_epochs.get(producer_id, 0)
        raw = build_control_batch(ControlType.COMMIT if commit else ControlType.ABORT, base_offset=0,
                                  producer_id=producer_id, producer_epoch=epoch, timestamp=timestamp,
                                  coordinator_epoch=coordinator_epoch)
        return self.append_batch(raw, leader_epoch=leader_epoch)

    def truncate_start(self, offset: int) -> None:
        """Move the log start offset forward (DeleteRecords / retention); whole batches below it go."""
        if offset > self.log_end_offset:
            raise ValueError(f"log start {offset} beyond the log end {self.log_end_offset}")
        if offset <= self.log_start_offset:
            return
        self.log_start_offset = offset
        keep = bisect.bisect_left(self._last_offsets, offset)
        del self.batches[:keep]
        del self._last_offsets[:keep]
        self.aborted = [a for a in self.aborted if a.last_offset >= offset]
        self._changed()

    # -- reading -----------------------------------------------------------------------------------
    def batch_index(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset`` (len(batches) if none)."""
        return bisect.bisect_left(self._last_offsets, offset)

    def read(self, fetch_offset: int, max_bytes: int, upper_bound: int, *, min_one: bool = False,
             partial: bool = False) -> tuple[list[StoredBatch], bytes]:
        """Whole batches from the one containing ``fetch_offset``, all below ``upper_bound``, within
        ``max_bytes`` (``min_one``: the first batch even if larger). Returns (batches, wire bytes); with
        ``partial`` the bytes may end with the leading part of the next batch (never in ``batches``)."""
        out: list[StoredBatch] = []
        total = 0
        tail = b""
        for i in range(self.batch_index(fetch_offset), len(self.batches)):
            b = self.batches[i]
            if b.base_offset >= upper_bound:
                break
            if total + b.size > max_bytes and not (min_one and not out):
                room = max_bytes - total
                if partial and room > 0:
                    tail = b.data[:room]
                break
            out.append(b)
            total += b.size
        return out, b"".join(b.data for b in out) + tail

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets [start, end) (last offset >= start, first < end)."""
        return [a for a in self.aborted if a.last_offset >= start and a.first_offset < end]

    def offset_for_timestamp(self, timestamp: int, upper_bound: int | None = None) -> TimestampOffset | None:
        """The first record whose timestamp is >= ``timestamp`` (below ``upper_bound``), else None."""
        for b in self.batches:
            if b.max_timestamp < timestamp:
                continue
            batch = b.decode()
            for r in batch.records or ():
                if r.offset < self.log_start_offset:
                    continue
                if r.timestamp >= timestamp:
                    if upper_bound is not None and r.offset >= upper_bound:
                        return None
                    return TimestampOffset(r.timestamp, r.offset, b.leader_epoch)
        return None

    def max_timestamp_offset(self) -> TimestampOffset | None:
        """The record with the largest timestamp (the first of equals), else None."""
        best: TimestampOffset | None = None
        for b in self.batches:
            if best is not None and b.max_timestamp <= best.timestamp:
                continue
            for r in b.decode().records or ():
                if r.offset >= self.log_start_offset and (best is None or r.timestamp > best.timestamp):
                    best = TimestampOffset(r.timestamp, r.offset, b.leader_epoch)
        return best

    def epoch_at(self, offset: int) -> int:
        """Leader epoch of the batch holding ``offset`` (the last batch's for the log end), -1 if none."""
        i = self.batch_index(offset)
        if i < len(self.batches):
            return self.batches[i].leader_epoch
        return self.batches[-1].leader_epoch if self.batches else -1

    def records(self, *, include_control: bool = False) -> list[Any]:
        """Every stored record (decoded), for assertions."""
        out: list[Any] = []
        for b in self.batches:
            if b.control and not include_control:
                continue
            out.extend(r for r in b.decode().records or () if r.offset >= self.log_start_offset)
        return out


def parse_single_batch(raw: bytes, *, verify_crc: bool = True, allow_empty: bool = False) -> RecordBatch:
    """The one complete batch of ``raw`` (records count >= 1 unless ``allow_empty``); raises
    :class:`InvalidBatchError` otherwise."""
    try:
        it = iter_batches(raw, verify_crc=verify_crc)
        batches = list(it)
    except CorruptRecordError as exc:
        raise InvalidBatchError(str(exc), 2) from None  # CORRUPT_MESSAGE
    except UnsupportedMessageFormatError as exc:
        raise InvalidBatchError(str(exc)) from None
    if len(batches) != 1 or it.partial_bytes:
        raise InvalidBatchError(f"expected exactly one complete record batch, got {len(batches)} "
                                f"(+{it.partial_bytes} trailing bytes)")
    batch = batches[0]
    if batch.records_count < (0 if allow_empty else 1):
        raise InvalidBatchError("a record batch without records")
    return batch

