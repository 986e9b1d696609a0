"""The broker connection's frame reader (service/client/connection.py ``_KafkaProtocol``, a buffered
protocol): small frames come out of the reusable scratch buffer as bytes, a frame larger than it is read into a
buffer of its own, and however the stream is cut into reads every frame comes out whole, in order, once."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest

from service.client import connection as C
from service.client.errors import FrameTooLargeError, KafkaError


@dataclass
class _Config:
    max_frame_bytes: int = 256 * 1024 * 1024


@dataclass
class _Conn:
    config: _Config = field(default_factory=_Config)
    address: str = "test:9092"
    frames: list[tuple[bytes, int, type]] = field(default_factory=list)
    failed: list[KafkaError] = field(default_factory=list)

    def _on_frame(self, payload: Any, size: int) -> None:
        self.frames.append((bytes(payload), size, type(payload)))

    def _fail(self, exc: KafkaError) -> None:
        self.failed.append(exc)


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _bodies(rng: random.Random) -> list[bytes]:
    sizes = [4, 5, 100, C.SCRATCH_BYTES - 4, C.SCRATCH_BYTES - 3, C.SCRATCH_BYTES, C.SCRATCH_BYTES * 3 + 7, 4, 9,
             200_000, 60]
    return [rng.randbytes(n) for n in sizes]


def _feed(proto: Any, data: bytes, cuts: list[int]) -> None:
    """Deliver data through get_buffer / buffer_updated, each read at most the next cut's size."""
    pos = 0
    i = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos, cuts[i % len(cuts)])
        buf[:n] = data[pos:pos + n]
        proto.buffer_updated(n)
        pos += n
        i += 1


@pytest.mark.parametrize("cuts", [[1], [3], [4], [7, 1, 4096], [65536], [10**9], [5, 40_000, 2, 13]])
async def test_every_frame_whole_in_order_however_cut(cuts: list[int]) -> None:
    rng = random.Random(sum(cuts))
    bodies = _bodies(rng)
    conn = _Conn()
    proto = C._KafkaProtocol(conn)  # type: ignore[arg-type]
    _feed(proto, b"".join(_frame(b) for b in bodies), cuts)
    assert [f[0] for f in conn.frames] == bodies
    assert [f[1] for f in conn.frames] == [len(b) for b in bodies]
    # small frames are bytes (copied out of the reused scratch buffer); large ones keep their own buffer
    for body, _, kind in conn.frames:
        assert kind is (bytes if len(body) + 4 <= C.SCRATCH_BYTES else bytearray)
    assert not conn.failed
    assert proto.frame is None and proto.start == proto.end == 0


async def test_random_cuts_and_data_received_path() -> None:
    rng = random.Random(7)
    for _ in range(20):
        bodies = [rng.randbytes(rng.choice([4, 10, 1000, C.SCRATCH_BYTES, 3 * C.SCRATCH_BYTES])) for _ in range(12)]
        data = b"".join(_frame(b) for b in bodies)
        conn = _Conn()
        proto = C._KafkaProtocol(conn)  # type: ignore[arg-type]
        pos = 0
        while pos < len(data):  # the non-buffered entry point, in random pieces
            n = rng.randint(1, 3 * C.SCRATCH_BYTES)
            proto.data_received(data[pos:pos + n])
            pos += n
        assert [f[0] for f in conn.frames] == bodies


async def test_a_bad_size_fails_the_connection_once_and_drops_the_rest() -> None:
    conn = _Conn(config=_Config(max_frame_bytes=1000))
    proto = C._KafkaProtocol(conn)  # type: ignore[arg-type]
    _feed(proto, _frame(b"okay") + _frame(b"x" * 1001) + _frame(b"late"), [10**9])
    assert [f[0] for f in conn.frames] == [b"okay"]
    assert len(conn.failed) == 1 and isinstance(conn.failed[0], FrameTooLargeError)
    _feed(proto, _frame(b"more"), [10**9])  # after the failure nothing more is parsed
    assert [f[0] for f in conn.frames] == [b"okay"] and len(conn.failed) == 1
    conn2 = _Conn()
    proto2 = C._KafkaProtocol(conn2)  # type: ignore[arg-type]
    _feed(proto2, b"\x00\x00\x00\x02ab", [10**9])  # below the 4-byte minimum (a correlation id)
    assert isinstance(conn2.failed[0], FrameTooLargeError)


async def test_frame_buffer_helper() -> None:
    buf = C._frame_buffer(1000)
    assert isinstance(buf, bytearray) and len(buf) == 1000
    assert C._frame_buffer(0) == bytearray()
    assert C._frame_buffer_py(3) == bytearray(3)
