"""Encoding a producer batch (magic 2) from queued records, faster than the general ``build_batch``.

The records section is written by the C encoder ``service.producer._cproduce`` (built by ``hatch_build.py``)
when it can be imported (unless ``KCG_NO_CEXT=1``), else by the pure-Python twin below, which it matches
byte for byte (differential unit test); the Python one uses precomputed zig-zag varints for small numbers
(lengths, offset and timestamp deltas below 2**13). The header follows :mod:`service.protocol.records`
conventions; the result is byte-for-byte what ``records.build_batch`` produces for the same input.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import crc32c as _crc32c

from service.lib.native import load
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


def _encode_runs_py(runs: list[tuple[list[Any], int]]) -> tuple[bytes, int, int, int]:
    """The records section of a batch from the accumulator's runs (the C encoder's Python twin):
    ``runs`` is a list of ``(records, default_timestamp)``, each record ``(key, value, headers, partition,
    timestamp | None)``. Returns (section, count, base timestamp, max timestamp)."""
    zz = _ZZ
    parts: list[bytes] = []
    append = parts.append
    i = 0
    base_ts = max_ts = 0
    for records, default_ts in runs:
        for rec in records:
            key, value, headers, ts = rec[0], rec[1], rec[2], rec[4]
            if ts is None:
                ts = default_ts
            if i == 0:
                base_ts = max_ts = ts
            elif ts > max_ts:
                max_ts = ts
            d = ts - base_ts
            body = [b"\x00", zz[d] if 0 <= d < _SMALL else _zz_slow(d), zz[i] if i < _SMALL else _zz_slow(i)]
            if key is None:
                body.append(_NULL)
            else:
                n = len(key)
                body.append(zz[n] if n < _SMALL else _zz_slow(n))
                body.append(bytes(key))
            if value is None:
                body.append(_NULL)
            else:
                n = len(value)
                body.append(zz[n] if n < _SMALL else _zz_slow(n))
                body.append(bytes(value))
            body.append(_headers(headers) if headers else b"\x00")
            b = b"".join(body)
            n = len(b)
            append(zz[n] if n < _SMALL else _zz_slow(n))
            append(b)
            i += 1
    return b"".join(parts), i, base_ts, max_ts


#: the largest per-record overhead plain_sizes takes
MAX_OVERHEAD = 0x7FFFFFFF


def _plain_sizes_py(records: list[Any], overhead: int) -> list[int] | None:
    """Each record's size (``overhead`` + its value's length) if no record has a key, a partition or headers
    (the producer's sticky fast path), else None. Records are tuples of at least five fields. ``overhead``
    outside 0..2**31-1 is a ValueError (as in the C twin)."""
    if not 0 <= overhead <= MAX_OVERHEAD:
        raise ValueError(f"plain_sizes: overhead {overhead} is outside 0..{MAX_OVERHEAD}")
    if not all(isinstance(r, tuple) for r in records):
        return None
    if not all(len(r) >= 5 and r[0] is None and r[3] is None and not r[2] for r in records):
        return None
    return [overhead + (len(v) if v is not None else 0) for v in [r[1] for r in records]]


def _metas_py(cls: Any, partition: int, base_offset: int, n: int) -> list[Any]:
    """``n`` instances of the 2-tuple class ``cls``: ``(partition, base_offset + i)``. A negative ``n`` is a
    ValueError, offsets beyond 64 bits an OverflowError (as in the C twin)."""
    if n < 0:
        raise ValueError("metas: n must be >= 0")
    if n > 0 and base_offset + n - 1 > 2**63 - 1:
        raise OverflowError("metas: base_offset + n - 1 is beyond a 64-bit offset")
    new = tuple.__new__
    return [new(cls, (partition, o)) for o in range(base_offset, base_offset + n)]


_cproduce, C_IMPORT_ERROR = load("service.producer._cproduce")
encode_runs = _cproduce.encode_runs if _cproduce is not None else _encode_runs_py
plain_sizes = _cproduce.plain_sizes if _cproduce is not None else _plain_sizes_py
metas = _cproduce.metas if _cproduce is not None else _metas_py
# The C module or None: its parse_binary / render_offsets serve the HTTP produce route (api/v2/produce.py), which
# falls back to Python (and names errors) whenever they answer None.
native: Any = _cproduce


def use_c_extension(enabled: bool) -> None:
    """Select the record encoder (tests cover both). ``True`` raises ImportError when it is not built."""
    global encode_runs, plain_sizes, metas
    if not enabled:
        encode_runs, plain_sizes, metas = _encode_runs_py, _plain_sizes_py, _metas_py
    elif _cproduce is None:
        raise ImportError(f"service.producer._cproduce is not available: {C_IMPORT_ERROR}")
    else:
        encode_runs, plain_sizes, metas = _cproduce.encode_runs, _cproduce.plain_sizes, _cproduce.metas


def encode_run_batch(runs: list[tuple[list[Any], int]], *, producer_id: int = -1, producer_epoch: int = -1,
                     base_sequence: int = -1, compression: int = Compression.NONE) -> bytes:
    """One batch at base offset 0 from the accumulator's runs (see :func:`_encode_runs_py`)."""
    section, count, base_ts, max_ts = encode_runs(runs)
    payload = compress(compression, section) if compression else section
    out = bytearray(_HEADER.pack(
        0, _MIN_BATCH_LENGTH + len(payload), -1, 2, 0, compression & 0x07, count - 1,
        base_ts, max_ts, producer_id, producer_epoch, base_sequence, count))
    out += payload
    struct.pack_into(">I", out, 17, _crc32c.crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def encode_batch(records: Sequence[Any], *, producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1, compression: int = Compression.NONE) -> bytes:
    """One batch at base offset 0 from ``records``: items whose first four fields are
    ``(key, value, headers, timestamp)`` (timestamp in ms; the batch's base timestamp is the first
    record's)."""
    run = [(r[0], r[1], r[2], None, r[3]) for r in records]
    return encode_run_batch([(run, 0)], producer_id=producer_id, producer_epoch=producer_epoch,
                            base_sequence=base_sequence, compression=compression)
