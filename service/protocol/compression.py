"""Compression codecs of record batches and bounded decompression (sans-io).

A batch whose records section would inflate past a bound (default :data:`DEFAULT_MAX_INFLATED_BYTES`,
process-wide :func:`set_max_inflated_bytes`) raises :class:`InflatedSizeError`, and the codec never writes more
than the bound: gzip and lz4 batches small enough that even the codec's largest possible ratio stays within the
bound are decompressed directly; larger ones, and zstd (whose ratio has no useful bound), decompress into a buffer
of the bound (an anonymous mapping: pages are only committed as they are written). Raw snappy states its exact
size up front, checked before decompressing. :mod:`service.protocol.records` uses these when it decodes a batch.
"""

from __future__ import annotations

import enum
import mmap
import struct
from typing import Any

import cramjam

from service.protocol.errors import CorruptRecordError

_INT32 = struct.Struct(">i")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4



# -- bounded decompression ------------------------------------------------------------------------
DEFAULT_MAX_INFLATED_BYTES = 64 * 1024 * 1024
_max_inflated = DEFAULT_MAX_INFLATED_BYTES

# The largest output/input ratio each codec can reach (deflate: 1032:1; an lz4 block: 255 bytes of match
# length per input byte), with a margin: a batch at most limit / ratio bytes long cannot pass the limit.
_MAX_RATIO = {1: 1040, 3: 260}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class InflatedSizeError(CorruptRecordError):
    """A compressed batch inflates past the configured bound (a decompression bomb, or a batch larger than
    this gateway accepts); names topic, partition and the batch's offsets."""

    def __init__(self, message: str, *, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None, limit: int = 0, next_offset: int | None = None) -> None:
        super().__init__(message, topic=topic, partition=partition, offset=offset)
        self.limit = limit
        self.next_offset = next_offset


class TooLarge(Exception):
    """Raised by ``decompress_bounded``: the output passes the bound (``size`` when known, else -1)."""

    def __init__(self, size: int = -1) -> None:
        super().__init__(size)
        self.size = size


# Batches known to inflate past a bound, by (topic, partition, base offset, CRC, length, bound): refused again
# without decompressing (a reader retrying a bomb costs a lookup, not the bound's worth of CPU each time).
KNOWN_TOO_LARGE: dict[tuple[Any, ...], int] = {}
KNOWN_TOO_LARGE_MAX = 1024


def set_max_inflated_bytes(limit: int) -> None:
    """The process-wide bound on one batch's decompressed records section (``decode`` without ``max_inflated``)."""
    global _max_inflated
    if limit <= 0:
        raise ValueError("the inflated-size bound must be positive")
    _max_inflated = limit


def max_inflated_bytes() -> int:
    return _max_inflated


def _zstd_content_size(mv: memoryview) -> int | None:
    """The Frame_Content_Size a zstd frame header declares (a hint only), or None."""
    if len(mv) < 6 or mv[:4] != _ZSTD_MAGIC:
        return None
    fhd = mv[4]
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    fcs_size = (single, 2, 4, 8)[fcs_flag]
    if not fcs_size:
        return None
    pos = 5 + (0 if single else 1) + did_size
    if len(mv) < pos + fcs_size:
        return None
    n = int.from_bytes(mv[pos:pos + fcs_size], "little")
    return n + 256 if fcs_size == 2 else n


_U32 = struct.Struct("<I")
_LZ4_BLOCK_MAX = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}
_ZSTD_BLOCK_MAX = 1 << 17


def _is_skippable(magic: int) -> bool:  # zstd and lz4 share the skippable frame magics
    return 0x184D2A50 <= magic <= 0x184D2A5F


def _lz4_size_bound(mv: memoryview, limit: int) -> int | None:
    """An upper bound of an lz4 frame sequence's output from its block headers (a compressed block inflates
    to at most the frame's block maximum); stops once past ``limit``. None when the headers do not parse."""
    n = len(mv)
    pos = bound = 0
    try:
        while pos < n:
            (magic,) = _U32.unpack_from(mv, pos)
            if _is_skippable(magic):
                pos += 8 + _U32.unpack_from(mv, pos + 4)[0]
                continue
            if magic != 0x184D2204:
                return None
            flg, bd = mv[pos + 4], mv[pos + 5]
            block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7)
            if block_max is None:
                return None
            block_sum = 4 if flg & 0x10 else 0
            pos += 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
            while True:
                (size,) = _U32.unpack_from(mv, pos)
                pos += 4
                if size == 0:  # end mark, then the optional content checksum
                    pos += 4 if flg & 0x04 else 0
                    break
                raw = size & 0x7FFFFFFF
                bound += raw if size & 0x80000000 else block_max
                if bound > limit:
                    return bound
                pos += raw + block_sum
    except (struct.error, IndexError):
        return None
    return bound if pos == n else None


def _zstd_size_bound(mv: memoryview, limit: int) -> int | None:
    """An upper bound of a zstd frame sequence's output from its block headers (raw and RLE blocks state
    their size, a compressed block inflates to at most 128 KiB); stops once past ``limit``. None when the
    headers do not parse."""
    n = len(mv)
    pos = bound = 0
    try:
        while pos < n:
            (magic,) = _U32.unpack_from(mv, pos)
            if _is_skippable(magic):
                pos += 8 + _U32.unpack_from(mv, pos + 4)[0]
                continue
            if magic != 0xFD2FB528:
                return None
            fhd = mv[pos + 4]
            single = (fhd >> 5) & 1
            pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
            while True:
                h = mv[pos] | mv[pos + 1] << 8 | mv[pos + 2] << 16
                pos += 3
                btype, bsize = (h >> 1) & 3, h >> 3
                if btype == 0:  # raw
                    bound += bsize
                    pos += bsize
                elif btype == 1:  # RLE: one byte repeated bsize times
                    bound += bsize
                    pos += 1
                elif btype == 2:
                    bound += _ZSTD_BLOCK_MAX
                    pos += bsize
                else:
                    return None
                if bound > limit:
                    return bound
                if h & 1:  # last block
                    break
            pos += 4 if fhd & 0x04 else 0  # content checksum
    except (struct.error, IndexError):
        return None
    return bound if pos == n else None


def _decompress_into(codec: Any, data: Any, size: int, mapped: bool = False) -> memoryview:
    """Decompress into a buffer of ``size`` bytes (an anonymous mapping when ``mapped``: its pages are
    committed only as they are written); raises TooLarge when the output does not fit."""
    out: Any = mmap.mmap(-1, size) if mapped else bytearray(size)
    try:
        n = codec.decompress_into(data, out)
    except Exception as e:
        # Free the buffer now: a traceback keeps this frame (and its locals) alive until the exception is
        # collected, and several of them could hold several bounds' worth of written pages.
        out = None
        msg = str(e)
        if "whole buffer" in msg or "too small" in msg:  # cramjam: the output buffer is full, more is coming
            raise TooLarge() from None
        raise
    return memoryview(out)[:n]


def decompress_bounded(compression: int, data: bytes | memoryview, limit: int) -> Any:
    """Decompress a records section into at most ``limit`` bytes (bytes or a buffer); raises ``TooLarge``
    when it would inflate past ``limit``, ValueError / the codec's error for a malformed one.

    The output buffer is what bounds it: a size hint (gzip's trailer, an lz4 or zstd frame's block headers,
    zstd's declared content size) only picks a right-sized buffer first; a hint that lies fails to fit and
    the data is decompressed again into a mapping of ``limit + 1`` bytes, which decides."""
    if compression == Compression.NONE:
        return data
    if compression == Compression.SNAPPY:
        return _snappy_decompress(data, limit)
    mv = memoryview(data)
    n = len(mv)
    ratio = _MAX_RATIO.get(compression)
    if ratio is not None and n * ratio <= limit:
        return decompress(compression, data)  # cannot pass the bound: the fast path
    hint: int | None = None
    if compression == Compression.GZIP:
        codec: Any = cramjam.gzip
        if n >= 18 and mv[0] == 0x1F and mv[1] == 0x8B:
            hint = _U32.unpack_from(mv, n - 4)[0]  # ISIZE: the (last member's) size mod 2**32
    elif compression == Compression.LZ4:
        codec = cramjam.lz4
        hint = _lz4_size_bound(mv, limit)
    elif compression == Compression.ZSTD:
        codec = cramjam.zstd
        hint = _zstd_content_size(mv)
        if hint is not None and hint > limit:
            raise TooLarge(hint)
        if hint is None:
            hint = _zstd_size_bound(mv, limit)
    else:
        raise ValueError(f"unknown compression type {compression}")
    if hint is not None and hint <= limit:
        try:
            return _decompress_into(codec, data, hint)
        except Exception:  # a wrong hint (or corrupt data): decided below, within the bound
            pass
    out = _decompress_into(codec, data, limit + 1, mapped=True)
    if len(out) > limit:
        del out  # (see _decompress_into)
        raise TooLarge()
    return out


# -- codecs ---------------------------------------------------------------------------------------
def _snappy_decompress(data: bytes | memoryview, limit: int | None = None) -> bytes:
    """Raw or xerial-framed snappy. Raw snappy starts with its exact decompressed length (the codec refuses
    a stream whose output does not match it), so ``limit`` is checked before anything is decompressed."""
    mv = memoryview(data)
    if len(mv) < _XERIAL_HEADER_SIZE or mv[:8] != _XERIAL_MAGIC:
        if limit is not None and cramjam.snappy.decompress_raw_len(mv) > limit:
            raise TooLarge(cramjam.snappy.decompress_raw_len(mv))
        return bytes(cramjam.snappy.decompress_raw(mv))
    # xerial framing: 16-byte header, then (int32 length, raw snappy chunk)*
    parts: list[bytes] = []
    pos = _XERIAL_HEADER_SIZE
    end = len(mv)
    total = 0
    while pos < end:
        if end - pos < 4:
            raise ValueError("truncated xerial snappy block length")
        (n,) = _INT32.unpack_from(mv, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise ValueError("xerial snappy block runs past the end of the data")
        chunk = mv[pos:pos + n]
        if limit is not None:
            total += cramjam.snappy.decompress_raw_len(chunk)
            if total > limit:
                raise TooLarge(total)
        parts.append(bytes(cramjam.snappy.decompress_raw(chunk)))
        pos += n
    return b"".join(parts)


def _lz4_compress(data: bytes) -> bytes:
    # Independent blocks: Kafka's Java reader decompresses each frame block on its own.
    c = cramjam.lz4.Compressor(block_linked=False, content_checksum=False)
    c.compress(data)
    return bytes(c.finish())


def _gzip_decompress(data: bytes | memoryview) -> bytes:
    return bytes(cramjam.gzip.decompress(data))


def decompress(compression: int, data: bytes | memoryview) -> bytes:
    """Decompress a batch's records section. Raises ValueError for an unknown codec."""
    if compression == Compression.LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if compression == Compression.ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    if compression == Compression.SNAPPY:
        return _snappy_decompress(data)
    if compression == Compression.GZIP:
        return _gzip_decompress(data)
    if compression == Compression.NONE:
        return bytes(data)
    raise ValueError(f"unknown compression type {compression}")


def compress(compression: int, data: bytes) -> bytes:
    """Compress a records section the way the common Kafka clients do (raw snappy, lz4 frame...)."""
    if compression == Compression.NONE:
        return data
    if compression == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if compression == Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if compression == Compression.LZ4:
        return _lz4_compress(data)
    if compression == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))
    raise ValueError(f"unknown compression type {compression}")
