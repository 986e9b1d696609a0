"""What many HTTP tests do with a consumer instance: poll its records until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

BIN = "application/vnd.kafka.binary.v2+json"


async def poll(http: httpx.AsyncClient, base: str, *, accept: str = BIN, timeout_ms: int = 1000) -> list[Any]:
    """One long poll of the instance at ``base``: its records as JSON (a 200 answer is required)."""
    r = await http.get(f"{base}/records", params={"timeout": timeout_ms}, headers={"Accept": accept})
    assert r.status_code == 200, r.text
    return list(r.json())


async def poll_until(http: httpx.AsyncClient, base: str, done: int | Callable[[list[Any]], bool], *,
                     accept: str = BIN, timeout: float = 30.0, timeout_ms: int = 1000) -> list[Any]:
    """Poll until ``done`` records arrived (an int) or ``done(records so far)`` holds; the records. Fails with
    what it got when ``timeout`` seconds pass first."""
    enough = (lambda got: len(got) >= done) if isinstance(done, int) else done
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not enough(got):
        assert time.monotonic() < deadline, f"gave up after {timeout} s with {len(got)} records: {got[:10]}"
        got += await poll(http, base, accept=accept, timeout_ms=timeout_ms)
    return got
