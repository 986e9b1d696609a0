"""Stateless offset-range reads of one partition (no consumer group, no position kept).

``read_page(client, tp, offset, end_offset, isolation_level, max_bytes)`` answers one page of the records of
``tp`` in ``[offset, end)`` where ``end = min(end_offset, limit)`` and ``limit`` is the last stable offset
under read_committed, else the high watermark (``end_offset=None``: ``end = limit``). A reader loops::

    page = read_page(..., offset=o, end_offset=e)
    ...                          # page.records
    o = page.next_offset         # offsets have gaps: compaction, control markers, aborted records
    until page.next_offset >= page.end_offset

Each page is one Fetch on a leased connection of the tenant's client with a 5 ms broker wait (Tansu answers
a 0 ms, min-bytes-0 fetch with no partitions), so it never parks behind, or holds up, other requests on the
shared connection. Where the broker has fetch sessions (KIP-227) a reader's pages go through one: the
client keeps idle one-partition sessions per (broker, partition) (:class:`RangeSessions`: at most
:data:`MAX_IDLE_SESSIONS` per client, dropped after :data:`SESSION_IDLE_S` idle seconds, so the broker's
session cache, which evicts small sessions first, is not crowded), and a page takes one exclusively (two
concurrent readers of one partition use two sessions, as epochs must follow each other). The next page of
a sequential reader is then an incremental request; an incremental answer that leaves the partition out
(nothing new, nothing changed) reads as an empty answer with the partition's last known watermarks, and a
session the broker no longer knows is replaced by a full request at once. Brokers without sessions
(Tansu answers session id 0) get full requests, as before.

Records are filtered by the pure :func:`service.fetch.read_committed.filter_batches` with the Fetch
response's aborted transactions (the ABORT/COMMIT control batches are skipped), cut at ``end``, and
trimmed to about ``max_bytes`` of keys + values (at least one record). A fetch that yields only control or
aborted batches is followed by another (up to :data:`MAX_ROUNDS`), so an empty page with ``next_offset <
end_offset`` is rare but legal. A fetch that brings nothing at all below ``end`` (a busy Tansu answers
within its wait before it has read the log) is asked again with a longer wait (5 ms x 4 per round, at most
:data:`MAX_RETRY_WAIT_MS`); only after :data:`MAX_ROUNDS` fetches is it a retriable error (503).

Decompression is bounded (:mod:`service.protocol.records`): a batch inflating past ``max_inflated`` (the
gateway's ``GATEWAY_MAX_BATCH_INFLATED_BYTES``) answers 422 / 42209 naming topic, partition and offset
(:class:`service.protocol.records.InflatedSizeError`, mapped by api/errors.py; batches before it are still
answered), and a page stops decoding once its batches inflated to ``max_bytes``, so one page holds at most
``max_bytes`` plus one batch however well the data compresses.

Limits: a broker without an aborted-transaction index (Tansu) returns aborted records that were flushed
before the abort, and a stateless read cannot take them back (the consumer engine only counts them).

:func:`to_arrow_ipc` renders a page as an Arrow IPC stream; :func:`arrow_table` builds the table (columns
topic (dictionary<int32, string>), partition (int32), offset (int64), timestamp (timestamp[ms]), key and
value (binary), headers (list<struct<key: string, value: binary>>)) from the decoded records with column
extraction in C (``map(itemgetter)``) and no Python object per record; header-less pages (the common case)
get their list offsets from a zero-filled buffer, others from a running sum over the header counts and flat
key / value columns (:func:`_headers_array`).
"""

from __future__ import annotations

import asyncio
import bisect
import operator
import weakref
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import Any

from service.client.client import KafkaClient
from service.client.errors import BrokerResponseError, KafkaError
from service.consumer.subscription import TopicPartition
from service.errors import GatewayError
from service.fetch.offsets import LEADER_RETRY_PAUSES, read_offsets
from service.fetch.oneshot import probe_fetch
from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED, filter_batches
from service.fetch.session import FetchSessionHandler
from service.protocol import error_codes as EC
from service.protocol.records import Record, decode_records

__all__ = [
    "ARROW_STREAM",
    "DEFAULT_MAX_BYTES",
    "MAX_MAX_BYTES",
    "MAX_ROUNDS",
    "OffsetOutOfRange",
    "RangePage",
    "RangeSessions",
    "arrow_schema",
    "arrow_table",
    "cut_page",
    "read_page",
    "to_arrow_ipc",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_MAX_BYTES = 52428800  # Kafka's fetch.max.bytes default
MAX_ROUNDS = 8  # fetches per page while they bring only control / aborted batches
FETCH_WAIT_MS = 5
MAX_RETRY_WAIT_MS = 500  # an empty answer below the end is asked again with a longer wait


class OffsetOutOfRange(GatewayError):
    """The offset is below the log start or above the high watermark: 422 / 42207, with the valid range in
    the message and in ``X-Log-Start-Offset`` / ``X-High-Watermark`` headers (when the broker told them)."""

    status = 422
    error_code = 42207


@dataclass(slots=True)
class RangePage:
    topic: str
    partition: int
    offset: int  # where this page was read from
    records: list[Record]
    next_offset: int  # where the next page starts
    end_offset: int  # min(requested end, LSO or high watermark): read until next_offset >= end_offset
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    fetches: int = 0
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.next_offset >= self.end_offset

    def headers(self) -> dict[str, str]:
        return {"X-Next-Offset": str(self.next_offset), "X-End-Offset": str(self.end_offset),
                "X-High-Watermark": str(self.high_watermark), "X-Last-Stable-Offset": str(self.last_stable_offset),
                "X-Log-Start-Offset": str(self.log_start_offset), "X-Record-Count": str(len(self.records))}

    def metadata(self) -> dict[str, str]:
        return {"topic": self.topic, "partition": str(self.partition), "offset": str(self.offset),
                "next_offset": str(self.next_offset), "end_offset": str(self.end_offset),
                "high_watermark": str(self.high_watermark), "last_stable_offset": str(self.last_stable_offset),
                "log_start_offset": str(self.log_start_offset)}


# -- pure paging -----------------------------------------------------------------------------------------
def _payload(r: Record) -> int:
    return (len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)


def cut_page(records: list[Record], next_offset: int, end: int, max_bytes: int | None = None,
             fetched_bytes: int = 0) -> tuple[list[Record], int]:
    """Records (sorted by offset, all >= the fetch offset) below ``end``, trimmed to about ``max_bytes`` of keys
    and values (at least one record; only looked at when the fetch brought more than ``max_bytes``), and the
    offset the next page starts from. ``next_offset`` is where the filter left off (past control, aborted
    and compacted batches); it never goes past ``end``."""
    if records and records[-1].offset >= end:
        records = records[:bisect.bisect_left(records, end, key=operator.itemgetter(0))]
        next_offset = end
    else:
        next_offset = min(next_offset, end)
    if max_bytes is not None and fetched_bytes > max_bytes and len(records) > 1:
        total = 0
        for i, r in enumerate(records):
            total += _payload(r)
            if total > max_bytes and i > 0:
                records = records[:i]
                next_offset = records[-1].offset + 1
                break
    return records, next_offset


def effective_end(end_offset: int | None, isolation_level: int, high_watermark: int, last_stable_offset: int) -> int:
    limit = high_watermark
    if isolation_level == READ_COMMITTED and last_stable_offset >= 0:
        limit = min(limit, last_stable_offset)
    return limit if end_offset is None else min(end_offset, limit)


# -- the broker side -------------------------------------------------------------------------------------
MAX_IDLE_SESSIONS = 32  # idle range-read fetch sessions kept per client
SESSION_IDLE_S = 60.0  # Kafka may evict an idle session after 120 s; ours are dropped before


@dataclass(eq=False)
class RangeSession:
    """A one-partition fetch session of a range reader and the partition's watermarks from its last answer
    (for an incremental answer that leaves the partition out)."""

    handler: FetchSessionHandler
    watermarks: tuple[int, int, int] | None = None  # high watermark, last stable offset, log start
    used: float = 0.0


class RangeSessions:
    """Idle range-read sessions of one client by (broker, partition); see the module docstring."""

    def __init__(self, max_idle: int = MAX_IDLE_SESSIONS, idle_s: float = SESSION_IDLE_S) -> None:
        self.max_idle, self.idle_s = max_idle, idle_s
        self._idle: dict[tuple[int, TopicPartition], list[RangeSession]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def take(self, node: int, tp: TopicPartition, now: float) -> RangeSession:
        stack = self._idle.get((node, tp))
        while stack:
            s = stack.pop()
            self._count -= 1
            if not stack:
                del self._idle[(node, tp)]
            if now - s.used <= self.idle_s:
                return s
        return RangeSession(FetchSessionHandler(node))

    def give(self, node: int, tp: TopicPartition, s: RangeSession, now: float) -> None:
        if s.handler.in_flight:
            return  # never reuse a session whose request did not end (the caller was cancelled)
        s.used = now
        self._idle.setdefault((node, tp), []).append(s)
        self._count += 1
        if self._count > self.max_idle:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        key, i = min(((k, i) for k, v in self._idle.items() for i in range(len(v))),
                     key=lambda ki: self._idle[ki[0]][ki[1]].used)
        del self._idle[key][i]
        if not self._idle[key]:
            del self._idle[key]
        self._count -= 1


_SESSIONS: weakref.WeakKeyDictionary[KafkaClient, RangeSessions] = weakref.WeakKeyDictionary()


def range_sessions(client: KafkaClient) -> RangeSessions:
    got = _SESSIONS.get(client)
    if got is None:
        got = _SESSIONS[client] = RangeSessions()
    return got


@dataclass
class _Unchanged:
    """An incremental answer without the partition: no records, the watermarks of the session's last answer."""

    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    error_code: int = 0
    records: bytes | None = None
    aborted_transactions: Any = None


async def _leader(client: KafkaClient, tp: TopicPartition, refresh: bool) -> int:
    return await client.leader_id(tp.topic, tp.partition, refresh=refresh)


async def _fetch(client: KafkaClient, node: int, tp: TopicPartition, offset: int, isolation: int,
                 max_bytes: int, max_wait_ms: int = FETCH_WAIT_MS) -> Any:
    """One Fetch of ``tp`` from ``offset`` on a leased connection, through one of the client's range
    sessions; the partition response. (:func:`service.fetch.oneshot.probe_fetch`: the main fetcher's
    version choice, v12 by name for topics without ids and for brokers that answer zero topic ids.)"""
    sessions = range_sessions(client)
    loop = asyncio.get_running_loop()
    rs = sessions.take(node, tp, loop.time())
    incremental = not rs.handler.metadata.is_full
    parts = await probe_fetch(client, node, {tp: offset}, max_bytes=max_bytes, isolation=isolation,
                              max_wait_ms=max_wait_ms, leader_epochs=True, lease=True,
                              request_max_bytes=max_bytes, session=rs.handler)
    part = parts.get(tp)
    if part is None:
        if not (incremental and rs.watermarks is not None):
            raise KafkaError(f"Fetch: no answer for {tp.topic}-{tp.partition}", retriable=True)
        part = _Unchanged(*rs.watermarks)  # an incremental answer leaves out a partition with nothing new
    elif not part.error_code:
        rs.watermarks = (part.high_watermark, part.last_stable_offset, part.log_start_offset)
    sessions.give(node, tp, rs, loop.time())
    return part


async def _fetch_with_leader(client: KafkaClient, tp: TopicPartition, offset: int, isolation: int,
                             max_bytes: int, max_wait_ms: int = FETCH_WAIT_MS) -> Any:
    """Fetch from the leader; a stale leader (NOT_LEADER_OR_FOLLOWER and the like) is looked up again, at once and
    then after the short pauses of :data:`LEADER_RETRY_PAUSES` (a partition just created on Apache Kafka answers
    UNKNOWN_LEADER_EPOCH for a moment)."""
    refresh = False
    for pause in (*LEADER_RETRY_PAUSES, None):
        node = await _leader(client, tp, refresh)
        part = await _fetch(client, node, tp, offset, isolation, max_bytes, max_wait_ms)
        code = part.error_code
        if not code:
            return part
        client.handle_error_code(code, tp.topic)
        if code not in EC.METADATA_REFRESH_CODES or pause is None:
            return part
        if pause:
            await asyncio.sleep(pause)
        refresh = True
    raise AssertionError("unreachable")  # pragma: no cover


def _out_of_range(tp: TopicPartition, offset: int, part: Any) -> OffsetOutOfRange:
    start = getattr(part, "log_start_offset", -1)
    hw = getattr(part, "high_watermark", -1)
    known = start is not None and start >= 0 and hw is not None and hw >= 0
    where = f" (the log holds offsets {start} to {hw})" if known else ""
    headers = {"X-Log-Start-Offset": str(start), "X-High-Watermark": str(hw)} if known else None
    return OffsetOutOfRange(f"offset {offset} of {tp.topic}-{tp.partition} is out of range{where}", headers=headers)


async def _out_of_range_with_bounds(client: KafkaClient, tp: TopicPartition, offset: int, part: Any
                                    ) -> OffsetOutOfRange:
    """The 422 of an offset outside the log, naming the log's bounds. Apache Kafka answers OFFSET_OUT_OF_RANGE
    with log start offset and high watermark -1 (Tansu never says it: it answers with the bounds, see read_page),
    so they are asked for (ListOffsets and a one-byte fetch); if that fails too, the error goes without them."""
    if (getattr(part, "log_start_offset", -1) not in (None, -1)
            and getattr(part, "high_watermark", -1) not in (None, -1)):
        return _out_of_range(tp, offset, part)
    try:
        bounds = await read_offsets(client, tp)
    except KafkaError:
        return _out_of_range(tp, offset, part)
    return _out_of_range(tp, offset, _Bounds(bounds.beginning_offset, bounds.end_offset))


@dataclass(frozen=True, slots=True)
class _Bounds:
    log_start_offset: int
    high_watermark: int


async def read_page(client: KafkaClient, tp: TopicPartition, offset: int, end_offset: int | None = None, *,
                    isolation_level: int = READ_COMMITTED, max_bytes: int = DEFAULT_MAX_BYTES,
                    max_inflated: int | None = None) -> RangePage:
    """One page of ``tp`` from ``offset`` (see the module docstring); ``max_inflated`` bounds each batch's
    decompressed size (default: the process-wide bound of :mod:`service.protocol.records`)."""
    if isolation_level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise ValueError(f"isolation level {isolation_level}")
    pos = offset
    page = RangePage(tp.topic, tp.partition, offset, [], offset, offset)
    size = max_bytes
    wait = FETCH_WAIT_MS
    while True:
        part = await _fetch_with_leader(client, tp, pos, isolation_level, size, wait)
        page.fetches += 1
        code = part.error_code
        if code == EC.OFFSET_OUT_OF_RANGE:
            raise await _out_of_range_with_bounds(client, tp, pos, part)
        if code:
            raise BrokerResponseError(code, f"Fetch {tp.topic}-{tp.partition} at {pos}")
        hw = part.high_watermark
        lso = part.last_stable_offset if part.last_stable_offset is not None and part.last_stable_offset >= 0 else hw
        page.high_watermark, page.last_stable_offset = hw, lso
        page.log_start_offset = start = part.log_start_offset if part.log_start_offset is not None else -1
        if pos > hw or pos < start:  # a broker that does not say OFFSET_OUT_OF_RANGE itself (Tansu, past the end)
            raise _out_of_range(tp, pos, part)
        end = effective_end(end_offset, isolation_level, hw, lso)
        page.end_offset = end
        if pos >= end:
            page.next_offset = pos
            return page
        raw = part.records or b""
        rs = decode_records(raw, topic=tp.topic, partition=tp.partition, defer_errors=True,
                            max_inflated=max_inflated, max_total_inflated=max_bytes)
        if rs.error is not None and not rs.batches:
            raise rs.error
        if not rs.batches:
            if (rs.first_batch_truncated and rs.oversized_first_batch
                    and size < rs.oversized_first_batch <= MAX_MAX_BYTES):
                size = rs.oversized_first_batch  # a broker without KIP-74: ask for the whole first batch
                continue
            if rs.first_batch_truncated:
                raise KafkaError(f"the batch at offset {pos} of {tp.topic}-{tp.partition} is larger than "
                                 f"{MAX_MAX_BYTES} bytes")
            if page.fetches < MAX_ROUNDS:  # a busy broker may answer within its wait before reading (Tansu)
                wait = min(wait * 4, MAX_RETRY_WAIT_MS)
                continue
            raise KafkaError(f"Fetch of {tp.topic}-{tp.partition} at {pos} returned nothing below {end}",
                             retriable=True)
        res = filter_batches(rs.batches, pos, isolation_level=isolation_level,
                             aborted_transactions=part.aborted_transactions, last_stable_offset=lso)
        records, nxt = cut_page(res.records, res.next_offset, end, max_bytes, len(raw))
        if rs.error is not None and nxt <= pos and not records:
            raise rs.error
        page.stats["aborted_batches"] = page.stats.get("aborted_batches", 0) + res.aborted_batches
        page.stats["control_batches"] = page.stats.get("control_batches", 0) + res.control_batches
        page.records = records
        page.next_offset = nxt
        if records or nxt >= end or nxt <= pos or page.fetches >= MAX_ROUNDS:
            return page
        pos = nxt  # only control / aborted / compacted batches: read on


# -- Arrow -----------------------------------------------------------------------------------------------
def _pa() -> Any:
    import pyarrow  # imported on first use: JSON-only gateways never load it

    return pyarrow


def arrow_schema(metadata: dict[str, str] | None = None) -> Any:
    pa = _pa()
    return pa.schema([
        pa.field("topic", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms"), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("item", pa.struct([
            pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]), nullable=False)),
                 nullable=False),
    ], metadata=metadata)


_OFF, _TS, _KEY, _VALUE, _HEADERS = (operator.itemgetter(i) for i in range(5))
_HKEY, _HVALUE = operator.itemgetter(0), operator.itemgetter(1)


def _headers_array(pa: Any, htype: Any, hs: list[tuple[tuple[str, bytes | None], ...]]) -> Any:
    """list<struct<key, value>> from the records' header tuples, built flat: list offsets from a running sum
    of the lengths (an ``array('i')`` filled in C), header keys and values from one chained pass, so no
    Python object is made per record (pyarrow's nested-sequence conversion would visit each one)."""
    offsets = array("i", accumulate(map(len, hs), initial=0))
    flat = list(chain.from_iterable(hs))
    keys = pa.array(list(map(_HKEY, flat)), pa.string())
    values = pa.array(list(map(_HVALUE, flat)), pa.binary())
    item = pa.StructArray.from_arrays([keys, values], fields=list(htype.value_type))
    return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
                                    item, type=htype)


def arrow_table(topic: str, partition: int, records: list[Record], metadata: dict[str, str] | None = None) -> Any:
    """The records as one Arrow record batch (wrapped in a table) with :func:`arrow_schema`."""
    pa = _pa()
    schema = arrow_schema(metadata)
    n = len(records)
    zeros = pa.repeat(pa.scalar(0, pa.int32()), n)
    topic_col = pa.DictionaryArray.from_arrays(zeros, pa.array([topic], pa.string()))
    partition_col = pa.repeat(pa.scalar(partition, pa.int32()), n)
    offsets = pa.array(list(map(_OFF, records)), pa.int64())
    timestamps = pa.array(list(map(_TS, records)), pa.int64()).view(pa.timestamp("ms"))
    keys = pa.array(list(map(_KEY, records)), pa.binary())
    values = pa.array(list(map(_VALUE, records)), pa.binary())
    htype = schema.field("headers").type
    hs = list(map(_HEADERS, records))
    if any(hs):
        headers = _headers_array(pa, htype, hs)
    else:  # no headers anywhere: n + 1 zero list offsets, an empty child
        headers = pa.ListArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1),
                                           pa.array([], htype.value_type), type=htype)
    batch = pa.RecordBatch.from_arrays([topic_col, partition_col, offsets, timestamps, keys, values, headers],
                                       schema=schema)
    return pa.Table.from_batches([batch], schema=schema)


def to_arrow_ipc(page: RangePage) -> bytes:
    """The page as an Arrow IPC stream: the schema (paging state in its metadata), then one record batch
    (none for an empty page)."""
    pa = _pa()
    sink = pa.BufferOutputStream()
    meta = page.metadata()
    if page.records:
        table = arrow_table(page.topic, page.partition, page.records, meta)
        schema = table.schema
    else:
        table = None
        schema = arrow_schema(meta)
    with pa.ipc.new_stream(sink, schema) as writer:
        if table is not None:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()
