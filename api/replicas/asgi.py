"""ASGI plumbing shared by the routing layer: holding back a 404/410 answer, recording and replaying a
request body, cancelling work when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

# starlette's own types (a scope or message may be any mapping)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")


@dataclass
class Captured:
    """A held-back response (status, headers, complete body)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def error_code(self) -> int | None:
        try:
            doc = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        code = doc.get("error_code") if isinstance(doc, dict) else None
        return code if isinstance(code, int) else None

    async def replay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class HoldNotFound:
    """A ``send`` that passes a response through unless it is a 404/410, which it holds back."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.state = "undecided"  # passing | holding | held
        self._start: Message | None = None
        self._body: list[bytes] = []

    async def send(self, message: Message) -> None:
        if self.state == "undecided" and message["type"] == "http.response.start":
            if message["status"] in (404, 410):
                self.state, self._start = "holding", message
                return
            self.state = "passing"
        if self.state == "holding" and message["type"] == "http.response.body":
            self._body.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.state = "held"
            return
        await self._send(message)

    @property
    def captured(self) -> Captured | None:
        if self.state != "held" or self._start is None:
            return None
        return Captured(self._start["status"], list(self._start.get("headers", [])), b"".join(self._body))


class Recorder:
    """A ``receive`` that remembers the request body the app read, to replay it to another replica."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.chunks: list[bytes] = []
        self.complete = False
        self.disconnected = False

    async def receive(self) -> Message:
        message = await self._receive()
        self._note(message)
        return message

    def _note(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.complete = True
        elif message["type"] == "http.disconnect":
            self.disconnected = True

    async def body(self) -> bytes | None:
        """The whole body (reading what the app left unread); None when the client went away."""
        while not self.complete and not self.disconnected:
            self._note(await self._receive())
        return None if self.disconnected else b"".join(self.chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` (which answers the client) until done, or cancel it when the client goes away (which
    closes the upstream request: the owner sees its client disconnect and ends the long poll / stream)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


def header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v
    return None



async def no_receive() -> Message:
    return {"type": "http.disconnect"}

