"""Kafka primitive types: unsigned varints, zigzag varints, classic/compact (nullable) strings and bytes, UUIDs."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.protocol import primitives as P
from service.protocol.errors import ProtocolDecodeError
from service.protocol.messages import compiled

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FAST = settings(max_examples=200, deadline=None, database=None)


def _w(fn: Callable[..., None], *args: Any) -> bytes:
    out = bytearray()
    fn(out, *args)
    return bytes(out)


# -- unsigned varints ----------------------------------------------------------------------------------

UVARINTS = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "8001"),
    (300, "ac02"),
    (16383, "ff7f"),
    (16384, "808001"),
    (INT32_MAX, "ffffffff07"),
    (2**32 - 1, "ffffffff0f"),
    (2**63 - 1, "ffffffffffffffff7f"),
    (2**64 - 1, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hexbytes"), UVARINTS)
def test_uvarint_known_encodings(value: int, hexbytes: str) -> None:
    encoded = bytes.fromhex(hexbytes)
    assert _w(P.write_uvarint, value) == encoded
    assert P.uvarint_bytes(value) == encoded
    # read at an offset, with trailing data: returns the position just after the varint
    assert P.read_uvarint(b"\xaa" + encoded + b"\xbb", 1) == (value, 1 + len(encoded))


def test_uvarint_rejects_negative() -> None:
    with pytest.raises(ValueError):
        _w(P.write_uvarint, -1)


def test_uvarint_too_long_is_a_decode_error() -> None:
    # 10 bytes is the longest valid (64-bit) varint; an 11th continuation is rejected.
    assert P.read_uvarint(b"\xff" * 9 + b"\x01", 0) == (2**64 - 1, 10)
    with pytest.raises(ProtocolDecodeError, match="too long"):
        P.read_uvarint(b"\xff" * 10 + b"\x01", 0)
    with pytest.raises(ProtocolDecodeError, match="too long"):
        P.read_uvarint(b"\x80" * 20, 0)


def test_truncated_uvarint_raises() -> None:
    # At the primitive level the buffer simply ends (IndexError); CompiledMessage.decode and the frame
    # decoders turn that into ProtocolDecodeError (see the message-level test below).
    with pytest.raises(IndexError):
        P.read_uvarint(b"\x80\x80", 0)
    with pytest.raises(IndexError):
        P.read_uvarint(b"", 0)


@FAST
@given(st.integers(0, 2**64 - 1))
def test_uvarint_roundtrip(value: int) -> None:
    encoded = P.uvarint_bytes(value)
    assert P.read_uvarint(encoded, 0) == (value, len(encoded))
    assert len(encoded) == max(1, (value.bit_length() + 6) // 7)


# -- zigzag (signed) varints -----------------------------------------------------------------------------

ZIGZAG = [
    (0, 0, "00"),
    (-1, 1, "01"),
    (1, 2, "02"),
    (-2, 3, "03"),
    (63, 126, "7e"),
    (-64, 127, "7f"),
    (64, 128, "8001"),
    (INT32_MAX, 2**32 - 2, "feffffff0f"),
    (INT32_MIN, 2**32 - 1, "ffffffff0f"),
    (INT64_MAX, 2**64 - 2, "feffffffffffffffff01"),
    (INT64_MIN, 2**64 - 1, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "zz", "hexbytes"), ZIGZAG)
def test_zigzag_varint_known_encodings(value: int, zz: int, hexbytes: str) -> None:
    assert P.zigzag(value) == zz
    assert _w(P.write_varint, value) == bytes.fromhex(hexbytes)
    assert P.read_varint(bytes.fromhex(hexbytes), 0) == (value, len(hexbytes) // 2)


@FAST
@given(st.integers(INT64_MIN, INT64_MAX))
def test_zigzag_varint_roundtrip(value: int) -> None:
    encoded = _w(P.write_varint, value)
    assert P.read_varint(encoded, 0) == (value, len(encoded))
    assert P.zigzag(value) >= 0


def test_zigzag_int32_matches_32_bit_formula() -> None:
    # Kafka's 32-bit zigzag is (n << 1) ^ (n >> 31); for int32 values our 64-bit form gives the same result.
    for n in (0, 1, -1, 12345, -12345, INT32_MAX, INT32_MIN):
        assert P.zigzag(n) == ((n << 1) ^ (n >> 31)) & 0xFFFFFFFF


# -- strings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "classic", "compact"),
    [
        ("", "0000", "01"),
        ("abc", "0003616263", "04616263"),
        ("é", "0002c3a9", "03c3a9"),  # lengths count UTF-8 bytes, not characters
        ("€😀", "0007e282acf09f9880", "08e282acf09f9880"),
    ],
)
def test_string_encodings(value: str, classic: str, compact: str) -> None:
    assert _w(P.write_string, value) == bytes.fromhex(classic)
    assert _w(P.write_nullable_string, value) == bytes.fromhex(classic)
    assert _w(P.write_compact_string, value) == bytes.fromhex(compact)
    assert _w(P.write_compact_nullable_string, value) == bytes.fromhex(compact)
    for reader, enc in [(P.read_string, classic), (P.read_nullable_string, classic),
                        (P.read_compact_string, compact), (P.read_compact_nullable_string, compact)]:
        data = bytes.fromhex(enc)
        assert reader(data + b"\x99", 0) == (value, len(data))
        assert reader(memoryview(b"\x00" + data), 1) == (value, 1 + len(data))


def test_null_strings() -> None:
    assert _w(P.write_nullable_string, None) == b"\xff\xff"
    assert _w(P.write_compact_nullable_string, None) == b"\x00"
    assert P.read_nullable_string(b"\xff\xff", 0) == (None, 2)
    assert P.read_compact_nullable_string(b"\x00", 0) == (None, 1)
    with pytest.raises(ProtocolDecodeError):
        P.read_string(b"\xff\xff", 0)
    with pytest.raises(ProtocolDecodeError):
        P.read_compact_string(b"\x00", 0)
    with pytest.raises(ValueError):
        _w(P.write_string, None)
    with pytest.raises(ValueError):
        _w(P.write_compact_string, None)


def test_compact_string_with_multibyte_length() -> None:
    s = "x" * 200
    encoded = _w(P.write_compact_string, s)
    assert encoded[:2] == b"\xc9\x01"  # 201 as a varint
    assert P.read_compact_string(encoded, 0) == (s, 202)


def test_classic_string_length_limit() -> None:
    _w(P.write_string, "a" * 0x7FFF)
    with pytest.raises(ValueError):
        _w(P.write_string, "a" * 0x8000)
    with pytest.raises(ValueError):
        _w(P.write_string, "é" * 0x4000)  # 32768 bytes


@pytest.mark.parametrize(
    ("reader", "data"),
    [
        (P.read_string, b"\x00\x05abc"),
        (P.read_nullable_string, b"\x00\x05abc"),
        (P.read_compact_string, b"\x06abc"),
        (P.read_compact_nullable_string, b"\x06abc"),
    ],
)
def test_string_running_past_the_end(reader: Callable[[bytes, int], tuple[Any, int]], data: bytes) -> None:
    with pytest.raises(ProtocolDecodeError, match="past the end"):
        reader(data, 0)


# -- bytes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "classic", "compact"),
    [(b"", "00000000", "01"), (b"ab", "000000026162", "036162"), (b"\x00" * 3, "00000003000000", "04000000")],
)
def test_bytes_encodings(value: bytes, classic: str, compact: str) -> None:
    assert _w(P.write_bytes, value) == bytes.fromhex(classic)
    assert _w(P.write_nullable_bytes, value) == bytes.fromhex(classic)
    assert _w(P.write_compact_bytes, value) == bytes.fromhex(compact)
    assert _w(P.write_compact_nullable_bytes, value) == bytes.fromhex(compact)
    for reader, enc in [(P.read_bytes, classic), (P.read_nullable_bytes, classic),
                        (P.read_compact_bytes, compact), (P.read_compact_nullable_bytes, compact)]:
        data = bytes.fromhex(enc)
        got, pos = reader(memoryview(data + b"\x01"), 0)
        assert (got, pos) == (value, len(data))
        assert type(got) is bytes  # a copy, not a view into the receive buffer


def test_null_bytes() -> None:
    assert _w(P.write_nullable_bytes, None) == b"\xff\xff\xff\xff"
    assert _w(P.write_compact_nullable_bytes, None) == b"\x00"
    assert P.read_nullable_bytes(b"\xff\xff\xff\xff", 0) == (None, 4)
    assert P.read_compact_nullable_bytes(b"\x00", 0) == (None, 1)
    with pytest.raises(ProtocolDecodeError):
        P.read_bytes(b"\xff\xff\xff\xff", 0)
    with pytest.raises(ProtocolDecodeError):
        P.read_compact_bytes(b"\x00", 0)
    with pytest.raises(ValueError):
        _w(P.write_bytes, None)
    with pytest.raises(ValueError):
        _w(P.write_compact_bytes, None)
    with pytest.raises(ProtocolDecodeError, match="past the end"):
        P.read_bytes(b"\x00\x00\x00\x09abc", 0)
    with pytest.raises(ProtocolDecodeError, match="past the end"):
        P.read_compact_nullable_bytes(b"\x0aabc", 0)


# -- uuids -----------------------------------------------------------------------------------------------


def test_uuid_bytes() -> None:
    u = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    assert P.uuid_bytes(u) == bytes.fromhex("6ba7b8109dad11d180b400c04fd430c8")
    assert P.uuid_bytes(None) == b"\x00" * 16
    assert P.uuid_bytes(u.bytes) == u.bytes
    assert P.ZERO_UUID == uuid.UUID(int=0)
    with pytest.raises(ValueError):
        P.uuid_bytes(b"\x01" * 15)


# -- the same failures surface as ProtocolDecodeError at message level -------------------------------------


def test_message_level_decode_errors_are_protocol_decode_errors() -> None:
    cm = compiled("SaslHandshakeRequest")
    assert cm.decode(b"\x00\x05PLAIN", 1).mechanism == "PLAIN"
    for bad in (b"", b"\x00", b"\x00\x05PLA", b"\xff\xff", b"\x00\x02\xc3\x28"):  # last: invalid UTF-8
        with pytest.raises(ProtocolDecodeError):
            cm.decode(bad, 1)
    flex = compiled("SaslAuthenticateRequest")
    assert flex.decode(b"\x03ab\x00", 2).auth_bytes == b"ab"
    for bad in (b"\x80", b"\x03ab", b"\x00\x00", b"\x03ab\x01\x05\x04xy", b"\xff" * 11):
        with pytest.raises(ProtocolDecodeError):
            flex.decode(bad, 2)
