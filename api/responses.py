"""JSON responses rendered with orjson; a response that holds a slot until its body was sent."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from fastapi.responses import JSONResponse, Response


class OrjsonResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class SlotResponse(Response):
    """A response that gives back a slot (an entered async context manager: a tenant's range-read slot) once
    its body left the process (api/server/http.py ``held_send``), however it ends."""

    def __init__(self, content: Any, release: contextlib.AbstractAsyncContextManager[None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release: contextlib.AbstractAsyncContextManager[None] | None = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release, self._release = self._release, None
            if release is not None:
                await release.__aexit__(None, None, None)
