"""Requests written in one event-loop iteration leave in one write(); heartbeats fall due on a shared tick
(TickTimers); request timeouts are swept per connection."""

from __future__ import annotations

import asyncio

import pytest

from service.client.connection import COALESCE_MAX_BYTES, BrokerConnection, ConnectionConfig
from service.client.errors import KafkaConnectionError, RequestTimeoutError
from service.lib.aio import TickTimers, tick_timers
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
    futs: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(5)]
    order: list[int] = []
    whens = [base + 0.001, base + 0.049, base + 0.05, base + 0.02, base + 0.12]  # ticks k+1, k+1, k+1, k+1, k+3
    for i, w in enumerate(whens):
        ticks.add(futs[i], w)
        futs[i].add_done_callback(lambda _f, i=i: order.append(i))
    assert len(ticks) == 5
    futs[3].cancel()  # ends early: left done in its bucket, skipped when the tick fires
    assert await asyncio.gather(*futs[:3]) == [False, False, False]
    assert loop.time() >= base + 0.05 - 0.002  # not before its tick (the loop clock has ms resolution)
    assert ticks.fired == 1 and sorted(order) == [0, 1, 2, 3]
    assert await futs[4] is False
    assert loop.time() >= base + 0.15 - 0.002 and ticks.fired == 2 and len(ticks) == 0


async def test_tick_timers_take_future_like_entries() -> None:
    """Anything with done() and set_result() can wait on the ticks (the heartbeat driver's due entries)."""
    loop = asyncio.get_running_loop()
    ticks = TickTimers(loop, 0.02)
    fired: list[str] = []

    class Due:
        def __init__(self, name: str, live: bool) -> None:
            self.name, self.live = name, live

        def done(self) -> bool:
            return not self.live

        def set_result(self, value: object) -> None:
            fired.append(f"{self.name}={value}")

    last: asyncio.Future[bool] = loop.create_future()
    ticks.add(Due("live", True), loop.time() + 0.01)  # type: ignore[arg-type]
    ticks.add(Due("dropped", False), loop.time() + 0.01)  # type: ignore[arg-type]
    ticks.add(last, loop.time() + 0.03)
    assert await last is False
    assert fired == ["live=False"]


async def test_tick_timers_rearm_for_an_earlier_tick() -> None:
    loop = asyncio.get_running_loop()
    ticks = TickTimers(loop, 0.02)
    late: asyncio.Future[bool] = loop.create_future()
    early: asyncio.Future[bool] = loop.create_future()
    ticks.add(late, loop.time() + 5.0)
    started = loop.time()
    ticks.add(early, loop.time() + 0.03)
    assert await early is False
    assert loop.time() - started < 1.0 and not late.done()
    late.cancel()
    assert tick_timers(loop, 0.02) is tick_timers(loop, 0.02) and tick_timers(loop, 0.02) is not ticks


async def test_request_timeouts_are_swept_without_a_timer_per_request() -> None:
    conn, writer = connection()
    conn._loop = asyncio.get_running_loop()
    with pytest.raises(RequestTimeoutError, match=r"timed out after 0\.2s"):
        await conn._send_raw(M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 4, raw=False,
                             timeout=0.2)
    assert conn._pending == {} and conn._sweep_handle is None  # the sweep stops once nothing is pending
    assert len(writer.writes) == 1


# -- send_nowait: requests whose answers are handled in a callback (heartbeats from the shared tick) ------
def answer(conn: BrokerConnection, corr: int, resp: object, version: int = 4) -> None:
    """Feed the connection's read callback the frame of ``resp`` for correlation id ``corr``."""
    from service.protocol import frames

    frame = frames.encode_response(resp, version, corr)  # type: ignore[arg-type]
    conn._on_frame(frame[4:], len(frame) - 4)


HB = M.HeartbeatRequest(group_id="g", generation_id=1, member_id="m")


async def test_send_nowait_calls_back_with_the_decoded_answer() -> None:
    conn, writer = connection()
    conn._loop = asyncio.get_running_loop()
    got: list[tuple[object, object]] = []
    conn.send_nowait(HB, 4, lambda resp, exc: got.append((resp, exc)))
    conn.send_nowait(HB, 4, lambda resp, exc: got.append((resp, exc)))
    await asyncio.sleep(0)
    assert len(writer.writes) == 1 and conn.in_flight == 2  # both frames in one write
    answer(conn, 1, M.HeartbeatResponse(throttle_time_ms=0, error_code=27))
    answer(conn, 0, M.HeartbeatResponse(throttle_time_ms=0, error_code=0))
    assert [(getattr(r, "error_code", None), e) for r, e in got] == [(27, None), (0, None)]
    assert conn.in_flight == 0
    answer(conn, 0, M.HeartbeatResponse(throttle_time_ms=0, error_code=0))  # a stray answer: ignored
    assert len(got) == 2


async def test_send_nowait_reports_timeouts_failures_and_a_closed_connection() -> None:
    conn, _writer = connection()
    conn._loop = loop = asyncio.get_running_loop()
    done: asyncio.Future[BaseException | None] = loop.create_future()
    conn.send_nowait(HB, 4, lambda _r, exc: done.set_result(exc), timeout=0.2)
    exc = await done
    assert isinstance(exc, RequestTimeoutError) and "HeartbeatRequest v4" in str(exc) and "0.2s" in str(exc)
    errors: list[BaseException | None] = []
    conn.send_nowait(HB, 4, lambda _r, e: errors.append(e))
    conn._fail(KafkaConnectionError("broker went away"))
    assert [str(e) for e in errors] == ["broker went away"]
    conn.send_nowait(HB, 4, lambda _r, e: errors.append(e))  # closed: called back at once
    assert len(errors) == 2 and isinstance(errors[1], KafkaConnectionError)


async def test_a_failing_callback_does_not_break_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    conn, writer = connection()
    conn._loop = asyncio.get_running_loop()

    def boom(_resp: object, _exc: object) -> None:
        raise RuntimeError("callback bug")

    got: list[object] = []
    conn.send_nowait(HB, 4, boom)
    conn.send_nowait(HB, 4, lambda resp, _e: got.append(resp))
    answer(conn, 0, M.HeartbeatResponse(throttle_time_ms=0, error_code=0))
    answer(conn, 1, M.HeartbeatResponse(throttle_time_ms=0, error_code=0))
    assert len(got) == 1 and conn.connected and not writer.closed
    assert "callback of HeartbeatRequest v4" in caplog.text


async def test_an_undecodable_answer_reaches_the_callback_as_an_error() -> None:
    from service.protocol.errors import KafkaProtocolError

    conn, _writer = connection()
    conn._loop = asyncio.get_running_loop()
    errors: list[BaseException | None] = []
    conn.send_nowait(HB, 4, lambda _r, e: errors.append(e))
    conn._on_frame(b"\x00\x00\x00\x00\x00", 5)  # correlation id 0, then a truncated body
    assert len(errors) == 1 and isinstance(errors[0], KafkaProtocolError)
