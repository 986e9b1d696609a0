"""Fault injection for the test broker.

A :class:`FaultInjector` holds faults for one broker or for the whole cluster. Each fault matches
requests by API key (optionally narrowed by a predicate) and applies to the next ``count`` matching
requests, then retires. When one request matches several faults, every one of them is consumed and
their effects combine: delays first, then a drop wins over an injected error.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from service.protocol.frames import RequestHeader

FaultKind = Literal["drop", "delay", "error"]
RequestPredicate = Callable[[RequestHeader, Any], bool]


@dataclass(eq=False)
class Fault:
    """One injected fault. ``applied`` counts the requests it has hit so far."""

    kind: FaultKind
    api_key: int
    remaining: int
    seconds: float = 0.0
    until: asyncio.Event | None = None
    error_code: int = 0
    depth: int | None = None
    when: RequestPredicate | None = None
    applied: int = 0

    @property
    def active(self) -> bool:
        return self.remaining > 0

    def matches(self, header: RequestHeader, request: Any) -> bool:
        if self.remaining <= 0 or header.api_key != self.api_key:
            return False
        return self.when is None or bool(self.when(header, request))

    async def wait(self) -> None:
        """For a delay fault: sleep ``seconds`` (``math.inf``: forever) or until ``until`` is set."""
        if self.until is not None:
            await self.until.wait()
        elif math.isinf(self.seconds):
            await asyncio.Event().wait()  # never answered; ends when the connection is closed
        elif self.seconds > 0:
            await asyncio.sleep(self.seconds)  # the injected latency itself, not synchronisation


@dataclass
class FaultInjector:
    faults: list[Fault] = field(default_factory=list)

    def drop_connection(self, api_key: int, count: int = 1, *, when: RequestPredicate | None = None) -> Fault:
        """Close the connection upon receiving the next ``count`` matching requests, without answering."""
        return self._add(Fault("drop", api_key, count, when=when))

    def delay(
        self,
        api_key: int,
        seconds: float = math.inf,
        count: int = 1,
        *,
        until: asyncio.Event | None = None,
        when: RequestPredicate | None = None,
    ) -> Fault:
        """Answer the next ``count`` matching requests ``seconds`` late, or once ``until`` is set.

        With neither (``seconds=math.inf``) the requests are never answered; the connection stays
        open until the client or the test closes it. The connection handles requests in order, like
        a Kafka broker, so later requests on it wait too.
        """
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        return self._add(Fault("delay", api_key, count, seconds=seconds, until=until, when=when))

    def error(
        self,
        api_key: int,
        error_code: int,
        count: int = 1,
        *,
        depth: int | None = None,
        when: RequestPredicate | None = None,
    ) -> Fault:
        """Answer the next ``count`` matching requests with ``error_code``.

        The code goes into every ``error_code`` field of the response: the top level (depth 0), the
        entries of top-level arrays such as topics (depth 1), their nested entries such as partitions
        (depth 2)... ``depth`` restricts it to one level; ``None`` sets all levels.
        """
        return self._add(Fault("error", api_key, count, error_code=error_code, depth=depth, when=when))

    def clear(self) -> None:
        self.faults.clear()

    @property
    def pending(self) -> list[Fault]:
        return [f for f in self.faults if f.active]

    def take(self, header: RequestHeader, request: Any) -> list[Fault]:
        """Consume and return every fault matching this request."""
        hit = []
        for f in self.faults:
            if f.matches(header, request):
                f.remaining -= 1
                f.applied += 1
                hit.append(f)
        self.faults = [f for f in self.faults if f.active]
        return hit

    def _add(self, fault: Fault) -> Fault:
        if fault.remaining < 1:
            raise ValueError("a fault needs count >= 1")
        self.faults.append(fault)
        return fault
