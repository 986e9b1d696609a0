"""Answers held until they left the process (api/server/http.py: held_send, the send timeout, LeanCycle waiting
for the drain) and the records-per-request cap of the produce parsers (api/v2/produce.py, _cproduce)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from api.server.http import (
    HELD_MIN_BYTES,
    CoalescingTransport,
    LeanCycle,
    OutputLimits,
    _HeadGuard,
    held_send,
)
from api.v2.produce import parse_body_records
from service.errors import GatewayError
from service.instances.budget import MemoryBudget
from service.producer import encoding

MiB = 1024 * 1024


class _Uvicorn:
    """uvicorn's ``send`` as far as held_send relies on it: while the connection is over its mark (``paused``),
    a send waits for the drain before writing."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.messages: list[dict[str, Any]] = []
        self.written = 0

    async def send(self, message: dict[str, Any]) -> None:
        await self.writable.wait()
        self.messages.append(message)
        self.written += len(message.get("body", b""))


async def test_a_large_body_is_charged_until_the_connection_drained() -> None:
    budget = MemoryBudget(64 * MiB)
    up = _Uvicorn()
    send = held_send(up.send, budget, MiB)
    body = b"x" * (3 * MiB + 5)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    up.writable.clear()  # the client stopped reading: the pieces wait
    task = asyncio.ensure_future(send({"type": "http.response.body", "body": body}))
    await asyncio.sleep(0)  # (one loop turn: the task runs up to its first wait)
    assert not task.done() and budget.by_kind["send"] == len(body) and budget.used == len(body)
    up.writable.set()  # the client reads again
    await task
    pieces = [m for m in up.messages if m["type"] == "http.response.body"]
    assert [len(m["body"]) for m in pieces] == [MiB, MiB, MiB, 5, 0, 0]
    assert [m["more_body"] for m in pieces] == [True] * 5 + [False]  # the end only after the drain wait
    assert b"".join(bytes(m["body"]) for m in pieces) == body
    assert budget.used == 0 and budget.by_kind["send"] == 0


async def test_a_stream_chunk_is_held_and_the_stream_goes_on() -> None:
    budget = MemoryBudget(64 * MiB)
    up = _Uvicorn()
    send = held_send(up.send, budget, MiB)
    chunk = b"y" * HELD_MIN_BYTES
    await send({"type": "http.response.body", "body": chunk, "more_body": True})
    assert [m.get("more_body") for m in up.messages] == [True, True]  # the chunk, the drain wait; no end
    assert budget.used == 0


async def test_small_bodies_and_other_messages_pass_untouched() -> None:
    budget = MemoryBudget(64 * MiB)
    up = _Uvicorn()
    send = held_send(up.send, budget, MiB)
    small = {"type": "http.response.body", "body": b"z" * (HELD_MIN_BYTES - 1)}
    start = {"type": "http.response.start", "status": 200, "headers": []}
    await send(start)
    await send(small)
    assert up.messages == [start, small] and budget.used == 0
    # no budget (before the gateway started): pieces and the drain wait all the same
    up2 = _Uvicorn()
    await held_send(up2.send, None, MiB)({"type": "http.response.body", "body": b"a" * (2 * MiB)})
    assert [len(m["body"]) for m in up2.messages] == [MiB, MiB, 0, 0]


async def test_the_charge_is_released_when_the_connection_is_lost() -> None:
    budget = MemoryBudget(64 * MiB)

    async def lost(message: dict[str, Any]) -> None:
        raise OSError("connection lost")

    with pytest.raises(OSError):
        await held_send(lost, budget, MiB)({"type": "http.response.body", "body": b"a" * (2 * MiB)})
    assert budget.used == 0


class _UvicornCycle:
    """uvicorn's RequestResponseCycle as far as held_send's common path relies on it: ``send`` bound to it, its
    ``flow`` (uvicorn's FlowControl, paused above the high-water mark) and ``disconnected``."""

    def __init__(self) -> None:
        from uvicorn.protocols.http.flow_control import FlowControl

        self.flow = FlowControl(SimpleNamespace())  # type: ignore[arg-type]
        self.disconnected = False
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


async def test_on_uvicorn_a_body_goes_as_written_and_stays_charged_while_over_the_mark() -> None:
    budget = MemoryBudget(64 * MiB)
    cycle = _UvicornCycle()
    send = held_send(cycle.send, budget, MiB)
    answer = {"type": "http.response.body", "body": b"x" * (HELD_MIN_BYTES + 1)}
    await send(answer)  # below the mark after the write: nothing held, one message, as written
    assert cycle.messages == [answer] and budget.used == 0
    cycle.messages.clear()
    cycle.flow.pause_writing()  # the connection is over its mark after the write (the client does not read)
    task = asyncio.ensure_future(send(answer))
    await asyncio.sleep(0)
    assert not task.done() and budget.by_kind["send"] == len(answer["body"])
    cycle.flow.resume_writing()  # drained below the low-water mark
    await task
    assert cycle.messages == [answer] and budget.used == 0
    # a lost connection: uvicorn's connection_lost resumes writing, the charge goes
    cycle.flow.pause_writing()
    task = asyncio.ensure_future(send(answer))
    await asyncio.sleep(0)
    assert budget.used == len(answer["body"])
    cycle.disconnected = True
    cycle.flow.resume_writing()
    await task
    assert budget.used == 0
    # a body over the mark still goes in pieces with the drain wait
    cycle.messages.clear()
    await send({"type": "http.response.body", "body": b"y" * (2 * MiB)})
    assert [len(m["body"]) for m in cycle.messages] == [MiB, MiB, 0, 0] and budget.used == 0


# -- the send timeout and the drain callbacks ------------------------------------------------------------------
class _Transport:
    def __init__(self, unsent: int = 0) -> None:
        self.unsent = unsent
        self.aborted = asyncio.Event()
        self.closing = False
        self.limits: dict[str, int] = {}

    def abort(self) -> None:
        self.closing = True
        self.aborted.set()

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = {"high": high or 0}


class _Base:
    """uvicorn's protocol as far as the guard calls it."""

    def __init__(self) -> None:
        self.flow = SimpleNamespace(write_paused=False)

    def pause_writing(self) -> None:
        self.flow.write_paused = True

    def resume_writing(self) -> None:
        self.flow.write_paused = False


class _Guarded(_HeadGuard, _Base):
    output_limits = OutputLimits(max_unsent_bytes=256 * 1024, send_timeout_s=0.05)

    def __init__(self, transport: _Transport) -> None:
        _Base.__init__(self)
        self.loop = asyncio.get_running_loop()
        self.connections: set[Any] = set()
        self.cycle = None
        self.raw = transport
        self.transport = transport  # type: ignore[assignment]
        self._guard_init()
        self._guard_connection_made()


async def test_a_connection_over_its_mark_past_the_send_timeout_is_aborted() -> None:
    raw = _Transport()
    proto = _Guarded(raw)
    assert raw.limits == {"high": 256 * 1024}  # the mark is the transport's high-water mark
    drained: list[str] = []
    proto.when_drained(lambda: drained.append("now"))  # not over the mark: at once
    assert drained == ["now"]
    proto.pause_writing()
    proto.when_drained(lambda: drained.append("later"))
    assert drained == ["now"]
    await asyncio.wait_for(raw.aborted.wait(), 10)  # the client never read: dropped
    proto._guard_connection_lost()
    assert drained == ["now", "later"]  # the lost connection releases what waited for the drain


async def test_a_connection_that_drains_in_time_is_kept() -> None:
    raw = _Transport()
    proto = _Guarded(raw)
    drained: list[str] = []
    proto.pause_writing()
    proto.when_drained(lambda: drained.append("x"))
    proto.resume_writing()
    assert drained == ["x"] and proto._send_timer is None
    # a later pause gets a fresh timeout (and the guard's connection_lost cancels it)
    proto.pause_writing()
    assert proto._send_timer is not None
    proto._guard_connection_lost()
    assert proto._send_timer is None and not raw.aborted.is_set()


async def test_a_closed_connection_with_unsent_bytes_is_aborted_after_the_send_timeout() -> None:
    raw = _Transport(unsent=1000)
    t = CoalescingTransport(raw, asyncio.get_running_loop(), 0.05)  # type: ignore[arg-type]
    t.close()
    await asyncio.wait_for(raw.aborted.wait(), 10)
    raw2 = _Transport(unsent=0)
    CoalescingTransport(raw2, asyncio.get_running_loop(), 0.0).close()  # nothing unsent: no timer
    assert raw2.closing and not raw2.aborted.is_set()


async def test_the_default_send_timeout_is_the_output_limits_default() -> None:
    """Without a send timeout the transport takes OutputLimits' default (30 s), a number: the slotted
    dataclass's class attribute is its slot descriptor, not the default."""
    raw = _Transport(unsent=1000)
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    assert t._send_timeout_s == OutputLimits().send_timeout_s == 30.0
    t.abort()


# -- LeanCycle: the protocol-level produce answer completes once drained -----------------------------------------
class _CountingCall:
    """A LeanCall answering at once; ``sent()`` counted."""

    def __init__(self) -> None:
        self.released = 0

    def answer_now(self, body: bytes, respond: Any) -> None:
        respond(200, [(b"content-length", b"2")], b"{}")

    def abandon(self) -> None:
        raise AssertionError("not abandoned")

    def sent(self) -> None:
        self.released += 1


class _Writes:
    def __init__(self) -> None:
        self.lines: list[Any] = []

    def writelines(self, data: Any) -> None:
        self.lines.append(data)

    def close(self) -> None:
        pass


class _LeanProto:
    def __init__(self, paused: bool) -> None:
        self.transport = _Writes()
        self.tasks: set[Any] = set()
        self.server_state = SimpleNamespace(default_headers=[])
        self.flow = SimpleNamespace(write_paused=paused)
        self.logger = logging.getLogger("test")
        self.completed = 0
        self.drained: list[Any] = []

    def on_response_complete(self) -> None:
        self.completed += 1

    def when_drained(self, callback: Any) -> None:
        self.drained.append(callback)


@pytest.fixture(autouse=True)
def _status_lines() -> None:
    from api.server import http as httpserver
    httpserver._STATUS_LINE.setdefault(200, b"HTTP/1.1 200 OK\r\n")


def test_a_lean_answer_over_the_mark_completes_only_once_drained() -> None:
    proto, call = _LeanProto(paused=True), _CountingCall()
    cycle = LeanCycle(proto, call, keep_alive=True)
    cycle.start()
    assert proto.transport.lines and not cycle.response_complete and proto.completed == 0 and call.released == 0
    proto.drained.pop()()  # the client read it
    assert cycle.response_complete and proto.completed == 1 and call.released == 1
    proto2, call2 = _LeanProto(paused=False), _CountingCall()
    LeanCycle(proto2, call2, keep_alive=True).start()
    assert proto2.completed == 1 and call2.released == 1 and not proto2.drained  # not over the mark: at once


def test_a_lean_answer_to_a_client_gone_releases_at_once() -> None:
    proto, call = _LeanProto(paused=False), _CountingCall()
    cycle = LeanCycle(proto, call, keep_alive=True)
    cycle.disconnected = True
    cycle.start()
    assert not proto.transport.lines and call.released == 1


# -- records per produce request -------------------------------------------------------------------------------
def _body(n: int, record: bytes = b"{}") -> bytes:
    return b'{"records":[' + b",".join([record] * n) + b"]}"


@pytest.mark.parametrize("record", [b"{}", b'{"value":"AA=="}', b'{"key":null,"value":"AAE="}'])
def test_the_c_parser_stops_at_the_record_after_the_cap(record: bytes) -> None:
    native = encoding.native
    assert native is not None
    body = _body(5, record)
    full = native.parse_body_binary(body, None)
    assert native.parse_body_binary(body, None, 5) == full  # at the cap: parsed
    assert native.parse_body_binary(body, None, -1) == full  # below 0: no cap
    assert native.parse_body_binary(body, None, 4) == 5  # over it: cap + 1, not parsed on
    assert native.parse_body_binary(body, None, 0) == 1
    assert native.parse_body_binary(b'{"records":[{}, {"other":1}]}', None, 1) == 2  # whatever follows
    assert native.parse_body_binary(b'{"records":[{"other":1}]}', None, 1) is None  # not the plain shape


@pytest.mark.parametrize("fmt", ["binary", "json"])
@pytest.mark.parametrize("native", [True, False])
def test_every_parse_path_refuses_more_records_than_the_cap(fmt: str, native: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(encoding, "native", None)  # the Python twin
    record = b'{"value":"AA=="}' if fmt == "binary" else b'{"value":{"a":1}}'
    _, records, _ = parse_body_records(_body(3, record), fmt, None, 3)
    assert len(records) == 3
    for raw in (_body(4, record), _body(4, b"{}"), _body(4, b'{"value":"AA==","headers":[]}')):
        with pytest.raises(GatewayError) as err:
            parse_body_records(raw, fmt, 2, 3)
        assert err.value.status == 413 and err.value.error_code == 41303 and "3 records" in str(err.value)
    assert len(parse_body_records(_body(4, record), fmt, None)[1]) == 4  # no cap given: none
