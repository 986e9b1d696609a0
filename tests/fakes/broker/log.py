"""The request log: every request a test broker received, in arrival order across the cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.protocol.messages import REQUESTS


@dataclass(eq=False)
class RequestLogEntry:
    """One received request.

    ``size`` is the request's size field (header + body, without the 4-byte size prefix);
    ``frame_size`` adds the prefix. ``request`` is the decoded request, or ``None`` if the key/version
    is unknown or the body does not decode. ``outcome`` says what the broker did: ``"pending"``,
    ``"answered"``, ``"no-response"``, ``"error-injected"``, ``"dropped"`` (fault), ``"closed"``
    (the broker closed the connection because of the request) or ``"aborted"`` (the connection
    went away before the answer). ``response`` is what was sent, if anything.
    """

    seq: int
    node_id: int
    connection_id: int
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int
    request: Any = None
    outcome: str = "pending"
    response: Any = None

    @property
    def frame_size(self) -> int:
        return self.size + 4

    @property
    def api_name(self) -> str:
        cm = REQUESTS.get(self.api_key)
        return cm.schema.name.removesuffix("Request") if cm else f"ApiKey{self.api_key}"

    def __repr__(self) -> str:
        return (
            f"<#{self.seq} node={self.node_id} conn={self.connection_id} {self.api_name} v{self.api_version} "
            f"corr={self.correlation_id} size={self.size} {self.outcome}>"
        )


Predicate = Callable[[RequestLogEntry], bool]


class RequestLog:
    def __init__(self) -> None:
        self.entries: list[RequestLogEntry] = []
        self._waiters: list[tuple[Predicate, int, asyncio.Future[list[RequestLogEntry]]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.entries)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def append(self, entry: RequestLogEntry) -> None:
        self.entries.append(entry)
        self.notify()

    def notify(self) -> None:
        """Re-check waiters (called when an entry's outcome changes)."""
        self._wake()

    def clear(self) -> None:
        self.entries.clear()

    def mark(self) -> int:
        """A position to pass as ``since`` to only see later requests."""
        return self._seq

    def select(
        self,
        api_key: int | None = None,
        *,
        node_id: int | None = None,
        since: int = 0,
        where: Predicate | None = None,
    ) -> list[RequestLogEntry]:
        return [e for e in self.entries if self._match(e, api_key, node_id, since, where)]

    async def wait_for(
        self,
        api_key: int | None = None,
        *,
        count: int = 1,
        node_id: int | None = None,
        since: int = 0,
        where: Predicate | None = None,
        timeout: float = 10.0,
    ) -> list[RequestLogEntry]:
        """Wait until at least ``count`` requests match; returns all matches. ``where`` is re-checked
        whenever an entry changes, so ``where=lambda e: e.outcome == "answered"`` waits for answers."""

        def pred(e: RequestLogEntry) -> bool:
            return self._match(e, api_key, node_id, since, where)

        found = [e for e in self.entries if pred(e)]
        if len(found) >= count:
            return found
        fut: asyncio.Future[list[RequestLogEntry]] = asyncio.get_running_loop().create_future()
        waiter = (pred, count, fut)
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    @staticmethod
    def _match(e: RequestLogEntry, api_key: int | None, node_id: int | None, since: int,
               where: Predicate | None) -> bool:
        return (
            e.seq > since
            and (api_key is None or e.api_key == api_key)
            and (node_id is None or e.node_id == node_id)
            and (where is None or where(e))
        )

    def _wake(self) -> None:
        for waiter in list(self._waiters):
            pred, count, fut = waiter
            if fut.done():
                continue
            found = [e for e in self.entries if pred(e)]
            if len(found) >= count:
                fut.set_result(found)
