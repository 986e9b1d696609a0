"""Kafka record batches (magic 2): walking a fetch's records blob, decoding, encoding.

Everything here is sans-io (no I/O, no global state besides the decoder switch). The hot path is:

    it = iter_batches(blob, topic=t, partition=p)
    for batch in it:                       # header parsed, CRC checked, nothing decoded yet
        if batch.is_control: ...           # e.g. batch.control_type: COMMIT/ABORT marker
        records = batch.decode()           # list[Record]; decompresses first if needed
    if it.oversized_first_batch: ...       # nothing fit: the first batch is bigger than the fetch size

``decode_records`` does the same eagerly and returns a :class:`RecordSet`.

Decompression is bounded: a batch whose records section would inflate past ``max_inflated`` bytes (default
:data:`DEFAULT_MAX_INFLATED_BYTES`, process-wide :func:`set_max_inflated_bytes`; the gateway sets it from
``GATEWAY_MAX_BATCH_INFLATED_BYTES``) raises :class:`InflatedSizeError` naming the batch, and the codec never
writes more than the bound: gzip and lz4 batches small enough that even the codec's largest possible ratio
stays within the bound are decompressed directly; larger ones, and zstd (whose ratio has no useful bound),
decompress into a buffer of the bound (an anonymous mapping: pages are only committed as they are written),
so a frame that lies about its size cannot go past it. Raw snappy states its exact size up front (checked
before decompressing; the codec refuses a stream that does not match it). ``decode_records`` can also stop
decoding once the batches it decoded add up to ``max_total_inflated`` (the caller's page or fetch budget), so
one response inflates to at most that plus one batch.

Record decoding has two interchangeable implementations: the C accelerator
``service.protocol._crecords`` (built by ``hatch_build.py``) and a pure-Python fallback. The C one is
used when it can be imported unless ``KCG_NO_CEXT=1`` is set in the environment at import time;
``use_c_extension()`` switches at run time (tests use it to cover both paths).
"""

from __future__ import annotations

import enum
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import crc32c as _crc32c

from service.lib.native import load
from service.protocol.compression import (
    DEFAULT_MAX_INFLATED_BYTES,
    KNOWN_TOO_LARGE,
    KNOWN_TOO_LARGE_MAX,
    Compression,
    InflatedSizeError,
    TooLarge,
    compress,
    decompress,
    decompress_bounded,
    max_inflated_bytes,
    set_max_inflated_bytes,
)
from service.protocol.errors import (
    CorruptRecordError,
    ProtocolDecodeError,
    UnsupportedMessageFormatError,
)
from service.protocol.primitives import read_uvarint, write_varint

__all__ = [
    "BATCH_HEADER_SIZE",
    "C_EXTENSION_AVAILABLE",
    "DEFAULT_MAX_INFLATED_BYTES",
    "LOG_OVERHEAD",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "BatchIterator",
    "Compression",
    "ControlType",
    "Header",
    "InflatedSizeError",
    "Record",
    "RecordBatch",
    "RecordSet",
    "build_batch",
    "build_control_batch",
    "compress",
    "decode_records",
    "decompress",
    "decompress_bounded",
    "iter_batches",
    "max_inflated_bytes",
    "set_max_inflated_bytes",
    "use_c_extension",
    "using_c_extension",
]

# -- layout ---------------------------------------------------------------------------------------
# base offset, batch length | partition leader epoch, magic, crc, attributes, last offset delta,
# base timestamp, max timestamp, producer id, producer epoch, base sequence, records count
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_CONTROL_KEY = struct.Struct(">hh")
_TXN_MARKER_VALUE = struct.Struct(">hi")
_INT32 = struct.Struct(">i")

LOG_OVERHEAD = 12  # base offset + batch length: the part not counted by batch length
BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
_MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49
_MAGIC_POS = 16
_CRC_START = 21  # the CRC covers attributes .. end of batch
_MIN_RECORD_SIZE = 7  # length varint + attributes, ts delta, offset delta, key len, value len, header count

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

_COMPRESSION_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20

class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


Header = tuple[str, bytes | None]


class Record(NamedTuple):
    """One decoded record; a plain tuple underneath (the C decoder builds these directly)."""

    offset: int  # absolute
    timestamp: int  # absolute, ms since the epoch (the batch's max timestamp under log-append time)
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]  # () when the record has none


# -- record section decoders ----------------------------------------------------------------------
# Signature shared by both implementations:
#   (buf, start, end, count, base_offset, base_timestamp, log_append_timestamp | None, record_type)
# They raise ValueError on malformed input; callers turn that into CorruptRecordError.
SectionDecoder = Callable[[Any, int, int, int, int, int, "int | None", type], list[Record]]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    u, pos = read_uvarint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


def _decode_section_py(buf: Any, start: int, end: int, count: int, base_offset: int,
                       base_timestamp: int, append_timestamp: int | None,
                       record_type: type = Record) -> list[Record]:
    if not isinstance(buf, bytes):
        buf = bytes(memoryview(buf)[start:end])
        end -= start
        start = 0
    if count < 0:
        raise ValueError(f"negative records count {count}")
    if count * _MIN_RECORD_SIZE > end - start:
        raise ValueError(f"records count {count} cannot fit in {end - start} bytes")
    new = tuple.__new__
    out: list[Record] = []
    append = out.append
    pos = start
    try:
        for i in range(count):
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = _varint(buf, pos)
            rec_end = pos + length
            if length < _MIN_RECORD_SIZE - 1 or rec_end > end:
                raise ValueError(f"record {i} has a bad length {length}")
            pos += 1  # attributes: unused
            b = buf[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                ts_delta, pos = _varint(buf, pos)
            b = buf[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                off_delta, pos = _varint(buf, pos)
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            if n >= 0:
                key: bytes | None = buf[pos:pos + n]
                pos += n
            elif n == -1:
                key = None
            else:
                raise ValueError(f"record {i} has a bad key length {n}")
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            if n >= 0:
                value: bytes | None = buf[pos:pos + n]
                pos += n
            elif n == -1:
                value = None
            else:
                raise ValueError(f"record {i} has a bad value length {n}")
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            headers: tuple[Header, ...] = ()
            if n:
                if n < 0:
                    raise ValueError(f"record {i} has a bad header count {n}")
                hlist: list[Header] = []
                for _ in range(n):
                    hk, pos = _varint(buf, pos)
                    if hk < 0 or pos + hk > rec_end:
                        raise ValueError(f"record {i} has a bad header key length {hk}")
                    hkey = str(buf[pos:pos + hk], "utf-8")
                    pos += hk
                    hv, pos = _varint(buf, pos)
                    if hv >= 0:
                        hval: bytes | None = buf[pos:pos + hv]
                        pos += hv
                    elif hv == -1:
                        hval = None
                    else:
                        raise ValueError(f"record {i} has a bad header value length {hv}")
                    if pos > rec_end:
                        raise ValueError(f"record {i}: header runs past the record")
                    hlist.append((hkey, hval))
                headers = tuple(hlist)
            if pos != rec_end:
                raise ValueError(f"record {i}: fields take {pos - rec_end + length} bytes, "
                                 f"its length says {length}")
            append(new(record_type, (
                base_offset + off_delta,
                base_timestamp + ts_delta if append_timestamp is None else append_timestamp,
                key, value, headers)))
    except (IndexError, ProtocolDecodeError) as e:
        raise ValueError(f"record runs past the end of the batch ({e})") from None
    if pos != end:
        raise ValueError(f"{end - pos} bytes left over after {count} records")
    return out


_crecords, _C_IMPORT_ERROR = load("service.protocol._crecords")
C_EXTENSION_AVAILABLE = _crecords is not None

_decode_section: SectionDecoder = (
    _crecords.decode_records if _crecords is not None else _decode_section_py)


def use_c_extension(enabled: bool) -> None:
    """Select the record decoder. ``True`` raises ImportError when the extension is not available."""
    global _decode_section
    if enabled:
        if _crecords is None:
            raise ImportError(f"service.protocol._crecords is not available: {_C_IMPORT_ERROR}")
        _decode_section = _crecords.decode_records
    else:
        _decode_section = _decode_section_py


def using_c_extension() -> bool:
    return _decode_section is not _decode_section_py


# -- batches --------------------------------------------------------------------------------------
class RecordBatch:
    """A magic-2 batch header plus a reference to its (possibly compressed) records section.

    ``records`` stays ``None`` until ``decode()`` is called (``decode_records`` does it eagerly).
    A batch references the blob it came from (no copy); decoded records are independent copies.
    """

    __slots__ = (
        "_buf",
        "_end",
        "_start",
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "batch_length",
        "crc",
        "inflated_size",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition",
        "partition_leader_epoch",
        "producer_epoch",
        "producer_id",
        "records",
        "records_count",
        "topic",
    )

    def __init__(self, header: tuple[int, ...], buf: Any, start: int, end: int,
                 topic: str | None = None, partition: int | None = None) -> None:
        (self.base_offset, self.batch_length, self.partition_leader_epoch, self.magic, self.crc,
         self.attributes, self.last_offset_delta, self.base_timestamp, self.max_timestamp,
         self.producer_id, self.producer_epoch, self.base_sequence, self.records_count) = header
        self._buf = buf
        self._start = start
        self._end = end
        self.topic = topic
        self.partition = partition
        self.records: list[Record] | None = None

    # header-derived properties
    @property
    def first_timestamp(self) -> int:
        return self.base_timestamp

    @property
    def compression(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = create time, 1 = log-append time (every record's timestamp is ``max_timestamp``)."""
        return 1 if self.attributes & _LOG_APPEND_TIME else 0

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & _LOG_APPEND_TIME)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size(self) -> int:
        """Bytes this batch takes in the blob."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def raw_records(self) -> memoryview:
        """The records section as on the wire (compressed if the batch is)."""
        return memoryview(self._buf)[self._start:self._end]

    def _corrupt(self, message: str) -> CorruptRecordError:
        return CorruptRecordError(message, topic=self.topic, partition=self.partition,
                                  offset=self.base_offset)

    def decode(self, max_inflated: int | None = None) -> list[Record]:
        """Decompress (if needed) and decode the records; the result is also kept in ``records``.

        A batch whose records count is 0 holds no records whatever its records section and compression
        attribute say, as in Kafka's ``DefaultRecordBatch.iterator()``: the log cleaner leaves such empty
        batches (header only) on compacted topics, e.g. for transaction markers it removed. Both record
        decoders are bypassed, so they agree on it.
        """
        if self.records_count == 0:
            self.records = []
            self.inflated_size = 0
            return self.records
        compression = self.attributes & _COMPRESSION_MASK
        if compression:
            limit = max_inflated_bytes() if max_inflated is None else max_inflated
            too_large: int | None = None
            known = None
            if KNOWN_TOO_LARGE:
                known = (self.topic, self.partition, self.base_offset, self.crc, self.batch_length, limit)
                too_large = KNOWN_TOO_LARGE.get(known)
            if too_large is None:
                try:
                    buf: Any = decompress_bounded(compression, memoryview(self._buf)[self._start:self._end],
                                                  limit)
                except TooLarge as e:
                    too_large = e.size
                    if len(KNOWN_TOO_LARGE) >= KNOWN_TOO_LARGE_MAX:
                        del KNOWN_TOO_LARGE[next(iter(KNOWN_TOO_LARGE))]
                    KNOWN_TOO_LARGE[known or (self.topic, self.partition, self.base_offset, self.crc,
                                               self.batch_length, limit)] = too_large
                except Exception as e:  # codec libraries raise their own error types
                    codec = Compression(compression).name.lower() if compression <= 4 else str(compression)
                    raise self._corrupt(f"cannot decompress record batch ({codec}): {e}") from None
            if too_large is not None:  # raised outside the handler: no context chain keeps buffers alive
                codec = Compression(compression).name.lower()
                size = f" (it declares {too_large} bytes)" if too_large >= 0 else ""
                raise InflatedSizeError(
                    f"record batch {self.base_offset}..{self.last_offset} ({codec}, {self._end - self._start} "
                    f"bytes compressed) inflates past the limit of {limit} bytes{size}",
                    topic=self.topic, partition=self.partition, offset=self.base_offset, limit=limit,
                    next_offset=self.next_offset)
            start, end = 0, len(buf)
        else:
            buf, start, end = self._buf, self._start, self._end
        self.inflated_size = end - start
        append_ts = self.max_timestamp if self.attributes & _LOG_APPEND_TIME else None
        try:
            records = _decode_section(buf, start, end, self.records_count, self.base_offset,
                                      self.base_timestamp, append_ts, Record)
        except ValueError as e:
            raise self._corrupt(f"corrupt record batch: {e}") from None
        self.records = records
        return records

    @property
    def control_type(self) -> ControlType | int | None:
        """For a control batch, the marker type of its (single) control record: ABORT or COMMIT.

        None for a non-control batch and for an empty control batch (records count 0, as Kafka's log
        cleaner leaves them: skipped like Java's consumer does, its offsets consumed); an unknown type
        is a plain int. Decodes the batch if needed (raising CorruptRecordError like ``decode()``).
        """
        if not self.attributes & _CONTROL:
            return None
        records = self.records if self.records is not None else self.decode()
        if not records:
            return None
        key = records[0].key
        if key is None or len(key) < _CONTROL_KEY.size:
            raise self._corrupt("control record with a short key")
        ctype: int
        _version, ctype = _CONTROL_KEY.unpack_from(key)
        try:
            return ControlType(ctype)
        except ValueError:
            return ctype

    def __repr__(self) -> str:
        flags = "".join((" txn" if self.is_transactional else "", " control" if self.is_control else "",
                         " log-append" if self.is_log_append_time else ""))
        return (f"<RecordBatch offsets={self.base_offset}..{self.last_offset} count={self.records_count} "
                f"compression={self.compression} producer={self.producer_id}/{self.producer_epoch}{flags}>")


class BatchIterator:
    """Iterates over the complete batches of a records blob (see ``iter_batches``).

    After iteration stops: ``partial_bytes`` is how many trailing bytes did not form a complete
    batch (brokers cut responses at the fetch size), and ``oversized_first_batch`` is the size the
    first batch needs when not even one batch fitted (a record too large for the fetch size), else
    ``None``. ``first_batch_truncated`` is True in that case even when the size could not be read.
    """

    __slots__ = ("_count", "_data", "_len", "_mv", "_pos", "_verify_crc", "first_batch_truncated",
                 "oversized_first_batch", "partial_bytes", "partition", "topic")

    def __init__(self, data: bytes | bytearray | memoryview, *, topic: str | None = None,
                 partition: int | None = None, verify_crc: bool = True) -> None:
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        self._mv = mv
        self._data = data if isinstance(data, bytes) else mv
        self._len = len(mv)
        self._pos = 0
        self._count = 0
        self._verify_crc = verify_crc
        self.topic = topic
        self.partition = partition
        self.partial_bytes = 0
        self.first_batch_truncated = False
        self.oversized_first_batch: int | None = None

    def __iter__(self) -> BatchIterator:
        return self

    def _stop(self, remaining: int, needed: int | None) -> None:
        self.partial_bytes = remaining
        if remaining and self._count == 0:
            self.first_batch_truncated = True
            self.oversized_first_batch = needed
        self._pos = self._len
        raise StopIteration

    def __next__(self) -> RecordBatch:
        # Fast path: a complete, plausible magic-2 batch. Everything else goes to _next_slow.
        pos = self._pos
        if self._len - pos >= BATCH_HEADER_SIZE:
            header = _BATCH_HEADER.unpack_from(self._data, pos)
            end = pos + LOG_OVERHEAD + header[1]
            if (header[3] == 2 and end <= self._len and header[1] >= _MIN_BATCH_LENGTH
                    and header[12] >= 0):
                if self._verify_crc and _crc32c.crc32c(self._mv[pos + _CRC_START:end]) != header[4]:
                    self._crc_error(header[0], header[4], pos, end)
                self._pos = end
                self._count += 1
                return RecordBatch(header, self._data, pos + BATCH_HEADER_SIZE, end, self.topic,
                                   self.partition)
        return self._next_slow()

    def _crc_error(self, base_offset: int, crc: int, pos: int, end: int) -> None:
        actual = _crc32c.crc32c(self._mv[pos + _CRC_START:end])
        raise CorruptRecordError(
            f"record batch CRC mismatch (stored {crc:#010x}, computed {actual:#010x})",
            topic=self.topic, partition=self.partition, offset=base_offset)

    def _next_slow(self) -> RecordBatch:
        data = self._data
        pos = self._pos
        remaining = self._len - pos
        if remaining < LOG_OVERHEAD:
            self._stop(remaining, None)
        base_offset, batch_length = _OFFSET_AND_LENGTH.unpack_from(data, pos)
        size = LOG_OVERHEAD + batch_length
        magic = data[pos + _MAGIC_POS] if remaining > _MAGIC_POS else None
        complete = remaining >= size
        if magic in (0, 1) and (complete or self._count == 0):
            raise UnsupportedMessageFormatError(
                f"unsupported message format (magic {magic}): pre-0.11 message sets are not supported"
                f" (topic={self.topic}, partition={self.partition}, offset={base_offset})")
        if batch_length < _MIN_BATCH_LENGTH and (magic is None or magic >= 2):
            raise CorruptRecordError(f"record batch length {batch_length} is below the minimum",
                                     topic=self.topic, partition=self.partition, offset=base_offset)
        if not complete:
            self._stop(remaining, size)
        if magic != 2:
            raise UnsupportedMessageFormatError(
                f"unsupported message format (magic {magic})"
                f" (topic={self.topic}, partition={self.partition}, offset={base_offset})")
        header = _BATCH_HEADER.unpack_from(data, pos)
        end = pos + size
        if self._verify_crc and _crc32c.crc32c(self._mv[pos + _CRC_START:end]) != header[4]:
            self._crc_error(base_offset, header[4], pos, end)
        if header[12] < 0:
            raise CorruptRecordError(f"negative records count {header[12]}",
                                     topic=self.topic, partition=self.partition, offset=base_offset)
        self._pos = end
        self._count += 1
        return RecordBatch(header, data, pos + BATCH_HEADER_SIZE, end, self.topic, self.partition)


def iter_batches(data: bytes | bytearray | memoryview, *, topic: str | None = None,
                 partition: int | None = None, verify_crc: bool = True) -> BatchIterator:
    """Walk the batches of a records blob without decoding records.

    Raises UnsupportedMessageFormatError for magic 0/1 message sets and CorruptRecordError (naming
    topic, partition and the batch's base offset) for a CRC mismatch or an impossible header; both
    are raised when the bad batch is reached, after the batches before it were yielded.
    """
    return BatchIterator(data, topic=topic, partition=partition, verify_crc=verify_crc)


class RecordSet:
    """Eagerly decoded contents of a records blob (see ``decode_records``)."""

    __slots__ = ("batches", "budget_stop", "error", "first_batch_truncated", "inflated_bytes",
                 "oversized_first_batch", "partial_bytes")

    def __init__(self, batches: list[RecordBatch], partial_bytes: int, first_batch_truncated: bool,
                 oversized_first_batch: int | None, error: Exception | None, inflated_bytes: int = 0,
                 budget_stop: bool = False) -> None:
        self.batches = batches
        self.partial_bytes = partial_bytes
        self.first_batch_truncated = first_batch_truncated
        self.oversized_first_batch = oversized_first_batch
        self.error = error
        self.inflated_bytes = inflated_bytes  # decoded records sections, summed
        self.budget_stop = budget_stop  # decoding stopped at max_total_inflated (batches were left)

    def records(self) -> Iterator[Record]:
        """All data records in order (control batches skipped; no transactional filtering)."""
        for b in self.batches:
            if not b.is_control and b.records:
                yield from b.records

    @property
    def next_offset(self) -> int | None:
        """Offset after the last complete batch, or None when there was none."""
        return self.batches[-1].next_offset if self.batches else None


def decode_records(data: bytes | bytearray | memoryview, *, topic: str | None = None,
                   partition: int | None = None, verify_crc: bool = True,
                   defer_errors: bool = False, max_inflated: int | None = None,
                   max_total_inflated: int | None = None) -> RecordSet:
    """Decode every complete batch in ``data`` (headers and records).

    With ``defer_errors`` a corrupt or unsupported batch stops decoding without raising: the
    batches before it are returned and the exception is stored in ``RecordSet.error`` (a consumer
    can hand out what it has and report the error at the right offset).

    ``max_inflated``: the bound on each batch's decoded records section (default: the process-wide
    :func:`max_inflated_bytes`); a batch past it is an :class:`InflatedSizeError`. ``max_total_inflated``:
    once the decoded sections add up to this, the batches left are not decoded (``RecordSet.budget_stop``;
    the caller reads on from ``next_offset``), so the whole set is at most that plus one batch.
    """
    it = BatchIterator(data, topic=topic, partition=partition, verify_crc=verify_crc)
    batches: list[RecordBatch] = []
    error: Exception | None = None
    total = 0
    stop = False
    try:
        for batch in it:
            if max_total_inflated is not None and total >= max_total_inflated and batches:
                stop = True
                break
            batch.decode(max_inflated)
            total += batch.inflated_size
            batches.append(batch)
    except (CorruptRecordError, UnsupportedMessageFormatError) as e:
        if not defer_errors:
            raise
        error = e
    return RecordSet(batches, it.partial_bytes, it.first_batch_truncated, it.oversized_first_batch, error,
                     total, stop)


# -- encoding -------------------------------------------------------------------------------------
RecordInput = Record | tuple[Any, ...]


def _write_bytes(out: bytearray, v: bytes | None) -> None:
    if v is None:
        out.append(1)  # zigzag(-1)
    else:
        write_varint(out, len(v))
        out += v


def _encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, key: bytes | None,
                   value: bytes | None, headers: Iterable[Header]) -> None:
    body = bytearray(b"\x00")  # attributes
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_bytes(body, key)
    _write_bytes(body, value)
    hs = list(headers)
    write_varint(body, len(hs))
    for hk, hv in hs:
        k = hk.encode()
        write_varint(body, len(k))
        body += k
        _write_bytes(body, hv)
    write_varint(out, len(body))
    out += body


def build_batch(records: Iterable[RecordInput], *, base_offset: int = 0, compression: int = 0,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                base_sequence: int = NO_SEQUENCE, transactional: bool = False, control: bool = False,
                partition_leader_epoch: int = -1, base_timestamp: int | None = None,
                log_append_time: bool = False, max_timestamp: int | None = None,
                last_offset_delta: int | None = None) -> bytes:
    """Encode one magic-2 batch (complete, CRC included).

    Each item of ``records`` is either a ``Record`` (its absolute offset must be >= ``base_offset``;
    ``timestamp`` may be None) or a tuple ``(key, value[, headers[, timestamp]])`` placed at
    ``base_offset + index``. Missing timestamps default to ``base_timestamp``, or the current time.
    ``base_timestamp`` defaults to the first record's timestamp; ``max_timestamp`` to the largest
    record timestamp (with ``log_append_time`` pass the append time as ``max_timestamp``).
    """
    rows: list[tuple[int, int | None, bytes | None, bytes | None, Iterable[Header]]] = []
    for i, r in enumerate(records):
        if isinstance(r, Record):
            if r.offset < base_offset:
                raise ValueError(f"record offset {r.offset} is below the base offset {base_offset}")
            rows.append((r.offset - base_offset, r.timestamp, r.key, r.value, r.headers or ()))
        else:
            n = len(r)
            if not 2 <= n <= 4:
                raise ValueError("a record tuple is (key, value[, headers[, timestamp]])")
            rows.append((i, r[3] if n > 3 else None, r[0], r[1], (r[2] or ()) if n > 2 else ()))
    if base_timestamp is None:
        base_timestamp = next((ts for _, ts, *_ in rows if ts is not None), None)
        if base_timestamp is None:
            base_timestamp = int(time.time() * 1000)
    body = bytearray()
    max_ts = -1
    max_delta = 0
    for delta, ts, key, value, headers in rows:
        if ts is None:
            ts = base_timestamp
        max_ts = max(max_ts, ts)
        max_delta = max(max_delta, delta)
        _encode_record(body, delta, ts - base_timestamp, key, value, headers)
    if max_timestamp is None:
        max_timestamp = max_ts if rows else base_timestamp
    if last_offset_delta is None:
        last_offset_delta = max_delta
    payload = compress(compression, bytes(body)) if compression else bytes(body)
    attributes = compression & _COMPRESSION_MASK
    if log_append_time:
        attributes |= _LOG_APPEND_TIME
    if transactional:
        attributes |= _TRANSACTIONAL
    if control:
        attributes |= _CONTROL
    batch_length = _MIN_BATCH_LENGTH + len(payload)
    out = bytearray(_BATCH_HEADER.pack(
        base_offset, batch_length, partition_leader_epoch, 2, 0, attributes, last_offset_delta,
        base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, len(rows)))
    out += payload
    struct.pack_into(">I", out, 17, _crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def build_control_batch(control_type: ControlType | int, *, base_offset: int, producer_id: int,
                        producer_epoch: int, timestamp: int | None = None, coordinator_epoch: int = 0,
                        partition_leader_epoch: int = -1) -> bytes:
    """A transaction marker batch (COMMIT or ABORT) as the transaction coordinator writes it."""
    key = _CONTROL_KEY.pack(0, int(control_type))
    value = _TXN_MARKER_VALUE.pack(0, coordinator_epoch)
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    return build_batch([(key, value, (), ts)], base_offset=base_offset, producer_id=producer_id,
                       producer_epoch=producer_epoch, transactional=True, control=True,
                       partition_leader_epoch=partition_leader_epoch)
