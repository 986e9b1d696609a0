"""Requests written in one event-loop iteration leave in one write(); heartbeats fall due on a shared tick."""

from __future__ import annotations

import asyncio

from service.client.connection import COALESCE_MAX_BYTES, BrokerConnection, ConnectionConfig
from service.client.errors import KafkaConnectionError
from service.group.coordinator import HEARTBEAT_TICK_S, on_tick


class FakeWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def connection() -> tuple[BrokerConnection, FakeWriter]:
    conn = BrokerConnection("127.0.0.1", 1, ConnectionConfig())
    writer = FakeWriter()
    conn._writer = writer  # type: ignore[assignment]
    return conn, writer


async def test_frames_of_one_iteration_leave_in_one_write_in_order() -> None:
    conn, writer = connection()
    conn._write(b"a1")
    conn._write(b"b22")
    conn._write(b"c333")
    assert writer.writes == []  # queued until the end of this iteration
    await asyncio.sleep(0)
    assert writer.writes == [b"a1b22c333"]
    conn._write(b"d")
    await asyncio.sleep(0)
    assert writer.writes == [b"a1b22c333", b"d"]


async def test_a_large_frame_goes_at_once_after_what_is_queued() -> None:
    conn, writer = connection()
    conn._write(b"small")
    big = b"x" * COALESCE_MAX_BYTES
    conn._write(big)
    assert writer.writes == [b"small", big]  # order kept, nothing waits for the loop
    await asyncio.sleep(0)
    assert writer.writes == [b"small", big]


async def test_a_failed_connection_drops_its_queue() -> None:
    conn, writer = connection()
    conn._write(b"lost")
    conn._fail(KafkaConnectionError("test"))
    await asyncio.sleep(0)
    assert writer.writes == [] and writer.closed


def test_heartbeat_delays_end_on_the_shared_tick() -> None:
    for now in (0.0, 1.2345, 1000.017, 98765.4321):
        for delay in (0.0, 0.5, 2.4, 3.0):
            d = on_tick(now, delay)
            assert delay - 1e-9 <= d < delay + HEARTBEAT_TICK_S + 1e-9
            ticks = (now + d) / HEARTBEAT_TICK_S
            assert abs(ticks - round(ticks)) < 1e-6
    # two members whose heartbeats fall due within one tick wake together
    assert abs((10.001 + on_tick(10.001, 3.0)) - (10.013 + on_tick(10.013, 2.996))) < 1e-9
