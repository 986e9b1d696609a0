"""Kafka primitive types: fixed ints, varints, (compact/nullable) strings and bytes, UUIDs.

Readers take ``(buf, pos)`` and return ``(value, new_pos)``; writers append to a ``bytearray``.
"""

from __future__ import annotations

import struct
import uuid

from service.protocol.errors import ProtocolDecodeError

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT32 = struct.Struct(">I")
NULL_ARRAY32 = INT32.pack(-1)
NULL_STRING16 = INT16.pack(-1)
NULL_COMPACT = b"\x00"
ZERO_UUID = uuid.UUID(int=0)


# -- varints -------------------------------------------------------------------------------------
def read_uvarint(b: bytes | memoryview, pos: int) -> tuple[int, int]:
    x = b[pos]
    pos += 1
    if x < 0x80:
        return x, pos
    result = x & 0x7F
    shift = 7
    while True:
        x = b[pos]
        pos += 1
        result |= (x & 0x7F) << shift
        if x < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolDecodeError("varint is too long")


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def read_varint(b: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Zigzag-encoded signed varint (also used for varlong)."""
    u, pos = read_uvarint(b, pos)
    return (u >> 1) ^ -(u & 1), pos


def write_varint(out: bytearray, value: int) -> None:
    write_uvarint(out, (value << 1) ^ (value >> 63))


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


# -- strings -------------------------------------------------------------------------------------
def read_string(b: bytes | memoryview, pos: int) -> tuple[str, int]:
    (n,) = INT16.unpack_from(b, pos)
    pos += 2
    if n < 0:
        raise ProtocolDecodeError("null string in a non-nullable field")
    end = pos + n
    if end > len(b):
        raise ProtocolDecodeError("string runs past the end of the buffer")
    return str(b[pos:end], "utf-8"), end


def read_nullable_string(b: bytes | memoryview, pos: int) -> tuple[str | None, int]:
    (n,) = INT16.unpack_from(b, pos)
    pos += 2
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(b):
        raise ProtocolDecodeError("string runs past the end of the buffer")
    return str(b[pos:end], "utf-8"), end


def read_compact_string(b: bytes | memoryview, pos: int) -> tuple[str, int]:
    n, pos = read_uvarint(b, pos)
    if n == 0:
        raise ProtocolDecodeError("null string in a non-nullable field")
    end = pos + n - 1
    if end > len(b):
        raise ProtocolDecodeError("string runs past the end of the buffer")
    return str(b[pos:end], "utf-8"), end


def read_compact_nullable_string(b: bytes | memoryview, pos: int) -> tuple[str | None, int]:
    n, pos = read_uvarint(b, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(b):
        raise ProtocolDecodeError("string runs past the end of the buffer")
    return str(b[pos:end], "utf-8"), end


def write_string(out: bytearray, s: str) -> None:
    if s is None:
        raise ValueError("null string in a non-nullable field")
    e = s.encode()
    if len(e) > 0x7FFF:
        raise ValueError("string longer than 32767 bytes")
    out += INT16.pack(len(e))
    out += e


def write_nullable_string(out: bytearray, s: str | None) -> None:
    if s is None:
        out += NULL_STRING16
    else:
        write_string(out, s)


def write_compact_string(out: bytearray, s: str) -> None:
    if s is None:
        raise ValueError("null string in a non-nullable field")
    e = s.encode()
    write_uvarint(out, len(e) + 1)
    out += e


def write_compact_nullable_string(out: bytearray, s: str | None) -> None:
    if s is None:
        out.append(0)
    else:
        write_compact_string(out, s)


# -- bytes ---------------------------------------------------------------------------------------
def read_bytes(b: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    v, pos = read_nullable_bytes(b, pos)
    if v is None:
        raise ProtocolDecodeError("null bytes in a non-nullable field")
    return v, pos


def read_nullable_bytes(b: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    (n,) = INT32.unpack_from(b, pos)
    pos += 4
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(b):
        raise ProtocolDecodeError("bytes run past the end of the buffer")
    return bytes(b[pos:end]), end


def read_nullable_records(b: bytes | memoryview, pos: int) -> tuple[memoryview | None, int]:
    """A ``records`` field (non-flexible versions): a zero-copy view of the frame, not a copy (a Fetch
    response's records are megabytes, decoded straight from the frame)."""
    (n,) = INT32.unpack_from(b, pos)
    pos += 4
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(b):
        raise ProtocolDecodeError("bytes run past the end of the buffer")
    return memoryview(b)[pos:end], end


def read_compact_nullable_records(b: bytes | memoryview, pos: int) -> tuple[memoryview | None, int]:
    """A ``records`` field (flexible versions), as :func:`read_nullable_records`."""
    n, pos = read_uvarint(b, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(b):
        raise ProtocolDecodeError("bytes run past the end of the buffer")
    return memoryview(b)[pos:end], end


def read_compact_bytes(b: bytes | memoryview, pos: int) -> tuple[bytes, int]:
    v, pos = read_compact_nullable_bytes(b, pos)
    if v is None:
        raise ProtocolDecodeError("null bytes in a non-nullable field")
    return v, pos


def read_compact_nullable_bytes(b: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_uvarint(b, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(b):
        raise ProtocolDecodeError("bytes run past the end of the buffer")
    return bytes(b[pos:end]), end


def write_bytes(out: bytearray, v: bytes) -> None:
    if v is None:
        raise ValueError("null bytes in a non-nullable field")
    out += INT32.pack(len(v))
    out += v


def write_nullable_bytes(out: bytearray, v: bytes | None) -> None:
    if v is None:
        out += NULL_ARRAY32
    else:
        out += INT32.pack(len(v))
        out += v


def write_compact_bytes(out: bytearray, v: bytes) -> None:
    if v is None:
        raise ValueError("null bytes in a non-nullable field")
    write_uvarint(out, len(v) + 1)
    out += v


def write_compact_nullable_bytes(out: bytearray, v: bytes | None) -> None:
    if v is None:
        out.append(0)
    else:
        write_uvarint(out, len(v) + 1)
        out += v


def uuid_bytes(u: uuid.UUID | bytes | None) -> bytes:
    if u is None:
        return ZERO_UUID.bytes
    if isinstance(u, bytes):
        if len(u) != 16:
            raise ValueError("a UUID is 16 bytes")
        return u
    return u.bytes
