"""Requests written in one event-loop iteration leave in one write(); heartbeats fall due on a shared tick
(TickTimers); request timeouts are swept per connection."""

from __future__ import annotations

import asyncio

import pytest

from service.aio import LightEvent, TickTimers, tick_timers
from service.client.connection import COALESCE_MAX_BYTES, BrokerConnection, ConnectionConfig
from service.client.errors import KafkaConnectionError, RequestTimeoutError
from service.protocol import messages as M


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


async def test_tick_timers_wake_waiters_of_one_tick_together_with_one_loop_timer() -> None:
    loop = asyncio.get_running_loop()
    ticks = TickTimers(loop, 0.05)
    now = loop.time()
    base = (int(now / 0.05) + 2) * 0.05  # a tick boundary ahead
    ev = [LightEvent() for _ in range(5)]
    order: list[int] = []

    async def waiter(i: int, when: float) -> None:
        assert await ev[i].wait_tick(when, ticks) is (i == 3)
        order.append(i)

    whens = [base + 0.001, base + 0.049, base + 0.05, base + 0.02, base + 0.12]  # ticks k+1, k+1, k+1, k+1, k+3
    tasks = [asyncio.create_task(waiter(i, w)) for i, w in enumerate(whens)]
    await asyncio.sleep(0)
    assert len(ticks) == 5
    ev[3].set()  # ends early: left done in its bucket, skipped when the tick fires
    await asyncio.gather(*tasks[:4])
    assert loop.time() >= base + 0.05 - 0.002  # not before its tick (the loop clock has ms resolution)
    assert ticks.fired == 1 and sorted(order) == [0, 1, 2, 3]
    await tasks[4]
    assert loop.time() >= base + 0.15 - 0.002 and ticks.fired == 2 and len(ticks) == 0


async def test_tick_timers_rearm_for_an_earlier_tick() -> None:
    loop = asyncio.get_running_loop()
    ticks = TickTimers(loop, 0.02)
    late, early = LightEvent(), LightEvent()
    t_late = asyncio.create_task(late.wait_tick(loop.time() + 5.0, ticks))
    await asyncio.sleep(0)
    started = loop.time()
    assert await early.wait_tick(loop.time() + 0.03, ticks) is False
    assert loop.time() - started < 1.0 and not t_late.done()
    late.set()
    assert await t_late is True
    assert tick_timers(loop, 0.02) is tick_timers(loop, 0.02) and tick_timers(loop, 0.02) is not ticks


async def test_request_timeouts_are_swept_without_a_timer_per_request() -> None:
    conn, writer = connection()
    conn._loop = asyncio.get_running_loop()
    with pytest.raises(RequestTimeoutError, match=r"timed out after 0\.2s"):
        await conn._send_raw(M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 4, raw=False,
                             timeout=0.2)
    assert conn._pending == {} and conn._sweep_handle is None  # the sweep stops once nothing is pending
    assert len(writer.writes) == 1
