"""The Confluent wire format of schema'd record keys and values (sans-io).

A framed payload is: the magic byte ``0``, the schema id as a 4-byte big-endian unsigned integer, for Protobuf
the message-index list (the path of the record's message type in the schema's file descriptor), then the
serialized record. The index list is a zigzag varint count followed by that many zigzag varint indexes; the
common case ``[0]`` (the file's first message) is written as the single byte ``0`` (a count of zero means
``[0]``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC_BYTE = 0
#: magic byte + schema id
HEADER_SIZE = 5
#: bound on the message-index count a reader accepts (nesting depth of a message type; Confluent's bound)
MAX_MESSAGE_INDEXES = 100_000

_HEADER = struct.Struct(">BI")


class WireFormatError(ValueError):
    """A key or value is not a well-formed Confluent wire-format payload."""


class NoMagicByte(WireFormatError):
    """The payload does not start with the magic byte 0 (not written by a Schema Registry serializer)."""


class FrameTooShort(WireFormatError):
    """The payload ends inside the header (magic byte, schema id or message-index list)."""


class BadMessageIndexes(WireFormatError):
    """The Protobuf message-index list is malformed (negative count or index, count too large, bad varint)."""


@dataclass(frozen=True, slots=True)
class Unframed:
    """A parsed frame: the schema id, the Protobuf message indexes (``None`` for other formats) and the
    serialized record (a zero-copy view of the input)."""

    schema_id: int
    payload: memoryview
    message_indexes: tuple[int, ...] | None = None


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _write_varint(out: bytearray, value: int) -> None:
    v = _zigzag(value) & 0xFFFFFFFFFFFFFFFF
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def encode_message_indexes(indexes: list[int] | tuple[int, ...]) -> bytes:
    """The message-index list as written after the schema id (``[0]`` -> ``b"\\x00"``)."""
    if not indexes:
        raise ValueError("a message-index list has at least one index")
    if any(i < 0 for i in indexes):
        raise ValueError(f"message indexes are not negative: {list(indexes)}")
    if len(indexes) == 1 and indexes[0] == 0:
        return b"\x00"
    out = bytearray()
    _write_varint(out, len(indexes))
    for i in indexes:
        _write_varint(out, i)
    return bytes(out)


def frame_header(schema_id: int, message_indexes: list[int] | tuple[int, ...] | None = None) -> bytes:
    """The bytes before the serialized record: magic byte, schema id and (Protobuf) the message indexes."""
    if not 0 <= schema_id <= 0xFFFFFFFF:
        raise ValueError(f"schema id out of range: {schema_id}")
    head = _HEADER.pack(MAGIC_BYTE, schema_id)
    return head if message_indexes is None else head + encode_message_indexes(message_indexes)


def frame(schema_id: int, payload: bytes, message_indexes: list[int] | tuple[int, ...] | None = None) -> bytes:
    """``payload`` framed for schema ``schema_id`` (pass ``message_indexes`` for Protobuf)."""
    return frame_header(schema_id, message_indexes) + payload


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise FrameTooShort("the payload ends inside the Protobuf message-index list")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise BadMessageIndexes("varint longer than 10 bytes in the Protobuf message-index list")
    value &= 0xFFFFFFFFFFFFFFFF
    return (value >> 1) ^ -(value & 1), pos


def schema_id_of(data: bytes | bytearray | memoryview) -> int:
    """The schema id of a framed payload (checks only the 5-byte header)."""
    if len(data) < 1 or data[0] != MAGIC_BYTE:
        raise NoMagicByte(_no_magic_text(data))
    if len(data) < HEADER_SIZE:
        raise FrameTooShort(f"{len(data)} bytes: shorter than the 5-byte magic byte and schema id")
    return _HEADER.unpack_from(data)[1]


def unframe(data: bytes | bytearray | memoryview, *, protobuf: bool = False) -> Unframed:
    """Parse a framed payload; ``protobuf=True`` reads the message-index list after the schema id."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    schema_id = schema_id_of(view)
    if not protobuf:
        return Unframed(schema_id, view[HEADER_SIZE:])
    count, pos = _read_varint(view, HEADER_SIZE)
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise BadMessageIndexes(f"message-index count {count} out of range 0..{MAX_MESSAGE_INDEXES}")
    if count == 0:
        return Unframed(schema_id, view[pos:], (0,))
    indexes = []
    for _ in range(count):
        index, pos = _read_varint(view, pos)
        if index < 0:
            raise BadMessageIndexes(f"negative message index {index}")
        indexes.append(index)
    return Unframed(schema_id, view[pos:], tuple(indexes))


def _no_magic_text(data: bytes | bytearray | memoryview) -> str:
    if not len(data):
        return "empty payload: no magic byte"
    return f"first byte {data[0]}, not the magic byte 0 of the Confluent wire format"
