"""api/server/http.py's HeadScanner: request-head bytes and lines counted over arbitrary chunks."""

from __future__ import annotations

import asyncio

import orjson

from api.server.http import TOO_LARGE, TOO_MANY, HeadLimits, HeadScanner, error_bytes

LIMITS = HeadLimits(max_bytes=100, max_count=3)


def feed_all(scanner: HeadScanner, data: bytes, step: int) -> object:
    for i in range(0, len(data), step):
        verdict = scanner.feed(data[i:i + step])
        if verdict is not None or scanner.ended:
            return verdict
    return None


def test_a_head_within_the_limits_ends_at_the_empty_line_in_any_chunking() -> None:
    head = b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n"
    for step in (1, 2, 3, 7, len(head)):
        scanner = HeadScanner(LIMITS)
        assert feed_all(scanner, head + b"body" * 100, step) is None
        assert scanner.ended and scanner.size == len(head) and scanner.lines == 5, step


def test_body_bytes_after_the_head_are_not_counted() -> None:
    scanner = HeadScanner(LIMITS)
    assert scanner.feed(b"POST / HTTP/1.1\r\nContent-Length: 500\r\n\r\n" + b"x" * 500) is None
    assert scanner.size == 40 and scanner.ended


def test_too_large_and_too_many() -> None:
    assert feed_all(HeadScanner(LIMITS), b"GET / HTTP/1.1\r\nX: " + b"a" * 200, 10) is TOO_LARGE
    many = b"GET / HTTP/1.1\r\n" + b"A: 1\r\n" * 4 + b"\r\n"
    assert HeadScanner(LIMITS).feed(many) is TOO_MANY
    assert HeadScanner(LIMITS).feed(b"GET / HTTP/1.1\r\n" + b"A: 1\r\n" * 3 + b"\r\n") is None
    assert feed_all(HeadScanner(LIMITS), b"GET / HTTP/1.1\r\n" + b"A:\r\n" * 4, 3) is TOO_MANY  # still arriving


def test_a_new_head_starts_after_the_end_and_bare_lf_ends_a_head() -> None:
    scanner = HeadScanner(LIMITS)
    assert scanner.feed(b"GET / HTTP/1.1\n\n") is None and scanner.ended and scanner.size == 16
    assert scanner.feed(b"GET /x HTTP/1.1\r\n") is None
    assert not scanner.ended and scanner.size == 17 and scanner.lines == 1
    # the first end wins, whichever form it takes; the body after it is never part of the head
    scanner = HeadScanner(LIMITS)
    assert scanner.feed(b"POST / HTTP/1.1\nA: b\n\nbody\r\n\r\nmore") is None
    assert scanner.ended and scanner.size == len(b"POST / HTTP/1.1\nA: b\n\n")
    scanner = HeadScanner(LIMITS)
    assert scanner.feed(b"POST / HTTP/1.1\r\nA: b\r\n\r\nbody\n\nmore") is None
    assert scanner.ended and scanner.size == len(b"POST / HTTP/1.1\r\nA: b\r\n\r\n")


def test_error_bytes_is_a_json_http_response() -> None:
    raw = error_bytes(TOO_LARGE, LIMITS)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head and b"content-length: %d" % len(body) in head
    assert orjson.loads(body) == {"error_code": 43101, "message": "request header section too large (over 100 bytes)"}


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, chunks: list[bytes]) -> None:
        self.calls.append(("writelines", [bytes(c) for c in chunks]))

    def close(self) -> None:
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.calls.append(("abort", None))

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


async def test_coalescing_transport_sends_head_and_body_in_one_call() -> None:
    import asyncio

    from api.server.http import HOLD_MAX_BYTES, CoalescingTransport

    rec = _Recorder()
    t = CoalescingTransport(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert rec.calls == [] and t.get_write_buffer_size() == 19  # held until the body (or the end of the tick)
    body = bytearray(b"body")
    t.write(body)
    body[:] = b"XXXX"  # the caller may reuse its buffer once write returned
    assert rec.calls == [("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"body"])]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert len(rec.calls) == 1
    # a lone short write leaves at the end of the loop iteration, unchanged even if its buffer changes
    buf = bytearray(b"alone")
    t.write(buf)
    buf[:] = b"later"
    await asyncio.sleep(0)
    assert rec.calls[-1] == ("write", b"alone")
    # a long write is never held; writelines, close and abort keep the order
    big = b"x" * (HOLD_MAX_BYTES + 1)
    t.write(big)
    assert rec.calls[-1] == ("write", big)
    t.write(b"a")
    t.writelines([b"b", b"c"])
    assert rec.calls[-2:] == [("write", b"a"), ("writelines", [b"b", b"c"])]
    t.write(b"last words")
    t.close()
    assert rec.calls[-2:] == [("write", b"last words"), ("close", None)]
    t.write(b"dropped")
    t.abort()
    assert rec.calls[-1] == ("abort", None) and ("write", b"dropped") not in rec.calls
    assert t.is_closing() is False  # everything else is the transport's own


# -- LeanCycle: a request answered without uvicorn's ASGI cycle ------------------------------------------------
class _Call:
    """A LeanCall: answers at once (``mode="now"``), later from a callback (``"later"``), through an awaitable
    (``"await"``), or raises (an Exception as the answer)."""

    def __init__(self, answer: object = None, mode: str = "now") -> None:
        self.answers = answer or (200, [(b"content-length", b"2"), (b"content-type", b"x/y")], b"{}")
        self.mode = mode
        self.bodies: list[bytes] = []
        self.abandoned = 0
        self.respond: object = None

    def answer_now(self, body: bytes, respond: object) -> object:
        self.bodies.append(body)
        if isinstance(self.answers, Exception) and self.mode != "await":
            raise self.answers
        if self.mode == "now":
            respond(*self.answers)  # type: ignore[operator]
            return None
        if self.mode == "later":
            self.respond = respond
            return None
        return self._awaited()

    async def _awaited(self) -> object:
        await asyncio.sleep(0)
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers

    def abandon(self) -> None:
        self.abandoned += 1


class _Proto:
    def __init__(self) -> None:
        import logging
        from types import SimpleNamespace
        self.transport = _Recorder()
        self.tasks: set[object] = set()  # uvicorn's server_state.tasks, which the protocol holds
        self.server_state = SimpleNamespace(default_headers=[(b"server", b"uvicorn"), (b"date", b"today")])
        self.completed = 0
        self.logger = logging.getLogger("test")
        self.flow = SimpleNamespace(write_paused=False)  # uvicorn's flow control: over the high-water mark
        self.drained: list[object] = []

    def on_response_complete(self) -> None:
        self.completed += 1

    def when_drained(self, callback: object) -> None:
        self.drained.append(callback)


HEAD_200 = b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ndate: today\r\ncontent-length: 2\r\ncontent-type: x/y\r\n\r\n"


async def test_lean_cycle_answers_in_one_write_with_the_default_headers() -> None:
    from api.server.http import LeanCycle
    for mode in ("now", "later", "await"):
        proto, call = _Proto(), _Call(mode=mode)
        cycle = LeanCycle(proto, call, keep_alive=True)
        cycle.chunks += [b"ab", b"cd"]
        needs_task = cycle.start()
        assert needs_task is (mode == "await") and call.bodies == [b"abcd"]
        if mode == "later":
            assert proto.transport.calls == [] and not cycle.response_complete
            # in flight without a task: counted with uvicorn's tasks (the shutdown drain's quiet check)
            assert proto.tasks == {cycle} and cycle.cancel("graceful shutdown timed out") is False
            call.respond(*call.answers)  # type: ignore[operator]  # the records were acknowledged
        elif mode == "await":
            await cycle.run_asgi(None)
        assert not proto.tasks, mode
        assert proto.transport.calls == [("writelines", [HEAD_200, b"{}"])], mode
        assert cycle.response_complete and proto.completed == 1 and call.abandoned == 0
        assert cycle.proto is None  # no reference cycle with the protocol that holds it
        cycle.disconnected = True
        cycle.message_event.set()  # a later connection loss: nothing to abandon
        assert call.abandoned == 0


async def test_lean_cycle_closes_without_keep_alive_and_answers_500_for_a_bug() -> None:
    from api.server.http import LeanCycle
    proto, call = _Proto(), _Call()
    cycle = LeanCycle(proto, call, keep_alive=False)
    assert not cycle.start()
    (kind, (head, _)), close = proto.transport.calls
    assert kind == "writelines" and head.endswith(b"connection: close\r\n\r\n") and close == ("close", None)
    for mode in ("now", "await"):
        proto, call = _Proto(), _Call(RuntimeError("bug"), mode=mode)
        cycle = LeanCycle(proto, call, keep_alive=True)
        if cycle.start():
            await cycle.run_asgi(None)
        (_, (head, body)), close = proto.transport.calls
        assert head.startswith(b"HTTP/1.1 500 ") and b"connection: close\r\n" in head
        assert body == b"Internal Server Error" and close == ("close", None) and proto.completed == 1


async def test_lean_cycle_abandoned_mid_body_and_silent_after_a_disconnect() -> None:
    from api.server.http import LeanCycle
    proto, call = _Proto(), _Call()
    cycle = LeanCycle(proto, call, keep_alive=True)
    cycle.chunks.append(b"part")
    cycle.disconnected = True  # what uvicorn's connection_lost does, then message_event.set()
    cycle.message_event.set()
    cycle.message_event.set()
    assert call.abandoned == 1 and cycle.proto is None and proto.transport.calls == []
    # lost while the answer was being computed (awaited, or waiting for the records): nothing is written
    for mode in ("await", "later"):
        proto, call = _Proto(), _Call(mode=mode)
        cycle = LeanCycle(proto, call, keep_alive=True)
        if cycle.start():
            task = asyncio.ensure_future(cycle.run_asgi(None))
            cycle.disconnected = True
            await task
        else:
            assert proto.tasks == {cycle}
            cycle.disconnected = True
            call.respond(*call.answers)  # type: ignore[operator]
        assert call.bodies == [b""] and proto.transport.calls == [] and proto.completed == 0 and not proto.tasks
        assert call.abandoned == 0 and cycle.proto is None


def test_a_held_write_to_a_connection_the_peer_closed_is_dropped_not_raised() -> None:
    """uvloop raises RuntimeError on a write to a closed handle: a short write held for the end of the loop
    iteration must not be flushed into a transport the peer closed meanwhile (seen in CI as a traceback in the
    log of a replica whose forwarding peer was killed)."""
    import asyncio
    import socket

    import uvloop

    from api.server.http import CoalescingTransport

    errors: list[dict[str, object]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        a, b = socket.socketpair()
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=a)
        t = CoalescingTransport(transport, loop)  # type: ignore[arg-type]
        transport.abort()  # the peer is gone; the handle closes at the end of this iteration
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")  # an answer written in the same iteration is held past that
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert t.get_write_buffer_size() == 0
        b.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    assert errors == []
