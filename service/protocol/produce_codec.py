"""Produce requests and answers by hand, for the producer's hot path.

The generated codec (``frames.encode_request`` / ``decode_response``) builds a message object per topic and
partition and reads every field of the answer into objects; a Produce request of the gateway is a few
partitions of payloads already encoded, and its answer is, nearly always, "no error" for each of them. Here:

- :func:`produce_body` writes a ProduceRequest body (v3-v11, flexible from v9) straight from
  ``(topic, [(partition, records bytes | None), ...])`` pairs, byte for byte what the generated encoder writes
  for the same request (unit test: tests/unit/protocol/test_produce_codec.py);
- :func:`decode_produce_ok` reads a ProduceResponse (v3-v11) when every partition answered without an error
  and nothing optional is present (no record errors, error message or tagged fields): ``[(topic, partition,
  base_offset), ...]``; anything else (an error, a tag, a malformed or unexpected answer) returns None and the
  caller decodes the answer with the generated decoder, which reads everything and names what is malformed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from service.protocol import primitives as P

MIN_VERSION = 3
MAX_VERSION = 11
FIRST_FLEXIBLE = 9

_ACKS_TIMEOUT = struct.Struct(">hi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PART = struct.Struct(">ihq")  # index, error_code, base_offset
_PART_SKIP_V5 = 16  # log_append_time_ms, log_start_offset
_PART_SKIP_V3 = 8  # log_append_time_ms

TopicData = tuple[str, Sequence[tuple[int, "bytes | None"]]]


def _uv(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14))
    return P.uvarint_bytes(value)


def produce_body(version: int, acks: int, timeout_ms: int, topics: Sequence[TopicData],
                 transactional_id: str | None = None) -> bytes:
    """A ProduceRequest body (no request header) in ``version`` (3..11)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"ProduceRequest v{version} is not written by hand")
    parts: list[bytes] = []
    append = parts.append
    pack_i32 = _I32.pack
    if version >= FIRST_FLEXIBLE:
        if transactional_id is None:
            append(b"\x00")
        else:
            tid = transactional_id.encode()
            append(_uv(len(tid) + 1))
            append(tid)
        append(_ACKS_TIMEOUT.pack(acks, timeout_ms))
        append(_uv(len(topics) + 1))
        for name, partitions in topics:
            raw = name.encode()
            append(_uv(len(raw) + 1))
            append(raw)
            append(_uv(len(partitions) + 1))
            for index, records in partitions:
                append(pack_i32(index))
                if records is None:
                    append(b"\x00")
                else:
                    append(_uv(len(records) + 1))
                    append(records)
                append(b"\x00")  # partition tagged fields
            append(b"\x00")  # topic tagged fields
        append(b"\x00")  # request tagged fields
    else:
        if transactional_id is None:
            append(b"\xff\xff")
        else:
            tid = transactional_id.encode()
            append(_I16.pack(len(tid)))
            append(tid)
        append(_ACKS_TIMEOUT.pack(acks, timeout_ms))
        append(pack_i32(len(topics)))
        for name, partitions in topics:
            raw = name.encode()
            append(_I16.pack(len(raw)))
            append(raw)
            append(pack_i32(len(partitions)))
            for index, records in partitions:
                append(pack_i32(index))
                if records is None:
                    append(b"\xff\xff\xff\xff")
                else:
                    append(pack_i32(len(records)))
                    append(records)
    return b"".join(parts)


def produce_frame(version: int, correlation_id: int, client_id: str | None, acks: int, timeout_ms: int,
                  topics: Sequence[TopicData], transactional_id: str | None = None) -> bytes:
    """A complete request frame (size prefix, request header v1/v2, body): what ``frames.encode_request``
    writes for the same ProduceRequest."""
    head = bytearray(struct.pack(">hhi", 0, version, correlation_id))
    P.write_nullable_string(head, client_id)
    if version >= FIRST_FLEXIBLE:
        head.append(0)
    body = produce_body(version, acks, timeout_ms, topics, transactional_id)
    return _I32.pack(len(head) + len(body)) + bytes(head) + body


def decode_produce_ok(version: int, payload: bytes | bytearray | memoryview) -> list[tuple[str, int, int]] | None:
    """``[(topic, partition, base_offset), ...]`` from a ProduceResponse frame (``payload`` starts with the
    correlation id) in which every partition answered error code 0 with nothing optional set; None for any
    other answer (decode it with the generated decoder)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        return None
    try:
        return _decode_ok(version, payload)
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):
        return None


def _count(b: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's count and the position after it: a one-byte compact count (flexible) or an int32; -1 for a
    null array or a multi-byte compact count (over 126 entries: not an answer this fast path takes)."""
    if flexible:
        n = b[pos] - 1
        return (n if n < 0x7F else -1), pos + 1
    (n,) = _I32.unpack_from(b, pos)
    return n, pos + 4


def _decode_ok(version: int, b: bytes | bytearray | memoryview) -> list[tuple[str, int, int]] | None:
    flexible = version >= FIRST_FLEXIBLE
    skip = _PART_SKIP_V5 if version >= 5 else _PART_SKIP_V3
    unpack_part = _PART.unpack_from
    out: list[tuple[str, int, int]] = []
    end = len(b)
    pos = 4  # correlation id
    if flexible:
        if b[pos] != 0:  # response header tagged fields
            return None
        pos += 1
    n, pos = _count(b, pos, flexible)
    if n < 0:
        return None
    for _ in range(n):
        if flexible:
            size = b[pos] - 1
            if size < 0 or size >= 0x7F:
                return None
            pos += 1
        else:
            (size,) = _I16.unpack_from(b, pos)
            if size < 0:
                return None
            pos += 2
        if pos + size > end:
            return None
        name = str(b[pos:pos + size], "utf-8")
        pos += size
        m, pos = _count(b, pos, flexible)
        if m < 0:
            return None
        for _ in range(m):
            index, code, base_offset = unpack_part(b, pos)
            if code:
                return None
            pos += 14 + skip
            if version >= 8:
                if flexible:
                    if b[pos] != 1 or b[pos + 1] != 0 or b[pos + 2] != 0:  # [] record_errors, null message, no tags
                        return None
                    pos += 3
                else:
                    if b[pos:pos + 6] != b"\x00\x00\x00\x00\xff\xff":  # [] record_errors, null error_message
                        return None
                    pos += 6
            out.append((name, index, base_offset))
        if flexible:
            if b[pos] != 0:  # topic tagged fields
                return None
            pos += 1
    pos += 4  # throttle_time_ms
    if flexible:
        if pos >= end or b[pos] != 0:  # response tagged fields
            return None
        pos += 1
    if pos != end:
        return None
    return out
