"""Encoding a producer batch (magic 2) from queued records, faster than the general ``build_batch``.

The records section is written with precomputed zig-zag varints for small numbers (lengths, offset and
timestamp deltas below 2**13), then the header via :mod:`service.protocol.records` conventions. The
result is byte-for-byte what ``records.build_batch`` produces for the same input (unit-tested), at
about a third of its cost per record.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import crc32c as _crc32c

from service.protocol.primitives import write_varint
from service.protocol.records import Compression, compress

# base offset, batch length | partition leader epoch, magic, crc, attributes, last offset delta,
# base timestamp, max timestamp, producer id, producer epoch, base sequence, records count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_MIN_BATCH_LENGTH = _HEADER.size - 12
_CRC_START = 21
_SMALL = 1 << 13


def _zz_slow(v: int) -> bytes:
    out = bytearray()
    write_varint(out, v)
    return bytes(out)


_ZZ: list[bytes] = [_zz_slow(i) for i in range(_SMALL)]
_NULL = _zz_slow(-1)


def _zz(v: int) -> bytes:
    return _ZZ[v] if 0 <= v < _SMALL else _zz_slow(v)


def _headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    out = [_zz(len(headers))]
    for hk, hv in headers:
        k = hk.encode()
        out.append(_zz(len(k)))
        out.append(k)
        if hv is None:
            out.append(_NULL)
        else:
            out.append(_zz(len(hv)))
            out.append(hv)
    return b"".join(out)


def encode_batch(records: Sequence[Any], *, producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1, compression: int = Compression.NONE) -> bytes:
    """One batch at base offset 0 from ``records``: items whose first four fields are
    ``(key, value, headers, timestamp)`` (timestamp in ms; the batch's base timestamp is the first
    record's)."""
    zz = _ZZ
    base_ts = records[0][3]
    max_ts = base_ts
    parts: list[bytes] = []
    append = parts.append
    for i, rec in enumerate(records):
        key, value, headers, ts = rec[0], rec[1], rec[2], rec[3]
        d = ts - base_ts
        if ts > max_ts:
            max_ts = ts
        body = [b"\x00", zz[d] if 0 <= d < _SMALL else _zz_slow(d), zz[i] if i < _SMALL else _zz_slow(i)]
        if key is None:
            body.append(_NULL)
        else:
            n = len(key)
            body.append(zz[n] if n < _SMALL else _zz_slow(n))
            body.append(key)
        if value is None:
            body.append(_NULL)
        else:
            n = len(value)
            body.append(zz[n] if n < _SMALL else _zz_slow(n))
            body.append(value)
        body.append(_headers(headers) if headers else b"\x00")
        b = b"".join(body)
        n = len(b)
        append(zz[n] if n < _SMALL else _zz_slow(n))
        append(b)
    section = b"".join(parts)
    payload = compress(compression, section) if compression else section
    out = bytearray(_HEADER.pack(
        0, _MIN_BATCH_LENGTH + len(payload), -1, 2, 0, compression & 0x07, len(records) - 1,
        base_ts, max_ts, producer_id, producer_epoch, base_sequence, len(records)))
    out += payload
    struct.pack_into(">I", out, 17, _crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)
